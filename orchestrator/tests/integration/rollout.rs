//! Rollout wiring without external processes: the image recorder (persisted, generation
//! semantics, no re-derivation), monitor output in `GET /state` and `/metrics`, and the
//! extender's filter rejecting nodes the monitor excludes.

use crate::common;

use axum::body::Body;
use axum::http::Request;
use common::*;
use k8s_openapi::api::core::v1::Node;
use kudos_orchestrator::grpc::{Ingest, Services};
use kudos_orchestrator::http::router;
use kudos_orchestrator::index::{HeartbeatInfo, SharedIndex};
use kudos_orchestrator::kobj;
use kudos_orchestrator::metrics::Metrics;
use kudos_orchestrator::rollout::{ConfigRecorder, NodeMonitoring, record_images};
use kudos_orchestrator::store::{FileStore, Store};
use kudos_proto::kudos::v1::registry_service_server::RegistryService;
use kudos_rollout::image::{build_layer, group_config_files};
use kudos_rollout::reconcile::DryRunSink;
use kudos_rollout::{
    Ctx, DerivedImage, ImageDeriver, ImageRecorder, Mode, MonitorPolicy, PlainHttp, PluginConfig,
    RegistrySettings, RolloutMetrics, RolloutSettings,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tower::ServiceExt;

/// Port 1 on loopback: any registry access fails, so a pass that tries to push fails.
const BASE: &str = "127.0.0.1:1/kudos/device-plugin:base";
const REPO: &str = "127.0.0.1:1/kudos/device-plugin-derived";

/// A file store in `dir`, an empty index and the ingestion over both that knows node n1.
fn ingest_for_n1(dir: &tempfile::TempDir) -> (Arc<dyn Store>, SharedIndex, Arc<Ingest>) {
    let store: Arc<dyn Store> = Arc::new(FileStore::open(&dir.path().join("s.redb")).unwrap());
    let index = mk_index(&[]);
    let metrics = Arc::new(Metrics::new());
    let ingest = ingest(index.clone(), store.clone(), &["n1"], metrics);
    (store, index, ingest)
}

fn deriver() -> ImageDeriver {
    ImageDeriver::new(
        RegistrySettings {
            base_image: BASE.into(),
            repository: REPO.into(),
            plain_http: PlainHttp::Loopback,
            credentials: Default::default(),
            retry: Default::default(),
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(1),
        },
        RolloutMetrics::default(),
    )
    .unwrap()
}

/// The image rollout would derive for the view's only group (digest made up, layer real).
fn derived(view: &PluginConfig) -> (String, DerivedImage) {
    let group = view.groups().unwrap().remove(0);
    let layer = build_layer(&group_config_files(view, &group).unwrap()).unwrap();
    let digest = format!("sha256:{:0>64}", 7);
    let image = DerivedImage {
        reference: format!("{REPO}@{digest}"),
        digest,
        tag: format!("{}-g{}", group.name, view.generation),
        generation: view.generation,
        base_image: BASE.into(),
        config_layer_diff_id: layer.diff_id,
    };
    (group.name, image)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorder_persists_images_and_an_identical_generation_does_not_rederive() {
    let dir = tempfile::tempdir().unwrap();
    let (store, index, ingest) = ingest_for_n1(&dir);
    let mut published = ingest.plugin_updates.subscribe();
    let grpc = Services(ingest.clone());
    let r = grpc
        .report_plugin(with_token(plugin("n1", 2, true), Some("t-n1")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.generation, 1);

    let view = index.read().plugin_config().clone();
    let (group, image) = derived(&view);
    assert_eq!(group, "nvidia");
    let d = deriver();
    assert!(
        d.needs_derivation(&view, &view.groups().unwrap()[0])
            .unwrap()
    );

    // Recording persists (store first), updates the index and publishes, bumping once.
    let images = BTreeMap::from([(group.clone(), image.clone())]);
    ConfigRecorder::new(ingest.clone())
        .record(view.generation, &images)
        .unwrap();
    let loaded = store.load().await.unwrap().plugin_config;
    assert_eq!(loaded.generation, 2);
    assert_eq!(loaded.images["nvidia"].digest, image.digest);
    assert_eq!(*index.read().plugin_config(), loaded);
    assert_eq!(published.borrow_and_update().generation, 2);

    // The same images again, or an image of a group not in the configuration: no write.
    assert_eq!(record_images(&ingest, 2, &images).await.unwrap(), None);
    let stray = BTreeMap::from([("amd".to_string(), image.clone())]);
    assert_eq!(record_images(&ingest, 2, &stray).await.unwrap(), None);
    assert_eq!(store.load().await.unwrap().plugin_config.generation, 2);
    assert!(!published.has_changed().unwrap());

    // The view of the bumped generation needs no derivation: a reconcile pass with a
    // deriver whose registry is unreachable plans no push and renders the recorded image.
    let next = loaded.clone();
    assert_eq!(next.generation, 2);
    assert!(
        !d.needs_derivation(&next, &next.groups().unwrap()[0])
            .unwrap()
    );
    let out = Arc::new(Mutex::new(String::new()));
    let sink_out = out.clone();
    let sink: DryRunSink = Arc::new(move |s: &str| sink_out.lock().unwrap().push_str(s));
    let ctx = Ctx::new(
        RolloutSettings::default(),
        Arc::new(ConfigRecorder::new(ingest.clone())),
        RolloutMetrics::default(),
    )
    .with_deriver(d.clone())
    .with_mode(Mode::DryRun(sink));
    kudos_rollout::reconcile(Arc::new(next), Arc::new(ctx))
        .await
        .unwrap();
    let text = out.lock().unwrap().clone();
    assert!(!text.contains("an image would be derived"), "{text}");
    assert!(
        text.contains(&format!("image: {}", image.reference)),
        "{text}"
    );

    // A real change (a third device) does need a new image.
    grpc.report_plugin(with_token(plugin("n1", 3, true), Some("t-n1")))
        .await
        .unwrap();
    let changed = index.read().plugin_config().clone();
    assert_eq!(changed.generation, 3);
    assert!(
        d.needs_derivation(&changed, &changed.groups().unwrap()[0])
            .unwrap()
    );
}

fn node(name: &str, ready: bool, gpus: u32) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", UNIFIED: gpus.to_string()},
            "allocatable": {"cpu": "64", "memory": "512Gi", UNIFIED: gpus.to_string()},
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
        }
    }))
    .unwrap()
}

