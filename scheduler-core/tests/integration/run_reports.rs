//! Feedback keyed by run: snapshots replace each other, the final report replaces them all, the
//! units are consistent, and per-unit speed is learned from progress without a declared total.

use kudos_scheduler_core::{
    DeviceProfile, ObserveError, RunObservation, Scheduler, SchedulerConfig,
};

fn profile(model: &str) -> DeviceProfile {
    DeviceProfile {
        vendor: "nvidia".into(),
        model: model.into(),
        count: 1,
        memory_bytes: 16 << 30,
    }
}

/// A report of a run that started at `start` and had done `work` units by `end`.
fn report(node: &str, start: f64, end: f64, work: f64, completed: bool) -> RunObservation {
    RunObservation {
        node: node.into(),
        class: "resnet".into(),
        profile: profile("V100"),
        gpus: 1,
        start,
        end,
        completed,
        progress: None,
        gpu_busy_seconds: None,
        work_units: Some(work),
    }
}

fn per_unit(s: &Scheduler, node: &str) -> f64 {
    s.predict("resnet", node, &profile("V100"), Some(1.0))
        .seconds
}

/// A ten-hour run at 2 s per step, reported every ten minutes and at the end, is one run, and
/// the model learns 2 s per step from the first snapshot on, with no declared total.
#[test]
fn snapshots_of_one_run_count_once_and_learn_per_unit_time() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    let start = 1000.0;
    for k in 1..=60 {
        let t = start + 600.0 * f64::from(k);
        let done = (t - start) / 2.0;
        let fb = s
            .observe_run("pod-a", &report("n1", start, t, done, k == 60), t)
            .expect("valid snapshot");
        assert!(
            (per_unit(&s, "n1") - 2.0).abs() < 1e-6,
            "after snapshot {k}"
        );
        assert_eq!(s.state().node_runs("resnet", "n1"), 1, "snapshot {k}");
        if k == 60 {
            assert_eq!(fb.actual_seconds, 36_000.0);
        }
    }
    // Reviews come from one run, not sixty, and the model counts one run learned.
    assert_eq!(s.state().tracked_runs(), 1);
    assert_eq!(s.state().runs(), 1);
}

/// The old failure: work done so far was read as the whole run's work and the time also
/// extrapolated by progress, so per-unit time came out 1/progress too slow. With both given,
/// work units win and nothing is extrapolated twice.
#[test]
fn work_so_far_and_progress_are_not_double_extrapolated() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    let mut r = report("n1", 0.0, 100.0, 50.0, false);
    r.progress = Some(0.25);
    let fb = s.observe_run("pod-b", &r, 100.0).expect("valid");
    assert_eq!(fb.actual_seconds, 400.0, "whole run extrapolated once");
    assert!((per_unit(&s, "n1") - 2.0).abs() < 1e-6);
}

/// A snapshot older than the one held, or any snapshot after the final report, is stale and
/// leaves the model untouched.
#[test]
fn stale_snapshots_are_rejected() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.observe_run("pod-c", &report("n1", 0.0, 200.0, 100.0, false), 200.0)
        .expect("valid");
    let before = s.state().clone();
    let old = s.observe_run("pod-c", &report("n1", 0.0, 100.0, 10.0, false), 210.0);
    assert!(
        matches!(old, Err(ObserveError::Stale { held: "newer", .. })),
        "{old:?}"
    );
    assert_eq!(s.state(), &before);
    s.observe_run("pod-c", &report("n1", 0.0, 400.0, 200.0, true), 400.0)
        .expect("final");
    let late = s.observe_run("pod-c", &report("n1", 0.0, 500.0, 250.0, false), 500.0);
    assert!(
        matches!(late, Err(ObserveError::Stale { held: "final", .. })),
        "{late:?}"
    );
    assert_eq!(s.state().node_runs("resnet", "n1"), 1);
}

/// Different runs are different observations; unkeyed reports each count as a run.
#[test]
fn distinct_runs_accumulate() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    for (i, key) in ["r1", "r2", "r3"].iter().enumerate() {
        let t = 1000.0 * (i as f64 + 1.0);
        s.observe_run(key, &report("n1", t - 100.0, t, 50.0, true), t)
            .expect("valid");
    }
    s.observe(&report("n1", 4000.0, 4100.0, 50.0, true), 4100.0)
        .expect("valid");
    assert_eq!(s.state().node_runs("resnet", "n1"), 4);
}

