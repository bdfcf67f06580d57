//! Runs: from "devices assigned to a container" to "devices released", with a sample summary.
//!
//! [`RunTracker`] is a pure state machine fed once per sampling period with the time, the
//! current assignments, pod metadata and the device readings; it returns the reports to store.
//! Keeping it free of I/O and clocks makes the accounting (busy time, energy, peaks) testable
//! to the period.
//!
//! Accounting rules, each accurate to one sampling period:
//! - a run starts at the first tick its container holds the devices and ends when they are
//!   released or its pod has ended (see "When a run ends" below);
//! - every later tick covers the interval since the previous one (capped at three periods, so an
//!   agent stall is not booked as work); the interval counts as GPU-busy when any of the run's
//!   devices is above the busy threshold, and energy is the devices' power times the interval;
//! - a long run emits an in-progress snapshot every progress period, so the orchestrator can
//!   extrapolate before it ends.
//!
//! Reported times ([`run_window`]): a run's start and end are its container's own, so image
//! pulls and container creation are not booked as compute time, whenever the pod's status
//! gives them (`--pod-metadata kube`); otherwise the run's ticks, as above.
//! - Start: the `startedAt` of the container's first attempt. Its devices are held from then
//!   on, so after restarts (`restartCount` > 0) the run still counts from the first start,
//!   back-off and later attempts included; a status that no longer shows the first start
//!   (two or more restarts the agent did not see) leaves the run on its ticks.
//! - End: the current attempt's `finishedAt` when it has terminated, else the tick.
//! - The API's times are whole seconds, truncated. The agent's own view of the transition
//!   comes through that same status (kubelet relist, status update, watch, next tick) and
//!   lags it by up to a second or more, so the API's time is the better one: start and end
//!   truncated alike make their difference unbiased, within 1 s. A container that started and finished
//!   within one API second is reported as half a second (at most the time the agent saw).
//! - A start not before the tick (clock skew) leaves the run on its ticks: no reported run
//!   has a zero or negative duration. Busy time is capped at the reported wall time.
//!
//! When a run ends. A successful PodResources listing that lacks a run is weak evidence: a
//! restarted kubelet answers `List` before it has re-synced its pods (measured on v1.37: one
//! listing without the pod, a second after the socket came back), and a run must not be split
//! by that. A run is identified by namespace, pod, container and device set, and by the pod's
//! UID where the metadata gives one; it ends
//! - at once when its pod has ended (phase `Succeeded`/`Failed`), or when a listing shows its
//!   container holding a different device set, or its pod's name with another UID;
//! - while listings lack it ("missing"), when the pod's metadata says the container has
//!   terminated (its `finishedAt`) or the pod is gone from the API server (deleted). As long as
//!   the metadata shows the pod with its container not terminated, listings that lack it do
//!   not end it, however many;
//! - without metadata for its pod (`--pod-metadata none`, or a pod the watch has not shown),
//!   once it has been missing from every successful listing for the grace period
//!   (`RunConfig::end_grace`), counted only since PodResources last came back: a listing
//!   right after a kubelet restart does not end a run by itself, nor does a failed one.
//!
//! A missing run that is listed again with the same devices (and UID) continues: same run ID,
//! one report. A run that ends while missing, without a container finish to time it, is
//! reported as it stood at the first listing that lacked it (its end, busy time and energy),
//! so the grace delays the report, not the reported end. Snapshots pause while a run is
//! missing.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use kudos_proto::kudos::v1::{RunReport, RunState};

use crate::attribution::{Assignment, device_id_to_uuid};
use crate::podmeta::{ContainerTimes, PodMeta, PodMetaSource};
use crate::sample::{DeviceReading, DeviceSample};

/// Settings of the run accounting.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// This node's name, copied into every report.
    pub node: String,
    /// A device counts as busy above this utilisation, percent.
    pub busy_threshold_percent: f64,
    /// The sampling period (used to cap intervals).
    pub period: Duration,
    /// How often a running run emits an in-progress snapshot; `None` disables snapshots.
    pub progress_period: Option<Duration>,
    /// How long a run without pod metadata may be missing from successful PodResources
    /// listings before it ends (see the module docs); zero ends it at the first one.
    pub end_grace: Duration,
}

type RunKey = (String, String, String);

