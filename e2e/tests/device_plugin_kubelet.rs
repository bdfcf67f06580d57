//! Scenario 1: `kudos-device-plugin` against the kubelet's real device manager (kubelet-dm):
//! registration of `kudos.dev/gpu` with fake NVML GPUs, XID → unhealthy → recovery,
//! allocation through the kubelet's admission path, kubelet restart → re-registration (timed),
//! the PodResources server showing the allocation, and the node agent attributing it.

use kudos_e2e::kubelet::{Capacity, pod_resources_list};
use kudos_e2e::paths::{kudos_bin, upstream_bin};
use kudos_e2e::proc::{Proc, free_port, wait_for};
use kudos_e2e::{KubeletDm, RunDir, http, require_bins};
use kudos_nvml::fake::FakeNvml;
use std::process::Command;
use std::time::{Duration, Instant};

const RES: &str = "kudos.dev/gpu";
const GPUS: u32 = 4;

async fn wait_capacity(
    dm: &KubeletDm,
    what: &str,
    timeout: Duration,
    f: impl Fn(&Capacity) -> bool,
) -> anyhow::Result<Capacity> {
    wait_for(what, timeout, Duration::from_millis(10), async || {
        dm.capacity().ok().filter(|c| f(c))
    })
    .await
}

fn count(m: &std::collections::BTreeMap<String, i64>) -> i64 {
    m.get(RES).copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_plugin_with_real_kubelet_device_manager() -> anyhow::Result<()> {
    let plugin = kudos_bin("kudos-device-plugin");
    let agent = kudos_bin("kudos-node-agent");
    if !require_bins(
        "device_plugin_kubelet",
        &[upstream_bin("kubelet-dm"), plugin.clone(), agent.clone()],
    ) {
        return Ok(());
    }
    let run = RunDir::new("device-plugin")?;
    let mut dm = KubeletDm::start(&run.join("kubelet"), &run.join("kubelet-dm.log")).await?;

    let nvml_dir = run.join("nvml");
    std::fs::create_dir_all(&nvml_dir)?;
    let mut fake = FakeNvml::new(&nvml_dir, GPUS)?;
    for d in &mut fake.devices {
        d.name = "Tesla T4".into();
        d.memory_bytes = 16 << 30;
    }
    fake.write()?;
    let devroot = run.join("devroot");
    std::fs::create_dir_all(&devroot)?;

    // The plugin runs inside kubelet-dm's mount namespace and uses the default
    // /var/lib/kubelet/device-plugins, like a DaemonSet pod with that hostPath.
    let argv: Vec<String> = vec![
        plugin.display().to_string(),
        "--node-name=e2e-node".into(),
        "--backends=nvidia".into(),
        format!("--nvml-library={}", fake.library().display()),
        "--nvidia-device-specs".into(),
        format!("--dev-root={}", devroot.display()),
        format!("--name-cache={}", run.join("name-cache").display()),
        "--metrics-addr=off".into(),
        "--recovery-quiet-seconds=2".into(),
        "--probe-interval-seconds=0.5".into(),
    ];
    let plugin_log = run.join("kudos-device-plugin.log");
    let pid = dm.spawn(
        &argv,
        &[(
            "KUDOS_LOG",
            std::env::var("KUDOS_E2E_PLUGIN_LOG").unwrap_or_else(|_| "info".into()),
        )],
        &plugin_log,
    )?;

    let c = wait_capacity(
        &dm,
        "kudos.dev/gpu registered",
        Duration::from_secs(30),
        |c| count(&c.capacity) == GPUS as i64,
    )
    .await?;
    assert_eq!(count(&c.allocatable), GPUS as i64);
    let ids: Vec<String> = c.devices[RES].keys().cloned().collect();
    assert!(
        ids.iter()
            .all(|i| i.starts_with("nv-GPU-") && i.len() <= 63),
        "vendor-prefixed stable ids: {ids:?}"
    );

    // XID 79 (fallen off the bus) on GPU 1: allocatable N-1, capacity N.
    fake.xid(1, 79);
    fake.write()?;
    let c = wait_capacity(&dm, "GPU 1 unhealthy", Duration::from_secs(15), |c| {
        count(&c.allocatable) == GPUS as i64 - 1
    })
    .await?;
    assert_eq!(
        count(&c.capacity),
        GPUS as i64,
        "an unhealthy device stays in capacity"
    );
    // The device manager lists only healthy devices as allocatable.
    let bad: Vec<_> = ids
        .iter()
        .filter(|i| !c.devices[RES].contains_key(*i))
        .cloned()
        .collect();
    assert_eq!(bad.len(), 1);
    assert!(
        bad[0].contains(&fake.devices[1].uuid),
        "the XID's GPU is the unhealthy one: {bad:?}"
    );
    // An application XID (13) is ignored by default.
    fake.xid(2, 13);
    fake.write()?;
    // Recovery after the quiet period.
    let t = Instant::now();
    wait_capacity(&dm, "GPU 1 recovered", Duration::from_secs(30), |c| {
        count(&c.allocatable) == GPUS as i64
    })
    .await?;
    eprintln!(
        "recovery observed {:?} after the XID 13 write (quiet period 2 s)",
        t.elapsed()
    );
    let c = dm.capacity()?;
    assert_eq!(
        c.devices[RES].len(),
        GPUS as usize,
        "XID 13 must not mark a GPU unhealthy: {:?}",
        c.devices
    );

    // Allocation through the kubelet's admission path.
    let uid = "11111111-2222-4333-8444-555555555555";
    let a = dm.admit("default", "trainer", uid, &[("main", &[(RES, "2")])])?;
    assert_eq!(a["admitted"], true, "{a}");
    let cont = &a["containers"][0];
    let given: Vec<String> = cont["device_ids"][RES]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(given.len(), 2, "{a}");
    let visible = cont["envs"]["NVIDIA_VISIBLE_DEVICES"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for id in &given {
        let uuid = id.trim_start_matches("nv-");
        assert!(
            visible.contains(uuid),
            "NVIDIA_VISIBLE_DEVICES={visible} names {uuid}"
        );
    }
    let paths: Vec<&str> = cont["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["container_path"].as_str())
        .collect();
    assert!(paths.contains(&"/dev/nvidiactl"), "device nodes: {paths:?}");
    assert_eq!(
        paths
            .iter()
            .filter(|p| p.starts_with("/dev/nvidia")
                && p[11..].chars().all(|c| c.is_ascii_digit())
                && p.len() > 11)
            .count(),
        2,
        "{paths:?}"
    );
    // Only 2 GPUs are left: a 3-GPU pod is rejected at admission.
    let r = dm.admit(
        "default",
        "too-big",
        "22222222-2222-4333-8444-555555555555",
        &[("main", &[(RES, "3")])],
    )?;
    assert_eq!(r["admitted"], false, "{r}");

    // Kubelet restart: sockets deleted, new registration server; the plugin must re-register.
    let t = Instant::now();
    let generation = dm.restart()?;
    let c = wait_capacity(
        &dm,
        "re-registration after kubelet restart",
        Duration::from_secs(30),
        |c| c.generation == generation && count(&c.capacity) == GPUS as i64,
    )
    .await?;
    let rereg = t.elapsed();
    eprintln!(
        "RESULT re-registration after kubelet restart: {} ms",
        rereg.as_millis()
    );
    assert!(
        rereg < Duration::from_secs(10),
        "re-registration took {rereg:?}"
    );
    assert_eq!(count(&c.allocatable), GPUS as i64);

    // The restarted kubelet's PodResources server shows the checkpointed allocation.
    let sock = dm.pod_resources_socket();
    let list = pod_resources_list(&sock).await?;
    let pod = list
        .pod_resources
        .iter()
        .find(|p| p.name == "trainer")
        .expect("trainer in PodResources");
    let mut listed: Vec<String> = pod.containers[0]
        .devices
        .iter()
        .filter(|d| d.resource_name == RES)
        .flat_map(|d| d.device_ids.clone())
        .collect();
    listed.sort();
    let mut want = given.clone();
    want.sort();
    assert_eq!(listed, want, "PodResources after restart");

    // The node agent attributes those GPUs to the pod (DCGM-style labels on /metrics).
    let mport = free_port();
    let mut cmd = Command::new(&agent);
    cmd.args([
        "--node-name=e2e-node".to_string(),
        "--gpu-backend=nvml".into(),
        format!("--nvml-library={}", fake.library().display()),
        format!("--pod-resources-socket={}", sock.display()),
        "--sample-period=200ms".into(),
        format!("--outbox-dir={}", run.join("outbox").display()),
        format!("--metrics-addr=127.0.0.1:{mport}"),
    ])
    .env("RUST_LOG", "info");
    let mut agent_proc = Proc::spawn("kudos-node-agent", cmd, &run.join("kudos-node-agent.log"))?;
    let addr = format!("127.0.0.1:{mport}");
    let metrics = wait_for(
        "node agent attributes the GPUs to the pod",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || {
            let text = http::request("GET", &addr, "/metrics", None)
                .ok()
                .map(|r| String::from_utf8_lossy(&r.body).to_string())?;
            let ok = given.iter().all(|id| {
                let uuid = id.trim_start_matches("nv-");
                text.lines().any(|l| {
                    l.starts_with("DCGM_FI_DEV_GPU_UTIL")
                        && l.contains(uuid)
                        && l.contains("pod=\"trainer\"")
                        && l.contains("namespace=\"default\"")
                })
            });
            ok.then_some(text)
        },
    )
    .await?;
    let others = fake
        .devices
        .iter()
        .filter(|d| !given.iter().any(|g| g.contains(&d.uuid)))
        .count();
    assert_eq!(others, 2);
    assert!(!metrics.lines().any(|l| l.contains("pod=\"too-big\"")));
    agent_proc.check_running()?;
    agent_proc.stop();

    // The pod ends: its devices are free again.
    dm.delete_pod(uid)?;
    let r = dm.admit(
        "default",
        "after",
        "33333333-2222-4333-8444-555555555555",
        &[("main", &[(RES, "4")])],
    )?;
    assert_eq!(
        r["admitted"], true,
        "all 4 GPUs free after the pod ended: {r}"
    );

    dm.kill(pid, 15)?;
    dm.check_running()?;
    run.pass();
    Ok(())
}

/// Design §2.1 steps 2–4: the plugin reports to the orchestrator, registers with the kubelet
/// under the unified name the orchestrator answers (here a non-default one), caches it, and
/// keeps registering under it when the orchestrator is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_plugin_registers_under_orchestrator_unified_name() -> anyhow::Result<()> {
    use kudos_e2e::orchestrator::{Orchestrator, node_token};
    let plugin = kudos_bin("kudos-device-plugin");
    if !require_bins(
        "device_plugin_unified_name",
        &[
            upstream_bin("kubelet-dm"),
            plugin.clone(),
            kudos_bin("kudos-orchestrator"),
        ],
    ) {
        return Ok(());
    }
    const UNIFIED: &str = "example.com/accel";
    let run = RunDir::new("device-plugin-name")?;
    let dm = KubeletDm::start(&run.join("kubelet"), &run.join("kubelet-dm.log")).await?;
    let mut orch = Orchestrator::start(
        run.path(),
        None,
        &["e2e-node".to_string()],
        &[format!("--unified-resource-name={UNIFIED}")],
    )
    .await?;
    let nvml_dir = run.join("nvml");
    std::fs::create_dir_all(&nvml_dir)?;
    let fake = FakeNvml::new(&nvml_dir, 2)?;
    fake.write()?;
    let token = run.join("token");
    std::fs::write(&token, node_token("e2e-node"))?;
    let argv: Vec<String> = vec![
        plugin.display().to_string(),
        "--node-name=e2e-node".into(),
        "--backends=nvidia".into(),
        format!("--nvml-library={}", fake.library().display()),
        format!("--name-cache={}", run.join("name-cache").display()),
        format!("--orchestrator-addr=http://{}", orch.grpc_addr),
        format!("--token-file={}", token.display()),
        "--metrics-addr=off".into(),
    ];
    let env = [("KUDOS_LOG", "info".to_string())];
    let pid = dm.spawn(&argv, &env, &run.join("kudos-device-plugin.log"))?;
    let has = |c: &Capacity, r: &str| c.capacity.get(r).copied().unwrap_or(0) == 2;
    let c = wait_for(
        "registered under the orchestrator's unified name",
        Duration::from_secs(30),
        Duration::from_millis(20),
        async || dm.capacity().ok().filter(|c| has(c, UNIFIED)),
    )
    .await?;
    assert!(
        !c.capacity.contains_key(RES),
        "only the unified name is registered: {:?}",
        c.capacity
    );
    let st = http::get_json(&orch.http_addr, "/state")?;
    let entry = &st["pluginConfig"]["nodes"]["e2e-node"];
    assert!(
        entry.to_string().contains("nvidia.com/gpu"),
        "plugin configuration records the vendor name: {st}"
    );

    // Control plane down: a restarted plugin uses the cached name.
    orch.stop();
    dm.kill(pid, 15)?;
    wait_for(
        "plugin gone",
        Duration::from_secs(15),
        Duration::from_millis(50),
        async || {
            dm.capacity()
                .ok()
                .filter(|c| c.allocatable.get(UNIFIED).copied().unwrap_or(0) == 0)
        },
    )
    .await?;
    let _pid2 = dm.spawn(&argv, &env, &run.join("kudos-device-plugin-2.log"))?;
    wait_for(
        "re-registered from the name cache with the orchestrator down",
        Duration::from_secs(30),
        Duration::from_millis(20),
        async || {
            dm.capacity()
                .ok()
                .filter(|c| has(c, UNIFIED) && c.allocatable.get(UNIFIED).copied() == Some(2))
        },
    )
    .await?;
    run.pass();
    Ok(())
}
