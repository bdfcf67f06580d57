//! The unified name: from the orchestrator (stubbed `RegistryService`), else cached, else the
//! default; a node never loses its GPUs because the control plane is down.

use crate::support;

use kudos_nvml::fake::FakeNvml;
use std::time::Duration;
use support::{Kubelet, Plugin, Registry, flags, serve_registry, serve_registry_on_loopback};

struct Env {
    tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
    cache: std::path::PathBuf,
    fake: FakeNvml,
}

fn env() -> Env {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("dp");
    std::fs::create_dir_all(&dir).expect("dir");
    let nvml = tmp.path().join("nvml");
    std::fs::create_dir_all(&nvml).expect("dir");
    let fake = FakeNvml::new(&nvml, 2).expect("fake");
    let cache = tmp.path().join("state/resource-name");
    Env {
        dir,
        cache,
        fake,
        tmp,
    }
}

fn plugin_flags(e: &Env, orchestrator: Option<&str>) -> Vec<String> {
    let mut f = flags(&e.dir, e.fake.library(), &e.cache);
    let token = e.tmp.path().join("token");
    std::fs::write(&token, "s3cret\n").expect("token");
    f.push(format!("--token-file={}", token.display()));
    f.push("--orchestrator-timeout-seconds=0.5".into());
    f.push("--report-max-backoff-seconds=0.2".into());
    if let Some(addr) = orchestrator {
        f.push(format!("--orchestrator-addr={addr}"));
    }
    f
}

/// An address nothing listens on.
async fn dead_addr() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    format!("http://{addr}")
}

#[tokio::test]
async fn orchestrator_down_registers_under_the_default_name() {
    let e = env();
    let mut kubelet = Kubelet::new(&e.dir);
    kubelet.start();
    let plugin = Plugin::start(&plugin_flags(&e, Some(&dead_addr().await)));
    let (reg, _) = kubelet.registration().await;
    assert_eq!(reg.resource_name, "kudos.dev/gpu");
    kubelet.list_where(|l| l.len() == 2).await;
    plugin.stop().await;
}

#[tokio::test]
async fn orchestrator_down_registers_under_the_cached_name() {
    let e = env();
    std::fs::create_dir_all(e.cache.parent().expect("parent")).expect("dir");
    std::fs::write(&e.cache, "example.com/accel\n").expect("cache");
    let mut kubelet = Kubelet::new(&e.dir);
    kubelet.start();
    let plugin = Plugin::start(&plugin_flags(&e, Some(&dead_addr().await)));
    let (reg, _) = kubelet.registration().await;
    assert_eq!(reg.resource_name, "example.com/accel");
    plugin.stop().await;
}

#[tokio::test]
async fn orchestrator_name_is_used_cached_and_reported_with_the_token() {
    let e = env();
    let registry = Registry::named("unified.example/gpu");
    let (addr, server) = serve_registry_on_loopback(registry.clone()).await;
    let mut kubelet = Kubelet::new(&e.dir);
    kubelet.start();
    let plugin = Plugin::start(&plugin_flags(&e, Some(&addr)));
    let (reg, _) = kubelet.registration().await;
    assert_eq!(reg.resource_name, "unified.example/gpu");
    assert_eq!(
        std::fs::read_to_string(&e.cache).expect("cached").trim(),
        "unified.example/gpu"
    );
    {
        let calls = registry.calls.lock().expect("lock");
        let (req, auth) = &calls[0];
        assert_eq!(auth.as_deref(), Some("Bearer s3cret"));
        assert_eq!(req.node, "node-a");
        assert_eq!(req.vendor, "nvidia");
        assert_eq!(req.vendor_resource_name, "nvidia.com/gpu");
        assert_eq!(req.devices.len(), 2);
        assert_eq!(req.devices[0].uuid, e.fake.devices[0].uuid);
        assert_eq!(req.devices[0].id, format!("nv-{}", e.fake.devices[0].uuid));
        assert_eq!(req.devices[0].numa_node, Some(0));
        assert_eq!(req.devices[0].memory_bytes, 80 * 1024 * 1024 * 1024);
        assert!(req.devices[0].healthy);
        assert_eq!(req.plugin_version, env!("CARGO_PKG_VERSION"));
    }
    plugin.stop().await;
    server.abort();
}

#[tokio::test]
async fn orchestrator_coming_up_later_renames_and_reregisters() {
    let e = env();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr_str = listener.local_addr().expect("addr");
    drop(listener); // down at first
    let mut kubelet = Kubelet::new(&e.dir);
    kubelet.start();
    let plugin = Plugin::start(&plugin_flags(&e, Some(&format!("http://{addr_str}"))));
    let (reg, _) = kubelet.registration().await;
    assert_eq!(reg.resource_name, "kudos.dev/gpu");
    kubelet.list_where(|l| l.len() == 2).await;

    let registry = Registry::named("other.example/gpu");
    let listener = tokio::net::TcpListener::bind(addr_str)
        .await
        .expect("rebind");
    let server = serve_registry(registry, listener).await;
    let (reg, _) = kubelet.registration().await;
    assert_eq!(reg.resource_name, "other.example/gpu");
    kubelet.list_where(|l| l.len() == 2).await;
    assert_eq!(
        std::fs::read_to_string(&e.cache).expect("cached").trim(),
        "other.example/gpu"
    );
    kubelet
        .no_registration_for(Duration::from_millis(800))
        .await;
    plugin.stop().await;
    server.abort();
}

#[tokio::test]
async fn an_invalid_name_from_the_orchestrator_is_not_used() {
    let e = env();
    let registry = Registry::named("kubernetes.io/gpu");
    let (addr, server) = serve_registry_on_loopback(registry).await;
    let mut kubelet = Kubelet::new(&e.dir);
    kubelet.start();
    let plugin = Plugin::start(&plugin_flags(&e, Some(&addr)));
    let (reg, _) = kubelet.registration().await;
    assert_eq!(reg.resource_name, "kudos.dev/gpu");
    assert!(!e.cache.exists());
    plugin.stop().await;
    server.abort();
}
