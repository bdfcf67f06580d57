//! Footprint benchmark (not a test): CPU time and memory of the real `kudos-node-agent` binary
//! sampling 8 fake GPUs (the fake `libnvidia-ml.so.1` from `kudos-nvml`, through NVML) at 1 Hz,
//! with a kubelet PodResources stand-in assigning them to pods and a receiver playing the
//! orchestrator. Target: <= 0.5 % of one core and <= 20 MiB RSS.
//!
//! `cargo bench -p kudos-node-agent --bench footprint` (seconds: `KUDOS_BENCH_SECONDS`,
//! default 60). Prints the figures; asserts nothing.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kudos_nvml::fake::FakeNvml;
use kudos_proto::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use kudos_proto::podresources::v1::*;
use kudos_testkit::proc::status_kib;
use kudos_testkit::telemetry_receiver::TestReceiver;

struct Kubelet(Vec<PodResources>);

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _: tonic::Request<ListPodResourcesRequest>,
    ) -> Result<tonic::Response<ListPodResourcesResponse>, tonic::Status> {
        Ok(tonic::Response::new(ListPodResourcesResponse {
            pod_resources: self.0.clone(),
        }))
    }
    async fn get_allocatable_resources(
        &self,
        _: tonic::Request<AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<AllocatableResourcesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn get(
        &self,
        _: tonic::Request<GetPodResourcesRequest>,
    ) -> Result<tonic::Response<GetPodResourcesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
}

/// (utime + stime in clock ticks, VmRSS KiB, VmHWM KiB) of `pid`.
fn usage(pid: u32) -> (u64, u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after the command: state is index 0, utime 11, stime 12.
    let ticks = f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let kib = |field| status_kib(pid, field).unwrap_or(0);
    (ticks, kib("VmRSS:"), kib("VmHWM:"))
}

/// CPU clock ticks of the threads of `pid` named `name` (still alive).
fn thread_ticks(pid: u32, name: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .map(|stat| {
            let after = stat
                .rsplit_once(')')
                .map(|(_, r)| r.to_owned())
                .unwrap_or_default();
            let f: Vec<&str> = after.split_whitespace().collect();
            let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            field(11) + field(12)
        })
        .sum()
}

fn clock_ticks() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs: u64 = std::env::var("KUDOS_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fake = FakeNvml::new(dir.path(), 8).expect("fake nvml");
    for (i, d) in fake.devices.iter_mut().enumerate() {
        d.gpu_utilization_percent = 10 * i as u32;
        d.memory_used_bytes = (i as u64 + 1) << 30;
    }
    fake.write().expect("write fake config");

    // Four pods with two GPUs each.
    let pods = (0..4)
        .map(|p| PodResources {
            name: format!("train-{p}"),
            namespace: "bench".into(),
            containers: vec![ContainerResources {
                name: "main".into(),
                devices: vec![ContainerDevices {
                    resource_name: "kudos.dev/gpu".into(),
                    device_ids: (0..2)
                        .map(|k| format!("nv-{}", fake.devices[p * 2 + k].uuid))
                        .collect(),
                    topology: None,
                }],
                ..Default::default()
            }],
        })
        .collect();
    let sock = dir.path().join("kubelet.sock");
    let listener = tokio::net::UnixListener::bind(&sock).expect("bind kubelet socket");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(Kubelet(pods)))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let rx = TestReceiver::default();
    let (addr, _server) = rx
        .bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind receiver");

    let mut agent = Command::new(env!("CARGO_BIN_EXE_kudos-node-agent"))
        .args([
            "--node-name",
            "bench-node",
            "--gpu-backend",
            "nvml",
            "--sample-period",
            "1s",
            "--progress-period",
            "10s",
        ])
        .arg("--nvml-library")
        .arg(fake.library())
        .arg("--pod-resources-socket")
        .arg(&sock)
        .arg("--outbox-dir")
        .arg(dir.path().join("outbox"))
        .args([
            "--orchestrator-url",
            &format!("http://{addr}"),
            "--metrics-addr",
            "127.0.0.1:0",
            "--log-level",
            "warn",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start agent");
    let pid = agent.id();
    tokio::time::sleep(Duration::from_secs(5)).await; // start-up and first runs
    let (t0, _, _) = usage(pid);
    let e0 = thread_ticks(pid, "nvml-events");
    let start = Instant::now();
    let mut peak_rss = 0;
    while start.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        peak_rss = peak_rss.max(usage(pid).1);
    }
    let (t1, rss, hwm) = usage(pid);
    let e1 = thread_ticks(pid, "nvml-events");
    let wall = start.elapsed().as_secs_f64();
    let cpu = (t1 - t0) as f64 / clock_ticks() as f64;
    let events = e1.saturating_sub(e0) as f64 / clock_ticks() as f64;
    let _ = agent.kill();
    let _ = agent.wait();
    let snapshots = rx.state().reports.len();
    println!("kudos-node-agent footprint, 8 fake GPUs (NVML), 1 Hz, 4 pods, {wall:.0} s:");
    println!(
        "  cpu time     {cpu:.3} s  = {:.3} % of one core (whole process)",
        cpu / wall * 100.0
    );
    println!(
        "    of which  {events:.3} s  = {:.3} % in the XID event thread, i.e. the fake library's 5 ms poll loop",
        events / wall * 100.0
    );
    println!(
        "    the rest  {:.3} s  = {:.3} % of one core (sampling, attribution, runs, outbox, gRPC, metrics)",
        cpu - events,
        (cpu - events) / wall * 100.0
    );
    println!(
        "  rss          {:.1} MiB now, {:.1} MiB peak sampled, {:.1} MiB high-water",
        rss as f64 / 1024.0,
        peak_rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    println!(
        "  reports      {snapshots} in-progress snapshots received, {} heartbeats",
        rx.state().heartbeats.len()
    );
}
