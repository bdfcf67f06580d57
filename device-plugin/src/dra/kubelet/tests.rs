//! The preparer against a map of claims (the API server is the integration test's job).

use super::*;
use crate::backend::DeviceBackend;
use crate::backend::fake::FakeBackend;
use crate::dra::checkpoint::Loaded;
use api::dra_plugin_server::DraPlugin as _;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Default)]
struct Claims {
    claims: std::sync::Mutex<BTreeMap<(String, String), ResourceClaim>>,
    reads: AtomicUsize,
}

impl ClaimSource for Arc<Claims> {
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<ResourceClaim, String>> + Send {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let found = self
            .claims
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| format!("ResourceClaim {namespace}/{name} not found"));
        std::future::ready(found)
    }
}

fn claim(name: &str, uid: &str, devices: &[&str]) -> ResourceClaim {
    let results = devices
        .iter()
        .map(|d| crate::dra::prepare::tests::result("gpu", "node-a", d))
        .collect();
    crate::dra::prepare::tests::allocated_claim(name, uid, results)
}

fn wire(name: &str, uid: &str) -> api::Claim {
    api::Claim {
        namespace: "ml".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

struct Env {
    dir: tempfile::TempDir,
    source: Arc<Claims>,
    backends: Backends,
}

impl Env {
    fn new() -> Env {
        let fake: Arc<dyn DeviceBackend> = Arc::new(FakeBackend::new("acme", 2, 1));
        Env {
            dir: tempfile::tempdir().expect("tempdir"),
            source: Arc::default(),
            backends: Backends::new(vec![fake]).expect("backends"),
        }
    }

    fn add(&self, c: ResourceClaim) {
        let key = (
            c.metadata.namespace.clone().unwrap_or_default(),
            c.metadata.name.clone().unwrap_or_default(),
        );
        self.source
            .claims
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, c);
    }

    fn cdi(&self) -> cdi::CdiDir {
        cdi::CdiDir::new(self.dir.path().join("cdi"))
    }

    /// A preparer over the checkpoint on disk, as after a (re)start.
    fn preparer(&self) -> (Preparer<Arc<Claims>>, Loaded) {
        let (cp, loaded) =
            Checkpoint::load(&self.dir.path().join("plugin/checkpoint.json")).expect("load");
        let (_tx, health) = watch::channel(Arc::new(HealthMap::default()));
        let p = Preparer::new(
            self.source.clone(),
            "node-a".into(),
            self.backends.clone(),
            self.cdi(),
            cp,
            health,
            Metrics::new(),
        );
        (p, loaded)
    }
}

#[tokio::test]
async fn prepare_writes_the_cdi_spec_and_answers_each_claim_on_its_own() {
    let env = Env::new();
    env.add(claim("train", "u-1", &["acme-dev0", "acme-dev1"]));
    env.add(claim("elsewhere", "u-3", &["acme-dev7"]));
    let (p, loaded) = env.preparer();
    assert_eq!(loaded, Loaded::Fresh);
    let resp = p
        .prepare(&[
            wire("train", "u-1"),
            wire("missing", "u-2"),
            wire("elsewhere", "u-3"),
            wire("train", "../x"),
        ])
        .await;
    assert_eq!(resp.claims.len(), 4);
    let ok = &resp.claims["u-1"];
    assert_eq!(ok.error, "");
    let ids: Vec<&str> = ok
        .devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.iter().map(String::as_str))
        .collect();
    assert_eq!(
        ids,
        [
            "gpu.kudos.dev/gpu=u-1-acme-dev0",
            "gpu.kudos.dev/gpu=u-1-acme-dev1"
        ]
    );
    assert_eq!(ok.devices[1].request_names, ["gpu"]);
    assert_eq!(ok.devices[1].pool_name, "node-a");
    assert!(resp.claims["u-2"].error.contains("not found"));
    assert!(
        resp.claims["u-3"]
            .error
            .contains("not a device of this node")
    );
    assert!(resp.claims["../x"].error.contains("not a UID"));
    let spec: cdi::Spec =
        serde_json::from_slice(&std::fs::read(env.cdi().path("u-1")).expect("spec")).expect("json");
    assert_eq!(spec.devices.len(), 2);
    assert_eq!(
        spec.devices[0].container_edits.env,
        ["ACME_VISIBLE_DEVICES=acme-uuid-0,acme-uuid-1"]
    );
    assert!(!env.cdi().exists("u-2") && !env.cdi().exists("u-3"));
}

#[tokio::test]
async fn a_restart_keeps_prepared_claims_without_the_api_server() {
    let env = Env::new();
    env.add(claim("train", "u-1", &["acme-dev1"]));
    let first = {
        let (p, _) = env.preparer();
        let first = p.prepare(&[wire("train", "u-1")]).await;
        // Again: answered from the checkpoint, the API server not asked twice.
        assert_eq!(p.prepare(&[wire("train", "u-1")]).await, first);
        first
    };
    assert_eq!(env.source.reads.load(Ordering::SeqCst), 1);

    // Restart with the claim gone from the API server and its CDI file lost.
    env.source
        .claims
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
    std::fs::remove_file(env.cdi().path("u-1")).expect("rm");
    let (p, loaded) = env.preparer();
    assert_eq!(loaded, Loaded::Restored(1));
    assert_eq!(p.prepare(&[wire("train", "u-1")]).await, first);
    assert!(env.cdi().exists("u-1"), "re-written from the checkpoint");
    assert_eq!(env.source.reads.load(Ordering::SeqCst), 1);

    // Unprepare, twice, and of a claim never prepared: all fine.
    for _ in 0..2 {
        let resp = p
            .unprepare(&[wire("train", "u-1"), wire("other", "u-9")])
            .await;
        assert!(resp.claims.values().all(|r| r.error.is_empty()), "{resp:?}");
        assert_eq!(resp.claims.len(), 2);
    }
    assert!(!env.cdi().exists("u-1"));
    let (_, loaded) = env.preparer();
    assert_eq!(loaded, Loaded::Restored(0));
}

#[tokio::test]
async fn oversized_requests_are_refused_before_any_work() {
    let env = Env::new();
    let (p, _) = env.preparer();
    let svc = DraService(Arc::new(p));
    let claims = (0..300).map(|i| wire("c", &format!("u-{i}"))).collect();
    let err = svc
        .node_prepare_resources(Request::new(api::NodePrepareResourcesRequest { claims }))
        .await
        .expect_err("too many");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(env.source.reads.load(Ordering::SeqCst), 0);
}
