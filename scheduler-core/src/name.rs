//! [`Name`]: a name (of a node, a device vendor, a device model) shared rather than copied.
//!
//! Every ranking names each candidate once in its answer, and the caller builds the candidates,
//! each with its device profile, from its own index for every call; at thousands of nodes a
//! `String` per name per call was a fifth of `rank`'s time and a third of the orchestrator's
//! candidate lookup (an allocation, a copy and a free each). A `Name` is a reference count to
//! one allocation, so passing it along is an increment.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A shared name. Dereferences to `str`; serialises as a JSON string; hashes, compares and
/// orders as its text.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(Arc<str>);

impl Name {
    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether both are the same allocation (so certainly equal), without reading the text.
    pub fn same_allocation(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }

    /// Where the text lives, for a cache keyed by allocation.
    pub(crate) fn address(&self) -> usize {
        self.0.as_ptr() as usize
    }
}

/// The bytes after the last whole 8-byte word of `bytes`, little-endian in a word whose other
/// bytes are zero: what copying them into a zeroed word gives, read without that copy. The copy
/// is a call to `memcpy` (its length varies) and a store that the load after it has to wait
/// for; in the orchestrator's name table it was about 40 % of a lookup. Read instead from
/// the slice itself: the 8 bytes ending it, shifted, when it has 8; else two overlapping 4-byte
/// reads, or the bytes one by one under 4.
#[inline]
pub fn tail_word(bytes: &[u8]) -> u64 {
    let r = bytes.len() % 8;
    let last = |n: usize| &bytes[bytes.len() - n..];
    let word4 = |b: &[u8]| {
        b.first_chunk::<4>()
            .map_or(0, |w| u64::from(u32::from_le_bytes(*w)))
    };
    match r {
        0 => 0,
        _ if bytes.len() >= 8 => {
            let w = last(8)
                .first_chunk::<8>()
                .map_or(0, |w| u64::from_le_bytes(*w));
            w >> ((8 - r) * 8)
        }
        4.. => word4(bytes) | (word4(last(4)) << ((r - 4) * 8)),
        _ => bytes.iter().rev().fold(0, |v, &b| (v << 8) | u64::from(b)),
    }
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Self {
        Self(Arc::from(s))
    }
}

impl From<String> for Name {
    fn from(s: String) -> Self {
        Self(Arc::from(s))
    }
}

impl From<&String> for Name {
    fn from(s: &String) -> Self {
        Self(Arc::from(s.as_str()))
    }
}

impl From<Name> for String {
    fn from(n: Name) -> Self {
        n.0.as_ref().to_owned()
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tail_word` is exactly the copy into a zeroed word that it replaces, at every length.
    #[test]
    fn tail_word_is_the_zero_padded_remainder() {
        let bytes: Vec<u8> = (1u8..=40).map(|i| i.wrapping_mul(37)).collect();
        for n in 0..=bytes.len() {
            let b = &bytes[..n];
            let rest = b.chunks_exact(8).remainder();
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            assert_eq!(tail_word(b), u64::from_le_bytes(w), "length {n}");
        }
    }

    #[test]
    fn serialises_as_a_plain_string_and_compares_with_str() {
        let n = Name::from("gpu-a");
        assert_eq!(serde_json::to_string(&n).expect("json"), "\"gpu-a\"");
        let back: Name = serde_json::from_str("\"gpu-a\"").expect("parse");
        assert_eq!(back, n);
        assert_eq!(n, "gpu-a");
        assert_eq!(format!("{n} {n:?}"), "gpu-a \"gpu-a\"");
        let clone = n.clone();
        assert!(
            std::ptr::eq(clone.as_str(), n.as_str()),
            "a clone shares the text"
        );
    }
}
