//! The first model (§2.2 step 2): predict a pod's compute time on a node, with an uncertainty
//! and the source of the evidence.
//!
//! Everything is in log space: `x = ln(seconds / work_units)`. Run times are multiplicative
//! (a device twice as fast halves the time; noise is a percentage), so logs make the effects
//! additive and the noise roughly symmetric. The evidence hierarchy, most specific first:
//!
//! 1. **Own history** of (class, node), once it has `min_own_runs`; blended by precision with the
//!    profile estimate so one unusual node is detected without being trusted on two runs.
//! 2. **Profile**: runs of the class pooled over nodes with the same [`DeviceProfile`], shrunk
//!    towards the transfer estimate by precision (helps most after one or two runs).
//! 3. **Transfer** (see `transfer.rs`): a log-additive model
//!    `x = class effect + profile effect + interaction`, refitted on every observation over the (class, profile) cells with the
//!    capability prior as a ridge on each profile effect, plus the interaction borrowed from
//!    classes that behave alike on the profiles both ran on. A class seen on other profiles is
//!    predicted on a new one through what every other class taught about that profile; the
//!    residual spread of the fit is the uncertainty.
//! 4. **Prior**: the class effect and the capability table of [`crate::prior`]. A class never
//!    seen starts at the median level of the known classes with a wide uncertainty (before any
//!    class has run: `default_class_seconds` for the whole run, whatever work it declares).
//!
//! The pod's GPU count is part of the class: the model keys a class run with `g > 1` devices per
//! pod as its own shape (`class#g`), sharing the device effects through the transfer model. A
//! shape without runs borrows the level of the same class at the nearest GPU count, scaled by
//! `g^-0.9` with an uncertainty that grows with the ratio of the counts.
//!
//! **Exploration guarantee.** A spec-sheet prior, or a speed factor learned from other classes,
//! can be wrong by 20x for one class. Until a class has `explore_runs` runs on a device profile,
//! its prediction there carries the prior's whole range (`ln 20`) as its uncertainty, so the
//! exploring score tries every profile that could be fastest a few times, wherever the prior
//! ranks it; then the class's own runs decide.
//!
//! Each cell keeps a window of its newest runs and a robust location: weighted median, then a
//! few Huber iterations with a MAD scale shrunk toward a prior scale. One straggler moves the
//! estimate by at most a clipped residual divided by the runs, and a window forgets drift.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::SchedulerConfig;
use crate::prior::capability;
use crate::types::{DeviceProfile, Prediction, PredictionSource};

/// Prior scale (log sd) of run-to-run noise, and its pseudo-count, for a cell with few runs.
const PRIOR_SCALE: f64 = 0.2;
const PRIOR_SCALE_WEIGHT: f64 = 2.0;
const MIN_SCALE: f64 = 0.02;
/// Huber tuning constant (in robust standard deviations).
const HUBER_K: f64 = 1.5;
/// Node-to-node spread (log sd) within a device profile, for blending own history with the pool.
pub(crate) const NODE_SPREAD: f64 = 0.1;
/// Ridge weight of the capability prior on each profile effect, in runs.
/// Weak: the prior can be wrong by 20x, so a couple of runs outweigh it.
pub(crate) const PROFILE_PRIOR_WEIGHT: f64 = 0.1;
/// Prior spread of the class x profile interaction and its pseudo-count (in cells).
pub(crate) const PRIOR_INTERACTION_SD: f64 = 0.3;
pub(crate) const PRIOR_INTERACTION_WEIGHT: f64 = 2.0;
/// Shrinkage of the similar-class interaction toward zero, in pseudo-neighbours.
pub(crate) const SIMILAR_PRIOR_WEIGHT: f64 = 0.5;
/// Full recomputation period of the similar-class tables, in runs (the observed class's table is
/// recomputed on every run).
pub(crate) const SIMILAR_FULL_EVERY: u64 = 64;
/// Log sd of a (class, profile) prediction until the class has `explore_runs` runs on the
/// profile: the prior's whole range, ln(20), at one standard deviation. Every such cell's
/// optimistic (UCB, c >= 1) time is then at least 20x better than its prediction, so it is tried
/// whatever the prior or the other classes say, and only a few times.
pub(crate) const UNTRIED_LOG_SD: f64 = 2.995_732_273_553_991; // ln(20)
/// Log sd of the level of a class never seen.
const UNSEEN_CLASS_LOG_SD: f64 = 1.5;
/// Assumed exponent of the speed-up with the pod's GPU count (time ~ gpus^-s) when a class is
/// predicted at a GPU count it has no runs at, from its runs at another count; and its log sd per
/// unit of `|ln(g / h)|`.
const GPU_SCALING: f64 = 0.9;
const GPU_SCALING_SD: f64 = 0.25;
/// Separator of the GPU count in internal class keys (label values cannot contain it).
const GPU_SEP: char = '#';

