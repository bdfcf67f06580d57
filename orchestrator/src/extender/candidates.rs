//! The candidate names of one filter or prioritize call, and the way back from the ranking to
//! each name of the request.
//!
//! kube-scheduler sends up to thousands of names and wants one answer per name, in its order;
//! the ranking lists nodes in recommended order. Joining the two through a map from name to
//! entry cost a hash and a string comparison per node on every call (a tenth of prioritize at
//! 5,000 nodes). Here the join is by position: request name → distinct candidate → node state
//! → ranking entry ([`kudos_scheduler_core::RankEntry::candidate`]), each step a vector index.

use crate::fasthash::FastMap;
use crate::index::Unknown;
use kudos_scheduler_core::{NodeState, Ranking};
use std::borrow::Cow;
use std::collections::hash_map::Entry;

/// The distinct names of a request that the index is asked about, and where each request name
/// went.
pub(super) struct Candidates<'n> {
    /// Distinct names to rank, in the order first seen; excluded names are left out.
    pub names: Vec<&'n str>,
    /// Per request name: its index in `names` (a repeated name shares its first occurrence's),
    /// or `None` when node monitoring excludes it.
    slot: Vec<Option<u32>>,
    /// The names node monitoring excludes, with its reason, each once.
    pub excluded: Vec<Unknown>,
}

impl<'n> Candidates<'n> {
    /// Splits `request` into distinct names to rank and excluded ones (`exclusion` gives the
    /// reason). scheduler-core wants each node once; kube-scheduler never repeats a name, but a
    /// client might, and then gets the same answer for every occurrence.
    pub fn of<'r, 'e>(
        request: &'n [Cow<'r, str>],
        exclusion: impl Fn(&str) -> Option<&'e str>,
    ) -> Self {
        let mut first: FastMap<&'n str, Option<u32>> =
            FastMap::with_capacity_and_hasher(request.len(), Default::default());
        let mut names = Vec::with_capacity(request.len());
        let mut slot = Vec::with_capacity(request.len());
        let mut excluded = Vec::new();
        for name in request {
            let name: &'n str = name.as_ref();
            let s = match first.entry(name) {
                Entry::Occupied(o) => *o.get(),
                Entry::Vacant(v) => *v.insert(match exclusion(name) {
                    Some(reason) => {
                        excluded.push((name.to_owned(), reason.to_owned()));
                        None
                    }
                    None => {
                        names.push(name);
                        Some((names.len() - 1) as u32)
                    }
                }),
            };
            slot.push(s);
        }
        Self {
            names,
            slot,
            excluded,
        }
    }

    /// Per request name, the index of its entry in `ranking`, or `None` (unknown to the index,
    /// excluded, or rejected). `states` are what the index built for [`Candidates::names`]:
    /// one per name it knows, in order, so the ranking's candidate positions index them.
    pub fn entries(&self, states: &[NodeState], ranking: &Ranking) -> Vec<Option<u32>> {
        // names → states: the index leaves out only the names it does not know.
        let mut state_of = vec![None; self.names.len()];
        let mut next = 0usize;
        for (c, name) in self.names.iter().enumerate() {
            if states.get(next).is_some_and(|s| s.name.as_str() == *name) {
                state_of[c] = Some(next);
                next += 1;
            }
        }
        if next != states.len() {
            // Not the index's order after all: join by name instead (a map, but correct).
            tracing::warn!(
                states = states.len(),
                matched = next,
                "node states not in candidate order; answering by name"
            );
            let by_name: FastMap<&str, u32> = ranking
                .entries
                .iter()
                .enumerate()
                .map(|(i, e)| (e.node.as_str(), i as u32))
                .collect();
            return self
                .slot
                .iter()
                .map(|s| s.and_then(|c| by_name.get(self.names[c as usize]).copied()))
                .collect();
        }
        let mut entry_of_state = vec![None; states.len()];
        for (i, e) in ranking.entries.iter().enumerate() {
            if let Some(x) = entry_of_state.get_mut(e.candidate) {
                *x = Some(i as u32);
            }
        }
        self.slot
            .iter()
            .map(|s| {
                let state = state_of[(*s)? as usize]?;
                entry_of_state[state]
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kudos_scheduler_core::{DeviceProfile, NodeHealth, RankEntry};

    fn state(name: &str) -> NodeState {
        NodeState {
            name: name.into(),
            profile: DeviceProfile {
                vendor: "nvidia".into(),
                model: "a100".into(),
                count: 8,
                memory_bytes: 0,
            },
            free_devices: 8,
            cpu_allocatable_milli: 1000,
            cpu_requested_milli: 0,
            memory_allocatable_bytes: 1 << 30,
            memory_requested_bytes: 0,
            health: NodeHealth::Healthy,
        }
    }

    fn entry(node: &str, candidate: usize, rank: usize) -> RankEntry {
        RankEntry {
            node: node.into(),
            prediction: None,
            review: None,
            good_rate: 0.5,
            score: 5,
            default_score: 0.0,
            merged_score: 0.0,
            rank,
            candidate,
        }
    }

    fn ranking(entries: Vec<RankEntry>) -> Ranking {
        Ranking {
            namespace: "ns".into(),
            pod: "p".into(),
            class: None,
            threshold_seconds: None,
            entries,
            rejected: vec![],
        }
    }

    fn request(names: &[&'static str]) -> Vec<Cow<'static, str>> {
        names.iter().map(|n| Cow::Borrowed(*n)).collect()
    }

    #[test]
    fn each_request_name_finds_its_entry_through_unknown_excluded_rejected_and_repeated_names() {
        // a: ranked second; ghost: unknown to the index; cordoned: excluded; b: rejected;
        // c: ranked first; a again.
        let req = request(&["a", "ghost", "cordoned", "b", "c", "a"]);
        let c = Candidates::of(&req, |n| (n == "cordoned").then_some("rollout"));
        assert_eq!(c.names, ["a", "ghost", "b", "c"]);
        assert_eq!(c.excluded, [("cordoned".into(), "rollout".into())]);
        // The index knows a, b and c (in that order); rank rejected b.
        let states = [state("a"), state("b"), state("c")];
        let r = ranking(vec![entry("c", 2, 1), entry("a", 0, 2)]);
        assert_eq!(
            c.entries(&states, &r),
            [Some(1), None, None, None, Some(0), Some(1)]
        );
    }

    #[test]
    fn states_out_of_candidate_order_are_joined_by_name() {
        let req = request(&["a", "b"]);
        let c = Candidates::of(&req, |_| None);
        let states = [state("b"), state("a")];
        let r = ranking(vec![entry("a", 1, 1), entry("b", 0, 2)]);
        assert_eq!(c.entries(&states, &r), [Some(0), Some(1)]);
    }
}
