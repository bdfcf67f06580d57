//! Steps 1 to 5 composed: node set, prediction, review, score, queues and merge, and the
//! explanation table (step 8).
//!
//! This is the extender's hot path (kube-scheduler calls it serially for every pod), so it works
//! in two passes over the nodes with per-call caches: nodes share few device profiles, so the
//! class checks and the profile-level prediction are computed once per distinct profile; per node
//! there is one hash lookup for its own history and plain arithmetic. Sorts run on integer keys
//! and ties are broken by packed name keys, so string comparisons stay out of the queue sorts.

use std::fmt::Write as _;
use std::hash::Hasher as _;

use crate::config::{Exploration, SchedulerConfig};
use crate::nodeset::{check_node_kind, check_profile_kind};
use crate::predict::{
    ClassState, LogPrediction, ModelState, NameHasher, NodeCell, predict_node, predict_profile_for,
    work_scale,
};
use crate::queue::{self, Candidate};
use crate::review::{good_probability, review, threshold};
use crate::score::{decay, explored_log_time, good_rate, to_score};
use crate::types::{
    DeviceProfile, NodeState, PodSpec, Prediction, PredictionSource, RankEntry, Ranking, Rejection,
    RejectionKind, Review,
};

/// Per-call cache entry for one device profile.
struct ProfileInfo<'a> {
    profile: &'a DeviceProfile,
    hash: u64,
    key: String,
    allowed: Result<(), (RejectionKind, String)>,
    pred: Option<LogPrediction>,
}

/// One node that passed step 1, and everything steps 2 to 5 compute for it.
struct Work<'a> {
    node: &'a NodeState,
    profile: u32,
    pred: Option<LogPrediction>,
    /// The node's own cell, when it has runs on its current profile.
    own: Option<&'a NodeCell>,
    /// The name's first bytes and length, so sort keys are built without touching it again.
    head: [u8; HEAD],
    name_len: usize,
    /// Queue inputs (step 4 fills score, rate and time).
    cand: Candidate<'a>,
    name_key: u64,
    /// Default plugins' score, finished in step 4.
    default_parts: queue::DefaultParts,
    /// Log time the exploring score reviews (optimistic or sampled).
    point: f64,
    good_rate: f64,
    seconds: f64,
}

/// Bytes of a node name kept inline for its sort key.
const HEAD: usize = 24;

/// What every node of a profile without its own history shares in step 4.
#[derive(Clone, Copy)]
struct Shared {
    p_good: f64,
    p_explore: f64,
    seconds: f64,
}

fn profile_hash(p: &DeviceProfile) -> u64 {
    let mut h = NameHasher::default();
    h.write(p.vendor.as_bytes());
    h.write_u8(0xff);
    h.write(p.model.as_bytes());
    h.write_u64(u64::from(p.count) ^ p.memory_bytes.rotate_left(32));
    h.finish()
}

fn profile_index<'a>(
    cache: &mut Vec<ProfileInfo<'a>>,
    last: &mut usize,
    profile: &'a DeviceProfile,
    make: impl FnOnce(&'a DeviceProfile, u64) -> ProfileInfo<'a>,
) -> usize {
    if let Some(p) = cache.get(*last)
        && std::ptr::eq(p.profile, profile)
    {
        return *last;
    }
    // Nodes share few profiles: compare a hash first, the strings only on a hash match.
    let h = profile_hash(profile);
    if let Some(i) = cache
        .iter()
        .position(|p| p.hash == h && p.profile == profile)
    {
        *last = i;
        return i;
    }
    cache.push(make(profile, h));
    *last = cache.len() - 1;
    *last
}

