//! gRPC ingestion against an in-process server on loopback: the registry's rewrite and
//! generation, acknowledgement only after persistence, de-duplication, and auth refusals.

use crate::common;

use common::*;
use futures::future::BoxFuture;
use kudos_orchestrator::grpc::Services;
use kudos_orchestrator::index::SharedIndex;
use kudos_orchestrator::metrics::Metrics;
use kudos_orchestrator::state::{PluginConfig, StoredRun};
use kudos_orchestrator::store::{Appended, FileStore, Loaded, Store, StoreError};
use kudos_proto::kudos::v1 as pb;
use pb::registry_service_client::RegistryServiceClient;
use pb::telemetry_service_client::TelemetryServiceClient;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

/// A store whose appends wait for a permit: shows that no ack leaves before the write ends.
struct GatedStore {
    inner: FileStore,
    gate: Arc<Semaphore>,
}

impl Store for GatedStore {
    fn load(&self) -> BoxFuture<'_, Result<Loaded, StoreError>> {
        self.inner.load()
    }
    fn save_plugin_config(&self, cfg: PluginConfig) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.save_plugin_config(cfg)
    }
    fn append_run(&self, run: StoredRun) -> BoxFuture<'_, Result<Appended, StoreError>> {
        Box::pin(async move {
            self.gate.acquire().await.expect("gate open").forget();
            self.inner.append_run(run).await
        })
    }
    fn save_model(&self, model: Vec<u8>, seq: u64) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.save_model(model, seq)
    }
}

struct Server {
    addr: String,
    index: SharedIndex,
    metrics: Arc<Metrics>,
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn registry(&self) -> RegistryServiceClient<tonic::transport::Channel> {
        RegistryServiceClient::connect(self.addr.clone())
            .await
            .unwrap()
    }

    async fn telemetry(&self) -> TelemetryServiceClient<tonic::transport::Channel> {
        TelemetryServiceClient::connect(self.addr.clone())
            .await
            .unwrap()
    }
}

async fn start(gate: Option<Arc<Semaphore>>) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let file = FileStore::open(&dir.path().join("s.redb")).unwrap();
    let store: Arc<dyn Store> = match gate {
        Some(gate) => Arc::new(GatedStore { inner: file, gate }),
        None => Arc::new(file),
    };
    let index = mk_index(&[]);
    let metrics = Arc::new(Metrics::new());
    let ingest = ingest(index.clone(), store.clone(), &["n1", "n2"], metrics.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let svc = Services(ingest);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(kudos_orchestrator::grpc::registry_server(svc.clone()))
            .add_service(kudos_orchestrator::grpc::telemetry_server(svc))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    Server {
        addr,
        index,
        metrics,
        store,
        _dir: dir,
    }
}

/// `ReportPlugin` for n1 with its token: `devices` devices, all `healthy` or none.
async fn report_n1_plugin(
    c: &mut RegistryServiceClient<tonic::transport::Channel>,
    devices: usize,
    healthy: bool,
) -> pb::ReportPluginResponse {
    c.report_plugin(with_token(plugin("n1", devices, healthy), Some("t-n1")))
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn registry_rewrites_name_and_bumps_generation_only_on_change() {
    let s = start(None).await;
    let mut c = s.registry().await;
    let r = report_n1_plugin(&mut c, 2, true).await;
    assert_eq!(r.unified_resource_name, UNIFIED);
    assert_eq!(r.generation, 1);
    let r = report_n1_plugin(&mut c, 2, true).await;
    assert_eq!(r.generation, 1, "same report, same generation");
    let r = report_n1_plugin(&mut c, 2, false).await;
    assert_eq!(r.generation, 1, "health is not configuration");
    let r = report_n1_plugin(&mut c, 3, true).await;
    assert_eq!(r.generation, 2);
    let stored = s.store.load().await.unwrap().plugin_config;
    assert_eq!(stored.generation, 2);
    assert_eq!(
        stored.nodes["n1"]["nvidia"].vendor_resource_name,
        "nvidia.com/gpu"
    );
    assert_eq!(stored.nodes["n1"]["nvidia"].devices.len(), 3);
    assert_eq!(s.index.read().profile("n1").unwrap().count, 3);
}

#[tokio::test]
async fn registry_tells_each_node_which_allocation_api_to_use() {
    use kudos_api::dra::{AllocationApi, DRIVER};
    use kudos_orchestrator::dra::AllocationPolicy;
    let s = start(None).await;
    let mut c = s.registry().await;
    // The default policy: the device-plugin API, no driver.
    let r = report_n1_plugin(&mut c, 2, true).await;
    assert_eq!(r.allocation_api, "device-plugin");
    assert_eq!(r.dra_driver, "");
    // auto with a v1.37 kubelet: DRA, with the driver the device plugin must serve.
    let node = |labels: serde_json::Value| {
        let n: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "labels": labels},
            "status": {"nodeInfo": {"kubeletVersion": "v1.37.2", "machineID": "", "systemUUID": "",
                "bootID": "", "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}}
        }))
        .unwrap();
        kudos_orchestrator::kobj::node_info(&n, UNIFIED)
    };
    {
        let mut idx = s.index.write();
        idx.set_allocation_policy(AllocationPolicy::Auto);
        idx.apply_node(node(serde_json::json!({})));
    }
    let r = report_n1_plugin(&mut c, 2, true).await;
    assert_eq!(
        AllocationApi::parse(&r.allocation_api),
        Some(AllocationApi::Dra)
    );
    assert_eq!(r.dra_driver, DRIVER);
    // The node's label overrides the policy.
    s.index.write().apply_node(node(
        serde_json::json!({"kudos.dev/allocation-api": "device-plugin"}),
    ));
    let r = report_n1_plugin(&mut c, 2, true).await;
    assert_eq!(r.allocation_api, "device-plugin");
    assert_eq!(r.dra_driver, "");
}

