//! Ranking input: a [`NodeState`] for each node a request names, and where each name went.
//!
//! The extender asks for up to thousands of names per call, and answers kube-scheduler one line
//! per name, in its order. So this returns, beside the states, each name's state by position:
//! a repeated name points at its first occurrence's state (scheduler-core ranks each node once),
//! an unknown or excluded one at none. Each name is looked up once, in the index's one entry per
//! node. Repeats are found through the slot each entry has, a mark per node in a small vector,
//! not through a map of the names (only names without an entry go through one).
//!
//! The states come in the index's slot order, not the order asked: kube-scheduler's parallel
//! filter sends the same nodes in a new order for each pod, and ranking reads each state several
//! times, so in the order asked every read went somewhere else in memory; in slot order the lent
//! states are read front to back. `rank` does not depend on the order of its nodes.
//!
//! A state is lent, not built, wherever the node's own facts decide it: each entry keeps the
//! state its facts give ([`Index::lent`]), built by the first call after a change. Only a
//! node that a request sends in full, that has binds in flight, or whose heartbeat went stale
//! gets a state built for the call.

use super::{
    Index, NodeFacts, UNKNOWN_CPU_MILLI, UNKNOWN_MEMORY_BYTES, UNKNOWN_NODE_REASON, Unknown,
    to_profile,
};
use crate::fasthash::FastMap;
use crate::kobj::{NodeInfo, Requests};
use crate::state::ProfileRecord;
use kudos_scheduler_core::{Name, NodeHealth, NodeState};
use std::borrow::Borrow;
use std::ops::Deref;

/// Whether nodes that node monitoring excludes are left out (the extender) or described like
/// any other (`GET /state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exclusions {
    /// Excluded nodes get no state; they come back in [`NodeStates::unknown`] with the
    /// monitor's reason.
    Apply,
    /// Excluded nodes are described too.
    Ignore,
}

/// A node's ranking input: the one its index entry keeps, or one built for this call.
#[derive(Debug)]
pub enum NodeRef<'a> {
    /// The entry's state, as its facts give it.
    Lent(&'a NodeState),
    /// Built for this call: the request sent the Node, binds are in flight, or the heartbeat is
    /// stale.
    Built(Box<NodeState>),
}

impl NodeRef<'_> {
    /// The state itself, copied if lent.
    pub fn into_owned(self) -> NodeState {
        match self {
            NodeRef::Lent(s) => s.clone(),
            NodeRef::Built(s) => *s,
        }
    }
}

impl Deref for NodeRef<'_> {
    type Target = NodeState;

    fn deref(&self) -> &NodeState {
        match self {
            NodeRef::Lent(s) => s,
            NodeRef::Built(s) => s,
        }
    }
}

impl Borrow<NodeState> for NodeRef<'_> {
    fn borrow(&self) -> &NodeState {
        self
    }
}

/// The answer of [`Index::node_states`], borrowing from the index.
#[derive(Debug, Default)]
pub struct NodeStates<'a> {
    /// One per distinct known, not excluded name: first those without an index entry (in the
    /// order first asked), then the others in slot order.
    pub states: Vec<NodeRef<'a>>,
    /// Names without a state (unknown to Kudos, or excluded), each once, with the reason.
    pub unknown: Vec<Unknown>,
    /// Per name asked, in order: the index of its state in `states`, or `None`.
    pub of_name: Vec<Option<u32>>,
}

/// A slot not asked for yet in this call.
const UNSEEN: u32 = u32::MAX;
/// Asked for in this call, without a state.
const STATELESS: u32 = u32::MAX - 1;

/// What pass 1 of [`Index::node_states`] found for a name.
#[derive(Clone, Copy)]
enum Asked {
    /// The name's entry is in this slot; its state is given in pass 2.
    Slot(u32),
    /// No entry: its state (an index into the states, or [`STATELESS`]).
    State(u32),
}

impl<'i> NodeStates<'i> {
    /// Adds `state` of `name`, first asked at `pos`: its index among the states, or
    /// [`STATELESS`] with the reason kept in `unknown`.
    fn push(
        &mut self,
        state: Result<NodeRef<'i>, String>,
        pos: usize,
        name: &str,
        unknown: &mut Vec<(usize, Unknown)>,
    ) -> u32 {
        match state {
            Ok(s) => {
                self.states.push(s);
                (self.states.len() - 1) as u32
            }
            Err(reason) => {
                unknown.push((pos, (name.to_owned(), reason)));
                STATELESS
            }
        }
    }
}

