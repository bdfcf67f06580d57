//! Index tests: `apply`/`reset` on `mk_*` objects, then read back node states.

use super::*;
use crate::kobj::{node_info, pod_facts};
use k8s_openapi::api::core::v1::{Node, Pod};
use kudos_scheduler_core::NodeState;

const GPU: &str = "kudos.dev/gpu";

fn mk_node(name: &str, gpus: u32, ready: bool) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"kudos.dev/gpu-vendor": "nvidia", "kudos.dev/gpu-model": "NVIDIA L4",
                                              "kudos.dev/gpu-memory-bytes": "24Gi"}},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi", GPU: gpus.to_string()},
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }, "reason": "KubeletNotReady"}]}
    }))
    .unwrap()
}

fn mk_pod(name: &str, node: Option<&str>, gpus: u32, phase: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi", GPU: gpus.to_string()}}}]},
        "status": {"phase": phase}
    }))
    .unwrap()
}

fn mk_index() -> Index {
    Index::new(GPU, 60.0, Scheduler::new(SchedulerConfig::default()), true)
}

/// A plugin configuration in which `vendor`'s plugin on `node` reported one `model` device.
fn one_device_reported(node: &str, vendor: &str, model: &str) -> PluginConfig {
    let mut cfg = PluginConfig::default();
    cfg.upsert(
        node,
        vendor,
        crate::state::VendorEntry {
            vendor_resource_name: format!("{vendor}.com/gpu"),
            devices: vec![crate::state::DeviceRecord {
                id: format!("{vendor}-0"),
                model: model.into(),
                memory_bytes: 1,
                ..Default::default()
            }],
            plugin_version: "1".into(),
        },
        GPU,
    );
    cfg
}

/// What the extender asks: `names` with exclusions applied, nothing from the request or in flight.
fn ask<'a, 'i>(
    idx: &'i Index,
    names: impl IntoIterator<Item = &'a str>,
    now: f64,
) -> NodeStates<'i> {
    idx.node_states(
        names,
        Exclusions::Apply,
        &FastMap::default(),
        &FastMap::default(),
        now,
    )
}

/// A heartbeat received at `at` from an agent with one healthy device.
fn heartbeat_at(at: f64) -> HeartbeatInfo {
    HeartbeatInfo {
        at,
        agent_version: String::new(),
        outbox_depth: 0,
        healthy_devices: 1,
        total_devices: 1,
    }
}

fn state(idx: &Index, name: &str, now: f64) -> NodeState {
    let mut s = ask(idx, [name], now).states;
    s.pop().expect("known node").into_owned()
}

#[test]
fn free_devices_follow_bound_pods() {
    let mut idx = mk_index();
    idx.reset_nodes(vec![node_info(&mk_node("n1", 4, true), GPU)]);
    idx.reset_pods(&[pod_facts(&mk_pod("a", Some("n1"), 1, "Running"), GPU).unwrap()]);
    assert!(idx.ready());
    let s = state(&idx, "n1", 0.0);
    assert_eq!(
        (
            s.free_devices,
            s.cpu_requested_milli,
            s.cpu_allocatable_milli
        ),
        (3, 1000, 16_000)
    );
    assert_eq!(s.profile.memory_bytes, 24 << 30);
    idx.apply_pod(&pod_facts(&mk_pod("b", Some("n1"), 2, "Running"), GPU).unwrap());
    assert_eq!(state(&idx, "n1", 0.0).free_devices, 1);
    // Ended pods release their devices; re-applying a pod does not double count.
    idx.apply_pod(&pod_facts(&mk_pod("b", Some("n1"), 2, "Succeeded"), GPU).unwrap());
    idx.apply_pod(&pod_facts(&mk_pod("a", Some("n1"), 1, "Running"), GPU).unwrap());
    assert_eq!(state(&idx, "n1", 0.0).free_devices, 3);
    idx.delete_pod(&pod_facts(&mk_pod("a", Some("n1"), 1, "Running"), GPU).unwrap());
    assert_eq!(state(&idx, "n1", 0.0).free_devices, 4);
    // In-flight binds from the extender count too.
    let assumed: FastMap<String, Requests> = [(
        "n1".to_owned(),
        Requests {
            gpus: 2,
            ..Default::default()
        },
    )]
    .into_iter()
    .collect();
    let s = idx
        .node_states(
            ["n1"],
            Exclusions::Apply,
            &FastMap::default(),
            &assumed,
            0.0,
        )
        .states;
    assert_eq!(s[0].free_devices, 2);
}

