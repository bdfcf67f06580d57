//! The heterogeneous scenario the real-node test (`tests/realnode_kudos.rs`) and the local demo
//! (`kudos-e2e-demo`) both run: Kudos installed with `helm install` (rollout on, the chart's
//! own Kudos scheduler) on the two GPU nodes of [`super::gpus`], and jobs of two classes, X
//! fastest on node a's V100s and Y on node b's T4s (`examples/workload`).

use super::RealCluster;
use super::access::{self, As};
use super::gpus;
use super::kudos::Helm;
use crate::http;
use crate::paths::RunDir;
use crate::proc::wait_for;
use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::ListParams;
use kudos_api::dra::DRIVER;
use kudos_testkit::registry::{self, Registry};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Node a (4 × V100): class X's faster node.
pub const NODE_A: &str = "127.0.0.1";
/// Node b (4 × T4): class Y's faster node.
pub const NODE_B: &str = "127.0.0.2";
/// Work units of every job (6 s at speed 1).
pub const WORK: f64 = 6.0;
/// The unified resource name.
pub const RES: &str = "kudos.dev/gpu";

/// Class of job `i` and the node where that class runs fastest.
pub fn class_of(i: usize) -> (&'static str, &'static str) {
    if i.is_multiple_of(2) {
        ("X", NODE_A)
    } else {
        ("Y", NODE_B)
    }
}

/// Job `i`: one device, its class label and declared work, scheduled by the Kudos scheduler.
pub fn job(i: usize) -> Pod {
    job_with_work(i, WORK)
}

/// Job `i` declaring `work` units (seconds at speed 1) instead of [`WORK`].
pub fn job_with_work(i: usize, work: f64) -> Pod {
    let (class, _) = class_of(i);
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("job-{i:02}"),
            "labels": {"kudos.dev/class": class},
            "annotations": {"kudos.dev/work": work.to_string()},
        },
        "spec": {
            // Opt in to the chart's Kudos scheduler; the default scheduler stays as it is.
            "schedulerName": "kudos",
            "restartPolicy": "Never",
            "containers": [{
                "name": "job",
                "image": "localhost/kudos/kudos-workload:0.1.0",
                "args": ["--class", class, "--work", work.to_string()],
                "resources": {"limits": {RES: "1"}},
            }],
        },
    }))
    .expect("valid pod")
}

/// The orchestrator's `/state`, if it answers.
pub fn state() -> Option<serde_json::Value> {
    access::get().ok()?.get_json("/state").ok()
}

/// Runs the orchestrator has learned from.
pub fn model_runs() -> Option<u64> {
    state()?["model"]["runs"].as_u64()
}

/// Every line of the containers' logs under `dir` (each node's `pod-logs`) that tells a run's
/// life: the agents' "run started" / "run ended" / missing / listed again, the orchestrator's
/// "run observed" / "run stored". What a failed exactly-once check prints.
pub fn run_log_lines(dir: &Path) -> Vec<String> {
    const MARKS: [&str; 6] = [
        "run started",
        "run ended",
        "run missing",
        "listed again",
        "run observed",
        "run stored",
    ];
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() && !t.is_symlink() => stack.push(p),
                Ok(t) if t.is_file() && p.extension().is_some_and(|x| x == "log") => {
                    let Ok(text) = std::fs::read_to_string(&p) else {
                        continue;
                    };
                    let within = p.strip_prefix(dir).unwrap_or(&p).display().to_string();
                    out.extend(
                        text.lines()
                            .filter(|l| MARKS.iter().any(|m| l.contains(m)))
                            .map(|l| format!("{within}: {l}")),
                    );
                }
                _ => {}
            }
        }
    }
    out.sort();
    out
}

/// Waits until the orchestrator answers `/readyz` with 200.
pub async fn wait_orchestrator_ready(what: &str) -> Result<()> {
    wait_for(
        what,
        Duration::from_secs(120),
        Duration::from_millis(250),
        || async {
            access::get()
                .ok()?
                .call(As::Anonymous, "GET", "/readyz", None)
                .ok()
                .filter(|r| r.status == 200)
                .map(|_| ())
        },
    )
    .await
}

/// What [`install`] installs beyond the scenario's defaults.
#[derive(Debug, Default, Clone)]
pub struct InstallOptions {
    /// Extra `helm --set` values, after the scenario's own.
    pub set: Vec<String>,
    /// Nodes expected on DRA: [`install`] waits for their ResourceSlice instead of allocatable
    /// `kudos.dev/gpu`.
    pub dra_nodes: Vec<&'static str>,
}

