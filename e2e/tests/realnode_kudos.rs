//! Kudos deployed the way users deploy it, on two real nodes (real kubelets, containerd, runc):
//! node a has four fake V100s, node b four fake T4s, delivered like a real driver. `helm
//! install` installs the chart with rollout on (a local docker-registry holds the plugin base
//! image and receives the derived one), its manifests adapted by a post-renderer only for a
//! cluster without kube-proxy and DNS (see `realnode::kudos::adapt`); kube-scheduler runs
//! the shipped extender configuration in the chart's own Kudos scheduler instance (pods opt
//! in with `schedulerName: kudos`; the default scheduler has no extender), and:
//! - the bootstrap device plugin reports both nodes; the orchestrator derives the `nvidia`
//!   group's image, pushes it, applies its DaemonSet and hands both nodes over by label; the
//!   bootstrap pods leave, the group's pods pull the derived image from the registry, and
//!   each kubelet sees exactly two registrations (bootstrap, then group): no socket fight;
//! - both nodes end up allocatable `kudos.dev/gpu` = 4;
//! - 40 jobs of classes X (fastest on V100) and Y (fastest on T4) are submitted over time; every
//!   one succeeds and every run is reported exactly once, also across a kubelet restart in the
//!   middle (the plugin re-registers once, within 2 s of the registration server coming up);
//! - after the first 10 jobs at least 80 % land on their class's faster node, and `/explain`
//!   ranks that node first;
//! - killing the orchestrator pod loses no acknowledged report; deleting a node (the one the
//!   orchestrator does not run on) prunes it;
//! - the orchestrator speaks HTTPS only (the chart's self-signed CA): the extender answers only
//!   kube-scheduler's client certificate (every job above was placed through it), `bind`
//!   refuses a pod Kudos did not rank, and reads need a token RBAC allows (`kudos-reader`);
//! - the chart's admission webhook gives a GPU pod written for the default scheduler Kudos'
//!   scheduler (the real API server calling the orchestrator), a CPU pod keeps its own;
//! - `helm upgrade` mid-run keeps the learned state and disturbs no running job; `helm
//!   uninstall` leaves no DaemonSet, Deployment, webhook or node label behind and keeps the
//!   state;
//! - the host is left exactly as it was.

use ::http as http_req;
use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use kudos_e2e::proc::wait_for;
use kudos_e2e::realnode::access::{self, As};
use kudos_e2e::realnode::kudos::ORCHESTRATOR_HTTP;
use kudos_e2e::realnode::scenario::{self, NODE_A, Reaper, class_of, job, model_runs, state};
use kudos_e2e::realnode::{RealCluster, gpus};
use kudos_e2e::{RunDir, http, require_bins};
use std::time::{Duration, Instant};

const JOBS: usize = 40;
const WARMUP: usize = 10;
/// The job after which `helm upgrade` runs (while jobs run).
const UPGRADE_AT: usize = 30;

/// Seconds since midnight of a klog line (`I1201 02:20:01.123456 ...`).
fn klog_time(line: &str) -> Option<f64> {
    let t = line.split_whitespace().nth(1)?;
    let mut p = t.split(':');
    let (h, m, s): (f64, f64, f64) = (
        p.next()?.parse().ok()?,
        p.next()?.parse().ok()?,
        p.next()?.parse().ok()?,
    );
    Some(h * 3600.0 + m * 60.0 + s)
}

/// (registration server start, device plugin registrations) in one kubelet log.
fn registrations(log: &std::path::Path) -> (Option<f64>, Vec<f64>) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let start = text
        .lines()
        .find(|l| l.contains("Starting device plugin registration server"))
        .and_then(klog_time);
    let regs = text
        .lines()
        .filter(|l| l.contains("Got registration request from device plugin"))
        .filter_map(klog_time)
        .collect();
    (start, regs)
}

