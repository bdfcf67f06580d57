//! [`NameSlots`]: node name → slot, the table every ranking call looks each candidate up in.
//!
//! At 5,000 candidates per call the lookups were a fifth of the extender's handler, and most of
//! that was confirming the match: a hash map keyed by [`Name`] compares the asked text with the
//! key's, which lives in its own allocation somewhere in the heap, one likely cache miss (and a
//! call into libc's `memcmp`) per candidate. Here the keys' text lives in one buffer, each
//! name's bytes at its slot's span, and a probe compares a 32-bit tag of the name's hash before
//! it reads any text: a match is confirmed within a few tens of kilobytes that stay in cache,
//! and a mismatch almost never reads text at all.
//!
//! Open addressing with linear probing, at most half full, deletion by backward shift (no
//! tombstones, so probes stay short however many nodes come and go). The hash is not keyed:
//! names come from the cluster's own Node objects and authenticated reports, as with
//! [`crate::fasthash`].

use kudos_scheduler_core::{Name, tail_word};

/// An empty bucket.
const EMPTY: Bucket = Bucket {
    tag: 0,
    slot: u32::MAX,
};

/// Smallest table (buckets).
const MIN_BUCKETS: usize = 16;

/// Garbage (bytes of removed names) allowed in the text buffer beyond its live bytes before it
/// is rewritten.
const MIN_GARBAGE: usize = 4096;

/// Bytes the processor moves into its caches at once.
const CACHE_LINE: usize = 64;

/// A call looking up at least one name per this many buckets reads the table in address order
/// first ([`NameSlots::warm`]): one name per cache line of buckets, on average.
const WARM_EVERY_BUCKETS: usize = CACHE_LINE / size_of::<Bucket>();

/// Eight bytes, so that the table for 5,000 names (16,384 buckets) is 128 KiB: a ranking call
/// probes it once per candidate in no order, and its other buffers compete for the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bucket {
    /// The name's hash, its high half: the bucket it belongs in is `tag & mask`, and a probe
    /// compares the whole tag before any text.
    tag: u32,
    /// The name's slot, `u32::MAX` for an empty bucket.
    slot: u32,
}

/// Where a slot's name is in [`NameSlots::text`].
#[derive(Clone, Copy, Debug, Default)]
struct Span {
    start: u32,
    len: u32,
}

/// Node name → slot. Slots are the caller's (the index hands them out and reuses them); a slot
/// holds at most one name.
#[derive(Default)]
pub(super) struct NameSlots {
    buckets: Vec<Bucket>,
    /// Per slot, its name (shared with every state built for it), `None` when free.
    names: Vec<Option<Name>>,
    /// Per slot, where its name's bytes are in `text`.
    spans: Vec<Span>,
    text: Vec<u8>,
    /// Bytes of `text` that belong to no name any more.
    garbage: usize,
    len: usize,
}

/// The tag of a name: its bytes in 8-byte words, each mixed in by multiplication, then a final
/// avalanche so that every bit of the tag (its low bits pick the bucket) depends on every byte.
/// A last partial word is read by [`tail_word`] (copying it out was about 40 % of a lookup).
fn tag(name: &[u8]) -> u32 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = (name.len() as u64).wrapping_mul(K);
    let mut mix = |w: u64| h = (h ^ w).wrapping_mul(K).rotate_left(29);
    let mut words = name.chunks_exact(8);
    for w in &mut words {
        mix(word(w));
    }
    if !words.remainder().is_empty() {
        mix(tail_word(name));
    }
    h ^= h >> 32;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    ((h ^ (h >> 29)) >> 32) as u32
}

/// 8 bytes as a little-endian word (`b` holds at least 8).
#[inline]
fn word(b: &[u8]) -> u64 {
    b.first_chunk::<8>().map_or(0, |w| u64::from_le_bytes(*w))
}

/// Byte equality without a call out for the short texts node names are: whole words, then the
/// rest as one word each ([`tail_word`]; the lengths are equal, so the words are equal exactly
/// when the bytes are).
#[inline]
fn same_text(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len()
        && a.chunks_exact(8)
            .zip(b.chunks_exact(8))
            .all(|(x, y)| word(x) == word(y))
        && tail_word(a) == tail_word(b)
}

