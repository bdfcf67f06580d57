//! From an accepted run report to the published model, off the extender's path.
//!
//! ```text
//!  report streams ──(run, reply)──> RunWriter ──(stored runs, in seq order)──> Learner
//!                    <── ack ───── one store commit per batch      refit a copy, swap it in
//! ```
//!
//! - [`RunWriter`]: one task appends the runs waiting from every stream in one store commit
//!   (one fsync for many reports), answers each stream once its run is durable, and hands the
//!   stored runs to the learner in `seq` order.
//! - [`Learner`]: one task owns a working copy of the model. It learns a batch of runs on a
//!   blocking thread, each run refitting only its own class's level
//!   ([`kudos_scheduler_core::Refit::Deferred`]); before each copy it makes the model-wide
//!   refit once for every run since ([`Scheduler::settle`]), copies the result and
//!   publishes it with [`crate::index::Index::publish_model`], a pointer swap (the model it
//!   replaced is freed on a blocking thread after the lock is released); while runs keep
//!   arriving, copies are spaced by [`publish_gap`] ([`COPY_SHARE`] times the last copy's
//!   cost, at most [`PUBLISH_EVERY`]), so neither copying a large model nor the rankings that
//!   read a fresh copy from memory rather than cache dominate. No lock is held
//!   while it learns, so `filter`/`prioritize` keep answering from the previous model, and
//!   the work per report on the ingestion path is one channel send.
//!
//! An acknowledgement promises durability, not learning: a run stored but not yet learned when
//! the process stops is above the last snapshot's `seq`, so it is replayed at the next start,
//! by the learner, as a backlog it learns before anything new ([`Learner::spawn_with_backlog`]).
//! A panic while learning loses nothing either: the copy is rebuilt from the published model
//! and every run since is learned again (see [`relearn`]).

use crate::index::{SharedIndex, apply_run_with};
use crate::metrics::Metrics;
use crate::state::StoredRun;
use crate::store::{Appended, Store, StoreError};
use kudos_scheduler_core::{Feedback, Refit, Scheduler};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

/// Runs stored or learned in one batch at most.
pub const MAX_BATCH: usize = 256;
/// Stored runs waiting for the learner; beyond this the writer waits (bounded memory).
const LEARN_QUEUE: usize = 4096;

type Reply = oneshot::Sender<Result<(Appended, StoredRun), Arc<StoreError>>>;

/// Appends runs in batches; see the module docs.
#[derive(Clone)]
pub struct RunWriter {
    tx: mpsc::Sender<(StoredRun, Reply)>,
}

/// Why a run could not be appended.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The store refused the batch the run was in.
    #[error(transparent)]
    Store(Arc<StoreError>),
    /// The writer task ended (shutdown).
    #[error("the run writer has stopped")]
    Stopped,
}

impl RunWriter {
    /// Starts the writer and the learner over `index`.
    pub fn spawn(store: Arc<dyn Store>, learner: Learner) -> Self {
        let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
        tokio::spawn(write_loop(store, rx, learner).instrument(tracing::info_span!("run_writer")));
        Self { tx }
    }

    /// Stores `run` (its `seq` is assigned here) and returns the outcome once it is durable.
    pub async fn append(&self, run: StoredRun) -> Result<(Appended, StoredRun), WriteError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((run, reply))
            .await
            .map_err(|_| WriteError::Stopped)?;
        rx.await
            .map_err(|_| WriteError::Stopped)?
            .map_err(WriteError::Store)
    }
}

