//! What the extender keeps of its rankings: the last one per pod, for `GET /explain`, the
//! Binding's explanation and `bind`'s check that Kudos ranked the pod it is asked to bind.

use super::ledger::Reservation;
use crate::fifo::FifoMap;
use kudos_scheduler_core::LazyRanking;
use serde::Serialize;
use std::sync::{Arc, Mutex};

/// Explanations kept, at most (the newest; see [`ExplainCache`]).
const MAX_EXPLAINED: usize = 4096;
/// Node lines (ranked, rejected or unknown) over all explanations kept, at most: about 106 MB
/// (measured: 106 bytes a ranked node). Counting explanations alone let them grow with the
/// cluster: 4,096 rankings of 5,000 nodes are 2 GB, and the orchestrator, limited to 512 MiB by
/// the chart, reached 1 GB after 2,000 pods. At 5,000 nodes this keeps the last 200 pods
/// ranked, at 1,213 nodes the last 824.
const MAX_EXPLAINED_NODE_LINES: usize = 1_000_000;

/// What `GET /explain/{namespace}/{pod}` returns: the last ranking computed for the pod.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explained {
    /// Which verb computed it.
    pub verb: &'static str,
    /// UID of the pod ranked (empty when the request carried none); bind checks it.
    pub pod_uid: String,
    /// Unix seconds.
    pub computed_at: f64,
    /// Exploration seed used.
    pub seed: u64,
    /// The ranking: per node prediction (seconds, log-sd uncertainty, source), review, good
    /// rate, score, default score, merged score, rank; and rejected nodes with reasons. Kept
    /// as scored: its entries are written when read (`/explain`), not for every call.
    pub ranking: LazyRanking,
    /// The gang reservation in force, if the pod belongs to a gang.
    pub gang_reservation: Option<Reservation>,
    /// Nodes Kudos could not rank (no known accelerators, or excluded by node monitoring),
    /// with reasons; the filter answers them in `FailedAndUnresolvableNodes`. At most the
    /// first 100 are kept here.
    pub unknown_nodes: Vec<(String, String)>,
    /// How many nodes Kudos could not rank.
    pub unknown_nodes_total: usize,
}

impl Explained {
    /// Its size for [`MAX_EXPLAINED_NODE_LINES`]: one line per node ranked, rejected or kept
    /// unknown, and one for the rest.
    fn node_lines(&self) -> usize {
        self.ranking.len() + self.ranking.rejected().len() + self.unknown_nodes.len() + 1
    }
}

/// The last rankings by `namespace/name`, bounded in number ([`MAX_EXPLAINED`]) and in node
/// lines ([`MAX_EXPLAINED_NODE_LINES`]), the oldest evicted first; the newest is always kept.
/// `bind` admits only pods whose ranking is kept here: one evicted before kube-scheduler binds
/// it (far more pods ranked in between than the bound keeps) is refused and scheduled again.
pub struct ExplainCache {
    inner: Mutex<Explanations>,
    max_lines: usize,
}

struct Explanations {
    by_pod: FifoMap<String, Arc<Explained>>,
    /// [`Explained::node_lines`] summed over `by_pod`.
    lines: usize,
}

impl Default for ExplainCache {
    fn default() -> Self {
        Self::with_bounds(MAX_EXPLAINED, MAX_EXPLAINED_NODE_LINES)
    }
}

impl ExplainCache {
    /// At most `max_explained` explanations holding at most `max_lines` node lines in all.
    pub fn with_bounds(max_explained: usize, max_lines: usize) -> Self {
        Self {
            inner: Mutex::new(Explanations {
                by_pod: FifoMap::new(max_explained),
                lines: 0,
            }),
            max_lines,
        }
    }

    /// Keeps `e` as `key`'s ranking; returns what is kept now, as [`ExplainCache::size`].
    pub(super) fn put(&self, key: String, e: Arc<Explained>) -> (usize, usize) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let g = &mut *g;
        g.lines += e.node_lines();
        let lines = &mut g.lines;
        g.by_pod
            .insert_dropping(key, e, |old| *lines -= old.node_lines());
        while g.lines > self.max_lines && g.by_pod.len() > 1 {
            match g.by_pod.pop_oldest() {
                Some((_, old)) => g.lines -= old.node_lines(),
                None => break,
            }
        }
        (g.by_pod.len(), g.lines)
    }

    /// The last ranking of `namespace/pod`.
    pub fn get(&self, namespace: &str, pod: &str) -> Option<Arc<Explained>> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.by_pod.get(&format!("{namespace}/{pod}")).cloned()
    }

    /// The `n` pods ranked most recently (first ranked, newest first) with their last ranking.
    pub fn recent(&self, n: usize) -> Vec<(String, Arc<Explained>)> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.by_pod
            .newest(n)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Explanations kept, and their node lines in all.
    pub fn size(&self) -> (usize, usize) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (g.by_pod.len(), g.lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kudos_scheduler_core::{Name, RankEntry, Ranking};

    fn explained(nodes: usize) -> Arc<Explained> {
        let entry = |i: usize| RankEntry {
            node: Name::from(format!("node-{i}").as_str()),
            prediction: None,
            review: None,
            good_rate: 0.5,
            score: 5,
            default_score: 0.0,
            merged_score: 0.0,
            rank: i + 1,
            candidate: i,
        };
        Arc::new(Explained {
            verb: "filter",
            pod_uid: String::new(),
            computed_at: 0.0,
            seed: 0,
            ranking: Ranking {
                namespace: "default".into(),
                pod: "p".into(),
                class: None,
                threshold_seconds: None,
                entries: (0..nodes).map(entry).collect(),
                rejected: Vec::new(),
            }
            .into(),
            gang_reservation: None,
            unknown_nodes: Vec::new(),
            unknown_nodes_total: 0,
        })
    }

    /// Rankings of large clusters are kept by their node lines, not only by their number: the
    /// oldest go first, the newest stays even alone over the bound, and replacing a pod's
    /// ranking counts only the new one.
    #[test]
    fn explanations_are_bounded_by_their_node_lines() {
        let cache = ExplainCache::with_bounds(100, 2_000);
        for i in 0..10 {
            cache.put(format!("default/p{i}"), explained(500));
        }
        // 501 lines each: three fit in 2,000.
        assert_eq!(cache.size(), (3, 1_503));
        assert!(cache.get("default", "p6").is_none(), "evicted");
        assert!(cache.get("default", "p9").is_some(), "the newest is kept");
        cache.put("default/p9".into(), explained(100));
        assert_eq!(
            cache.size(),
            (3, 1_103),
            "a replaced ranking no longer counts"
        );
        cache.put("default/huge".into(), explained(5_000));
        assert_eq!(
            cache.size(),
            (1, 5_001),
            "the newest is kept even alone over the bound"
        );
        assert!(cache.get("default", "huge").is_some());
        // The number still bounds small rankings.
        let cache = ExplainCache::with_bounds(4, 1_000_000);
        for i in 0..10 {
            cache.put(format!("default/p{i}"), explained(1));
        }
        assert_eq!(cache.size(), (4, 8));
        let recent: Vec<String> = cache.recent(2).into_iter().map(|(k, _)| k).collect();
        assert_eq!(recent, ["default/p9", "default/p8"]);
    }
}
