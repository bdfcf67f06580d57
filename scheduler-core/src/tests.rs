//! Behaviour tests of the facade: the pipeline end to end on small clusters.

use super::*;

pub(crate) fn profile(model: &str) -> DeviceProfile {
    DeviceProfile {
        vendor: "nvidia".into(),
        model: model.into(),
        count: 4,
        memory_bytes: 16 << 30,
    }
}

pub(crate) fn node(name: &str, model: &str) -> NodeState {
    NodeState {
        name: name.into(),
        profile: profile(model),
        free_devices: 4,
        cpu_allocatable_milli: 32_000,
        cpu_requested_milli: 0,
        memory_allocatable_bytes: 128 << 30,
        memory_requested_bytes: 0,
        health: NodeHealth::Healthy,
    }
}

pub(crate) fn pod(class: Option<&str>) -> PodSpec {
    PodSpec {
        namespace: "default".into(),
        name: "job".into(),
        class: class.map(Into::into),
        gpus: 1,
        cpu_milli: 1000,
        memory_bytes: 1 << 30,
        ..Default::default()
    }
}

pub(crate) fn run(node: &str, model: &str, class: &str, seconds: f64, end: f64) -> RunObservation {
    RunObservation {
        node: node.into(),
        class: class.into(),
        profile: profile(model),
        gpus: 1,
        start: end - seconds,
        end,
        completed: true,
        progress: None,
        gpu_busy_seconds: None,
        work_units: None,
    }
}

#[test]
fn unclassified_pods_get_neutral_scores() {
    let s = Scheduler::new(SchedulerConfig::default());
    let nodes = vec![node("a", "V100"), node("b", "K80")];
    let r = s.rank(&pod(None), &nodes, 0.0, 1);
    assert_eq!(r.entries.len(), 2);
    assert!(
        r.entries
            .iter()
            .all(|e| e.score == 5 && e.prediction.is_none())
    );
    assert_eq!(r.threshold_seconds, None);
}

#[test]
fn prior_prefers_faster_devices_before_any_history() {
    let s = Scheduler::new(SchedulerConfig::default());
    let nodes = vec![node("slow", "Tesla K80"), node("fast", "H100 SXM")];
    let r = s.rank(&pod(Some("resnet")), &nodes, 0.0, 1);
    assert_eq!(r.best().map(|e| e.node.as_str()), Some("fast"));
    assert!(r.entries.iter().all(|e| {
        e.prediction
            .as_ref()
            .is_some_and(|p| p.source == PredictionSource::Prior)
    }));
}

#[test]
fn learns_that_a_slower_spec_is_faster_for_a_class() {
    // The class runs 3x faster on the "K80" than on the "V100" (like Gavel's recommendation model):
    // evidence must beat the specification prior.
    let mut s = Scheduler::new(SchedulerConfig::default());
    let mut t = 0.0;
    for _ in 0..5 {
        t += 1000.0;
        s.observe(&run("k", "K80", "rec", 100.0, t), t)
            .expect("valid");
        s.observe(&run("v", "V100", "rec", 300.0, t), t)
            .expect("valid");
    }
    let nodes = vec![node("v", "V100"), node("k", "K80")];
    let r = s.rank(&pod(Some("rec")), &nodes, t, 7);
    println!("{}", r.to_table());
    assert_eq!(r.best().map(|e| e.node.as_str()), Some("k"));
    let k = &r.entries[0];
    assert_eq!(k.review, Some(Review::Good));
    assert_eq!(r.entries[1].review, Some(Review::Bad));
    assert!(k.score > r.entries[1].score);
    let p = k.prediction.as_ref().expect("prediction");
    assert!((p.seconds / 100.0 - 1.0).abs() < 0.05, "{p:?}");
    assert!(matches!(p.source, PredictionSource::OwnHistory { runs: 5 }));
}

