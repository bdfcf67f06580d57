//! Device-plugin figures (not tests): runs the real binary with 8 fake GPUs against the kubelet
//! stand-in and prints
//! - Allocate latency over the Unix socket (p50, p99, max),
//! - time from `kubelet.sock` re-creation to the new registration (p50, max),
//! - steady resident memory of the plugin process.
//!
//! `cargo bench -p kudos-device-plugin --bench plugin [-- --allocations N --restarts N]`

// The integration tests' kubelet stand-in and plugin runner; the bench uses a few of them.
#[path = "../tests/integration/support/mod.rs"]
#[allow(dead_code)]
mod support;

use kudos_nvml::fake::FakeNvml;
use kudos_proto::deviceplugin::v1beta1 as api;
use kudos_testkit::proc::status_kib;
use std::time::{Duration, Instant};
use support::{Kubelet, plugin_client};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let allocations = arg("--allocations", 2000);
    let restarts = arg("--restarts", 20);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let tmp = tempfile::tempdir().expect("tempdir");
        let nvml_dir = tmp.path().join("nvml");
        std::fs::create_dir_all(&nvml_dir).expect("dir");
        let fake = FakeNvml::new(&nvml_dir, 8).expect("fake nvml");
        let dir = tmp.path().join("dp");
        std::fs::create_dir_all(&dir).expect("dir");
        let mut kubelet = Kubelet::new(&dir);
        kubelet.start();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kudos-device-plugin"))
            .arg(format!("--device-plugin-dir={}", dir.display()))
            .arg(format!("--nvml-library={}", fake.library().display()))
            .arg(format!("--name-cache={}", tmp.path().join("name").display()))
            .args(["--backends=nvidia", "--metrics-addr=off", "--node-name=bench", "--log-level=warn"])
            .spawn()
            .expect("start kudos-device-plugin");
        kubelet.registration().await;
        kubelet.list_where(|l| l.len() == 8).await;

        // Allocate latency, sequential, one client connection as the kubelet keeps.
        let mut client = plugin_client(&dir, "kudos.sock").await;
        let ids: Vec<String> = fake.devices.iter().map(|d| format!("nv-{}", d.uuid)).collect();
        let mut lat = Vec::with_capacity(allocations);
        for k in 0..allocations + 100 {
            let req = api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest { devices_ids: vec![ids[k % 8].clone(), ids[(k + 1) % 8].clone()] }],
            };
            let t = Instant::now();
            client.allocate(req).await.expect("allocate");
            if k >= 100 {
                lat.push(t.elapsed());
            }
        }
        lat.sort();
        println!(
            "allocate over the socket ({allocations} calls, 2 GPUs each): p50 {:?}  p99 {:?}  max {:?}",
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            lat[lat.len() - 1]
        );

        // Steady RSS after the work above, with the kubelet's stream open.
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Some(kib) = status_kib(child.id(), "VmRSS:") {
            println!("steady RSS with 8 fake GPUs: {:.1} MiB", kib as f64 / 1024.0);
        }

        // Kubelet restarts.
        let mut took = Vec::with_capacity(restarts);
        for _ in 0..restarts {
            let recreated = kubelet.restart().await;
            let (_, at) = kubelet.registration().await;
            took.push(at.duration_since(recreated));
            kubelet.list_where(|l| l.len() == 8).await;
        }
        took.sort();
        println!(
            "kubelet.sock re-creation -> registration ({restarts} restarts): p50 {:?}  max {:?}",
            percentile(&took, 0.5),
            took[took.len() - 1]
        );
        if let Some(kib) = status_kib(child.id(), "VmRSS:") {
            println!("RSS after {restarts} restarts: {:.1} MiB", kib as f64 / 1024.0);
        }
        let _ = child.kill();
        let _ = child.wait();
    });
}