async fn call(app: axum::Router, method: &str, uri: &str, body: Value) -> (String, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let v = serde_json::from_str(&text).unwrap_or(Value::Null);
    (text, v)
}

#[tokio::test]
async fn state_shows_monitor_output_and_filter_rejects_excluded_nodes() {
    let model = "NVIDIA H100 80GB HBM3";
    let index = mk_index(&[("gpu-a", "nvidia", model, 4), ("gpu-b", "nvidia", model, 4)]);
    {
        let mut i = index.write();
        i.apply_node(kobj::node_info(&node("gpu-a", true, 4), UNIFIED));
        i.apply_node(kobj::node_info(&node("gpu-b", true, 4), UNIFIED));
        // Only gpu-a's agent sends heartbeats; the index alone does not hold that against
        // gpu-b (agents may be absent), node monitoring does.
        let at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        i.heartbeat(
            "gpu-a",
            HeartbeatInfo {
                at,
                agent_version: "t".into(),
                outbox_depth: 0,
                healthy_devices: 4,
                total_devices: 4,
            },
        );
    }
    let state = mk_state(index.clone());
    let app = router(state.clone(), &limits());
    let filter = json!({"Pod": pod_json("p", None, 1), "NodeNames": ["gpu-a", "gpu-b"]});

    let (_, before) = call(app.clone(), "POST", "/kudos/v1/filter", filter.clone()).await;
    assert_eq!(before["NodeNames"], json!(["gpu-a", "gpu-b"]));
    let (_, s) = call(app.clone(), "GET", "/state", Value::Null).await;
    assert_eq!(s["nodeMonitor"], Value::Null, "no monitoring pass yet");

    let view = index.read().plugin_config().clone();
    let monitoring = NodeMonitoring {
        settings: RolloutSettings::default(),
        policy: MonitorPolicy::default(),
        metrics: state.metrics.monitor.clone(),
        rollout_source: "daemonSetWatch",
    };
    let excluded = monitoring
        .pass(&index, &view, &[], SystemTime::now())
        .unwrap();
    assert_eq!(excluded, 1);

    let (_, s) = call(app.clone(), "GET", "/state", Value::Null).await;
    let nodes = &s["nodeMonitor"]["nodes"];
    assert_eq!(nodes[0]["node"], "gpu-a");
    assert_eq!(nodes[0]["excludeFromRanking"], false);
    assert_eq!(nodes[0]["allocatable"], 4);
    assert_eq!(nodes[0]["rollout"]["state"], "noImage");
    assert_eq!(nodes[1]["node"], "gpu-b");
    assert_eq!(nodes[1]["excludeFromRanking"], true);
    assert_eq!(nodes[1]["reasons"], json!(["noHeartbeat"]));
    assert_eq!(s["nodeMonitor"]["rolloutSource"], "daemonSetWatch");

    let (_, after) = call(app.clone(), "POST", "/kudos/v1/filter", filter).await;
    assert_eq!(after["NodeNames"], json!(["gpu-a"]));
    let reason = after["FailedAndUnresolvableNodes"]["gpu-b"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains("node monitoring") && reason.contains("noHeartbeat"),
        "{after}"
    );

    let (metrics, _) = call(app, "GET", "/metrics", Value::Null).await;
    assert!(
        metrics.contains("kudos_orchestrator_node_excluded{node=\"gpu-b\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("kudos_orchestrator_node_unified_allocatable{node=\"gpu-a\"} 4"));
    assert!(
        metrics.contains("# TYPE kudos_orchestrator_rollout_image_push_retries_total counter"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_push_leaves_the_configuration_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let (store, index, ingest) = ingest_for_n1(&dir);
    Services(ingest.clone())
        .report_plugin(with_token(plugin("n1", 1, true), Some("t-n1")))
        .await
        .unwrap();
    let before = store.load().await.unwrap().plugin_config;
    let mut settings = deriver().settings().clone();
    settings.retry.max_attempts = 1;
    let metrics = RolloutMetrics::default();
    // Registry and API server both unreachable (port 1): the push fails, nothing is recorded.
    let kube =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
    let ctx = Ctx::new(
        RolloutSettings::default(),
        Arc::new(ConfigRecorder::new(ingest.clone())),
        metrics.clone(),
    )
    .with_kube(kube)
    .with_deriver(ImageDeriver::new(settings, metrics.clone()).unwrap());
    let view = before.clone();
    // The pass fails (the push, then the apply against the unreachable API server).
    assert!(
        kudos_rollout::reconcile(Arc::new(view), Arc::new(ctx))
            .await
            .is_err()
    );
    let failed = kudos_rollout::metrics::GroupLabels {
        group: "nvidia".into(),
        outcome: kudos_rollout::metrics::Outcome::Failure,
    };
    assert_eq!(metrics.image_pushes.get_or_create(&failed).get(), 1);
    assert_eq!(store.load().await.unwrap().plugin_config, before);
    assert_eq!(*index.read().plugin_config(), before);
    assert!(before.images.is_empty());
}

#[tokio::test]
async fn vendor_names_that_cannot_name_a_plugin_group_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let grpc = Services(ingest_for_n1(&dir).2);
    let mut req = plugin("n1", 1, true);
    req.vendor = "NVIDIA".into();
    let status = grpc
        .report_plugin(with_token(req, Some("t-n1")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("lowercase DNS label"),
        "{status:?}"
    );
}

/// A node deleted from the cluster leaves the persisted plugin configuration (and so `/state`
/// and rollout's groups), once: found on real kubelets, where a deleted node stayed forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_is_pruned_from_the_persisted_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let (store, index, ingest) = ingest_for_n1(&dir);
    let mut published = ingest.plugin_updates.subscribe();
    Services(ingest.clone())
        .report_plugin(with_token(plugin("n1", 2, true), Some("t-n1")))
        .await
        .unwrap();
    assert!(index.read().plugin_config().nodes.contains_key("n1"));
    assert!(ingest.forget_node("n1").await.unwrap());
    let cfg = index.read().plugin_config().clone();
    assert!(!cfg.nodes.contains_key("n1"));
    assert_eq!(cfg.generation, 2);
    assert_eq!(store.load().await.unwrap().plugin_config, cfg, "persisted");
    assert_eq!(published.borrow_and_update().generation, 2, "published");
    assert!(
        !ingest.forget_node("n1").await.unwrap(),
        "nothing left to prune"
    );
    assert_eq!(index.read().plugin_config().generation, 2);
}
