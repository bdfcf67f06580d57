//! The parts of a `Pod` Kudos reads ([`crate::kobj::pod_facts`]), deserialized alone.
//!
//! kube-scheduler sends the whole pod with every filter and prioritize call. Most of its JSON
//! is none of Kudos' business: managed fields, volumes (the API server gives every pod a
//! projected service-account token volume), probes, environment, tolerations. Deserialized
//! as a k8s-openapi `Pod`, each of those was parsed into owned strings and maps; at 1,213 nodes
//! that was 15% of the orchestrator's CPU under a real kube-scheduler (perf, 2026-12-07), about
//! as much as ranking the nodes. The types here name only what `pod_facts` reads, so serde skips
//! the rest without allocating, and the result is a `Pod` with just those fields set.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

/// A pod: a JSON object only (serde's derived form would also take an array of the fields in
/// order, which no Kubernetes client sends and a whole `Pod` refuses).
struct PodView(PodFields);

impl<'de> Deserialize<'de> for PodView {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = PodView;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a Pod object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<PodView, A::Error> {
                PodFields::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(PodView)
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodFields {
    #[serde(default)]
    metadata: Option<MetaView>,
    #[serde(default)]
    spec: Option<SpecView>,
    #[serde(default)]
    status: Option<StatusView>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaView {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    /// Where a watch resumes from.
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecView {
    #[serde(default)]
    containers: Option<Vec<ContainerView>>,
    #[serde(default)]
    init_containers: Option<Vec<ContainerView>>,
    #[serde(default)]
    overhead: Option<BTreeMap<String, Quantity>>,
    #[serde(default)]
    node_name: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerView {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    resources: Option<ResourceRequirements>,
    #[serde(default)]
    restart_policy: Option<String>,
}

#[derive(Deserialize)]
struct StatusView {
    #[serde(default)]
    phase: Option<String>,
}

impl From<ContainerView> for Container {
    fn from(c: ContainerView) -> Self {
        Container {
            name: c.name.unwrap_or_default(),
            resources: c.resources,
            restart_policy: c.restart_policy,
            ..Container::default()
        }
    }
}

impl From<PodView> for Pod {
    fn from(PodView(p): PodView) -> Self {
        let containers = |v: Option<Vec<ContainerView>>| -> Vec<Container> {
            v.unwrap_or_default().into_iter().map(Into::into).collect()
        };
        let metadata = p.metadata.map_or_else(ObjectMeta::default, |m| ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            labels: m.labels,
            annotations: m.annotations,
            ..ObjectMeta::default()
        });
        Pod {
            metadata,
            spec: p.spec.map(|s| PodSpec {
                containers: containers(s.containers),
                init_containers: s.init_containers.map(|v| containers(Some(v))),
                overhead: s.overhead,
                node_name: s.node_name,
                ..PodSpec::default()
            }),
            status: p.status.map(|s| PodStatus {
                phase: s.phase,
                ..PodStatus::default()
            }),
        }
    }
}

/// `deserialize_with` for an optional pod: a `Pod` holding only what Kudos reads.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Pod>, D::Error> {
    Ok(Option::<PodView>::deserialize(d)?.map(Pod::from))
}

/// A pod as the index's watch receives it: a `Pod` holding only what Kudos reads (and the
/// resource version the watch resumes from), listed and watched as `v1` `pods` like a `Pod`.
#[derive(Clone, Debug, Default)]
pub struct WatchedPod(pub Pod);

impl<'de> Deserialize<'de> for WatchedPod {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        PodView::deserialize(d).map(|v| WatchedPod(v.into()))
    }
}

impl k8s_openapi::Resource for WatchedPod {
    const API_VERSION: &'static str = <Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Pod as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for WatchedPod {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.0.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kobj::pod_facts;

