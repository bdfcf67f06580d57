//! Scenario 2: the real kube-scheduler calls the Kudos extender (`kudos-orchestrator`
//! against the real API server). After run reports show one GPU model clearly fastest for a
//! class, new pods of that class land on nodes of that model, `/explain` agrees, pods without
//! the resource are unaffected, and a down extender gives clear errors (or is ignored when
//! configured `ignorable`).

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kudos_api::labels::GPU_MODEL as MODEL_LABEL;
use kudos_e2e::nodes::{NodeShape, create_nodes, uniform_shapes};
use kudos_e2e::orchestrator::Orchestrator;
use kudos_e2e::paths::{kudos_bin, upstream_bin};
use kudos_e2e::pods::{bound_node, unschedulable};
use kudos_e2e::proc::wait_for;
use kudos_e2e::telemetry::{completed_run, report_runs};
use kudos_e2e::{ControlPlane, ControlPlaneOptions, ExtenderOptions, RunDir};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

/// The class whose measured speed contradicts the device-capability prior: the T4 is
/// fastest (as for Gavel's Recommendation jobs, where the K80 beats the V100).
const CLASS: &str = "recommendation";
const MODELS: [&str; 3] = ["V100M32", "P100", "T4"];

fn pod(name: &str, class: Option<&str>, gpus: Option<u32>) -> Pod {
    let mut res = json!({"cpu": "500m", "memory": "512Mi"});
    if let Some(g) = gpus {
        res["kudos.dev/gpu"] = json!(g.to_string());
    }
    let mut labels = json!({});
    if let Some(c) = class {
        labels["kudos.dev/class"] = json!(c);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/none:0",
                 "resources": {"requests": res, "limits": res}}]}
    }))
    .unwrap()
}

/// A control plane without a scheduler yet, `shapes` as its Nodes and an orchestrator that
/// knows them.
struct Setup {
    run: RunDir,
    cp: ControlPlane,
    orch: Orchestrator,
    ext: ExtenderOptions,
    pods: Api<Pod>,
}

/// Starts a [`Setup`]; `None` (the test skips) when the binaries are missing.
async fn start(test: &str, shapes: &[NodeShape]) -> anyhow::Result<Option<Setup>> {
    start_with(test, shapes, &[]).await
}

/// [`start`] with `extra` flags for the orchestrator.
async fn start_with(
    test: &str,
    shapes: &[NodeShape],
    extra: &[&str],
) -> anyhow::Result<Option<Setup>> {
    // The scheduler starts once the extender's address is known.
    let bins = [
        upstream_bin("kube-scheduler"),
        kudos_bin("kudos-orchestrator"),
    ];
    let opts = ControlPlaneOptions::default();
    let Some((run, cp)) = ControlPlane::for_test(test, opts, &bins).await? else {
        return Ok(None);
    };
    create_nodes(&cp.client, shapes, "kudos.dev/gpu").await?;
    let names: Vec<String> = shapes.iter().map(|s| s.name.clone()).collect();
    let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
    let orch = Orchestrator::start(run.path(), Some(&cp.kubeconfig), &names, &extra).await?;
    let ext = ExtenderOptions::kudos(orch.extender_url());
    let pods = Api::namespaced(cp.client.clone(), "default");
    Ok(Some(Setup {
        run,
        cp,
        orch,
        ext,
        pods,
    }))
}

/// GPU model by node name.
fn model_of(shapes: &[NodeShape]) -> BTreeMap<String, String> {
    shapes
        .iter()
        .map(|s| (s.name.clone(), s.model.clone()))
        .collect()
}

/// The smallest predicted seconds among T4 nodes and among the other nodes in an `/explain`.
fn fastest_by_model(ex: &serde_json::Value, model_of: &BTreeMap<String, String>) -> (f64, f64) {
    let (mut t4, mut other) = (f64::INFINITY, f64::INFINITY);
    for e in ex["ranking"]["entries"].as_array().into_iter().flatten() {
        let Some(secs) = e["prediction"]["seconds"].as_f64() else {
            continue;
        };
        let is_t4 = e["node"]
            .as_str()
            .and_then(|n| model_of.get(n))
            .is_some_and(|m| m == "T4");
        let slot = if is_t4 { &mut t4 } else { &mut other };
        *slot = slot.min(secs);
    }
    (t4, other)
}

