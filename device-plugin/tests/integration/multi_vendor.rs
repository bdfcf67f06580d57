//! One process serves NVIDIA (fake NVML), AMD (fake sysfs tree) and a static-file vendor
//! under one name; `Allocate` dispatches by device-ID prefix. Also checks `/metrics` with
//! promtool.

use crate::support;

use kudos_device_plugin::backend::DeviceBackend;
use kudos_device_plugin::backend::amd::AmdBackend;
use kudos_nvml::fake::FakeNvml;
use kudos_proto::deviceplugin::v1beta1 as api;
use std::path::Path;
use support::{Kubelet, Plugin, healthy, plugin_client};

/// Builds `<root>/sys/class/drm/cardN -> devices/<bdf>` for AMD cards (and one Intel card that
/// must be ignored), and `<root>/dev/kfd`.
fn fake_sysfs(root: &Path) {
    let pci = root.join("sys/devices/pci0000:00");
    let drm = root.join("sys/class/drm");
    std::fs::create_dir_all(&drm).expect("drm");
    for (card, bdf, vendor, render, numa) in [
        ("card0", "0000:03:00.0", "0x1002", "renderD128", "0"),
        ("card1", "0000:83:00.0", "0x1002", "renderD129", "1"),
        ("card2", "0000:00:02.0", "0x8086", "renderD130", "-1"),
    ] {
        let dev = pci.join(bdf);
        std::fs::create_dir_all(dev.join("drm").join(render)).expect("render");
        std::fs::write(dev.join("vendor"), format!("{vendor}\n")).expect("vendor");
        std::fs::write(dev.join("numa_node"), format!("{numa}\n")).expect("numa");
        std::fs::write(dev.join("product_name"), "AMD Instinct MI300X\n").expect("name");
        std::fs::write(dev.join("mem_info_vram_total"), "206158430208\n").expect("vram");
        std::fs::create_dir_all(drm.join(card)).expect("card");
        std::os::unix::fs::symlink(&dev, drm.join(card).join("device")).expect("link");
        // Connector entries must be skipped.
        std::fs::create_dir_all(drm.join(format!("{card}-DP-1"))).expect("connector");
    }
    std::fs::create_dir_all(root.join("dev/dri")).expect("dev");
    std::fs::write(root.join("dev/kfd"), "").expect("kfd");
}

#[test]
fn amd_discovery_reads_sysfs_and_requires_kfd() {
    let tmp = tempfile::tempdir().expect("tempdir");
    fake_sysfs(tmp.path());
    let b = AmdBackend::discover(&tmp.path().join("sys"), tmp.path()).expect("discover");
    let ids: Vec<&str> = b.devices().iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, vec!["amd-0000:03:00.0", "amd-0000:83:00.0"]);
    assert_eq!(b.devices()[1].numa_node, Some(1));
    assert_eq!(b.devices()[0].model, "AMD Instinct MI300X");
    assert_eq!(b.devices()[0].memory_bytes, 206_158_430_208);
    assert!(b.probe(&b.devices()[0]).is_ok());
    std::fs::remove_file(tmp.path().join("dev/kfd")).expect("rm");
    assert!(AmdBackend::discover(&tmp.path().join("sys"), tmp.path()).is_err());
    // No cards at all is not an error.
    let empty = tempfile::tempdir().expect("tempdir");
    assert!(
        AmdBackend::discover(empty.path(), empty.path())
            .expect("empty")
            .devices()
            .is_empty()
    );
}