/// The model's key of a class run with `gpus` devices per pod: the class name for one GPU (and
/// zero), `name#g` otherwise. Pods of one class at different GPU counts are different resource
/// shapes with their own levels; the transfer model shares the device effects between them.
pub(crate) fn class_key(class: &str, gpus: u32) -> std::borrow::Cow<'_, str> {
    if gpus <= 1 {
        std::borrow::Cow::Borrowed(class)
    } else {
        std::borrow::Cow::Owned(format!("{class}{GPU_SEP}{gpus}"))
    }
}

fn split_key(key: &str) -> (&str, u32) {
    match key.rsplit_once(GPU_SEP) {
        Some((base, g)) => (base, g.parse().unwrap_or(1)),
        None => (key, 1),
    }
}

/// A fast deterministic hasher for node-name lookups on the ranking hot path: eight bytes per
/// step (FxHash-style multiply-rotate) and a splitmix finaliser, so the high bits hashbrown uses
/// as tags are well mixed even for names that differ only in their last characters.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NameHasher(u64);

impl NameHasher {
    fn mix(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for NameHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            self.mix(u64::from_le_bytes(b));
        }
        let r = chunks.remainder().len();
        if r > 0 {
            self.mix(crate::tail_word(bytes) ^ ((r as u64) << 59));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.mix(u64::from(i));
    }
}

/// One run as the model keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Obs {
    /// `ln(seconds / work_units)`.
    pub x: f64,
    /// Weight in (0, 1] (in-progress runs count by their progress).
    pub w: f64,
    /// When it was observed.
    pub t: f64,
    /// The run it belongs to ([`crate::runs::run_id`] of its key), 0 for an unkeyed report.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub run: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Robust location and scale of a window of runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Estimate {
    /// Robust mean of `x`.
    pub mean: f64,
    /// Robust log sd of one run.
    pub scale: f64,
    /// Sum of weights.
    pub n: f64,
}

impl Estimate {
    /// Standard error of the mean.
    pub fn se(&self) -> f64 {
        self.scale / self.n.max(1e-9).sqrt()
    }
}

/// A window of the newest runs with its cached robust estimate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Window {
    pub obs: VecDeque<Obs>,
    pub est: Estimate,
}

impl Window {
    pub fn push(&mut self, obs: Obs, cap: usize) {
        while self.obs.len() >= cap.max(1) {
            self.obs.pop_front();
        }
        self.obs.push_back(obs);
        self.est = robust_estimate(&self.obs);
    }

    /// Withdraws the observation of run `id` (a snapshot being replaced); false when the window
    /// no longer holds it.
    pub fn remove_run(&mut self, id: u64) -> bool {
        let before = self.obs.len();
        self.obs.retain(|o| o.run != id);
        let removed = self.obs.len() != before;
        if removed {
            self.est = robust_estimate(&self.obs);
        }
        removed
    }
}

