//! Design §2.2 steps 2 to 4 over a call: prediction, the review threshold, reviews and scores.
//!
//! A node without its own history of the class has its profile's prediction, so its review and
//! score are its profile's too: both are computed once, on the [`super::ProfileRow`]. Thompson
//! sampling draws per node, so under it every node gets its own [`Eval`].

use std::borrow::Borrow;

use super::{Call, Class, Eval, Scratch, exploring};
use crate::config::Exploration;
use crate::predict::{LogPrediction, predict_node, predict_profile_for};
use crate::review::{good_probability, threshold};
use crate::score::{decay, explored_log_time, good_rate, to_score};
use crate::types::NodeState;

/// The fastest predicted and explored log times among the candidates (step 3's reference).
#[derive(Clone, Copy, Debug)]
pub(super) struct Fastest {
    mean: f64,
    point: f64,
}

impl Fastest {
    const NONE: Fastest = Fastest {
        mean: f64::INFINITY,
        point: f64::INFINITY,
    };

    fn include(&mut self, e: &Eval) {
        self.mean = self.mean.min(e.log_time);
        self.point = self.point.min(e.point);
    }
}

/// The review threshold of a call (step 3), plain and for the exploring score.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Threshold {
    /// Seconds, `None` without a class or without a prediction to be relative to.
    pub seconds: Option<f64>,
    ln: Option<f64>,
    ln_explore: Option<f64>,
}

/// The evaluation of a node (or profile) predicted `pred` per work unit, before its review.
fn predicted<N>(
    call: &Call<'_, N>,
    class: &Class<'_>,
    pred: LogPrediction,
    node: &str,
    reviews: Option<(f64, f64, f64)>,
) -> Eval {
    let mean = pred.mean + pred.ln_work(class.ln_work);
    Eval {
        pred: Some(pred),
        log_time: mean,
        point: explored_log_time(&call.config.exploration, mean, pred.sd, call.seed, node),
        reviews,
        ..Eval::NEUTRAL
    }
}

/// §2.2 step 2: each candidate's compute time from the first model. A profile-level prediction
/// per distinct profile; a node with its own runs of the class on its current profile refines
/// it with them and gets its own evaluation (as does every node under Thompson sampling).
/// Without a class nothing is predicted.
pub(super) fn predict<N: Borrow<NodeState>>(call: &Call<'_, N>, s: &mut Scratch) -> Fastest {
    s.evals.clear();
    let mut fastest = Fastest::NONE;
    let Some(class) = &call.class else {
        return fastest;
    };
    for (p, key) in s.profiles.iter_mut().zip(&s.profile_keys) {
        if p.allowed.is_ok() {
            let profile = &call.node(p.first).profile;
            let pred = predict_profile_for(call.state, call.config, class.lookup, profile, key);
            p.pred = Some(pred);
        }
    }
    let per_node_draw = matches!(call.config.exploration, Exploration::Thompson);
    let min_own_runs = call.config.min_own_runs;
    for row in &mut s.rows {
        let profile = &mut s.profiles[row.profile as usize];
        let key = &s.profile_keys[row.profile as usize];
        let node = call.node(row.node);
        let own = class
            .history
            .and_then(|c| c.nodes.get(node.name.as_str()))
            .filter(|c| c.window.est.n > 0.0 && c.profile_key == *key);
        let Some(profile_pred) = profile.pred else {
            continue;
        };
        if own.is_none() && !per_node_draw {
            profile.shared_rows += 1;
            continue;
        }
        let pred = predict_node(profile_pred, own, key, min_own_runs);
        let reviews = own.map(|c| (c.good, c.bad, c.t_ref));
        let eval = predicted(call, class, pred, &node.name, reviews);
        fastest.include(&eval);
        row.eval = s.evals.len() as u32;
        s.evals.push(eval);
    }
    for p in &mut s.profiles {
        if let (Some(pred), true) = (p.pred, p.shared_rows > 0) {
            // The name only seeds Thompson draws, which are never shared.
            p.eval = predicted(call, class, pred, "", None);
            fastest.include(&p.eval);
        }
    }
    fastest
}

/// §2.2 step 3: the review threshold, the pod's deadline when it has one, else relative to the
/// fastest candidate. The exploring score reviews each node's optimistic (UCB) or sampled
/// (Thompson) time against the same rule applied to those times, so a plausibly faster,
/// unexplored node can outscore an incumbent that is merely "good" (see [`crate::score`]).
pub(super) fn review_threshold<N>(call: &Call<'_, N>, fastest: Fastest) -> Threshold {
    let Some(class) = &call.class else {
        return Threshold {
            seconds: None,
            ln: None,
            ln_explore: None,
        };
    };
    let seconds_of = |ln: f64| ln.is_finite().then(|| ln.exp());
    let factor = call.config.threshold_factor_for(class.name);
    let deadline = call.pod.deadline_seconds;
    let seconds = threshold(deadline, seconds_of(fastest.mean), factor);
    Threshold {
        seconds,
        ln: seconds.map(f64::ln),
        ln_explore: threshold(deadline, seconds_of(fastest.point), factor).map(f64::ln),
    }
}

/// §2.2 step 4: each evaluation's predicted review as a probability, combined with the node's
/// decayed actual reviews into its good-review rate (the second model) and its 0..=10 score,
/// the first queue's order. Without a threshold every score stays neutral.
pub(super) fn score<N>(call: &Call<'_, N>, threshold: &Threshold, s: &mut Scratch) {
    let config = call.config;
    let explore_threshold = threshold.ln_explore.filter(|_| exploring(config));
    let scored = |e: &mut Eval| {
        let Some(pred) = e.pred else { return };
        e.seconds = e.log_time.exp();
        let Some(lt) = threshold.ln else { return };
        let (good, bad) = e.reviews.map_or((0.0, 0.0), |(good, bad, t_ref)| {
            let d = decay(call.now - t_ref, config.review_half_life_seconds);
            (good * d, bad * d)
        });
        let p_good = good_probability(e.log_time, pred.sd, lt);
        let p_explore = explore_threshold.map_or(p_good, |le| good_probability(e.point, 0.0, le));
        let weight = config.prediction_review_weight;
        let explored = good_rate(&config.beta_prior, good, bad, p_explore, weight);
        e.good_rate = good_rate(&config.beta_prior, good, bad, p_good, weight);
        e.rate = explored;
        e.score = to_score(explored);
    };
    for e in &mut s.evals {
        scored(e);
    }
    for p in s.profiles.iter_mut().filter(|p| p.shared_rows > 0) {
        scored(&mut p.eval);
    }
}
