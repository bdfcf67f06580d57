//! Pure scheduling algorithms for Kudos: the patent's steps as a library.
//!
//! Steps are numbered as in the design document's flows, one numbering for the whole codebase:
//! §2.1 registration and rollout (steps 1-7), §2.2 scheduling (steps 1-6), §2.3 feedback
//! (steps 1-3). A bare "step N" in this crate means §2.2 step N.
//!
//! No I/O, no async, no clock (time is an argument), seedable randomness, `serde` for the learned
//! state. The orchestrator (extender, feedback ingestion, `/explain`) and the simulator both drive
//! the [`Scheduler`] facade; nothing else re-implements these steps.
//!
//! | Design step | Module | What |
//! | --- | --- | --- |
//! | §2.2 step 1 | [`nodeset`] | nodes that fit the pod and whose devices the class allows |
//! | §2.2 step 2 | [`predict`], [`prior`], `transfer` | first model: time, uncertainty, source |
//! | §2.2 step 3 | [`review`] | good / bad against a deadline or the best candidate |
//! | §2.2 step 4 | [`score`] | second model: decayed good-review rate, Beta prior, exploration |
//! | §2.2 step 5 | [`queue`] | first queue, default plugins (second queue), merge |
//! | §2.2 steps 1-5 | `rank` | the steps above composed, one function each; [`Ranking::to_table`] |
//! | §2.2 step 6 | [`place`] | one node, or k gang slots together with an expiry |
//! | §2.3 step 3 | [`feedback`] | actual time, model update, actual review, third queue |
//!
//! Start with [`Scheduler::rank`] and [`Scheduler::observe_run`].
//!
//! Rejected nodes carry a [`RejectionKind`] ([`RejectionKind::is_permanent`] marks the
//! mismatches an extender reports as unresolvable); predictions take the pod's GPU count into
//! account ([`Scheduler::predict_gpus`]; see [`predict`]).
//!
//! Beyond the shared contract the crate offers [`Scheduler::try_new`] (validate, then build),
//! read-only summaries of [`ModelState`] (`classes`, `runs`, `node_runs`) and the building blocks
//! as public modules ([`queue`] reproduces kube-scheduler's default scoring, [`prior`] holds the
//! capability table) so `/explain` and the simulator can show intermediate results.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod config;
pub mod feedback;
mod name;
pub mod nodeset;
pub mod place;
pub mod predict;
pub mod prior;
pub mod queue;
mod rank;
pub mod review;
mod runs;
pub mod score;
mod transfer;
pub mod types;
pub mod vendor_outcomes;

pub use config::{BetaPrior, ClassConfig, ConfigError, Exploration, MergeWeights, SchedulerConfig};
pub use feedback::{ObserveError, Refit};
pub use name::{Name, tail_word};
pub use place::PlaceError;
pub use predict::ModelState;
pub use rank::LazyRanking;
pub use types::{
    DeviceProfile, Feedback, GangPlacement, GangSlot, GangSpec, NodeHealth, NodeState, PodSpec,
    Prediction, PredictionSource, RankEntry, Ranking, Rejection, RejectionKind, Review,
    RunObservation, Timestamp,
};

use std::borrow::Borrow;

use serde::{Deserialize, Serialize};

/// The scheduler: a validated configuration and the learned model state.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Scheduler {
    config: SchedulerConfig,
    state: ModelState,
}

impl Scheduler {
    /// A scheduler with an empty history. Validate the configuration first
    /// ([`SchedulerConfig::validate`]); [`Scheduler::try_new`] does both.
    pub fn new(config: SchedulerConfig) -> Self {
        Self::with_state(config, ModelState::default())
    }