#[derive(Clone, Debug)]
struct Run {
    run_id: String,
    device_ids: Vec<String>,
    meta: PodMeta,
    models: Vec<String>,
    /// The first tick that saw the devices held (after a restore: the saved start).
    alloc_ms: i64,
    /// The container's status, its first start kept once seen.
    container: ContainerTimes,
    /// Time of the last accounted tick; `None` right after a restore.
    last_ms: Option<i64>,
    busy_s: f64,
    util_sum: f64,
    util_n: u64,
    peak_util: f64,
    peak_mem: u64,
    energy_j: f64,
    /// Last energy counter per device UUID, where the device has one.
    last_energy: HashMap<String, f64>,
    samples: u32,
    seq: u32,
    last_snapshot_ms: i64,
    /// Set while successful listings lack the run.
    missing: Option<Missing>,
    /// This process has seen the pod in the metadata, so its absence there means deleted.
    meta_seen: bool,
}

/// A run that successful listings lack.
#[derive(Clone, Debug)]
struct Missing {
    /// The first such listing.
    since_ms: i64,
    /// The run was resumed after an agent restart and never seen held since.
    unknown_end: bool,
    /// The run as accounted at that listing: what is reported if it ended there.
    at: Box<Run>,
}

/// Why a run ended, for the log.
#[derive(Clone, Copy, Debug)]
enum EndReason {
    PodEnded,
    Reallocated,
    ContainerFinished,
    PodDeleted,
    MissingPastGrace,
}

impl EndReason {
    fn as_str(self) -> &'static str {
        match self {
            Self::PodEnded => "pod ended",
            Self::Reallocated => "devices or pod changed",
            Self::ContainerFinished => "container finished, devices released",
            Self::PodDeleted => "pod deleted, devices released",
            Self::MissingPastGrace => "devices released (missing past the grace period)",
        }
    }
}

/// Where a run's reported start and end came from (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSource {
    /// The container's status: started/finished.
    Container,
    /// The agent's ticks: devices first seen held to released (today's fallback).
    Allocation,
}

impl TimeSource {
    /// The metric label and log value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Container => "container",
            Self::Allocation => "allocation",
        }
    }
}

/// A run that ended this tick, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndedRun {
    /// `Completed` or `Failed`.
    pub state: RunState,
    /// Where its times came from.
    pub time_source: TimeSource,
}

/// Most finished container attempts remembered (see [`RunTracker`]'s `finished`): far more
/// than the pods one node runs at once.
const MAX_FINISHED: usize = 4096;

/// A container that started and finished within one second of the API's clock is reported as
/// this long (the expected length of such a span), capped by what the agent saw.
const SUB_SECOND_MS: i64 = 500;

/// The `(start, end)` to report for a run first seen holding its devices at `alloc_ms`, at tick
/// `now_ms`, given its container's status; see the module docs. `end > start` whenever
/// `now_ms > alloc_ms`, and a container window never reaches past `now_ms`.
pub fn run_window(alloc_ms: i64, now_ms: i64, c: &ContainerTimes) -> (i64, i64, TimeSource) {
    if let Some(start) = c.first_start_ms.filter(|s| *s < now_ms) {
        let end = c
            .finished_ms
            .filter(|f| (start..=now_ms).contains(f))
            .unwrap_or(now_ms);
        let end = if end > start {
            end
        } else {
            (start + SUB_SECOND_MS).min(now_ms)
        };
        return (start, end, TimeSource::Container);
    }
    (alloc_ms, now_ms, TimeSource::Allocation)
}

/// What one tick produced.
#[derive(Debug, Default)]
pub struct TickOutput {
    /// Reports to store, completed ones and snapshots.
    pub reports: Vec<RunReport>,
    /// The runs that ended (one per completed or failed report).
    pub ended: Vec<EndedRun>,
    /// Runs started or ended this tick (the set of active runs changed).
    pub changed: bool,
}

/// Tracks active runs; see the module docs.
pub struct RunTracker {
    cfg: RunConfig,
    runs: HashMap<RunKey, Run>,
    /// Runs ended because their pod ended while the kubelet still listed the devices; they
    /// must not restart until the assignment goes away.
    ended: HashSet<(RunKey, Vec<String>)>,
    /// Container attempts whose run ended after the attempt finished, as (pod UID, restart
    /// count): the kubelet may list the devices again afterwards (a listing that lacked the pod
    /// once, then had it), and that must not start a second run of the same attempt. Kept
    /// while the pod's metadata shows the same UID; at most [`MAX_FINISHED`].
    finished: HashMap<RunKey, (String, i32)>,
    /// Since when PodResources has answered without a failure in between; `None` right after
    /// a failed listing.
    listing_ok_since: Option<i64>,
    rng_state: u64,
}

