//! Design §2.2 step 5 over a call: the second queue (kube-scheduler's default plugins) and the
//! merge into the recommended queue, in one sort.
//!
//! The order is [`crate::queue::recommended_by`]'s (debug builds check every call against it):
//! merged score descending, then the tie queue's key (the first queue's when the kudos weight is
//! positive, else the second's), then the full name. The merged score is a function of (kudos
//! score, default score), both small integers, so it enters the key as its rank among all such
//! pairs (12 bits, one table per weights, kept across calls). The tie queue's key without the
//! name is replaced the same way: the first queue's (score, rate, time) by its dense rank among
//! the call's distinct evaluations (few: one per profile plus nodes with their own history), the
//! second queue's by the default score. The name key's leading bits fill the rest of one `u64`,
//! so the sort moves `(u64, u32)` pairs; rows whose keys are equal are ordered by full name, which
//! orders them as the remaining name-key bits would, then by name.

use std::borrow::Borrow;

use super::{Call, Eval, Row, SHARED, Scratch};
use crate::config::MergeWeights;
use crate::queue::{self, DefaultPlugins, MAX_EXTENDER_SCORE, common_prefix, name_key};
use crate::types::NodeState;

/// Default plugins' scores run 0..=200 (two plugins at weight 1, 0..=100 each).
const MAX_DEFAULT: usize = 2 * queue::MAX_NODE_SCORE as usize;
/// (kudos score, default score) pairs.
const PAIRS: usize = (MAX_EXTENDER_SCORE as usize + 1) * (MAX_DEFAULT + 1);
/// Bits of a pair's rank (`PAIRS` < 2^12).
const RANK_BITS: u32 = 12;

/// The rank of each (kudos score, default score) pair's merged score, best first, for one set of
/// merge weights.
#[derive(Debug, Default)]
pub(super) struct PairRanks {
    weights: Option<(u64, u64)>,
    rank: Vec<u16>,
}

impl PairRanks {
    fn pair(score: u8, default_score: u8) -> usize {
        usize::from(score.min(MAX_EXTENDER_SCORE as u8)) * (MAX_DEFAULT + 1)
            + usize::from(default_score)
    }

    /// The table for `w`, recomputed only when the weights change.
    fn for_weights(&mut self, w: &MergeWeights) -> &[u16] {
        let bits = (w.kudos.to_bits(), w.default_plugins.to_bits());
        if self.weights != Some(bits) {
            let mut by_merged: Vec<(u64, usize)> = (0..PAIRS)
                .map(|p| {
                    let c = queue::Candidate {
                        name: "",
                        score: (p / (MAX_DEFAULT + 1)) as u8,
                        rate: 0.0,
                        log_time: 0.0,
                        default_score: (p % (MAX_DEFAULT + 1)) as f64,
                    };
                    (!queue::ordered(queue::merged_score(&c, w)), p)
                })
                .collect();
            by_merged.sort_unstable();
            self.rank = vec![0; PAIRS];
            for (r, run) in by_merged.chunk_by(|a, b| a.0 == b.0).enumerate() {
                for &(_, p) in run {
                    self.rank[p] = r as u16;
                }
            }
            self.weights = Some(bits);
        }
        &self.rank
    }
}

/// §2.2 step 5: each candidate's default plugins' score (the second queue, reproduced), then the
/// recommended queue into [`Scratch::order`].
pub(super) fn merge<N: Borrow<NodeState>>(call: &Call<'_, N>, s: &mut Scratch) {
    let name = |row: &Row| call.node(row.node).name.as_bytes();
    let lcp = s.rows.first().map_or(0, |first| {
        let first = name(first);
        s.rows.iter().fold(first.len(), |lcp, row| {
            common_prefix(&first[..lcp], name(row))
        })
    });
    let plugins = DefaultPlugins::new(call.pod);
    s.names.clear();
    for row in &mut s.rows {
        let node = call.node(row.node);
        row.default_score = plugins.score(node);
        row.name_key = name_key(node.name.as_bytes(), lcp);
        s.names.push(Some(node.name.clone()));
    }

    let w = &call.config.merge_weights;
    if w.kudos > 0.0 {
        let bits = rank_first_queue(s);
        sort_keys(s, w, bits, |e, _| u64::from(e.queue_rank));
    } else {
        sort_keys(s, w, 8, |_, row| {
            (MAX_DEFAULT - usize::from(row.default_score)) as u64
        });
    }
    let rows = &s.rows;
    // Equal keys: same merged score, same tie position, names equal in the key's bytes.
    for run in s.order.chunk_by_mut(|a, b| a.0 == b.0) {
        if run.len() > 1 {
            run.sort_unstable_by(|a, b| {
                let (ra, rb) = (&rows[a.1 as usize], &rows[b.1 as usize]);
                name(ra).cmp(name(rb)).then(a.1.cmp(&b.1))
            });
        }
    }
    debug_assert_eq!(
        s.order.iter().map(|o| o.1).collect::<Vec<_>>(),
        generic_order(call, s),
        "the packed sort must give the generic merge's order"
    );
}

