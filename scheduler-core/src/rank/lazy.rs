//! [`LazyRanking`]: a ranking whose recommended queue is ordered when first read, and whose
//! entries are written only when asked for.
//!
//! The extender answers `prioritize` with each candidate's kudos score and `filter` with the best
//! few of the recommended queue; neither reads the thousands of [`RankEntry`]s a [`Ranking`]
//! holds, yet writing them, ordering them and dropping them, with the default plugins' scores
//! (divisions and a square root per node), was a third of the instructions of a `prioritize`
//! over 5,000 nodes. So a call computes steps 1 to 4 while it borrows its node states and keeps
//! here, owned, only what the queue is made of (per ranked node its name, its evaluation and what
//! the default plugins read of it): the default scores and the order are computed on first read,
//! an entry is written when read, and the whole [`Ranking`] (for `/explain`) on demand. All give
//! exactly what [`crate::Scheduler::rank`] gives, which is this ranking written whole.

use std::sync::OnceLock;

use serde::{Serialize, Serializer};

use super::{Eval, merge, with_scratch};
use crate::Name;
use crate::config::MergeWeights;
use crate::queue::{self, Candidate, DefaultPlugins, NodeResources};
use crate::review::review;
use crate::types::{Prediction, RankEntry, Ranking, Rejection};

/// A ranking of one pod over one call's nodes (see the module docs). Ranked nodes are numbered
/// in the order of the call's nodes, rejected ones left out; [`LazyRanking::recommended`] gives
/// them in recommended order.
#[derive(Clone, Debug)]
pub struct LazyRanking {
    namespace: String,
    pod: String,
    class: Option<String>,
    threshold_seconds: Option<f64>,
    /// Sorted by node name.
    rejected: Vec<Rejection>,
    body: Body,
    /// The recommended order, once read whole.
    order: OnceLock<Ordered>,
    /// The best of the recommended order, once read before the whole was (a filter's best).
    best: OnceLock<Ordered>,
}

/// The fewest ranked nodes a read of the best orders: an event's note reads the first two
/// entries, one after the other.
const BEST_AT_LEAST: usize = 16;

/// Step 5's result, computed on first read.
#[derive(Clone, Debug, Default)]
struct Ordered {
    /// Ranked nodes in recommended order, best first: all of them, or the best.
    order: Vec<u32>,
    /// Each ranked node's default plugins' score, 0..=200 (empty for a written ranking).
    default_scores: Vec<u8>,
}

#[derive(Clone, Debug)]
enum Body {
    /// Scored, not written.
    Scored(Scored),
    /// Written whole: the entries, in recommended order.
    Written(Vec<RankEntry>),
}

/// What the recommended queue is made of, per ranked node in the order of the call's nodes.
#[derive(Clone, Debug)]
pub(super) struct Scored {
    pub(super) rows: Vec<ScoredRow>,
    /// Each row's node name.
    pub(super) names: NameText,
    /// The evaluations the rows point at: the nodes' own, then one per device profile.
    pub(super) evals: Vec<Eval>,
    /// The pod's requests, as the default plugins read them.
    pub(super) plugins: DefaultPlugins,
    pub(super) weights: MergeWeights,
}

/// The ranked nodes' names, copied into one buffer in row order.
///
/// Sharing each node's [`Name`] instead costs an atomic increment per node on a cache line of
/// its own (and a decrement when the ranking is dropped). In a scheduling run at 5,000 nodes,
/// where kube-scheduler and the API server push the names out of the caches between two
/// calls, those increments were 6 % of the orchestrator's CPU, each one a miss the processor
/// could not overlap with the next (a locked instruction waits for the loads before it), and
/// the merge's name keys then read the same cold lines again. A copy reads each name once with
/// plain loads, into a buffer the merge reads front to back.
#[derive(Clone, Debug, Default)]
pub(super) struct NameText {
    text: String,
    /// Per name, where it ends in `text`; it starts where the one before ends.
    ends: Vec<usize>,
}

impl NameText {
    /// The names in order, copied; one allocation each for the text and the ends.
    pub(super) fn copied<'a>(names: impl Iterator<Item = &'a str> + Clone) -> Self {
        let bytes = names.clone().map(str::len).sum();
        let mut text = String::with_capacity(bytes);
        let ends = names
            .map(|n| {
                text.push_str(n);
                text.len()
            })
            .collect();
        Self { text, ends }
    }

    /// Name `i`, if there are that many.
    pub(super) fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = i.checked_sub(1).map_or(0, |p| self.ends[p]);
        self.text.get(start..end)
    }

    /// Name `i`, which must be held (like indexing a slice).
    pub(super) fn at(&self, i: usize) -> &str {
        self.get(i).expect("a name index below len")
    }

    /// The names in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &str> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let n = &self.text[start..end];
            start = end;
            n
        })
    }
}