/// Ranks `nodes` for `pod` (see [`crate::Scheduler::rank`]).
pub fn rank(
    config: &SchedulerConfig,
    state: &ModelState,
    pod: &PodSpec,
    nodes: &[NodeState],
    now: f64,
    seed: u64,
) -> Ranking {
    let class_name = pod.class.as_deref();
    let class_cfg = class_name.and_then(|c| config.classes.get(c));
    let lookup = class_name.map(|c| state.class_for(c, pod.gpus));
    let class_state: Option<&ClassState> = lookup.and_then(|l| l.own);
    let ln_work = work_scale(pod.work_units).ln();

    let mut cache: Vec<ProfileInfo<'_>> = Vec::new();
    let mut last = 0usize;
    let mut work: Vec<Work<'_>> = Vec::with_capacity(nodes.len());
    let mut rejected = Vec::new();
    let mut lcp = usize::MAX;
    let with_history = class_state.filter(|c| !c.nodes.is_empty());
    for node in nodes {
        if let Err((kind, reason)) = check_node_kind(node, pod) {
            rejected.push(Rejection {
                node: node.name.clone(),
                reason,
                kind,
            });
            continue;
        }
        let pi = profile_index(&mut cache, &mut last, &node.profile, |profile, hash| {
            let key = profile.key();
            let allowed = match class_name {
                Some(c) => check_profile_kind(c, class_cfg, profile),
                None => Ok(()),
            };
            let pred = lookup.map(|l| predict_profile_for(state, config, l, profile, &key));
            ProfileInfo {
                profile,
                hash,
                key,
                allowed,
                pred,
            }
        });
        let info = &cache[pi];
        if let Err((kind, reason)) = &info.allowed {
            rejected.push(Rejection {
                node: node.name.clone(),
                reason: reason.clone(),
                kind: *kind,
            });
            continue;
        }
        let own = with_history
            .and_then(|c| c.nodes.get(node.name.as_str()))
            .filter(|c| c.window.est.n > 0.0 && c.profile_key == info.key);
        let pred = info
            .pred
            .map(|p| predict_node(p, own, &info.key, config.min_own_runs));
        let name = node.name.as_bytes();
        let first = work.first().map_or(name, |w| w.node.name.as_bytes());
        // Only the current common prefix can still shrink.
        lcp = queue::common_prefix(&first[..lcp.min(first.len())], name);
        let mut head = [0u8; HEAD];
        let n = name.len().min(HEAD);
        head[..n].copy_from_slice(&name[..n]);
        work.push(Work {
            node,
            profile: pi as u32,
            pred,
            own,
            head,
            name_len: name.len(),
            cand: Candidate {
                name: &node.name,
                score: 5,
                rate: 0.5,
                log_time: 0.0,
                default_score: 0.0,
            },
            default_parts: queue::DefaultParts::new(node, pod),
            name_key: 0,
            point: 0.0,
            good_rate: 0.5,
            seconds: 0.0,
        });
    }

    // Step 3: the threshold, from the fastest candidate unless the pod has a deadline. The
    // exploring score reviews each node's optimistic (UCB) or sampled (Thompson) time against the
    // same rule applied to those times, so a plausibly faster, unexplored node can outscore an
    // incumbent that is merely "good" (see `crate::score`).
    let exploring = !matches!(config.exploration, Exploration::None);
    let (mut fastest, mut fastest_point) = (f64::INFINITY, f64::INFINITY);
    for w in &mut work {
        w.cand.default_score = w.default_parts.score();
        w.name_key = if w.name_len <= HEAD || lcp + 8 <= HEAD {
            queue::name_key(&w.head[..w.name_len.min(HEAD)], lcp)
        } else {
            queue::name_key(w.node.name.as_bytes(), lcp)
        };
        let Some(p) = w.pred else { continue };
        let mean = p.mean + p.ln_work(ln_work);
        w.cand.log_time = mean;
        w.point = explored_log_time(&config.exploration, mean, p.sd, seed, &w.node.name);
        fastest = fastest.min(mean);
        fastest_point = fastest_point.min(w.point);
    }
    let fastest = fastest.is_finite().then(|| fastest.exp());
    let fastest_point = fastest_point.is_finite().then(|| fastest_point.exp());
    let factor = class_name.map_or(config.threshold_factor, |c| config.threshold_factor_for(c));
    let threshold_seconds = class_name.and(threshold(pod.deadline_seconds, fastest, factor));
    let ln_thr = threshold_seconds.map(f64::ln);
    let ln_thr_explore =
        class_name.and(threshold(pod.deadline_seconds, fastest_point, factor).map(f64::ln));

    // Step 4: reviews and scores. Nodes without their own history share their profile's
    // prediction, so its soft reviews are computed once per profile (Thompson still draws per node).
    let per_node_draw = matches!(config.exploration, Exploration::Thompson);
    let weight = config.prediction_review_weight;
    let explore_p = |point: f64, exploit: f64| match ln_thr_explore {
        Some(lt) if exploring => good_probability(point, 0.0, lt),
        _ => exploit,
    };
    let mut shared: Vec<Option<Shared>> = vec![None; cache.len()];
    for w in &mut work {
        let Some(p) = w.pred else { continue };
        let mean = w.cand.log_time;
        let Some(lt) = ln_thr else {
            w.seconds = mean.exp();
            continue;
        };
        let (good, bad) = w.own.map_or((0.0, 0.0), |c| {
            let d = decay(now - c.t_ref, config.review_half_life_seconds);
            (c.good * d, c.bad * d)
        });
        let (p_good, p_explore, secs) = if w.own.is_some() {
            let g = good_probability(mean, p.sd, lt);
            (g, explore_p(w.point, g), mean.exp())
        } else {
            let point = w.point;
            let sh = *shared[w.profile as usize].get_or_insert_with(|| {
                let p_good = good_probability(mean, p.sd, lt);
                Shared {
                    p_good,
                    p_explore: explore_p(point, p_good),
                    seconds: mean.exp(),
                }
            });
            let p_explore = if per_node_draw {
                explore_p(point, sh.p_good)
            } else {
                sh.p_explore
            };
            (sh.p_good, p_explore, sh.seconds)
        };
        let explored = good_rate(&config.beta_prior, good, bad, p_explore, weight);
        w.good_rate = good_rate(&config.beta_prior, good, bad, p_good, weight);
        w.seconds = secs;
        w.cand.score = to_score(explored);
        w.cand.rate = explored;
    }

    // Step 5: queues and merge, in one sort (see `queue::recommended`).
    let generic = || queue::recommended_by(&work, |w| (&w.cand, w.name_key), &config.merge_weights);
    let merged = recommended(&work, &config.merge_weights).unwrap_or_else(generic);
    // Debug builds (every test) check the packed sort against the generic one.
    debug_assert_eq!(
        merged.iter().map(|m| (m.2, m.3)).collect::<Vec<_>>(),
        generic().iter().map(|m| (m.2, m.3)).collect::<Vec<_>>()
    );
    let entries = merged
        .iter()
        .enumerate()
        .map(|(pos, &(_, _, i, merged_score))| {
            let w = &work[i as usize];
            let prediction = w.pred.map(|p| Prediction {
                seconds: w.seconds,
                uncertainty_log_sd: p.sd,
                source: p.source,
            });
            let review = match (&prediction, threshold_seconds) {
                (Some(p), Some(t)) => Some(review(p.seconds, t)),
                _ => None,
            };
            RankEntry {
                node: w.node.name.clone(),
                prediction,
                review,
                good_rate: w.good_rate,
                score: w.cand.score,
                default_score: w.cand.default_score,
                merged_score,
                rank: pos + 1,
            }
        })
        .collect();
    rejected.sort_by(|a: &Rejection, b: &Rejection| a.node.cmp(&b.node));
    Ranking {
        namespace: pod.namespace.clone(),
        pod: pod.name.clone(),
        class: pod.class.clone(),
        threshold_seconds,
        entries,
        rejected,
    }
}

