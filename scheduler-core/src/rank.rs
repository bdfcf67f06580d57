//! Steps 1 to 5 composed: node set, prediction, review, score, queues and merge, and the
//! explanation table (step 8).
//!
//! This is the extender's hot path (kube-scheduler calls it serially for every pod), so it works
//! in two passes over the nodes with per-call caches: nodes share few device profiles, so the
//! class checks and the profile-level prediction are computed once per distinct profile; per node
//! there is one hash lookup for its own history and plain arithmetic. Node names are sorted once
//! and ties are broken by that order, so no string comparison happens inside the queue sorts.

use std::fmt::Write as _;

use crate::config::SchedulerConfig;
use crate::nodeset::{check_node, check_profile};
use crate::predict::{
    ClassState, LogPrediction, ModelState, NodeCell, predict_node, predict_profile, work_scale,
};
use crate::queue::{self, Candidate};
use crate::review::{good_probability, review, threshold};
use crate::score::{decay, explored_log_time, good_rate, to_score};
use crate::types::{
    DeviceProfile, NodeState, PodSpec, PredictionSource, RankEntry, Ranking, Rejection, Review,
};

/// Per-call cache entry for one device profile.
struct ProfileInfo<'a> {
    profile: &'a DeviceProfile,
    key: String,
    allowed: Result<(), String>,
    pred: Option<LogPrediction>,
}

/// One node that passed step 1.
struct Fit<'a> {
    node: &'a NodeState,
    pred: Option<LogPrediction>,
    cell: Option<&'a NodeCell>,
}

fn profile_index<'a>(
    cache: &mut Vec<ProfileInfo<'a>>,
    last: &mut usize,
    profile: &'a DeviceProfile,
    make: impl FnOnce(&'a DeviceProfile) -> ProfileInfo<'a>,
) -> usize {
    if let Some(p) = cache.get(*last)
        && (std::ptr::eq(p.profile, profile) || p.profile == profile)
    {
        return *last;
    }
    if let Some(i) = cache.iter().position(|p| p.profile == profile) {
        *last = i;
        return i;
    }
    cache.push(make(profile));
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
    let class_state: Option<&ClassState> = class_name.and_then(|c| state.classes.get(c));
    let ln_work = work_scale(pod.work_units).ln();

    let mut cache: Vec<ProfileInfo<'_>> = Vec::new();
    let mut last = 0usize;
    let mut fits: Vec<Fit<'_>> = Vec::with_capacity(nodes.len());
    let mut rejected = Vec::new();
    for node in nodes {
        if let Err(reason) = check_node(node, pod) {
            rejected.push(Rejection {
                node: node.name.clone(),
                reason,
            });
            continue;
        }
        let pi = profile_index(&mut cache, &mut last, &node.profile, |profile| {
            let key = profile.key();
            let allowed = match class_name {
                Some(c) => check_profile(c, class_cfg, profile),
                None => Ok(()),
            };
            let pred =
                class_name.map(|_| predict_profile(state, config, class_state, profile, &key));
            ProfileInfo {
                profile,
                key,
                allowed,
                pred,
            }
        });
        let info = &cache[pi];
        if let Err(reason) = &info.allowed {
            rejected.push(Rejection {
                node: node.name.clone(),
                reason: reason.clone(),
            });
            continue;
        }
        let cell = class_state
            .filter(|c| !c.nodes.is_empty())
            .and_then(|c| c.nodes.get(node.name.as_str()));
        let pred = info
            .pred
            .map(|p| predict_node(p, cell, &info.key, config.min_own_runs));
        fits.push(Fit { node, pred, cell });
    }

    // Step 3: the threshold, from the fastest candidate unless the pod has a deadline.
    let fastest = fits
        .iter()
        .filter_map(|f| f.pred.map(|p| p.mean))
        .min_by(f64::total_cmp)
        .map(|m| (m + ln_work).exp());
    let factor = class_name.map_or(config.threshold_factor, |c| config.threshold_factor_for(c));
    let threshold_seconds = class_name.and(threshold(pod.deadline_seconds, fastest, factor));
    let ln_thr = threshold_seconds.map(f64::ln);

    // Step 4: reviews and scores.
    let mut rates = Vec::with_capacity(fits.len());
    let mut candidates: Vec<Candidate<'_>> = Vec::with_capacity(fits.len());
    for f in &fits {
        let (good, bad) = f.cell.map_or((0.0, 0.0), |c| {
            let d = decay(now - c.t_ref, config.review_half_life_seconds);
            (c.good * d, c.bad * d)
        });
        let (rate, explored, log_time) = match (f.pred, ln_thr) {
            (Some(p), Some(lt)) => {
                let mean = p.mean + ln_work;
                let p_good = good_probability(mean, p.sd, lt);
                let shifted =
                    explored_log_time(&config.exploration, mean, p.sd, seed, &f.node.name);
                let p_explore = good_probability(shifted, p.sd, lt);
                let w = config.prediction_review_weight;
                (
                    good_rate(&config.beta_prior, good, bad, p_good, w),
                    good_rate(&config.beta_prior, good, bad, p_explore, w),
                    mean,
                )
            }
            _ => (0.5, 0.5, 0.0),
        };
        rates.push(rate);
        candidates.push(Candidate {
            name: &f.node.name,
            score: to_score(explored),
            rate: explored,
            log_time,
            default_score: queue::default_score(f.node, pod),
        });
    }

    // Step 5: queues and merge.
    let names = queue::name_order(&candidates);
    let first = queue::first_queue(&candidates, &names);
    let second = queue::second_queue(&candidates, &names);
    let merged = queue::merge(&candidates, &first, &second, &config.merge_weights);
    let entries = merged
        .iter()
        .enumerate()
        .map(|(pos, &(i, merged_score))| {
            let (f, c) = (&fits[i as usize], &candidates[i as usize]);
            let prediction = f.pred.map(|p| p.to_prediction(pod.work_units));
            let review = match (&prediction, threshold_seconds) {
                (Some(p), Some(t)) => Some(review(p.seconds, t)),
                _ => None,
            };
            RankEntry {
                node: f.node.name.clone(),
                prediction,
                review,
                good_rate: rates[i as usize],
                score: c.score,
                default_score: c.default_score,
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
