//! Scheduling throughput through the real kube-scheduler, with and without the Kudos extender.
//!
//! For each mode: a fresh etcd + kube-apiserver, the Alibaba 2023 GPU-node shapes (1,213 nodes)
//! as Node objects, N pending pods (`kudos.dev/gpu: 1`, a `kudos.dev/class` label), then
//! kube-scheduler is started (plain, or wired to a `kudos-orchestrator` started against the
//! same API server) and a watch times the bindings. Throughput = bound pods / (last bind -
//! first bind). Prints a table and one JSON line.
//!
//! `kudos-e2e-throughput [--pods N] [--qps Q] [--modes baseline,kudos,kudos-prioritize,null-extender] [--nodes N]`

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kudos_e2e::nodes::{alibaba_shapes, create_nodes};
use kudos_e2e::orchestrator::Orchestrator;
use kudos_e2e::paths::{kudos_bin, upstream_bin};
use kudos_e2e::{ControlPlane, ControlPlaneOptions, ExtenderOptions, RunDir, require_bins};
use serde_json::json;
use std::collections::HashSet;
use std::time::{Duration, Instant};

const CLASSES: [&str; 4] = ["resnet50", "transformer", "lm", "recommendation"];

struct Opts {
    pods: usize,
    qps: u32,
    modes: Vec<String>,
    nodes: Option<usize>,
}

/// Parses the flags. Modes: `baseline` (no extender), `kudos` (the extender as
/// `deploy/scheduler` ships it), `kudos-prioritize` (the same without filter), `null-extender`
/// (filter + prioritize answered by a do-nothing server, kube-scheduler binds: the protocol's
/// floor).
fn parse() -> Result<Opts> {
    let mut o = Opts {
        pods: 1000,
        qps: 1000,
        modes: vec!["baseline".into(), "kudos".into()],
        nodes: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut v = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--pods" => o.pods = v()?.parse()?,
            "--qps" => o.qps = v()?.parse()?,
            "--nodes" => o.nodes = Some(v()?.parse()?),
            "--modes" => o.modes = v()?.split(',').map(str::to_string).collect(),
            "-h" | "--help" => {
                println!(
                    "kudos-e2e-throughput [--pods N=1000] [--qps Q=1000] [--modes baseline,kudos,kudos-prioritize,null-extender] [--nodes N]"
                );
                std::process::exit(0);
            }
            _ => bail!("unknown argument {a}"),
        }
    }
    Ok(o)
}

struct Outcome {
    mode: String,
    pods: usize,
    nodes: usize,
    bound: usize,
    bind_window: Duration,
    since_start: Duration,
    /// (verb, mean ms, calls) as the orchestrator measured its extender handlers.
    extender_ms: Vec<(String, f64, u64)>,
    /// CPU seconds each process used from scheduler start to the last binding.
    cpu: Vec<(String, f64)>,
}

impl Outcome {
    fn rate(&self) -> f64 {
        if self.bound < 2 {
            return 0.0;
        }
        (self.bound - 1) as f64 / self.bind_window.as_secs_f64().max(1e-9)
    }
}