fn weighted_median(pairs: &mut [(f64, f64)]) -> f64 {
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = pairs.iter().map(|p| p.1).sum();
    let mut acc = 0.0;
    for (i, &(x, w)) in pairs.iter().enumerate() {
        acc += w;
        if acc >= total / 2.0 {
            // Exactly half: average with the next value, as an ordinary median does.
            if (acc - total / 2.0).abs() < 1e-12 && i + 1 < pairs.len() {
                return (x + pairs[i + 1].0) / 2.0;
            }
            return x;
        }
    }
    pairs.last().map_or(0.0, |p| p.0)
}

/// Weighted Huber M-estimate with a MAD scale shrunk toward the prior scale.
pub(crate) fn robust_estimate(obs: &VecDeque<Obs>) -> Estimate {
    let n: f64 = obs.iter().map(|o| o.w).sum();
    if obs.is_empty() || n <= 0.0 {
        return Estimate::default();
    }
    let mut pairs: Vec<(f64, f64)> = obs.iter().map(|o| (o.x, o.w)).collect();
    let mut m = weighted_median(&mut pairs);
    let mut dev: Vec<(f64, f64)> = obs.iter().map(|o| ((o.x - m).abs(), o.w)).collect();
    let mad = 1.4826 * weighted_median(&mut dev);
    let scale = ((PRIOR_SCALE_WEIGHT * PRIOR_SCALE * PRIOR_SCALE + n * mad * mad)
        / (PRIOR_SCALE_WEIGHT + n))
        .sqrt()
        .max(MIN_SCALE);
    for _ in 0..6 {
        let (mut num, mut den) = (0.0, 0.0);
        for o in obs {
            let r = ((o.x - m) / scale).abs();
            let hw = if r <= HUBER_K { 1.0 } else { HUBER_K / r };
            num += o.w * hw * o.x;
            den += o.w * hw;
        }
        if den > 0.0 {
            m = num / den;
        }
    }
    Estimate { mean: m, scale, n }
}

/// Runs of one class pooled over one device profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Cell {
    pub profile: DeviceProfile,
    pub window: Window,
}

/// Runs of one class on one node, and the node's actual reviews for the class.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct NodeCell {
    /// Profile key the runs were made on (history is ignored if the node's hardware changes).
    pub profile_key: String,
    pub window: Window,
    /// Decayed good reviews as of `t_ref`.
    pub good: f64,
    /// Decayed bad reviews as of `t_ref`.
    pub bad: f64,
    /// Reference time of `good` and `bad`.
    pub t_ref: f64,
}

impl NodeCell {
    /// When the cell was last observed (its newest run; its reviews' time once it has none).
    fn last_seen(&self) -> f64 {
        self.window.obs.back().map_or(self.t_ref, |o| o.t)
    }
}

/// A class's cells per node, by node name.
pub(crate) type NodeCells = HashMap<String, NodeCell, BuildHasherDefault<NameHasher>>;

/// Everything learned about one class.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ClassState {
    /// Fitted class effect (log seconds per unit on a speed-1 device); `None` before any run.
    pub effect: Option<f64>,
    /// Per-profile cells, by profile key.
    pub cells: BTreeMap<String, Cell>,
    /// Per-node cells, shared between copies of the model until one of them changes them: the
    /// learner publishes a copy of the whole model, and these are most of it (about half of one
    /// copy's time at 31,000 cells), while one batch of runs touches few classes. Serialised
    /// as the map it holds (serde's `rc`), so stored state reads as before.
    pub nodes: Arc<NodeCells>,
    /// Fastest known per-unit log time over the class's profiles (the actual-review reference).
    pub best: Option<f64>,
    /// The reference the nodes' actual reviews were last re-judged against.
    #[serde(default)]
    pub judged: Option<f64>,
    /// Predicted interaction `(mean, sd)` on profiles the class has not run on, from classes that
    /// behave alike on the profiles both have run on (see [`ModelState::refit`]).
    #[serde(default)]
    pub transfer: BTreeMap<String, (f64, f64)>,
    /// End time of the class's latest observation: with `max_classes` classes, a new one
    /// replaces the least recently seen.
    #[serde(default)]
    pub last_seen: f64,
}

/// A fitted profile effect of the transfer model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ProfileEffect {
    /// Fitted effect (log time relative to the class effect).
    pub effect: f64,
    /// Runs (over all classes) behind it.
    pub weight: f64,
}