/// History: every node ran the class six times; T4 nodes took 100 s, P100 300 s, V100 400 s.
async fn feed_history(orch: &Orchestrator, shapes: &[NodeShape]) -> anyhow::Result<()> {
    let secs = |m: &str| match m {
        "T4" => 100.0,
        "P100" => 300.0,
        _ => 400.0,
    };
    let before = orch.learned_runs().unwrap_or(0);
    let mut seq = 0;
    for s in shapes {
        let reports = (0..6)
            .map(|i| {
                seq += 1;
                completed_run(
                    &s.name,
                    &s.model,
                    CLASS,
                    secs(&s.model),
                    600.0 + 700.0 * i as f64,
                    seq,
                )
            })
            .collect();
        report_runs(&orch.grpc_addr, &s.name, reports).await?;
    }
    // Acknowledged means stored; the pods placed next must see the model that learned them.
    orch.wait_learned(before + seq as u64, Duration::from_secs(30))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extender_steers_class_to_fastest_model_and_explain_agrees() -> anyhow::Result<()> {
    let shapes = uniform_shapes(&MODELS, 3, 8);
    let Some(Setup {
        run,
        mut cp,
        mut orch,
        mut ext,
        pods,
    }) = start("extender_scheduling", &shapes).await?
    else {
        return Ok(());
    };
    let model_of = model_of(&shapes);
    cp.start_scheduler(50, Some(&ext))?;

    // Pods without the managed resource never reach the extender; pods with it but without
    // a class get a neutral score and are bound.
    pods.create(&PostParams::default(), &pod("plain", None, None))
        .await?;
    pods.create(&PostParams::default(), &pod("no-class", None, Some(1)))
        .await?;
    bound_node(&pods, "plain").await?;
    bound_node(&pods, "no-class").await?;

    // Before any history the prediction comes from device capability: the T4 is not the
    // fastest. (Placement itself is then nearly a tie, so only the prediction is asserted.)
    pods.create(
        &PostParams::default(),
        &pod("before-history", Some(CLASS), Some(1)),
    )
    .await?;
    bound_node(&pods, "before-history").await?;
    let ex = orch.explain("default", "before-history")?;
    let (t4, other) = fastest_by_model(&ex, &model_of);
    eprintln!("before history: fastest predicted T4 {t4:.1} s, other models {other:.1} s");
    for e in ex["ranking"]["entries"].as_array().into_iter().flatten() {
        eprintln!(
            "  {} score {} review {} good_rate {} rank {}",
            e["node"], e["score"], e["review"], e["good_rate"], e["rank"]
        );
    }
    assert!(
        t4 > other,
        "without history the capability prior must not make the T4 fastest (else the test proves nothing): {ex}"
    );

    feed_history(&orch, &shapes).await?;

    let nodes: Api<Node> = Api::all(cp.client.clone());
    for i in 0..6 {
        let name = format!("{CLASS}-{i}");
        pods.create(&PostParams::default(), &pod(&name, Some(CLASS), Some(1)))
            .await?;
        let node = bound_node(&pods, &name).await?;
        let model = nodes
            .get(&node)
            .await?
            .metadata
            .labels
            .and_then(|l| l.get(MODEL_LABEL).cloned())
            .unwrap_or_default();
        assert_eq!(
            model, "T4",
            "pod {name} landed on {node} ({model}); the class is fastest on T4"
        );
        let ex = orch.explain("default", &name)?;
        let entries = ex["ranking"]["entries"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            !entries.is_empty(),
            "/explain has a ranking for {name}: {ex}"
        );
        let best = entries
            .iter()
            .filter_map(|e| e["score"].as_u64())
            .max()
            .unwrap_or(0);
        let mine = entries
            .iter()
            .find(|e| e["node"] == node.as_str())
            .and_then(|e| e["score"].as_u64());
        assert_eq!(
            mine,
            Some(best),
            "/explain: bound node {node} must carry the best Kudos score: {ex}"
        );
        // `kubectl describe pod` says why: the explanation rode on the extender's Binding.
        let placed = pods.get(&name).await?;
        let why = placed
            .annotations()
            .get(kudos_api::labels::PLACEMENT)
            .cloned()
            .unwrap_or_default();
        assert!(
            why.starts_with("Kudos ranked ") && why.ends_with(&format!("/explain/default/{name}")),
            "{name} explains its placement in its {} annotation: {why:?}",
            kudos_api::labels::PLACEMENT
        );
        let (t4, other) = fastest_by_model(&ex, &model_of);
        assert!(
            t4 < other,
            "after the reports the T4 is predicted fastest ({t4} s vs {other} s): {ex}"
        );
        let top = entries
            .iter()
            .find(|e| e["rank"] == 1)
            .and_then(|e| e["node"].as_str())
            .unwrap_or_default()
            .to_string();
        assert_eq!(
            model_of.get(&top).map(String::as_str),
            Some("T4"),
            "/explain ranks a T4 node first: {ex}"
        );
    }

    // Extender down, not ignorable: GPU pods fail to schedule with a clear error, others are unaffected.
    orch.stop();
    pods.create(
        &PostParams::default(),
        &pod("while-down", Some(CLASS), Some(1)),
    )
    .await?;
    let (reason, message) = unschedulable(&pods, "while-down", Duration::from_secs(60)).await?;
    let msg = format!("{reason}: {message}");
    eprintln!("extender down: {msg}");
    assert!(
        msg.contains("extender") || msg.contains("connection refused") || msg.contains("Post"),
        "error names the extender: {msg}"
    );
    pods.create(&PostParams::default(), &pod("plain-while-down", None, None))
        .await?;
    bound_node(&pods, "plain-while-down").await?;

    // Ignorable extender: the scheduler proceeds without it.
    cp.stop_scheduler();
    ext.ignorable = true;
    ext.bind_verb = None; // an ignorable extender must not be the binder
    cp.start_scheduler(50, Some(&ext))?;
    bound_node(&pods, "while-down").await?;
    cp.check_running()?;
    run.pass();
    Ok(())
}

/// A gang (3 members x 4 GPUs) of the class: the first evaluated member reserves slots for
/// all (`/explain` shows them), members are bound exactly there through the extender's bind,
/// on T4 nodes (a gang runs at the pace of its slowest member), and no node is overcommitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extender_gang_members_bind_to_reserved_slots() -> anyhow::Result<()> {
    let shapes = uniform_shapes(&MODELS, 3, 8);
    let Some(Setup {
        run,
        mut cp,
        orch,
        ext,
        pods,
    }) = start("extender_gang", &shapes).await?
    else {
        return Ok(());
    };
    let model_of = model_of(&shapes);
    cp.start_scheduler(50, Some(&ext))?;
    feed_history(&orch, &shapes).await?;
    // Every T4 node could hold two members (8 GPUs), so only the reservation keeps them apart.
    for i in 0..3 {
        let mut p = pod(&format!("gang-{i}"), Some(CLASS), Some(4));
        p.metadata.annotations = Some(
            [
                ("kudos.dev/gang-name".to_string(), "g1".to_string()),
                ("kudos.dev/gang-size".to_string(), "3".to_string()),
            ]
            .into(),
        );
        pods.create(&PostParams::default(), &p).await?;
    }
    let mut gang_nodes = Vec::new();
    for i in 0..3 {
        gang_nodes.push(bound_node(&pods, &format!("gang-{i}")).await?);
    }
    let ex = orch.explain("default", "gang-2")?;
    let reservation = if ex["gangReservation"].is_null() {
        &ex["gang_reservation"]
    } else {
        &ex["gangReservation"]
    };
    let slots: Vec<String> = reservation["slots"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|s| s["node"].as_str().map(str::to_string))
        .collect();
    eprintln!("gang g1 bound to {gang_nodes:?}; reserved slots {slots:?}");
    // No node holds more kudos.dev/gpu than it has.
    let mut used = BTreeMap::<String, i64>::new();
    for p in pods.list(&Default::default()).await? {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        for c in p.spec.map(|s| s.containers).unwrap_or_default() {
            if let Some(q) = c
                .resources
                .and_then(|r| r.requests)
                .and_then(|r| r.get("kudos.dev/gpu").cloned())
            {
                *used.entry(node.clone()).or_default() += q.0.parse::<i64>().unwrap_or(0);
            }
        }
    }
    eprintln!("kudos.dev/gpu in use per node: {used:?}");
    assert!(
        used.values().all(|&u| u <= 8),
        "a node is overcommitted: {used:?}"
    );
    assert_eq!(
        slots.len(),
        3,
        "/explain shows the gang's reservation: {ex}"
    );
    let (mut a, mut b) = (gang_nodes.clone(), slots.clone());
    a.sort();
    b.sort();
    assert_eq!(a, b, "members bound to exactly the reserved slots");
    for n in &gang_nodes {
        assert_eq!(
            model_of.get(n).map(String::as_str),
            Some("T4"),
            "gang member on {n}"
        );
    }

    cp.check_running()?;
    run.pass();
    Ok(())
}

