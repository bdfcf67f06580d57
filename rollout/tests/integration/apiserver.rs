//! Server-side apply of the rendered DaemonSets against a real kube-apiserver (and etcd)
//! built by `e2e/build` into `e2e/_out/bin`, started by `kudos-testkit`. Skips with a message
//! when they are absent (panics instead with `KUDOS_E2E_REQUIRE=1`).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, Patch, PostParams};
use kudos_rollout::credentials::{CredentialsError, resolve_auth};
use kudos_rollout::render::{OWNED_SELECTOR, affinity_nodes};
use kudos_rollout::{
    CredentialSource, DerivedImage, PluginConfig, RolloutMetrics, RolloutSettings, apply,
};
use kudos_rollout::{DeviceRecord, VendorEntry};
use kudos_testkit::{ControlPlane, ControlPlaneOptions};
use oci_client::secrets::RegistryAuth;

use crate::util::Recorder;

fn image(group: &str) -> DerivedImage {
    let hex = format!("{:0>64}", group.len());
    DerivedImage {
        reference: format!("127.0.0.1:5000/kudos/device-plugin-derived@sha256:{hex}"),
        digest: format!("sha256:{hex}"),
        tag: format!("{group}-g3"),
        generation: 3,
        base_image: "127.0.0.1:5000/kudos/device-plugin:base".into(),
        config_layer_diff_id: "sha256:00".into(),
    }
}

