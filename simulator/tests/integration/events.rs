//! Learning under change: mid-run events (a node slows down, a new GPU type joins) and learned
//! state carried from one run to the next.

use crate::common;

use common::settings;
use kudos_sim::sim::JobRecord;
use kudos_sim::simulate_run;

/// Runs (start-ordered) that started at or after `t` and used node `node`.
fn runs_on(records: &[&JobRecord], node: usize) -> Vec<f64> {
    records
        .iter()
        .filter(|r| r.slots.iter().any(|s| s.0 == node))
        .map(|r| r.start)
        .collect()
}

/// One V100 node's GPUs slow down 3x (thermal throttling, a failing card). Its own runs earn it
/// bad reviews and a slower prediction, so within 20 of its runs after the slowdown Kudos stops
/// sending it work it can run faster elsewhere.
#[test]
fn per_node_reviews_move_work_off_a_degraded_node() {
    let event_h = 1000.0;
    let s = settings(&[
        "--workload",
        "b0",
        "--jobs",
        "1500",
        "--rate",
        "0.3",
        "--cluster",
        "v100=6x1,p100=6x1,k80=6x1",
        "--event",
        &format!("slow:v100-000@{event_h}:3"),
    ]);
    let bad = s
        .cluster
        .nodes
        .iter()
        .position(|n| n.name == "v100-000")
        .expect("node exists");
    let healthy: Vec<usize> = (0..s.cluster.nodes.len())
        .filter(|&i| i != bad && s.cluster.nodes[i].name.starts_with("v100"))
        .collect();
    for seed in [0, 1] {
        let (_, result) = simulate_run(&s, 0.3, seed, "kudos", &mut || {}).expect("simulates");
        let mut after: Vec<&JobRecord> = result
            .records
            .iter()
            .flatten()
            .filter(|r| r.start >= event_h * 3600.0)
            .collect();
        after.sort_by(|a, b| a.start.total_cmp(&b.start));
        let bad_runs = runs_on(&after, bad);
        // From its 20th run after the slowdown on (or from the slowdown if it had fewer).
        let cut = bad_runs.get(19).copied().unwrap_or(event_h * 3600.0);
        let later: Vec<&JobRecord> = after.iter().copied().filter(|r| r.start > cut).collect();
        let bad_later = runs_on(&later, bad).len() as f64;
        let healthy_later = healthy
            .iter()
            .map(|&i| runs_on(&later, i).len() as f64)
            .sum::<f64>()
            / healthy.len() as f64;
        println!(
            "seed {seed}: {} runs on the degraded node after the slowdown; after its 20th: {bad_later} vs {healthy_later:.1} per healthy V100",
            bad_runs.len()
        );
        assert!(healthy_later >= 20.0, "too few jobs after the cut to judge");
        assert!(
            bad_later <= 0.25 * healthy_later,
            "seed {seed}: the degraded node still ran {bad_later} jobs vs {healthy_later:.1} per healthy V100"
        );
    }
}

/// A GPU type joins mid-run, and the prior rates it the slowest (V100 at 0.2x, below the K80):
/// Kudos must try it, find it fastest, and move most work there.
#[test]
fn a_new_gpu_type_gets_explored() {
    let join_h = 300.0;
    let mut s = settings(&[
        "--workload",
        "b0",
        "--jobs",
        "1200",
        "--rate",
        "0.3",
        "--cluster",
        "k80=6x1,p100=6x1",
        "--event",
        &format!("join:v100=6x1@{join_h}"),
    ]);
    s.kudos
        .config
        .capability_overrides
        .insert("v100".to_owned(), 0.2);
    let v100 = s.table.gpu_index("v100").expect("in the table");
    for seed in [0, 1] {
        let share = |policy: &str| {
            let (_, result) = simulate_run(&s, 0.3, seed, policy, &mut || {}).expect("simulates");
            let after: Vec<&JobRecord> = result
                .records
                .iter()
                .flatten()
                .filter(|r| r.start >= join_h * 3600.0)
                .collect();
            let on_new = after
                .iter()
                .filter(|r| r.slots.iter().all(|s| s_type(&result, s.0) == v100))
                .count();
            (on_new, after.len())
        };
        let (kudos, n) = share("kudos");
        let (oracle, _) = share("greedy-oracle");
        println!(
            "seed {seed}: after the join, {kudos} of {n} jobs on the new type (greedy oracle {oracle})"
        );
        assert!(
            kudos as f64 >= 0.8 * oracle as f64,
            "seed {seed}: {kudos} jobs on the new type vs the greedy oracle's {oracle}"
        );
    }
}

fn s_type(result: &kudos_sim::sim::SimResult, node: usize) -> usize {
    result.final_cluster.nodes[node].gpu_type
}

/// Learned state carries over: a second run started from the first run's state predicts
/// better from its first jobs than one started empty (classes are job types here, so a cold
/// start has 26 classes to learn and a warm one has them).
#[test]
fn state_out_then_in_starts_warm() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state.json");
    let path = state.to_str().expect("utf-8 path");
    let flags = [
        "--jobs",
        "600",
        "--class-by-job-type",
        "--policies",
        "kudos",
    ];
    let first = settings(&[&flags[..], &["--state-out", path]].concat());
    let cold = kudos_sim::run_one(&first, 0.3, 0, "kudos", &mut || {}).expect("simulates");
    assert!(state.is_file(), "--state-out wrote nothing");
    let second = settings(&[&flags[..], &["--state-in", path]].concat());
    let warm = kudos_sim::run_one(&second, 0.3, 1, "kudos", &mut || {}).expect("simulates");
    let cold2 = kudos_sim::run_one(&first, 0.3, 1, "kudos", &mut || {}).expect("simulates");
    let first_tenth = |m: &kudos_sim::metrics::Metrics| m.mape_over_time.first().copied();
    println!(
        "first-tenth MAPE: empty start {:?} (seed 0), {:?} (seed 1); from saved state {:?}",
        first_tenth(&cold),
        first_tenth(&cold2),
        first_tenth(&warm)
    );
    assert!(first_tenth(&warm) < first_tenth(&cold2));
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"classes\": 3}").expect("writes");
    let e = kudos_sim::cli::Settings::from_args(&common::args(&[
        "--state-in",
        bad.to_str().expect("utf-8 path"),
    ]))
    .expect_err("not a state file");
    assert!(format!("{e:#}").contains("--state-in"), "{e:#}");
}
