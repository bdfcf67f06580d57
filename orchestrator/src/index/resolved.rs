//! The last candidate list the index resolved to slots, for the next call that sends it again.
//!
//! kube-scheduler sends the extender the same `NodeNames`, in the same order, for pod after
//! pod: every node that passed its own filters, which in a cluster with room is all of them. At
//! 5,000 candidates, looking each name up in [`super::Index`]'s table was most of building the
//! ranking input (a hash and, for the key comparison, a read of the name where the table keeps
//! it: two cache misses per name). Comparing each name with the same position of the last list,
//! kept as one contiguous buffer read front to back, gives the same slots for a fraction of
//! that.
//!
//! A slot is reused only for the same name at the same position, and only while no name has
//! gained or lost its slot since (the index's `slots_epoch`), so the answer is always what the
//! table would give. A list that differs from some position on is looked up from there and
//! becomes the new last list. One list is kept: its size is bounded by the request limits
//! (`MAX_NODE_NAMES` names of at most `MAX_OBJECT_NAME_LEN` bytes).

use std::sync::{Arc, Mutex};

/// A name without a slot (unknown to the index).
const NO_SLOT: u32 = u32::MAX;

/// One resolved list: the names one after another, and per name its end and slot.
#[derive(Debug)]
pub(super) struct ResolvedNames {
    /// The index's `slots_epoch` the slots were read at.
    epoch: u64,
    bytes: Box<[u8]>,
    /// Per name: the end of its bytes, its slot or [`NO_SLOT`].
    ends: Box<[(u32, u32)]>,
}

impl ResolvedNames {
    /// The slot of `name` as position `i` of the list, if the list had exactly `name` there:
    /// `Some(None)` for a name without a slot.
    #[inline]
    pub(super) fn slot(&self, i: usize, name: &str) -> Option<Option<u32>> {
        let &(end, slot) = self.ends.get(i)?;
        let start = match i {
            0 => 0,
            _ => self.ends.get(i - 1)?.0,
        };
        let kept = self.bytes.get(start as usize..end as usize)?;
        (kept == name.as_bytes()).then_some((slot != NO_SLOT).then_some(slot))
    }

    /// Names in the list.
    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }
}

/// A list being resolved by a call whose names differ from the last list's.
#[derive(Debug, Default)]
pub(super) struct NamesBuilder {
    bytes: Vec<u8>,
    ends: Vec<(u32, u32)>,
}

impl NamesBuilder {
    /// Starts with the first `n` names of `last` (which the call sent the same), for a list of
    /// about `expected` names.
    pub(super) fn with_prefix(last: Option<&ResolvedNames>, n: usize, expected: usize) -> Self {
        let mut b = Self {
            bytes: Vec::new(),
            ends: Vec::with_capacity(expected),
        };
        if let Some(last) = last {
            let n = n.min(last.ends.len());
            let ends = &last.ends[..n];
            let end = ends.last().map_or(0, |e| e.0 as usize);
            b.bytes
                .reserve(end.saturating_mul(expected) / n.max(1) + 16);
            b.bytes.extend_from_slice(&last.bytes[..end]);
            b.ends.extend_from_slice(ends);
        }
        b
    }

    /// Appends the next name and its slot. A list too long for `u32` offsets is not kept
    /// (the request limits keep real ones far below).
    pub(super) fn push(&mut self, name: &str, slot: Option<u32>) {
        self.bytes.extend_from_slice(name.as_bytes());
        let end = u32::try_from(self.bytes.len()).unwrap_or(u32::MAX);
        self.ends.push((end, slot.unwrap_or(NO_SLOT)));
    }

    fn finish(self, epoch: u64) -> Option<ResolvedNames> {
        u32::try_from(self.bytes.len()).ok()?;
        Some(ResolvedNames {
            epoch,
            bytes: self.bytes.into_boxed_slice(),
            ends: self.ends.into_boxed_slice(),
        })
    }
}

/// The last list (see the module docs). Calls read it under a short lock and share it.
#[derive(Debug, Default)]
pub(super) struct LastNames(Mutex<Option<Arc<ResolvedNames>>>);

impl LastNames {
    /// The last list, if its slots are still those of `epoch`.
    pub(super) fn get(&self, epoch: u64) -> Option<Arc<ResolvedNames>> {
        let last = self.0.lock().ok()?;
        last.as_ref().filter(|l| l.epoch == epoch).cloned()
    }

    /// Keeps `list`, resolved at `epoch`, as the last list.
    pub(super) fn put(&self, list: NamesBuilder, epoch: u64) {
        let list = list.finish(epoch).map(Arc::new);
        if let Ok(mut last) = self.0.lock() {
            *last = list;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(names: &[(&str, Option<u32>)], epoch: u64) -> ResolvedNames {
        let mut b = NamesBuilder::default();
        for (n, s) in names {
            b.push(n, *s);
        }
        b.finish(epoch).unwrap()
    }

    #[test]
    fn a_slot_is_given_only_for_the_same_name_at_the_same_position() {
        let l = list(&[("a", Some(3)), ("bb", None), ("c", Some(0))], 1);
        assert_eq!(l.slot(0, "a"), Some(Some(3)));
        assert_eq!(l.slot(1, "bb"), Some(None));
        assert_eq!(l.slot(2, "c"), Some(Some(0)));
        assert_eq!(l.slot(1, "b"), None, "a prefix of the kept name");
        assert_eq!(l.slot(1, "bbb"), None, "the kept name is a prefix");
        assert_eq!(l.slot(0, "c"), None, "another position");
        assert_eq!(l.slot(3, "d"), None, "past the end");
    }

    #[test]
    fn a_new_list_keeps_the_prefix_it_shares_with_the_last() {
        let last = list(&[("a", Some(3)), ("bb", None), ("c", Some(0))], 1);
        let mut b = NamesBuilder::with_prefix(Some(&last), 2, 3);
        b.push("d", Some(7));
        let new = b.finish(1).unwrap();
        assert_eq!(new.len(), 3);
        assert_eq!(new.slot(0, "a"), Some(Some(3)));
        assert_eq!(new.slot(1, "bb"), Some(None));
        assert_eq!(new.slot(2, "d"), Some(Some(7)));
        assert_eq!(new.slot(2, "c"), None);
    }

    #[test]
    fn a_list_from_another_epoch_is_not_given() {
        let last = LastNames::default();
        let mut b = NamesBuilder::default();
        b.push("a", Some(1));
        last.put(b, 4);
        assert!(last.get(4).is_some());
        assert!(
            last.get(5).is_none(),
            "a name gained or lost its slot since"
        );
    }
}