impl Index {
    /// Builds ranking input for `names`. `from_request` holds nodes kube-scheduler sent in
    /// full (`Nodes` form), which win over the index (they are at least as fresh); `assumed`
    /// are devices/cpu/memory of binds not yet seen by the Pod watch. Nodes Kudos knows
    /// nothing about come back in [`NodeStates::unknown`] with a reason, as do excluded nodes
    /// under [`Exclusions::Apply`].
    pub fn node_states<'a, 'i>(
        &'i self,
        names: impl IntoIterator<Item = &'a str>,
        exclusions: Exclusions,
        from_request: &FastMap<String, NodeInfo>,
        assumed: &FastMap<String, Requests>,
        now: f64,
    ) -> NodeStates<'i> {
        let names: Vec<&'a str> = names.into_iter().collect();
        let mut out = NodeStates {
            states: Vec::with_capacity(names.len()),
            unknown: Vec::new(),
            of_name: Vec::with_capacity(names.len()),
        };
        // Names without a state, with the position that first asked for them.
        let mut unknown: Vec<(usize, Unknown)> = Vec::new();
        // Pass 1, in the order asked: each name's slot, and per slot the first position that
        // asked for it. Names without an entry (known by their slices, or not at all) get
        // their state here, through a map of those names.
        let mut first_at = vec![UNSEEN; self.entries.len()];
        let mut asked: Vec<Asked> = Vec::with_capacity(names.len());
        let mut seen_elsewhere: FastMap<&str, u32> = FastMap::default();
        self.slot_of.get_each(&names, |pos, name, slot| {
            if let Some(slot) = slot
                && let Some(first) = first_at.get_mut(slot as usize)
            {
                if *first == UNSEEN {
                    *first = pos as u32;
                }
                asked.push(Asked::Slot(slot));
                return;
            }
            let state = match seen_elsewhere.get(name) {
                Some(&state) => state,
                None => {
                    let state = self.state(name, None, exclusions, from_request, assumed, now);
                    let state = out.push(state, pos, name, &mut unknown);
                    seen_elsewhere.insert(name, state);
                    state
                }
            };
            asked.push(Asked::State(state));
        });
        // Pass 2, in slot order: the states of the names with an entry, each slot's first
        // position replaced by its state (or STATELESS) for pass 3. Ranking reads every
        // state several times; in slot order it reads the lent states front to back, where the
        // order asked (kube-scheduler's parallel filter sends a new one for each pod) scattered
        // every read.
        for (slot, first) in first_at.iter_mut().enumerate() {
            if *first == UNSEEN {
                continue;
            }
            let pos = *first as usize;
            let name = names[pos];
            let state = self.state(
                name,
                Some(slot as u32),
                exclusions,
                from_request,
                assumed,
                now,
            );
            *first = out.push(state, pos, name, &mut unknown);
        }
        // Pass 3, in the order asked: each name's state.
        out.of_name.extend(asked.into_iter().map(|a| {
            let state = match a {
                Asked::Slot(slot) => first_at.get(slot as usize).copied().unwrap_or(STATELESS),
                Asked::State(state) => state,
            };
            (state != STATELESS).then_some(state)
        }));
        unknown.sort_by_key(|(pos, _)| *pos);
        out.unknown = unknown.into_iter().map(|(_, u)| u).collect();
        out
    }

    /// The state of a node asked about for the first time in a call, or why it has none: the
    /// entry's own when nothing in this call changes it. `slot` is the node's slot, when it
    /// has an entry: the entry itself (and its name as the index keeps it, by slot) is read
    /// only to build a state.
    fn state<'i>(
        &'i self,
        name: &str,
        slot: Option<u32>,
        exclusions: Exclusions,
        from_request: &FastMap<String, NodeInfo>,
        assumed: &FastMap<String, Requests>,
        now: f64,
    ) -> Result<NodeRef<'i>, String> {
        let build = || {
            let facts = slot.and_then(|s| self.facts_at(s));
            self.first_state(name, facts, exclusions, from_request, assumed, now)
                .map(|s| NodeRef::Built(Box::new(s)))
        };
        let Some(slot) = slot else {
            return build();
        };
        let changed_here = (!from_request.is_empty() && from_request.contains_key(name))
            || (!assumed.is_empty() && assumed.contains_key(name));
        if changed_here {
            return build();
        }
        if exclusions == Exclusions::Apply
            && let Some(reason) = self.exclusion(name)
        {
            return Err(reason.to_owned());
        }
        let Some(lent) = self.lent(slot) else {
            return build();
        };
        let own = lent.state.get_or_init(|| {
            let (sent, binds) = (FastMap::default(), FastMap::default());
            // No time at which the heartbeat is stale: that is judged below, per call.
            let never = f64::NEG_INFINITY;
            let own = self.first_state(
                name,
                self.facts_at(slot),
                Exclusions::Ignore,
                &sent,
                &binds,
                never,
            );
            own.ok()
        });
        let Some(own) = own else {
            return Err(UNKNOWN_NODE_REASON.to_owned());
        };
        let stale = lent
            .heartbeat_at
            .is_some_and(|at| now - at > self.heartbeat_max_age);
        if stale && own.health == NodeHealth::Healthy {
            return build();
        }
        Ok(NodeRef::Lent(own))
    }

    /// The state of a node built from every source, or why it has none.
    pub(super) fn first_state(
        &self,
        name: &str,
        facts: Option<(&Name, &NodeFacts)>,
        exclusions: Exclusions,
        from_request: &FastMap<String, NodeInfo>,
        assumed: &FastMap<String, Requests>,
        now: f64,
    ) -> Result<NodeState, String> {
        if exclusions == Exclusions::Apply
            && let Some(reason) = self.exclusion(name)
        {
            return Err(reason.to_owned());
        }
        let own = facts.map(|(_, f)| f);
        let sent = from_request.get(name);
        let info = sent.or_else(|| own.and_then(|f| f.info.as_ref()));
        // A DRA node's devices are those of its ResourceSlices, which the scheduler
        // allocates from (the plugin's report until they are seen), never allocatable: a
        // plugin that registered through the device-plugin API before the orchestrator's
        // answer leaves a stale allocatable of 0 for minutes. Slices are looked up only
        // where they can matter.
        let dra = crate::dra::decide(self.allocation_policy, info).0
            == kudos_api::dra::AllocationApi::Dra;
        // The plugin's report first, then the labels: a Node sent in the request is read as it
        // is, the index's own with the profile computed when it changed.
        let cached = facts.and_then(|(n, f)| {
            let p = f.known.as_ref();
            let p = p.or_else(|| f.labelled.as_ref().filter(|_| sent.is_none()));
            Some((n, p?))
        });
        let shared_name = || facts.map_or_else(|| Name::from(name), |(n, _)| n.clone());
        let (node_name, profile) = match cached {
            Some((n, p)) => (n.clone(), p.clone()),
            None => match (
                info.and_then(|i| i.label_profile.as_ref()),
                self.slices.node(name),
            ) {
                (Some(p), _) => (shared_name(), to_profile(p)),
                (None, Some((_, s))) => (
                    shared_name(),
                    to_profile(&ProfileRecord {
                        vendor: s.vendor.clone(),
                        model: s.model.clone(),
                        count: s.total,
                        memory_bytes: s.memory_bytes,
                    }),
                ),
                // Short: the filter answers this once per unknown candidate.
                (None, None) => return Err(UNKNOWN_NODE_REASON.to_owned()),
            },
        };
        let mut used = own.map(|f| f.used).unwrap_or_default();
        if let Some(a) = assumed.get(name) {
            used.add(*a);
        }
        // (healthy, total) devices as the device plugin reports them.
        let reported = own.and_then(NodeFacts::reported_devices);
        let devices = match dra.then(|| self.slices.node(name)).flatten() {
            Some((counts, _)) => Some(counts),
            None => reported,
        };
        let node_allocatable = info.filter(|_| !dra).and_then(|i| i.gpu_allocatable);
        let allocatable = node_allocatable
            .map(u64::from)
            .unwrap_or_else(|| u64::from(devices.map_or(profile.count, |(h, _)| h)));
        let heartbeat = own.and_then(|f| f.heartbeat.as_ref());
        let health = self.health(info, heartbeat, devices, now);
        Ok(NodeState {
            name: node_name,
            profile,
            free_devices: allocatable
                .saturating_sub(used.gpus)
                .min(u64::from(u32::MAX)) as u32,
            cpu_allocatable_milli: info.map_or(UNKNOWN_CPU_MILLI, |i| i.cpu_allocatable_milli),
            cpu_requested_milli: used.cpu_milli,
            memory_allocatable_bytes: info
                .map_or(UNKNOWN_MEMORY_BYTES, |i| i.memory_allocatable_bytes),
            memory_requested_bytes: used.memory_bytes,
            health,
        })
    }
}
