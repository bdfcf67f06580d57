//! gRPC ingestion against an in-process server on loopback: the registry's rewrite and
//! generation, acknowledgement only after persistence, de-duplication, and auth refusals.

mod common;

use common::*;
use futures::future::BoxFuture;
use kudos_orchestrator::auth::StaticAuthenticator;
use kudos_orchestrator::grpc::{Ingest, Services};
use kudos_orchestrator::index::SharedIndex;
use kudos_orchestrator::metrics::Metrics;
use kudos_orchestrator::state::{PluginConfig, StoredRun};
use kudos_orchestrator::store::{Appended, FileStore, Loaded, Store, StoreError};
use kudos_proto::kudos::v1 as pb;
use pb::registry_service_client::RegistryServiceClient;
use pb::registry_service_server::RegistryServiceServer;
use pb::telemetry_service_client::TelemetryServiceClient;
use pb::telemetry_service_server::TelemetryServiceServer;
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
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

async fn start(gate: Option<Arc<Semaphore>>) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let file = FileStore::open(&dir.path().join("s.redb")).unwrap();
    let store: Arc<dyn Store> = match gate {
        Some(gate) => Arc::new(GatedStore { inner: file, gate }),
        None => Arc::new(file),
    };
    let index = mk_index(&[]);
    let auth = StaticAuthenticator::new(
        [
            ("t-n1".to_owned(), "n1".to_owned()),
            ("t-n2".to_owned(), "n2".to_owned()),
        ]
        .into(),
    );
    // No drain in these tests: a dropped sender never signals one.
    let (_, draining) = tokio::sync::watch::channel(false);
    let ingest = Arc::new(Ingest {
        index: index.clone(),
        store: store.clone(),
        auth: Arc::new(auth),
        metrics: Arc::new(Metrics::new()),
        unified: UNIFIED.into(),
        heartbeat_max_age: 120.0,
        lock: tokio::sync::Mutex::new(()),
        draining,
        plugin_updates: tokio::sync::watch::Sender::new(Default::default()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let svc = Services(ingest);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistryServiceServer::new(svc.clone()))
            .add_service(TelemetryServiceServer::new(svc))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    Server {
        addr,
        index,
        store,
        _dir: dir,
    }
}

#[tokio::test]
async fn registry_rewrites_name_and_bumps_generation_only_on_change() {
    let s = start(None).await;
    let mut c = RegistryServiceClient::connect(s.addr.clone())
        .await
        .unwrap();
    let r = c
        .report_plugin(with_token(plugin("n1", 2, true), Some("t-n1")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.unified_resource_name, UNIFIED);
    assert_eq!(r.generation, 1);
    let r = c
        .report_plugin(with_token(plugin("n1", 2, true), Some("t-n1")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.generation, 1, "same report, same generation");
    let r = c
        .report_plugin(with_token(plugin("n1", 2, false), Some("t-n1")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.generation, 1, "health is not configuration");
    let r = c
        .report_plugin(with_token(plugin("n1", 3, true), Some("t-n1")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.generation, 2);
    let stored = s.store.load().await.unwrap().plugin_config;
    assert_eq!(stored.generation, 2);
    assert_eq!(
        stored.nodes["n1"]["nvidia"].vendor_resource_name,
        "nvidia.com/gpu"
    );
    assert_eq!(stored.nodes["n1"]["nvidia"].devices.len(), 3);
    assert_eq!(s.index.read().unwrap().profile("n1").unwrap().count, 3);
}

#[tokio::test]
async fn auth_refusals() {
    let s = start(None).await;
    let mut reg = RegistryServiceClient::connect(s.addr.clone())
        .await
        .unwrap();
    let mut tel = TelemetryServiceClient::connect(s.addr.clone())
        .await
        .unwrap();
    let e = reg
        .report_plugin(with_token(plugin("n1", 1, true), None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    let e = reg
        .report_plugin(with_token(plugin("n1", 1, true), Some("nope")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    let e = reg
        .report_plugin(with_token(plugin("n1", 1, true), Some("t-n2")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");
    assert!(e.message().contains("may only report about itself"), "{e}");

    let hb = |node: &str| pb::HeartbeatRequest {
        node: node.into(),
        ..Default::default()
    };
    assert_eq!(
        tel.heartbeat(with_token(hb("n1"), None))
            .await
            .unwrap_err()
            .code(),
        Code::Unauthenticated
    );
    assert_eq!(
        tel.heartbeat(with_token(hb("n1"), Some("bad")))
            .await
            .unwrap_err()
            .code(),
        Code::Unauthenticated
    );
    assert_eq!(
        tel.heartbeat(with_token(hb("n1"), Some("t-n2")))
            .await
            .unwrap_err()
            .code(),
        Code::PermissionDenied
    );
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
    let mut reg = RegistryServiceClient::connect(s.addr.clone())
        .await
        .unwrap();
    reg.report_plugin(with_token(plugin("n1", 2, true), Some("t-n1")))
        .await
        .unwrap();
    let mut tel = TelemetryServiceClient::connect(s.addr.clone())
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(8);
    let mut acks = tel
        .report_runs(with_token(ReceiverStream::new(rx), Some("t-n1")))
        .await
        .unwrap()
        .into_inner();
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
    let idx = s.index.read().unwrap();
    assert_eq!(idx.applied_seq(), 3);
    assert_eq!(idx.scheduler().state().runs(), 1);
}
