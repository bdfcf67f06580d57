//! Pod metadata the kubelet does not give us: UID, class, declared work, phase.
//!
//! Trust boundary: the class comes from the pod's `kudos.dev/class` label and the work from its
//! `kudos.dev/work` annotation, as stored by the API server — both written by whoever created
//! the pod, and the orchestrator decides how far to trust them. Nothing here is read from inside
//! a container. Without an API server (`--pod-metadata none`) every field is empty and runs are
//! still reported, unclassified.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kudos_api::labels;
use tracing::Instrument;

/// What we know about one pod besides its devices.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodMeta {
    /// `metadata.uid`.
    pub uid: String,
    /// `kudos.dev/class` label; empty when absent.
    pub class: String,
    /// `kudos.dev/work`, when present and a finite non-negative number.
    pub work: Option<f64>,
    /// `kudos.dev/progress`, when present and within 0..=1.
    pub progress: Option<f64>,
    /// The pod ended in failure (`status.phase == Failed`).
    pub failed: bool,
    /// The pod has ended (`Succeeded` or `Failed`).
    pub ended: bool,
}

/// A source of pod metadata keyed by namespace and name.
pub trait PodMetaSource: Send + Sync + 'static {
    /// Metadata of `namespace/name`, or `None` when unknown.
    fn get(&self, namespace: &str, name: &str) -> Option<PodMeta>;
}

/// No API server: nothing is known.
pub struct NoPodMeta;

impl PodMetaSource for NoPodMeta {
    fn get(&self, _: &str, _: &str) -> Option<PodMeta> {
        None
    }
}

/// An in-memory map, written by the watcher (or by tests), read by the sampling loop.
#[derive(Clone, Default)]
pub struct PodMetaStore(Arc<RwLock<HashMap<(String, String), PodMeta>>>);

impl PodMetaStore {
    /// Inserts or replaces one pod.
    pub fn apply(&self, namespace: &str, name: &str, meta: PodMeta) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert((namespace.to_owned(), name.to_owned()), meta);
    }
    /// Forgets one pod.
    pub fn delete(&self, namespace: &str, name: &str) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(namespace.to_owned(), name.to_owned()));
    }
    fn replace(&self, all: HashMap<(String, String), PodMeta>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = all;
    }
}

impl PodMetaSource for PodMetaStore {
    fn get(&self, namespace: &str, name: &str) -> Option<PodMeta> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }
}

fn parse_fraction(s: Option<&String>, max: f64) -> Option<f64> {
    s.and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0 && *v <= max)
}

/// Extracts what the agent needs from a pod object.
pub fn meta_of(pod: &Pod) -> PodMeta {
    let md = &pod.metadata;
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    PodMeta {
        uid: md.uid.clone().unwrap_or_default(),
        class: md
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::CLASS))
            .cloned()
            .unwrap_or_default(),
        work: parse_fraction(
            md.annotations.as_ref().and_then(|a| a.get(labels::WORK)),
            f64::MAX,
        ),
        progress: parse_fraction(
            md.annotations
                .as_ref()
                .and_then(|a| a.get(labels::PROGRESS)),
            1.0,
        ),
        failed: phase == "Failed",
        ended: phase == "Failed" || phase == "Succeeded",
    }
}

fn key_of(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Watches the pods bound to `node` (field selector `spec.nodeName=<node>`, so the agent's
/// RBAC and memory stay per-node) and keeps `store` current. Runs until the task is dropped;
/// watch errors are retried with the runtime's default backoff.
pub fn spawn_pod_watcher(
    client: kube::Client,
    node: String,
    store: PodMetaStore,
) -> tokio::task::JoinHandle<()> {
    let span = tracing::info_span!("pod_watcher", node = %node);
    tokio::spawn(
        async move {
            let api: kube::Api<Pod> = kube::Api::all(client);
            let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
            let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
            let mut init: HashMap<(String, String), PodMeta> = HashMap::new();
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(Event::Apply(p)) => {
                        let (ns, name) = key_of(&p);
                        store.apply(&ns, &name, meta_of(&p));
                    }
                    Ok(Event::Delete(p)) => {
                        let (ns, name) = key_of(&p);
                        store.delete(&ns, &name);
                    }
                    Ok(Event::Init) => init.clear(),
                    Ok(Event::InitApply(p)) => {
                        init.insert(key_of(&p), meta_of(&p));
                    }
                    Ok(Event::InitDone) => {
                        tracing::debug!(pods = init.len(), "pod list synced");
                        store.replace(std::mem::take(&mut init));
                    }
                    Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
                }
            }
        }
        .instrument(span),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use kube::api::ObjectMeta;
    use std::time::Duration;

    #[test]
    fn reads_class_work_and_phase_from_the_pod_object_only() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u-1".into()),
                labels: Some([(labels::CLASS.to_string(), "resnet50".to_string())].into()),
                annotations: Some(
                    [
                        (labels::WORK.to_string(), "90".to_string()),
                        (labels::PROGRESS.to_string(), "7".into()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            status: Some(PodStatus {
                phase: Some("Failed".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = meta_of(&pod);
        assert_eq!(m.uid, "u-1");
        assert_eq!(m.class, "resnet50");
        assert_eq!(m.work, Some(90.0));
        assert_eq!(m.progress, None, "progress outside 0..=1 is ignored");
        assert!(m.failed && m.ended);
        let bare = meta_of(&Pod::default());
        assert_eq!(bare.class, "");
        assert!(!bare.ended);
    }

    /// The watcher against an API-server stand-in: it lists only this node's pods (field
    /// selector) and fills the store from the list.
    #[tokio::test]
    async fn watcher_lists_only_this_nodes_pods_into_the_store() {
        use kube::client::Body;
        use std::sync::Mutex;
        let queries: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = queries.clone();
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "7"},
            "items": [{
                "metadata": {"name": "train", "namespace": "ml", "uid": "u-9",
                             "labels": {"kudos.dev/class": "bert"},
                             "annotations": {"kudos.dev/work": "12.5"}},
                "status": {"phase": "Running"}
            }]
        });
        let body = serde_json::to_vec(&pod).expect("json");
        let svc = tower::service_fn(move |req: http::Request<Body>| {
            let q = req.uri().query().unwrap_or("").to_owned();
            seen.lock().expect("lock").push(q.clone());
            let body = body.clone();
            async move {
                if q.contains("watch=true") {
                    // Hold the watch open: nothing changes during the test.
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                Ok::<_, std::convert::Infallible>(http::Response::new(Body::from(body)))
            }
        });
        let client = kube::Client::new(svc, "default");
        let store = PodMetaStore::default();
        let task = spawn_pod_watcher(client, "node-a".into(), store.clone());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while store.get("ml", "train").is_none() {
            assert!(std::time::Instant::now() < deadline, "pod never arrived");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        task.abort();
        let m = store.get("ml", "train").expect("pod");
        assert_eq!(
            (m.uid.as_str(), m.class.as_str(), m.work),
            ("u-9", "bert", Some(12.5))
        );
        let q = queries.lock().expect("lock").clone();
        assert!(!q.is_empty());
        assert!(
            q.iter()
                .all(|q| q.contains("fieldSelector=spec.nodeName%3Dnode-a")),
            "every request is limited to this node: {q:?}"
        );
    }
}