fn key_of(a: &Assignment) -> RunKey {
    (a.namespace.clone(), a.pod.clone(), a.container.clone())
}

impl RunTracker {
    /// A tracker with no active runs.
    pub fn new(cfg: RunConfig) -> Self {
        Self {
            cfg,
            runs: HashMap::new(),
            ended: HashSet::new(),
            finished: HashMap::new(),
            listing_ok_since: None,
            rng_state: random_seed(),
        }
    }

    /// Number of runs in progress.
    pub fn active(&self) -> usize {
        self.runs.len()
    }

    fn new_run_id(&mut self) -> String {
        // splitmix64: IDs only need to be unique, the seed comes from the OS.
        let mut next = || {
            self.rng_state = self.rng_state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.rng_state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let (a, b) = (next(), next());
        format!("{a:016x}{b:016x}")
    }

    /// Feeds one tick with a successful PodResources listing; returns the reports it produced.
    pub fn observe(
        &mut self,
        now_ms: i64,
        assignments: &[Assignment],
        meta: &dyn PodMetaSource,
        readings: &[DeviceReading],
    ) -> TickOutput {
        self.tick(now_ms, Some(assignments), meta, readings)
    }

    /// Feeds one tick whose PodResources listing failed: the runs are accounted as they stand
    /// and can end only on their pod's metadata; none starts, and none advances towards ending
    /// by absence.
    pub fn observe_unlisted(
        &mut self,
        now_ms: i64,
        meta: &dyn PodMetaSource,
        readings: &[DeviceReading],
    ) -> TickOutput {
        self.tick(now_ms, None, meta, readings)
    }

    fn tick(
        &mut self,
        now_ms: i64,
        listing: Option<&[Assignment]>,
        meta: &dyn PodMetaSource,
        readings: &[DeviceReading],
    ) -> TickOutput {
        let mut out = TickOutput::default();
        let by_uuid: HashMap<&str, &DeviceReading> =
            readings.iter().map(|r| (r.info.uuid.as_str(), r)).collect();
        // Device lists are compared as sets: sort them whatever the source did.
        let sorted: Vec<Assignment> = listing
            .unwrap_or_default()
            .iter()
            .map(|a| {
                let mut a = a.clone();
                a.device_ids.sort();
                a
            })
            .collect();
        let current: Option<HashMap<RunKey, &Assignment>> =
            listing.map(|_| sorted.iter().map(|a| (key_of(a), a)).collect());
        match &current {
            Some(cur) => {
                self.listing_ok_since.get_or_insert(now_ms);
                self.ended
                    .retain(|(k, ids)| cur.get(k).is_some_and(|a| &a.device_ids == ids));
            }
            None => self.listing_ok_since = None,
        }
        let grace_ms = i64::try_from(self.cfg.end_grace.as_millis()).unwrap_or(i64::MAX);
        self.finished.retain(|k, (uid, _)| {
            meta.get(&k.0, &k.1)
                .is_some_and(|m| m.uid == *uid && !m.ended)
        });

        // Account the interval for every run that was already going, note which ones the
        // listing lacks, then end those that are over (see the module docs).
        let keys: Vec<RunKey> = self.runs.keys().cloned().collect();
        for key in keys {
            let pod_meta = meta.get(&key.0, &key.1);
            let Some(run) = self.runs.get_mut(&key) else {
                continue;
            };
            // A pod re-created under the same name is another pod: its metadata is not this
            // run's, and this run's pod is gone.
            let replaced = pod_meta.as_ref().is_some_and(|m| {
                !m.uid.is_empty() && !run.meta.uid.is_empty() && m.uid != run.meta.uid
            });
            let pod_meta = pod_meta.filter(|_| !replaced);
            if let Some(m) = &pod_meta {
                merge_meta(&mut run.meta, m);
                if let Some(c) = m.containers.get(&key.2) {
                    merge_times(&mut run.container, c);
                }
                run.meta_seen = true;
            }
            let deleted = replaced || (pod_meta.is_none() && run.meta_seen);
            let unknown_end = run.last_ms.is_none();
            account(run, now_ms, &self.cfg, &by_uuid);

            let mut reallocated = false;
            match current.as_ref().map(|c| c.get(&key)) {
                Some(Some(a)) if a.device_ids == run.device_ids && !replaced => {
                    if let Some(m) = run.missing.take() {
                        tracing::info!(
                            run_id = %run.run_id, namespace = %key.0, pod = %key.1,
                            container = %key.2, missing_s = (now_ms - m.since_ms) as f64 / 1000.0,
                            "run listed again by PodResources; it continues"
                        );
                    }
                }
                Some(Some(_)) => reallocated = true,
                Some(None) if run.missing.is_none() => {
                    tracing::info!(
                        run_id = %run.run_id, namespace = %key.0, pod = %key.1,
                        container = %key.2,
                        "run missing from the PodResources listing; kept open until it is \
                         listed again, its pod says it ended or the grace period passes"
                    );
                    run.missing = Some(Missing {
                        since_ms: now_ms,
                        unknown_end,
                        at: Box::new(run.clone()),
                    });
                }
                Some(None) | None => {}
            }

            let pod_ended = pod_meta.as_ref().is_some_and(|m| m.ended);
            let finished = run.container.finished_ms.is_some();
            let reason = if pod_ended {
                Some(EndReason::PodEnded)
            } else if reallocated {
                Some(EndReason::Reallocated)
            } else if let Some(m) = &run.missing {
                if deleted {
                    Some(EndReason::PodDeleted)
                } else if pod_meta.is_some() {
                    finished.then_some(EndReason::ContainerFinished)
                } else {
                    let from = self.listing_ok_since.map(|ok| ok.max(m.since_ms));
                    from.filter(|f| now_ms - f >= grace_ms)
                        .map(|_| EndReason::MissingPastGrace)
                }
            } else {
                None
            };

            let Some(reason) = reason else {
                if let Some(p) = self.cfg.progress_period
                    && run.missing.is_none()
                    && now_ms - run.last_snapshot_ms
                        >= i64::try_from(p.as_millis()).unwrap_or(i64::MAX)
                {
                    run.seq += 1;
                    run.last_snapshot_ms = now_ms;
                    let run = run.clone();
                    out.reports
                        .push(self.report(&key, &run, RunState::InProgress, now_ms));
                }
                continue;
            };
            let Some(mut run) = self.runs.remove(&key) else {
                continue;
            };
            // Still held (listed, or not known otherwise) when its pod ended: it must not
            // restart while the kubelet keeps listing the devices.
            let held = !reallocated && run.missing.is_none();
            // Reported as it stood at the first listing that lacked it (with what the pod's
            // metadata says now), unless the container's own finish times it.
            let (mut end_ms, mut unknown_end) = (now_ms, unknown_end);
            if let Some(m) = run.missing.take() {
                unknown_end = m.unknown_end;
                let timed = run.container.first_start_ms.is_some() && finished;
                if !timed {
                    end_ms = m.since_ms;
                    let (meta, container) = (run.meta, run.container);
                    run = *m.at;
                    (run.meta, run.container) = (meta, container);
                }
            }
            // A run resumed after a restart whose devices were already gone ended while the
            // agent was down, at an unknown time: not evidence of speed.
            let state = if run.meta.failed || (!held && unknown_end) {
                RunState::Failed
            } else {
                RunState::Completed
            };
            let (start, end, source) = run_window(run.alloc_ms, end_ms, &run.container);
            tracing::info!(
                run_id = %run.run_id, namespace = %key.0, pod = %key.1, container = %key.2,
                class = %run.meta.class, busy_s = run.busy_s,
                wall_s = (end - start) as f64 / 1000.0, time_source = source.as_str(),
                allocated_to_start_s = (start - run.alloc_ms) as f64 / 1000.0,
                restarts = run.container.restarts, reason = reason.as_str(), "run ended"
            );
            out.reports.push(self.report(&key, &run, state, end_ms));
            out.ended.push(EndedRun {
                state,
                time_source: source,
            });
            out.changed = true;
            if run.container.finished_ms.is_some() && self.finished.len() < MAX_FINISHED {
                let attempt = (run.meta.uid.clone(), run.container.restarts);
                self.finished.insert(key.clone(), attempt);
            }
            if held && matches!(reason, EndReason::PodEnded) {
                self.ended.insert((key, run.device_ids));
            }
        }

        let Some(current) = current else {
            return out;
        };
        // Start runs for new assignments.
        for (key, a) in current {
            if self.runs.contains_key(&key)
                || self.ended.contains(&(key.clone(), a.device_ids.clone()))
            {
                continue;
            }
            let pod_meta = meta.get(&a.namespace, &a.pod).unwrap_or_default();
            if pod_meta.ended {
                continue;
            }
            let container = pod_meta
                .containers
                .get(&a.container)
                .copied()
                .unwrap_or_default();
            // The attempt whose run already ended, listed again: not a new run.
            if container.finished_ms.is_some()
                && self.finished.get(&key) == Some(&(pod_meta.uid.clone(), container.restarts))
            {
                continue;
            }
            let models = a
                .device_ids
                .iter()
                .map(|id| {
                    by_uuid
                        .get(device_id_to_uuid(id))
                        .map(|r| r.info.model.clone())
                        .unwrap_or_default()
                })
                .collect();
            let run_id = self.new_run_id();
            tracing::info!(
                run_id = %run_id, namespace = %a.namespace, pod = %a.pod, container = %a.container,
                class = %pod_meta.class, devices = ?a.device_ids, "run started"
            );
            self.runs.insert(
                key,
                Run {
                    run_id,
                    device_ids: a.device_ids.clone(),
                    meta: pod_meta,
                    models,
                    alloc_ms: now_ms,
                    container,
                    last_ms: Some(now_ms),
                    busy_s: 0.0,
                    util_sum: 0.0,
                    util_n: 0,
                    peak_util: 0.0,
                    peak_mem: 0,
                    energy_j: 0.0,
                    last_energy: HashMap::new(),
                    samples: 0,
                    seq: 0,
                    last_snapshot_ms: now_ms,
                    missing: None,
                    meta_seen: false,
                },
            );
            out.changed = true;
        }
        out
    }

    fn report(&self, key: &RunKey, run: &Run, state: RunState, now_ms: i64) -> RunReport {
        let (report_id, progress) = match state {
            RunState::InProgress => (format!("{}-s{}", run.run_id, run.seq), run.meta.progress),
            RunState::Completed => (format!("{}-end", run.run_id), Some(1.0)),
            _ => (format!("{}-end", run.run_id), run.meta.progress),
        };
        let (start, end, _) = run_window(run.alloc_ms, now_ms, &run.container);
        // Ticks before the container started or after it finished can add up to a period of
        // busy time beyond the container's window; busy time never exceeds wall time.
        let wall_s = (end - start).max(0) as f64 / 1000.0;
        RunReport {
            report_id,
            run_id: run.run_id.clone(),
            node: self.cfg.node.clone(),
            pod_namespace: key.0.clone(),
            pod_name: key.1.clone(),
            pod_uid: run.meta.uid.clone(),
            container: key.2.clone(),
            class: run.meta.class.clone(),
            device_ids: run.device_ids.clone(),
            device_models: run.models.clone(),
            state: state as i32,
            start_unix_ms: start,
            end_unix_ms: end,
            gpu_busy_seconds: run.busy_s.min(wall_s),
            mean_utilization_percent: if run.util_n == 0 {
                0.0
            } else {
                run.util_sum / run.util_n as f64
            },
            peak_utilization_percent: run.peak_util,
            peak_memory_bytes: run.peak_mem,
            energy_joules: run.energy_j,
            progress,
            work_done: match (run.meta.work, progress) {
                (Some(w), Some(p)) => Some(w * p),
                _ => None,
            },
            sample_count: run.samples,
        }
    }

    /// In-progress snapshots of every active run, for persisting across agent restarts.
    pub fn active_snapshots(&self, now_ms: i64) -> Vec<RunReport> {
        self.runs
            .iter()
            .map(|(k, r)| self.report(k, r, RunState::InProgress, now_ms))
            .collect()
    }

    /// Resumes runs saved by [`Self::active_snapshots`] before a restart, keeping their IDs and
    /// totals. The time the agent was down is not accounted. A resumed run whose devices are
    /// gone at the first tick ends then, as a run whose end is unknown.
    pub fn restore(&mut self, snapshots: Vec<RunReport>) {
        for s in snapshots {
            let key = (
                s.pod_namespace.clone(),
                s.pod_name.clone(),
                s.container.clone(),
            );
            let seq = s
                .report_id
                .rsplit_once("-s")
                .and_then(|(_, n)| n.parse().ok())
                .unwrap_or(0);
            let n = u64::from(s.sample_count);
            self.runs.insert(
                key,
                Run {
                    run_id: s.run_id,
                    device_ids: s.device_ids,
                    meta: PodMeta {
                        uid: s.pod_uid,
                        class: s.class,
                        work: None,
                        progress: s.progress,
                        failed: false,
                        ended: false,
                        containers: HashMap::new(),
                    },
                    models: s.device_models,
                    // The saved start (the container's when it was known); the pod's status
                    // gives the container's again at the next tick.
                    alloc_ms: s.start_unix_ms,
                    container: ContainerTimes::default(),
                    last_ms: None,
                    busy_s: s.gpu_busy_seconds,
                    util_sum: s.mean_utilization_percent * n as f64,
                    util_n: n,
                    peak_util: s.peak_utilization_percent,
                    peak_mem: s.peak_memory_bytes,
                    energy_j: s.energy_joules,
                    last_energy: HashMap::new(),
                    samples: s.sample_count,
                    seq: seq + 1_000, // snapshot IDs after a restore never collide with earlier ones
                    last_snapshot_ms: s.end_unix_ms,
                    missing: None,
                    meta_seen: false,
                },
            );
        }
    }
}

fn merge_meta(into: &mut PodMeta, m: &PodMeta) {
    if !m.uid.is_empty() {
        into.uid.clone_from(&m.uid);
    }
    if !m.class.is_empty() {
        into.class.clone_from(&m.class);
    }
    if m.work.is_some() {
        into.work = m.work;
    }
    if m.progress.is_some() {
        into.progress = m.progress;
    }
    into.failed |= m.failed;
    into.ended |= m.ended;
}

/// Takes a container's newer status, keeping its first start once seen: after restarts the
/// status no longer shows it.
fn merge_times(into: &mut ContainerTimes, c: &ContainerTimes) {
    let first = into.first_start_ms.or(c.first_start_ms);
    *into = *c;
    into.first_start_ms = first;
}

/// Adds the interval since the run's previous tick to its totals.
fn account(run: &mut Run, now_ms: i64, cfg: &RunConfig, by_uuid: &HashMap<&str, &DeviceReading>) {
    let Some(last) = run.last_ms.replace(now_ms) else {
        return;
    };
    let cap = cfg.period.as_secs_f64() * 3.0;
    let dt = ((now_ms - last) as f64 / 1000.0).clamp(0.0, cap);
    let samples: Vec<(&str, &DeviceSample)> = run
        .device_ids
        .iter()
        .filter_map(|id| by_uuid.get(device_id_to_uuid(id)))
        .filter_map(|r| r.result.as_ref().ok().map(|s| (r.info.uuid.as_str(), s)))
        .collect();
    if samples.is_empty() {
        return;
    }
    run.samples += 1;
    let mut busy = false;
    let mut mem = 0u64;
    for (uuid, s) in &samples {
        busy |= s.gpu_util_percent > cfg.busy_threshold_percent;
        run.util_sum += s.gpu_util_percent;
        run.util_n += 1;
        run.peak_util = run.peak_util.max(s.gpu_util_percent);
        mem = mem.saturating_add(s.memory_used_bytes);
        // The driver's energy counter when there is one and it moves (exact), else power
        // times the interval (older GPUs, vGPUs, counters that are stuck).
        let counted = s.energy_joules.and_then(|e| {
            let prev = run.last_energy.insert((*uuid).to_owned(), e)?;
            (e > prev && e - prev <= 2_000.0 * cap.max(dt)).then_some(e - prev)
        });
        run.energy_j += counted.unwrap_or_else(|| s.power_watts.unwrap_or(0.0) * dt);
    }
    run.peak_mem = run.peak_mem.max(mem);
    if busy {
        run.busy_s += dt;
    }
}

fn random_seed() -> u64 {
    use std::io::Read;
    let mut buf = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .is_ok()
    {
        return u64::from_le_bytes(buf);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.as_nanos() as u64) ^ u64::from(std::process::id()).rotate_left(32)
}

#[cfg(test)]
mod tests;