/// Found on real kubelets: a DRA node whose plugin first registered through the device-plugin
/// API (before the orchestrator's answer) keeps `kudos.dev/gpu: 0` allocatable for minutes.
/// Its free devices come from the plugin's healthy devices, less the pods bound there.
#[test]
fn a_dra_nodes_free_devices_come_from_its_plugin_not_a_stale_allocatable() {
    let mut idx = mk_index();
    let mut node = mk_node("n1", 0, true);
    node.metadata
        .labels
        .get_or_insert_default()
        .insert("kudos.dev/allocation-api".into(), "dra".into());
    idx.reset_nodes(vec![node_info(&node, GPU)]);
    idx.reset_pods(&[pod_facts(&mk_pod("a", Some("n1"), 1, "Running"), GPU).unwrap()]);
    idx.set_device_health("n1", "nvidia", (3, 4));
    assert_eq!(state(&idx, "n1", 0.0).free_devices, 2, "3 healthy, 1 used");
    // Once its ResourceSlice is seen, that is what the scheduler allocates from.
    let slice = |healthy| slices::SliceDevices {
        node: "n1".into(),
        total: 4,
        healthy,
        vendor: "nvidia".into(),
        model: "Tesla T4".into(),
        memory_bytes: 16 << 30,
    };
    idx.apply_slice("n1-gpu.kudos.dev", Some(slice(2)));
    assert_eq!(
        state(&idx, "n1", 0.0).free_devices,
        1,
        "2 untainted, 1 used"
    );
    // The same node on the device-plugin API: its allocatable counts, not the slice.
    idx.reset_nodes(vec![node_info(&mk_node("n1", 0, true), GPU)]);
    assert_eq!(state(&idx, "n1", 0.0).free_devices, 0);
}

/// A DRA node no plugin has reported and no label describes is known from its slice.
#[test]
fn a_dra_node_known_only_from_its_slice_is_ranked_with_the_slices_profile() {
    let mut idx = mk_index();
    idx.set_allocation_policy(crate::dra::AllocationPolicy::Dra);
    let bare: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n2"},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi"},
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap();
    idx.reset_nodes(vec![node_info(&bare, GPU)]);
    let unknown = ask(&idx, ["n2"], 0.0).unknown;
    assert_eq!(unknown.len(), 1, "no plugin report, no labels, no slice");
    idx.reset_slices(vec![(
        "n2-gpu.kudos.dev".into(),
        slices::SliceDevices {
            node: "n2".into(),
            total: 2,
            healthy: 2,
            vendor: "amd".into(),
            model: "MI300X".into(),
            memory_bytes: 192 << 30,
        },
    )]);
    let s = state(&idx, "n2", 0.0);
    assert_eq!(
        (s.profile.vendor.as_str(), s.profile.count, s.free_devices),
        ("amd", 2, 2)
    );
    idx.apply_slice("n2-gpu.kudos.dev", None);
    let unknown = ask(&idx, ["n2"], 0.0).unknown;
    assert_eq!(unknown.len(), 1, "the slice deleted");
}

/// Found on real kubelets: a pod bound through the extender, then shown running and then
/// Succeeded by the watch, must not fall back to the extender's assumption (which would hold its
/// device for the rest of the 5-minute assume window).
#[test]
fn an_ended_pod_is_known_so_its_assumed_bind_stops_counting() {
    let mut idx = mk_index();
    idx.reset_nodes(vec![node_info(&mk_node("n1", 4, true), GPU)]);
    idx.reset_pods(&[]);
    assert!(!idx.knows_bound_pod("uid-job"));
    idx.apply_pod(&pod_facts(&mk_pod("job", Some("n1"), 1, "Running"), GPU).unwrap());
    assert!(idx.knows_bound_pod("uid-job"));
    idx.apply_pod(&pod_facts(&mk_pod("job", Some("n1"), 1, "Succeeded"), GPU).unwrap());
    assert!(idx.knows_bound_pod("uid-job"), "ended pods stay known");
    assert_eq!(state(&idx, "n1", 0.0).free_devices, 4);
    // A pod deleted before the watch ever showed it ended is known too.
    idx.apply_pod(&pod_facts(&mk_pod("gone", Some("n1"), 1, "Running"), GPU).unwrap());
    idx.delete_pod(&pod_facts(&mk_pod("gone", Some("n1"), 1, "Running"), GPU).unwrap());
    assert!(idx.knows_bound_pod("uid-gone"));
    // Bounded: the oldest ended pods are forgotten first.
    for i in 0..MAX_ENDED_PODS {
        idx.delete_pod(
            &pod_facts(&mk_pod(&format!("p{i}"), Some("n1"), 1, "Running"), GPU).unwrap(),
        );
    }
    assert!(!idx.knows_bound_pod("uid-job"));
    assert!(idx.knows_bound_pod(&format!("uid-p{}", MAX_ENDED_PODS - 1)));
}

