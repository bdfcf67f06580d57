//! Scheduling throughput through the real kube-scheduler, with and without the Kudos extender.
//!
//! For each mode: a fresh etcd + kube-apiserver, the Alibaba 2023 GPU-node shapes (1,213 nodes;
//! repeated under new names for more) as Node objects, N pending pods (`kudos.dev/gpu: 1` and a
//! `kudos.dev/class` label; with `--non-gpu F` that fraction asks for CPU and memory only), then
//! kube-scheduler is started (plain, or wired to a `kudos-orchestrator` or a do-nothing
//! extender started against the same API server) and a watch times the bindings. Throughput of
//! a kind of pod = its bound pods / (its last bind - its first bind). Prints a table, the
//! ratios, and one JSON line.
//!
//! `kudos-e2e-throughput --help` lists the flags.

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kudos_e2e::nodes::{NodeShape, alibaba_shapes, create_nodes};
use kudos_e2e::orchestrator::{ChartTls, Orchestrator, OrchestratorOptions};
use kudos_e2e::paths::{kudos_bin, upstream_bin};
use kudos_e2e::{ControlPlane, ControlPlaneOptions, ExtenderOptions, RunDir, require_bins};
use serde_json::json;
use std::collections::HashSet;
use std::time::{Duration, Instant};

const CLASSES: [&str; 4] = ["resnet50", "transformer", "lm", "recommendation"];

const HELP: &str = "\
kudos-e2e-throughput: pods/s through the real kube-scheduler, with and without an extender

