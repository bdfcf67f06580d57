//! Exploration with a guarantee: whatever the spec-sheet prior says, every GPU type that could be
//! fastest for a class gets tried, and Kudos recovers. Run on both throughput tables: Gavel's
//! (K80/P100/V100, measured) and the spec-modelled one (T4/A10/A100/H100/L40S, where two
//! families are fastest on the L40S, which the prior rates below the H100).

use crate::common;

use common::{jct, settings};
use kudos_sim::cli::Settings;

/// A prior scrambled so that the slowest types look fastest and the fastest look slowest: on
/// Gavel's table the K80 3x / V100 0.33x; on the spec table the built-in prior's speeds
/// handed out in reverse order (the T4 gets the H100's 3.98, the H100 the T4's 0.43).
fn scrambled(table: &str) -> Vec<(&'static str, f64)> {
    if table == "builtin:gavel" {
        vec![("k80", 3.0), ("p100", 1.0), ("v100", 0.33)]
    } else {
        vec![
            ("t4", 3.98),
            ("a10", 2.37),
            ("a100", 1.68),
            ("l40s", 1.15),
            ("h100", 0.43),
        ]
    }
}

fn light_load(table: &str, extra: &[&str]) -> Settings {
    let mut argv = vec!["--throughputs", table, "--workload", "b0", "--jobs", "2000"];
    argv.extend_from_slice(extra);
    let mut s = settings(&argv);
    s.kudos.config.capability_overrides = scrambled(table)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    s
}

/// With the prior scrambled, Kudos is within 1.10x of the greedy oracle over jobs 1000-1999 at
/// light load (1 job/h on 108 GPUs): it found the fast types within the first 1,000 jobs.
#[test]
fn scrambled_prior_recovers_within_1000_jobs() {
    for table in ["builtin:gavel", "builtin:spec"] {
        let s = light_load(table, &["--window", "1000:2000"]);
        for seed in [0, 1] {
            let (kudos, oracle) = (
                jct(&s, 1.0, seed, "kudos"),
                jct(&s, 1.0, seed, "greedy-oracle"),
            );
            let share = kudos_sim::run_one(&s, 1.0, seed, "kudos", &mut || {})
                .expect("simulates")
                .fastest_share;
            // Spec table: each family has one fastest type, two of them the L40S that the
            // prior (and the scramble) rate low; Kudos must have found every one.
            if table == "builtin:spec" {
                assert!(
                    share >= 0.95,
                    "{table} seed {seed}: {share:.2} on the fastest type"
                );
            }
            assert!(
                kudos / oracle <= 1.10,
                "{table} seed {seed}: kudos {kudos:.2} h vs greedy oracle {oracle:.2} h ({:.2}x)",
                kudos / oracle
            );
        }
    }
}

/// With the prior scrambled, Kudos is never worse than the static fastest-type preference
/// (which is given the right order), from light load to saturation.
#[test]
fn scrambled_prior_never_worse_than_fastest_type() {
    for (table, rates) in [
        ("builtin:gavel", [1.0, 4.0, 6.0]),
        ("builtin:spec", [1.0, 20.0, 60.0]),
    ] {
        let s = light_load(table, &[]);
        for rate in rates {
            let (kudos, fastest) = (jct(&s, rate, 0, "kudos"), jct(&s, rate, 0, "fastest-type"));
            assert!(
                kudos <= fastest * 1.02,
                "{table} at {rate}/h: kudos {kudos:.2} h vs fastest-type {fastest:.2} h"
            );
        }
    }
}