async fn run_mode(mode: &str, o: &Opts) -> Result<Outcome> {
    let run = RunDir::new(&format!("throughput-{mode}"))?;
    let mut cp = ControlPlane::start(&run, ControlPlaneOptions::default()).await?;
    let mut shapes = alibaba_shapes()?;
    if let Some(n) = o.nodes {
        shapes.truncate(n);
    }
    let t = Instant::now();
    create_nodes(&cp.client, &shapes, "kudos.dev/gpu").await?;
    eprintln!(
        "[{mode}] {} nodes created in {:?}",
        shapes.len(),
        t.elapsed()
    );

    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let t = Instant::now();
    futures::stream::iter(0..o.pods)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let res = json!({"cpu": "1", "memory": "1Gi", "kudos.dev/gpu": "1"});
                let p: Pod = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("bench-{i:05}"), "labels": {"kudos.dev/class": CLASSES[i % CLASSES.len()]}},
                    "spec": {"containers": [{"name": "main", "image": "registry.invalid/none:0",
                             "resources": {"requests": res, "limits": res}}]}
                }))?;
                pods.create(&PostParams::default(), &p).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    eprintln!("[{mode}] {} pods created in {:?}", o.pods, t.elapsed());

    let mut orch = None;
    let extender = if mode == "null-extender" {
        let mut e = ExtenderOptions::kudos(kudos_e2e::null_extender::start()?);
        e.filter_verb = Some("filter".into());
        e.prioritize_verb = Some("prioritize".into());
        e.bind_verb = None;
        Some(e)
    } else if mode.starts_with("kudos") {
        let names: Vec<String> = shapes.iter().map(|s| s.name.clone()).collect();
        let orc = Orchestrator::start(run.path(), Some(&cp.kubeconfig), &names, &[]).await?;
        let mut e = ExtenderOptions::kudos(orc.extender_url());
        match mode {
            "kudos" => {}
            "kudos-prioritize" => {
                e.filter_verb = None;
                e.ignored_by_scheduler = false;
            }
            _ => bail!("unknown mode {mode}"),
        }
        orch = Some(orc);
        Some(e)
    } else {
        None
    };

    // Watch bindings before the scheduler starts.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let watch_api = pods.clone();
    let watch = tokio::spawn(async move {
        let mut s = watcher(watch_api, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Ok(Some(p)) = s.try_next().await {
            if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
                let _ = tx.send((p.metadata.name.unwrap_or_default(), Instant::now()));
            }
        }
    });
    let mut pids = cp.pids();
    if let Some(orc) = &orch {
        pids.push(("kudos-orchestrator".into(), orc.pid()));
    }
    let start = Instant::now();
    cp.start_scheduler(o.qps, extender.as_ref())?;
    pids = cp
        .pids()
        .into_iter()
        .filter(|(n, _)| n == "kube-scheduler")
        .chain(pids)
        .collect();
    let cpu0: Vec<f64> = pids
        .iter()
        .map(|(_, p)| kudos_e2e::proc::cpu_seconds(*p).unwrap_or(0.0))
        .collect();
    let mut bound = HashSet::new();
    let (mut first, mut last) = (None, None);
    let deadline = start + Duration::from_secs(900);
    while bound.len() < o.pods {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left.min(Duration::from_secs(60)), rx.recv()).await {
            Ok(Some((name, at))) => {
                if bound.insert(name) {
                    first.get_or_insert(at);
                    last = Some(at);
                }
            }
            Ok(None) => bail!("pod watch ended"),
            Err(_) => {
                eprintln!(
                    "[{mode}] no binding for 60 s ({} of {} bound); logs in {}",
                    bound.len(),
                    o.pods,
                    run.path().display()
                );
                break;
            }
        }
    }
    watch.abort();
    let cpu: Vec<(String, f64)> = pids
        .iter()
        .zip(cpu0)
        .map(|((n, p), c0)| {
            (
                n.clone(),
                kudos_e2e::proc::cpu_seconds(*p).unwrap_or(c0) - c0,
            )
        })
        .collect();
    cp.check_running()?;
    let mut extender_ms = Vec::new();
    if let Some(orc) = orch.as_mut() {
        orc.check_running()?;
        if let Ok(r) = kudos_e2e::http::request("GET", &orc.http_addr, "/metrics", None) {
            extender_ms = extender_means(&String::from_utf8_lossy(&r.body));
        }
        orc.stop();
    }
    if bound.len() == o.pods {
        run.pass();
    }
    let (f, l) = (first.unwrap_or(start), last.unwrap_or(start));
    Ok(Outcome {
        mode: mode.to_string(),
        pods: o.pods,
        nodes: shapes.len(),
        bound: bound.len(),
        bind_window: l - f,
        since_start: l - start,
        extender_ms,
        cpu,
    })
}

