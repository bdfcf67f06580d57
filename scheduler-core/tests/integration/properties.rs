//! Property tests of the ranking: bounded scores, input-order independence, determinism per
//! seed, monotonicity in reviews, and merge weights that reproduce either queue.

use kudos_scheduler_core::queue::{self, Candidate};
use kudos_scheduler_core::{
    DeviceProfile, Exploration, MergeWeights, NodeHealth, NodeState, PodSpec, Scheduler,
    SchedulerConfig,
};
use proptest::prelude::*;

use crate::common;
use common::completed_run;

const MODELS: &[&str] = &["K80", "P100", "V100", "A100", "G1", "T4"];

fn profile(model: usize) -> DeviceProfile {
    DeviceProfile {
        vendor: "nvidia".into(),
        model: MODELS[model % MODELS.len()].into(),
        count: 4,
        memory_bytes: 16 << 30,
    }
}

#[derive(Clone, Debug)]
struct NodeGen {
    model: usize,
    free: u32,
    cpu_used: u64,
    mem_used: u64,
    healthy: bool,
}

fn node_gen() -> impl Strategy<Value = NodeGen> {
    (
        0..MODELS.len(),
        0u32..=4,
        0u64..32_000,
        0u64..(128u64 << 30),
        prop::bool::weighted(0.9),
    )
        .prop_map(|(model, free, cpu_used, mem_used, healthy)| NodeGen {
            model,
            free,
            cpu_used,
            mem_used,
            healthy,
        })
}

fn build(gens: &[NodeGen]) -> Vec<NodeState> {
    gens.iter()
        .enumerate()
        .map(|(i, g)| NodeState {
            name: format!("node-{i:03}").into(),
            profile: profile(g.model),
            free_devices: g.free,
            cpu_allocatable_milli: 32_000,
            cpu_requested_milli: g.cpu_used,
            memory_allocatable_bytes: 128 << 30,
            memory_requested_bytes: g.mem_used,
            health: if g.healthy {
                NodeHealth::Healthy
            } else {
                NodeHealth::Stale { age_seconds: 100.0 }
            },
        })
        .collect()
}

fn pod(class: bool) -> PodSpec {
    PodSpec {
        namespace: "ns".into(),
        name: "p".into(),
        class: class.then(|| "c".into()),
        gpus: 1,
        cpu_milli: 500,
        memory_bytes: 1 << 30,
        ..Default::default()
    }
}

/// A scheduler with some history: runs of class `c` on the first nodes.
fn trained(config: SchedulerConfig, nodes: &[NodeState], runs: &[(usize, f64)]) -> Scheduler {
    let mut s = Scheduler::new(config);
    let mut t = 0.0;
    for &(i, secs) in runs {
        let Some(n) = nodes.get(i % nodes.len().max(1)) else {
            continue;
        };
        t += 100.0;
        s.observe(&completed_run(n, "c", t - secs, t), t)
            .expect("valid run");
    }
    s
}

fn config(exploration: Exploration) -> SchedulerConfig {
    SchedulerConfig {
        exploration,
        ..SchedulerConfig::default()
    }
}

fn exploration() -> impl Strategy<Value = Exploration> {
    prop_oneof![
        Just(Exploration::None),
        Just(Exploration::Thompson),
        (0.0f64..3.0).prop_map(|c| Exploration::Ucb { c }),
    ]
}

fn candidates_gen() -> impl Strategy<Value = Vec<(u8, f64, f64, f64)>> {
    prop::collection::vec((0u8..=10, 0.0f64..1.0, -5.0f64..5.0, 0.0f64..200.0), 1..60)
}