/// The learned state of the scheduler: serialisable for persistence, opaque otherwise.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelState {
    pub(crate) classes: BTreeMap<String, ClassState>,
    pub(crate) profile_effects: BTreeMap<String, ProfileEffect>,
    pub(crate) interaction_sd: Option<f64>,
    pub(crate) runs: u64,
    /// Keyed runs and the observation each currently contributes (see [`crate::runs`]).
    #[serde(default)]
    pub(crate) ledger: crate::runs::RunLedger,
    /// Final runs per class and vendor (see [`crate::vendor_outcomes`]).
    #[serde(default)]
    pub(crate) vendor_outcomes: crate::vendor_outcomes::VendorOutcomes,
    /// What observations learned with [`crate::Refit::Deferred`] left for
    /// [`ModelState::settle`]; `None` when the model is settled. Never stored: a stored model
    /// is refitted whole when it is read.
    #[serde(skip)]
    pub(crate) unsettled: Option<Unsettled>,
}

/// The model-wide refit that deferred observations owe (see [`crate::Refit::Deferred`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Unsettled {
    /// [`ModelState::runs`] before the first deferred observation: the settle makes the full
    /// similar-class pass if a multiple of its period was crossed since.
    pub runs_before: u64,
    /// Classes observed since, whose similar-class rows the settle recomputes.
    pub classes: std::collections::BTreeSet<String>,
    /// More classes than [`MAX_UNSETTLED_CLASSES`] were observed: every row is recomputed.
    pub all: bool,
}

/// Classes an unsettled model lists by name before it recomputes every class's row instead
/// (class names are user input; the list must not grow with them).
pub(crate) const MAX_UNSETTLED_CLASSES: usize = 4096;

impl ModelState {
    /// Classes with at least one run; a class's runs with `g > 1` GPUs per pod are listed as
    /// its own shape `class#g`.
    pub fn classes(&self) -> impl Iterator<Item = &str> {
        self.classes.keys().map(String::as_str)
    }

    /// Why `vendor` is excluded for `class`'s pods that name no vendors, if it is (see
    /// [`crate::vendor_outcomes`]).
    pub fn vendor_excluded(&self, class: &str, vendor: &str) -> Option<String> {
        self.vendor_outcomes.excluded(class, vendor)
    }

    /// Forgets the least recently observed classes until at most `keep` remain: class names
    /// are user input (a label on any pod), so the model must not grow with them. Returns the
    /// classes forgotten. One scan per class forgotten, which happens once per new class at
    /// the limit.
    pub(crate) fn evict_classes_beyond(&mut self, keep: usize) -> Vec<String> {
        let mut evicted = Vec::new();
        while self.classes.len() > keep {
            let Some(oldest) = self
                .classes
                .iter()
                .min_by(|a, b| a.1.last_seen.total_cmp(&b.1.last_seen))
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            self.classes.remove(&oldest);
            evicted.push(oldest);
        }
        evicted
    }

    /// (class, node) cells kept, over all classes.
    pub fn node_cells(&self) -> usize {
        self.classes.values().map(|c| c.nodes.len()).sum()
    }

    /// When there are more than `keep` (class, node) cells, forgets the least recently
    /// observed until an eighth of `keep` is free, so the scan over all cells happens once per
    /// `keep / 8` new cells.
    pub(crate) fn evict_node_cells_beyond(&mut self, keep: usize) {
        let total = self.node_cells();
        if total <= keep {
            return;
        }
        let remove = total - (keep - keep / 8);
        let mut times: Vec<f64> = self
            .classes
            .values()
            .flat_map(|c| c.nodes.values().map(NodeCell::last_seen))
            .collect();
        let (_, cut, _) = times.select_nth_unstable_by(remove - 1, f64::total_cmp);
        let cut = *cut;
        // All cells older than the cut go, and as many as needed of those observed at it.
        let older = times.iter().filter(|t| **t < cut).count();
        let mut at_cut = remove - older;
        let goes = |cell: &NodeCell, at_cut: usize| {
            let t = cell.last_seen();
            t < cut || (t == cut && at_cut > 0)
        };
        for class in self.classes.values_mut() {
            // Only classes that lose a cell are unshared from the published copy.
            if !class.nodes.values().any(|cell| goes(cell, at_cut)) {
                continue;
            }
            Arc::make_mut(&mut class.nodes).retain(|_, cell| {
                let gone = goes(cell, at_cut);
                if gone && cell.last_seen() == cut {
                    at_cut -= 1;
                }
                !gone
            });
        }
    }

