//! Fixtures shared by the integration tests: an index with a few nodes, the HTTP app over it,
//! and pod JSON builders.
#![allow(dead_code)]

use kudos_orchestrator::extender::bind::LocalBinder;
use kudos_orchestrator::extender::ledger::Ledger;
use kudos_orchestrator::extender::{ExplainCache, Extender};
use kudos_orchestrator::http::{HttpLimits, HttpState, router};
use kudos_orchestrator::index::{HeartbeatInfo, Index, SharedIndex};
use kudos_orchestrator::metrics::Metrics;
use kudos_orchestrator::state::{DeviceRecord, PluginConfig, VendorEntry};
use kudos_scheduler_core::{Scheduler, SchedulerConfig};
use parking_lot::RwLock;
use std::sync::Arc;
use std::time::Duration;

pub const UNIFIED: &str = "kudos.dev/gpu";

pub fn entry(model: &str, n: usize, mem: u64) -> VendorEntry {
    VendorEntry {
        vendor_resource_name: "vendor.example/gpu".into(),
        devices: (0..n)
            .map(|i| DeviceRecord {
                id: format!("{}-{i}", model.to_lowercase().replace(' ', "-")),
                model: model.into(),
                memory_bytes: mem,
                ..Default::default()
            })
            .collect(),
        plugin_version: "test".into(),
    }
}

/// An empty index, standalone (so ready), with the default scheduler.
pub fn empty_index() -> Index {
    Index::new(
        UNIFIED,
        120.0,
        Scheduler::new(SchedulerConfig::default()),
        false,
    )
}

/// An index (standalone, so ready) with `nodes` as (name, vendor, model, devices).
pub fn mk_index(nodes: &[(&str, &str, &str, usize)]) -> SharedIndex {
    let mut idx = empty_index();
    let mut cfg = PluginConfig::default();
    for (name, vendor, model, n) in nodes {
        cfg.upsert(name, vendor, entry(model, *n, 80 << 30), UNIFIED);
    }
    idx.set_plugin_config(cfg);
    Arc::new(RwLock::new(idx))
}

/// The standard fixture: three healthy GPU nodes and one whose agent went silent.
pub fn standard_index() -> SharedIndex {
    let index = mk_index(&[
        ("gpu-a", "nvidia", "NVIDIA H100 80GB HBM3", 4),
        ("gpu-b", "amd", "AMD Instinct MI300X", 8),
        ("gpu-c", "nvidia", "Tesla V100-SXM2-16GB", 2),
        ("gpu-stale", "nvidia", "NVIDIA A100-SXM4-80GB", 4),
    ]);
    index.write().heartbeat(
        "gpu-stale",
        HeartbeatInfo {
            at: 1.0,
            agent_version: "t".into(),
            outbox_depth: 0,
            healthy_devices: 4,
            total_devices: 4,
        },
    );
    index
}

/// The gRPC ingestion over `index` and `store`, with static tokens `t-<node>` for `nodes`. No
/// drain in these tests: the dropped sender never signals one.
pub fn ingest(
    index: SharedIndex,
    store: Arc<dyn kudos_orchestrator::store::Store>,
    nodes: &[&str],
    metrics: Arc<Metrics>,
) -> Arc<kudos_orchestrator::grpc::Ingest> {
    let (_, draining) = tokio::sync::watch::channel(false);
    let tokens = nodes.iter().map(|n| (format!("t-{n}"), n.to_string()));
    Arc::new(kudos_orchestrator::grpc::Ingest {
        runs: run_writer(store.clone(), index.clone(), metrics.clone()),
        index,
        store,
        auth: Arc::new(kudos_orchestrator::auth::StaticAuthenticator::new(
            tokens.collect(),
        )),
        metrics,
        unified: UNIFIED.into(),
        heartbeat_max_age: 120.0,
        lock: tokio::sync::Mutex::new(()),
        draining,
        plugin_updates: tokio::sync::watch::Sender::new(Default::default()),
    })
}

/// The run writer and learner of an ingestion fixture (needs a tokio runtime).
pub fn run_writer(
    store: Arc<dyn kudos_orchestrator::store::Store>,
    index: SharedIndex,
    metrics: Arc<Metrics>,
) -> kudos_orchestrator::learn::RunWriter {
    kudos_orchestrator::learn::RunWriter::spawn(
        store,
        kudos_orchestrator::learn::Learner::spawn(index, metrics, None),
    )
}

pub fn limits() -> HttpLimits {
    HttpLimits {
        prefix: "/kudos/v1".into(),
        max_body_bytes: 1 << 20,
        timeout: Duration::from_secs(5),
        bind_timeout: Duration::from_secs(5),
        max_concurrent: 16,
    }
}

pub fn mk_extender(index: SharedIndex, metrics: Arc<Metrics>) -> Extender {
    Extender {
        index,
        ledger: Ledger::new(false),
        explain: ExplainCache::default(),
        binder: Arc::new(LocalBinder),
        metrics,
        unified: UNIFIED.into(),
        last_filter: Default::default(),
        filter_top_nodes: None,
        events: None,
    }
}