#[tokio::test]
async fn auth_refusals() {
    let s = start(None).await;
    let mut reg = s.registry().await;
    let mut tel = s.telemetry().await;
    // A missing or unknown token is refused; another node's token may not speak for n1.
    let refusals = |bad: &'static str| {
        [
            (None, Code::Unauthenticated),
            (Some(bad), Code::Unauthenticated),
            (Some("t-n2"), Code::PermissionDenied),
        ]
    };
    for (token, code) in refusals("nope") {
        let e = reg
            .report_plugin(with_token(plugin("n1", 1, true), token))
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{e}");
        if code == Code::PermissionDenied {
            assert!(e.message().contains("may only report about itself"), "{e}");
        }
    }

    let hb = |node: &str| pb::HeartbeatRequest {
        node: node.into(),
        ..Default::default()
    };
    for (token, code) in refusals("bad") {
        let e = tel
            .heartbeat(with_token(hb("n1"), token))
            .await
            .unwrap_err();
        assert_eq!(e.code(), code);
    }
    let ok = tel
        .heartbeat(with_token(hb("n1"), Some("t-n1")))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.interval_seconds >= 1);

    let stream = tokio_stream::iter(vec![report("r1", "n1", pb::RunState::Completed, "c")]);
    let e = tel
        .report_runs(with_token(stream, Some("bad")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    // A report about another node on an authenticated stream is REJECTED, per the proto.
    let stream = tokio_stream::iter(vec![report("r2", "n2", pb::RunState::Completed, "c")]);
    let mut acks = tel
        .report_runs(with_token(stream, Some("t-n1")))
        .await
        .unwrap()
        .into_inner();
    let ack = acks.message().await.unwrap().unwrap();
    assert_eq!(ack.status, pb::AckStatus::Rejected as i32);
    assert!(
        ack.message.contains("only report about itself"),
        "{}",
        ack.message
    );
}

#[tokio::test]
async fn acks_follow_persistence_and_duplicates_are_recognised() {
    let gate = Arc::new(Semaphore::new(0));
    let s = start(Some(gate.clone())).await;
    let (tx, mut acks) = stream_n1(&s).await;
    tx.send(report("a", "n1", pb::RunState::Completed, "resnet50"))
        .await
        .unwrap();
    // The store has not finished: no ack may arrive.
    let early = tokio::time::timeout(Duration::from_millis(300), acks.message()).await;
    assert!(
        early.is_err(),
        "ack before the report was stored: {early:?}"
    );
    gate.add_permits(100);
    let ack = acks.message().await.unwrap().unwrap();
    assert_eq!(
        (ack.report_id.as_str(), ack.status),
        ("a", pb::AckStatus::Accepted as i32)
    );
    assert_eq!(s.store.load().await.unwrap().runs_to_replay.len(), 1);

    tx.send(report("a", "n1", pb::RunState::Completed, "resnet50"))
        .await
        .unwrap();
    tx.send(report("f", "n1", pb::RunState::Failed, "resnet50"))
        .await
        .unwrap();
    tx.send(report("u", "n1", pb::RunState::Completed, ""))
        .await
        .unwrap();
    let mut bad = report("x", "n1", pb::RunState::Completed, "c");
    bad.end_unix_ms = 1;
    tx.send(bad).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(acks.message().await.unwrap().unwrap().status);
    }
    assert_eq!(
        got,
        vec![
            pb::AckStatus::Duplicate as i32,
            pb::AckStatus::Accepted as i32,
            pb::AckStatus::Accepted as i32,
            pb::AckStatus::Rejected as i32
        ]
    );
    // Three stored; only the classified, completed one reached the model.
    let loaded = s.store.load().await.unwrap();
    assert_eq!(loaded.runs_to_replay.len(), 3);
    wait_learned(&s.index, 3).await;
    let idx = s.index.read();
    assert_eq!(idx.applied_seq(), 3);
    assert_eq!(idx.scheduler().state().runs(), 1);
}