/// Kudos scores (0..=10) times default scores (integers 0..=200): the merged score is a function
/// of the pair.
const PAIRS: usize = 11 * 201;

/// [`queue::recommended_by`] with one `u128` key per node: the merged score is a function of
/// (kudos score, default score), both small integers, so it is replaced by its rank among the
/// pairs present (12 bits), which leaves room for the tie key (the first queue's key without the
/// name's last byte, or the second queue's key). Equal keys fall back to full names as there.
/// `None` when a default score is not an integer in 0..=200 (never, from `DefaultParts`).
fn recommended(
    work: &[Work<'_>],
    w: &crate::config::MergeWeights,
) -> Option<Vec<queue::MergedKey>> {
    let pair = |x: &Candidate<'_>| -> Option<usize> {
        let d = x.default_score;
        let ok = (0.0..=200.0).contains(&d) && d.fract() == 0.0 && x.score <= 10;
        ok.then(|| usize::from(x.score) * 201 + d as usize)
    };
    let mut rank_of = vec![u32::MAX; PAIRS];
    for x in work {
        rank_of[pair(&x.cand)?] = 0;
    }
    let mut present: Vec<(u64, u32)> = rank_of
        .iter()
        .enumerate()
        .filter(|(_, r)| **r == 0)
        .map(|(p, _)| {
            let c = Candidate {
                name: "",
                score: (p / 201) as u8,
                rate: 0.0,
                log_time: 0.0,
                default_score: (p % 201) as f64,
            };
            (!queue::ordered(queue::merged_score(&c, w)), p as u32)
        })
        .collect();
    present.sort_unstable();
    let mut rank = 0u32;
    for (k, run) in present.chunk_by(|a, b| a.0 == b.0).enumerate() {
        rank = k as u32;
        for &(_, p) in run {
            rank_of[p as usize] = rank;
        }
    }
    debug_assert!(rank < 1 << 12);
    let by_kudos = w.kudos > 0.0;
    let mut keys: Vec<(u128, u32)> = work
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let c = &x.cand;
            let r = u128::from(rank_of[usize::from(c.score) * 201 + c.default_score as usize]);
            let tie = if by_kudos {
                // Score (4 bits used of 8) | rate 24 | time 32 | name's first 7 bytes.
                queue::first_key(c, x.name_key) >> 8
            } else {
                // Default score descending (8 bits) | name.
                (u128::from(200 - c.default_score as u64) << 64) | u128::from(x.name_key)
            };
            ((r << 116) | tie, i as u32)
        })
        .collect();
    keys.sort_unstable_by_key(|k| k.0);
    for run in keys.chunk_by_mut(|a, b| a.0 == b.0) {
        if run.len() > 1 {
            run.sort_by(|a, b| {
                work[a.1 as usize]
                    .node
                    .name
                    .cmp(&work[b.1 as usize].node.name)
                    .then(a.1.cmp(&b.1))
            });
        }
    }
    Some(
        keys.into_iter()
            .map(|(_, i)| {
                let m = queue::merged_score(&work[i as usize].cand, w);
                (0, 0, i, m)
            })
            .collect(),
    )
}

