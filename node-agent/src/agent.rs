//! The sampling loop: once per period, read the GPUs, ask the kubelet who holds them, advance
//! the runs, store their reports in the outbox, publish metrics.
//!
//! The kubelet being briefly unreachable, or restarting, must not end runs: a failed
//! PodResources call neither starts a run nor counts towards ending one (the per-pod metrics
//! keep the last known holders), and a successful listing that lacks a run only starts its
//! grace period ([`crate::runs`] says when it ends). Until the first successful call no run is
//! started or ended at all (runs resumed after a restart wait for real data). A report the
//! outbox cannot take right now (disk error) is kept in memory and retried next period.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kudos_proto::kudos::v1::{RunReport, RunState};
use tokio::sync::watch;
use tracing::Instrument;

use crate::attribution::{Assignment, AssignmentSource, device_id_to_uuid};
use crate::metrics::{Holder, Metrics};
use crate::outbox::Outbox;
use crate::podmeta::PodMetaSource;
use crate::runs::RunTracker;
use crate::sample::Sampler;
use crate::sender::DeviceHealth;

/// Reports kept in memory while the outbox cannot be written, at most.
const MAX_UNSAVED: usize = 10_000;

/// Everything one sampling loop needs.
pub struct Agent<A: AssignmentSource> {
    node: String,
    sampler: Sampler,
    assignments: A,
    meta: Arc<dyn PodMetaSource>,
    tracker: RunTracker,
    outbox: Arc<Outbox>,
    metrics: Arc<Metrics>,
    health: Arc<DeviceHealth>,
    last: Option<Vec<Assignment>>,
    list_failing: bool,
    unsaved: Vec<RunReport>,
}