#[test]
fn health_from_readiness_devices_and_heartbeats() {
    let mut idx = mk_index();
    idx.reset_nodes(vec![
        node_info(&mk_node("ok", 1, true), GPU),
        node_info(&mk_node("down", 1, false), GPU),
    ]);
    assert!(!idx.ready(), "pods not synced yet");
    assert_eq!(state(&idx, "ok", 100.0).health, NodeHealth::Healthy);
    assert!(
        matches!(state(&idx, "down", 100.0).health, NodeHealth::Unhealthy { reason } if reason.contains("not Ready"))
    );
    idx.heartbeat("ok", heartbeat_at(50.0));
    assert_eq!(state(&idx, "ok", 100.0).health, NodeHealth::Healthy);
    assert!(
        matches!(state(&idx, "ok", 200.0).health, NodeHealth::Stale { age_seconds } if age_seconds == 150.0)
    );
    idx.set_device_health("ok", "nvidia", (0, 1));
    assert!(matches!(
        state(&idx, "ok", 60.0).health,
        NodeHealth::Unhealthy { .. }
    ));
}

/// Plugins' reports are outside input: counts summed over vendors saturate instead of
/// overflowing, and a node with healthy devices stays healthy.
#[test]
fn device_health_summed_over_vendors_saturates() {
    let mut idx = mk_index();
    idx.reset_nodes(vec![node_info(&mk_node("n1", 2, true), GPU)]);
    idx.set_device_health("n1", "nvidia", (u32::MAX, u32::MAX));
    idx.set_device_health("n1", "amd", (5, 5));
    assert_eq!(state(&idx, "n1", 0.0).health, NodeHealth::Healthy);
    let observed = idx.monitor_observations();
    let health = &observed.plugin_health["n1"];
    assert_eq!(
        (health.healthy, health.total),
        (u64::from(u32::MAX), u64::from(u32::MAX))
    );
}

#[test]
fn plugin_report_wins_over_labels_and_unknown_nodes_are_named() {
    let mut idx = mk_index();
    idx.reset_nodes(vec![node_info(&mk_node("n1", 2, true), GPU)]);
    idx.set_plugin_config(one_device_reported("n1", "amd", "MI300X"));
    assert_eq!(state(&idx, "n1", 0.0).profile.vendor, "amd");
    let unknown = ask(&idx, ["ghost"], 0.0).unknown;
    assert_eq!(unknown[0].0, "ghost");
}

/// Per name asked, the name of the state it found.
fn state_names<'s>(got: &'s NodeStates) -> Vec<Option<&'s str>> {
    let name = |i: u32| got.states.get(i as usize).map(|s| s.name.as_str());
    got.of_name.iter().map(|s| s.and_then(name)).collect()
}

