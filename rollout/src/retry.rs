//! Retry policy for image pushes and for the reconciler's error requeue.
//!
//! Exponential backoff without jitter: there is one writer (the lease holder) per cluster,
//! so there is no herd to spread, and a deterministic schedule is easy to test and to read
//! in logs.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Exponential backoff: `initial · multiplier^(n-1)`, capped at `max_delay`, for at most
/// `max_attempts` attempts in one derivation (the reconciler's own requeue keeps retrying
/// after that, with the same schedule via [`RetryPolicy::requeue_after`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetryPolicy {
    /// Delay before the second attempt.
    pub initial_delay: Duration,
    /// Upper bound on any delay.
    pub max_delay: Duration,
    /// Growth factor between consecutive delays (≥ 1).
    pub multiplier: u32,
    /// Attempts in one call, including the first (≥ 1).
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    /// 1 s, 2 s, 4 s between four attempts; the reconciler backs off up to 5 minutes.
    fn default() -> Self {
        Self {
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
            multiplier: 2,
            max_attempts: 4,
        }
    }
}

impl RetryPolicy {
    /// The delay to wait after failed attempt number `attempt` (1-based) before the next one,
    /// or `None` when no attempt is left.
    pub fn delay_after(&self, attempt: u32) -> Option<Duration> {
        if attempt == 0 || attempt >= self.max_attempts.max(1) {
            return None;
        }
        Some(self.backoff(attempt))
    }

    /// The reconciler's requeue delay after `consecutive_failures` failed passes (≥ 1);
    /// not bounded by `max_attempts`, only capped at `max_delay`.
    pub fn requeue_after(&self, consecutive_failures: u32) -> Duration {
        self.backoff(consecutive_failures.max(1))
    }

    fn backoff(&self, n: u32) -> Duration {
        let factor = u64::from(self.multiplier.max(1))
            .checked_pow(n.saturating_sub(1))
            .unwrap_or(u64::MAX);
        let nanos = u64::try_from(self.initial_delay.as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_mul(factor);
        Duration::from_nanos(nanos).min(self.max_delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_until_attempts_run_out() {
        let p = RetryPolicy::default();
        let delays: Vec<_> = (1..=5).map(|a| p.delay_after(a)).collect();
        assert_eq!(
            delays,
            [
                Some(Duration::from_secs(1)),
                Some(Duration::from_secs(2)),
                Some(Duration::from_secs(4)),
                None,
                None
            ]
        );
        assert_eq!(p.delay_after(0), None);
    }

    #[test]
    fn capped_and_overflow_safe() {
        let p = RetryPolicy {
            max_attempts: u32::MAX,
            ..RetryPolicy::default()
        };
        assert_eq!(p.delay_after(9), Some(Duration::from_secs(256)));
        assert_eq!(p.delay_after(10), Some(Duration::from_secs(300)));
        assert_eq!(p.delay_after(1000), Some(Duration::from_secs(300)));
        assert_eq!(p.requeue_after(0), Duration::from_secs(1));
        assert_eq!(p.requeue_after(70), Duration::from_secs(300));
    }

    #[test]
    fn single_attempt_never_retries() {
        let p = RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        };
        assert_eq!(p.delay_after(1), None);
    }
}
