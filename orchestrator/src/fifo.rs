//! A map bounded by insertion order: beyond its capacity the oldest key goes first. For what
//! is kept only to answer about recent things (explanations, ended pods), keyed by user input.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// See the module docs. Re-inserting a key replaces its value and keeps its age.
#[derive(Debug)]
pub struct FifoMap<K, V> {
    map: HashMap<K, V>,
    order: VecDeque<K>,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V> FifoMap<K, V> {
    /// An empty map keeping at most `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        Self {
            map: HashMap::new(),
            order: VecDeque::new(),
            capacity,
        }
    }

    /// Inserts or replaces `key`; a new key past the capacity evicts the oldest.
    pub fn insert(&mut self, key: K, value: V) {
        self.insert_dropping(key, value, drop);
    }

    /// [`FifoMap::insert`], handing each value it lets go (the one replaced, or the oldest
    /// evicted) to `dropped`.
    pub fn insert_dropping(&mut self, key: K, value: V, mut dropped: impl FnMut(V)) {
        match self.map.insert(key.clone(), value) {
            Some(old) => dropped(old),
            None => {
                self.order.push_back(key);
                while self.order.len() > self.capacity {
                    match self.pop_oldest() {
                        Some((_, old)) => dropped(old),
                        None => break,
                    }
                }
            }
        }
    }

    /// Removes and returns the oldest entry.
    pub fn pop_oldest(&mut self) -> Option<(K, V)> {
        let key = self.order.pop_front()?;
        let value = self.map.remove(&key)?;
        Some((key, value))
    }

    /// Entries kept.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The value of `key`, if kept.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get(key)
    }

    /// Up to `n` kept entries, newest first.
    pub fn newest(&self, n: usize) -> impl Iterator<Item = (&K, &V)> {
        self.order
            .iter()
            .rev()
            .filter_map(|k| self.map.get(k).map(|v| (k, v)))
            .take(n)
    }
}