/// kube-scheduler sends the same names in a new order for each pod. Whatever the order, each
/// name finds the same state and the unknown ones are reported in the order asked, while the
/// states come in the index's slot order (so that ranking reads them front to back).
#[test]
fn states_come_in_slot_order_whatever_the_order_asked() {
    let mut idx = mk_index();
    let nodes: Vec<String> = (0..6).map(|i| format!("n{i}")).collect();
    idx.reset_nodes(
        nodes
            .iter()
            .map(|n| node_info(&mk_node(n, 1, true), GPU))
            .collect(),
    );
    let slot_order: Vec<&str> = {
        let mut by_slot: Vec<(u32, &str)> = nodes
            .iter()
            .map(|n| (idx.slot_of.get(n).expect("known"), n.as_str()))
            .collect();
        by_slot.sort();
        by_slot.into_iter().map(|(_, n)| n).collect()
    };
    for asked in [
        ["n0", "x", "n1", "n2", "n3", "y", "n4", "n5"],
        ["n5", "n4", "y", "n3", "n2", "n1", "x", "n0"],
        ["n3", "y", "n0", "n5", "x", "n1", "n4", "n2"],
    ] {
        let got = ask(&idx, asked, 0.0);
        let names: Vec<&str> = got.states.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, slot_order, "asked {asked:?}");
        let expected: Vec<Option<&str>> = asked
            .iter()
            .map(|n| n.starts_with('n').then_some(*n))
            .collect();
        assert_eq!(state_names(&got), expected, "asked {asked:?}");
        let unknown: Vec<&str> = got.unknown.iter().map(|u| u.0.as_str()).collect();
        let unknown_asked: Vec<&str> = asked
            .iter()
            .copied()
            .filter(|n| !n.starts_with('n'))
            .collect();
        assert_eq!(unknown, unknown_asked, "in the order asked");
    }
}

/// Each name asked about finds its state by position: a repeated name its first occurrence's
/// (one state per node, whether the plugin configuration or only labels describe it), an
/// unknown or excluded name none, reported once; `GET /state`'s view ignores exclusions.
#[test]
fn each_name_finds_its_state_and_repeats_share_the_first() {
    let mut idx = mk_index();
    // "plugged" has a plugin report (a configured profile); "labelled" only its Node's labels.
    idx.reset_nodes(vec![
        node_info(&mk_node("labelled", 2, true), GPU),
        node_info(&mk_node("cordoned", 2, true), GPU),
    ]);
    idx.set_plugin_config(one_device_reported("plugged", "nvidia", "A100"));
    idx.excluded.insert(
        "cordoned".into(),
        "excluded by Kudos node monitoring: test".into(),
    );
    let asked = [
        "plugged", "ghost", "labelled", "cordoned", "plugged", "ghost", "labelled", "cordoned",
    ];
    let got = ask(&idx, asked, 0.0);
    assert_eq!(got.states.len(), 2, "one state per node");
    assert_eq!(
        state_names(&got),
        [
            Some("plugged"),
            None,
            Some("labelled"),
            None,
            Some("plugged"),
            None,
            Some("labelled"),
            None
        ]
    );
    let unknown: Vec<&str> = got.unknown.iter().map(|u| u.0.as_str()).collect();
    assert_eq!(unknown, ["ghost", "cordoned"]);
    assert_eq!(got.unknown[1].1, "excluded by Kudos node monitoring: test");

    let view = idx.node_states(
        ["cordoned"],
        Exclusions::Ignore,
        &FastMap::default(),
        &FastMap::default(),
        0.0,
    );
    assert_eq!(view.of_name, [Some(0)]);
    assert_eq!(view.states[0].name.as_str(), "cordoned");
}

/// Nodes described only by their labels share the labels' names too, follow a label change,
/// and a Node sent in the request wins over the index's; an entry's slot, freed when its node
/// goes, serves a new node without mixing the two up.
#[test]
fn labelled_nodes_share_names_follow_changes_and_slots_are_reused() {
    let mut idx = mk_index();
    idx.reset_nodes(vec![
        node_info(&mk_node("a", 2, true), GPU),
        node_info(&mk_node("b", 2, true), GPU),
    ]);
    let [a, b] = ["a", "b"].map(|n| state(&idx, n, 0.0).profile);
    assert_eq!(a.model, "NVIDIA L4");
    assert!(
        Name::same_allocation(&a.model, &b.model) && Name::same_allocation(&a.vendor, &b.vendor)
    );

    let mut relabelled = mk_node("b", 2, true);
    let labels = relabelled.metadata.labels.get_or_insert_default();
    labels.insert("kudos.dev/gpu-model".into(), "NVIDIA T4".into());
    idx.apply_node(node_info(&relabelled, GPU));
    assert_eq!(state(&idx, "b", 0.0).profile.model, "NVIDIA T4");

    let sent: FastMap<String, NodeInfo> =
        [("b".to_owned(), node_info(&mk_node("b", 2, true), GPU))]
            .into_iter()
            .collect();
    let got = idx.node_states(["b"], Exclusions::Apply, &sent, &FastMap::default(), 0.0);
    assert_eq!(
        got.states[0].profile.model, "NVIDIA L4",
        "the request's Node wins"
    );

    idx.delete_node("a");
    idx.apply_node(node_info(&mk_node("c", 1, true), GPU));
    let got = ask(&idx, ["c", "b", "a", "c", "b"], 0.0);
    let names: Vec<&str> = got.states.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["c", "b"]);
    assert_eq!(got.of_name, [Some(0), Some(1), None, Some(0), Some(1)]);
    assert_eq!(got.states[0].free_devices, 1);
}