/// Opens a report stream for node n1 (after its plugin registered two devices).
async fn stream_n1(s: &Server) -> (mpsc::Sender<pb::RunReport>, tonic::Streaming<pb::RunAck>) {
    let mut reg = s.registry().await;
    reg.report_plugin(with_token(plugin("n1", 2, true), Some("t-n1")))
        .await
        .unwrap();
    let mut tel = s.telemetry().await.max_encoding_message_size(16 << 20);
    let (tx, rx) = mpsc::channel(8);
    let acks = tel
        .report_runs(with_token(ReceiverStream::new(rx), Some("t-n1")))
        .await
        .unwrap()
        .into_inner();
    (tx, acks)
}

/// A run of 10^9 seconds was accepted and reviewed Good: it is rejected, said why, and counted.
#[tokio::test]
async fn implausible_run_times_are_rejected_and_counted() {
    let s = start(None).await;
    let (tx, mut acks) = stream_n1(&s).await;
    let mut long = report("long", "n1", pb::RunState::Completed, "resnet50");
    long.start_unix_ms = 1_000_000_000_000;
    long.end_unix_ms = long.start_unix_ms + 1_000_000_000 * 1000;
    let mut busy = report("busy", "n1", pb::RunState::Completed, "resnet50");
    busy.gpu_busy_seconds = 1e9;
    tx.send(long).await.unwrap();
    tx.send(busy).await.unwrap();
    for _ in 0..2 {
        let ack = acks.message().await.unwrap().unwrap();
        assert_eq!(ack.status, pb::AckStatus::Rejected as i32, "{ack:?}");
        assert!(
            ack.message.contains("plausible") || ack.message.contains("exceeds"),
            "{}",
            ack.message
        );
    }
    assert!(
        s.metrics.encode().unwrap().contains(
            "kudos_orchestrator_run_report_rejections_total{reason=\"implausible_time\"} 2"
        )
    );
    assert!(s.store.load().await.unwrap().runs_to_replay.is_empty());
}

/// A 900 KB device model and 100 KB class names went into state: refused on entry, naming the
/// field and the bound.
#[tokio::test]
async fn oversized_names_are_refused_on_entry() {
    let s = start(None).await;
    let mut reg = s.registry().await;
    let mut p = plugin("n1", 1, true);
    p.devices[0].model = "M".repeat(900_000);
    let e = reg
        .report_plugin(with_token(p, Some("t-n1")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("model name") && e.message().contains("more than 96"),
        "{e}"
    );
    assert!(s.index.read().plugin_config().nodes.is_empty());

    let (tx, mut acks) = stream_n1(&s).await;
    tx.send(report(
        "c",
        "n1",
        pb::RunState::Completed,
        &"c".repeat(100_000),
    ))
    .await
    .unwrap();
    let ack = acks.message().await.unwrap().unwrap();
    assert_eq!(ack.status, pb::AckStatus::Rejected as i32);
    assert!(
        ack.message.contains("class") && ack.message.contains("63"),
        "{}",
        ack.message
    );
}

/// A report over 1 MiB ended the stream with OK and no ack: now the stream ends with a status
/// that names the bound, so the agent knows the report was not taken.
#[tokio::test]
async fn an_oversized_report_ends_the_stream_with_a_clear_status() {
    let s = start(None).await;
    let (tx, mut acks) = stream_n1(&s).await;
    tx.send(report("ok", "n1", pb::RunState::Completed, "resnet50"))
        .await
        .unwrap();
    let ack = acks.message().await.unwrap().unwrap();
    assert_eq!(ack.status, pb::AckStatus::Accepted as i32);
    let mut big = report("big", "n1", pb::RunState::Completed, "resnet50");
    big.run_id = "r".repeat(2 << 20);
    tx.send(big).await.unwrap();
    let e = acks.message().await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("1048576"), "{e}");
}
