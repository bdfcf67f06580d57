//! The step functions composed by [`super::rank`] give the ranking that design §2.2's steps define
//! node by node, on a fixed cluster: with and without history, a forbidden profile, unfit nodes,
//! every exploration rule, both one-sided merge weights, deadlines, declared work and GPU counts.

use super::*;
use crate::config::MergeWeights;
use crate::nodeset::{check_devices, check_node_kind};
use crate::predict::{predict_node, predict_profile_for};
use crate::queue::{self, Candidate};
use crate::review::{good_probability, threshold};
use crate::score::{decay, explored_log_time, good_rate, to_score};
use crate::tests::{node, pod, run};
use crate::types::{NodeHealth, Prediction, RankEntry, Ranking, Review};
use crate::{Name, Scheduler};

/// Steps 1 to 5 for each node on its own, from their definitions: no per-profile sharing, no
/// scratch, and the merge as the two queues' sorts followed by [`queue::merge`].
fn reference(s: &Scheduler, pod: &PodSpec, nodes: &[NodeState], now: f64, seed: u64) -> Ranking {
    let (config, state) = (s.config(), s.state());
    let class = pod.class.as_deref();
    let lookup = class.map(|c| state.class_for(c, pod.gpus));
    let ln_work = work_scale(pod.work_units).ln();
    let mut rejected = Vec::new();
    let mut fit = Vec::new();
    for node in nodes {
        let class_rules = class.map(|c| (c, config.classes.get(c)));
        let allowed = check_node_kind(node, pod)
            .and_then(|()| check_devices(pod, class_rules, config, state, &node.profile));
        if let Err((kind, reason)) = allowed {
            let name = node.name.clone();
            rejected.push(Rejection {
                node: name,
                reason,
                kind,
            });
            continue;
        }
        let key = node.profile.key();
        let own = lookup
            .and_then(|l| l.own)
            .and_then(|c| c.nodes.get(node.name.as_str()))
            .filter(|c| c.window.est.n > 0.0 && c.profile_key == key);
        let pred = lookup.map(|l| {
            let p = predict_profile_for(state, config, l, &node.profile, &key);
            predict_node(p, own, &key, config.min_own_runs)
        });
        let mean = pred.map(|p| p.mean + p.ln_work(ln_work));
        let point = pred.map(|p| {
            let m = p.mean + p.ln_work(ln_work);
            explored_log_time(&config.exploration, m, p.sd, seed, &node.name)
        });
        fit.push((node, pred, mean, point, own));
    }
    let fastest = |times: Vec<Option<f64>>| {
        let min = times.into_iter().flatten().fold(f64::INFINITY, f64::min);
        min.is_finite().then(|| min.exp())
    };
    let fastest_mean = fastest(fit.iter().map(|f| f.2).collect());
    let fastest_point = fastest(fit.iter().map(|f| f.3).collect());
    let factor = class.map_or(config.threshold_factor, |c| config.threshold_factor_for(c));
    let thr = class.and(threshold(pod.deadline_seconds, fastest_mean, factor));
    let thr_explore = class.and(threshold(pod.deadline_seconds, fastest_point, factor));
    let exploring = !matches!(config.exploration, Exploration::None);
    let weight = config.prediction_review_weight;
    let scored: Vec<(f64, f64, u8, f64)> = fit
        .iter()
        .map(|&(_, pred, mean, point, own)| {
            let (Some(p), Some(mean), Some(point), Some(t)) = (pred, mean, point, thr) else {
                return (0.5, 0.5, 5, mean.unwrap_or(0.0).exp());
            };
            let (good, bad) = own.map_or((0.0, 0.0), |c| {
                let d = decay(now - c.t_ref, config.review_half_life_seconds);
                (c.good * d, c.bad * d)
            });
            let p_good = good_probability(mean, p.sd, t.ln());
            let p_explore = match thr_explore {
                Some(te) if exploring => good_probability(point, 0.0, te.ln()),
                _ => p_good,
            };
            let explored = good_rate(&config.beta_prior, good, bad, p_explore, weight);
            let rate = good_rate(&config.beta_prior, good, bad, p_good, weight);
            (rate, explored, to_score(explored), mean.exp())
        })
        .collect();
    let candidates: Vec<Candidate<'_>> = fit
        .iter()
        .zip(&scored)
        .map(|(&(node, _, mean, _, _), &(_, rate, score, _))| Candidate {
            name: &node.name,
            score,
            rate,
            log_time: mean.unwrap_or(0.0),
            default_score: queue::default_score(node, pod),
        })
        .collect();
    let names = queue::name_keys(&candidates);
    let w = &config.merge_weights;
    let tie = if w.kudos > 0.0 {
        queue::first_queue(&candidates, &names)
    } else {
        queue::second_queue(&candidates, &names)
    };
    let entries = queue::merge(&candidates, &tie, w)
        .into_iter()
        .enumerate()
        .map(|(pos, (i, merged_score))| {
            let (i, c) = (i as usize, &candidates[i as usize]);
            let (good_rate, _, score, seconds) = scored[i];
            let prediction = fit[i].1.map(|p| Prediction {
                seconds,
                uncertainty_log_sd: p.sd,
                source: p.source,
            });
            let review = thr
                .zip(prediction.as_ref())
                .map(|(t, p)| crate::review::review(p.seconds, t));
            RankEntry {
                node: c.name.into(),
                prediction,
                review,
                good_rate,
                score,
                default_score: c.default_score,
                merged_score,
                rank: pos + 1,
                candidate: nodes
                    .iter()
                    .position(|n| std::ptr::eq(n, fit[i].0))
                    .expect("every candidate is one of the nodes"),
            }
        })
        .collect();
    rejected.sort_by(|a, b| a.node.cmp(&b.node));
    Ranking {
        namespace: pod.namespace.clone(),
        pod: pod.name.clone(),
        class: pod.class.clone(),
        threshold_seconds: thr,
        entries,
        rejected,
    }
}

