//! Filter → prioritize reuse: prioritize answers from the ranking filter just made for the
//! same pod when nothing that scores could have changed in between.

use super::Explained;
use crate::kobj::PodFacts;
use std::borrow::Cow;
use std::sync::{Arc, Mutex};

/// The last filter's ranking, which prioritize reuses for the same pod when no score can have
/// changed in between: kube-scheduler calls prioritize right after filter, in the same
/// scheduling cycle, with exactly the nodes that passed, so ranking again would compute the
/// same scores (same inputs, same seed). Binds in between (the earlier pods' binding cycles run
/// beside this pod's cycle) do not count: they change which nodes fit, never a node's score,
/// and fit was settled by this cycle's filter, kube-scheduler's NodeResourcesFit included,
/// against a snapshot that already holds those pods (see [`crate::index::Index::generation`]).
#[derive(Default)]
pub struct LastFilter(Mutex<Option<CachedFilter>>);

struct CachedFilter {
    uid: String,
    at: std::time::Instant,
    /// [`crate::index::Index::generation`] when the filter ranked.
    generation: u64,
    explained: Arc<Explained>,
    /// The nodes the filter let through, in the order it answered them (which is the order
    /// kube-scheduler's prioritize sends them in), as indices of ranked nodes (see
    /// [`kudos_scheduler_core::LazyRanking`]).
    passed: Vec<u32>,
}

/// How long a filter ranking may be reused.
const REUSE_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

impl LastFilter {
    /// Keeps filter's ranking of the pod of `facts` (not a gang member's, whose answers depend
    /// on its slot claim, nor a pod without a UID): `generation` is the index generation it
    /// ranked at, `passed` the ranked nodes it let through, in answer order.
    pub(super) fn remember(
        &self,
        facts: &PodFacts,
        generation: u64,
        explained: &Arc<Explained>,
        passed: impl FnOnce() -> Vec<u32>,
    ) {
        if facts.gang.is_some() || facts.uid.is_empty() {
            return;
        }
        if let Ok(mut g) = self.0.lock() {
            *g = Some(CachedFilter {
                uid: facts.uid.clone(),
                at: std::time::Instant::now(),
                generation,
                explained: explained.clone(),
                passed: passed(),
            });
        }
    }

    /// The filter ranking of this pod and each of `names`' score in it, if prioritize may
    /// reuse it: the same pod, no score input changed since (`generation`: the index's now), and `names` exactly the nodes the
    /// filter let through, in the order it answered them (one string comparison per node).
    pub(super) fn reusable(
        &self,
        facts: &PodFacts,
        names: &[Cow<str>],
        generation: impl FnOnce() -> u64,
    ) -> Option<(Arc<Explained>, Vec<u8>)> {
        if facts.uid.is_empty() || facts.gang.is_some() {
            return None;
        }
        let g = self.0.lock().ok()?;
        let c = g.as_ref()?;
        let fresh = c.uid == facts.uid
            && c.at.elapsed() < REUSE_WINDOW
            && c.generation == generation()
            && names.len() == c.passed.len();
        if !fresh {
            return None;
        }
        let ranking = &c.explained.ranking;
        let in_order = names
            .iter()
            .zip(&c.passed)
            .map(|(n, &i)| {
                let (node, score) = ranking.node_score(i as usize)?;
                (node == n.as_ref()).then_some(score)
            })
            .collect::<Option<Vec<u8>>>();
        // Another order of the same nodes (not kube-scheduler's, but a caller's): by name.
        let scores = in_order.or_else(|| {
            let by_name: crate::fasthash::FastMap<&str, u8> = (0..ranking.len())
                .filter_map(|i| ranking.node_score(i))
                .collect();
            (by_name.len() == names.len())
                .then(|| {
                    names
                        .iter()
                        .map(|n| by_name.get(n.as_ref()).copied())
                        .collect::<Option<Vec<u8>>>()
                })
                .flatten()
        })?;
        Some((c.explained.clone(), scores))
    }
}