/// `extender.filterTopNodes`: the filter passes only Kudos' best nodes and leaves the others
/// out of its answer (neither passed nor failed). The real kube-scheduler accepts that answer
/// and places every pod among them: with 2, each pod's node is first or second in the ranking
/// it was placed by, while more nodes fit. (Passing every node, kube-scheduler's own scores
/// may pick any node that fits.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extender_filter_passing_only_the_best_nodes_places_every_pod_among_them()
-> anyhow::Result<()> {
    let shapes = uniform_shapes(&MODELS, 3, 2);
    let Some(Setup {
        run,
        mut cp,
        orch,
        ext,
        pods,
    }) = start_with("extender_filter_top", &shapes, &["--filter-top-nodes", "2"]).await?
    else {
        return Ok(());
    };
    feed_history(&orch, &shapes).await?;
    cp.start_scheduler(50, Some(&ext))?;
    for i in 0..8 {
        let name = format!("top-{i}");
        pods.create(&PostParams::default(), &pod(&name, Some(CLASS), Some(1)))
            .await?;
        let node = bound_node(&pods, &name).await?;
        let ex = orch.explain("default", &name)?;
        let entries = ex["ranking"]["entries"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(entries.len() > 2, "more nodes fit than pass: {ex}");
        let rank = entries
            .iter()
            .find(|e| e["node"] == node.as_str())
            .and_then(|e| e["rank"].as_u64());
        eprintln!("{name} -> {node}, rank {rank:?} of {}", entries.len());
        assert!(
            matches!(rank, Some(1 | 2)),
            "{name} landed on {node}, ranked {rank:?}; only the best two passed: {ex}"
        );
    }
    cp.check_running()?;
    run.pass();
    Ok(())
}

/// Every vendor registers `kudos.dev/gpu`: the real kube-scheduler with the Kudos extender
/// puts pods that name no vendor (CUDA images, the default) only on NVIDIA nodes and pods with
/// `kudos.dev/vendors: amd` only on AMD nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extender_keeps_pods_on_vendors_their_images_can_use() -> anyhow::Result<()> {
    // Two NVIDIA and two AMD nodes of 2 GPUs, all registering kudos.dev/gpu; 4 pods that name
    // no vendor (CUDA images: the default) and 4 that name AMD. The slots fit exactly, so a
    // pod on the wrong vendor also leaves another pod unschedulable.
    let shapes = uniform_shapes(&["T4", "MI300X"], 2, 2);
    let Some(Setup {
        run,
        mut cp,
        orch: _orch,
        ext,
        pods,
    }) = start("extender_vendors", &shapes).await?
    else {
        return Ok(());
    };
    let mut want = BTreeMap::new();
    for i in 0..4 {
        let cuda = format!("cuda-{i}");
        pods.create(&PostParams::default(), &pod(&cuda, Some(CLASS), Some(1)))
            .await?;
        want.insert(cuda, "node-t4-");
        let rocm = format!("rocm-{i}");
        let mut p = pod(&rocm, Some(CLASS), Some(1));
        p.metadata.annotations = Some(BTreeMap::from([(
            kudos_api::labels::VENDORS.to_owned(),
            "amd".to_owned(),
        )]));
        pods.create(&PostParams::default(), &p).await?;
        want.insert(rocm, "node-mi300x-");
    }
    cp.start_scheduler(50, Some(&ext))?;
    for (name, prefix) in &want {
        let node = bound_node(&pods, name).await?;
        eprintln!("{name} -> {node}");
        assert!(
            node.starts_with(prefix),
            "{name} landed on {node}; its image can use only {prefix}* nodes"
        );
    }
    cp.check_running()?;
    run.pass();
    Ok(())
}