#[test]
fn unfit_nodes_are_rejected_with_reasons() {
    let mut cfg = SchedulerConfig::default();
    cfg.classes.insert(
        "llm".into(),
        ClassConfig {
            allowed_vendors: vec!["amd".into()],
            ..ClassConfig::default()
        },
    );
    let s = Scheduler::new(cfg);
    let mut full = node("full", "V100");
    full.free_devices = 0;
    let mut sick = node("sick", "V100");
    sick.health = NodeHealth::Unhealthy {
        reason: "XID 79".into(),
    };
    let mut stale = node("stale", "V100");
    stale.health = NodeHealth::Stale { age_seconds: 300.0 };
    let mut amd = node("amd", "MI300X");
    amd.profile.vendor = "amd".into();
    let nodes = vec![full, sick, stale, node("nv", "A100"), amd];
    let r = s.rank(&pod(Some("llm")), &nodes, 0.0, 1);
    assert_eq!(r.entries.len(), 1);
    assert_eq!(r.entries[0].node, "amd");
    let reasons: Vec<&str> = r.rejected.iter().map(|x| x.reason.as_str()).collect();
    assert!(reasons[0].contains("free device"), "{reasons:?}");
    assert!(reasons[1].contains("allows vendors"), "{reasons:?}");
    assert!(reasons[2].contains("XID 79"), "{reasons:?}");
    assert!(reasons[3].contains("stale"), "{reasons:?}");
}

#[test]
fn deadline_is_the_threshold_and_work_scales_time() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    for i in 0..3 {
        let mut r = run("a", "V100", "c", 200.0, 1000.0 * f64::from(i + 1));
        r.work_units = Some(2.0);
        s.observe(&r, 1000.0 * f64::from(i + 1)).expect("valid");
    }
    let mut p = pod(Some("c"));
    p.work_units = Some(10.0);
    p.deadline_seconds = Some(900.0);
    let r = s.rank(&p, &[node("a", "V100")], 4000.0, 1);
    assert_eq!(r.threshold_seconds, Some(900.0));
    let e = &r.entries[0];
    let secs = e.prediction.as_ref().map(|x| x.seconds).unwrap_or_default();
    assert!((secs - 1000.0).abs() < 20.0, "{secs}");
    assert_eq!(e.review, Some(Review::Bad));
}

#[test]
fn observe_rejects_nonsense_and_leaves_state_untouched() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    let before = s.state().clone();
    let mut bad = run("a", "V100", "c", 10.0, 100.0);
    bad.end = 50.0;
    bad.start = 60.0;
    assert!(matches!(
        s.observe(&bad, 100.0),
        Err(ObserveError::EndBeforeStart { .. })
    ));
    let mut nan = run("a", "V100", "c", 10.0, 100.0);
    nan.end = f64::NAN;
    assert!(matches!(
        s.observe(&nan, 100.0),
        Err(ObserveError::NonFinite { .. })
    ));
    let mut prog = run("a", "V100", "c", 10.0, 100.0);
    prog.completed = false;
    prog.progress = Some(1.5);
    assert_eq!(
        s.observe(&prog, 100.0),
        Err(ObserveError::ProgressOutOfRange(1.5))
    );
    prog.progress = None;
    assert_eq!(s.observe(&prog, 100.0), Err(ObserveError::MissingProgress));
    let zero = run("a", "V100", "c", 0.0, 100.0);
    assert_eq!(s.observe(&zero, 100.0), Err(ObserveError::ZeroDuration));
    // Amounts at the edge of what a float holds: a subnormal amount of work made seconds per
    // unit infinite, the class's fit NaN and the next report of the run panic.
    let mut tiny = run("a", "V100", "c", 60.0, 100.0);
    tiny.work_units = Some(2.237_912_271_857e-312);
    assert_eq!(
        s.observe(&tiny, 100.0),
        Err(ObserveError::InvalidWork(2.237_912_271_857e-312))
    );
    tiny.work_units = Some(1e300);
    assert!(matches!(
        s.observe(&tiny, 100.0),
        Err(ObserveError::InvalidWork(_))
    ));
    tiny.work_units = None;
    tiny.completed = false;
    tiny.progress = Some(1e-300);
    assert!(matches!(
        s.observe(&tiny, 100.0),
        Err(ObserveError::ProgressOutOfRange(_))
    ));
    assert_eq!(s.state(), &before);
}