#[tokio::test]
async fn three_vendors_one_name_dispatch_by_prefix() {
    let tmp = tempfile::tempdir().expect("tempdir");
    fake_sysfs(tmp.path());
    let nvml_dir = tmp.path().join("nvml");
    std::fs::create_dir_all(&nvml_dir).expect("dir");
    let fake = FakeNvml::new(&nvml_dir, 2).expect("fake");
    let static_file = tmp.path().join("acme.json");
    std::fs::write(
        &static_file,
        r#"{"version":"v1","vendor":"acme","resourceName":"acme.com/npu","visibleDevicesEnv":"ACME_VISIBLE_DEVICES",
            "devices":[{"id":"npu0","model":"Acme N1","numaNode":0,"deviceNodes":["/dev/null"]}]}"#,
    )
    .expect("static");
    let dir = tmp.path().join("dp");
    std::fs::create_dir_all(&dir).expect("dir");
    let mut kubelet = Kubelet::new(&dir);
    kubelet.start();
    let plugin = Plugin::start(&[
        format!("--device-plugin-dir={}", dir.display()),
        format!("--nvml-library={}", fake.library().display()),
        format!("--sysfs-root={}", tmp.path().join("sys").display()),
        format!("--dev-root={}", tmp.path().display()),
        format!("--static-devices={}", static_file.display()),
        format!("--name-cache={}", tmp.path().join("c").display()),
        "--backends=nvidia,amd,static".into(),
    ]);
    let (reg, _) = kubelet.registration().await;
    assert_eq!(reg.resource_name, "kudos.dev/gpu");
    let list = kubelet.list_where(|l| l.len() == 5).await;
    assert_eq!(healthy(&list), 5);
    let nv = format!("nv-{}", fake.devices[0].uuid);
    let mut c = plugin_client(&dir, "kudos.sock").await;
    let resp = c
        .allocate(api::AllocateRequest {
            container_requests: vec![
                api::ContainerAllocateRequest {
                    devices_ids: vec!["amd-0000:83:00.0".into()],
                },
                api::ContainerAllocateRequest {
                    devices_ids: vec![nv.clone(), "acme-npu0".into(), "amd-0000:03:00.0".into()],
                },
            ],
        })
        .await
        .expect("allocate")
        .into_inner();
    let amd = &resp.container_responses[0];
    let paths: Vec<&str> = amd
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert_eq!(paths, vec!["/dev/kfd", "/dev/dri/renderD129"]);
    assert_eq!(
        amd.devices[1].host_path,
        tmp.path().join("dev/dri/renderD129").display().to_string()
    );
    assert!(amd.envs.is_empty());
    let mixed = &resp.container_responses[1];
    assert_eq!(
        mixed.envs.get("NVIDIA_VISIBLE_DEVICES"),
        Some(&fake.devices[0].uuid)
    );
    assert_eq!(
        mixed.envs.get("ACME_VISIBLE_DEVICES").map(String::as_str),
        Some("npu0")
    );
    let paths: Vec<&str> = mixed
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert_eq!(paths, vec!["/dev/null", "/dev/kfd", "/dev/dri/renderD128"]);
    plugin.stop().await;
}

#[tokio::test]
async fn metrics_pass_promtool() {
    use kudos_device_plugin::backend::{Backends, Health};
    let m = kudos_device_plugin::metrics::Metrics::new();
    m.registration(true);
    m.registration(false);
    m.allocation(true, 0.0004);
    m.allocation(false, 0.002);
    m.health_transition("nvidia", Health::Unhealthy);
    m.reregistration("stream_closed");
    m.report(false);
    m.set_devices(
        &Backends::new(Vec::new()).expect("empty"),
        &Default::default(),
    );
    let text = m.encode();
    for needle in [
        "kudos_device_plugin_registrations_total{result=\"ok\"} 1",
        "kudos_device_plugin_allocate_duration_seconds_count 2",
        "kudos_device_plugin_health_transitions_total{vendor=\"nvidia\",health=\"unhealthy\"} 1",
        "kudos_device_plugin_reregistrations_total{reason=\"stream_closed\"} 1",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
    assert!(m.is_ready());

    // Served over HTTP; Prometheus text unless OpenMetrics is asked for.
    use tower::ServiceExt as _;
    let req = axum::http::Request::get("/metrics")
        .body(axum::body::Body::empty())
        .expect("req");
    let resp = m.router().oneshot(req).await.expect("serve");
    assert_eq!(resp.status(), 200);
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("body");
    let text = String::from_utf8(body.to_vec()).expect("utf8");
    assert!(
        text.contains("# TYPE kudos_device_plugin_registrations_total counter"),
        "{text}"
    );
    assert!(!text.contains("# EOF"));
    let req = axum::http::Request::get("/ready")
        .body(axum::body::Body::empty())
        .expect("req");
    assert_eq!(m.router().oneshot(req).await.expect("serve").status(), 200);

    if let Some(report) = kudos_testkit::promtool_check_metrics(&text).expect("promtool") {
        assert!(report.success, "promtool: {}\n{text}", report.output);
    }
}
