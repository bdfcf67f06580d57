//! Reviews (§2.2 step 3): a node is *Good* for a pod when its predicted compute time is at or
//! below the threshold, *Bad* above it.
//!
//! The threshold is the pod's deadline when it declares one; otherwise it is relative to the best
//! candidate (`threshold_factor` x the fastest prediction, default 1.25x), so "good" means "close
//! enough to the best we can do now". After a run, the actual time is reviewed against the class's
//! fastest known time with the same factor (see [`crate::feedback`]).
//!
//! Besides the crisp review shown to operators, the second model needs the *probability* that a
//! run would be reviewed good, `P(t <= threshold)` under the prediction's log-normal uncertainty
//! plus run-to-run noise. It is what a predicted review is worth as evidence: a confident
//! prediction far below the threshold counts as a whole good review, a coin-flip one as half.

use crate::types::Review;

/// Floor of the run-to-run log spread used in soft reviews (the PAI trace's median CoV is ~0.09).
pub const RUN_NOISE_LOG_SD: f64 = 0.1;

/// The crisp review of a time against a threshold.
pub fn review(seconds: f64, threshold_seconds: f64) -> Review {
    if seconds <= threshold_seconds {
        Review::Good
    } else {
        Review::Bad
    }
}

/// The review threshold: the deadline if given (and sensible), else `factor` x the fastest
/// prediction. `None` when there is neither.
pub fn threshold(deadline_seconds: Option<f64>, fastest: Option<f64>, factor: f64) -> Option<f64> {
    match deadline_seconds {
        Some(d) if d.is_finite() && d > 0.0 => Some(d),
        _ => fastest.filter(|f| f.is_finite()).map(|f| f * factor),
    }
}

/// Probability that a run whose median log time is `log_seconds` (sd `log_sd`) finishes at or below
/// `ln_threshold`.
pub fn good_probability(log_seconds: f64, log_sd: f64, ln_threshold: f64) -> f64 {
    let sd = (log_sd * log_sd + RUN_NOISE_LOG_SD * RUN_NOISE_LOG_SD).sqrt();
    normal_cdf((ln_threshold - log_seconds) / sd)
}

/// Standard normal CDF (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7).
pub fn normal_cdf(z: f64) -> f64 {
    if z.is_nan() {
        return 0.5;
    }
    let x = z.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-x * x).exp();
    if z >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_threshold_is_good_above_is_bad() {
        assert_eq!(review(10.0, 10.0), Review::Good);
        assert_eq!(review(10.0 + 1e-9, 10.0), Review::Bad);
    }

    #[test]
    fn deadline_wins_over_relative_threshold() {
        assert_eq!(threshold(Some(100.0), Some(10.0), 1.25), Some(100.0));
        assert_eq!(threshold(None, Some(10.0), 1.25), Some(12.5));
        assert_eq!(threshold(Some(-1.0), Some(10.0), 1.25), Some(12.5));
        assert_eq!(threshold(None, None, 1.25), None);
    }

    #[test]
    fn cdf_is_sane_and_soft_review_is_monotone() {
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-7);
        assert!((normal_cdf(1.96) - 0.975).abs() < 1e-3);
        assert!((normal_cdf(-1.96) - 0.025).abs() < 1e-3);
        let thr = 10f64.ln();
        let fast = good_probability(8f64.ln(), 0.05, thr);
        let slow = good_probability(12f64.ln(), 0.05, thr);
        assert!(fast > 0.9 && slow < 0.1 && fast > slow);
    }
}