/// Kudos as installed by [`install`].
#[derive(Debug)]
pub struct Installed {
    /// The registry derived plugin images are pushed to (stops on drop).
    pub registry: Registry,
    /// Helm, for `upgrade` and `uninstall`.
    pub helm: Helm,
}

/// Everything [`install`] needs besides the real-node files (for `require_bins`).
pub fn required_files() -> Vec<std::path::PathBuf> {
    let mut v = gpus::required_files(gpus::IMAGES);
    v.extend(registry::bins());
    v.push(super::kudos::helm_bin());
    v.push(crate::browser::chromium_bin());
    v
}

/// Installs Kudos on `cluster` as an operator would: a registry holding the plugin base image,
/// `helm install` with rollout on and the chart's Kudos scheduler (the image built from e2e's
/// kube-scheduler, one replica: all pods share the host's network here, so a second could not
/// bind its port), the default scheduler without any extender (it places Kudos' own pods).
/// Returns once both nodes were handed to the derived `nvidia` plugin and serve their devices
/// (allocatable `kudos.dev/gpu`, or a ResourceSlice on `opts.dra_nodes`).
pub async fn install(
    run: &RunDir,
    cluster: &mut RealCluster,
    adapt_bin: &Path,
    opts: &InstallOptions,
) -> Result<Installed> {
    let t0 = Instant::now();
    let reg = Registry::start(run.path(), crate::proc::free_port()).await?;
    let base = format!("{}/kudos/kudos-device-plugin:0.1.0", reg.addr);
    let archive = gpus::image_dir().join("kudos-device-plugin.tar");
    registry::skopeo(&[
        "copy",
        "--quiet",
        "--dest-tls-verify=false",
        &format!("docker-archive:{}", archive.display()),
        &format!("docker://{base}"),
    ])?;
    let api_port: u16 = cluster
        .cp
        .server
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .context("apiserver port")?;
    let helm = Helm::new(run.path(), &cluster.cp.kubeconfig, adapt_bin, api_port)?;
    helm.install(
        &[
            "orchestrator.rollout.enabled=true".into(),
            format!("orchestrator.rollout.baseImage={base}"),
            format!(
                "orchestrator.rollout.repository={}/kudos/device-plugin-derived",
                reg.addr
            ),
            "scheduler.image.registry=localhost".into(),
            "scheduler.image.repository=kudos/kube-scheduler".into(),
            "scheduler.image.tag=v1.37.2".into(),
            "scheduler.replicas=1".into(),
            // Every pod here shares the host's network: a standby would find its ports taken.
            "orchestrator.replicas=1".into(),
            format!("scheduler.securePort={}", crate::proc::free_port()),
        ]
        .into_iter()
        .chain(opts.set.iter().cloned())
        .collect::<Vec<_>>(),
    )?;
    cluster.start_scheduler(None)?;
    let client = cluster.cp.client.clone();
    access::setup(&client, run.path()).await?;
    wait_orchestrator_ready("orchestrator /readyz").await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "kudos-system");
    wait_for(
        "the Kudos scheduler (kudos-scheduler Deployment) ready",
        Duration::from_secs(120),
        Duration::from_millis(500),
        async || {
            let d = deployments
                .get_opt("kudos-scheduler")
                .await
                .ok()
                .flatten()?;
            (d.status?.ready_replicas? >= 1).then_some(())
        },
    )
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let daemonsets: Api<DaemonSet> = Api::namespaced(client, "kudos-system");
    // Rollout: both nodes handed to the nvidia group's DaemonSet, the bootstrap gone.
    wait_for(
        "both nodes handed over to kudos-device-plugin-nvidia",
        Duration::from_secs(180),
        Duration::from_millis(500),
        async || {
            for n in [NODE_A, NODE_B] {
                let node = nodes.get_opt(n).await.ok().flatten()?;
                let group = node.metadata.labels?.get("kudos.dev/plugin-group").cloned();
                (group.as_deref() == Some("nvidia")).then_some(())?;
            }
            let status = |name: &'static str| {
                let daemonsets = daemonsets.clone();
                async move { daemonsets.get_opt(name).await.ok().flatten()?.status }
            };
            let group = status("kudos-device-plugin-nvidia").await?;
            let boot = status("kudos-device-plugin-bootstrap").await?;
            (group.number_ready == 2
                && boot.current_number_scheduled == 0
                && boot.number_misscheduled == 0)
                .then_some(())
        },
    )
    .await
    .with_context(|| {
        format!(
            "/state rollout: {:?}",
            state().map(|s| s["nodeMonitor"].clone())
        )
    })?;
    eprintln!(
        "RESULT rollout: derived image applied, both nodes handed over after {:?}",
        t0.elapsed()
    );
    let slices: Api<ResourceSlice> = Api::all(cluster.cp.client.clone());
    for &n in &opts.dra_nodes {
        wait_for(
            &format!(
                "{n}: a ResourceSlice of {DRIVER} with {} devices",
                gpus::GPUS_PER_NODE
            ),
            Duration::from_secs(120),
            Duration::from_millis(500),
            async || {
                let lp = ListParams::default()
                    .fields(&format!("spec.nodeName={n},spec.driver={DRIVER}"));
                let list = slices.list(&lp).await.ok()?;
                let devices: usize = list
                    .items
                    .iter()
                    .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
                    .sum();
                (devices == gpus::GPUS_PER_NODE as usize).then_some(())
            },
        )
        .await?;
    }
    for n in [NODE_A, NODE_B]
        .into_iter()
        .filter(|n| !opts.dra_nodes.contains(n))
    {
        wait_for(
            &format!("{n}: allocatable {RES} = {}", gpus::GPUS_PER_NODE),
            Duration::from_secs(120),
            Duration::from_millis(500),
            async || {
                let node = nodes.get_opt(n).await.ok().flatten()?;
                let q = node.status?.allocatable?.get(RES)?.0.clone();
                (q == gpus::GPUS_PER_NODE.to_string()).then_some(())
            },
        )
        .await?;
    }
    eprintln!(
        "RESULT Kudos installed, both nodes allocatable after {:?}",
        t0.elapsed()
    );
    Ok(Installed {
        registry: reg,
        helm,
    })
}