/// Nodes whose plugins report one model share its names (ranking matches profiles by them),
/// and keep their own device counts; another model has its own.
#[test]
fn nodes_of_one_model_share_its_names() {
    let mut idx = mk_index();
    let names = ["a", "b", "c"];
    idx.reset_nodes(
        names
            .iter()
            .map(|n| node_info(&mk_node(n, 2, true), GPU))
            .collect(),
    );
    let mut cfg = PluginConfig::default();
    for (node, model, devices) in [("a", "H100", 2), ("b", "H100", 1), ("c", "A100", 2)] {
        let devices = (0..devices)
            .map(|i| crate::state::DeviceRecord {
                id: format!("nvidia-{i}"),
                model: model.into(),
                memory_bytes: 80 << 30,
                ..Default::default()
            })
            .collect();
        let entry = crate::state::VendorEntry {
            vendor_resource_name: "nvidia.com/gpu".into(),
            devices,
            plugin_version: "1".into(),
        };
        cfg.upsert(node, "nvidia", entry, GPU);
    }
    idx.set_plugin_config(cfg);
    let [a, b, c] = names.map(|n| state(&idx, n, 0.0).profile);
    assert!(
        Name::same_allocation(&a.model, &b.model) && Name::same_allocation(&a.vendor, &b.vendor)
    );
    assert_eq!((a.count, b.count), (2, 1));
    assert!(!Name::same_allocation(&a.model, &c.model) && *c.model == *"A100");
    assert!(Name::same_allocation(&a.vendor, &c.vendor));
}

/// A run's in-progress snapshots and its final report (same run ID) are one observation, and
/// the class's latest third queue is kept for `/explain`.
#[test]
fn snapshots_of_one_run_count_once_and_the_third_queue_is_kept() {
    let mut idx = mk_index();
    let report = |seq: u64, end: f64, outcome: RunOutcome, work: f64| StoredRun {
        seq,
        report_id: format!("r{seq}"),
        run_id: "pod-uid-1".into(),
        node: "n1".into(),
        pod_namespace: "default".into(),
        pod_name: "train".into(),
        class: "resnet".into(),
        device_ids: vec!["nv-0".into()],
        outcome,
        start: 1000.0,
        end,
        gpu_busy_seconds: 0.0,
        progress: None,
        work_done: Some(work),
        profile: Some(ProfileRecord {
            vendor: "nvidia".into(),
            model: "V100".into(),
            count: 1,
            memory_bytes: 16 << 30,
        }),
        received_at: end,
    };
    assert!(idx.third_queue("resnet").is_none());
    for (seq, end) in [(1, 1600.0), (2, 2200.0), (3, 2800.0)] {
        let fb = idx.apply_run(&report(
            seq,
            end,
            RunOutcome::InProgress,
            (end - 1000.0) / 2.0,
        ));
        assert!(matches!(fb, Ok(Some(_))), "{fb:?}");
    }
    let done = idx.apply_run(&report(4, 3400.0, RunOutcome::Completed, 1200.0));
    assert!(matches!(done, Ok(Some(_))), "{done:?}");
    assert_eq!(idx.scheduler().state().node_runs("resnet", "n1"), 1);
    let third = idx.third_queue("resnet").expect("kept");
    assert_eq!(third.observed_at, 3400.0);
    assert_eq!(third.nodes.first().map(|n| n.0.as_str()), Some("n1"));
}