#[test]
fn in_progress_runs_extrapolate() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    let mut r = run("a", "V100", "c", 50.0, 100.0);
    r.completed = false;
    r.progress = Some(0.25);
    let f = s.observe(&r, 100.0).expect("valid");
    assert_eq!(f.actual_seconds, 200.0);
    assert_eq!(f.third_queue.first().map(|x| x.0.as_str()), Some("a"));
}

#[test]
fn one_poisoned_run_has_bounded_influence() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    for i in 1..=10 {
        s.observe(
            &run("a", "V100", "c", 100.0, f64::from(i) * 1000.0),
            f64::from(i) * 1000.0,
        )
        .expect("valid");
    }
    s.observe(&run("a", "V100", "c", 1.0e7, 2.0e7), 2.0e7)
        .expect("valid");
    let p = s.predict("c", "a", &profile("V100"), None);
    assert!(p.seconds < 130.0, "{p:?}");
}

/// A scheduler that saw three rounds of runs of class `c`, each `(node, model, seconds)` on
/// `gpus` devices: the gang tests' history, at their members' shape.
fn trained_at_gang_shape(gpus: u32, runs: &[(&str, &str, f64)]) -> Scheduler {
    let mut s = Scheduler::new(SchedulerConfig::default());
    for i in 1..=3 {
        let t = f64::from(i) * 1000.0;
        for &(n, m, secs) in runs {
            let mut r = run(n, m, "c", secs, t);
            r.gpus = gpus;
            s.observe(&r, t).expect("valid");
        }
    }
    s
}

/// A member of gang `g` of `size` pods of class `c`, each asking for `gpus` devices.
fn gang_pod(gpus: u32, size: u32) -> PodSpec {
    let mut p = pod(Some("c"));
    p.gpus = gpus;
    p.gang = Some(GangSpec {
        name: "g".into(),
        size,
    });
    p
}

#[test]
fn gang_prefers_one_profile_and_reports_slowest_member() {
    // The runs of the class at the gang's shape (two devices per pod).
    let s = trained_at_gang_shape(
        2,
        &[
            ("v1", "V100", 100.0),
            ("v2", "V100", 100.0),
            ("p1", "P100", 105.0),
            ("k1", "K80", 400.0),
        ],
    );
    let mut p = gang_pod(2, 4);
    let nodes = vec![
        node("v1", "V100"),
        node("v2", "V100"),
        node("p1", "P100"),
        node("k1", "K80"),
    ];
    let g = s.place_gang(&p, &nodes, 5000.0, 1).expect("fits");
    assert_eq!(g.members.len(), 4);
    assert!(
        g.members
            .iter()
            .all(|m| m.node.starts_with('v') && m.gpus == 2),
        "{g:?}"
    );
    assert_eq!(
        g.expires_at,
        5000.0 + s.config().gang_reservation_ttl_seconds
    );
    assert!((g.predicted_seconds - 100.0).abs() < 5.0);
    p.gang.as_mut().expect("a gang member").size = 9;
    assert!(matches!(
        s.place_gang(&p, &nodes, 5000.0, 1),
        Err(PlaceError::InsufficientCapacity {
            needed: 9,
            available: 8,
            ..
        })
    ));
}

#[test]
fn state_round_trips_through_json() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.observe(&run("a", "V100", "c", 100.0, 1000.0), 1000.0)
        .expect("valid");
    let json = serde_json::to_string(s.state()).expect("serialises");
    let back: ModelState = serde_json::from_str(&json).expect("deserialises");
    let s2 = Scheduler::with_state(SchedulerConfig::default(), back);
    assert_eq!(
        s.predict("c", "a", &profile("V100"), None),
        s2.predict("c", "a", &profile("V100"), None)
    );
}

