//! A small cache of authentication and authorization answers (TokenReview, SubjectAccessReview):
//! answers that allow are kept for the configured time, refusals for 10 s, answers that could
//! not be had (API server down) not at all. Bounded: when full, expired entries go, and if none
//! had expired, all.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a refusal is kept.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(10);
const MAX_ENTRIES: usize = 10_000;

/// An answer and when it expires.
type Entry<V, E> = (Result<V, E>, Instant);

/// Answers by key (a token, or a token and a path).
pub struct ReviewCache<K, V, E> {
    ttl: Duration,
    entries: Mutex<HashMap<K, Entry<V, E>>>,
}

impl<K: Eq + Hash, V: Clone, E: Clone> ReviewCache<K, V, E> {
    /// Allowing answers are kept for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The cached answer for `key`, else `review`'s, cached unless `transient` says it is.
    pub async fn get_or_review<F>(
        &self,
        key: K,
        review: F,
        transient: impl Fn(&E) -> bool,
    ) -> Result<V, E>
    where
        F: std::future::Future<Output = Result<V, E>>,
    {
        let now = Instant::now();
        if let Ok(entries) = self.entries.lock()
            && let Some((r, until)) = entries.get(&key)
            && *until > now
        {
            return r.clone();
        }
        let r = review.await;
        let ttl = match &r {
            Ok(_) => self.ttl,
            Err(e) if transient(e) => return r,
            Err(_) => NEGATIVE_TTL,
        };
        if let Ok(mut entries) = self.entries.lock() {
            if entries.len() >= MAX_ENTRIES {
                entries.retain(|_, (_, until)| *until > now);
                if entries.len() >= MAX_ENTRIES {
                    entries.clear();
                }
            }
            entries.insert(key, (r.clone(), now + ttl));
        }
        r
    }
}
