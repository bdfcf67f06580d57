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
use std::sync::Arc;

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

/// Shards of the ledger. The orchestrator's learner copies the model for every publish, and the
/// ledger as one map of 10,000 keyed runs was most of that copy: 6.0-6.6 of 10.7-11.3 ms after
/// 40,000 runs over 1,000 classes. Shared shards make its part of a copy 256 reference counts
/// (the whole copy 2.8 ms), and the first change to a shard after a copy copies that shard
/// alone, so the ledger's share of a publish is what changed since the last one.
const SHARDS: usize = 256;

/// Keyed runs, bounded, in [`SHARDS`] shards by the key's [`run_id`], each shared between copies
/// of the model until one of them changes it. Serialised as one map of entries and one of their
/// order, as before it was sharded, so stored models load either way.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RunLedger {
    shards: Vec<Arc<Shard>>,
    len: usize,
    next_seq: u64,
}

/// The keyed runs whose key hashes to one shard, and their insertion order.
#[derive(Clone, Debug, Default, PartialEq)]
struct Shard {
    entries: BTreeMap<String, RunEntry>,
    /// `seq -> key`, oldest first.
    order: BTreeMap<u64, String>,
}

impl Default for RunLedger {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Default::default()).collect(),
            len: 0,
            next_seq: 0,
        }
    }
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
    fn shard_of(key: &str) -> usize {
        (run_id(key) % SHARDS as u64) as usize
    }

    pub fn get(&self, key: &str) -> Option<&RunEntry> {
        self.shards.get(Self::shard_of(key))?.entries.get(key)
    }

    /// Records `entry` under `key` (replacing any older entry of the key) and returns the entries
    /// evicted to stay within `cap`, oldest first.
    pub fn insert(&mut self, key: &str, mut entry: RunEntry, cap: usize) -> Vec<RunEntry> {
        let shard = Arc::make_mut(&mut self.shards[Self::shard_of(key)]);
        if let Some(old) = shard.entries.remove(key) {
            shard.order.remove(&old.seq);
            self.len -= 1;
        }
        entry.seq = self.next_seq;
        self.next_seq += 1;
        shard.order.insert(entry.seq, key.to_owned());
        shard.entries.insert(key.to_owned(), entry);
        self.len += 1;
        let mut evicted = Vec::new();
        while self.len > cap.max(1) {
            // The oldest entry is the smallest first seq over the shards.
            let Some(i) = (0..self.shards.len())
                .filter_map(|i| Some((*self.shards[i].order.first_key_value()?.0, i)))
                .min()
                .map(|(_, i)| i)
            else {
                break;
            };
            let shard = Arc::make_mut(&mut self.shards[i]);
            let Some((_, oldest)) = shard.order.pop_first() else {
                break;
            };
            if let Some(e) = shard.entries.remove(&oldest) {
                evicted.push(e);
                self.len -= 1;
            }
        }
        evicted
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// A ledger of `entries` (each keeps its `seq`), the next insertion numbered `next_seq` or
    /// after the newest entry, whichever is later: a stored `next_seq` behind its entries (damage)
    /// would give a new run the seq of an old one, and one of the two would never be evicted.
    fn from_flat(entries: impl IntoIterator<Item = (String, RunEntry)>, next_seq: u64) -> Self {
        let mut ledger = Self {
            next_seq,
            ..Self::default()
        };
        for (key, entry) in entries {
            ledger.next_seq = ledger.next_seq.max(entry.seq.saturating_add(1));
            let shard = Arc::make_mut(&mut ledger.shards[Self::shard_of(&key)]);
            shard.order.insert(entry.seq, key.clone());
            if shard.entries.insert(key, entry).is_none() {
                ledger.len += 1;
            }
        }
        ledger
    }
}

/// The stored form: one map of entries by key and one of keys by insertion order.
#[derive(Serialize)]
struct FlatRef<'a> {
    entries: BTreeMap<&'a str, &'a RunEntry>,
    order: BTreeMap<u64, &'a str>,
    next_seq: u64,
}

/// [`FlatRef`], read back.
#[derive(Deserialize)]
struct Flat {
    entries: BTreeMap<String, RunEntry>,
    order: BTreeMap<u64, String>,
    next_seq: u64,
}