/// One ranked node.
#[derive(Clone, Copy, Debug)]
pub(super) struct ScoredRow {
    /// Its index among the call's nodes.
    pub(super) candidate: u32,
    /// Its evaluation, an index into [`Scored::evals`].
    pub(super) eval: u32,
    /// What the default plugins (step 5's second queue) read of the node: kept rather than
    /// scored, since a caller that reads only the kudos scores never needs the second queue,
    /// whose divisions and square root were a tenth of a call's instructions.
    pub(super) resources: NodeResources,
}

impl Scored {
    pub(super) fn eval(&self, row: &ScoredRow) -> &Eval {
        &self.evals[row.eval as usize]
    }

    /// Each row's default plugins' score, 0..=200.
    pub(super) fn default_scores(&self) -> Vec<u8> {
        self.rows
            .iter()
            .map(|r| self.plugins.score(&r.resources))
            .collect()
    }

    /// The best `want` rows in recommended order (all, if fewer), with every row's default score.
    fn ordered(&self, want: usize) -> Ordered {
        let default_scores = self.default_scores();
        Ordered {
            order: with_scratch(|scratch| merge::order(self, &default_scores, scratch, want)),
            default_scores,
        }
    }

    /// The queue inputs of row `r` with its default score, as [`crate::queue`] takes them.
    pub(super) fn candidate<'a>(
        &'a self,
        r: usize,
        name: &'a str,
        default_score: u8,
    ) -> Candidate<'a> {
        let e = self.eval(&self.rows[r]);
        Candidate {
            name,
            score: e.score,
            rate: e.rate,
            log_time: e.log_time,
            default_score: f64::from(default_score),
        }
    }
}

impl LazyRanking {
    pub(super) fn scored(
        namespace: String,
        pod: String,
        class: Option<String>,
        threshold_seconds: Option<f64>,
        mut rejected: Vec<Rejection>,
        scored: Scored,
    ) -> Self {
        rejected.sort_by(|a, b| a.node.cmp(&b.node));
        Self {
            namespace,
            pod,
            class,
            threshold_seconds,
            rejected,
            body: Body::Scored(scored),
            order: OnceLock::new(),
            best: OnceLock::new(),
        }
    }

    /// Pod namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Pod name.
    pub fn pod(&self) -> &str {
        &self.pod
    }

    /// Pod class.
    pub fn class(&self) -> Option<&str> {
        self.class.as_deref()
    }

    /// The review threshold used, seconds (`None` without a class or without candidates).
    pub fn threshold_seconds(&self) -> Option<f64> {
        self.threshold_seconds
    }

    /// Nodes that cannot run the pod, by name.
    pub fn rejected(&self) -> &[Rejection] {
        &self.rejected
    }

    /// How many nodes are ranked.
    pub fn len(&self) -> usize {
        match &self.body {
            Body::Scored(s) => s.rows.len(),
            Body::Written(entries) => entries.len(),
        }
    }

    /// Whether no node is ranked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ranked node `i`'s name.
    pub fn node(&self, i: usize) -> Option<&str> {
        match &self.body {
            Body::Scored(s) => s.names.get(i),
            Body::Written(entries) => entries.get(i).map(|e| e.node.as_str()),
        }
    }

    /// Ranked node `i`'s kudos score, 0..=10 (what the extender answers).
    pub fn score(&self, i: usize) -> Option<u8> {
        self.node_score(i).map(|(_, score)| score)
    }

    /// Ranked node `i`'s name and kudos score, in one look (what a caller joining answers to
    /// names reads per node).
    pub fn node_score(&self, i: usize) -> Option<(&str, u8)> {
        match &self.body {
            Body::Scored(s) => Some((s.names.get(i)?, s.eval(s.rows.get(i)?).score)),
            Body::Written(entries) => entries.get(i).map(|e| (e.node.as_str(), e.score)),
        }
    }

    /// Ranked node `i`'s index among the nodes of the call.
    pub fn candidate(&self, i: usize) -> Option<usize> {
        match &self.body {
            Body::Scored(s) => s.rows.get(i).map(|r| r.candidate as usize),
            Body::Written(entries) => entries.get(i).map(|e| e.candidate),
        }
    }

    /// The ranked nodes in recommended order, best first (sorted on the first call).
    pub fn recommended(&self) -> &[u32] {
        &self.ordered().order
    }

    /// The first `k` of [`LazyRanking::recommended`] (all, if fewer), ordering only those when
    /// the whole order was not read yet: the best 100 of 5,000 cost a selection and a sort of
    /// 100, where the whole order sorts 5,000.
    pub fn best(&self, k: usize) -> &[u32] {
        let o = &self.best_ordered(k).order;
        &o[..k.min(o.len())]
    }

