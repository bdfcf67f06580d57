//! The run ledger: which observation each keyed run currently contributes, so that a run's newer
//! in-progress snapshot replaces its earlier one and its final report replaces them all.
//!
//! A node agent reports a long run every minute while it runs and once when it ends. Counting each
//! snapshot as a run would let one ten-hour job flood a cell's window with hundreds of copies of
//! itself; the ledger keeps exactly one observation per run key. Its size is bounded
//! ([`crate::SchedulerConfig::max_tracked_runs`]): when full, the oldest entry is forgotten, and if
//! that run was still in progress its provisional observation is withdrawn from the model (a run
//! that never reports again must not linger as half a run).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where a keyed run's current observation lives, and whether it is final.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunEntry {
    /// Internal class key (class and GPU count) of the observation.
    pub class_key: String,
    /// Node it ran on.
    pub node: String,
    /// Device-profile key of the observation's cell.
    pub profile_key: String,
    /// Identifier stored in the observation ([`crate::predict::Obs::run`]).
    pub id: u64,
    /// Snapshot (or end) time of the current observation.
    pub end: f64,
    /// The final report arrived: later snapshots of this run are stale.
    pub completed: bool,
    /// Insertion order, for eviction.
    pub seq: u64,
}

/// Keyed runs, bounded.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunLedger {
    pub entries: BTreeMap<String, RunEntry>,
    /// `seq -> key`, oldest first.
    pub order: BTreeMap<u64, String>,
    pub next_seq: u64,
}

/// A stable 64-bit identifier of a run key (FNV-1a); never 0, which means "no run key".
pub(crate) fn run_id(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

impl RunLedger {
    pub fn get(&self, key: &str) -> Option<&RunEntry> {
        self.entries.get(key)
    }

    /// Records `entry` under `key` (replacing any older entry of the key) and returns the entries
    /// evicted to stay within `cap`.
    pub fn insert(&mut self, key: &str, mut entry: RunEntry, cap: usize) -> Vec<RunEntry> {
        if let Some(old) = self.entries.remove(key) {
            self.order.remove(&old.seq);
        }
        entry.seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(entry.seq, key.to_owned());
        self.entries.insert(key.to_owned(), entry);
        let mut evicted = Vec::new();
        while self.entries.len() > cap.max(1) {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some(e) = self.entries.remove(&oldest) {
                evicted.push(e);
            }
        }
        evicted
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(end: f64) -> RunEntry {
        RunEntry {
            class_key: "c".into(),
            node: "n".into(),
            profile_key: "p".into(),
            id: 1,
            end,
            completed: false,
            seq: 0,
        }
    }

    #[test]
    fn bounded_and_evicts_oldest_first() {
        let mut l = RunLedger::default();
        assert!(l.insert("a", entry(1.0), 2).is_empty());
        assert!(l.insert("b", entry(2.0), 2).is_empty());
        // Re-inserting "a" makes it the newest: "b" is now the oldest.
        assert!(l.insert("a", entry(3.0), 2).is_empty());
        let ev = l.insert("c", entry(4.0), 2);
        assert_eq!(ev.iter().map(|e| e.end).collect::<Vec<_>>(), vec![2.0]);
        assert_eq!(l.len(), 2);
        assert!(l.get("b").is_none() && l.get("a").is_some());
        assert_eq!(l.order.len(), 2);
    }

    #[test]
    fn ids_are_stable_and_never_zero() {
        assert_eq!(run_id("pod-1"), run_id("pod-1"));
        assert_ne!(run_id("pod-1"), run_id("pod-2"));
        assert_ne!(run_id(""), 0);
    }
}