proptest! {
    // Failing cases are printed with their minimal input; nothing is written into the tree.
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn merge_with_a_zero_weight_is_the_other_queue(raw in candidates_gen(), w in 0.1f64..10.0) {
        let names: Vec<String> = (0..raw.len()).map(|i| format!("n{:03}", (i * 37) % 101)).collect();
        let c: Vec<Candidate<'_>> = raw.iter().zip(&names).map(|(&(score, rate, log_time, d), name)| Candidate {
            name,
            score,
            // Coarse values force ties, so tie-breaks are exercised.
            rate: (rate * 4.0).round() / 4.0,
            log_time: log_time.round(),
            default_score: d.round(),
        }).collect();
        let order = queue::name_keys(&c);
        let first = queue::first_queue(&c, &order);
        let second = queue::second_queue(&c, &order);
        let only_kudos = queue::merge(&c, &first, &MergeWeights { kudos: w, default_plugins: 0.0 });
        let only_default = queue::merge(&c, &second, &MergeWeights { kudos: 0.0, default_plugins: w });
        prop_assert_eq!(only_kudos.iter().map(|x| x.0).collect::<Vec<_>>(), first.clone());
        prop_assert_eq!(only_default.iter().map(|x| x.0).collect::<Vec<_>>(), second.clone());
        // The one-sort recommended queue used by `rank` is the same merge.
        for weights in [
            MergeWeights { kudos: w, default_plugins: 0.0 },
            MergeWeights { kudos: 0.0, default_plugins: w },
            MergeWeights { kudos: 5.0, default_plugins: w },
        ] {
            let tie = if weights.kudos > 0.0 { &first } else { &second };
            prop_assert_eq!(queue::recommended(&c, &order, &weights), queue::merge(&c, tie, &weights));
        }
    }

    #[test]
    fn scores_in_range_and_ranks_consecutive(
        gens in prop::collection::vec(node_gen(), 1..40),
        runs in prop::collection::vec((0usize..40, 1.0f64..5000.0), 0..30),
        ex in exploration(),
        seed in any::<u64>(),
        class in any::<bool>(),
    ) {
        let nodes = build(&gens);
        let s = trained(config(ex), &nodes, &runs);
        let r = s.rank(&pod(class), &nodes, 10_000.0, seed);
        prop_assert_eq!(r.entries.len() + r.rejected.len(), nodes.len());
        for (i, e) in r.entries.iter().enumerate() {
            prop_assert!(e.score <= 10);
            prop_assert!((0.0..=1.0).contains(&e.good_rate));
            prop_assert!((0.0..=200.0).contains(&e.default_score));
            prop_assert_eq!(e.rank, i + 1);
        }
        let table = r.to_table();
        prop_assert_eq!(table.lines().count(), 2 + nodes.len());
    }

    #[test]
    fn ranking_independent_of_input_order_and_deterministic(
        gens in prop::collection::vec(node_gen(), 1..40),
        runs in prop::collection::vec((0usize..40, 1.0f64..5000.0), 0..30),
        ex in exploration(),
        seed in any::<u64>(),
        rotate in 0usize..40,
    ) {
        let nodes = build(&gens);
        let s = trained(config(ex), &nodes, &runs);
        let a = s.rank(&pod(true), &nodes, 10_000.0, seed);
        let again = s.rank(&pod(true), &nodes, 10_000.0, seed);
        prop_assert_eq!(&a, &again);
        let mut shuffled = nodes.clone();
        shuffled.reverse();
        let k = rotate % shuffled.len();
        shuffled.rotate_left(k);
        let mut b = s.rank(&pod(true), &shuffled, 10_000.0, seed);
        // Each entry points back at its node in the input it was given.
        for (r, input) in [(&a, &nodes), (&b, &shuffled)] {
            for e in &r.entries {
                prop_assert_eq!(&input[e.candidate].name, &e.node);
            }
        }
        // Apart from those positions, the order of the input changes nothing.
        for (x, y) in b.entries.iter_mut().zip(&a.entries) {
            x.candidate = y.candidate;
        }
        prop_assert_eq!(&a, &b);
    }

    #[test]
    fn good_reviews_never_rank_below_bad_ones_on_same_evidence(
        reviews in 1usize..12,
        ex in prop_oneof![Just(Exploration::None), (0.0f64..3.0).prop_map(|c| Exploration::Ucb { c })],
        swap in any::<bool>(),
        seed in any::<u64>(),
    ) {
        // Two identical nodes of one profile; a third, fast node sets the class reference so the
        // slow runs are bad and the fast-enough ones good. Same number and ages of runs.
        let idle = || NodeGen { model: 2, free: 4, cpu_used: 0, mem_used: 0, healthy: true };
        let (good_name, bad_name) = if swap { ("a-good", "b-bad") } else { ("b-good", "a-bad") };
        let mut nodes = build(&[idle(), idle()]);
        nodes[0].name = good_name.into();
        nodes[1].name = bad_name.into();
        let mut s = Scheduler::new(config(ex));
        let mut t = 0.0;
        for _ in 0..reviews {
            for (node, secs) in [(&nodes[0], 100.0), (&nodes[1], 200.0)] {
                t += 10.0;
                s.observe(&completed_run(node, "c", t - secs, t), t).expect("valid");
            }
        }
        let r = s.rank(&pod(true), &nodes, t, seed);
        let pos = |n: &str| r.entries.iter().position(|e| e.node == n);
        prop_assert!(pos(good_name) < pos(bad_name), "{}", r.to_table());
        let g = &r.entries[pos(good_name).unwrap_or(0)];
        let b = &r.entries[pos(bad_name).unwrap_or(0)];
        prop_assert!(g.score >= b.score && g.good_rate >= b.good_rate);
    }

    #[test]
    fn zero_weight_reproduces_the_other_queue(
        gens in prop::collection::vec(node_gen(), 1..40),
        runs in prop::collection::vec((0usize..40, 1.0f64..5000.0), 0..30),
        seed in any::<u64>(),
    ) {
        let nodes = build(&gens);
        for (kudos, default_plugins) in [(0.0, 1.0), (5.0, 0.0)] {
            let mut cfg = config(Exploration::Thompson);
            cfg.merge_weights = MergeWeights { kudos, default_plugins };
            let s = trained(cfg, &nodes, &runs);
            let r = s.rank(&pod(true), &nodes, 10_000.0, seed);
            let cands: Vec<Candidate<'_>> = r.entries.iter().map(|e| Candidate {
                name: &e.node,
                score: e.score,
                rate: 0.0,
                log_time: 0.0,
                default_score: e.default_score,
            }).collect();
            let names = queue::name_keys(&cands);
            let merged: Vec<&str> = r.entries.iter().map(|e| e.node.as_str()).collect();
            if kudos == 0.0 {
                let second: Vec<&str> = queue::second_queue(&cands, &names)
                    .into_iter().map(|i| cands[i as usize].name).collect();
                prop_assert_eq!(merged, second);
            } else {
                // The first queue orders by score first: the merged queue must be score-sorted
                // and, within equal scores, keep the first queue's tie-breaks (rate, time, name).
                let scores: Vec<u8> = r.entries.iter().map(|e| e.score).collect();
                let mut sorted = scores.clone();
                sorted.sort_unstable_by(|a, b| b.cmp(a));
                prop_assert_eq!(scores, sorted);
                let with_zero_default = r.entries.iter().all(|e| e.merged_score == 5.0 * 10.0 * f64::from(e.score));
                prop_assert!(with_zero_default);
            }
        }
    }
}