/// With the shipped scheduler configuration (and the extender's bind), 10 one-GPU pods created
/// at once on 3 nodes x 2 GPUs end with 6 bound, none over a node's 2, and the rest
/// unschedulable. (With `ignoredByScheduler: true` this fails: the extender's filter alone
/// does not stop overcommit while binds are in flight.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extender_never_overcommits_devices() -> anyhow::Result<()> {
    let shapes = uniform_shapes(&["T4"], 3, 2);
    let Some(Setup {
        run,
        mut cp,
        orch: _orch,
        ext,
        pods,
    }) = start("extender_overcommit", &shapes).await?
    else {
        return Ok(());
    };
    for i in 0..10 {
        pods.create(
            &PostParams::default(),
            &pod(&format!("fill-{i}"), Some(CLASS), Some(1)),
        )
        .await?;
    }
    cp.start_scheduler(50, Some(&ext))?;
    let used = wait_for(
        "6 bound and 4 unschedulable",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let list = pods.list(&Default::default()).await.ok()?;
            let mut used = BTreeMap::<String, u32>::new();
            let mut unschedulable = 0;
            for p in &list.items {
                match p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                    Some(n) => *used.entry(n).or_default() += 1,
                    None => {
                        let c = p
                            .status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled").cloned());
                        if c.is_some_and(|c| c.status == "False") {
                            unschedulable += 1;
                        }
                    }
                }
            }
            let bound: u32 = used.values().sum();
            (bound + unschedulable == 10 && bound >= 6).then_some(used)
        },
    )
    .await?;
    eprintln!("one-GPU pods per node: {used:?}");
    assert!(
        used.values().all(|&u| u <= 2),
        "a node is overcommitted: {used:?}"
    );
    assert_eq!(
        used.values().sum::<u32>(),
        6,
        "every free GPU is used: {used:?}"
    );
    cp.check_running()?;
    run.pass();
    Ok(())
}