impl Serialize for RunLedger {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let shards = || self.shards.iter();
        FlatRef {
            entries: shards()
                .flat_map(|s| s.entries.iter().map(|(k, e)| (k.as_str(), e)))
                .collect(),
            order: shards()
                .flat_map(|s| s.order.iter().map(|(q, k)| (*q, k.as_str())))
                .collect(),
            next_seq: self.next_seq,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RunLedger {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let flat = Flat::deserialize(deserializer)?;
        // The entries carry their own seq; `order` is what they say, so it is rebuilt from them
        // (a stored order that disagreed could only have come from damage).
        let _ = flat.order;
        Ok(Self::from_flat(flat.entries, flat.next_seq))
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
    }

    /// Over many shards the ledger still keeps the newest `cap` keys and evicts the oldest first.
    #[test]
    fn eviction_is_oldest_first_across_shards() {
        let mut l = RunLedger::default();
        let mut evicted = Vec::new();
        for i in 0..1000 {
            for e in l.insert(&format!("run-{i}"), entry(f64::from(i)), 100) {
                evicted.push(e.end);
            }
        }
        assert_eq!(l.len(), 100);
        assert_eq!(evicted, (0..900).map(f64::from).collect::<Vec<_>>());
        assert!((900..1000).all(|i| l.get(&format!("run-{i}")).is_some()));
        assert!(l.get("run-899").is_none());
    }

    /// A copy of the model shares every shard; a change to the copy copies the one shard it
    /// touches and leaves the original as it was.
    #[test]
    fn a_copy_shares_its_shards_until_one_changes() {
        let mut l = RunLedger::default();
        for i in 0..2000 {
            l.insert(&format!("run-{i}"), entry(1.0), 10_000);
        }
        let mut copy = l.clone();
        let shared = |a: &RunLedger, b: &RunLedger| {
            a.shards
                .iter()
                .zip(&b.shards)
                .filter(|(x, y)| Arc::ptr_eq(x, y))
                .count()
        };
        assert_eq!(shared(&l, &copy), SHARDS);
        copy.insert("new", entry(2.0), 10_000);
        assert_eq!(shared(&l, &copy), SHARDS - 1);
        assert!(l.get("new").is_none() && copy.get("new").is_some());
        assert_eq!((l.len(), copy.len()), (2000, 2001));
    }

    /// Stored models keep the form from before the shards: one map of entries by key, one of
    /// keys by insertion order, and the next seq; reading it back gives the same ledger, which
    /// evicts in the same order.
    #[test]
    fn the_stored_form_is_one_map_as_before() {
        let mut l = RunLedger::default();
        for (i, key) in ["b", "a", "c"].into_iter().enumerate() {
            l.insert(key, entry(i as f64), 10);
        }
        l.insert("b", entry(9.0), 10);
        let json = serde_json::to_value(&l).expect("serialises");
        let e = |end: f64, seq: u64| {
            serde_json::json!({"class_key": "c", "node": "n", "profile_key": "p", "id": 1,
                "end": end, "completed": false, "seq": seq})
        };
        assert_eq!(
            json,
            serde_json::json!({
                "entries": {"a": e(1.0, 1), "b": e(9.0, 3), "c": e(2.0, 2)},
                "order": {"1": "a", "2": "c", "3": "b"},
                "next_seq": 4,
            })
        );
        let mut back: RunLedger = serde_json::from_value(json.clone()).expect("reads back");
        assert_eq!(back, l);
        let gone = back.insert("d", entry(4.0), 3);
        assert_eq!(gone.iter().map(|e| e.end).collect::<Vec<_>>(), vec![1.0]);

        // A stored next_seq behind its entries: new runs still number after the newest.
        let mut damaged = json;
        damaged["next_seq"] = serde_json::json!(0);
        let mut back: RunLedger = serde_json::from_value(damaged).expect("reads back");
        for (i, key) in ["d", "e", "f"].into_iter().enumerate() {
            back.insert(key, entry(10.0 + i as f64), 3);
        }
        assert_eq!(back.len(), 3);
        assert!(["d", "e", "f"].iter().all(|k| back.get(k).is_some()));
    }

    #[test]
    fn ids_are_stable_and_never_zero() {
        assert_eq!(run_id("pod-1"), run_id("pod-1"));
        assert_ne!(run_id("pod-1"), run_id("pod-2"));
        assert_ne!(run_id(""), 0);
    }
}
