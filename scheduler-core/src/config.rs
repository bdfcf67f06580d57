//! Scheduler configuration, by design §2.2 step: per-class constraints (step 1), the capability
//! prior and robustness of the first model (step 2), the review threshold (step 3), the second
//! model's decay, Beta prior and exploration (step 4), merge weights (step 5) and the gang
//! reservation TTL (step 6).
//!
//! Every field has a default, and `#[serde(default, deny_unknown_fields)]` lets a YAML or JSON
//! file override only the parts it names while a typo is an error rather than a silent default.
//! [`SchedulerConfig::validate`] turns nonsense (negative half-lives, a threshold below 1x) into a
//! typed error before anything runs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Constraints and overrides for one algorithm class.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassConfig {
    /// Vendors whose devices may run the class (empty: any). Case-insensitive.
    pub allowed_vendors: Vec<String>,
    /// Device models that may run the class (empty: any). Case-insensitive exact match.
    /// When both lists are given, a node qualifies if either matches.
    pub allowed_models: Vec<String>,
    /// Minimum memory per device, bytes.
    pub min_device_memory_bytes: u64,
    /// Overrides [`SchedulerConfig::threshold_factor`] for this class.
    pub threshold_factor: Option<f64>,
}

/// How the second model explores nodes with little evidence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Exploration {
    /// Pure exploitation.
    None,
    /// Optimism in the face of uncertainty: the predicted time is lowered by `c` standard deviations
    /// of its uncertainty before it is reviewed. Deterministic and monotone in evidence.
    Ucb {
        /// Standard deviations of optimism.
        c: f64,
    },
    /// Thompson sampling: the predicted log time is drawn from its posterior, per node, from a
    /// generator seeded by the call's seed and the node name.
    Thompson,
}

impl Default for Exploration {
    fn default() -> Self {
        Self::Ucb { c: 1.0 }
    }
}

/// Beta prior of the good-review rate: `alpha` pseudo good reviews, `beta` pseudo bad ones.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BetaPrior {
    /// Pseudo good reviews.
    pub alpha: f64,
    /// Pseudo bad reviews.
    pub beta: f64,
}

impl Default for BetaPrior {
    fn default() -> Self {
        Self {
            alpha: 1.0,
            beta: 1.0,
        }
    }
}

/// Weights of the merge of the first (kudos) and second (default plugins) queues.
///
/// kube-scheduler multiplies an extender's 0..=10 score by `100 / 10` and by the extender's
/// weight, and adds it to the plugins' weighted 0..=100 scores. The defaults mirror an extender at
/// weight 5 against the two default scoring plugins at weight 1.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MergeWeights {
    /// Weight of the kudos score (after scaling 0..=10 to 0..=100).
    pub kudos: f64,
    /// Weight of the default plugins' score.
    pub default_plugins: f64,
}

impl Default for MergeWeights {
    fn default() -> Self {
        Self {
            kudos: 5.0,
            default_plugins: 1.0,
        }
    }
}