#[test]
fn failed_runs_count_per_vendor_and_in_progress_snapshots_do_not() {
    let mut idx = mk_index();
    let run = |seq: u64, vendor: &str, outcome: RunOutcome| StoredRun {
        seq,
        report_id: format!("r{seq}"),
        run_id: format!("run-{seq}"),
        node: format!("{vendor}-node"),
        pod_namespace: "default".into(),
        pod_name: format!("p{seq}"),
        class: "llm".into(),
        device_ids: vec!["d0".into()],
        outcome,
        start: 1000.0,
        end: 1010.0,
        gpu_busy_seconds: 0.0,
        progress: (outcome == RunOutcome::InProgress).then_some(0.5),
        work_done: None,
        profile: Some(ProfileRecord {
            vendor: vendor.into(),
            model: "M".into(),
            count: 1,
            memory_bytes: 16 << 30,
        }),
        received_at: 1010.0,
    };
    idx.apply_run(&run(1, "nvidia", RunOutcome::Completed))
        .expect("applied");
    for seq in 2..5 {
        let fb = idx.apply_run(&run(seq, "amd", RunOutcome::Failed));
        assert!(
            matches!(fb, Ok(None)),
            "a failed run teaches no speed: {fb:?}"
        );
        idx.apply_run(&run(seq + 10, "amd", RunOutcome::InProgress))
            .expect("applied");
    }
    let state = idx.scheduler().state();
    let why = state.vendor_excluded("llm", "amd").expect("excluded");
    assert!(why.contains("failed 3 times"), "{why}");
    assert_eq!(state.vendor_excluded("llm", "nvidia"), None);
}

/// Pods change which nodes fit, never a node's score, so they leave the generation alone (the
/// extender's filter → prioritize reuse survives the binds of earlier pods); a Node update
/// moves it only when it changes what Kudos reads of the Node.
#[test]
fn the_generation_moves_with_score_inputs_not_with_pods() {
    let mut idx = mk_index();
    let n1 = node_info(&mk_node("n1", 4, true), GPU);
    idx.reset_nodes(vec![n1.clone()]);
    let g = idx.generation();
    let web = pod_facts(&mk_pod("web", Some("n1"), 0, "Running"), GPU).unwrap();
    idx.apply_pod(&web);
    assert_eq!(state(&idx, "n1", 0.0).cpu_requested_milli, 1000);
    idx.delete_pod(&web);
    assert_eq!(state(&idx, "n1", 0.0).cpu_requested_milli, 0);
    let train = |phase| pod_facts(&mk_pod("train", Some("n1"), 1, phase), GPU).unwrap();
    idx.apply_pod(&train("Running"));
    assert_eq!(
        state(&idx, "n1", 0.0).free_devices,
        3,
        "a bound GPU pod takes one"
    );
    idx.apply_pod(&train("Succeeded"));
    assert_eq!(
        state(&idx, "n1", 0.0).free_devices,
        4,
        "an ended one frees it"
    );
    idx.reset_pods(&[train("Running")]);
    assert_eq!(state(&idx, "n1", 0.0).free_devices, 3);
    assert_eq!(idx.generation(), g, "pods change what fits, not a score");

    idx.apply_node(n1.clone());
    assert_eq!(
        idx.generation(),
        g,
        "a Node update with nothing new for Kudos"
    );
    idx.apply_node(node_info(&mk_node("n1", 4, false), GPU));
    let not_ready = idx.generation();
    assert!(
        not_ready > g,
        "a node that stops being ready is judged again"
    );
    assert_ne!(state(&idx, "n1", 0.0).health, NodeHealth::Healthy);
    idx.apply_node(n1);
    assert!(idx.generation() > not_ready, "and again when it is back");
    assert_eq!(state(&idx, "n1", 0.0).health, NodeHealth::Healthy);
}

/// Plugins report every few minutes and ResourceSlices are resent with nothing new: the same
/// device health or slice again leaves the generation alone; a change moves it.
#[test]
fn reports_with_nothing_new_leave_the_generation_alone() {
    let mut idx = mk_index();
    idx.reset_nodes(vec![node_info(&mk_node("n1", 4, true), GPU)]);
    idx.set_device_health("n1", "nvidia", (4, 4));
    let g = idx.generation();
    idx.set_device_health("n1", "nvidia", (4, 4));
    assert_eq!(idx.generation(), g, "the same health again");
    assert_eq!(state(&idx, "n1", 0.0).health, NodeHealth::Healthy);
    idx.set_device_health("n1", "nvidia", (0, 4));
    let failed = idx.generation();
    assert!(failed > g, "every device failed");
    assert!(matches!(
        state(&idx, "n1", 0.0).health,
        NodeHealth::Unhealthy { .. }
    ));
    idx.set_device_health("n1", "amd", (4, 4));
    assert!(idx.generation() > failed, "another vendor's first report");

    let slice = |healthy| crate::index::slices::SliceDevices {
        node: "n1".into(),
        total: 4,
        healthy,
        ..Default::default()
    };
    idx.apply_slice("n1-gpu", Some(slice(4)));
    let g = idx.generation();
    idx.apply_slice("n1-gpu", Some(slice(4)));
    idx.apply_slice("n2-gpu", None);
    assert_eq!(
        idx.generation(),
        g,
        "the same slice again, an unknown one gone"
    );
    idx.apply_slice("n1-gpu", Some(slice(2)));
    let tainted = idx.generation();
    assert!(tainted > g, "devices tainted");
    idx.apply_slice("n1-gpu", None);
    assert!(idx.generation() > tainted, "the slice deleted");
}