async fn write_loop(
    store: Arc<dyn Store>,
    mut rx: mpsc::Receiver<(StoredRun, Reply)>,
    learner: Learner,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let (runs, replies): (Vec<StoredRun>, Vec<Reply>) = batch.drain(..).unzip();
        match store.append_runs(runs.clone()).await {
            Ok(outcomes) => {
                for ((run, reply), outcome) in runs.into_iter().zip(replies).zip(outcomes) {
                    let run = match outcome {
                        Appended::Stored(seq) => StoredRun { seq, ..run },
                        Appended::Duplicate => run,
                    };
                    if let Appended::Stored(_) = outcome {
                        learner.learn(run.clone()).await;
                    }
                    let _ = reply.send(Ok((outcome, run)));
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// Called on the learner's thread after a batch is learned on the copy and before it is
/// published (for tests that need a refit to be in progress).
pub type LearnHook = Arc<dyn Fn() + Send + Sync>;

/// Feeds stored runs to the learner task; see the module docs.
#[derive(Clone)]
pub struct Learner {
    tx: mpsc::Sender<StoredRun>,
}

impl Learner {
    /// Starts the learner with a working copy of the index's model.
    pub fn spawn(index: SharedIndex, metrics: Arc<Metrics>, hook: Option<LearnHook>) -> Self {
        Self::start(index, metrics, hook, Vec::new()).0
    }

    /// Starts the learner, which first learns `backlog` (stored runs the index's model does
    /// not hold yet, in `seq` order: those after the snapshot at start) and then what
    /// [`Learner::learn`] queues.
    pub fn spawn_with_backlog(
        index: SharedIndex,
        metrics: Arc<Metrics>,
        backlog: Vec<StoredRun>,
    ) -> Self {
        Self::start(index, metrics, None, backlog).0
    }

    /// As [`Learner::spawn_with_backlog`], and the learner's task: it ends once every clone of
    /// the `Learner` is dropped, after publishing what it learned. A follower stops its
    /// learner this way before it replaces the model with a snapshot, so that nothing learned
    /// on the old model is published over the new one.
    pub fn spawn_joinable(
        index: SharedIndex,
        metrics: Arc<Metrics>,
        backlog: Vec<StoredRun>,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        Self::start(index, metrics, None, backlog)
    }

    fn start(
        index: SharedIndex,
        metrics: Arc<Metrics>,
        hook: Option<LearnHook>,
        backlog: Vec<StoredRun>,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(LEARN_QUEUE);
        let working = Scheduler::clone(&index.read().model());
        let task = tokio::spawn(
            learn_loop(index, rx, working, metrics, hook, backlog)
                .instrument(tracing::info_span!("learner")),
        );
        (Self { tx }, task)
    }

    /// Queues a stored run, in `seq` order; waits while the queue is full.
    pub async fn learn(&self, run: StoredRun) {
        if self.tx.send(run).await.is_err() {
            tracing::warn!("the learner has stopped; the run is learned at the next start");
        }
    }
}

/// Longest time a learned run waits to be published while others keep arriving.
pub const PUBLISH_EVERY: std::time::Duration = std::time::Duration::from_millis(500);
/// A copy of the model costs as much as the model is big (32 ms for 30,000 (class, node)
/// cells), and the first ranking after each publish reads the new copy from memory rather than
/// cache. With copies ten times their cost apart (every 60 ms for 5,300 cells) the prioritize
/// p99 at 5,000 nodes while reports were learned was 2.0-2.8 ms, against 1.4-1.5 ms refitting
/// under the lock (`KUDOS_BENCH_MODEL_RUNS=30000` with the `prioritize` bench; the largest
/// latencies, 3 to 5 ms, point at the fresh copy, not timed per call). After a copy that took
/// `c`, the next waits until `COPY_SHARE × c` has passed (at most [`PUBLISH_EVERY`]): copying
/// takes at most about a hundredth of the learner's time, a large model is published at most
/// twice a second (p99 1.4-1.6 ms in the same bench), and a small one (a copy of microseconds)
/// still after every batch.
pub const COPY_SHARE: u32 = 100;

/// How long after a publish the next may be, given what the last copy cost.
pub fn publish_gap(last_copy: std::time::Duration) -> std::time::Duration {
    (last_copy * COPY_SHARE).min(PUBLISH_EVERY)
}

/// What was learned but not yet published: the highest `seq`, and each class's latest third
/// queue.
#[derive(Default)]
struct Unpublished {
    seq: Option<u64>,
    third: Vec<(String, f64, Feedback)>,
}

impl Unpublished {
    /// Counts every run up to `seq` as applied once published.
    fn covers(&mut self, seq: u64) {
        self.seq = Some(self.seq.map_or(seq, |s| s.max(seq)));
    }

    /// Records a learned run's `seq` and third queue (replacing its class's earlier one).
    fn learned(&mut self, seq: u64, class: &str, third: Option<(f64, Feedback)>) {
        self.covers(seq);
        if let Some((at, fb)) = third {
            self.third.retain(|(c, _, _)| c != class);
            self.third.push((class.to_owned(), at, fb));
        }
    }
}

async fn learn_loop(
    index: SharedIndex,
    mut rx: mpsc::Receiver<StoredRun>,
    mut working: Scheduler,
    metrics: Arc<Metrics>,
    hook: Option<LearnHook>,
    backlog: Vec<StoredRun>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    // The backlog is learned first, a batch at a time like any other runs; runs queued
    // meanwhile wait in the channel, so the model learns everything in `seq` order.
    let replay_total = backlog.len();
    let replay_started = std::time::Instant::now();
    let mut backlog = backlog.into_iter();
    if replay_total > 0 {
        tracing::info!(
            runs = replay_total,
            "learning the runs stored after the snapshot; ranking with the snapshot's model until then"
        );
    }
    let mut pending = Unpublished::default();
    // The runs in `working` that the published model does not have yet: if learning panics,
    // the copy is rebuilt from the published model and these are learned again.
    let mut since_publish: Vec<StoredRun> = Vec::new();
    let mut last_publish: Option<tokio::time::Instant> = None;
    let mut last_copy = std::time::Duration::ZERO;
    loop {
        let replaying = backlog.len() > 0;
        let received = match (pending.seq, last_publish) {
            _ if replaying => {
                batch.extend(backlog.by_ref().take(MAX_BATCH));
                batch.len()
            }
            // Something waits to be published: take more runs until it is due.
            (Some(_), Some(at)) => tokio::select! {
                n = rx.recv_many(&mut batch, MAX_BATCH) => n,
                () = tokio::time::sleep_until(at + publish_gap(last_copy)) => {
                    (working, last_copy) = publish(&index, working, &mut pending, &mut last_publish, &metrics).await;
                    since_publish.clear();
                    continue;
                }
            },
            _ => rx.recv_many(&mut batch, MAX_BATCH).await,
        };
        if received == 0 {
            break;
        }
        let runs = std::mem::take(&mut batch);
        let batch_first_seq = runs.first().map_or(0, |r| r.seq);
        since_publish.extend(runs.iter().cloned());
        let hook = hook.clone();
        let metrics2 = metrics.clone();
        let mut unpublished = std::mem::take(&mut pending);
        let learned = tokio::task::spawn_blocking(move || {
            let start = std::time::Instant::now();
            for run in &runs {
                let fb = learn_one(&mut working, run, &mut unpublished, &metrics2);
                // Replayed runs were logged when they arrived.
                if !replaying {
                    log_feedback(run, fb);
                }
            }
            if let Some(h) = &hook {
                h();
            }
            metrics2.learned_runs.inc_by(runs.len() as u64);
            metrics2
                .learn_batch_duration
                .observe(start.elapsed().as_secs_f64());
            (working, unpublished)
        })
        .await;
        match learned {
            Ok((w, unpublished)) => {
                (working, pending) = (w, unpublished);
            }
            Err(e) => {
                // A panic in the model: the copy may be half-changed, so it is rebuilt from the
                // published model and everything learned since is learned again, one run at a
                // time, leaving out a run that panics again. Nothing acknowledged is lost: the
                // next publish (and so the next snapshot) covers what the copy holds.
                tracing::error!(error = %e, runs = since_publish.len(), "learning a batch failed; relearning from the published model");
                let base = Scheduler::clone(&index.read().model());
                let again = std::mem::take(&mut since_publish);
                let metrics2 = metrics.clone();
                match tokio::task::spawn_blocking(move || relearn(base, again, &metrics2)).await {
                    Ok((w, unpublished, kept)) => {
                        // The failed batch's runs were not counted as learned yet.
                        let batch = kept.iter().filter(|r| r.seq >= batch_first_seq).count();
                        metrics.learned_runs.inc_by(batch as u64);
                        (working, pending, since_publish) = (w, unpublished, kept);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "relearning failed; restarting from the published model");
                        working = Scheduler::clone(&index.read().model());
                        continue;
                    }
                }
            }
        }
        let replayed = replaying && backlog.len() == 0;
        let due = last_publish.is_none_or(|at| at.elapsed() >= publish_gap(last_copy));
        if due || replayed {
            (working, last_copy) =
                publish(&index, working, &mut pending, &mut last_publish, &metrics).await;
            since_publish.clear();
        }
        if replayed {
            tracing::info!(
                runs = replay_total,
                seconds = replay_started.elapsed().as_secs_f64(),
                applied_seq = index.read().applied_seq(),
                "runs stored after the snapshot learned and published"
            );
        }
    }
    if pending.seq.is_some() {
        publish(&index, working, &mut pending, &mut last_publish, &metrics).await;
    }
}

/// Learns one run into `working` and records it in `unpublished`.
fn learn_one(
    working: &mut Scheduler,
    run: &StoredRun,
    unpublished: &mut Unpublished,
    metrics: &Metrics,
) -> Result<Option<Feedback>, String> {
    // The model-wide refit waits for the copy that is published (see `publish`): at 1,000
    // classes it cost about 1 ms a run, where learning one class's level costs its cells.
    let fb = apply_run_with(working, run, Refit::Deferred);
    // Each class's latest third queue is published with the model.
    let third = match &fb {
        Ok(Some(fb)) => {
            metrics
                .feedback_rescored_nodes
                .inc_by(fb.third_queue.len() as u64);
            Some((run.received_at, fb.clone()))
        }
        _ => None,
    };
    unpublished.learned(run.seq, &run.class, third);
    fb
}

/// Learns `runs` again on `base` after a panic, one at a time. A run that panics is left out
/// (it is stored, and logged here, but never learned) and the rest are learned again on a fresh
/// copy, since the panic may have left the copy half-changed. Returns the copy, what it holds
/// unpublished and the runs it holds.
fn relearn(
    base: Scheduler,
    runs: Vec<StoredRun>,
    metrics: &Metrics,
) -> (Scheduler, Unpublished, Vec<StoredRun>) {
    relearn_with(base, runs, metrics, learn_one)
}

type LearnOne =
    fn(&mut Scheduler, &StoredRun, &mut Unpublished, &Metrics) -> Result<Option<Feedback>, String>;

fn relearn_with(
    base: Scheduler,
    mut runs: Vec<StoredRun>,
    metrics: &Metrics,
    learn: LearnOne,
) -> (Scheduler, Unpublished, Vec<StoredRun>) {
    // The highest seq left out: the published model counts as having applied it, so a restart
    // does not replay (and panic on) it.
    let mut left_out: Option<u64> = None;
    loop {
        let mut working = base.clone();
        let mut unpublished = Unpublished::default();
        let panicked = runs.iter().position(|run| {
            let learned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                learn(&mut working, run, &mut unpublished, metrics)
            }));
            learned.is_err()
        });
        let Some(i) = panicked else {
            if let Some(seq) = left_out {
                unpublished.covers(seq);
            }
            return (working, unpublished, runs);
        };
        let run = runs.remove(i);
        left_out = Some(left_out.map_or(run.seq, |s| s.max(run.seq)));
        metrics.runs_left_out.inc();
        tracing::error!(node = %run.node, class = %run.class, run_id = %run.run_id, report_id = %run.report_id, seq = run.seq, "learning this run panics; it stays stored and is left out of the model");
    }
}

