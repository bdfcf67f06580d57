//! End-to-end checks of the simulator itself: invariants every policy must keep, and the
//! comparisons the benchmark's conclusions rest on.

use crate::common;

use common::{args, settings};
use kudos_sim::cli::Settings;
use kudos_sim::simulate_run;

/// GPUs are conserved: no node ever holds more than it has, every placeable job runs to the
/// end, no job starts before it arrives, and the cluster is empty again at the end.
#[test]
fn invariants_hold_for_every_policy() {
    // Multi-GPU B0 on 4-GPU nodes exercises gangs (8-GPU jobs) and fragmentation.
    let s = settings(&[
        "--workload",
        "b0",
        "--multi-gpu",
        "--jobs",
        "600",
        "--rate",
        "6",
    ]);
    for policy in kudos_sim::policy::POLICY_NAMES {
        let (jobs, result) = simulate_run(&s, 6.0, 3, policy, &mut || {}).unwrap();
        assert_eq!(result.records.len(), jobs.len());
        let mut events: Vec<(f64, i64, usize)> = Vec::new();
        for (job, rec) in jobs.iter().zip(&result.records) {
            let rec = rec
                .as_ref()
                .unwrap_or_else(|| panic!("{policy}: job {} never ran", job.id));
            assert!(
                rec.start >= job.arrival,
                "{policy}: job {} started before it arrived",
                job.id
            );
            assert!(rec.end > rec.start);
            assert_eq!(rec.slots.iter().map(|s| s.1).sum::<u32>(), job.gpus);
            if rec.slots.len() > 1 {
                assert!(
                    job.gpus > s.cluster.max_node_gpus,
                    "{policy}: a job that fits one node was split"
                );
            }
            for &(node, gpus) in &rec.slots {
                events.push((rec.start, i64::from(gpus), node));
                events.push((rec.end, -i64::from(gpus), node));
            }
        }
        // Releases before allocations at equal times, as the event loop does.
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut used = vec![0i64; s.cluster.nodes.len()];
        for (_, delta, node) in events {
            used[node] += delta;
            assert!(used[node] >= 0);
            assert!(
                used[node] <= i64::from(s.cluster.nodes[node].total),
                "{policy}: node {node} over-allocated"
            );
        }
        assert!(used.iter().all(|u| *u == 0));
        assert_eq!(result.final_cluster.free_gpus(), s.cluster.total_gpus());
        assert!(
            result.stranded.is_empty(),
            "{policy}: {:?} never placed",
            result.stranded
        );
    }
}

/// On a single GPU type there is nothing to learn: Kudos must match kube-default up to the
/// noise of tie-breaking.
#[test]
fn single_type_cluster_gives_kudos_equal_to_kube_default() {
    let s = settings(&["--cluster", "v100=27x4", "--jobs", "1500", "--rate", "0.2"]);
    let jct = |p: &str| {
        kudos_sim::run_one(&s, 0.2, 0, p, &mut || {})
            .unwrap()
            .avg_jct_h
    };
    let (kube, kudos) = (jct("kube-default"), jct("kudos"));
    let ratio = kudos / kube;
    assert!(
        (0.95..=1.05).contains(&ratio),
        "kudos {kudos:.2} h vs kube-default {kube:.2} h"
    );
}

/// With everything at its defaults (the embedded B1 comparison), the oracle beats kube-default
/// and random, and Kudos beats kube-default.
#[test]
fn default_b1_oracle_beats_kube_default_and_random() {
    let s = settings(&[]);
    let rate = s.rates[0];
    let jct = |p: &str| {
        kudos_sim::run_one(&s, rate, 0, p, &mut || {})
            .unwrap()
            .avg_jct_h
    };
    let (kube, random, oracle, kudos) = (
        jct("kube-default"),
        jct("random"),
        jct("oracle"),
        jct("kudos"),
    );
    assert!(
        oracle < kube,
        "oracle {oracle:.1} h vs kube-default {kube:.1} h"
    );
    assert!(
        oracle < random,
        "oracle {oracle:.1} h vs random {random:.1} h"
    );
    assert!(
        kudos < kube,
        "kudos {kudos:.1} h vs kube-default {kube:.1} h"
    );
}

/// The same seed gives the same numbers.
#[test]
fn runs_are_deterministic() {
    let s = settings(&["--jobs", "300"]);
    let a = kudos_sim::run_one(&s, 0.3, 5, "kudos", &mut || {}).unwrap();
    let b = kudos_sim::run_one(&s, 0.3, 5, "kudos", &mut || {}).unwrap();
    assert_eq!(a, b);
}

/// `--kudos-config` takes scheduler-core's own JSON configuration and names the file on error.
#[test]
fn kudos_config_is_scheduler_core_json() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.json");
    std::fs::write(&good, r#"{"threshold_factor": 1.1}"#).unwrap();
    let s = settings(&["--kudos-config", good.to_str().unwrap(), "--jobs", "200"]);
    assert_eq!(s.kudos.config.threshold_factor, 1.1);
    kudos_sim::run_one(&s, 0.3, 0, "kudos", &mut || {}).unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"threshold": 1.1}"#).unwrap();
    let e = Settings::from_args(&args(&["--kudos-config", bad.to_str().unwrap()])).unwrap_err();
    assert!(format!("{e:#}").contains("bad.json"), "{e:#}");
}

/// Unknown GPU types in a cluster shape or preference list are rejected up front.
#[test]
fn unknown_names_fail_before_simulating() {
    for argv in [
        vec!["kudos-sim", "--cluster", "a100=2x8"],
        vec!["kudos-sim", "--prefer", "v100,h100"],
        vec!["kudos-sim", "--policies", "kube-default,best"],
        vec!["kudos-sim", "--workload", "b2"],
    ] {
        assert!(Settings::from_args(&args(&argv[1..])).is_err(), "{argv:?}");
    }
}

/// Any table in the Gavel layout works, with free-form GPU names and no K80/P100/V100.
#[test]
fn free_form_throughput_table_drives_every_policy() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t.csv");
    std::fs::write(
        &table,
        "job_type,model,batch_size,scale_factor,Gaudi 2_steps_per_s,mi250x_steps_per_s,mi250x_unconsolidated_steps_per_s\n\
         Net (batch size 8),Net,8,1,4.0,1.0,1.0\n\
         Net (batch size 8),Net,8,2,7.0,1.8,1.2\n\
         Other,Other,,1,1.0,3.0,3.0\n",
    )
    .unwrap();
    let s = settings(&[
        "--throughputs",
        table.to_str().unwrap(),
        "--workload",
        "b0",
        "--multi-gpu",
        "--cluster",
        "per-type:4x1",
        "--jobs",
        "300",
    ]);
    assert_eq!(s.table.gpu_types, vec!["Gaudi 2", "mi250x"]);
    // No v100 column: durations are converted to steps on the first GPU type.
    assert_eq!(s.workload.reference_gpu, 0);
    let jct = |p: &str| kudos_sim::run_one(&s, 2.0, 0, p, &mut || {}).unwrap();
    for p in kudos_sim::policy::POLICY_NAMES {
        let m = jct(p);
        assert_eq!(m.stranded, 0, "{p}");
        assert!(m.avg_jct_h > 0.0, "{p}");
    }
    // The oracle puts every job on its faster type when it can: most of the time at this load.
    assert!(jct("oracle").fastest_share > jct("random").fastest_share);
}