/// One entry per node holds what every source knows of it; the entry goes when the last source
/// lets go (the state is bounded by nodes that exist), and what each source said survives the
/// others' changes.
#[test]
fn a_nodes_entry_lives_while_any_source_knows_it() {
    let mut idx = mk_index();
    let hb = HeartbeatInfo {
        at: 50.0,
        agent_version: String::new(),
        outbox_depth: 0,
        healthy_devices: 1,
        total_devices: 1,
    };
    idx.reset_nodes(vec![
        node_info(&mk_node("n1", 4, true), GPU),
        node_info(&mk_node("n2", 4, true), GPU),
        node_info(&mk_node("n1", 4, true), GPU),
    ]);
    assert_eq!(idx.node_count(), 2, "a name listed twice is one node");
    idx.heartbeat("n1", hb.clone());
    idx.set_device_health("n1", "nvidia", (3, 4));
    idx.apply_pod(&pod_facts(&mk_pod("a", Some("n1"), 1, "Running"), GPU).unwrap());
    idx.set_plugin_config(one_device_reported("n1", "nvidia", "NVIDIA L4"));

    // The Node object goes; the plugin's profile and the bound pod keep the entry.
    idx.delete_node("n1");
    assert_eq!(idx.node_count(), 1);
    assert!(
        idx.view(100.0).heartbeats.is_empty(),
        "its heartbeat went with it"
    );
    let s = state(&idx, "n1", 100.0);
    assert_eq!((s.free_devices, s.cpu_requested_milli), (0, 1000));
    // A new Node list does not forget the pod's use.
    idx.reset_nodes(vec![node_info(&mk_node("n1", 4, true), GPU)]);
    assert_eq!(idx.node_count(), 1);
    assert_eq!(state(&idx, "n1", 100.0).free_devices, 3);
    assert!(
        !idx.slot_of.contains_key("n2"),
        "n2 had nothing but its Node object"
    );

    idx.delete_node("n1");
    idx.delete_pod(&pod_facts(&mk_pod("a", Some("n1"), 1, "Running"), GPU).unwrap());
    assert!(idx.slot_of.contains_key("n1"), "still configured");
    idx.set_plugin_config(PluginConfig::default());
    assert!(
        idx.slot_of.is_empty(),
        "nothing left of n1: {:?}",
        idx.slot_of
    );
    assert_eq!(idx.profile("n1"), None);
}