fn source_label(s: &PredictionSource) -> String {
    match s {
        PredictionSource::OwnHistory { runs } => format!("own({runs})"),
        PredictionSource::Profile { runs } => format!("profile({runs})"),
        PredictionSource::Transfer => "transfer".to_owned(),
        PredictionSource::Prior => "prior".to_owned(),
    }
}

impl Ranking {
    /// The recommended node, if any.
    pub fn best(&self) -> Option<&RankEntry> {
        self.entries.first()
    }

    /// A plain-text explanation: per node the predicted time with its uncertainty (as a x/÷
    /// factor) and source, the review, good rate, kudos score, default score, merged score and rank;
    /// then the rejected nodes with their reasons.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let class = self.class.as_deref().unwrap_or("-");
        let thr = self
            .threshold_seconds
            .map_or_else(|| "-".to_owned(), |t| format!("{t:.1}s"));
        let _ = writeln!(
            out,
            "pod {}/{} class {class} threshold {thr}",
            self.namespace, self.pod
        );
        let _ = writeln!(
            out,
            "{:>4}  {:<24} {:>12} {:>7} {:<12} {:<6} {:>5} {:>5} {:>7} {:>8}",
            "rank",
            "node",
            "predicted",
            "x/÷",
            "source",
            "review",
            "rate",
            "score",
            "default",
            "merged"
        );
        for e in &self.entries {
            let (pred, unc, src) = match &e.prediction {
                Some(p) => (
                    format!("{:.1}s", p.seconds),
                    format!("{:.2}", p.uncertainty_log_sd.exp()),
                    source_label(&p.source),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            let rev = match e.review {
                Some(Review::Good) => "good",
                Some(Review::Bad) => "bad",
                None => "-",
            };
            let _ = writeln!(
                out,
                "{:>4}  {:<24} {:>12} {:>7} {:<12} {:<6} {:>5.2} {:>5} {:>7.0} {:>8.0}",
                e.rank,
                e.node,
                pred,
                unc,
                src,
                rev,
                e.good_rate,
                e.score,
                e.default_score,
                e.merged_score
            );
        }
        for r in &self.rejected {
            let _ = writeln!(out, "  rejected {}: {}", r.node, r.reason);
        }
        out
    }
}