    /// An order holding at least the best `k`: the whole one if read, else the best alone.
    fn best_ordered(&self, k: usize) -> &Ordered {
        let k = k.min(self.len());
        let Body::Scored(s) = &self.body else {
            return self.ordered();
        };
        if let Some(whole) = self.order.get() {
            return whole;
        }
        let best = self.best.get_or_init(|| s.ordered(k.max(BEST_AT_LEAST)));
        if best.order.len() >= k {
            best
        } else {
            self.ordered()
        }
    }

    fn ordered(&self) -> &Ordered {
        self.order.get_or_init(|| match &self.body {
            Body::Scored(s) => s.ordered(s.rows.len()),
            Body::Written(entries) => Ordered {
                order: (0..entries.len() as u32).collect(),
                default_scores: Vec::new(),
            },
        })
    }

    /// The entry at 0-based position `pos` of the recommended queue.
    pub fn entry(&self, pos: usize) -> Option<RankEntry> {
        let o = self.best_ordered(pos.saturating_add(1));
        let i = *o.order.get(pos)? as usize;
        match &self.body {
            Body::Scored(s) => Some(self.write_entry(s, i, pos, Name::from(s.names.at(i)), o)),
            Body::Written(entries) => entries.get(i).cloned(),
        }
    }

    /// Ranked node `i` at 0-based position `pos` of the recommended queue, as an entry.
    fn write_entry(&self, s: &Scored, i: usize, pos: usize, node: Name, o: &Ordered) -> RankEntry {
        let row = &s.rows[i];
        let e = s.eval(row);
        // The merged score does not read the name.
        let c = s.candidate(i, "", o.default_scores.get(i).copied().unwrap_or(0));
        let prediction = e.pred.map(|p| Prediction {
            seconds: e.seconds,
            uncertainty_log_sd: p.sd,
            source: p.source,
        });
        let review = match (&prediction, self.threshold_seconds) {
            (Some(p), Some(t)) => Some(review(p.seconds, t)),
            _ => None,
        };
        RankEntry {
            node,
            prediction,
            review,
            good_rate: e.good_rate,
            score: e.score,
            default_score: c.default_score,
            merged_score: queue::merged_score(&c, &s.weights),
            rank: pos + 1,
            candidate: row.candidate as usize,
        }
    }

    /// The whole ranking, written (for `/explain`; the ranking itself keeps no copy).
    pub fn to_ranking(&self) -> Ranking {
        let entries = match &self.body {
            Body::Scored(s) => {
                let o = self.ordered();
                o.order
                    .iter()
                    .enumerate()
                    .map(|(pos, &i)| {
                        let name = Name::from(s.names.at(i as usize));
                        self.write_entry(s, i as usize, pos, name, o)
                    })
                    .collect()
            }
            Body::Written(entries) => entries.clone(),
        };
        self.head(entries, self.rejected.clone())
    }

    /// The whole ranking, written (each entry's name a new allocation).
    pub fn into_ranking(self) -> Ranking {
        self.into_ranking_named(|_| None)
    }

    /// The whole ranking, written, each entry's name `name(candidate)` where that gives one
    /// (a caller that still has the call's nodes shares their names) and a copy otherwise.
    pub(crate) fn into_ranking_named(
        mut self,
        mut name: impl FnMut(usize) -> Option<Name>,
    ) -> Ranking {
        self.ordered();
        let o = self.order.take().unwrap_or_default();
        let rejected = std::mem::take(&mut self.rejected);
        let entries = match std::mem::replace(&mut self.body, Body::Written(Vec::new())) {
            Body::Scored(s) => o
                .order
                .iter()
                .enumerate()
                .map(|(pos, &i)| {
                    let i = i as usize;
                    let node = name(s.rows[i].candidate as usize)
                        .unwrap_or_else(|| Name::from(s.names.at(i)));
                    self.write_entry(&s, i, pos, node, &o)
                })
                .collect(),
            Body::Written(entries) => entries,
        };
        self.head(entries, rejected)
    }

    fn head(&self, entries: Vec<RankEntry>, rejected: Vec<Rejection>) -> Ranking {
        Ranking {
            namespace: self.namespace.clone(),
            pod: self.pod.clone(),
            class: self.class.clone(),
            threshold_seconds: self.threshold_seconds,
            entries,
            rejected,
        }
    }
}

impl From<Ranking> for LazyRanking {
    /// A ranking already written, in its order.
    fn from(r: Ranking) -> Self {
        Self {
            namespace: r.namespace,
            pod: r.pod,
            class: r.class,
            threshold_seconds: r.threshold_seconds,
            rejected: r.rejected,
            body: Body::Written(r.entries),
            order: OnceLock::new(),
            best: OnceLock::new(),
        }
    }
}

impl Serialize for LazyRanking {
    /// As the [`Ranking`] it writes.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_ranking().serialize(serializer)
    }
}