/// Closed loop: rank, run on the head of the queue, observe the true time. The class runs 1.25x
/// faster on the P100 than on the V100 (the prior says the opposite, mildly) and 4x slower on the
/// K80. Exploration must find the P100, and evidence must keep pods there.
#[test]
fn closed_loop_settles_on_the_fastest_type() {
    let truth = |model: &str| match model {
        "P100" => 80.0,
        "V100" => 100.0,
        _ => 400.0,
    };
    let nodes: Vec<NodeState> = ["K80", "P100", "V100"]
        .iter()
        .flat_map(|m| (0..2).map(move |i| node(&format!("{}-{i}", m.to_lowercase()), m)))
        .collect();
    let mut s = Scheduler::new(SchedulerConfig::default());
    let mut chosen = Vec::new();
    let mut t = 0.0;
    for job in 0..30u64 {
        let r = s.rank(&pod(Some("c")), &nodes, t, job);
        let best = r.best().expect("a node fits").node.clone();
        let model = nodes
            .iter()
            .find(|n| n.name == best)
            .map(|n| n.profile.model.to_string())
            .unwrap_or_default();
        t += 1000.0;
        s.observe(&run(&best, &model, "c", truth(&model), t), t)
            .expect("valid");
        chosen.push(model);
    }
    let last: Vec<&str> = chosen[20..].iter().map(String::as_str).collect();
    assert!(last.iter().all(|m| *m == "P100"), "{chosen:?}");
    // The exploration guarantee tries every type `explore_runs` times (the prior may be wrong
    // by 20x), and no more once the runs say it is slow.
    let explore = SchedulerConfig::default().explore_runs as usize;
    assert!(
        chosen.iter().filter(|m| *m == "K80").count() <= explore,
        "{chosen:?}"
    );
}

#[test]
fn a_new_fastest_profile_rejudges_the_class_in_the_third_queue() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    let mut t = 0.0;
    for _ in 0..3 {
        t += 100.0;
        let f = s
            .observe(&run("slow", "K80", "c", 400.0, t), t)
            .expect("valid");
        assert_eq!(f.review, Review::Good, "the only profile is the reference");
    }
    let before = s
        .rank(&pod(Some("c")), &[node("slow", "K80")], t, 1)
        .entries[0]
        .good_rate;
    t += 100.0;
    let f = s
        .observe(&run("fast", "V100", "c", 100.0, t), t)
        .expect("valid");
    assert_eq!(f.review, Review::Good);
    let names: Vec<&str> = f.third_queue.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(names, ["fast", "slow"], "{:?}", f.third_queue);
    assert!(f.third_queue[0].1 > f.third_queue[1].1);
    // The slow node's past runs are now bad reviews.
    let after = s.rank(
        &pod(Some("c")),
        &[node("slow", "K80"), node("fast", "V100")],
        t,
        1,
    );
    let slow = after
        .entries
        .iter()
        .find(|e| e.node == "slow")
        .expect("ranked");
    assert!(slow.good_rate < before, "{before} -> {}", slow.good_rate);
    assert_eq!(after.best().map(|e| e.node.as_str()), Some("fast"));
}

#[test]
fn gang_mixes_profiles_only_when_much_faster() {
    let s = trained_at_gang_shape(
        4,
        &[
            ("a1", "A100", 50.0),
            ("v1", "V100", 100.0),
            ("v2", "V100", 100.0),
        ],
    );
    // Each node has one 4-device slot. Two members: A100 + V100 is no faster than V100 + V100
    // (the slowest member is a V100 either way), so one profile wins. Three members need all
    // three nodes: mixing is the only option.
    let mut p = gang_pod(4, 2);
    let nodes = vec![node("a1", "A100"), node("v1", "V100"), node("v2", "V100")];
    let g = s.place_gang(&p, &nodes, 5000.0, 1).expect("fits");
    // Mixed (A100 + V100) has the same slowest member as all-V100: one profile wins.
    assert!(g.members.iter().all(|m| m.node.starts_with('v')), "{g:?}");
    p.gang.as_mut().expect("a gang member").size = 3;
    let g = s.place_gang(&p, &nodes, 5000.0, 1).expect("fits");
    let mut used: Vec<&str> = g.members.iter().map(|m| m.node.as_str()).collect();
    used.sort_unstable();
    assert_eq!(used, ["a1", "v1", "v2"]);
    assert!((g.predicted_seconds - 100.0).abs() < 5.0, "{g:?}");
}