pub fn mk_state(index: SharedIndex) -> Arc<HttpState> {
    let metrics = Arc::new(Metrics::new());
    let extender = mk_extender(index.clone(), metrics.clone());
    Arc::new(HttpState::new(extender, index, metrics))
}

pub fn mk_app(index: SharedIndex) -> axum::Router {
    router(mk_state(index), &limits())
}

/// A pod JSON object (camelCase, as kube-scheduler sends it).
pub fn pod_json(name: &str, class: Option<&str>, gpus: u32) -> serde_json::Value {
    let mut labels = serde_json::Map::new();
    if let Some(c) = class {
        labels.insert("kudos.dev/class".into(), c.into());
    }
    let mut requests = serde_json::Map::new();
    requests.insert("cpu".into(), "1".into());
    if gpus > 0 {
        requests.insert(UNIFIED.into(), gpus.to_string().into());
    }
    serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"requests": requests, "limits": null}}]},
        "status": null
    })
}

// === gRPC builders ===

use kudos_proto::kudos::v1 as pb;

pub fn with_token<T>(msg: T, token: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

pub fn plugin(node: &str, devices: usize, healthy: bool) -> pb::ReportPluginRequest {
    pb::ReportPluginRequest {
        node: node.into(),
        vendor: "nvidia".into(),
        vendor_resource_name: "nvidia.com/gpu".into(),
        devices: (0..devices)
            .map(|i| pb::Device {
                id: format!("nv-GPU-{i}"),
                model: "NVIDIA H100 80GB HBM3".into(),
                memory_bytes: 80 << 30,
                uuid: format!("GPU-{i}"),
                numa_node: Some(0),
                healthy,
            })
            .collect(),
        plugin_version: "0.1.0".into(),
    }
}

pub fn report(id: &str, node: &str, state: pb::RunState, class: &str) -> pb::RunReport {
    pb::RunReport {
        report_id: id.into(),
        run_id: format!("run-{id}"),
        node: node.into(),
        pod_namespace: "default".into(),
        pod_name: format!("pod-{id}"),
        pod_uid: format!("uid-{id}"),
        class: class.into(),
        device_ids: vec!["nv-GPU-0".into()],
        state: state as i32,
        start_unix_ms: 1_700_000_000_000,
        end_unix_ms: 1_700_000_600_000,
        gpu_busy_seconds: 550.0,
        ..Default::default()
    }
}

/// One request through the router; the body as JSON (or as a JSON string when it is not JSON).
pub async fn call(
    app: axum::Router,
    method: &str,
    uri: &str,
    body: Vec<u8>,
) -> (axum::http::StatusCode, serde_json::Value) {
    let req = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))
        .unwrap();
    let resp = tower::ServiceExt::oneshot(app, req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, v)
}

/// `POST` of `body` (JSON) through the router.
pub async fn post(
    app: &axum::Router,
    uri: &str,
    body: Vec<u8>,
) -> (axum::http::StatusCode, serde_json::Value) {
    call(app.clone(), "POST", uri, body).await
}

/// `GET` through the router.
pub async fn get(app: &axum::Router, uri: &str) -> (axum::http::StatusCode, serde_json::Value) {
    call(app.clone(), "GET", uri, vec![]).await
}

/// Waits until the learner has published a model that includes run `seq` (learning is
/// asynchronous; the guard turns a hang into a failure).
pub async fn wait_learned(index: &SharedIndex, seq: u64) {
    tokio::time::timeout(Duration::from_secs(60), async {
        while index.read().applied_seq() < seq {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the learner published the run");
}

/// Fitted numbers of the transfer model: the learner refits the whole model once per publish
/// (scheduler-core `Refit::Deferred`), so where the fit stopped between runs depends on how the
/// runs fell into batches (before a kill and after it, on a leader and its follower), and the
/// fit, warm-started from there, agrees to its tolerance rather than to the bit.
const FITTED: [&str; 3] = ["effect", "interaction_sd", "transfer"];

/// Where two `/state` documents (or parts of them) differ, if they do: everything must be equal
/// but [`FITTED`] numbers, which may differ by 1e-9 relative.
pub fn state_difference(a: &serde_json::Value, b: &serde_json::Value) -> Option<String> {
    difference_at(a, b, "")
}

fn difference_at(a: &serde_json::Value, b: &serde_json::Value, path: &str) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            if !x.keys().eq(y.keys()) {
                return Some(format!("{path}: keys {:?} and {:?}", x.keys(), y.keys()));
            }
            x.iter()
                .find_map(|(k, v)| difference_at(v, &y[k], &format!("{path}.{k}")))
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (v, w))| difference_at(v, w, &format!("{path}[{i}]"))),
        (Value::Number(x), Value::Number(y))
            if x != y && FITTED.iter().any(|f| path.split('.').any(|p| p == *f)) =>
        {
            // A number without an f64 value is a difference, not a match.
            match (x.as_f64(), y.as_f64()) {
                (Some(x), Some(y)) if ((x - y) / x.abs().max(1e-12)).abs() < 1e-9 => None,
                _ => Some(format!("{path}: {x} and {y}")),
            }
        }
        _ => (a != b).then(|| format!("{path}: {a} and {b}")),
    }
}
