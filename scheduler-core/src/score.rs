//! The second model (§2.2 step 4): each node's good-review rate for a class becomes a 0..=10
//! score; sorted by score, the nodes form the first queue.
//!
//! **How predicted and actual reviews combine.** The rate is the posterior mean of a Beta-Bernoulli
//! model of "a run of this class on this node is reviewed good":
//!
//! ```text
//! rate = (alpha + G + w * p) / (alpha + beta + G + B + w)
//! ```
//!
//! * `alpha`, `beta`: the Beta prior, so a node with two reviews is neither top nor bottom by luck;
//! * `G`, `B`: the node's *actual* reviews from feedback, each weighted `2^(-age / half_life)` so
//!   the rate follows change (a degraded node, a driver upgrade);
//! * `p`: the *predicted* review of this ranking, as a probability (`P(t <= threshold)` under the
//!   prediction's uncertainty, see [`crate::review::good_probability`]), counted as `w`
//!   (`prediction_review_weight`) pseudo-reviews.
//!
//! Actual reviews say how a node really did; the predicted review says how it compares with the
//! *current* candidates and carries everything the first model learned from other nodes and
//! classes. Because the prediction sharpens as evidence arrives (its `p` tends to 0 or 1), the
//! rate moves pods to faster device types as soon as the first model knows they are faster, while
//! a node that actually misbehaves is pulled down by its own bad reviews.
//!
//! **Exploration.** Actual good reviews make an incumbent's rate climb toward 1, and a node that
//! has never run the class cannot pass `(alpha + w) / (alpha + beta + w)` on predictions alone, so
//! exploration cannot be a small bonus on the rate. Instead the exploring score reviews a *point*
//! log time per node: optimistic by `c` standard deviations of the prediction (UCB, default) or
//! drawn from the prediction's posterior with a generator seeded by the call's seed and the node
//! name (Thompson: deterministic and input-order free). The points are reviewed against the same
//! rule applied to the points (`factor` x the best point, or the deadline), with run-to-run noise
//! only. An unexplored device that may well be faster then outranks an incumbent whose own
//! narrow prediction is only "good", until runs on it settle the question; a device that is slow
//! even optimistically is never tried. Exploration changes the score, never the reported
//! `good_rate`, and a confident prediction (small sd) barely moves.

use crate::config::{BetaPrior, Exploration};

/// Decay factor of actual reviews `age` seconds old (future timestamps do not amplify).
pub fn decay(age_seconds: f64, half_life_seconds: f64) -> f64 {
    if age_seconds <= 0.0 || !age_seconds.is_finite() {
        return 1.0;
    }
    (-(age_seconds / half_life_seconds) * std::f64::consts::LN_2).exp()
}

/// Posterior mean good-review rate.
pub fn good_rate(prior: &BetaPrior, good: f64, bad: f64, predicted_p: f64, weight: f64) -> f64 {
    let p = if predicted_p.is_finite() {
        predicted_p.clamp(0.0, 1.0)
    } else {
        0.5
    };
    (prior.alpha + good + weight * p) / (prior.alpha + prior.beta + good + bad + weight)
}

/// Maps a rate in 0..=1 to the extender's 0..=10.
pub fn to_score(rate: f64) -> u8 {
    if rate.is_nan() {
        return 5;
    }
    (rate.clamp(0.0, 1.0) * 10.0).round() as u8
}

/// The log time to review for exploration: `mean` shifted by the exploration rule.
pub fn explored_log_time(
    exploration: &Exploration,
    mean: f64,
    sd: f64,
    seed: u64,
    node: &str,
) -> f64 {
    match exploration {
        Exploration::None => mean,
        Exploration::Ucb { c } => mean - c * sd,
        Exploration::Thompson => mean + sd * standard_normal(seed, node),
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn name_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A standard normal draw determined by `(seed, node)` only (Box-Muller on two splitmix outputs).
pub fn standard_normal(seed: u64, node: &str) -> f64 {
    let a = splitmix(seed ^ name_hash(node));
    let b = splitmix(a);
    let u1 = ((a >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let u2 = (b >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prior_keeps_few_reviews_in_the_middle() {
        let prior = BetaPrior::default();
        let two_good = good_rate(&prior, 2.0, 0.0, 0.5, 0.0);
        let many_good = good_rate(&prior, 200.0, 10.0, 0.5, 0.0);
        assert!(two_good < many_good, "{two_good} vs {many_good}");
        assert!(good_rate(&prior, 0.0, 2.0, 0.5, 0.0) > good_rate(&prior, 0.0, 200.0, 0.5, 0.0));
    }

    #[test]
    fn decay_halves_at_half_life() {
        assert!((decay(100.0, 100.0) - 0.5).abs() < 1e-12);
        assert_eq!(decay(-5.0, 100.0), 1.0);
    }

    #[test]
    fn scores_are_bounded() {
        assert_eq!(to_score(-1.0), 0);
        assert_eq!(to_score(2.0), 10);
        assert_eq!(to_score(f64::NAN), 5);
        assert_eq!(to_score(0.55), 6);
    }

    #[test]
    fn thompson_draws_are_deterministic_and_spread() {
        assert_eq!(standard_normal(7, "n1"), standard_normal(7, "n1"));
        let draws: Vec<f64> = (0..2000).map(|i| standard_normal(i, "node")).collect();
        let mean = draws.iter().sum::<f64>() / 2000.0;
        let var = draws.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / 2000.0;
        assert!(mean.abs() < 0.1 && (var - 1.0).abs() < 0.15, "{mean} {var}");
    }
}