/// Everything the scheduler can be told.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// Per-class constraints; classes not listed run anywhere.
    pub classes: BTreeMap<String, ClassConfig>,
    /// Relative speed by device model (V100 = 1.0), overriding or extending the built-in table.
    /// Keys match a model name when they occur in it, ignoring case and punctuation.
    pub capability_overrides: BTreeMap<String, f64>,
    /// Review threshold relative to the fastest candidate's prediction (default 1.25).
    pub threshold_factor: f64,
    /// Half-life of actual reviews, seconds.
    pub review_half_life_seconds: f64,
    /// Beta prior of the good-review rate.
    pub beta_prior: BetaPrior,
    /// Exploration of nodes with little evidence.
    pub exploration: Exploration,
    /// Merge weights.
    pub merge_weights: MergeWeights,
    /// Runs of a class on a node before its own history is the prediction's source.
    pub min_own_runs: u32,
    /// Runs of a class on a device profile before its prediction there stops carrying the
    /// prior's whole range (a factor 20) as uncertainty: with UCB (c >= 1) every profile that
    /// could be the fastest is tried this many times, whatever the prior says. 0 disables.
    pub explore_runs: u32,
    /// How long a gang reservation holds, seconds.
    pub gang_reservation_ttl_seconds: f64,
    /// A gang prefers one device profile unless mixing profiles makes its slowest member faster
    /// by more than this factor.
    pub gang_profile_tolerance: f64,
    /// Runs kept per (class, node) and (class, profile) for the robust estimate.
    pub history_window: usize,
    /// Predicted time, seconds (per work unit when the pod declares work), of a class with no
    /// history at all on a V100-class device: a placeholder level until the first run.
    pub default_class_seconds: f64,
    /// Learn profile speed factors across classes (disable to compare against the prior alone).
    pub enable_transfer: bool,
    /// Pseudo-reviews the current prediction counts for in the good-review rate.
    pub prediction_review_weight: f64,
    /// Keyed runs remembered so that a run's snapshots replace each other (bounds the ledger;
    /// the oldest run is forgotten first, and withdrawn if it was still in progress).
    pub max_tracked_runs: usize,
    /// Classes (and `class#g` shapes) the model keeps; a new one beyond this replaces the least
    /// recently observed (class names are user input, so the model's size must not follow them).
    pub max_classes: usize,
    /// (class, node) cells the model keeps, over all classes: the largest part of the model (a
    /// class × node grid, about 1.5 KB each when serialised). Beyond it the least recently
    /// observed eighth is forgotten at once; those nodes then fall back to their device
    /// profile's history for the class. Default 32,768: under 50 MB of state whatever the
    /// cluster and class count.
    pub max_node_cells: usize,
    /// Vendors whose devices a pod may use when neither the pod (`kudos.dev/vendors`) nor its
    /// class (`allowed_vendors`) names any. Default `[nvidia]`: an image built for one vendor's
    /// runtime (CUDA, most of them) fails on another's devices, and every vendor registers the
    /// same unified resource name, so a pod that says nothing is kept on the common runtime.
    /// Empty: any vendor (clusters of one vendor, or images that carry every runtime).
    pub default_vendors: Vec<String>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            classes: BTreeMap::new(),
            capability_overrides: BTreeMap::new(),
            threshold_factor: 1.25,
            review_half_life_seconds: 6.0 * 3600.0,
            beta_prior: BetaPrior::default(),
            exploration: Exploration::default(),
            merge_weights: MergeWeights::default(),
            min_own_runs: 3,
            explore_runs: 1,
            gang_reservation_ttl_seconds: 120.0,
            gang_profile_tolerance: 1.10,
            history_window: 16,
            default_class_seconds: 3600.0,
            enable_transfer: true,
            prediction_review_weight: 4.0,
            max_tracked_runs: 10_000,
            max_classes: 2_048,
            max_node_cells: 32_768,
            default_vendors: vec!["nvidia".to_owned()],
        }
    }
}

/// A configuration value that cannot work.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ConfigError {
    /// A value that is not a number and cannot work.
    #[error("{field} = {value} is invalid: {expected}")]
    Invalid {
        /// The offending field.
        field: String,
        /// Its value, quoted.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A number outside its allowed range.
    #[error("{field} = {value} is invalid: {expected}")]
    OutOfRange {
        /// The offending field.
        field: String,
        /// Its value.
        value: f64,
        /// What it must be.
        expected: &'static str,
    },
}

fn check(field: &str, value: f64, ok: bool, expected: &'static str) -> Result<(), ConfigError> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            field: field.to_owned(),
            value,
            expected,
        })
    }
}