/// The ledger of keyed runs is bounded; a run forgotten while in progress is withdrawn, so it
/// does not linger as a provisional observation nobody can replace.
#[test]
fn tracked_runs_are_bounded_and_evicted_snapshots_withdrawn() {
    let config = SchedulerConfig {
        max_tracked_runs: 3,
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::try_new(config).expect("valid config");
    for i in 0..10 {
        let t = 100.0 * (f64::from(i) + 1.0);
        s.observe_run(
            &format!("pod-{i}"),
            &report("n1", t - 50.0, t, 25.0, false),
            t,
        )
        .expect("valid");
        assert!(s.state().tracked_runs() <= 3);
    }
    assert_eq!(s.state().tracked_runs(), 3);
    assert_eq!(s.state().node_runs("resnet", "n1"), 3);
}

/// Without work units an in-progress report must say how far it is; with them it need not.
#[test]
fn in_progress_needs_progress_or_work() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    let mut r = report("n1", 0.0, 100.0, 50.0, false);
    r.work_units = None;
    assert_eq!(
        s.observe_run("pod-d", &r, 100.0),
        Err(ObserveError::MissingProgress)
    );
    r.work_units = Some(50.0);
    assert!(s.observe_run("pod-d", &r, 100.0).is_ok());
}

/// (class, node) cells are the model's largest part: beyond `max_node_cells` the least
/// recently observed go, an eighth at a time, and the recent ones keep their history.
#[test]
fn node_cells_stay_bounded_and_the_recent_ones_are_kept() {
    let mut s = Scheduler::new(SchedulerConfig {
        max_node_cells: 64,
        ..SchedulerConfig::default()
    });
    // 3 classes × 100 nodes, node by node: 300 cells offered, time increasing.
    let mut end = 1000.0;
    for node in 0..100 {
        for class in ["a", "b", "c"] {
            end += 10.0;
            let r = RunObservation {
                class: class.into(),
                ..report(&format!("n{node}"), end - 100.0, end, 50.0, true)
            };
            s.observe(&r, end).expect("observe");
            assert!(s.state().node_cells() <= 64, "{}", s.state().node_cells());
        }
    }
    assert!(s.state().node_cells() >= 56, "evicts an eighth, not all");
    for class in ["a", "b", "c"] {
        assert_eq!(s.state().node_runs(class, "n99"), 1, "the newest are kept");
        assert_eq!(s.state().node_runs(class, "n0"), 0, "the oldest are gone");
    }
    // The classes and what they learned per profile stay.
    let mut classes: Vec<&str> = s.state().classes().collect();
    classes.sort_unstable();
    assert_eq!(classes, ["a", "b", "c"]);
    let bad = SchedulerConfig {
        max_node_cells: 0,
        ..SchedulerConfig::default()
    };
    assert!(bad.validate().is_err());
}

/// Class names are user input: at `max_classes` a new class replaces the least recently
/// observed one, so the model's size does not follow the number of labels ever used.
#[test]
fn the_least_recently_seen_class_makes_room_for_a_new_one() {
    let mut s = Scheduler::new(SchedulerConfig {
        max_classes: 3,
        ..SchedulerConfig::default()
    });
    let run = |class: &str, end: f64| RunObservation {
        class: class.into(),
        ..report("n1", end - 100.0, end, 50.0, true)
    };
    for (i, c) in ["a", "b", "c"].iter().enumerate() {
        s.observe(&run(c, 1000.0 * (i as f64 + 1.0)), 5000.0)
            .expect("observe");
    }
    // a is seen again, so b is now the least recently seen.
    s.observe(&run("a", 4000.0), 5000.0).expect("observe");
    s.observe(&run("d", 5000.0), 5000.0).expect("observe");
    let mut classes: Vec<&str> = s.state().classes().collect();
    classes.sort_unstable();
    assert_eq!(classes, ["a", "c", "d"]);
    assert_eq!(s.state().node_runs("b", "n1"), 0);
    assert_eq!(s.state().node_runs("a", "n1"), 2);
    // Survives a snapshot.
    let json = serde_json::to_string(s.state()).expect("serialise");
    assert!(json.contains("last_seen"), "{json}");
    let bad = SchedulerConfig {
        max_classes: 0,
        ..SchedulerConfig::default()
    };
    assert!(bad.validate().is_err());
}