    /// Runs learned in total: a run counts once, however many snapshots of it replaced each
    /// other (an unkeyed report is a run of its own).
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// Keyed runs the model currently remembers (at most `max_tracked_runs`).
    pub fn tracked_runs(&self) -> usize {
        self.ledger.len()
    }

    /// Runs (effective weight, rounded down) of a class on a node (one-GPU pods; pass `class#g`
    /// for pods of `g` GPUs).
    pub fn node_runs(&self, class: &str, node: &str) -> u32 {
        self.classes
            .get(class)
            .and_then(|c| c.nodes.get(node))
            .map_or(0, |n| n.window.est.n as u32)
    }

    pub(crate) fn interaction_sd(&self) -> f64 {
        self.interaction_sd.unwrap_or(PRIOR_INTERACTION_SD)
    }

    /// The state of `class` at `gpus` devices per pod, or, when that shape has no level yet, the
    /// state of the same class at the nearest GPU count that has one, with the log shift
    /// `-GPU_SCALING * ln(gpus / h)` and its sd.
    pub(crate) fn class_for(&self, class: &str, gpus: u32) -> ClassLookup<'_> {
        let key = class_key(class, gpus);
        let own = self.classes.get(key.as_ref());
        if own.is_some_and(|c| c.effect.is_some()) {
            return ClassLookup { own, sibling: None };
        }
        let g = f64::from(gpus.max(1));
        let sibling = self
            .classes
            .range::<str, _>((std::ops::Bound::Included(class), std::ops::Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(class))
            .filter(|(k, c)| c.effect.is_some() && split_key(k).0 == class)
            .map(|(k, c)| {
                let d = (g / f64::from(split_key(k).1.max(1))).ln();
                (c, d)
            })
            .min_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
            .map(|(c, d)| (c, -GPU_SCALING * d, GPU_SCALING_SD * d.abs()));
        ClassLookup { own, sibling }
    }

    /// Median level over the classes that have one: the cold-start level of a new class.
    fn median_level(&self) -> Option<(f64, f64)> {
        let mut levels: Vec<f64> = self.classes.values().filter_map(|c| c.effect).collect();
        if levels.is_empty() {
            return None;
        }
        levels.sort_by(f64::total_cmp);
        let n = levels.len();
        let median = if n % 2 == 1 {
            levels[n / 2]
        } else {
            (levels[n / 2 - 1] + levels[n / 2]) / 2.0
        };
        let mut dev: Vec<f64> = levels.iter().map(|l| (l - median).abs()).collect();
        dev.sort_by(f64::total_cmp);
        let spread = 1.4826 * dev[n / 2];
        Some((median, spread))
    }
}

/// A class as the model knows it for one pod shape (see [`ModelState::class_for`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClassLookup<'a> {
    /// The shape's own state (possibly without a level yet).
    pub own: Option<&'a ClassState>,
    /// The class at another GPU count: state, log shift, extra log sd.
    pub sibling: Option<(&'a ClassState, f64, f64)>,
}

/// Profile-level prediction for a class looked up with [`ModelState::class_for`].
pub(crate) fn predict_profile_for(
    state: &ModelState,
    config: &SchedulerConfig,
    class: ClassLookup<'_>,
    profile: &DeviceProfile,
    key: &str,
) -> LogPrediction {
    match class.sibling {
        Some((sib, shift, extra_sd)) => {
            let p = predict_profile(state, config, Some(sib), profile, key);
            LogPrediction {
                mean: p.mean + shift,
                sd: (p.sd * p.sd + extra_sd * extra_sd).sqrt(),
                source: PredictionSource::Transfer,
                whole_run: false,
            }
        }
        None => predict_profile(state, config, class.own, profile, key),
    }
}