USAGE: kudos-e2e-throughput [--pods N] [--nodes N] [--non-gpu F] [--qps Q] [--pin A:B]
                            [--affinity-terms N] [--top-nodes N] [--modes M,M,...]
                            [--repeat N]

  --pods N       pending pods per mode (default 1000)
  --nodes N      Node objects (default: the 1,213 Alibaba 2023 GPU-node shapes; fewer takes the
                 first N, more repeats the shapes under new names)
  --non-gpu F    fraction of pods that ask for CPU and memory only (default 0; 0.9 is the mixed
                 workload: the extender's managedResources keeps them away from it)
  --qps Q        kube-scheduler's API client QPS and burst (default 1000)
  --affinity-terms N
                 affinity-floor mode: preferred terms per pod, for the first N models of the
                 class's order (default 0: one per GPU model of the cluster)
  --top-nodes N  kudos-top mode: nodes Kudos' filter passes, its best for the pod (default 16)
  --pin A:B      CPU lists (taskset -c syntax), e.g. 0:1: the cluster's kube-scheduler runs on
                 A, everything else of the run (etcd, kube-apiserver, Kudos' own scheduler, the
                 orchestrator, this tool and its do-nothing extender) on B, from the moment the
                 schedulers start. On a small machine this gives the cluster's scheduler CPU of
                 its own, as a control plane has where Kudos runs on other nodes; without it
                 every mode shares all CPUs and throughput follows total CPU per pod
  --repeat N     run the modes N times, in order, one round after another (default 1): the
                 modes of a round run minutes apart on the same machine, and each round's
                 ratios are printed, then every ratio's values, mean, least and greatest
                 (one run moves by about a tenth on a shared 2-core machine)
  --modes M,...  any of (default baseline,null-extender,kudos):
                   baseline          no extender
                   null-extender     a do-nothing extender with the verbs the kudos mode uses
                                     (as deploy/scheduler configures: filter, prioritize, bind),
                                     its filter passing the first 100 nodes as Kudos' passes its
                                     best 100
                   null-extender-top the same passing the first --top-nodes
                   null-extender-all-nodes
                                     the same passing every node (null-extender until 2026-12-06)
                   null-extender-fp  a do-nothing extender, filter + prioritize, kube-scheduler binds
                   null-extender-p   a do-nothing extender, prioritize only, kube-scheduler binds
                   null-extender-https
                                     null-extender over HTTPS (HTTP/1.1), kube-scheduler's
                                     client certificate required: the floor for kudos-https
                   kudos             kudos-orchestrator as deploy/scheduler configures it
                   kudos-top         kudos whose filter passes its --top-nodes best nodes
                                     (--filter-top-nodes; shipped: 100)
                   kudos-all-nodes   kudos whose filter passes every node that fits (as shipped
                                     until 2026-12-06: kube-scheduler scores them all)
                   kudos-prioritize  the same without filter
                   kudos-score-only  kudos with prioritize only, kube-scheduler binds (its
                                     explanation then goes out as an Event per pod)
                   kudos-no-events   kudos without its one Event per pod (--pod-events false)
                   kudos-https       kudos over HTTPS as the chart installs it: a serving
                                     certificate, kube-scheduler's client certificate required
                                     (HTTP/2 where the orchestrator offers it, as since
                                     2026-12-07; an older KUDOS_BIN_DIR build gives HTTP/1.1)
                   kudos-own-scheduler
                                     as the chart installs Kudos: the cluster's kube-scheduler
                                     untouched, a second one (schedulerName kudos) with the
                                     kudos extender; GPU pods name it, as the chart's webhook
                                     sets it (pods are created before either scheduler starts)
                   null-extender-own-scheduler
                                     the same with the do-nothing extender
                   affinity-floor    no extender; each GPU pod instead carries preferred node
                                     affinity, a weight per GPU model in its class's order: the
                                     scheduling cost of preferences set at admission time, as
                                     a webhook would set them (the webhook itself not included)

Needs etcd, kube-apiserver and kube-scheduler in e2e/_out/bin (e2e/build) and
kudos-orchestrator in target/debug or $KUDOS_BIN_DIR (use a release build for figures).
";

struct Opts {
    pods: usize,
    qps: u32,
    modes: Vec<String>,
    nodes: Option<usize>,
    non_gpu: f64,
    /// Preferred terms per pod in the affinity-floor mode (0: every model).
    affinity_terms: usize,
    /// Nodes Kudos' filter passes in the kudos-top mode.
    top_nodes: usize,
    /// `(cluster scheduler's CPUs, everything else's)`, taskset lists.
    pin: Option<(String, String)>,
    /// Rounds of all the modes.
    repeat: usize,
}

fn parse() -> Result<Opts> {
    let mut o = Opts {
        pods: 1000,
        qps: 1000,
        modes: vec!["baseline".into(), "null-extender".into(), "kudos".into()],
        nodes: None,
        non_gpu: 0.0,
        affinity_terms: 0,
        top_nodes: 16,
        pin: None,
        repeat: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut v = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--pods" => o.pods = v()?.parse().context("--pods")?,
            "--qps" => o.qps = v()?.parse().context("--qps")?,
            "--nodes" => o.nodes = Some(v()?.parse().context("--nodes")?),
            "--non-gpu" => o.non_gpu = v()?.parse().context("--non-gpu")?,
            "--affinity-terms" => {
                o.affinity_terms = v()?.parse().context("--affinity-terms")?;
            }
            "--top-nodes" => o.top_nodes = v()?.parse().context("--top-nodes")?,
            "--repeat" => {
                o.repeat = v()?.parse().context("--repeat")?;
                if o.repeat == 0 {
                    bail!("--repeat wants at least 1 round");
                }
            }
            "--pin" => {
                let spec = v()?;
                let Some((a, b)) = spec.split_once(':') else {
                    bail!("--pin wants two CPU lists as A:B (e.g. 0:1), got {spec}");
                };
                let ok = |l: &str| {
                    !l.is_empty()
                        && l.chars()
                            .all(|c| c.is_ascii_digit() || c == ',' || c == '-')
                };
                if !ok(a) || !ok(b) {
                    bail!(
                        "--pin wants CPU lists of digits, ',' and '-' (e.g. 0:1 or 0-1:2-3), got {spec}"
                    );
                }
                o.pin = Some((a.to_string(), b.to_string()));
            }
            "--modes" => o.modes = v()?.split(',').map(str::to_string).collect(),
            "-h" | "--help" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            _ => bail!("unknown argument {a} (see --help)"),
        }
    }
    if !(0.0..=1.0).contains(&o.non_gpu) {
        bail!("--non-gpu must be a fraction in 0..=1, got {}", o.non_gpu);
    }
    for m in &o.modes {
        if !MODES.contains(&m.as_str()) {
            bail!("unknown mode {m}; modes: {}", MODES.join(", "));
        }
    }
    Ok(o)
}

const MODES: [&str; 17] = [
    "baseline",
    "null-extender",
    "null-extender-top",
    "null-extender-all-nodes",
    "null-extender-fp",
    "null-extender-p",
    "null-extender-https",
    "kudos",
    "kudos-top",
    "kudos-all-nodes",
    "kudos-prioritize",
    "kudos-score-only",
    "kudos-no-events",
    "kudos-https",
    "kudos-own-scheduler",
    "null-extender-own-scheduler",
    "affinity-floor",
];

/// kudos-orchestrator's default `extender.filterTopNodes`: the nodes its filter passes, which
/// the do-nothing extender matches in the null-extender mode.
const KUDOS_FILTER_TOP_NODES: usize = 100;

/// The `schedulerName` of Kudos' own kube-scheduler in the `*-own-scheduler` modes (the chart's
/// `scheduler.schedulerName` default).
const OWN_SCHEDULER: &str = "kudos";

/// Whether pod `i` asks for no GPU: spreads `fraction` of the pods evenly through the queue.
fn is_non_gpu(i: usize, fraction: f64) -> bool {
    (((i + 1) as f64) * fraction).floor() > ((i as f64) * fraction).floor()
}