impl SchedulerConfig {
    /// Checks every value; the scheduler assumes a validated configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let t = self.threshold_factor;
        check("threshold_factor", t, t >= 1.0, "a finite number >= 1")?;
        if let Some(v) = self.default_vendors.iter().find(|v| v.trim().is_empty()) {
            return Err(ConfigError::Invalid {
                field: "default_vendors".to_owned(),
                value: format!("{v:?}"),
                expected: "vendor names such as nvidia or amd (an empty list allows any vendor)",
            });
        }
        let h = self.review_half_life_seconds;
        check("review_half_life_seconds", h, h > 0.0, "positive seconds")?;
        let (a, b) = (self.beta_prior.alpha, self.beta_prior.beta);
        check("beta_prior.alpha", a, a > 0.0, "positive")?;
        check("beta_prior.beta", b, b > 0.0, "positive")?;
        if let Exploration::Ucb { c } = self.exploration {
            check("exploration.c", c, c >= 0.0, "non-negative")?;
        }
        let (k, d) = (self.merge_weights.kudos, self.merge_weights.default_plugins);
        check("merge_weights.kudos", k, k >= 0.0, "non-negative")?;
        check("merge_weights.default_plugins", d, d >= 0.0, "non-negative")?;
        check(
            "merge_weights",
            k + d,
            k + d > 0.0,
            "at least one weight positive",
        )?;
        let e = f64::from(self.explore_runs);
        check("explore_runs", e, e <= 100.0, "0..=100")?;
        let m = f64::from(self.min_own_runs);
        check("min_own_runs", m, m >= 1.0, "at least 1")?;
        let ttl = self.gang_reservation_ttl_seconds;
        check("gang_reservation_ttl_seconds", ttl, ttl > 0.0, "positive")?;
        let g = self.gang_profile_tolerance;
        check("gang_profile_tolerance", g, g >= 1.0, "a number >= 1")?;
        let w = self.history_window as f64;
        check("history_window", w, (1.0..=1024.0).contains(&w), "1..=1024")?;
        let s = self.default_class_seconds;
        check("default_class_seconds", s, s > 0.0, "positive seconds")?;
        let p = self.prediction_review_weight;
        check("prediction_review_weight", p, p >= 0.0, "non-negative")?;
        let r = self.max_tracked_runs as f64;
        check(
            "max_tracked_runs",
            r,
            (1.0..=1e7).contains(&r),
            "1..=10000000",
        )?;
        let c = self.max_classes as f64;
        check("max_classes", c, (1.0..=1e6).contains(&c), "1..=1000000")?;
        let n = self.max_node_cells as f64;
        check(
            "max_node_cells",
            n,
            (1.0..=1e7).contains(&n),
            "1..=10000000",
        )?;
        for (model, speed) in &self.capability_overrides {
            check(
                &format!("capability_overrides.{model}"),
                *speed,
                *speed > 0.0,
                "a positive relative speed",
            )?;
        }
        for (name, class) in &self.classes {
            if let Some(f) = class.threshold_factor {
                check(
                    &format!("classes.{name}.threshold_factor"),
                    f,
                    f >= 1.0,
                    "a finite number >= 1",
                )?;
            }
        }
        Ok(())
    }

    /// The threshold factor for a class.
    pub fn threshold_factor_for(&self, class: &str) -> f64 {
        self.classes
            .get(class)
            .and_then(|c| c.threshold_factor)
            .unwrap_or(self.threshold_factor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        assert_eq!(SchedulerConfig::default().validate(), Ok(()));
    }

    #[test]
    fn rejects_threshold_below_one() {
        let c = SchedulerConfig {
            threshold_factor: 0.9,
            ..SchedulerConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(ConfigError::OutOfRange { ref field, .. }) if field == "threshold_factor"
        ));
    }

    #[test]
    fn partial_json_overrides_and_unknown_fields_fail() {
        let c: SchedulerConfig = serde_json::from_str(
            r#"{"threshold_factor": 1.5, "exploration": {"kind": "thompson"}}"#,
        )
        .expect("parses");
        assert_eq!(c.threshold_factor, 1.5);
        assert_eq!(c.exploration, Exploration::Thompson);
        assert_eq!(c.min_own_runs, 3);
        assert!(serde_json::from_str::<SchedulerConfig>(r#"{"treshold_factor": 1.5}"#).is_err());
    }
}