/// 30 nodes over five models, loads varied, names sharing long prefixes; six cannot run a pod
/// (five full, one stale), and one model is forbidden to class `c` under one configuration.
fn cluster() -> Vec<NodeState> {
    const MODELS: [&str; 5] = ["K80", "V100", "A100", "T4", "H100"];
    (0..30u64)
        .map(|i| {
            // Unique names, many equal beyond the sort key's eight bytes, one a prefix of others.
            let name = match i % 3 {
                0 => format!("gke-prod-pool-{}-0000000000-{i:02}", i % 2),
                1 => format!("n{i}"),
                _ if i == 2 => "gke-prod-pool-0-0000000000".to_owned(),
                _ => format!("gke-prod-pool-{i}-0000000000"),
            };
            let mut n = node(&name, MODELS[(i % 5) as usize]);
            n.free_devices = if i % 7 == 0 { 0 } else { 1 + (i % 4) as u32 };
            n.cpu_requested_milli = i * 997 % 32_000;
            n.memory_requested_bytes = (i * 7 % 100) << 30;
            if i == 13 {
                n.health = NodeHealth::Stale { age_seconds: 60.0 };
            }
            n
        })
        .collect()
}

/// The cluster as an interning caller gives it: nodes of one model share its vendor and model
/// allocations, and some of them differ in device count or memory all the same (a profile
/// matched by allocation must still be the node's own).
fn interned(mut nodes: Vec<NodeState>) -> Vec<NodeState> {
    let mut pool: Vec<Name> = Vec::new();
    let mut intern = |n: &Name| match pool.iter().find(|p| p.as_str() == n.as_str()) {
        Some(p) => p.clone(),
        None => {
            pool.push(n.clone());
            n.clone()
        }
    };
    for (i, n) in nodes.iter_mut().enumerate() {
        n.profile.vendor = intern(&n.profile.vendor);
        n.profile.model = intern(&n.profile.model);
        if i % 6 == 4 {
            n.profile.count *= 2;
        }
        if i % 9 == 8 {
            n.profile.memory_bytes /= 2;
        }
    }
    nodes
}