fn view() -> PluginConfig {
    let vendor = |v: &str, id: &str| {
        (
            v.to_string(),
            VendorEntry {
                vendor_resource_name: format!("{v}.com/gpu"),
                plugin_version: "0.1.0".into(),
                devices: vec![DeviceRecord {
                    id: id.into(),
                    ..DeviceRecord::default()
                }],
            },
        )
    };
    let node = |vs: Vec<(String, VendorEntry)>| -> BTreeMap<String, VendorEntry> {
        vs.into_iter().collect()
    };
    PluginConfig {
        generation: 3,
        unified_resource_name: "kudos.dev/gpu".into(),
        nodes: BTreeMap::from([
            (
                "gpu-a".to_string(),
                node(vec![vendor("nvidia", "nv-GPU-1")]),
            ),
            (
                "gpu-b".to_string(),
                node(vec![vendor("nvidia", "nv-GPU-2")]),
            ),
            (
                "gpu-c".to_string(),
                node(vec![vendor("amd", "amd-0000:03:00.0")]),
            ),
        ]),
        images: ["amd", "nvidia"].map(|g| (g.to_string(), image(g))).into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_is_accepted_idempotent_and_prunes() -> anyhow::Result<()> {
    let opts = ControlPlaneOptions::default();
    let Some((run, cp)) = ControlPlane::for_test("rollout-apiserver", opts, &[]).await? else {
        return Ok(());
    };
    let client = cp.client.clone();
    let settings = RolloutSettings::default();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut ns = Namespace::default();
    ns.metadata.name = Some(settings.namespace.clone());
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), &settings.namespace);

    // A DaemonSet of the orchestrator that is not a plugin: pruning must leave it alone.
    let mut other = kudos_rollout::render::render_group(
        &kudos_rollout::PluginGroup {
            name: "x".into(),
            vendors: vec!["x".into()],
            nodes: vec!["gpu-a".into()],
        },
        "127.0.0.1:5000/other@sha256:0000000000000000000000000000000000000000000000000000000000000000",
        1,
        &settings,
    );
    other.metadata.name = Some("kudos-node-agent".into());
    other
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("app.kubernetes.io/component".into(), "node-agent".into());
    dss.patch(
        "kudos-node-agent",
        &kudos_rollout::apply::patch_params(),
        &Patch::Apply(&other),
    )
    .await
    .unwrap();

    let metrics = RolloutMetrics::default();
    let v = view();
    let first = apply(&client, &v, &settings, &metrics).await.unwrap();
    let names: Vec<&str> = first.applied.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["kudos-device-plugin-amd", "kudos-device-plugin-nvidia"]
    );
    assert!(first.deleted.is_empty());

    let nv = dss.get("kudos-device-plugin-nvidia").await.unwrap();
    assert_eq!(affinity_nodes(&nv), ["gpu-a", "gpu-b"]);
    assert_eq!(
        nv.metadata.annotations.as_ref().unwrap()["kudos.dev/config-generation"],
        "3"
    );
    let amd = dss.get("kudos-device-plugin-amd").await.unwrap();
    assert_eq!(affinity_nodes(&amd), ["gpu-c"]);
    let managers: Vec<_> = nv
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert_eq!(managers, ["kudos-orchestrator"]);
    assert_eq!(
        nv.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .as_deref(),
        Some(image("nvidia").reference.as_str())
    );

    // Re-applying the same configuration, through the reconciler, writes nothing.
    let ctx = Arc::new(
        kudos_rollout::Ctx::new(
            settings.clone(),
            Arc::new(Recorder::default()),
            metrics.clone(),
        )
        .with_kube(client.clone()),
    );
    kudos_rollout::reconcile(Arc::new(v.clone()), ctx)
        .await
        .unwrap();
    let second = apply(&client, &v, &settings, &metrics).await.unwrap();
    assert_eq!(
        second.applied, first.applied,
        "resourceVersion must not change"
    );

    // AMD leaves the configuration: its DaemonSet goes, nvidia's stays untouched.
    let mut w = v.clone();
    w.generation = 4;
    w.nodes.remove("gpu-c");
    w.images.remove("amd");
    let third = apply(&client, &w, &settings, &metrics).await.unwrap();
    assert_eq!(third.deleted, ["kudos-device-plugin-amd"]);
    assert_eq!(third.applied, first.applied[1..]);
    let left: Vec<String> = dss
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|d| d.metadata.name)
        .collect();
    assert_eq!(left, ["kudos-device-plugin-nvidia", "kudos-node-agent"]);
    let owned = dss
        .list(&kube::api::ListParams::default().labels(OWNED_SELECTOR))
        .await
        .unwrap();
    assert_eq!(owned.items.len(), 1);
    assert_eq!(metrics.daemonset_deletes.get(), 1);

    // Registry credentials from a Secret (kubernetes.io/dockerconfigjson).
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let mut secret = Secret::default();
    secret.metadata.name = Some("registry".into());
    secret.type_ = Some("kubernetes.io/dockerconfigjson".into());
    secret.string_data = Some(BTreeMap::from([(
        ".dockerconfigjson".to_string(),
        r#"{"auths":{"reg.example:5000":{"username":"kudos","password":"pw"}}}"#.to_string(),
    )]));
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let source = CredentialSource::Secret {
        namespace: settings.namespace.clone(),
        name: "registry".into(),
    };
    let auth = resolve_auth(&source, "reg.example:5000", Some(&client))
        .await
        .unwrap();
    assert_eq!(auth, RegistryAuth::Basic("kudos".into(), "pw".into()));
    let missing = CredentialSource::Secret {
        namespace: settings.namespace.clone(),
        name: "absent".into(),
    };
    assert!(matches!(
        resolve_auth(&missing, "reg.example:5000", Some(&client)).await,
        Err(CredentialsError::Fetch { .. })
    ));
    run.pass();
    Ok(())
}