/// Every node's state as the extender gets it (lent by its entry where it can be) against one
/// built from every source for the call, after each kind of write the index takes: a write that
/// left a stale state lent would show here.
#[test]
fn lent_states_follow_every_write() {
    let names = ["n1", "n2", "n3"];
    let check = |idx: &Index, step: &str, now: f64| {
        let lent = ask(idx, names, now);
        let (sent, binds) = (FastMap::default(), FastMap::default());
        let built: Vec<Result<NodeState, String>> = names
            .iter()
            .map(|&n| {
                let facts = idx.slot_of.get(n).and_then(|slot| idx.facts_at(slot));
                idx.first_state(n, facts, Exclusions::Apply, &sent, &binds, now)
            })
            .collect();
        let got: Vec<Result<NodeState, String>> = names
            .iter()
            .enumerate()
            .map(|(i, &n)| match lent.of_name[i] {
                Some(s) => Ok((*lent.states[s as usize]).clone()),
                None => Err(lent
                    .unknown
                    .iter()
                    .find(|(u, _)| u == n)
                    .map(|(_, r)| r.clone())
                    .unwrap_or_default()),
            })
            .collect();
        assert_eq!(got, built, "after {step}");
        // Asked again: the same, now from the entries' states.
        let again: Vec<NodeState> = ask(idx, names, now)
            .states
            .into_iter()
            .map(NodeRef::into_owned)
            .collect();
        let first: Vec<NodeState> = lent.states.into_iter().map(NodeRef::into_owned).collect();
        assert_eq!(again, first, "asked twice after {step}");
    };
    let mut idx = mk_index();
    check(&idx, "nothing", 0.0);
    idx.reset_nodes(vec![
        node_info(&mk_node("n1", 4, true), GPU),
        node_info(&mk_node("n2", 2, true), GPU),
    ]);
    idx.reset_pods(&[]);
    check(&idx, "reset_nodes", 0.0);
    idx.apply_pod(&pod_facts(&mk_pod("a", Some("n1"), 1, "Running"), GPU).unwrap());
    check(&idx, "a pod bound", 0.0);
    idx.delete_pod(&pod_facts(&mk_pod("a", Some("n1"), 1, "Running"), GPU).unwrap());
    check(&idx, "the pod deleted", 0.0);
    idx.reset_pods(&[pod_facts(&mk_pod("b", Some("n2"), 2, "Running"), GPU).unwrap()]);
    check(&idx, "reset_pods", 0.0);
    idx.apply_node(node_info(&mk_node("n1", 4, false), GPU));
    check(&idx, "n1 not ready", 0.0);
    // Ready again, with the stale allocatable of 0 a DRA node's kubelet can show: the
    // allocation policy decides whether it or the plugin's healthy devices count.
    idx.apply_node(node_info(&mk_node("n1", 0, true), GPU));
    idx.set_device_health("n1", "nvidia", (3, 4));
    check(&idx, "n1 ready with a plugin health report", 0.0);
    idx.set_plugin_config(one_device_reported("n3", "amd", "MI300X"));
    check(&idx, "a plugin report for n3", 0.0);
    idx.set_device_health("n3", "amd", (0, 1));
    check(&idx, "n3's devices unhealthy", 0.0);
    idx.heartbeat("n2", heartbeat_at(0.0));
    check(&idx, "a heartbeat", 10.0);
    check(&idx, "the heartbeat gone stale", 1000.0);
    idx.heartbeat("n2", heartbeat_at(995.0));
    check(&idx, "a fresh heartbeat", 1000.0);
    idx.set_allocation_policy(crate::dra::AllocationPolicy::Dra);
    check(&idx, "DRA everywhere", 0.0);
    idx.apply_slice(
        "n1-gpu.kudos.dev",
        Some(slices::SliceDevices {
            node: "n1".into(),
            total: 4,
            healthy: 1,
            vendor: "nvidia".into(),
            model: "Tesla T4".into(),
            memory_bytes: 16 << 30,
        }),
    );
    check(&idx, "a slice", 0.0);
    idx.reset_slices(Vec::new());
    check(&idx, "slices reset", 0.0);
    idx.delete_node("n1");
    check(&idx, "n1 deleted", 0.0);
}

/// Publishing hands the replaced model back, held by nobody else, so the caller frees it after
/// releasing the lock (freeing a large model under the write lock stalled every ranking).
#[test]
fn publishing_a_model_hands_back_the_one_it_replaced() {
    let mut idx = mk_index();
    let old = idx.model();
    let g = idx.generation();
    let new = Arc::new(Scheduler::new(SchedulerConfig::default()));
    let replaced = idx.publish_model(new.clone(), 7);
    drop(old);
    assert_eq!(
        Arc::strong_count(&replaced),
        1,
        "the index no longer holds the replaced model"
    );
    assert!(Arc::ptr_eq(&idx.model(), &new), "the new model is served");
    assert!(idx.generation() > g, "rankings made before are stale");
    assert_eq!(idx.applied_seq(), 7);
    let _same = idx.publish_model(idx.model(), 3);
    assert_eq!(idx.applied_seq(), 7, "the applied seq never goes back");
}

#[test]
fn known_nodes_counts_each_asked_name_with_an_entry() {
    let mut idx = mk_index();
    for n in ["a", "b", "c"] {
        idx.apply_node(node_info(&mk_node(n, 2, true), GPU));
    }
    idx.delete_node("c");
    // A name asked twice counts twice; unknown and deleted names not at all.
    assert_eq!(idx.known_nodes(&["a", "zz", "b", "a", "c", ""]), 3);
    assert_eq!(idx.known_nodes(&[]), 0);
}