fn trained(config: SchedulerConfig, nodes: &[NodeState]) -> Scheduler {
    let mut s = Scheduler::new(config);
    let mut t = 1_000.0;
    for (i, n) in nodes.iter().enumerate().filter(|(i, _)| i % 4 == 1) {
        for k in 0..(i % 5) {
            t += 100.0;
            let secs = 100.0 * (1.0 + (i % 5) as f64) + 7.0 * k as f64;
            let r = run(&n.name, &n.profile.model, "c", secs, t);
            s.observe(&r, t).expect("a valid run");
        }
    }
    // A run on a profile the node no longer has: its history must be ignored.
    let r = run(&nodes[2].name, "P100", "c", 50.0, t + 10.0);
    s.observe(&r, t + 10.0).expect("a valid run");
    s
}

/// `lazy` reads as `written` does: each ranked node's name and score where the written ranking
/// has that candidate, each entry in place (read one by one, before the order is asked for),
/// the order, and the whole ranking.
fn reads_as(lazy: &LazyRanking, written: &Ranking) {
    // The best k, each read first on a fresh copy (selected and sorted alone), and again at
    // the end, once the whole order is known.
    let by_rank: Vec<usize> = written.entries.iter().map(|e| e.candidate).collect();
    let ks = [0, 1, 2, 5, 17, by_rank.len(), by_rank.len() + 3];
    let best_of = |r: &LazyRanking, k: usize| -> Vec<usize> {
        r.best(k)
            .iter()
            .map(|&i| r.candidate(i as usize).expect("a ranked node"))
            .collect()
    };
    for k in ks {
        let fresh = lazy.clone();
        assert_eq!(
            best_of(&fresh, k),
            by_rank[..k.min(by_rank.len())],
            "best {k}"
        );
        assert_eq!(
            fresh.entry(0),
            written.entries.first().cloned(),
            "entry 0 after best {k}"
        );
    }
    assert_eq!(lazy.len(), written.entries.len());
    assert_eq!(lazy.rejected(), written.rejected.as_slice());
    assert_eq!(lazy.class(), written.class.as_deref());
    assert_eq!(lazy.threshold_seconds(), written.threshold_seconds);
    for (pos, e) in written.entries.iter().enumerate() {
        assert_eq!(lazy.entry(pos).as_ref(), Some(e), "entry {pos}");
    }
    assert_eq!(lazy.entry(written.entries.len()), None);
    for i in 0..lazy.len() {
        let candidate = lazy.candidate(i).expect("a ranked node");
        let e = written
            .entries
            .iter()
            .find(|e| e.candidate == candidate)
            .expect("the same candidate ranked");
        assert_eq!(lazy.node(i), Some(e.node.as_str()));
        assert_eq!(lazy.score(i), Some(e.score));
        assert_eq!(lazy.node_score(i), Some((e.node.as_str(), e.score)));
        let pos = lazy.recommended().iter().position(|&r| r as usize == i);
        assert_eq!(pos, Some(e.rank - 1), "{}", e.node);
    }
    assert_eq!(lazy.node(lazy.len()), None);
    for k in ks {
        assert_eq!(
            best_of(lazy, k),
            by_rank[..k.min(by_rank.len())],
            "best {k}, order read"
        );
    }
    assert_eq!(&lazy.to_ranking(), written);
    assert_eq!(&lazy.clone().into_ranking(), written);
    let json = |v: Result<String, serde_json::Error>| v.expect("a ranking serialises");
    assert_eq!(
        json(serde_json::to_string(lazy)),
        json(serde_json::to_string(written)),
        "serialised as the ranking"
    );
}