/// Publishes a copy of `working` with what `pending` holds (copied on a blocking thread; the
/// index lock is held only to swap the pointer). Returns the working copy and what copying took.
async fn publish(
    index: &SharedIndex,
    mut working: Scheduler,
    pending: &mut Unpublished,
    last_publish: &mut Option<tokio::time::Instant>,
    metrics: &Metrics,
) -> (Scheduler, std::time::Duration) {
    let Some(seq) = pending.seq.take() else {
        return (working, std::time::Duration::ZERO);
    };
    let copied = tokio::task::spawn_blocking(move || {
        // Once per publish, not per run: what the runs since the last one deferred.
        working.settle();
        let start = std::time::Instant::now();
        let published = Arc::new(working.clone());
        (working, published, start.elapsed())
    })
    .await;
    let (working, published, took) = match copied {
        Ok(done) => done,
        Err(e) => {
            tracing::error!(error = %e, "copying the model failed; restarting from the published model");
            pending.third.clear();
            return (
                Scheduler::clone(&index.read().model()),
                std::time::Duration::ZERO,
            );
        }
    };
    let replaced = {
        let mut i = index.write();
        let replaced = i.publish_model(published, seq);
        for (class, at, fb) in pending.third.drain(..) {
            i.keep_third_queue(&class, at, &fb);
        }
        replaced
    };
    free_replaced(replaced);
    *last_publish = Some(tokio::time::Instant::now());
    metrics.model_publishes.inc();
    (working, took)
}