/// A prediction in log space per work unit, before scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LogPrediction {
    pub mean: f64,
    pub sd: f64,
    pub source: PredictionSource,
    /// The mean is a whole run's time, not per work unit (a new class before any class has a
    /// level: `default_class_seconds` says nothing about the size of a work unit).
    pub whole_run: bool,
}

impl LogPrediction {
    /// The log of the declared work's multiplier for this prediction.
    pub fn ln_work(self, ln_work: f64) -> f64 {
        if self.whole_run { 0.0 } else { ln_work }
    }

    pub fn to_prediction(self, work_units: Option<f64>) -> Prediction {
        let scale = if self.whole_run {
            1.0
        } else {
            work_scale(work_units)
        };
        Prediction {
            seconds: self.mean.exp() * scale,
            uncertainty_log_sd: self.sd,
            source: self.source,
        }
    }
}

/// The multiplier of a declared amount of work (1 when absent or nonsensical).
pub(crate) fn work_scale(work_units: Option<f64>) -> f64 {
    match work_units {
        Some(w) if w.is_finite() && w > 0.0 => w,
        _ => 1.0,
    }
}

fn precision_blend(a: f64, sa: f64, b: f64, sb: f64) -> (f64, f64) {
    let (pa, pb) = (1.0 / (sa * sa).max(1e-12), 1.0 / (sb * sb).max(1e-12));
    ((a * pa + b * pb) / (pa + pb), (1.0 / (pa + pb)).sqrt())
}

/// Profile-level prediction for a class (no node history).
pub(crate) fn predict_profile(
    state: &ModelState,
    config: &SchedulerConfig,
    class: Option<&ClassState>,
    profile: &DeviceProfile,
    key: &str,
) -> LogPrediction {
    let learned = if config.enable_transfer {
        state.profile_effects.get(key).filter(|p| p.weight > 0.0)
    } else {
        None
    };
    let (beta, beta_sd, transferred) = match learned {
        Some(p) => (
            p.effect,
            1.0 / (p.weight + PROFILE_PRIOR_WEIGHT).sqrt() * 0.2,
            true,
        ),
        // Only here: matching the model's name against the table is a string search per
        // table entry, and a ranking predicts every distinct profile among its candidates.
        None => {
            let cap = capability(&profile.model, &config.capability_overrides);
            (-cap.speed.ln(), cap.log_sd(), false)
        }
    };
    let base = match class.and_then(|c| c.effect) {
        Some(mu) => {
            let (gamma, gamma_sd) = class
                .and_then(|c| c.transfer.get(key))
                .copied()
                .filter(|_| transferred)
                .unwrap_or((0.0, state.interaction_sd()));
            let sd = (gamma_sd * gamma_sd + beta_sd * beta_sd).sqrt();
            let source = if transferred {
                PredictionSource::Transfer
            } else {
                PredictionSource::Prior
            };
            LogPrediction {
                mean: mu + beta + gamma,
                sd,
                source,
                whole_run: false,
            }
        }
        // Cold start: the median level of the known classes (per work unit like theirs), else
        // the configured placeholder for a whole run. Either way a wide uncertainty, and the
        // ranking comes from the device effects alone.
        None => {
            let (level, spread, whole_run) = match state.median_level() {
                Some((m, spread)) => (m, spread, false),
                None => (config.default_class_seconds.ln(), 0.0, true),
            };
            let level_sd = UNSEEN_CLASS_LOG_SD.max(spread);
            LogPrediction {
                mean: level + beta,
                sd: (level_sd * level_sd + beta_sd * beta_sd).sqrt(),
                source: PredictionSource::Prior,
                whole_run,
            }
        }
    };
    let cell = class.and_then(|c| c.cells.get(key)).map(|c| c.window.est);
    let mut pred = match cell {
        Some(est) if est.n > 0.0 => {
            let (mean, sd) = precision_blend(est.mean, est.se(), base.mean, base.sd);
            LogPrediction {
                mean,
                sd,
                source: PredictionSource::Profile {
                    runs: est.n.round() as u32,
                },
                whole_run: false,
            }
        }
        _ => base,
    };
    // The exploration guarantee (see the module docs): untried cells keep the prior's range.
    let runs = cell.map_or(0.0, |e| e.n);
    if runs + 1e-9 < f64::from(config.explore_runs) {
        pred.sd = pred.sd.max(UNTRIED_LOG_SD);
    }
    pred
}