#[test]
fn steps_compose_to_the_per_node_definition() {
    let nodes = cluster();
    let restricted = ClassConfig {
        allowed_models: vec!["K80".into(), "V100".into(), "A100".into(), "H100".into()],
        threshold_factor: Some(1.5),
        ..ClassConfig::default()
    };
    let configs = [
        SchedulerConfig::default(),
        SchedulerConfig {
            exploration: Exploration::Thompson,
            ..SchedulerConfig::default()
        },
        SchedulerConfig {
            exploration: Exploration::None,
            merge_weights: MergeWeights {
                kudos: 0.0,
                default_plugins: 1.0,
            },
            ..SchedulerConfig::default()
        },
        SchedulerConfig {
            merge_weights: MergeWeights {
                kudos: 1.0,
                default_plugins: 0.0,
            },
            classes: [("c".to_owned(), restricted)].into_iter().collect(),
            ..SchedulerConfig::default()
        },
    ];
    let base = pod(Some("c"));
    let pods = [
        base.clone(),
        pod(None),
        pod(Some("unseen")),
        PodSpec {
            deadline_seconds: Some(350.0),
            ..base.clone()
        },
        PodSpec {
            work_units: Some(2.5),
            gpus: 2,
            ..base.clone()
        },
    ];
    let mut compared = 0;
    let shared = interned(nodes.clone());
    for config in configs {
        let s = trained(config, &nodes);
        for p in &pods {
            for (now, seed) in [(5_000.0, 1), (90_000.0, 2)] {
                for nodes in [&nodes, &shared] {
                    let got = s.rank(p, nodes, now, seed);
                    assert_eq!(got, reference(&s, p, nodes, now, seed), "pod {p:?}");
                    reads_as(&s.rank_lazily(p, nodes, now, seed), &got);
                    reads_as(&LazyRanking::from(got.clone()), &got);
                    compared += got.entries.len();
                }
            }
        }
    }
    // The cluster exercises the paths: nodes with and without reviews, both reviews.
    let r = trained(SchedulerConfig::default(), &nodes).rank(&base, &nodes, 5_000.0, 1);
    assert!(r.rejected.len() == 6 && compared > 500, "{r:?}");
    let reviews: Vec<_> = r.entries.iter().filter_map(|e| e.review).collect();
    assert!(reviews.contains(&Review::Good) && reviews.contains(&Review::Bad));
}

#[test]
fn a_class_that_keeps_failing_on_a_vendor_is_kept_off_it_unless_the_pod_names_it() {
    let mut amd = node("amd-1", "MI300X");
    amd.profile.vendor = "amd".into();
    let nodes = vec![node("nv-1", "V100"), amd];
    let mut s = Scheduler::new(SchedulerConfig {
        default_vendors: Vec::new(),
        ..SchedulerConfig::default()
    });
    s.record_outcome("c", "nvidia", true);
    for _ in 0..crate::vendor_outcomes::FAILURES_TO_EXCLUDE {
        s.record_outcome("c", "amd", false);
    }
    let names =
        |r: &Ranking| -> Vec<String> { r.entries.iter().map(|e| e.node.to_string()).collect() };
    let plain = pod(Some("c"));
    let r = s.rank(&plain, &nodes, 5_000.0, 1);
    assert_eq!(names(&r), ["nv-1"], "{r:?}");
    assert_eq!(r.rejected[0].kind, RejectionKind::VendorNotAllowed);
    assert!(
        r.rejected[0].reason.contains("failed 3 times on amd"),
        "{r:?}"
    );
    assert_eq!(r, reference(&s, &plain, &nodes, 5_000.0, 1));
    // Named by the pod: taken at its word. Another class: no evidence against AMD.
    let named = PodSpec {
        vendors: vec!["amd".into()],
        ..plain.clone()
    };
    let r = s.rank(&named, &nodes, 5_000.0, 1);
    assert_eq!(names(&r), ["amd-1"], "{r:?}");
    assert_eq!(r, reference(&s, &named, &nodes, 5_000.0, 1));
    let other = pod(Some("other"));
    let r = s.rank(&other, &nodes, 5_000.0, 1);
    assert_eq!(r.entries.len(), 2, "{r:?}");
    assert_eq!(r, reference(&s, &other, &nodes, 5_000.0, 1));
    // The evidence is part of the model: it survives a snapshot.
    let back: Scheduler =
        serde_json::from_str(&serde_json::to_string(&s).expect("json")).expect("snapshot loads");
    assert_eq!(back.rank(&plain, &nodes, 5_000.0, 1).entries.len(), 1);
}

#[test]
fn name_text_gives_back_each_name_in_order() {
    let names = ["node-a", "", "nœud-β", "node-a", "x"];
    let t = lazy::NameText::copied(names.iter().copied());
    assert_eq!(t.iter().collect::<Vec<_>>(), names);
    for (i, n) in names.iter().enumerate() {
        assert_eq!(t.get(i), Some(*n));
        assert_eq!(t.at(i), *n);
    }
    assert_eq!(t.get(names.len()), None);
    let none = lazy::NameText::copied(std::iter::empty());
    assert_eq!(none.get(0), None);
    assert_eq!(none.iter().count(), 0);
}
