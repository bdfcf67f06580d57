//! A restart at the scale the state is bounded for, against a real kube-apiserver and etcd:
//! the orchestrator binary starts on a ConfigMap store that holds 5,000 nodes' plugin reports,
//! a model learned from 100,000 runs over 1,000 classes, the last 5,000 report IDs and 1,000
//! runs accepted after the snapshot, with 5,000 Node objects to watch. Prints the state's size
//! in the store, the time from the process's start to `/readyz` 200, and its resident memory.
//!
//! ```text
//! cargo build --release -p kudos-orchestrator --bin kudos-orchestrator --example restart_at_scale
//! target/release/examples/restart_at_scale [nodes] [classes] [runs] [pending]
//! ```
//!
//! Defaults: 5,000 nodes, 1,000 classes, 100,000 runs, 1,000 pending runs. Runs are drawn by a
//! seeded generator (one class on one node, uniformly; 8 GPU models by node), so every
//! (class, node) cell is offered and the model's bounds decide what stays. The orchestrator is
//! the binary beside this example (`target/release/kudos-orchestrator`) unless `KUDOS_BIN_DIR`
//! says otherwise. Needs `e2e/build`'s etcd and kube-apiserver.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::ListParams;
use kudos_orchestrator::state::{
    DeviceRecord, PluginConfig, ProfileRecord, RunOutcome, StoredRun, VendorEntry,
};
use kudos_orchestrator::store::{Appended, Store};
use kudos_orchestrator::store_k8s::ConfigMapStore;
use kudos_scheduler_core::{Scheduler, SchedulerConfig};
use kudos_testkit::nodes::{NodeShape, create_nodes};
use kudos_testkit::orchestrator::{Orchestrator, OrchestratorOptions};
use kudos_testkit::proc::status_kib;
use kudos_testkit::{ControlPlane, ControlPlaneOptions, RunDir};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const NAME: &str = "kudos-state";
const MODELS: [&str; 8] = ["V100", "T4", "A100", "H100", "L4", "K80", "P100", "A10"];
/// Report IDs the store keeps (`store::MAX_REPORT_IDS`): the history appended before the
/// snapshot, so the store holds as many as it ever does.
const HISTORY: usize = 5_000;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// SplitMix64: a seeded, dependency-free generator (the figures must be reproducible).
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

fn node_name(i: usize) -> String {
    format!("gpu-node-{i:05}")
}

/// The `i`th run: one class on one node, an hour at most, work by class.
fn run(i: usize, draw: &mut Draw, nodes: usize, classes: usize) -> StoredRun {
    let (node, class) = (draw.below(nodes), draw.below(classes));
    let end = 1.0e6 + i as f64 * 10.0;
    let model = MODELS[node % MODELS.len()];
    StoredRun {
        seq: 0,
        report_id: format!("{}-run-{i:06}-end", node_name(node)),
        run_id: format!("{}-run-{i:06}", node_name(node)),
        node: node_name(node),
        pod_namespace: "ml".into(),
        pod_name: format!("train-{i:06}"),
        class: format!("class-{class:04}"),
        device_ids: vec![format!("nv-GPU-{node:05}-0")],
        outcome: RunOutcome::Completed,
        start: end - 3600.0 + (class % 7) as f64 * 60.0,
        end,
        gpu_busy_seconds: 3000.0,
        progress: None,
        work_done: Some(1000.0 * (1.0 + (class % 7) as f64)),
        profile: Some(ProfileRecord {
            vendor: "nvidia".into(),
            model: model.into(),
            count: 8,
            memory_bytes: 80 << 30,
        }),
        received_at: end + 1.0,
    }
}

fn plugin_config(nodes: usize) -> PluginConfig {
    let mut cfg = PluginConfig {
        generation: 1,
        unified_resource_name: "kudos.dev/gpu".into(),
        ..Default::default()
    };
    for n in 0..nodes {
        let model = MODELS[n % MODELS.len()];
        let devices = (0..8)
            .map(|d| DeviceRecord {
                id: format!("nv-GPU-{n:05}-{d}"),
                model: model.into(),
                memory_bytes: 80 << 30,
                uuid: format!("GPU-{n:05}-{d}"),
                ..Default::default()
            })
            .collect();
        let entry = VendorEntry {
            vendor_resource_name: "nvidia.com/gpu".into(),
            devices,
            plugin_version: "0.1.0".into(),
        };
        cfg.nodes
            .insert(node_name(n), BTreeMap::from([("nvidia".into(), entry)]));
    }
    cfg
}

/// `VmRSS` and `VmHWM` (peak) of `pid`, MiB.
fn memory_mib(pid: u32) -> (f64, f64) {
    let mib = |field| status_kib(pid, field).map_or(0.0, |kib| kib as f64 / 1024.0);
    (mib("VmRSS:"), mib("VmHWM:"))
}

/// Bytes of data in the store's ConfigMaps, and how many there are.
async fn stored_bytes(api: &Api<ConfigMap>) -> anyhow::Result<(usize, usize)> {
    let lp = ListParams::default().labels(&format!("kudos.dev/store={NAME}"));
    let list = api.list(&lp).await?;
    let bytes = list
        .items
        .iter()
        .flat_map(|cm| cm.data.iter().flatten())
        .map(|(k, v)| k.len() + v.len())
        .sum();
    Ok((bytes, list.items.len()))
}