/// The chart's admission webhook: a GPU pod written for the default scheduler is given
/// Kudos' (through the real API server calling the orchestrator over HTTPS); a CPU pod is not.
/// Server-side dry runs: the webhook runs, nothing is stored or scheduled.
async fn check_webhook(client: &kube::Client) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut decided = Vec::new();
    for (name, limits) in [
        ("gpu", serde_json::json!({"kudos.dev/gpu": "1"})),
        ("cpu", serde_json::json!({"cpu": "1"})),
    ] {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("webhook-{name}")},
            "spec": {"containers": [{"name": "c", "image": "localhost/kudos/kudos-workload:0.1.0",
                                     "resources": {"limits": limits}}]},
        }))?;
        let created = pods.create(&dry, &pod).await?;
        decided.push(
            created
                .spec
                .and_then(|s| s.scheduler_name)
                .unwrap_or_default(),
        );
    }
    eprintln!(
        "RESULT webhook: GPU pod -> {:?}, CPU pod -> {:?}",
        decided[0], decided[1]
    );
    assert_eq!(decided, ["kudos", "default-scheduler"]);
    Ok(())
}

/// The rows `kubectl get <plural>` prints (a meta.k8s.io Table from the API server).
async fn kubectl_get(client: &kube::Client, plural: &str) -> Result<Vec<Vec<serde_json::Value>>> {
    let req = http_req::Request::get(format!("/apis/kudos.dev/v1alpha1/{plural}"))
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())?;
    let t: serde_json::Value = serde_json::from_str(&client.request_text(req).await?)?;
    Ok(t["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["cells"].as_array().cloned())
        .collect())
}