#[test]
fn gpu_count_is_part_of_the_prediction() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    let mut t = 0.0;
    for _ in 0..4 {
        t += 1000.0;
        s.observe(&run("v1", "V100", "c", 800.0, t), t)
            .expect("valid");
        let mut r = run("v2", "V100", "c", 120.0, t);
        r.gpus = 8;
        r.profile.count = 8;
        s.observe(&r, t).expect("valid");
    }
    let profile = node("v1", "V100").profile;
    let mut v2 = node("v2", "V100");
    v2.profile.count = 8;
    v2.free_devices = 8;
    let one = s.predict_gpus("c", 1, "v1", &profile, None);
    let eight = s.predict_gpus("c", 8, "v2", &v2.profile, None);
    assert!((one.seconds - 800.0).abs() < 40.0, "{one:?}");
    assert!((eight.seconds - 120.0).abs() < 10.0, "{eight:?}");
    assert_eq!(s.predict("c", "v1", &profile, None).seconds, one.seconds);
    // A shape with no runs borrows the nearest shape's level, scaled and less certain.
    let four = s.predict_gpus("c", 4, "v3", &profile, None);
    assert!(four.seconds > 120.0 && four.seconds < 800.0, "{four:?}");
    assert!(
        four.uncertainty_log_sd > eight.uncertainty_log_sd,
        "{four:?}"
    );
    assert_eq!(four.source, PredictionSource::Transfer);
    // The ranking uses the pod's shape.
    let mut p = pod(Some("c"));
    p.gpus = 8;
    let r = s.rank(&p, &[v2], t, 1);
    let e = r
        .best()
        .and_then(|e| e.prediction.clone())
        .expect("predicted");
    assert!((e.seconds - 120.0).abs() < 10.0, "{e:?}");
}

#[test]
fn cold_start_uses_the_median_class_level() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    let profile = node("v1", "V100").profile;
    // Before any class: the placeholder for the whole run, declared work or not.
    let p = s.predict("new", "v1", &profile, Some(1.0e6));
    assert!((p.seconds - 3600.0).abs() < 1.0, "{p:?}");
    assert_eq!(p.source, PredictionSource::Prior);
    let mut t = 0.0;
    for (class, per_unit) in [("a", 0.1), ("b", 0.2), ("c", 0.4)] {
        for _ in 0..3 {
            t += 1000.0;
            let mut r = run("v1", "V100", class, per_unit * 1000.0, t);
            r.work_units = Some(1000.0);
            s.observe(&r, t).expect("valid");
        }
    }
    // A new class declaring 5,000 units: the median per-unit time (0.2 s), wide, from the prior.
    let p = s.predict("new", "v1", &profile, Some(5000.0));
    assert!(p.seconds > 500.0 && p.seconds < 2000.0, "{p:?}");
    assert!(p.uncertainty_log_sd >= 1.5, "{p:?}");
    assert_eq!(p.source, PredictionSource::Prior);
    // Rankings still follow relative speed.
    let mut pd = pod(Some("new"));
    pd.work_units = Some(5000.0);
    let r = s.rank(&pd, &[node("k", "K80"), node("h", "H100")], t, 1);
    assert_eq!(r.best().map(|e| e.node.as_str()), Some("h"));
    let secs = r
        .best()
        .and_then(|e| e.prediction.clone())
        .expect("p")
        .seconds;
    assert!(secs < 2000.0, "{secs}");
}

