//! A fast, non-cryptographic hasher for the index's maps keyed by node and pod names.
//!
//! The extender looks up every candidate node in several maps on each call (5,000 nodes × 5
//! lookups); with std's SipHash that alone costs a large share of the call. Keys are names from
//! the cluster's own objects, not attacker-chosen input, so HashDoS resistance is not needed
//! here. The mixing is FxHash's (rustc): rotate, xor, multiply per 8-byte word.

use kudos_scheduler_core::tail_word;
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

/// A `HashMap` with [`FxHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;
/// A `HashSet` with [`FxHasher`].
pub type FastSet<T> = std::collections::HashSet<T, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

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
