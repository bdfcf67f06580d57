//! Feedback (§2.3 step 3): a run report becomes an actual compute time, updates the first model,
//! earns the node an actual review, and re-scores nodes (the third queue).
//!
//! * **Units.** The model learns `ln(seconds per work unit)`. `work_units` is the work done by the
//!   report's `end`: the whole run's for a final report, the work done *so far* for an in-progress
//!   snapshot (what a workload writes to `kudos.dev/progress`). A snapshot with work units is a
//!   measured rate, `elapsed / work done`, and needs no declared total and no extrapolation, so
//!   `kudos.dev/work` is optional. Without work units the whole run is the unit: a completed run
//!   took `end - start`; a run in progress is extrapolated as `elapsed / progress` and counts with
//!   weight `progress`. Work units are never combined with the progress fraction (no double
//!   extrapolation). The actual time is wall time from the reported start (container start).
//! * **One observation per run.** [`observe_run`] takes a run key (the run's ID, the same across
//!   its reports): a newer snapshot replaces the run's earlier one and the final report replaces
//!   them all, so a ten-hour run reported every minute is still one run. Snapshots older than the
//!   one held, and snapshots after the final report, are rejected as stale. The ledger of keyed
//!   runs is bounded (see [`crate::runs`]). Unkeyed reports ([`observe`]) each count as a run.
//! * **Validation.** Nothing a pod writes may poison the model: non-finite values, `end < start`,
//!   zero durations, progress outside [`MIN_PROGRESS`]..=1, work outside
//!   [`MIN_WORK_UNITS`]..=[`MAX_WORK_UNITS`] and busy time above the elapsed time are typed
//!   errors, and the model is untouched. The bounds keep every measure and every prediction
//!   made from it finite.
//! * **Bounded influence.** Once a class has a level, the log time per work unit is clipped to
//!   four standard deviations (at least a factor 10) of the current prediction before it is stored,
//!   and every cell's estimate is a robust M-estimate over a window, so one run cannot move any
//!   estimate far.
//! * **Actual review.** Good when the per-unit time is at most the class threshold factor times
//!   the fastest per-unit time known for the class (over device profiles). When that reference
//!   moves, every node of the class is re-judged from its stored runs, so old reviews never
//!   contradict what the model now knows; a node whose run was replaced is re-judged too.
//! * **Third queue.** The nodes whose reviews changed, with their new score (the exploit-only
//!   score against the class reference), best first. The first queue reads the same state, so the
//!   next ranking of the class already includes them.

use std::sync::Arc;

use thiserror::Error;

use crate::config::SchedulerConfig;
use crate::predict::{
    ModelState, NodeCell, Obs, Window, class_key, predict_node, predict_profile,
    predict_profile_for,
};
use crate::review::good_probability;
use crate::runs::RunEntry;
use crate::score::{decay, good_rate, to_score};
use crate::types::{Feedback, Review, RunObservation, Timestamp};

/// When an observation refits the transfer model (see [`crate::Scheduler::observe_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refit {
    /// The whole fit on every observation: each one's predictions see every earlier run.
    /// Costs every (class, profile) cell of the model per run, about 1 ms at 1,000 classes.
    EveryRun,
    /// Only the observed class's level (its effect against the current profile effects, and
    /// its fastest cell, which the run's review is made against) per run, costing that class's
    /// cells; the profile effects, the interaction spread and the similar-class rows wait for
    /// [`crate::Scheduler::settle`], which makes the whole fit once for every run since. Until then the
    /// next runs' clipping and third queues use profile effects that lack the runs since the
    /// last settle. A model must be settled before it ranks.
    Deferred,
}

/// Clip of one observation around the prediction, in prediction standard deviations.
const CLIP_SDS: f64 = 4.0;
/// Minimum clip half-width in log space (a factor 10).
const MIN_CLIP: f64 = std::f64::consts::LN_10;

/// Log change of the class reference that triggers re-judging all its nodes (1%).
const REJUDGE_TOLERANCE: f64 = 0.01;