/// The order of [`queue::recommended_by`] over the same candidates (the reference).
fn generic_order<N: Borrow<NodeState>>(call: &Call<'_, N>, s: &Scratch) -> Vec<u32> {
    let items: Vec<_> = s
        .rows
        .iter()
        .map(|row| (s.candidate(call.nodes, row), row.name_key))
        .collect();
    queue::recommended_by(&items, |(c, k)| (c, *k), &call.config.merge_weights)
        .into_iter()
        .map(|m| m.2)
        .collect()
}

/// Ranks the distinct evaluations in the first queue's order without names (score descending,
/// rate descending, time ascending; equal keys share a rank) into [`Eval::queue_rank`]. Returns
/// the bits a rank takes.
fn rank_first_queue(s: &mut Scratch) -> u32 {
    let key = |e: &Eval| {
        let c = queue::Candidate {
            name: "",
            score: e.score,
            rate: e.rate,
            log_time: e.log_time,
            default_score: 0.0,
        };
        (queue::first_key(&c, 0) >> 64) as u64
    };
    let individual = s.evals.len();
    // `order` is free until the merge's own keys: evaluation `i`, then profile `p` as
    // `individual + p`.
    s.order.clear();
    s.order
        .extend(s.evals.iter().enumerate().map(|(i, e)| (key(e), i as u32)));
    s.order.extend(
        s.profiles
            .iter()
            .enumerate()
            .map(|(p, row)| (key(&row.eval), (individual + p) as u32)),
    );
    s.order.sort_unstable_by_key(|k| k.0);
    let mut rank = 0u32;
    for (r, run) in s.order.chunk_by(|a, b| a.0 == b.0).enumerate() {
        rank = r as u32;
        for &(_, id) in run {
            let id = id as usize;
            match id.checked_sub(individual) {
                None => s.evals[id].queue_rank = rank,
                Some(p) => s.profiles[p].eval.queue_rank = rank,
            }
        }
    }
    u32::BITS - rank.leading_zeros()
}

/// The merge's sort: per row a `u64` of its pair's rank (12 bits), the tie queue's position
/// without the name (`tie_bits`, from `tie`) and the name key's leading bits, in
/// [`Scratch::order`], sorted; rows with equal keys are ordered by full name.
///
/// The sort itself moves plain `u64`s: the row index takes the key's lowest bits (the name key
/// gives them up, and the full-name fix-up orders rows those bits would have told apart).
fn sort_keys(s: &mut Scratch, w: &MergeWeights, tie_bits: u32, tie: impl Fn(&Eval, &Row) -> u64) {
    let ranks = s.pair_ranks.for_weights(w);
    let (rows, profiles, evals) = (&s.rows, &s.profiles, &s.evals);
    let name_shift = RANK_BITS + tie_bits;
    let key = |(i, row): (usize, &Row)| {
        let e = match row.eval {
            SHARED => &profiles[row.profile as usize].eval,
            e => &evals[e as usize],
        };
        let rank = u64::from(ranks[PairRanks::pair(e.score, row.default_score)]);
        let name = row.name_key.checked_shr(name_shift).unwrap_or(0);
        let key = (rank << (64 - RANK_BITS)) | (tie(e, row) << (64 - name_shift)) | name;
        (key, i as u32)
    };
    let row_bits = u64::BITS - (rows.len() as u64).leading_zeros();
    s.order.clear();
    if row_bits + name_shift > u64::BITS {
        // Too many rows to share a word with the ranks (over 2^25 at the least).
        s.order.extend(rows.iter().enumerate().map(key));
        s.order.sort_unstable_by_key(|k| k.0);
        return;
    }
    let row_mask = (1u64 << row_bits) - 1;
    s.packed.clear();
    s.packed.extend(
        rows.iter()
            .enumerate()
            .map(key)
            .map(|(k, i)| (k & !row_mask) | u64::from(i)),
    );
    s.packed.sort_unstable();
    s.order.extend(
        s.packed
            .iter()
            .map(|&k| (k & !row_mask, (k & row_mask) as u32)),
    );
}
