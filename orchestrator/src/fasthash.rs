//! A fast, non-cryptographic hasher for the index's maps keyed by node and pod names.
//!
//! The extender looks up every candidate node in several maps on each call (5,000 nodes × 5
//! lookups); with std's SipHash that alone costs a large share of the call. Keys are names from
//! the cluster's own objects, not attacker-chosen input, so HashDoS resistance is not needed
//! here. The mixing is FxHash's (rustc): rotate, xor, multiply per 8-byte word.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash-style hasher.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        if !chunks.remainder().is_empty() {
            self.add(tail_word(bytes));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The bytes after the last whole 8-byte word of `bytes`, little-endian in a word whose other
/// bytes are zero: what copying them into a zeroed word gives, read without that copy. The copy
/// is a call to `memcpy` (its length varies) and a store that the load after it has to wait
/// for; over the names of a call it was a third of the name table's lookups. Read instead from
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

/// A `HashMap` with [`FxHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;
/// A `HashSet` with [`FxHasher`].
pub type FastSet<T> = std::collections::HashSet<T, BuildHasherDefault<FxHasher>>;

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
    fn distinguishes_names_and_lengths() {
        let mut m: FastMap<String, u32> = FastMap::default();
        for i in 0..10_000 {
            m.insert(format!("node-{i:05}"), i);
        }
        m.insert("node-0000".into(), 99);
        assert_eq!(m.len(), 10_001);
        assert_eq!(m["node-00042"], 42);
        assert_eq!(m["node-0000"], 99);
    }
}