    /// Validates the configuration and builds a scheduler.
    pub fn try_new(config: SchedulerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self::new(config))
    }

    /// A scheduler resuming from persisted state. The transfer model is refitted under the given
    /// configuration (which may have changed since the state was saved).
    pub fn with_state(config: SchedulerConfig, state: ModelState) -> Self {
        let mut s = Self { config, state };
        if s.state.runs > 0 {
            s.state.refit(&s.config, None);
        }
        s
    }

    /// The learned state, for persistence.
    pub fn state(&self) -> &ModelState {
        &self.state
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// §2.2 steps 1-5: the recommended queue for `pod` over `nodes`, best first. Deterministic for a
    /// given seed and independent of the order of `nodes`. Unfit nodes (no room, class forbids
    /// their devices, too little device memory, unhealthy, stale) go to `rejected` with a reason.
    /// `nodes` may be the states themselves or anything that borrows them (a caller that keeps
    /// them need not copy them into a call).
    // Never inlined: `scripts/bench-gate` counts the instructions inside this function, which,
    // being generic, would otherwise be inlined into its callers.
    #[inline(never)]
    pub fn rank(
        &self,
        pod: &PodSpec,
        nodes: &[impl Borrow<NodeState>],
        now: Timestamp,
        seed: u64,
    ) -> Ranking {
        rank::rank_lazily(&self.config, &self.state, pod, nodes, now, seed)
            .into_ranking_named(|candidate| nodes.get(candidate).map(|n| n.borrow().name.clone()))
    }

    /// [`Scheduler::rank`] with the recommended queue ordered when first read and its entries
    /// written only when asked for: what a caller that needs each node's score, or the best
    /// few, reads without paying for every entry (see [`LazyRanking`]).
    pub fn rank_lazily(
        &self,
        pod: &PodSpec,
        nodes: &[impl Borrow<NodeState>],
        now: Timestamp,
        seed: u64,
    ) -> LazyRanking {
        rank::rank_lazily(&self.config, &self.state, pod, nodes, now, seed)
    }

    /// §2.2 step 6: one node for a single pod; for a gang, `size` slots together, one device profile
    /// preferred, minimising the slowest member's predicted time; expires at `now + TTL`.
    pub fn place_gang(
        &self,
        pod: &PodSpec,
        nodes: &[impl Borrow<NodeState>],
        now: Timestamp,
        seed: u64,
    ) -> Result<GangPlacement, PlaceError> {
        let ranking = self.rank(pod, nodes, now, seed);
        place::place(
            &ranking,
            nodes,
            pod,
            self.config.gang_profile_tolerance,
            self.config.gang_reservation_ttl_seconds,
            now,
        )
    }

    /// §2.3 step 3: learn from a completed or in-progress run. Invalid reports are rejected with a
    /// typed error and leave the model untouched.
    pub fn observe(
        &mut self,
        run: &RunObservation,
        now: Timestamp,
    ) -> Result<Feedback, ObserveError> {
        feedback::observe(&self.config, &mut self.state, run, now)
    }

    /// Counts a final run (completed or failed) of `class` on `vendor`'s devices: repeated
    /// failures on one vendor, where the class completes on another, exclude that vendor for the
    /// class's pods that name no vendors (see [`vendor_outcomes`]).
    pub fn record_outcome(&mut self, class: &str, vendor: &str, completed: bool) {
        self.state.vendor_outcomes.record(class, vendor, completed);
    }

    /// Step 7 for a run identified by `run_key` (its ID, the same in every report of the run):
    /// an in-progress snapshot replaces the run's earlier one, and the final report replaces
    /// them all, so each run counts once however often it reports. Stale snapshots (older than
    /// the one held, or after the final report) are rejected with [`ObserveError::Stale`].
    pub fn observe_run(
        &mut self,
        run_key: &str,
        run: &RunObservation,
        now: Timestamp,
    ) -> Result<Feedback, ObserveError> {
        feedback::observe_run(
            &self.config,
            &mut self.state,
            Some(run_key),
            run,
            now,
            Refit::EveryRun,
        )
    }

    /// [`Scheduler::observe_run`] (or, without `run_key`, [`Scheduler::observe`]) with the
    /// refit chosen: [`Refit::Deferred`] is for a learner that publishes a copy of the model
    /// now and then and calls [`Scheduler::settle`] before each copy.
    pub fn observe_with(
        &mut self,
        run_key: Option<&str>,
        run: &RunObservation,
        now: Timestamp,
        refit: Refit,
    ) -> Result<Feedback, ObserveError> {
        feedback::observe_run(&self.config, &mut self.state, run_key, run, now, refit)
    }

    /// Makes the refit deferred observations owe (see [`Refit::Deferred`]); nothing on a
    /// settled model.
    pub fn settle(&mut self) {
        self.state.settle(&self.config);
    }

    /// Whether every observation's refit is made (no [`Refit::Deferred`] one is owed).
    pub fn is_settled(&self) -> bool {
        self.state.unsettled.is_none()
    }

    /// The current prediction for `(class, node, profile)` without a pod (metrics, MAPE).
    pub fn predict(
        &self,
        class: &str,
        node: &str,
        profile: &DeviceProfile,
        work_units: Option<f64>,
    ) -> Prediction {
        self.predict_gpus(class, 1, node, profile, work_units)
    }

    /// [`Scheduler::predict`] for a pod of `gpus` devices.
    pub fn predict_gpus(
        &self,
        class: &str,
        gpus: u32,
        node: &str,
        profile: &DeviceProfile,
        work_units: Option<f64>,
    ) -> Prediction {
        let key = profile.key();
        let lookup = self.state.class_for(class, gpus);
        let p = predict::predict_profile_for(&self.state, &self.config, lookup, profile, &key);
        let cell = lookup.own.and_then(|c| c.nodes.get(node));
        predict::predict_node(p, cell, &key, self.config.min_own_runs).to_prediction(work_units)
    }
}

#[cfg(test)]
mod tests;
