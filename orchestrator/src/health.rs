//! Whether the index still answers: a watchdog for `/healthz` and `/readyz`.
//!
//! The index lock is a `parking_lot::RwLock`, which cannot be poisoned: a panic under it
//! releases it and the next caller proceeds (the panicking request fails alone). What can still
//! go wrong is a writer that never lets go (a bug, a livelock, a runaway computation). So a
//! thread of its own, outside the tokio runtime, takes a read lock every `period` with a
//! deadline; the time of the last success is what the probes read, without touching the lock.
//! When no read succeeded for `stall_after`, `/readyz` and `/healthz` answer 503, and the
//! kubelet's liveness probe restarts the pod instead of leaving it wedged while saying ok.

use crate::index::SharedIndex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long the index may refuse reads before the process counts as stalled.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(10);
/// How often the watchdog probes.
pub const DEFAULT_PROBE_PERIOD: Duration = Duration::from_secs(1);

/// The time of the last successful read of the index.
#[derive(Debug)]
pub struct IndexWatchdog {
    origin: Instant,
    /// Milliseconds since `origin` of the last successful probe.
    last_ok_ms: AtomicU64,
    stall_after: Duration,
}

impl IndexWatchdog {
    /// A watchdog that counts the index as answering now.
    pub fn new(stall_after: Duration) -> Self {
        Self {
            origin: Instant::now(),
            last_ok_ms: AtomicU64::new(0),
            stall_after,
        }
    }

    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis().min(u128::from(u64::MAX)) as u64
    }

    /// Takes a read lock, waiting at most `stall_after`; records the time when it succeeds.
    pub fn probe(&self, index: &SharedIndex) -> bool {
        let ok = index.try_read_for(self.stall_after).is_some();
        if ok {
            self.last_ok_ms.store(self.now_ms(), Ordering::Relaxed);
        }
        ok
    }

    /// How long the index has not answered, when that is longer than `stall_after`.
    pub fn stalled_for(&self) -> Option<Duration> {
        let age = Duration::from_millis(
            self.now_ms()
                .saturating_sub(self.last_ok_ms.load(Ordering::Relaxed)),
        );
        (age > self.stall_after).then_some(age)
    }

    /// Probes every `period` on a thread of its own (so a stuck runtime cannot stop it), and
    /// updates the `index_stalled_seconds` gauge. The thread ends when the index is dropped.
    pub fn spawn(
        self: &std::sync::Arc<Self>,
        index: &SharedIndex,
        period: Duration,
        metrics: std::sync::Arc<crate::metrics::Metrics>,
    ) -> std::io::Result<()> {
        let index = std::sync::Arc::downgrade(index);
        let this = self.clone();
        std::thread::Builder::new()
            .name("index-watchdog".into())
            .spawn(move || {
                while let Some(index) = index.upgrade() {
                    if !this.probe(&index) {
                        tracing::error!(
                            stall_after_seconds = this.stall_after.as_secs_f64(),
                            "the index did not answer a read in time; /healthz and /readyz fail until it does"
                        );
                    }
                    drop(index);
                    let stalled = this.stalled_for().map_or(0.0, |d| d.as_secs_f64());
                    metrics.index_stalled_seconds.set(stalled);
                    std::thread::sleep(period);
                }
            })
            .map(|_| ())
    }
}