    /// A pod as kube-scheduler sends it: managed fields, the service-account volume, probes,
    /// environment, a sidecar, overhead, Kudos' labels and annotations.
    fn full_pod() -> serde_json::Value {
        serde_json::json!({
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {
                "name": "train-7", "namespace": "ml", "uid": "u-7",
                "labels": {"kudos.dev/class": "resnet", "app": "train"},
                "annotations": {"kudos.dev/work": "120", "kudos.dev/vendors": "nvidia,amd",
                                "kudos.dev/gang-name": "g", "kudos.dev/gang-size": "2"},
                "managedFields": [{"manager": "kubectl", "operation": "Update",
                                   "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:spec": {"f:containers": {}}}}],
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j",
                                     "uid": "j-1", "controller": true}]
            },
            "spec": {
                "volumes": [{"name": "kube-api-access-x", "projected": {"sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt",
                                   "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}],
                "initContainers": [
                    {"name": "side", "image": "s", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}},
                    {"name": "setup", "image": "i",
                     "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}
                ],
                "containers": [{
                    "name": "main", "image": "trainer:1",
                    "env": [{"name": "A", "value": "b"}],
                    "livenessProbe": {"httpGet": {"path": "/", "port": 8080}},
                    "volumeMounts": [{"name": "kube-api-access-x", "mountPath": "/var/run"}],
                    "resources": {"requests": {"cpu": "1", "memory": "2Gi"},
                                  "limits": {"kudos.dev/gpu": "2"}}
                }],
                "overhead": {"cpu": "100m"},
                "tolerations": [{"key": "k", "operator": "Exists"}],
                "nodeName": "gpu-3"
            },
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        })
    }

    #[derive(Deserialize)]
    struct Args {
        #[serde(default, deserialize_with = "deserialize")]
        pod: Option<Pod>,
    }

    #[test]
    fn the_view_gives_the_same_facts_as_the_whole_pod() {
        let json = full_pod();
        let whole: Pod = serde_json::from_value(json.clone()).unwrap();
        let args: Args = serde_json::from_value(serde_json::json!({ "pod": json })).unwrap();
        let view = args.pod.unwrap();
        let (a, b) = (
            pod_facts(&whole, "kudos.dev/gpu").unwrap(),
            pod_facts(&view, "kudos.dev/gpu").unwrap(),
        );
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        // What the facts hold, so that the comparison cannot pass on two empty pods.
        assert_eq!(
            (b.requests.gpus, b.requests.cpu_milli, b.class.as_deref()),
            (2, 2350, Some("resnet"))
        );
        assert_eq!(
            (b.uid.as_str(), b.node_name.as_deref(), b.terminated),
            ("u-7", Some("gpu-3"), false)
        );
        assert_eq!(b.gang, Some(("g".to_string(), 2)));
    }

    #[test]
    fn null_and_absent_parts_are_an_empty_pod_and_wrong_types_are_refused() {
        for json in [
            r#"{"pod": {}}"#,
            r#"{"pod": {"metadata": null, "spec": null, "status": null}}"#,
            r#"{"pod": {"spec": {"containers": null}}}"#,
        ] {
            let args: Args = serde_json::from_str(json).unwrap();
            let f = pod_facts(&args.pod.unwrap(), "kudos.dev/gpu").unwrap();
            assert_eq!(f.requests.gpus, 0, "{json}");
        }
        let none: Args = serde_json::from_str(r#"{"pod": null}"#).unwrap();
        assert!(none.pod.is_none());
        for bad in [
            r#"{"pod": {"metadata": {"name": 3}}}"#,
            r#"{"pod": {"metadata": {"labels": {"kudos.dev/class": 1}}}}"#,
            r#"{"pod": {"spec": {"containers": {"name": "main"}}}}"#,
            r#"{"pod": []}"#,
        ] {
            assert!(serde_json::from_str::<Args>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_watched_pod_is_listed_and_watched_as_a_pod_and_keeps_its_resource_version() {
        use kube::{Resource, ResourceExt};
        assert_eq!(
            WatchedPod::url_path(&(), Some("ml")),
            Pod::url_path(&(), Some("ml"))
        );
        assert_eq!(WatchedPod::kind(&()), "Pod");
        let mut json = full_pod();
        json["metadata"]["resourceVersion"] = "4711".into();
        let ev: kube::core::WatchEvent<WatchedPod> =
            serde_json::from_value(serde_json::json!({"type": "MODIFIED", "object": json}))
                .unwrap();
        let kube::core::WatchEvent::Modified(p) = ev else {
            panic!("not a MODIFIED event");
        };
        assert_eq!(p.resource_version().as_deref(), Some("4711"));
        let f = pod_facts(&p.0, "kudos.dev/gpu").unwrap();
        assert_eq!((f.name.as_str(), f.requests.gpus), ("train-7", 2));
        let list: kube::core::ObjectList<WatchedPod> = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "9"},
            "items": [full_pod()]
        }))
        .unwrap();
        assert_eq!(list.items.len(), 1);
    }
}