/// Why a run report was rejected. The model is unchanged when `observe` fails.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ObserveError {
    /// A timestamp or measure is NaN or infinite.
    #[error("{field} is not a finite number")]
    NonFinite {
        /// The field.
        field: &'static str,
    },
    /// The run ends before it starts.
    #[error("end {end} is before start {start}")]
    EndBeforeStart {
        /// Start.
        start: f64,
        /// End.
        end: f64,
    },
    /// The run took no time.
    #[error("the run has zero duration")]
    ZeroDuration,
    /// Progress must be in [`MIN_PROGRESS`]..=1.
    #[error("progress {0} is outside 1e-6..=1")]
    ProgressOutOfRange(f64),
    /// A run in progress must say how far it is.
    #[error("a run in progress needs its progress")]
    MissingProgress,
    /// Work must be in [`MIN_WORK_UNITS`]..=[`MAX_WORK_UNITS`].
    #[error("work_units {0} is outside 1e-6..=1e15")]
    InvalidWork(f64),
    /// Busy time must be within 0..=elapsed.
    #[error("gpu_busy_seconds {busy} is outside 0..={elapsed}")]
    InvalidBusy {
        /// Reported busy seconds.
        busy: f64,
        /// Elapsed seconds.
        elapsed: f64,
    },
    /// Node or class is empty.
    #[error("{0} must not be empty")]
    Empty(&'static str),
    /// The run key already has a newer snapshot or its final report.
    #[error("run {key:?} already has a {held} report; this one is stale")]
    Stale {
        /// The run key.
        key: String,
        /// What the model holds: `newer` or `final`.
        held: &'static str,
    },
}

/// Least progress a snapshot may report: earlier, extrapolating the whole run's time from it
/// (`elapsed / progress`) says nothing, and at the smallest numbers it overflows.
pub const MIN_PROGRESS: f64 = 1e-6;
/// Least and most work units a run may report. Wide enough for any unit a class picks (epochs,
/// steps, samples, tokens), and narrow enough that seconds per unit and the predicted seconds
/// of a pod (per-unit time times its declared work) stay finite.
pub const MIN_WORK_UNITS: f64 = 1e-6;
/// See [`MIN_WORK_UNITS`].
pub const MAX_WORK_UNITS: f64 = 1e15;

fn finite(field: &'static str, v: f64) -> Result<f64, ObserveError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(ObserveError::NonFinite { field })
    }
}

/// What one report measures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measured {
    /// Whole-run compute time, seconds: the elapsed time of a completed run; for a run in
    /// progress, `elapsed / progress` when the fraction is known, else the elapsed time so far.
    pub actual_seconds: f64,
    /// `ln(seconds per work unit)`, or of the whole run's seconds without work units.
    pub log_per_unit: f64,
    /// Weight of the observation in (0, 1].
    pub weight: f64,
}

/// Validates a run and returns `(actual seconds, weight)` (see [`measure`]).
pub fn actual_time(run: &RunObservation) -> Result<(f64, f64), ObserveError> {
    measure(run).map(|m| (m.actual_seconds, m.weight))
}

/// Validates a run and measures it (see the module docs for the units).
pub fn measure(run: &RunObservation) -> Result<Measured, ObserveError> {
    if run.node.is_empty() {
        return Err(ObserveError::Empty("node"));
    }
    if run.class.is_empty() {
        return Err(ObserveError::Empty("class"));
    }
    let start = finite("start", run.start)?;
    let end = finite("end", run.end)?;
    if end < start {
        return Err(ObserveError::EndBeforeStart { start, end });
    }
    let elapsed = end - start;
    if elapsed <= 0.0 {
        return Err(ObserveError::ZeroDuration);
    }
    if let Some(w) = run.work_units
        && !(MIN_WORK_UNITS..=MAX_WORK_UNITS).contains(&w)
    {
        return Err(ObserveError::InvalidWork(w));
    }
    if let Some(b) = run.gpu_busy_seconds
        && (!b.is_finite() || b < 0.0 || b > elapsed * (1.0 + 1e-9))
    {
        return Err(ObserveError::InvalidBusy { busy: b, elapsed });
    }
    let progress = match run.progress {
        Some(p) if (MIN_PROGRESS..=1.0).contains(&p) => Some(p),
        Some(p) => return Err(ObserveError::ProgressOutOfRange(p)),
        None => None,
    };
    let (actual_seconds, weight) = if run.completed {
        (elapsed, 1.0)
    } else {
        match (progress, run.work_units) {
            (Some(p), _) => (elapsed / p, p),
            // A measured rate: as good a per-unit time as a finished run's.
            (None, Some(_)) => (elapsed, 1.0),
            (None, None) => return Err(ObserveError::MissingProgress),
        }
    };
    let log_per_unit = match run.work_units {
        // Work done by `end`, over the time it took: never extrapolated.
        Some(w) => (elapsed / w).ln(),
        None => actual_seconds.ln(),
    };
    // The bounds above keep these finite; checked anyway, since one infinite time would turn
    // the class's fit into NaN and panic a later clamp (found by fuzzing the gRPC ingestion:
    // a snapshot with 2e-312 work units, before work had a lower bound).
    Ok(Measured {
        actual_seconds: finite("actual_seconds", actual_seconds)?,
        log_per_unit: finite("seconds per work unit", log_per_unit)?,
        weight,
    })
}

