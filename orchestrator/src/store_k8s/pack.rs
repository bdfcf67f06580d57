//! Pieces of the ConfigMap store that need no API server: the bounded report-ID memory and
//! how snapshots and runs are cut into objects under [`OBJECT_BYTES`].

use super::{MAX_IDS_IN_MEMORY, OBJECT_BYTES};
use crate::state::StoredRun;
use crate::store::StoreError;
use std::collections::{HashSet, VecDeque};

/// Report IDs in arrival order, bounded.
#[derive(Default)]
pub(super) struct RecentIds {
    order: VecDeque<String>,
    set: HashSet<String>,
}

impl RecentIds {
    pub(super) fn insert(&mut self, id: String) {
        if self.set.insert(id.clone()) {
            self.order.push_back(id);
        }
        while self.order.len() > MAX_IDS_IN_MEMORY {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.set.contains(id)
    }

    pub(super) fn last(&self, n: usize) -> Vec<&String> {
        self.order
            .iter()
            .skip(self.order.len().saturating_sub(n))
            .collect()
    }
}

/// `s` in pieces of at most `max` bytes, cut at character boundaries.
pub(super) fn split_utf8(s: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let mut cut = rest.len().min(max);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (head, tail) = rest.split_at(cut);
        out.push(head);
        rest = tail;
    }
    out
}

/// Runs packed into JSON arrays of at most [`OBJECT_BYTES`]: (first seq, last seq, JSON).
pub(super) fn pack_runs(runs: &[StoredRun]) -> Result<Vec<(u64, u64, String)>, StoreError> {
    let mut out = Vec::new();
    let mut cur: Vec<String> = Vec::new();
    let (mut first, mut last, mut bytes) = (0, 0, 2);
    for r in runs {
        let one = serde_json::to_string(r)?;
        if one.len() + 2 > OBJECT_BYTES {
            return Err(StoreError::Conflict(format!(
                "run report {} is {} bytes, over the {OBJECT_BYTES}-byte object limit",
                r.report_id,
                one.len()
            )));
        }
        if !cur.is_empty() && bytes + one.len() + 1 > OBJECT_BYTES {
            out.push((first, last, format!("[{}]", cur.join(","))));
            cur.clear();
            bytes = 2;
        }
        if cur.is_empty() {
            first = r.seq;
        }
        last = r.seq;
        bytes += one.len() + 1;
        cur.push(one);
    }
    if !cur.is_empty() {
        out.push((first, last, format!("[{}]", cur.join(","))));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_split_at_character_boundaries_within_the_limit() {
        let s = "aé".repeat(1000);
        let parts = split_utf8(&s, 7);
        assert!(parts.iter().all(|p| p.len() <= 7 && !p.is_empty()));
        assert_eq!(parts.concat(), s);
        assert!(split_utf8("", 7).is_empty());
    }

    #[test]
    fn runs_are_packed_in_order_under_the_object_limit() {
        let runs: Vec<StoredRun> = (1..=4000)
            .map(|seq| StoredRun {
                seq,
                report_id: format!("report-{seq}-{}", "x".repeat(200)),
                ..crate::store::tests::run("r")
            })
            .collect();
        let packed = pack_runs(&runs).unwrap();
        assert!(
            packed.len() > 1,
            "4,000 runs of ~500 bytes need several objects"
        );
        let mut next = 1;
        for (first, last, json) in &packed {
            assert!(json.len() <= OBJECT_BYTES);
            let back: Vec<StoredRun> = serde_json::from_str(json).unwrap();
            assert_eq!((back[0].seq, back[back.len() - 1].seq), (*first, *last));
            assert_eq!(*first, next);
            next = last + 1;
        }
        assert_eq!(next, 4001);
    }
}