/// The handover on a real API server: group DaemonSets copy the bootstrap DaemonSet's pod,
/// their nodes are labelled only while the group's DaemonSet exists, and stale labels go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_pods_copy_the_bootstrap_and_nodes_are_handed_over_by_label() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Node;
    let opts = ControlPlaneOptions::default();
    let Some((run, cp)) = ControlPlane::for_test("rollout-handover", opts, &[]).await? else {
        return Ok(());
    };
    let client = cp.client.clone();
    let settings = RolloutSettings {
        pod_template_from: Some("kudos-device-plugin-bootstrap".into()),
        ..RolloutSettings::default()
    };
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": settings.namespace}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, labels) in [
        ("gpu-a", serde_json::json!({})),
        ("gpu-b", serde_json::json!({})),
        // Handed to a group that is gone: it must get its bootstrap plugin back.
        (
            "gpu-z",
            serde_json::json!({"kudos.dev/plugin-group": "old"}),
        ),
    ] {
        let node: Node = serde_json::from_value(
            serde_json::json!({"metadata": {"name": name, "labels": labels}}),
        )?;
        nodes.create(&PostParams::default(), &node).await?;
    }
    let bootstrap: DaemonSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kudos-device-plugin-bootstrap", "namespace": settings.namespace},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/component": "device-plugin-bootstrap"}},
            "template": {
                "metadata": {"labels": {
                    "app.kubernetes.io/component": "device-plugin-bootstrap",
                    "app.kubernetes.io/instance": "kudos",
                }},
                "spec": {
                    "runtimeClassName": "nvidia",
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "kudos.dev/plugin-group", "operator": "DoesNotExist"}]}]}}},
                    "containers": [{
                        "name": "plugin",
                        "image": "kudos/kudos-device-plugin:0.1.0",
                        "args": ["--orchestrator-addr=http://kudos-orchestrator.kudos-system.svc:8889"],
                        "env": [{"name": "KUDOS_VENDOR", "value": "nvidia"}],
                    }],
                },
            },
        },
    }))?;
    Api::<DaemonSet>::namespaced(client.clone(), &settings.namespace)
        .create(&PostParams::default(), &bootstrap)
        .await?;
    let group_label = |name: &'static str| {
        let nodes = nodes.clone();
        async move {
            nodes
                .get(name)
                .await
                .unwrap()
                .metadata
                .labels
                .unwrap_or_default()
                .get("kudos.dev/plugin-group")
                .cloned()
        }
    };

    let metrics = RolloutMetrics::default();
    let mut v = view();
    v.images.remove("amd"); // amd (gpu-c, no Node object) waits for its image
    let report = apply(&client, &v, &settings, &metrics).await?;
    assert_eq!(
        report.labelled,
        [
            ("gpu-a".to_string(), Some("nvidia".to_string())),
            ("gpu-b".to_string(), Some("nvidia".to_string())),
            ("gpu-z".to_string(), None),
        ]
    );
    assert_eq!(group_label("gpu-a").await.as_deref(), Some("nvidia"));
    assert_eq!(group_label("gpu-z").await, None);
    let nv = Api::<DaemonSet>::namespaced(client.clone(), &settings.namespace)
        .get("kudos-device-plugin-nvidia")
        .await?;
    let pod = nv.spec.unwrap().template;
    let labels = pod.metadata.unwrap().labels.unwrap();
    assert_eq!(labels["app.kubernetes.io/component"], "device-plugin");
    assert_eq!(labels["app.kubernetes.io/instance"], "kudos");
    let spec = pod.spec.unwrap();
    assert_eq!(spec.runtime_class_name.as_deref(), Some("nvidia"));
    let c = &spec.containers[0];
    assert_eq!(c.image.as_deref(), Some(image("nvidia").reference.as_str()));
    assert_eq!(
        c.args,
        bootstrap.spec.unwrap().template.spec.unwrap().containers[0].args
    );
    assert!(
        c.env.iter().flatten().all(|e| e.name != "KUDOS_VENDOR"),
        "the derived image's vendor must not be shadowed: {:?}",
        c.env
    );
    let terms = serde_json::to_value(&spec.affinity)?;
    assert!(!terms.to_string().contains("DoesNotExist"), "{terms}");
    assert_eq!(affinity_nodes_of(&terms), ["gpu-a", "gpu-b"]);

    // Applying again changes no label; losing the image hands the nodes back.
    assert!(
        apply(&client, &v, &settings, &metrics)
            .await?
            .labelled
            .is_empty()
    );
    v.images.remove("nvidia");
    let back = apply(&client, &v, &settings, &metrics).await?;
    assert_eq!(back.labelled.len(), 2);
    assert_eq!(group_label("gpu-b").await, None);

    // A missing template DaemonSet is an error naming it, not a silent built-in pod.
    let absent = RolloutSettings {
        pod_template_from: Some("absent".into()),
        ..settings.clone()
    };
    let err = apply(&client, &view(), &absent, &metrics)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("kudos-system/absent"), "{err}");
    run.pass();
    Ok(())
}

/// Node names of the affinity terms that also require the group label.
fn affinity_nodes_of(affinity: &serde_json::Value) -> Vec<String> {
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["matchExpressions"][0]["key"] == "kudos.dev/plugin-group")
        .filter_map(|t| t["matchFields"][0]["values"][0].as_str().map(String::from))
        .collect()
}