/// `n` node shapes: the Alibaba ones, cut or repeated under new names.
fn cluster_shapes(n: Option<usize>) -> Result<Vec<NodeShape>> {
    let base = alibaba_shapes()?;
    let Some(n) = n else { return Ok(base) };
    if base.is_empty() {
        bail!("no node shapes");
    }
    Ok((0..n)
        .map(|i| {
            let mut s = base[i % base.len()].clone();
            if i >= base.len() {
                s.name = format!("{}-r{}", s.name, i / base.len());
            }
            s
        })
        .collect())
}

/// Bindings of one kind of pod (GPU or not).
#[derive(Default)]
struct Kind {
    pods: usize,
    bound: usize,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Kind {
    fn record(&mut self, at: Instant) {
        self.bound += 1;
        self.first.get_or_insert(at);
        self.last = Some(at);
    }
    fn window(&self) -> Duration {
        match (self.first, self.last) {
            (Some(f), Some(l)) => l - f,
            _ => Duration::ZERO,
        }
    }
    fn rate(&self) -> f64 {
        if self.bound < 2 {
            return 0.0;
        }
        (self.bound - 1) as f64 / self.window().as_secs_f64().max(1e-9)
    }
    fn json(&self) -> serde_json::Value {
        json!({"pods": self.pods, "bound": self.bound, "bind_window_s": self.window().as_secs_f64(),
               "pods_per_s": self.rate()})
    }
}

struct Outcome {
    mode: String,
    nodes: usize,
    all: Kind,
    gpu: Kind,
    non_gpu: Kind,
    since_start: Duration,
    /// Each verb's handling time as the orchestrator measured it.
    extender_ms: Vec<VerbTimes>,
    /// CPU seconds each process used from scheduler start to the last binding.
    cpu: Vec<(String, f64)>,
    /// Connections the extender accepted: Kudos' counter since the orchestrator started (its
    /// readiness checks and the final `/metrics` scrape included), the do-nothing extender's
    /// from scheduler start; `None` without an extender.
    extender_connections: Option<u64>,
    /// Requests the API server served from scheduler start to the last binding, by
    /// `verb resource[/subresource]` (every client's, this harness's own watch included).
    api_requests: Vec<(String, f64)>,
}

/// Preferred node affinity for a pod of class `class`: a term for each of the first `terms`
/// GPU models (0: all of them) in an order that differs by class (a rotation of `models`),
/// weights falling from 100 (the API accepts 1..=100).
fn model_preferences(class: usize, models: &[String], terms: usize) -> serde_json::Value {
    let n = models.len();
    let take = if terms == 0 { n } else { terms.min(n) };
    let terms: Vec<serde_json::Value> = (0..take)
        .map(|k| {
            let model = &models[(class + k) % n];
            let weight = (100 - 99 * k / n).max(1);
            json!({"weight": weight, "preference": {"matchExpressions": [
                {"key": kudos_api::labels::GPU_MODEL, "operator": "In", "values": [model]}]}})
        })
        .collect();
    json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}})
}

/// Pod `i`; a GPU pod names `gpu_scheduler` when given, and carries `affinity` when given.
fn pod(
    i: usize,
    non_gpu: bool,
    gpu_scheduler: Option<&str>,
    affinity: Option<&serde_json::Value>,
) -> Result<Pod> {
    let (res, labels) = if non_gpu {
        (json!({"cpu": "1", "memory": "1Gi"}), json!({}))
    } else {
        (
            json!({"cpu": "1", "memory": "1Gi", "kudos.dev/gpu": "1"}),
            json!({"kudos.dev/class": CLASSES[i % CLASSES.len()]}),
        )
    };
    let mut spec = json!({"containers": [{"name": "main", "image": "registry.invalid/none:0",
                          "resources": {"requests": res, "limits": res}}]});
    if let (Some(name), false) = (gpu_scheduler, non_gpu) {
        spec["schedulerName"] = json!(name);
    }
    if let (Some(a), false) = (affinity, non_gpu) {
        spec["affinity"] = a.clone();
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("bench-{i:05}"), "labels": labels},
        "spec": spec
    }))?)
}