fn orchestrator_bin() -> PathBuf {
    if std::env::var_os("KUDOS_BIN_DIR").is_some() {
        return kudos_testkit::paths::kudos_bin("kudos-orchestrator");
    }
    // target/<profile>/examples/restart_at_scale -> target/<profile>/kudos-orchestrator
    std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.join("kudos-orchestrator")))
        .unwrap_or_else(|| kudos_testkit::paths::kudos_bin("kudos-orchestrator"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let (nodes, classes, runs, pending) =
        (arg(1, 5_000), arg(2, 1_000), arg(3, 100_000), arg(4, 1_000));
    let opts = ControlPlaneOptions::default();
    let mut bins = opts.bins();
    bins.push(orchestrator_bin());
    let Some(dir) = RunDir::for_test("restart-at-scale", &bins)? else {
        anyhow::bail!("missing binaries (run e2e/build and build kudos-orchestrator)");
    };
    let cp = ControlPlane::start(&dir, opts).await?;

    // The model, learned as the orchestrator learns: keyed runs through `index::apply_run`.
    let t = Instant::now();
    let mut draw = Draw(7);
    let mut model = Scheduler::new(SchedulerConfig::default());
    let mut history = Vec::new();
    for i in 0..runs {
        let r = run(i, &mut draw, nodes, classes);
        if let Err(e) = kudos_orchestrator::index::apply_run(&mut model, &r) {
            eprintln!("run {i} refused: {e}");
        }
        if i + HISTORY >= runs {
            history.push(r);
        }
    }
    let snapshot = serde_json::to_vec(model.state())?;
    eprintln!(
        "model: {runs} runs learned in {:.1} s; snapshot {:.1} MB",
        t.elapsed().as_secs_f64(),
        snapshot.len() as f64 / 1e6
    );

    // The store as a long-running leader leaves it.
    let t = Instant::now();
    let store = ConfigMapStore::new(cp.client.clone(), "default", NAME);
    store.load().await?;
    store.save_plugin_config(plugin_config(nodes)).await?;
    let mut seq = 0;
    for batch in history.chunks(256) {
        for a in store.append_runs(batch.to_vec()).await? {
            if let Appended::Stored(s) = a {
                seq = s;
            }
        }
    }
    store.save_model(snapshot, seq).await?;
    let after: Vec<StoredRun> = (runs..runs + pending)
        .map(|i| run(i, &mut draw, nodes, classes))
        .collect();
    for batch in after.chunks(256) {
        store.append_runs(batch.to_vec()).await?;
    }
    let shapes: Vec<NodeShape> = (0..nodes)
        .map(|n| NodeShape {
            name: node_name(n),
            cpu_milli: 64_000,
            memory_mib: 262_144,
            gpu: 8,
            model: MODELS[n % MODELS.len()].into(),
        })
        .collect();
    create_nodes(&cp.client, &shapes, "kudos.dev/gpu").await?;
    let api: Api<ConfigMap> = Api::namespaced(cp.client.clone(), "default");
    let (bytes, objects) = stored_bytes(&api).await?;
    eprintln!(
        "store written in {:.1} s: {:.1} MB in {objects} ConfigMaps; {nodes} Node objects",
        t.elapsed().as_secs_f64(),
        bytes as f64 / 1e6
    );

    // The restart: the real binary, from exec to /readyz 200 (state loaded, the pending runs
    // replayed, Nodes and Pods listed).
    let config = dir.path().join("orchestrator.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\n\
             store:\n  kind: configMap\n  namespace: default\n  name: {NAME}\n"
        ),
    )?;
    let orch_dir = dir.path().join("orchestrator");
    std::fs::create_dir_all(&orch_dir)?;
    let o = OrchestratorOptions {
        bin: orchestrator_bin(),
        kubeconfig: Some(cp.kubeconfig.clone()),
        extra: vec![format!("--config={}", config.display())],
        ..Default::default()
    };
    let t = Instant::now();
    let mut orch = Orchestrator::start_with(&orch_dir, &o).await?;
    let ready = t.elapsed();
    let (rss_ready, peak_ready) = memory_mib(orch.pid());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (rss_later, peak_later) = memory_mib(orch.pid());
    // What the restarted model holds (the snapshot's runs plus the pending ones, which the
    // learner replays after ready).
    let learned = kudos_testkit::http::get_json(&orch.http_addr, "/state").map_or_else(
        |e| format!("unread ({e})"),
        |s| s["model"]["runs"].to_string(),
    );
    println!(
        "RESULT restart at {nodes} nodes x {classes} classes ({runs} runs + {pending} pending): \
         state {:.1} MB in {objects} ConfigMaps; /readyz after {:.2} s; RSS {rss_ready:.0} MiB \
         at ready (peak {peak_ready:.0}), {rss_later:.0} MiB 10 s later (peak {peak_later:.0}); \
         model runs {learned}",
        bytes as f64 / 1e6,
        ready.as_secs_f64()
    );
    // Where the start's time went, in the orchestrator's own words.
    if let Ok(log) = std::fs::read_to_string(orch.log()) {
        log.lines()
            .filter(|l| {
                [
                    "ConfigMap store read",
                    "state restored",
                    "after the snapshot learned",
                ]
                .iter()
                .any(|m| l.contains(m))
            })
            .for_each(|l| println!("  {l}"));
    }
    orch.stop();
    dir.pass();
    Ok(())
}