#[test]
fn rejections_are_machine_readable() {
    use crate::types::RejectionKind;
    let mut cfg = SchedulerConfig::default();
    cfg.classes.insert(
        "llm".into(),
        crate::config::ClassConfig {
            allowed_vendors: vec![],
            allowed_models: vec!["A100".into(), "V100".into()],
            min_device_memory_bytes: 8 << 30,
            threshold_factor: None,
        },
    );
    let s = Scheduler::new(cfg);
    let mut p = pod(Some("llm"));
    p.gpus = 2;
    let mut full = node("full", "A100");
    full.free_devices = 1;
    let mut small = node("small", "A100");
    small.profile.count = 1;
    small.free_devices = 1;
    let mut sick = node("sick", "A100");
    sick.health = NodeHealth::Unhealthy {
        reason: "xid".into(),
    };
    let mut stale = node("stale", "A100");
    stale.health = NodeHealth::Stale { age_seconds: 600.0 };
    let mut v100 = node("v100", "V100");
    v100.profile.memory_bytes = 4 << 30;
    let nodes = vec![
        full,
        small,
        sick,
        stale,
        node("t4", "T4"),
        v100,
        node("ok", "A100"),
    ];
    let r = s.rank(&p, &nodes, 0.0, 1);
    let kind = |n: &str| r.rejected.iter().find(|x| x.node == n).map(|x| x.kind);
    assert_eq!(kind("full"), Some(RejectionKind::NoRoom));
    assert_eq!(kind("small"), Some(RejectionKind::NoDevices));
    assert_eq!(kind("sick"), Some(RejectionKind::Unhealthy));
    assert_eq!(kind("stale"), Some(RejectionKind::Stale));
    assert_eq!(kind("t4"), Some(RejectionKind::ClassForbidsDevice));
    assert_eq!(kind("v100"), Some(RejectionKind::InsufficientDeviceMemory));
    assert_eq!(kind("ok"), None);
    let permanent: Vec<&str> = r
        .rejected
        .iter()
        .filter(|x| x.kind.is_permanent())
        .map(|x| x.node.as_str())
        .collect();
    assert_eq!(permanent, ["small", "t4", "v100"]);
}

#[test]
fn rejection_kinds_are_listed_once_in_declaration_order() {
    for (i, kind) in RejectionKind::ALL.into_iter().enumerate() {
        assert_eq!(kind as usize, i, "{kind:?}");
    }
    let mut names: Vec<&str> = RejectionKind::ALL.map(RejectionKind::as_str).to_vec();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), RejectionKind::ALL.len());
}

/// The learner publishes a copy of the model after each batch: the copy shares every class's
/// node cells, learning a run afterwards copies only that class's, and the published copy keeps
/// what it had. Stored state reads and writes as before (the shared map is plain JSON).
#[test]
fn a_published_copy_shares_node_cells_until_its_class_learns() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    let mut end = 1.0e6;
    for class in ["a", "b", "c"] {
        for n in 0..4 {
            end += 10.0;
            s.observe(&run(&format!("n{n}"), "V100", class, 300.0, end), end)
                .unwrap();
        }
    }
    let published = s.clone();
    let shared = |a: &Scheduler, b: &Scheduler, class: &str| {
        std::sync::Arc::ptr_eq(&a.state.classes[class].nodes, &b.state.classes[class].nodes)
    };
    assert!(["a", "b", "c"].iter().all(|c| shared(&s, &published, c)));
    end += 10.0;
    s.observe(&run("n9", "V100", "b", 300.0, end), end).unwrap();
    assert!(shared(&s, &published, "a") && shared(&s, &published, "c"));
    assert!(
        !shared(&s, &published, "b"),
        "the class that learned has its own cells"
    );
    assert_eq!(published.state.classes["b"].nodes.len(), 4);
    assert_eq!(s.state.classes["b"].nodes.len(), 5);

    let json = serde_json::to_value(&s.state).unwrap();
    assert!(json["classes"]["b"]["nodes"]["n9"].is_object(), "{json}");
    let back: ModelState = serde_json::from_value(json).unwrap();
    assert_eq!(back, s.state);
}