async fn run_mode(mode: &str, o: &Opts) -> Result<Outcome> {
    let run = RunDir::new(&format!("throughput-{mode}"))?;
    let mut cp = ControlPlane::start(&run, ControlPlaneOptions::default()).await?;
    let shapes = cluster_shapes(o.nodes)?;
    let t = Instant::now();
    create_nodes(&cp.client, &shapes, "kudos.dev/gpu").await?;
    eprintln!(
        "[{mode}] {} nodes created in {:?}",
        shapes.len(),
        t.elapsed()
    );

    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let t = Instant::now();
    let non_gpu: Vec<bool> = (0..o.pods).map(|i| is_non_gpu(i, o.non_gpu)).collect();
    let own_scheduler = mode.ends_with("-own-scheduler");
    let gpu_scheduler = own_scheduler.then_some(OWN_SCHEDULER);
    let preferences = (mode == "affinity-floor").then(|| {
        let mut models: Vec<String> = shapes.iter().map(|s| s.model.clone()).collect();
        models.sort();
        models.dedup();
        (0..CLASSES.len())
            .map(|c| model_preferences(c, &models, o.affinity_terms))
            .collect::<Vec<_>>()
    });
    futures::stream::iter(0..o.pods)
        .map(|i| {
            let pods = pods.clone();
            let p = pod(
                i,
                non_gpu[i],
                gpu_scheduler,
                preferences.as_ref().map(|p| &p[i % CLASSES.len()]),
            );
            async move {
                pods.create(&PostParams::default(), &p?).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    eprintln!("[{mode}] {} pods created in {:?}", o.pods, t.elapsed());

    let mut orch = None;
    let extender = match mode {
        "baseline" | "affinity-floor" => None,
        "null-extender"
        | "null-extender-top"
        | "null-extender-all-nodes"
        | "null-extender-fp"
        | "null-extender-p"
        | "null-extender-https"
        | "null-extender-own-scheduler" => {
            let binder = kudos_e2e::null_extender::Binder {
                client: cp.client.clone(),
                runtime: tokio::runtime::Handle::current(),
            };
            // As Kudos' filter passes its best `filterTopNodes` (shipped 100), the do-nothing
            // one passes the first as many.
            let top = match mode {
                "null-extender-all-nodes" => None,
                "null-extender-top" => Some(o.top_nodes),
                _ => Some(KUDOS_FILTER_TOP_NODES),
            };
            let tls = match mode {
                "null-extender-https" => Some(ChartTls::new(run.path())?),
                _ => None,
            };
            let server_tls = tls.as_ref().map(|t| kudos_e2e::null_extender::Tls {
                cert: t.server.0.clone(),
                key: t.server.1.clone(),
                client_ca: t.scheduler.ca.clone(),
            });
            let url = kudos_e2e::null_extender::start(Some(binder), top, server_tls.as_ref())?;
            let mut e = ExtenderOptions::kudos(url);
            e.tls = tls.map(|t| t.scheduler);
            if mode == "null-extender-fp" {
                e.filter_verb = Some("filter".into());
                e.prioritize_verb = Some("prioritize".into());
                e.bind_verb = None;
            }
            if mode == "null-extender-p" {
                e.filter_verb = None;
                e.bind_verb = None;
            }
            Some(e)
        }
        _ => {
            let names: Vec<String> = shapes.iter().map(|s| s.name.clone()).collect();
            let extra: Vec<String> = match mode {
                "kudos-no-events" => vec!["--pod-events".into(), "false".into()],
                "kudos-top" => vec!["--filter-top-nodes".into(), o.top_nodes.to_string()],
                "kudos-all-nodes" => vec!["--filter-top-nodes".into(), "0".into()],
                _ => Vec::new(),
            };
            let (orc, tls) = if mode == "kudos-https" {
                let tls = ChartTls::new(run.path())?;
                let opts = tls.apply(OrchestratorOptions {
                    kubeconfig: Some(cp.kubeconfig.clone()),
                    static_token_nodes: Some(names),
                    ..OrchestratorOptions::default()
                });
                let orc = Orchestrator::start_with(run.path(), &opts).await?;
                (orc, Some(tls.scheduler))
            } else {
                let kc = Some(cp.kubeconfig.as_path());
                (
                    Orchestrator::start(run.path(), kc, &names, &extra).await?,
                    None,
                )
            };
            let mut e = ExtenderOptions::kudos(orc.extender_url());
            e.tls = tls;
            if mode == "kudos-prioritize" {
                e.filter_verb = None;
                e.ignored_by_scheduler = false;
            }
            if mode == "kudos-score-only" {
                e.filter_verb = None;
                e.bind_verb = None;
            }
            orch = Some(orc);
            Some(e)
        }
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
    if own_scheduler {
        cp.start_scheduler(o.qps, None)?;
        cp.start_named_scheduler(o.qps, extender.as_ref(), OWN_SCHEDULER)?;
    } else {
        cp.start_scheduler(o.qps, extender.as_ref())?;
    }
    pids = cp
        .pids()
        .into_iter()
        .filter(|(n, _)| n.starts_with("kube-scheduler"))
        .chain(pids)
        .collect();
    if let Some((sched_cpus, rest_cpus)) = &o.pin {
        let own = ("kudos-e2e-throughput".to_string(), std::process::id());
        for (name, pid) in pids.iter().chain([&own]) {
            let cpus = if name == "kube-scheduler" {
                sched_cpus
            } else {
                rest_cpus
            };
            pin(name, *pid, cpus)?;
        }
    }
    let cpu0: Vec<f64> = pids
        .iter()
        .map(|(_, p)| kudos_e2e::proc::cpu_seconds(*p).unwrap_or(0.0))
        .collect();
    let requests0 = api_requests(&cp.client).await;
    let null_connections0 = kudos_e2e::null_extender::connections();
    let mut bound = HashSet::new();
    let (mut all, mut gpu, mut other) = (Kind::default(), Kind::default(), Kind::default());
    all.pods = o.pods;
    other.pods = non_gpu.iter().filter(|x| **x).count();
    gpu.pods = o.pods - other.pods;
    let deadline = start + Duration::from_secs(900);
    while bound.len() < o.pods {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left.min(Duration::from_secs(60)), rx.recv()).await {
            Ok(Some((name, at))) => {
                let Some(i) = name
                    .strip_prefix("bench-")
                    .and_then(|n| n.parse::<usize>().ok())
                else {
                    continue;
                };
                if bound.insert(i) {
                    all.record(at);
                    if non_gpu.get(i).copied().unwrap_or(false) {
                        other.record(at);
                    } else {
                        gpu.record(at);
                    }
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
    let api_requests = match (requests0, api_requests(&cp.client).await) {
        (Some(before), Some(after)) => after
            .into_iter()
            .map(|(k, v)| {
                let d = v - before.get(&k).copied().unwrap_or(0.0);
                (k, d)
            })
            .filter(|(_, d)| *d > 0.0)
            .collect(),
        _ => Vec::new(),
    };
    cp.check_running()?;
    let mut extender_ms = Vec::new();
    // The do-nothing extender's own count; Kudos' comes from its `/metrics` below (none when
    // that cannot be read, rather than the do-nothing extender's zero).
    let mut extender_connections = extender
        .as_ref()
        .filter(|_| orch.is_none())
        .map(|_| kudos_e2e::null_extender::connections() - null_connections0);
    if let Some(orc) = orch.as_mut() {
        orc.check_running()?;
        if let Ok(r) = orc.get("/metrics") {
            let text = String::from_utf8_lossy(&r.body);
            extender_ms = extender_times(&text);
            extender_connections = text.lines().find_map(|l| {
                l.strip_prefix("kudos_orchestrator_http_connections_accepted_total ")
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .map(|v| v as u64)
            });
        }
        orc.stop();
    }
    if bound.len() == o.pods {
        run.pass();
    }
    Ok(Outcome {
        mode: mode.to_string(),
        nodes: shapes.len(),
        since_start: all.last.map_or(Duration::ZERO, |l| l - start),
        all,
        gpu,
        non_gpu: other,
        extender_ms,
        extender_connections,
        cpu,
        api_requests,
    })
}

/// `apiserver_request_total` summed by `verb resource[/subresource]`, from the API server's
/// own `/metrics`; `None` when it cannot be read (the figures are then left out).
async fn api_requests(client: &kube::Client) -> Option<std::collections::BTreeMap<String, f64>> {
    let req = http::Request::get("/metrics").body(Vec::new()).ok()?;
    let text = client.request_text(req).await.ok()?;
    let mut out = std::collections::BTreeMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |k: &str| label_value(labels, k).unwrap_or("");
        let sub = label("subresource");
        let key = format!(
            "{} {}{}{}",
            label("verb"),
            label("resource"),
            if sub.is_empty() { "" } else { "/" },
            sub
        );
        *out.entry(key).or_default() += sample_value(value);
    }
    Some(out)
}

/// Moves every thread of `pid` (threads made later inherit it) to the CPUs of `cpus`.
fn pin(name: &str, pid: u32, cpus: &str) -> Result<()> {
    let out = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .output()
        .context("run taskset (util-linux) for --pin")?;
    if !out.status.success() {
        bail!(
            "taskset -a -p -c {cpus} {pid} ({name}): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The value of label `key` in a sample's `k="v",...` label list (unquoted).
fn label_value<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|kv| {
        kv.strip_prefix(key)
            .and_then(|v| v.strip_prefix('='))
            .map(|v| v.trim_matches('"'))
    })
}

/// A sample's value: the first field after its labels (a timestamp may follow), 0 if unreadable.
fn sample_value(rest: &str) -> f64 {
    rest.split_whitespace()
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or(0.0)
}

/// One extender verb's handling time, from the orchestrator's own histogram.
#[derive(Debug)]
struct VerbTimes {
    verb: String,
    mean_ms: f64,
    calls: u64,
    /// The upper bound of the histogram bucket that holds the 99th percentile, ms: 99 % of the
    /// calls took at most this (the buckets double, so it bounds the p99 within a factor of
    /// two). `None` when the p99 is beyond the largest bucket.
    p99_at_most_ms: Option<f64>,
}

/// Each verb's mean handling time, calls and p99 bound ([`VerbTimes`]) from the orchestrator's
/// `kudos_orchestrator_extender_request_duration_seconds`.
fn extender_times(metrics: &str) -> Vec<VerbTimes> {
    let base = "kudos_orchestrator_extender_request_duration_seconds";
    /// Which series of the histogram a line belongs to.
    enum Series {
        Sum,
        Count,
        Bucket,
    }
    #[derive(Default)]
    struct Verb {
        sum: f64,
        count: u64,
        /// (upper bound in seconds, cumulative count)
        buckets: Vec<(f64, f64)>,
    }
    let mut verbs = std::collections::BTreeMap::<String, Verb>::new();
    let (sum, count, bucket) = (
        format!("{base}_sum{{"),
        format!("{base}_count{{"),
        format!("{base}_bucket{{"),
    );
    for l in metrics.lines() {
        let (series, rest) = if let Some(r) = l.strip_prefix(&sum) {
            (Series::Sum, r)
        } else if let Some(r) = l.strip_prefix(&count) {
            (Series::Count, r)
        } else if let Some(r) = l.strip_prefix(&bucket) {
            (Series::Bucket, r)
        } else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Some(verb) = label_value(labels, "verb") else {
            continue;
        };
        let v = sample_value(value);
        let e = verbs.entry(verb.to_string()).or_default();
        match series {
            Series::Sum => e.sum += v,
            Series::Count => e.count += v as u64,
            Series::Bucket => {
                let le = match label_value(labels, "le") {
                    Some("+Inf") => f64::INFINITY,
                    Some(le) => match le.parse() {
                        Ok(le) => le,
                        Err(_) => continue,
                    },
                    None => continue,
                };
                e.buckets.push((le, v));
            }
        }
    }
    verbs
        .into_iter()
        .filter(|(_, v)| v.count > 0)
        .map(|(verb, mut v)| {
            v.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let wanted = 0.99 * v.count as f64;
            let p99_at_most_ms = v
                .buckets
                .iter()
                .find(|(_, cumulative)| *cumulative >= wanted)
                .map(|(le, _)| le * 1000.0)
                .filter(|ms| ms.is_finite());
            VerbTimes {
                verb,
                mean_ms: v.sum * 1000.0 / v.count as f64,
                calls: v.count,
                p99_at_most_ms,
            }
        })
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
    println!(
        "# kudos-e2e-throughput {}",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    // Each round's outcomes and ratios.
    let mut rounds = Vec::new();
    for round in 1..=o.repeat {
        let mut out = Vec::new();
        for m in &o.modes {
            out.push(run_mode(m, &o).await?);
        }
        if o.repeat > 1 {
            println!("## round {round} of {}", o.repeat);
        }
        let ratios = print_round(&out);
        rounds.push((out, ratios));
    }
    let results = |out: &[Outcome]| -> Vec<serde_json::Value> {
        out.iter().map(|r| json!({"mode": r.mode, "nodes": r.nodes,
            "all": r.all.json(), "gpu": r.gpu.json(), "non_gpu": r.non_gpu.json(),
            "since_scheduler_start_s": r.since_start.as_secs_f64(),
            "cpu_seconds": r.cpu.iter().map(|(n, c)| json!({"process": n, "seconds": c})).collect::<Vec<_>>(),
            "extender_mean_ms": r.extender_ms.iter().map(|t| json!({"verb": t.verb, "mean_ms": t.mean_ms, "calls": t.calls, "p99_at_most_ms": t.p99_at_most_ms})).collect::<Vec<_>>(),
            "extender_connections": r.extender_connections,
            "api_requests": r.api_requests.iter().map(|(k, n)| json!({"request": k, "count": n})).collect::<Vec<_>>()})).collect()
    };
    let ratio_map =
        |r: &[(String, serde_json::Value)]| r.iter().cloned().collect::<serde_json::Map<_, _>>();
    let command = std::env::args().collect::<Vec<_>>();
    let json = match rounds.as_slice() {
        [(out, ratios)] => json!({
            "command": command,
            "results": results(out),
            "ratios": ratio_map(ratios),
        }),
        _ => {
            let per_round: Vec<Vec<(String, f64)>> = rounds
                .iter()
                .map(|(_, ratios)| {
                    ratios
                        .iter()
                        .filter_map(|(n, v)| Some((n.clone(), v.as_f64()?)))
                        .collect()
                })
                .collect();
            let spreads = kudos_e2e::spread::spreads(&per_round);
            println!(
                "ratios over {} rounds (each round's, in order):",
                rounds.len()
            );
            for s in &spreads {
                let values: Vec<String> = s.values.iter().map(|v| format!("{v:.3}")).collect();
                println!(
                    "spread {}: {}; mean {:.3}, least {:.3}, greatest {:.3}",
                    s.name,
                    values.join(", "),
                    s.mean,
                    s.min,
                    s.max
                );
            }
            json!({
                "command": command,
                "rounds": rounds.iter().map(|(out, ratios)| json!({"results": results(out), "ratios": ratio_map(ratios)})).collect::<Vec<_>>(),
                "spreads": spreads.iter().map(|s| (s.name.clone(), json!({"values": s.values, "mean": s.mean, "min": s.min, "max": s.max}))).collect::<serde_json::Map<_, _>>(),
            })
        }
    };
    println!("{json}");
    Ok(())
}

/// Prints one round's table, per-mode figures and ratios; gives the ratios.
fn print_round(out: &[Outcome]) -> Vec<(String, serde_json::Value)> {
    println!(
        "{:<27} {:>6} {:>6} {:>6} {:>12} {:>12} {:>9} {:>9} {:>9}",
        "mode",
        "nodes",
        "pods",
        "bound",
        "bind window",
        "since start",
        "pods/s",
        "GPU/s",
        "non-GPU/s"
    );
    for r in out {
        println!(
            "{:<27} {:>6} {:>6} {:>6} {:>11.2}s {:>11.2}s {:>9.1} {:>9.1} {:>9.1}",
            r.mode,
            r.nodes,
            r.all.pods,
            r.all.bound,
            r.all.window().as_secs_f64(),
            r.since_start.as_secs_f64(),
            r.all.rate(),
            r.gpu.rate(),
            r.non_gpu.rate()
        );
    }
    for r in out {
        let per_pod: Vec<String> = r
            .cpu
            .iter()
            .map(|(n, c)| format!("{n} {:.2}", c * 1000.0 / r.all.bound.max(1) as f64))
            .collect();
        println!("{}: CPU ms per bound pod: {}", r.mode, per_pod.join(", "));
        let requests: Vec<String> = r
            .api_requests
            .iter()
            .map(|(k, n)| format!("{k} {:.2}", n / r.all.bound.max(1) as f64))
            .collect();
        if let Some(n) = r.extender_connections {
            println!(
                "{}: extender connections accepted: {n} ({:.3} per bound pod)",
                r.mode,
                n as f64 / r.all.bound.max(1) as f64
            );
        }
        if !requests.is_empty() {
            println!(
                "{}: API requests per bound pod: {}",
                r.mode,
                requests.join(", ")
            );
        }
        for t in &r.extender_ms {
            let p99 = t
                .p99_at_most_ms
                .map_or("beyond the largest bucket".to_string(), |ms| {
                    format!("at most {ms:.2} ms")
                });
            println!(
                "{}: extender {}: mean {:.2} ms, p99 {p99}, over {} calls (orchestrator's histogram)",
                r.mode, t.verb, t.mean_ms, t.calls
            );
        }
    }
    let ratios = ratios(out);
    for (name, v) in &ratios {
        println!("ratio {name} = {v:.3}");
    }
    ratios
}

/// The ratios the issue sets goals for, each of pods/s of one kind of pod in one run:
/// `kudos/null-extender` (GPU pods; the mechanism's limit, goal >= 0.95),
/// `kudos/baseline` (GPU pods, goal >= 0.7; non-GPU pods, goal >= 0.98), and every other mode
/// against the baseline.
fn ratios(out: &[Outcome]) -> Vec<(String, serde_json::Value)> {
    let find = |m: &str| out.iter().find(|r| r.mode == m);
    let mut v = Vec::new();
    let mut put = |name: String, a: f64, b: f64| {
        if a > 0.0 && b > 0.0 {
            v.push((name, json!(a / b)));
        }
    };
    if let Some(base) = find("baseline") {
        for r in out.iter().filter(|r| r.mode != "baseline") {
            put(
                format!("{}/baseline gpu", r.mode),
                r.gpu.rate(),
                base.gpu.rate(),
            );
            put(
                format!("{}/baseline non-gpu", r.mode),
                r.non_gpu.rate(),
                base.non_gpu.rate(),
            );
        }
    }
    for (k, null) in [
        ("kudos", "null-extender"),
        ("kudos-top", "null-extender-top"),
        ("kudos-all-nodes", "null-extender-all-nodes"),
        ("kudos-prioritize", "null-extender-all-nodes"),
        ("kudos-no-events", "null-extender"),
        ("kudos-https", "null-extender-https"),
    ] {
        if let (Some(a), Some(b)) = (find(k), find(null)) {
            put(format!("{k}/{null} gpu"), a.gpu.rate(), b.gpu.rate());
        }
    }
    if let (Some(a), Some(b)) = (find("kudos-score-only"), find("null-extender-p")) {
        put(
            "kudos-score-only/null-extender-p gpu".into(),
            a.gpu.rate(),
            b.gpu.rate(),
        );
    }
    let own = "null-extender-own-scheduler";
    if let (Some(a), Some(b)) = (find("kudos-own-scheduler"), find(own)) {
        put(
            format!("kudos-own-scheduler/{own} gpu"),
            a.gpu.rate(),
            b.gpu.rate(),
        );
    }
    v
}

#[cfg(test)]
mod tests {
    use super::{extender_times, model_preferences};
    use k8s_openapi::api::core::v1::Affinity;

    /// The histogram as prometheus-client writes it: two verbs, one of them with a tail.
    #[test]
    fn extender_times_gives_each_verbs_mean_and_p99_bucket() {
        let base = "kudos_orchestrator_extender_request_duration_seconds";
        let mut text = format!("# TYPE {base} histogram\n");
        // filter: 200 calls, 198 within 0.4 ms, 2 within 0.8 ms (p99 in the 0.4 ms bucket).
        // prioritize: 100 calls, 98 within 0.1 ms, 2 beyond 1.6 ms (p99 beyond them all).
        for (verb, sum, count, buckets) in [
            (
                "filter",
                0.05,
                200,
                [0.0, 100.0, 198.0, 200.0, 200.0, 200.0],
            ),
            (
                "prioritize",
                0.02,
                100,
                [98.0, 98.0, 98.0, 98.0, 98.0, 100.0],
            ),
        ] {
            text.push_str(&format!("{base}_sum{{verb=\"{verb}\"}} {sum}\n"));
            text.push_str(&format!("{base}_count{{verb=\"{verb}\"}} {count}\n"));
            for (le, n) in ["0.0001", "0.0002", "0.0004", "0.0008", "0.0016", "+Inf"]
                .iter()
                .zip(buckets)
            {
                text.push_str(&format!(
                    "{base}_bucket{{le=\"{le}\",verb=\"{verb}\"}} {n}\n"
                ));
            }
        }
        text.push_str("kudos_orchestrator_other_total{verb=\"filter\"} 7\n");
        let times = extender_times(&text);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let [filter, prioritize] = &times[..] else {
            panic!("two verbs expected: {times:?}");
        };
        assert_eq!((filter.verb.as_str(), filter.calls), ("filter", 200));
        assert!(close(filter.mean_ms, 0.25), "{filter:?}");
        assert!(
            filter.p99_at_most_ms.is_some_and(|ms| close(ms, 0.4)),
            "{filter:?}"
        );
        assert_eq!(
            (prioritize.verb.as_str(), prioritize.calls),
            ("prioritize", 100)
        );
        assert!(close(prioritize.mean_ms, 0.2), "{prioritize:?}");
        assert_eq!(
            prioritize.p99_at_most_ms, None,
            "the tail is beyond every bucket"
        );
        assert!(extender_times("").is_empty());
    }

    fn models() -> Vec<String> {
        ["A10", "G2", "P100", "T4", "V100M16"]
            .map(String::from)
            .to_vec()
    }

    /// What the API server accepts: preferred terms with weights 1..=100, one model each.
    fn terms(class: usize, n: usize) -> Vec<(i32, String)> {
        let a: Affinity = match serde_json::from_value(model_preferences(class, &models(), n)) {
            Ok(a) => a,
            Err(e) => panic!("not an Affinity: {e}"),
        };
        a.node_affinity
            .and_then(|n| n.preferred_during_scheduling_ignored_during_execution)
            .unwrap_or_default()
            .into_iter()
            .map(|t| {
                let e = t.preference.match_expressions.unwrap_or_default();
                assert_eq!(e.len(), 1);
                assert_eq!(e[0].key, kudos_api::labels::GPU_MODEL);
                let v = e[0].values.clone().unwrap_or_default();
                assert_eq!(v.len(), 1);
                (t.weight, v[0].clone())
            })
            .collect()
    }

    #[test]
    fn each_class_prefers_the_models_in_its_own_order() {
        let all = terms(0, 0);
        assert_eq!(all.len(), 5, "0 terms means one per model");
        assert!(all.iter().all(|(w, _)| (1..=100).contains(w)));
        assert!(all.windows(2).all(|p| p[0].0 > p[1].0), "weights fall");
        assert_eq!(all[0], (100, "A10".into()));
        assert_eq!(
            terms(1, 0)[0].1,
            "G2",
            "the next class starts one model later"
        );
        assert_eq!(terms(6, 0)[0].1, "G2", "classes beyond the models wrap");
        assert_eq!(terms(2, 2), vec![(100, "P100".into()), (81, "T4".into())]);
        assert_eq!(terms(0, 9).len(), 5, "at most one term per model");
        let none = model_preferences(0, &[], 0);
        assert_eq!(
            none["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
            serde_json::json!([]),
            "no models, no terms"
        );
    }
}