/// Who may call what on the orchestrator as the chart installs it.
fn check_access() -> Result<()> {
    let a = access::get()?;
    let status = |who, method, path: &str, body: Option<&[u8]>| {
        a.call(who, method, path, body).map(|r| r.status)
    };
    assert_eq!(status(As::Anonymous, "GET", "/state", None)?, 401);
    assert_eq!(
        status(As::Stranger, "GET", "/state", None)?,
        403,
        "no Kudos role"
    );
    assert_eq!(status(As::Reader, "GET", "/state", None)?, 200);
    assert_eq!(status(As::Reader, "GET", "/metrics", None)?, 200);
    assert_eq!(
        status(As::Anonymous, "GET", "/healthz", None)?,
        200,
        "probes stay open"
    );
    let bind = serde_json::to_vec(&serde_json::json!({
        "PodName": "job-99", "PodNamespace": "default", "PodUID": "x", "Node": NODE_A,
    }))?;
    assert_eq!(
        status(As::Reader, "POST", "/kudos/v1/bind", Some(&bind))?,
        401,
        "a token is not kube-scheduler's client certificate"
    );
    let r = a.call(As::Scheduler, "POST", "/kudos/v1/bind", Some(&bind))?;
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert!(
        v["Error"]
            .as_str()
            .is_some_and(|e| e.contains("has not ranked")),
        "bind of a pod Kudos never ranked: {v}"
    );
    assert!(
        !http::request("GET", ORCHESTRATOR_HTTP, "/healthz", None).is_ok_and(|r| r.status == 200),
        "plain HTTP gets no answer"
    );
    eprintln!(
        "RESULT access: anonymous 401, stranger 403, reader 200, token on bind 401, unranked bind refused, plain HTTP refused"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kudos_on_two_real_nodes_learns_placement_and_survives_restarts() -> Result<()> {
    if !require_bins("realnode_kudos", &scenario::required_files()) {
        return Ok(());
    }
    let run = RunDir::new("realnode-kudos")?;
    let t0 = Instant::now();
    let mut cluster =
        RealCluster::start(&run, gpus::two_gpu_nodes(run.path(), gpus::IMAGES)?).await?;
    let client = cluster.cp.client.clone();
    eprintln!("RESULT cluster Ready after {:?}", t0.elapsed());
    let kudos = scenario::install(
        &run,
        &mut cluster,
        std::path::Path::new(env!("CARGO_BIN_EXE_kudos-e2e-adapt")),
        &Default::default(),
    )
    .await?;
    let helm = &kudos.helm;
    check_access()?;
    check_webhook(&client).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "kudos-system");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "kudos-system");
    // No socket fight: each kubelet saw the bootstrap plugin register, then the group's, and
    // nothing after (a fight re-registers every time one plugin re-creates its socket).
    tokio::time::sleep(Duration::from_secs(5)).await;
    for node in &cluster.nodes {
        let (_, regs) = registrations(&node.kubelet_log());
        eprintln!(
            "RESULT {}: registrations through the handover: {regs:?}",
            node.spec.name
        );
        assert_eq!(regs.len(), 2, "{}: registrations {regs:?}", node.spec.name);
    }

    // 40 jobs over time; the kubelet of node a restarts in the middle.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let reaper = Reaper::spawn(pods.clone());
    for i in 0..JOBS {
        reaper.wait_for_free_device(i).await?;
        pods.create(&PostParams::default(), &job(i)).await?;
        if i == UPGRADE_AT {
            // `helm upgrade` while jobs run: the orchestrator restarts with the new value;
            // the running jobs' pods are not touched (checked below: every job succeeds and
            // every run is learned once, across the restart).
            helm.upgrade(&["orchestrator.logFormat=text".into()])?;
            eprintln!("RESULT helm upgrade done after {:?}", t0.elapsed());
        }
        if i == JOBS / 2 {
            // Mid-run: restart node a's kubelet while a job runs there. (A pod bound in the
            // window between the kubelet's start and the plugin's re-registration is refused
            // by the kubelet itself, UnexpectedAdmissionError: so the restart waits for a
            // running job, and submission resumes once the plugin has re-registered.)
            wait_for(
                "a job running on node a",
                Duration::from_secs(60),
                Duration::from_millis(200),
                async || {
                    let lp = ListParams::default()
                        .fields(&format!("spec.nodeName={NODE_A},status.phase=Running"));
                    (!pods.list(&lp).await.ok()?.items.is_empty()).then_some(())
                },
            )
            .await?;
            cluster.nodes[0].restart_kubelet()?;
            cluster.wait_ready(0).await?;
            let log = cluster.nodes[0].kubelet_log();
            wait_for(
                "the device plugin re-registered with the restarted kubelet",
                Duration::from_secs(30),
                Duration::from_millis(100),
                || {
                    let log = log.clone();
                    async move { (!registrations(&log).1.is_empty()).then_some(()) }
                },
            )
            .await?;
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let placed = reaper.wait_all(JOBS).await?;
    let failed: Vec<_> = placed
        .iter()
        .filter(|(_, _, ph)| ph != "Succeeded")
        .collect();
    assert!(failed.is_empty(), "jobs failed: {failed:?}");
    for (name, node, _) in &placed {
        eprintln!("placement {name} on {node}");
    }
    let (on_fast, after_warmup) = scenario::on_faster_node(&placed, WARMUP);
    assert_eq!(after_warmup, JOBS - WARMUP);
    let share = on_fast as f64 / (JOBS - WARMUP) as f64;
    eprintln!(
        "RESULT after the first {WARMUP} jobs, {on_fast}/{} on their class's faster node",
        JOBS - WARMUP
    );

    // Every run reported exactly once (a split run would report twice).
    let runs = wait_for(
        "orchestrator learned from every run",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async { model_runs().filter(|r| *r >= JOBS as u64) },
    )
    .await
    .with_context(|| format!("/state: {:?}", state().map(|s| s["model"].clone())))?;
    if runs != JOBS as u64 {
        for line in scenario::run_log_lines(run.path()) {
            eprintln!("{line}");
        }
    }
    assert_eq!(runs, JOBS as u64, "runs reported (exactly one per job)");
    assert!(
        share >= 0.8,
        "only {on_fast} of {} jobs on their class's faster node",
        JOBS - WARMUP
    );

    // /explain ranks each class's faster node first (on the latest job whose ranking had
    // both nodes to choose from).
    for parity in [0, 1] {
        let (class, fast) = class_of(parity);
        let (i, entries) = scenario::ranked_both(parity, JOBS)
            .with_context(|| format!("no /explain of a class {class} job ranked both nodes"))?;
        let best = entries
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|e| e.0.as_str());
        assert_eq!(
            best,
            Some(fast),
            "class {class}: /explain of job-{i:02}: {entries:?}"
        );
        eprintln!("RESULT /explain of job-{i:02} (class {class}) predicts {entries:?}");
    }

    // `kubectl describe pod` tells why: the chart's scheduler binds through the extender, whose
    // Binding carries the explanation onto the pod, pointing at /explain.
    let last = format!("job-{:02}", JOBS - 1);
    let note = pods
        .get(&last)
        .await?
        .metadata
        .annotations
        .and_then(|a| a.get(kudos_api::labels::PLACEMENT).cloned())
        .with_context(|| format!("{last} has no {} annotation", kudos_api::labels::PLACEMENT))?;
    eprintln!("RESULT placement of {last}: {note}");
    assert!(note.contains(&format!("/explain/default/{last}")), "{note}");

    // Every metric the chart's Grafana dashboard queries is one the components expose. (The
    // per-node heartbeat gauge appears with the first heartbeat the orchestrator restarted by
    // `helm upgrade` receives: up to one heartbeat interval, 30 s.)
    let mut missing = Vec::new();
    let exposed = wait_for(
        "every metric the Grafana dashboard queries exposed",
        Duration::from_secs(60),
        Duration::from_secs(1),
        async || {
            missing = scenario::dashboard_metrics_missing().ok()?;
            missing.is_empty().then_some(())
        },
    )
    .await;
    assert!(
        exposed.is_ok(),
        "dashboard queries metrics nobody exposes: {missing:?}"
    );

    // `kubectl get kudosclasses`: each class's fastest model is its node's.
    let classes = wait_for(
        "kubectl get kudosclasses shows X fastest on V100 and Y on T4",
        Duration::from_secs(60),
        Duration::from_secs(1),
        async || {
            let rows = kubectl_get(&client, "kudosclasses").await.ok()?;
            let fastest = |class: &str| {
                rows.iter()
                    .find(|r| r[1] == class)
                    .and_then(|r| r[3].as_str().map(str::to_owned))
            };
            (fastest("X")? == gpus::MODEL_A && fastest("Y")? == gpus::MODEL_B).then_some(rows)
        },
    )
    .await?;
    eprintln!("RESULT kubectl get kudosclasses: {classes:?}");
    let nodes_table = kubectl_get(&client, "kudosnodes").await?;
    eprintln!("RESULT kubectl get kudosnodes: {nodes_table:?}");
    assert_eq!(nodes_table.len(), 2, "{nodes_table:?}");

    // The status page in headless Chromium: the learned heatmap shows each class faster on
    // its node's model, and the screenshot has the heatmap's green.
    let page = scenario::status_page(&run.join("status-page"))?;
    eprintln!(
        "RESULT /status in Chromium: {:?}; {} green pixels in {}",
        page.cells,
        page.green_pixels,
        page.screenshot.display()
    );
    for (class, fast, slow) in [
        ("X", gpus::MODEL_A, gpus::MODEL_B),
        ("Y", gpus::MODEL_B, gpus::MODEL_A),
    ] {
        let cell = |model: &str| {
            page.cells
                .get(&(class.to_string(), model.to_string()))
                .copied()
        };
        let (f, s) = (cell(fast), cell(slow));
        assert!(
            f.zip(s).is_some_and(|(f, s)| f < s),
            "class {class}: the page should show {fast} faster than {slow}: {:?}",
            page.cells
        );
    }
    // Each row's fastest cell is green: two cells of about 100x40 pixels at the least.
    assert!(
        page.green_pixels > 2000,
        "{} green pixels",
        page.green_pixels
    );

    // The kubelet restart: exactly one re-registration, within 2 s of the registration server.
    let (start, regs) = registrations(&cluster.nodes[0].kubelet_log());
    assert_eq!(
        regs.len(),
        1,
        "re-registrations after the kubelet restart: {regs:?}"
    );
    let delay = regs[0] - start.context("registration server start in the kubelet log")?;
    eprintln!(
        "RESULT device plugin re-registered {delay:.3} s after the registration server started"
    );
    assert!(delay <= 2.0, "re-registration took {delay} s");

    // Kill the orchestrator pod: the new one recovers every acknowledged report.
    let orch_pods: Api<Pod> = Api::namespaced(client.clone(), "kudos-system");
    let lp = ListParams::default().labels("app.kubernetes.io/name=kudos-orchestrator");
    let old: Vec<String> = orch_pods
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.uid)
        .collect();
    orch_pods
        .delete_collection(&DeleteParams::default().grace_period(0), &lp)
        .await?;
    wait_for(
        "a new orchestrator pod serving",
        Duration::from_secs(120),
        Duration::from_millis(500),
        async || {
            let l = orch_pods.list(&lp).await.ok()?;
            let fresh = l.items.iter().any(|p| {
                p.metadata.uid.as_ref().is_some_and(|u| !old.contains(u))
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            });
            let ready = access::get()
                .ok()?
                .call(As::Anonymous, "GET", "/readyz", None)
                .is_ok_and(|r| r.status == 200);
            (fresh && ready).then_some(())
        },
    )
    .await?;
    assert_eq!(
        model_runs(),
        Some(runs),
        "runs after the orchestrator restart"
    );

    // Delete the node the orchestrator does not run on (deleting its own node would first
    // wait for the pod garbage collector): that node's state is pruned.
    let orch_node = orch_pods
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.uid.as_ref().is_some_and(|u| !old.contains(u)))
        .find_map(|p| p.spec?.node_name)
        .context("the new orchestrator pod's node")?;
    let victim = usize::from(orch_node == NODE_A);
    let victim_name = cluster.nodes[victim].spec.ip.clone();
    eprintln!("RESULT orchestrator on {orch_node}; deleting node {victim_name}");
    cluster.nodes[victim].stop();
    nodes.delete(&victim_name, &DeleteParams::default()).await?;
    wait_for(
        &format!("node {victim_name} pruned from the orchestrator's state"),
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let s = state()?;
            let name = Some(victim_name.as_str());
            let known = s["nodes"]
                .as_array()?
                .iter()
                .any(|n| n["name"].as_str() == name)
                || s["nodesWithoutAccelerators"]
                    .as_array()?
                    .iter()
                    .any(|n| n.as_str() == name);
            (!known).then_some(())
        },
    )
    .await?;

    // `helm uninstall`: the chart's objects go, and its post-delete hook removes what the
    // orchestrator created at run time (the group's DaemonSet, the node labels); the learned
    // state is kept (uninstall.deleteState is false by default).
    helm.uninstall()?;
    let left: Vec<String> = daemonsets
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|d| d.metadata.name)
        .collect();
    assert!(
        left.is_empty(),
        "DaemonSets left after helm uninstall: {left:?}"
    );
    let labelled = nodes
        .list(&ListParams::default().labels("kudos.dev/plugin-group"))
        .await?
        .items
        .len();
    assert_eq!(labelled, 0, "nodes still labelled kudos.dev/plugin-group");
    assert!(
        deployments
            .list(&ListParams::default())
            .await?
            .items
            .is_empty(),
        "Deployments left after helm uninstall"
    );
    let webhooks: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> =
        Api::all(client.clone());
    assert!(
        webhooks.get_opt("kudos-scheduler-name").await?.is_none(),
        "the admission webhook is left after helm uninstall"
    );
    let crds: Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = Api::all(client.clone());
    for crd in ["kudosnodes.kudos.dev", "kudosclasses.kudos.dev"] {
        // CRD deletion finishes after its objects are removed: wait for it.
        let gone = wait_for(
            "the chart's CRDs deleted",
            Duration::from_secs(60),
            Duration::from_millis(500),
            async || crds.get_opt(crd).await.ok()?.is_none().then_some(()),
        )
        .await;
        assert!(gone.is_ok(), "CRD {crd} left after helm uninstall");
    }
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "kudos-system");
    assert!(
        cms.get_opt("kudos-orchestrator-state").await?.is_some(),
        "the learned state is kept"
    );
    eprintln!(
        "RESULT helm uninstall left no DaemonSet, Deployment, webhook, CRD or node label after {:?}",
        t0.elapsed()
    );
    eprintln!("RESULT scenario done after {:?}", t0.elapsed());

    cluster.shutdown_clean()?;
    run.pass();
    Ok(())
}