/// Frees a model that [`crate::index::Index::publish_model`] replaced, on a blocking thread:
/// called after the index lock is released, so neither the lock nor a runtime worker waits for
/// it (milliseconds at thousands of classes). Needs a Tokio runtime.
pub(crate) fn free_replaced(model: Arc<Scheduler>) {
    drop(tokio::task::spawn_blocking(move || drop(model)));
}

fn log_feedback(run: &StoredRun, fb: Result<Option<Feedback>, String>) {
    let pod = format!("{}/{}", run.pod_namespace, run.pod_name);
    match fb {
        Ok(Some(fb)) => {
            tracing::info!(node = %run.node, class = %run.class, pod = %pod, run_id = %run.run_id, report_id = %run.report_id, seq = run.seq, actual_seconds = fb.actual_seconds, review = ?fb.review, "run observed")
        }
        Ok(None) => {
            tracing::info!(node = %run.node, class = %run.class, pod = %pod, run_id = %run.run_id, report_id = %run.report_id, seq = run.seq, outcome = ?run.outcome, "run stored, not observed (failed, unclassified or no device profile)")
        }
        Err(e) => {
            tracing::warn!(node = %run.node, class = %run.class, pod = %pod, run_id = %run.run_id, report_id = %run.report_id, seq = run.seq, error = %e, "run stored, model refused it")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kudos_scheduler_core::SchedulerConfig;

    fn run(seq: u64) -> StoredRun {
        StoredRun {
            seq,
            ..crate::store::tests::run(&format!("r{seq}"))
        }
    }

    fn panics_on_seq_2(
        w: &mut Scheduler,
        r: &StoredRun,
        u: &mut Unpublished,
        m: &Metrics,
    ) -> Result<Option<Feedback>, String> {
        let fb = learn_one(w, r, u, m);
        assert_ne!(r.seq, 2, "a defect in the model");
        fb
    }

    #[test]
    fn relearning_leaves_out_only_the_run_that_panics_and_counts_it_applied() {
        let metrics = Metrics::new();
        let base = Scheduler::new(SchedulerConfig::default());
        let (_, unpublished, kept) =
            relearn_with(base, (1..=4).map(run).collect(), &metrics, panics_on_seq_2);
        let seqs: Vec<u64> = kept.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [1, 3, 4]);
        assert_eq!(unpublished.seq, Some(4));
        assert_eq!(metrics.runs_left_out.get(), 1);

        // The highest run panics: its seq still counts as applied, so a restart skips it.
        let base = Scheduler::new(SchedulerConfig::default());
        let (_, unpublished, kept) =
            relearn_with(base, vec![run(1), run(2)], &metrics, panics_on_seq_2);
        assert_eq!(kept.len(), 1);
        assert_eq!(unpublished.seq, Some(2));
        assert_eq!(metrics.runs_left_out.get(), 2);
    }
}