fn label(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

impl<A: AssignmentSource> Agent<A> {
    /// Assembles an agent and resumes the runs that were active when it last stopped.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        node: String,
        sampler: Sampler,
        assignments: A,
        meta: Arc<dyn PodMetaSource>,
        mut tracker: RunTracker,
        outbox: Arc<Outbox>,
        metrics: Arc<Metrics>,
        health: Arc<DeviceHealth>,
    ) -> Self {
        match outbox.load_active() {
            Ok(saved) if !saved.is_empty() => {
                tracing::info!(
                    runs = saved.len(),
                    "resuming runs active before the restart"
                );
                tracker.restore(saved);
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "cannot read saved runs; they restart from now"),
        }
        health.total.store(
            u32::try_from(sampler.devices().len()).unwrap_or(u32::MAX),
            Ordering::Relaxed,
        );
        metrics
            .outbox_capacity
            .set(i64::try_from(outbox.capacity()).unwrap_or(i64::MAX));
        Self {
            node,
            sampler,
            assignments,
            meta,
            tracker,
            outbox,
            metrics,
            health,
            last: None,
            list_failing: false,
            unsaved: Vec::new(),
        }
    }

    /// One sampling round.
    pub async fn tick(&mut self) {
        let t0 = Instant::now();
        let readings = self.sampler.sample_all().await;
        let now = crate::now_ms();
        let listed = match self.assignments.list().await {
            Ok(mut a) => {
                crate::attribution::resolve_dra_names(
                    &mut a,
                    readings.iter().map(|r| r.info.uuid.as_str()),
                );
                if self.list_failing {
                    tracing::info!(
                        "PodResources reachable again; it may lack pods until the kubelet re-syncs"
                    );
                }
                self.list_failing = false;
                self.last = Some(a);
                true
            }
            Err(e) => {
                self.metrics.podresources_errors.inc();
                if !self.list_failing {
                    tracing::warn!(error = %e, "cannot list pod resources; runs are kept as they are");
                }
                self.list_failing = true;
                false
            }
        };
        let mut holders = HashMap::new();
        for a in self.last.iter().flatten() {
            for id in &a.device_ids {
                let h = Holder {
                    pod: a.pod.clone(),
                    namespace: a.namespace.clone(),
                    container: a.container.clone(),
                };
                holders.insert(device_id_to_uuid(id).to_owned(), h);
            }
        }
        self.metrics.record(&readings, &holders, now);
        let healthy = readings.iter().filter(|r| r.result.is_ok()).count();
        self.health.healthy.store(
            u32::try_from(healthy).unwrap_or(u32::MAX),
            Ordering::Relaxed,
        );

        if let Some(assignments) = &self.last {
            let meta = self.meta.as_ref();
            let out = if listed {
                self.tracker.observe(now, assignments, meta, &readings)
            } else {
                self.tracker.observe_unlisted(now, meta, &readings)
            };
            for e in &out.ended {
                let state = if e.state == RunState::Failed {
                    "failed"
                } else {
                    "completed"
                };
                let source = e.time_source.as_str();
                self.metrics
                    .runs_ended
                    .get_or_create(&label(&[("state", state), ("time_source", source)]))
                    .inc();
            }
            let save = out.changed || !out.reports.is_empty();
            self.unsaved.extend(out.reports);
            self.store().await;
            if save {
                let snaps = self.tracker.active_snapshots(now);
                let ob = self.outbox.clone();
                match tokio::task::spawn_blocking(move || ob.save_active(&snaps)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "cannot save active runs"),
                    Err(e) => tracing::warn!(error = %e, "saving active runs failed"),
                }
            }
        }
        self.metrics
            .runs_active
            .set(i64::try_from(self.tracker.active()).unwrap_or(i64::MAX));
        self.metrics
            .outbox_depth
            .set(i64::try_from(self.outbox.depth()).unwrap_or(i64::MAX));
        self.metrics
            .sample_duration
            .observe(t0.elapsed().as_secs_f64());
    }

    /// Moves pending reports into the outbox.
    async fn store(&mut self) {
        if self.unsaved.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.unsaved);
        let ob = self.outbox.clone();
        let (batch, result) = match tokio::task::spawn_blocking(move || {
            let r = ob.push(&batch);
            (batch, r)
        })
        .await
        {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "outbox task failed; reports of this period lost");
                self.metrics.outbox_errors.inc();
                return;
            }
        };
        match result {
            Ok(out) => {
                for id in &out.dropped_snapshots {
                    tracing::warn!(report_id = %id, "outbox full: dropped an in-progress snapshot");
                    self.metrics
                        .outbox_dropped
                        .get_or_create(&label(&[("state", "in_progress"), ("reason", "full")]))
                        .inc();
                }
                for r in &out.refused {
                    tracing::error!(
                        report_id = %r.report_id, run_id = %r.run_id, pod = %r.pod_name, namespace = %r.pod_namespace,
                        class = %r.class, depth = self.outbox.depth(),
                        "outbox full of completed runs: this run report is LOST; raise --outbox-max-reports or restore the orchestrator"
                    );
                    self.metrics
                        .outbox_dropped
                        .get_or_create(&label(&[("state", "completed"), ("reason", "full")]))
                        .inc();
                }
            }
            Err(e) => {
                self.metrics.outbox_errors.inc();
                tracing::error!(error = %e, reports = batch.len(), "cannot write the outbox; retrying next period");
                let keep = MAX_UNSAVED.saturating_sub(self.unsaved.len());
                self.unsaved.extend(batch.into_iter().take(keep));
            }
        }
    }

    /// Samples every `period` until `shutdown` turns true, then saves the active runs (they are
    /// resumed, not ended, by the next agent).
    pub async fn run(mut self, period: Duration, mut shutdown: watch::Receiver<bool>) {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let span = tracing::info_span!("sampling", node = %self.node);
        loop {
            tokio::select! {
                _ = interval.tick() => self.tick().instrument(span.clone()).await,
                _ = crate::stopped(&mut shutdown) => break,
            }
        }
        let snaps = self.tracker.active_snapshots(crate::now_ms());
        if let Err(e) = self.outbox.save_active(&snaps) {
            tracing::warn!(error = %e, "cannot save active runs at shutdown");
        }
    }
}

#[cfg(test)]
mod tests;