/// Finished jobs as they finish: name → (node, phase). Submitting a job only while a device
/// is free (as a batch queue such as Kueue or Volcano would) makes a run measure placement,
/// not queueing.
#[derive(Debug)]
pub struct Reaper {
    finished: Arc<Mutex<BTreeMap<String, (String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Reaper {
    /// Starts recording the finished pods of `pods` (listed every 500 ms).
    pub fn spawn(pods: Api<Pod>) -> Self {
        let finished: Arc<Mutex<BTreeMap<String, (String, String)>>> = Arc::default();
        let task = tokio::spawn({
            let finished = finished.clone();
            async move {
                loop {
                    match pods.list(&ListParams::default()).await {
                        Ok(list) => {
                            for p in list.items {
                                let (Some(name), Some(node), Some(phase)) = (
                                    p.metadata.name.clone(),
                                    p.spec.as_ref().and_then(|s| s.node_name.clone()),
                                    p.status.as_ref().and_then(|s| s.phase.clone()),
                                ) else {
                                    continue;
                                };
                                if phase != "Succeeded" && phase != "Failed" {
                                    continue;
                                }
                                if let Ok(mut done) = finished.lock()
                                    && done
                                        .insert(name.clone(), (node.clone(), phase.clone()))
                                        .is_none()
                                {
                                    eprintln!("finished: {name} on {node}: {phase}");
                                }
                            }
                        }
                        Err(e) => eprintln!("reaper: listing pods failed: {e}"),
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        });
        Self { finished, task }
    }

    /// How many jobs have finished.
    pub fn count(&self) -> usize {
        self.finished.lock().map_or(0, |d| d.len())
    }

    /// Waits until a device is free for job `i` (fewer than all devices busy).
    pub async fn wait_for_free_device(&self, i: usize) -> Result<()> {
        let capacity = 2 * gpus::GPUS_PER_NODE as usize;
        wait_for(
            "a free device for the next job",
            Duration::from_secs(120),
            Duration::from_millis(200),
            async || (i - self.count() < capacity).then_some(()),
        )
        .await
    }

    /// Waits until `n` jobs have finished; stops recording and returns (name, node, phase).
    pub async fn wait_all(self, n: usize) -> Result<Vec<(String, String, String)>> {
        let placed = wait_for(
            "every job finished",
            Duration::from_secs(600),
            Duration::from_secs(1),
            async || {
                let done = self.finished.lock().ok()?;
                (done.len() == n).then(|| {
                    done.iter()
                        .map(|(name, (node, ph))| (name.clone(), node.clone(), ph.clone()))
                        .collect::<Vec<_>>()
                })
            },
        )
        .await;
        self.task.abort();
        placed
    }
}

/// Of `placed` jobs numbered at least `from`, how many ran on their class's faster node.
pub fn on_faster_node(placed: &[(String, String, String)], from: usize) -> (usize, usize) {
    let mut on_fast = 0;
    let mut total = 0;
    for (name, node, _) in placed {
        let Ok(i) = name.trim_start_matches("job-").parse::<usize>() else {
            continue;
        };
        if i >= from {
            total += 1;
            on_fast += usize::from(node == class_of(i).1);
        }
    }
    (on_fast, total)
}

/// The predictions of the latest job of class `parity` (0: X, 1: Y) among `0..jobs` whose
/// `/explain` ranked both nodes (when one node was full, kube-scheduler offered only the
/// other): (job, [(node, predicted seconds)]).
pub fn ranked_both(parity: usize, jobs: usize) -> Option<(usize, Vec<(String, f64)>)> {
    (0..jobs).rev().filter(|i| i % 2 == parity).find_map(|i| {
        let ex = access::get()
            .ok()?
            .get_json(&format!("/explain/default/job-{i:02}"))
            .ok()?;
        let entries: Vec<(String, f64)> = ex["ranking"]["entries"]
            .as_array()?
            .iter()
            .filter_map(|e| {
                Some((
                    e["node"].as_str()?.to_string(),
                    e["prediction"]["seconds"].as_f64()?,
                ))
            })
            .collect();
        (entries.len() >= 2).then_some((i, entries))
    })
}

/// What the status page showed in Chromium: per (class, model) the learned seconds per unit
/// of work, the screenshot's path and how many of its pixels are the heatmap's green (a
/// class's fastest model, confidently learned).
#[derive(Debug)]
pub struct StatusPage {
    /// (class, GPU model) → seconds per unit of work, from the rendered DOM.
    pub cells: BTreeMap<(String, String), f64>,
    /// The screenshot.
    pub screenshot: std::path::PathBuf,
    /// Strongly green pixels in it.
    pub green_pixels: usize,
}

/// Renders the orchestrator's `/status` in headless Chromium (see [`crate::browser`]).
pub fn status_page(dir: &Path) -> Result<StatusPage> {
    // The page needs a reader's token, which a browser cannot send by itself: fetch it as
    // `curl` would (what `kubectl port-forward` plus a token gives an operator), then render.
    std::fs::create_dir_all(dir)?;
    let page = access::get()?.call(As::Reader, "GET", "/status", None)?;
    anyhow::ensure!(page.status == 200, "GET /status: {}", page.status);
    let html = dir.join("status.html");
    std::fs::write(&html, &page.body)?;
    let url = format!("file://{}", html.display());
    let (dom, image) = crate::browser::render(&url, dir, 1280, 1400)?;
    let mut cells = BTreeMap::new();
    for td in dom.split("<td data-class=\"").skip(1) {
        let mut attrs = td.split('"');
        let class = attrs.next().unwrap_or_default().to_string();
        let model = attrs.nth(1).unwrap_or_default().to_string();
        if let Some(seconds) = attrs.nth(1).and_then(|s| s.parse::<f64>().ok()) {
            cells.insert((class, model), seconds);
        }
    }
    let green_pixels =
        image.count(|r, g, b| g > 140 && g > r.saturating_add(70) && g > b.saturating_add(70));
    Ok(StatusPage {
        cells,
        screenshot: dir.join("screenshot.png"),
        green_pixels,
    })
}

/// Metric names the chart's Grafana dashboard (`charts/kudos/dashboards/kudos.json`) queries
/// that none of the orchestrator's, node a's agent's or node a's device plugin's `/metrics`
/// exposes (histogram queries name the `_bucket` series; a family without samples counts by
/// its `# TYPE` line).
pub fn dashboard_metrics_missing() -> Result<Vec<String>> {
    let path = crate::paths::repo_root().join("charts/kudos/dashboards/kudos.json");
    let dashboard: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    let mut exposed = String::new();
    let orchestrator = access::get()?.call(As::Reader, "GET", "/metrics", None)?;
    anyhow::ensure!(
        orchestrator.status == 200,
        "orchestrator /metrics: {}",
        orchestrator.status
    );
    exposed.push_str(&String::from_utf8_lossy(&orchestrator.body));
    for addr in ["127.0.0.1:9410", "127.0.0.1:9401"] {
        let r = http::request("GET", addr, "/metrics", None)
            .with_context(|| format!("GET {addr}/metrics"))?;
        exposed.push_str(&String::from_utf8_lossy(&r.body));
    }
    let mut missing = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_default();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                // A family without samples yet (no rejection so far) still has its TYPE line.
                let family = ["_total", "_bucket"]
                    .iter()
                    .find_map(|s| word.strip_suffix(s))
                    .unwrap_or(word);
                let seen = exposed.contains(&format!("{word}{{"))
                    || exposed.contains(&format!("{word} "))
                    || exposed.contains(&format!("# TYPE {family} "))
                    || exposed.contains(&format!("# TYPE {word} "));
                if word.starts_with("kudos_") && !seen {
                    missing.push(word.to_string());
                }
            }
        }
    }
    Ok(missing)
}
