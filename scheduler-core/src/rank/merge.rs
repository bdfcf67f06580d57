//! Design §2.2 step 5 over a scored call: the merge of the first queue and the second
//! (kube-scheduler's default plugins, scored with the first) into the recommended queue, in one
//! sort.
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

use super::lazy::{Scored, ScoredRow};
use super::{Eval, Scratch};
use crate::config::MergeWeights;
use crate::queue::{self, MAX_EXTENDER_SCORE, common_prefix, name_key};

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

/// §2.2 step 5's recommended queue over a scored call: the `best` first of its ranked nodes
/// (indices into [`Scored::rows`]) in recommended order, all of them when `best` is at least
/// their number. `default_scores` are the second queue's, by row. Only the best are sorted: a
/// filter passing its best 100 of 5,000 selects them first (sorting all 5,000 keys was most of
/// the order's cost).
pub(super) fn order(
    scored: &Scored,
    default_scores: &[u8],
    s: &mut Scratch,
    best: usize,
) -> Vec<u32> {
    let names = &scored.names;
    let lcp = names.get(0).map_or(0, |first| {
        let first = first.as_bytes();
        names.iter().fold(first.len(), |lcp, name| {
            common_prefix(&first[..lcp], name.as_bytes())
        })
    });
    s.name_keys.clear();
    s.name_keys
        .extend(names.iter().map(|n| name_key(n.as_bytes(), lcp)));

    let w = &scored.weights;
    if w.kudos > 0.0 {
        let bits = rank_first_queue(scored, s);
        let queue_ranks = std::mem::take(&mut s.queue_ranks);
        sort_keys(scored, default_scores, s, best, bits, |row, _| {
            u64::from(queue_ranks[row.eval as usize])
        });
        s.queue_ranks = queue_ranks;
    } else {
        sort_keys(scored, default_scores, s, best, 8, |_, default_score| {
            (MAX_DEFAULT - usize::from(default_score)) as u64
        });
    }
    // Equal keys: same merged score, same tie position, names equal in the key's bytes.
    for run in s.order.chunk_by_mut(|a, b| a.0 == b.0) {
        if run.len() > 1 {
            run.sort_unstable_by(|a, b| {
                let (na, nb) = (names.at(a.1 as usize), names.at(b.1 as usize));
                na.as_bytes().cmp(nb.as_bytes()).then(a.1.cmp(&b.1))
            });
        }
    }
    let order: Vec<u32> = s.order.iter().take(best).map(|o| o.1).collect();
    debug_assert_eq!(
        order,
        generic_order(scored, default_scores, &s.name_keys)
            .into_iter()
            .take(best)
            .collect::<Vec<_>>(),
        "the packed sort must give the generic merge's order"
    );
    order
}

/// The order of [`queue::recommended_by`] over the same candidates (the reference).
fn generic_order(scored: &Scored, default_scores: &[u8], name_keys: &[u64]) -> Vec<u32> {
    let items: Vec<_> = (0..scored.rows.len())
        .map(|r| {
            let c = scored.candidate(r, scored.names.at(r), default_scores[r]);
            (c, name_keys[r])
        })
        .collect();
    queue::recommended_by(&items, |(c, k)| (c, *k), &scored.weights)
        .into_iter()
        .map(|m| m.2)
        .collect()
}

/// Ranks the distinct evaluations in the first queue's order without names (score descending,
/// rate descending, time ascending; equal keys share a rank) into [`Scratch::queue_ranks`], by
/// evaluation. Returns the bits a rank takes.
fn rank_first_queue(scored: &Scored, s: &mut Scratch) -> u32 {
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
    // `order` is free until the merge's own keys.
    s.order.clear();
    s.order.extend(
        scored
            .evals
            .iter()
            .enumerate()
            .map(|(i, e)| (key(e), i as u32)),
    );
    s.order.sort_unstable_by_key(|k| k.0);
    s.queue_ranks.clear();
    s.queue_ranks.resize(scored.evals.len(), 0);
    let mut rank = 0u32;
    for (r, run) in s.order.chunk_by(|a, b| a.0 == b.0).enumerate() {
        rank = r as u32;
        for &(_, id) in run {
            s.queue_ranks[id as usize] = rank;
        }
    }
    u32::BITS - rank.leading_zeros()
}

/// The merge's sort: per row a `u64` of its pair's rank (12 bits), the tie queue's position
/// without the name (`tie_bits`, from `tie`) and the name key's leading bits, in
/// [`Scratch::order`], sorted; rows with equal keys are ordered by full name. With `best`
/// below the rows, the order holds the best `best` keys and any others equal to the last of
/// them (ordered by name afterwards, they may take its place), sorted.
///
/// The sort itself moves plain `u64`s: the row index takes the key's lowest bits (the name key
/// gives them up, and the full-name fix-up orders rows those bits would have told apart).
fn sort_keys(
    scored: &Scored,
    default_scores: &[u8],
    s: &mut Scratch,
    best: usize,
    tie_bits: u32,
    tie: impl Fn(&ScoredRow, u8) -> u64,
) {
    let ranks = s.pair_ranks.for_weights(&scored.weights);
    let (rows, evals, name_keys) = (&scored.rows, &scored.evals, &s.name_keys);
    let name_shift = RANK_BITS + tie_bits;
    let key = |(i, row): (usize, &ScoredRow)| {
        let e = &evals[row.eval as usize];
        let d = default_scores[i];
        let rank = u64::from(ranks[PairRanks::pair(e.score, d)]);
        let name = name_keys[i].checked_shr(name_shift).unwrap_or(0);
        let key = (rank << (64 - RANK_BITS)) | (tie(row, d) << (64 - name_shift)) | name;
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
    sort_best(&mut s.packed, best, !row_mask);
    s.order.extend(
        s.packed
            .iter()
            .map(|&k| (k & !row_mask, (k & row_mask) as u32)),
    );
}

/// Sorts the `best` smallest of `keys` (compared whole), first selecting them when they are
/// fewer than the keys; keys equal to the last of them under `mask` are kept and sorted too.
fn sort_best(keys: &mut Vec<u64>, best: usize, mask: u64) {
    if best < keys.len() {
        let Some(last) = best.checked_sub(1) else {
            keys.clear();
            return;
        };
        keys.select_nth_unstable(last);
        let boundary = keys[last] & mask;
        let mut kept = best;
        for i in best..keys.len() {
            if keys[i] & mask == boundary {
                keys.swap(kept, i);
                kept += 1;
            }
        }
        keys.truncate(kept);
    }
    keys.sort_unstable();
}