/// Recomputes a node's decayed reviews as of `now` from its stored runs against `ln_ref`.
fn rejudge(cell: &mut NodeCell, ln_ref: f64, now: f64, half_life: f64) {
    let (mut good, mut bad) = (0.0, 0.0);
    for o in &cell.window.obs {
        let w = o.w * decay(now - o.t, half_life);
        if o.x <= ln_ref {
            good += w;
        } else {
            bad += w;
        }
    }
    cell.good = good;
    cell.bad = bad;
    cell.t_ref = now;
}

/// Applies one unkeyed report to the model: it counts as a run of its own (see
/// [`crate::Scheduler::observe`]).
pub fn observe(
    config: &SchedulerConfig,
    state: &mut ModelState,
    run: &RunObservation,
    now: Timestamp,
) -> Result<Feedback, ObserveError> {
    observe_run(config, state, None, run, now, Refit::EveryRun)
}

/// Withdraws a keyed run's current observation from its cells (see [`crate::runs`]).
fn withdraw(state: &mut ModelState, entry: &RunEntry) {
    if let Some(class) = state.classes.get_mut(&entry.class_key) {
        if let Some(cell) = class.cells.get_mut(&entry.profile_key) {
            cell.window.remove_run(entry.id);
        }
        if let Some(node) = Arc::make_mut(&mut class.nodes).get_mut(&entry.node) {
            node.window.remove_run(entry.id);
        }
    }
}