/// Node-level prediction: the profile prediction refined by the node's own runs.
pub(crate) fn predict_node(
    profile_pred: LogPrediction,
    node: Option<&NodeCell>,
    profile_key: &str,
    min_own_runs: u32,
) -> LogPrediction {
    match node {
        Some(cell) if cell.window.est.n > 0.0 && cell.profile_key == profile_key => {
            let est = cell.window.est;
            let prior_sd = (profile_pred.sd * profile_pred.sd + NODE_SPREAD * NODE_SPREAD).sqrt();
            let (mean, sd) = precision_blend(est.mean, est.se(), profile_pred.mean, prior_sd);
            let source = if est.n + 1e-9 >= f64::from(min_own_runs) {
                PredictionSource::OwnHistory {
                    runs: est.n.round() as u32,
                }
            } else {
                profile_pred.source
            };
            LogPrediction {
                mean,
                sd,
                source,
                whole_run: false,
            }
        }
        _ => profile_pred,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(xs: &[f64]) -> VecDeque<Obs> {
        xs.iter()
            .map(|&x| Obs {
                x,
                w: 1.0,
                t: 0.0,
                run: 0,
            })
            .collect()
    }

    #[test]
    fn one_straggler_does_not_wreck_the_estimate() {
        let clean = robust_estimate(&window(&[1.0, 1.02, 0.98, 1.01, 0.99]));
        let dirty = robust_estimate(&window(&[1.0, 1.02, 0.98, 1.01, 0.99, 1.0 + 3.0]));
        assert!((clean.mean - 1.0).abs() < 0.01);
        // A 20x straggler moves the mean by well under a tenth of its size.
        assert!((dirty.mean - clean.mean).abs() < 0.1, "{dirty:?}");
    }

    #[test]
    fn single_run_is_its_own_estimate() {
        let e = robust_estimate(&window(&[2.5]));
        assert_eq!(e.mean, 2.5);
        assert_eq!(e.n, 1.0);
        assert!(e.scale > 0.0);
    }

    #[test]
    fn name_hash_reads_remainders_like_bytewise() {
        let bytewise = |bytes: &[u8]| {
            let mut h = NameHasher::default();
            let mut chunks = bytes.chunks_exact(8);
            for c in &mut chunks {
                h.mix(u64::from_le_bytes(c.try_into().expect("8 bytes")));
            }
            let rest = chunks.remainder();
            if !rest.is_empty() {
                let v = rest
                    .iter()
                    .rev()
                    .fold(0u64, |v, &b| (v << 8) | u64::from(b));
                h.mix(v ^ ((rest.len() as u64) << 59));
            }
            h.finish()
        };
        let s = b"gpu-node-00042-abcdefghijklmnop";
        for end in 0..s.len() {
            let mut h = NameHasher::default();
            h.write(&s[..end]);
            assert_eq!(h.finish(), bytewise(&s[..end]), "{end}");
        }
    }

    #[test]
    fn window_forgets_oldest() {
        let mut w = Window::default();
        for i in 0..10 {
            w.push(
                Obs {
                    x: f64::from(i),
                    w: 1.0,
                    t: 0.0,
                    run: 0,
                },
                4,
            );
        }
        assert_eq!(w.obs.len(), 4);
        assert_eq!(w.obs.front().map(|o| o.x), Some(6.0));
    }
}