/// Mean extender handling time per verb (ms, count) from the orchestrator's own histogram.
fn extender_means(metrics: &str) -> Vec<(String, f64, u64)> {
    let base = "kudos_orchestrator_extender_request_duration_seconds";
    let mut sums = std::collections::BTreeMap::<String, (f64, u64)>::new();
    for l in metrics.lines() {
        let (is_sum, rest) = if let Some(r) = l.strip_prefix(&format!("{base}_sum{{")) {
            (true, r)
        } else if let Some(r) = l.strip_prefix(&format!("{base}_count{{")) {
            (false, r)
        } else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let verb = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("verb="))
            .unwrap_or(labels)
            .trim_matches('"')
            .to_string();
        let v: f64 = value
            .split_whitespace()
            .next()
            .and_then(|x| x.parse().ok())
            .unwrap_or(0.0);
        let e = sums.entry(verb).or_default();
        if is_sum { e.0 += v } else { e.1 += v as u64 }
    }
    sums.into_iter()
        .filter(|(_, (_, c))| *c > 0)
        .map(|(k, (s, c))| (k, s * 1000.0 / c as f64, c))
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let o = parse()?;
    let mut bins = vec![
        upstream_bin("etcd"),
        upstream_bin("kube-apiserver"),
        upstream_bin("kube-scheduler"),
    ];
    if o.modes.iter().any(|m| m.starts_with("kudos")) {
        bins.push(kudos_bin("kudos-orchestrator"));
    }
    if !require_bins("throughput", &bins) {
        return Ok(());
    }
    let mut out = Vec::new();
    for m in &o.modes {
        out.push(run_mode(m, &o).await?);
    }
    println!(
        "{:<10} {:>6} {:>6} {:>6} {:>12} {:>14} {:>9}",
        "mode", "nodes", "pods", "bound", "bind window", "since start", "pods/s"
    );
    for r in &out {
        println!(
            "{:<10} {:>6} {:>6} {:>6} {:>11.2}s {:>13.2}s {:>9.1}",
            r.mode,
            r.nodes,
            r.pods,
            r.bound,
            r.bind_window.as_secs_f64(),
            r.since_start.as_secs_f64(),
            r.rate()
        );
    }
    for r in &out {
        let per_pod: Vec<String> = r
            .cpu
            .iter()
            .map(|(n, c)| format!("{n} {:.2}", c * 1000.0 / r.bound.max(1) as f64))
            .collect();
        println!("{}: CPU ms per bound pod: {}", r.mode, per_pod.join(", "));
        for (verb, ms, n) in &r.extender_ms {
            println!(
                "{}: extender {verb}: mean {ms:.2} ms over {n} calls (orchestrator's histogram)",
                r.mode
            );
        }
    }
    let base = out.iter().find(|r| r.mode == "baseline").map(Outcome::rate);
    let mut ratios = serde_json::Map::new();
    for r in out.iter().filter(|r| r.mode != "baseline") {
        if let Some(b) = base.filter(|b| *b > 0.0) {
            println!(
                "ratio {}/baseline = {:.3} (goal >= 0.9)",
                r.mode,
                r.rate() / b
            );
            ratios.insert(r.mode.clone(), json!(r.rate() / b));
        }
    }
    let ratio = ratios.get("kudos").cloned();
    let json = json!({
        "results": out.iter().map(|r| json!({"mode": r.mode, "nodes": r.nodes, "pods": r.pods, "bound": r.bound,
            "bind_window_s": r.bind_window.as_secs_f64(), "since_scheduler_start_s": r.since_start.as_secs_f64(),
            "pods_per_s": r.rate(),
            "cpu_seconds": r.cpu.iter().map(|(n, c)| json!({"process": n, "seconds": c})).collect::<Vec<_>>(),
            "extender_mean_ms": r.extender_ms.iter().map(|(v, ms, n)| json!({"verb": v, "mean_ms": ms, "calls": n})).collect::<Vec<_>>()})).collect::<Vec<_>>(),
        "ratio": ratio,
        "ratios": ratios,
    });
    println!("{json}");
    Ok(())
}