/// Applies one report of the run `run_key` (or an unkeyed report) to the model: the run's
/// previous observation, if any, is replaced (see [`crate::Scheduler::observe_run`]).
pub fn observe_run(
    config: &SchedulerConfig,
    state: &mut ModelState,
    run_key: Option<&str>,
    run: &RunObservation,
    now: Timestamp,
    refit: Refit,
) -> Result<Feedback, ObserveError> {
    let m = measure(run)?;
    let (actual, weight, raw_x) = (m.actual_seconds, m.weight, m.log_per_unit);
    let now = finite("now", now)?;
    let key = run.profile.key();
    let previous = match run_key.and_then(|k| state.ledger.get(k).map(|e| (k, e))) {
        Some((k, e)) if e.completed || e.end > run.end => {
            return Err(ObserveError::Stale {
                key: k.to_owned(),
                held: if e.completed { "final" } else { "newer" },
            });
        }
        Some((_, e)) => Some(e.clone()),
        None => None,
    };
    if refit == Refit::EveryRun {
        // A refit owed by deferred observations comes first: this one's refit recomputes only
        // its own class's similar-class row.
        state.settle(config);
    }
    if let Some(e) = &previous {
        withdraw(state, e);
    }
    let id = run_key.map_or(0, crate::runs::run_id);

    // Bounded influence: clip around the current node prediction.
    let class_key = class_key(&run.class, run.gpus).into_owned();
    let lookup = state.class_for(&run.class, run.gpus);
    let class_state = lookup.own;
    let prof = predict_profile_for(state, config, lookup, &run.profile, &key);
    let node_cell = class_state.and_then(|c| c.nodes.get(&run.node));
    let pred = predict_node(prof, node_cell, &key, config.min_own_runs);
    // The first run of a class (at this GPU count) sets its level: there is nothing to protect
    // yet, and the cold-start level is a placeholder, not evidence.
    let x = if class_state.is_some_and(|c| c.effect.is_some()) {
        let half = (CLIP_SDS * (pred.sd * pred.sd + 0.01).sqrt()).max(MIN_CLIP);
        raw_x.clamp(pred.mean - half, pred.mean + half)
    } else {
        raw_x
    };
    let obs = Obs {
        x,
        w: weight,
        t: run.end,
        run: id,
    };
    if let Some(k) = run_key {
        let entry = RunEntry {
            class_key: class_key.clone(),
            node: run.node.clone(),
            profile_key: key.clone(),
            id,
            end: run.end,
            completed: run.completed,
            seq: 0,
        };
        for gone in state.ledger.insert(k, entry, config.max_tracked_runs) {
            // A run forgotten while in progress must not linger as half a run.
            if !gone.completed {
                withdraw(state, &gone);
            }
        }
    }
    // A replaced snapshot's node is re-judged from its window below, never counted twice;
    // and a run is one run however many snapshots of it arrive.
    let first_report = previous.is_none();
    let replaced_node = previous.map(|e| e.node);

    let window = config.history_window;
    if !state.classes.contains_key(&class_key) {
        state.evict_classes_beyond(config.max_classes.saturating_sub(1));
    }
    let new_cell = !state
        .classes
        .get(&class_key)
        .is_some_and(|c| c.nodes.contains_key(&run.node));
    if new_cell {
        state.evict_node_cells_beyond(config.max_node_cells.saturating_sub(1));
    }
    let class = state.classes.entry(class_key.clone()).or_default();
    class.last_seen = class.last_seen.max(run.end);
    class
        .cells
        .entry(key.clone())
        .or_insert_with(|| crate::predict::Cell {
            profile: run.profile.clone(),
            window: Window::default(),
        })
        .window
        .push(obs.clone(), window);
    let cell = Arc::make_mut(&mut class.nodes)
        .entry(run.node.clone())
        .or_insert_with(|| NodeCell {
            profile_key: key.clone(),
            window: Window::default(),
            good: 0.0,
            bad: 0.0,
            t_ref: now,
        });
    if cell.profile_key != key {
        // The node's hardware changed: its old runs say nothing about it now.
        *cell = NodeCell {
            profile_key: key.clone(),
            window: Window::default(),
            good: 0.0,
            bad: 0.0,
            t_ref: now,
        };
    }
    cell.window.push(obs, window);
    let runs_before = state.runs;
    if first_report {
        state.runs += 1;
    }
    match refit {
        Refit::EveryRun => state.refit(config, Some(&class_key)),
        Refit::Deferred => state.refit_deferred(config, &class_key, runs_before),
    }

    let factor = config.threshold_factor_for(&run.class);
    let half_life = config.review_half_life_seconds;
    let class = state
        .classes
        .get_mut(&class_key)
        .expect("class inserted above");
    let best = class.best.unwrap_or(x);
    let ln_ref = best + factor.ln();
    let review = if x <= ln_ref {
        Review::Good
    } else {
        Review::Bad
    };
    // Re-judge every node only when the reference moved by more than 1% since the last time
    // (every run on the fastest profile nudges it; re-judging on each nudge would churn the
    // whole class's reviews for nothing).
    let moved = class
        .judged
        .is_none_or(|b| (b - best).abs() > REJUDGE_TOLERANCE);
    if moved {
        class.judged = Some(best);
    }
    let mut touched: Vec<String> = Vec::new();
    if moved {
        for (name, cell) in Arc::make_mut(&mut class.nodes).iter_mut() {
            rejudge(cell, ln_ref, now, half_life);
            touched.push(name.clone());
        }
    } else if let Some(name) = replaced_node {
        for n in [name, run.node.clone()] {
            if let Some(cell) = Arc::make_mut(&mut class.nodes).get_mut(&n)
                && !touched.contains(&n)
            {
                rejudge(cell, ln_ref, now, half_life);
                touched.push(n);
            }
        }
    } else if let Some(cell) = Arc::make_mut(&mut class.nodes).get_mut(&run.node) {
        let d = decay(now - cell.t_ref, half_life);
        cell.good *= d;
        cell.bad *= d;
        cell.t_ref = now;
        match review {
            Review::Good => cell.good += weight,
            Review::Bad => cell.bad += weight,
        }
        touched.push(run.node.clone());
    }

    // Third queue: re-scored nodes, exploit-only, against the class reference.
    let state_ro: &ModelState = state;
    let class = &state_ro.classes[&class_key];
    let mut third: Vec<(String, u8)> = touched
        .into_iter()
        .filter_map(|name| {
            let cell = class.nodes.get(&name)?;
            let cell_profile = &class.cells.get(&cell.profile_key)?.profile;
            let p = predict_profile(
                state_ro,
                config,
                Some(class),
                cell_profile,
                &cell.profile_key,
            );
            let p = predict_node(p, Some(cell), &cell.profile_key, config.min_own_runs);
            let p_good = good_probability(p.mean, p.sd, ln_ref);
            let rate = good_rate(
                &config.beta_prior,
                cell.good,
                cell.bad,
                p_good,
                config.prediction_review_weight,
            );
            Some((name, to_score(rate)))
        })
        .collect();
    third.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(Feedback {
        actual_seconds: actual,
        review,
        third_queue: third,
    })
}