/// As the map it is (name → slot), not its buffers.
impl std::fmt::Debug for NameSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(n, slot)| (n.as_str(), slot)))
            .finish()
    }
}

impl NameSlots {
    /// Names held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no name is held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn mask(&self) -> usize {
        self.buckets.len().wrapping_sub(1)
    }

    /// The text of the name in `slot`.
    fn text_of(&self, slot: u32) -> &[u8] {
        let s = self.spans[slot as usize];
        &self.text[s.start as usize..(s.start + s.len) as usize]
    }

    /// The bucket holding `name`, if any.
    fn find(&self, name: &str) -> Option<usize> {
        self.find_tagged(name, tag(name.as_bytes()))
    }

    /// The bucket holding `name`, whose tag is `tag`, if any.
    fn find_tagged(&self, name: &str, tag: u32) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.mask();
        let mut i = tag as usize & mask;
        loop {
            let b = self.buckets[i];
            if b.slot == u32::MAX {
                return None;
            }
            if b.tag == tag && same_text(self.text_of(b.slot), name.as_bytes()) {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// `name`'s slot.
    pub fn get(&self, name: &str) -> Option<u32> {
        self.slot_tagged(name, tag(name.as_bytes()))
    }

    /// The slot of `name`, whose tag is `tag`.
    fn slot_tagged(&self, name: &str, tag: u32) -> Option<u32> {
        self.find_tagged(name, tag).map(|i| self.buckets[i].slot)
    }

    /// Each name's slot, in order: `each(position, name, slot)`. The buckets of a batch of
    /// names are read before any of them is probed: those reads do not depend on one another,
    /// so their cache misses overlap, where one probe after another waited for each in turn
    /// (a probe's branches keep the processor from running far ahead into the next).
    pub fn get_each<'n>(
        &self,
        names: &[&'n str],
        mut each: impl FnMut(usize, &'n str, Option<u32>),
    ) {
        const BATCH: usize = 8;
        if names.len() >= self.buckets.len() / WARM_EVERY_BUCKETS {
            self.warm();
        }
        let mask = self.mask();
        for (b, batch) in names.chunks(BATCH).enumerate() {
            let mut tags = [0u32; BATCH];
            let mut read = 0u32;
            for (t, name) in tags.iter_mut().zip(batch) {
                *t = tag(name.as_bytes());
                if let Some(bucket) = self.buckets.get(*t as usize & mask) {
                    read ^= bucket.slot;
                }
            }
            // Keeps the reads: their only purpose is to bring the buckets into the cache.
            std::hint::black_box(read);
            for (k, (&t, &name)) in tags.iter().zip(batch).enumerate() {
                each(b * BATCH + k, name, self.slot_tagged(name, t));
            }
        }
    }

    /// Reads one word of every cache line of the buckets, the spans and the text, front to
    /// back. Between two calls kube-scheduler (and the API server) run on the same cores and
    /// push these out of the caches; a call over thousands of names then finds every probe's
    /// bucket, span and text cold, three dependent misses per name that the batching above
    /// overlaps only eight at a time. Read in address order they stream in at memory bandwidth
    /// (about 200 KiB at 5,000 names), and the probes that follow hit the cache.
    fn warm(&self) {
        let mut read = 0u32;
        for b in self.buckets.iter().step_by(WARM_EVERY_BUCKETS) {
            read ^= b.slot;
        }
        for s in self.spans.iter().step_by(CACHE_LINE / size_of::<Span>()) {
            read ^= s.start;
        }
        for &t in self.text.iter().step_by(CACHE_LINE) {
            read ^= u32::from(t);
        }
        std::hint::black_box(read);
    }

    /// Whether `name` has a slot.
    #[cfg(test)]
    pub fn contains_key(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    /// The name in `slot`, as the table keeps it (shared), without a lookup.
    pub fn name(&self, slot: u32) -> Option<&Name> {
        self.names.get(slot as usize)?.as_ref()
    }

    /// Every name and its slot, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (&Name, u32)> {
        self.names
            .iter()
            .enumerate()
            .filter_map(|(slot, n)| Some((n.as_ref()?, slot as u32)))
    }

    /// Gives `name` (not held yet) `slot` (free in this table).
    pub fn insert(&mut self, name: Name, slot: u32) {
        debug_assert!(self.find(&name).is_none(), "{} held twice", name.as_str());
        if (self.len + 1) * 2 > self.buckets.len() {
            self.grow();
        }
        let s = slot as usize;
        if self.names.len() <= s {
            self.names.resize(s + 1, None);
            self.spans.resize(s + 1, Span::default());
        }
        debug_assert!(self.names[s].is_none(), "slot {slot} held twice");
        self.spans[s] = Span {
            start: self.text.len() as u32,
            len: name.len() as u32,
        };
        self.text.extend_from_slice(name.as_bytes());
        self.place(Bucket {
            tag: tag(name.as_bytes()),
            slot,
        });
        self.names[s] = Some(name);
        self.len += 1;
    }

    /// Puts `b` in the first empty bucket from its own.
    fn place(&mut self, b: Bucket) {
        let mask = self.mask();
        let mut i = b.tag as usize & mask;
        while self.buckets[i].slot != u32::MAX {
            i = (i + 1) & mask;
        }
        self.buckets[i] = b;
    }

    fn grow(&mut self) {
        // More buckets than a tag has bits for would leave the high ones unused.
        let buckets = (self.buckets.len() * 2).clamp(MIN_BUCKETS, 1 << 32);
        let old = std::mem::replace(&mut self.buckets, vec![EMPTY; buckets]);
        for b in old.into_iter().filter(|b| b.slot != u32::MAX) {
            self.place(b);
        }
    }

    /// Takes `name` out; its slot, if it had one.
    pub fn remove(&mut self, name: &str) -> Option<u32> {
        let i = self.find(name)?;
        let slot = self.buckets[i].slot;
        self.empty_bucket(i);
        self.release(slot);
        Some(slot)
    }

    /// Keeps only the names for which `keep(name, slot)` holds.
    pub fn retain(&mut self, mut keep: impl FnMut(&Name, u32) -> bool) {
        let gone: Vec<Name> = self
            .iter()
            .filter(|&(n, slot)| !keep(n, slot))
            .map(|(n, _)| n.clone())
            .collect();
        for n in gone {
            self.remove(&n);
        }
    }

    /// Frees `slot`'s name and text.
    fn release(&mut self, slot: u32) {
        let s = slot as usize;
        self.names[s] = None;
        self.garbage += std::mem::take(&mut self.spans[s]).len as usize;
        self.len -= 1;
        if self.garbage > MIN_GARBAGE && self.garbage > self.text.len() / 2 {
            self.rewrite_text();
        }
    }

    /// Rewrites the text buffer with the live names only.
    fn rewrite_text(&mut self) {
        let mut text = Vec::with_capacity(self.text.len() - self.garbage);
        for (span, name) in self.spans.iter_mut().zip(&self.names) {
            if let Some(n) = name {
                *span = Span {
                    start: text.len() as u32,
                    len: n.len() as u32,
                };
                text.extend_from_slice(n.as_bytes());
            }
        }
        self.text = text;
        self.garbage = 0;
    }

    /// Empties bucket `i`, moving later buckets of the same run back so that every name stays
    /// reachable from its own bucket without a gap (backward-shift deletion).
    fn empty_bucket(&mut self, mut i: usize) {
        let mask = self.mask();
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let b = self.buckets[j];
            if b.slot == u32::MAX {
                break;
            }
            let home = b.tag as usize & mask;
            // `b` may move to `i` unless its own bucket lies after `i` on the way to `j`.
            let stays = if i <= j {
                i < home && home <= j
            } else {
                i < home || home <= j
            };
            if !stays {
                self.buckets[i] = b;
                i = j;
            }
        }
        self.buckets[i] = EMPTY;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::collections::hash_map::Entry;

    /// `same_text` is byte equality at every length around the word sizes it reads in,
    /// whichever byte differs; equal texts get equal tags, and texts one byte apart different
    /// ones (these fixed texts do not collide in 32 bits).
    #[test]
    fn same_text_and_tag_read_every_byte() {
        for n in 0..=26usize {
            let a: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
            assert!(same_text(&a, &a.clone()), "len {n}");
            assert_eq!(tag(&a), tag(&a.clone()));
            for p in 0..n {
                let mut b = a.clone();
                b[p] = b'-';
                assert!(!same_text(&a, &b), "len {n}, byte {p}");
                assert_ne!(tag(&a), tag(&b), "len {n}, byte {p}");
            }
            let longer = [a.as_slice(), b"x"].concat();
            assert!(!same_text(&a, &longer), "len {n} against {}", n + 1);
            // A zero byte added is still another name (the length is in the tag).
            let zero = [a.as_slice(), b"\0"].concat();
            assert_ne!(tag(&a), tag(&zero), "len {n} and a zero byte");
        }
    }

    /// Random inserts and removes against a `HashMap`, with enough names for long runs of
    /// occupied buckets and text rewrites.
    #[test]
    fn agrees_with_a_hash_map_through_inserts_and_removes() {
        let mut table = NameSlots::default();
        let mut model: HashMap<String, u32> = HashMap::new();
        let mut free: Vec<u32> = Vec::new();
        let mut next_slot = 0u32;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for step in 0..40_000 {
            let name = format!("node-{}{}", rnd(3000), "x".repeat(rnd(20) as usize));
            if rnd(3) == 0 {
                let slot = model.remove(&name);
                assert_eq!(table.remove(&name), slot, "remove {name}");
                assert_eq!(table.get(&name), None, "{name} removed");
                free.extend(slot);
            } else if let Entry::Vacant(vacant) = model.entry(name) {
                // Freed slots are reused, as the index does.
                let slot = free.pop().unwrap_or_else(|| {
                    next_slot += 1;
                    next_slot - 1
                });
                table.insert(Name::from(vacant.key().as_str()), slot);
                vacant.insert(slot);
            }
            if step % 997 == 0 {
                for (n, &slot) in &model {
                    assert_eq!(table.get(n), Some(slot), "{n} at step {step}");
                    let kept = table.name(slot).map(Name::as_str);
                    assert_eq!(kept, Some(n.as_str()), "slot {slot}");
                }
                assert_eq!(table.len(), model.len());
                assert_eq!(table.iter().count(), model.len());
                assert_eq!(table.get("never-asked"), None);
            }
        }
        let live: usize = model.keys().map(String::len).sum();
        assert!(
            table.text.len() <= 2 * live + MIN_GARBAGE,
            "text {} for {live} live bytes",
            table.text.len()
        );
    }
    #[test]
    fn retain_keeps_exactly_what_it_is_told_and_slots_are_reused() {
        let mut table = NameSlots::default();
        for i in 0..100u32 {
            table.insert(Name::from(format!("n{i}")), i);
        }
        table.retain(|_, slot| slot % 3 == 0);
        assert_eq!(table.len(), 34);
        for i in 0..100u32 {
            let want = (i % 3 == 0).then_some(i);
            assert_eq!(table.get(&format!("n{i}")), want, "n{i}");
        }
        table.insert(Name::from("newcomer"), 1);
        assert_eq!(table.get("newcomer"), Some(1));
        assert_eq!(table.name(1).map(Name::as_str), Some("newcomer"));
        let slots: Vec<u32> = table.iter().map(|(_, s)| s).collect();
        assert!(
            slots.windows(2).all(|w| w[0] < w[1]),
            "slot order: {slots:?}"
        );
    }

    #[test]
    fn names_that_differ_only_in_length_or_late_bytes_are_told_apart() {
        let mut table = NameSlots::default();
        let names = [
            "a",
            "a\0",
            "abcdefgh",
            "abcdefghi",
            "abcdefgh\0",
            "",
            "abcdefgi",
        ];
        for (slot, n) in names.iter().enumerate() {
            table.insert(Name::from(*n), slot as u32);
        }
        for (slot, n) in names.iter().enumerate() {
            assert_eq!(table.get(n), Some(slot as u32), "{n:?}");
        }
        assert_eq!(table.get("abcdefghj"), None);
        assert!(same_text(b"0123456789abcdefX", b"0123456789abcdefX"));
        assert!(!same_text(b"0123456789abcdefX", b"0123456789abcdefY"));
        assert!(!same_text(b"0123456789abcdef", b"0123456789abcdefY"));
    }
}
