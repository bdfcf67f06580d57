//! The one index of cluster and model state.
//!
//! ```text
//!  Node watch ─┐                         ┌─> extender (filter/prioritize)   read
//!  Pod watch  ─┤  write   ┌───────────┐  ├─> /explain, /state, /readyz      read
//!  Registry   ─┼────────> │   Index   │ ─┤
//!  Telemetry  ─┘          └───────────┘  └─> model snapshots               read
//! ```
//!
//! Watchers and ingestion (registry, heartbeats) and the learner are the only writers; every
//! server handler takes a read lock, reads or copies what it needs and lets go. Each node's
//! ranking input (`NodeState`) is built once after its facts change and lent to every ranking
//! until the next change ([`Index::lent`]). No
//! handler reaches the API server from here, so the extender answers from memory in
//! microseconds. The lock is a `parking_lot::RwLock`: it cannot be poisoned (see
//! [`crate::health`] for what watches it instead).
//!
//! The model is published, not edited in place: the index holds an `Arc<Scheduler>` that the
//! learner ([`crate::learn`]) replaces, after refitting on its own copy off every lock, with
//! one pointer swap under the write lock.
//!
//! Free devices are allocatable minus what bound pods request, from a Pod watch: it is the
//! only source that also sees pods bound by other schedulers, pods that ended, and everything
//! that happened while this process was down. Binds this process made but the watch has not
//! shown yet are added by the extender from its own ledger (see [`crate::extender::Ledger`]).

mod name_slots;
pub mod slices;
mod states;
mod view;

pub use states::{Exclusions, NodeRef, NodeStates};
pub use view::{
    AllocationApiView, ModelSummary, MonitorObservations, PublishedModel, SliceCounts, StateView,
};

use crate::fasthash::FastMap;
use crate::fifo::FifoMap;
use crate::kobj::{NodeInfo, PodFacts, Requests};
use crate::state::{PluginConfig, ProfileRecord, RunOutcome, StoredRun};
use kudos_scheduler_core::{
    DeviceProfile, Feedback, ModelState, Name, NodeHealth, NodeState, Refit, RunObservation,
    Scheduler, SchedulerConfig,
};
use name_slots::NameSlots;
use parking_lot::RwLock;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

/// The index behind a lock: writers are the watchers, ingestion and the learner; everyone
/// else reads.
pub type SharedIndex = Arc<RwLock<Index>>;

/// CPU/memory assumed for a node known only from a plugin report (no `Node` object): large,
/// so Kudos does not reject it; kube-scheduler's own resource fit has the real numbers.
const UNKNOWN_CPU_MILLI: u64 = 1 << 40;
const UNKNOWN_MEMORY_BYTES: u64 = 1 << 60;
/// Distinct vendor and model names the index shares between nodes; more are copied per node
/// (ranking still matches those profiles, by their text). Kept for the index's life: they
/// come from plugin reports and Node labels, which name a cluster's few device models.
const MAX_INTERNED_NAMES: usize = 64;

/// Why a candidate cannot be ranked when Kudos knows no accelerators on it: no
/// kudos-device-plugin report and no `kudos.dev/gpu-vendor` label.
pub const UNKNOWN_NODE_REASON: &str =
    "Kudos knows no accelerators here (no device plugin report, no kudos.dev/gpu-vendor label)";

/// Last heartbeat of a node agent.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatInfo {
    /// Unix seconds when received.
    pub at: f64,
    /// Agent version.
    pub agent_version: String,
    /// Reports waiting in the agent's outbox.
    pub outbox_depth: u64,
    /// Devices sampled successfully.
    pub healthy_devices: u32,
    /// Devices in total.
    pub total_devices: u32,
}

/// Cluster and model state. See the module docs for who writes it.
pub struct Index {
    unified: String,
    heartbeat_max_age: f64,
    /// Node name → its slot, where its entry and lent state are kept. Finding a name touches
    /// only this table of names and slots: when the entries were its values, at 5,000
    /// candidates the probe's read of each ~380-byte entry missed the cache and was most of
    /// looking a node up (see [`NameSlots`] for how the table confirms a match).
    slot_of: NameSlots,
    /// Per slot, everything known of the node from every source (see [`NodeFacts`]). A free
    /// slot holds an empty entry.
    entries: Vec<NodeFacts>,
    /// Entries with a Node object.
    node_objects: usize,
    /// Slots of removed entries, given to the next new ones.
    free_slots: Vec<u32>,
    /// Per slot, what a ranking reads of the node (see [`Lent`]), kept in one array so that a
    /// ranking reads them in one place rather than inside the entries.
    lent: Vec<Lent>,
    /// Vendor and model names shared by the nodes' profiles (see [`MAX_INTERNED_NAMES`]).
    interned: Vec<Name>,
    pods: FastMap<String, (String, Requests)>,
    /// Pods the watch has shown ended (terminal or deleted), oldest first, at most
    /// [`MAX_ENDED_PODS`]: an assumed bind of one of them must not count again.
    ended: FifoMap<String, ()>,
    plugin_config: PluginConfig,
    /// The published model; replaced whole by [`Index::publish_model`].
    scheduler: Arc<Scheduler>,
    applied_seq: u64,
    nodes_synced: bool,
    pods_synced: bool,
    /// Bumped by every write that can change a node's Kudos score: its Node object (when what
    /// Kudos reads of it changed), plugin reports, device health, slices, node monitoring's
    /// exclusions, the model. Not by pods (nor heartbeats, which matter through staleness,
    /// judged at call time): a pod changes what is in use on its node, so which nodes fit,
    /// never how fast a node runs a class, and fit is settled by the filter. The extender's
    /// filter → prioritize reuse compares it: kube-scheduler binds each pod beside the next
    /// pod's cycle, so an earlier pod's bind landed between the two calls of about every other
    /// GPU pod (162 and 170 of 300 in two runs at 1,213 nodes, e2e/README.md), while that
    /// cycle's snapshot already holds the bound pod.
    generation: u64,
    /// The latest node-monitoring pass (rollout enabled only), see [`crate::rollout`].
    monitor: Option<MonitorView>,
    /// Node → why node monitoring excludes it from ranking; the extender's filter reads this.
    excluded: FastMap<String, String>,
    /// Class → its latest third queue (`/explain`), at most `MAX_THIRD_QUEUES` classes.
    third_queues: BTreeMap<String, ThirdQueue>,
    /// Which allocation API nodes use, unless a node's label says otherwise.
    allocation_policy: crate::dra::AllocationPolicy,
    /// The Kudos driver's ResourceSlices: DRA nodes' devices.
    slices: slices::SliceInventory,
}

/// What a ranking call reads per candidate, by slot: the node's ranking input as its entry's
/// facts give it, and the time of its heartbeat.
#[derive(Debug, Default)]
struct Lent {
    /// The node's state (`None`: no accelerators known), built by the first ranking after a
    /// change and lent to every ranking until the next: at 5,000 candidates, building and
    /// dropping the states was half of a ranking call. Every write to an entry empties it
    /// ([`Index::facts_mut`]), as does a change to what states also read outside the entries
    /// (ResourceSlices, the allocation policy). Heartbeats leave it: staleness is judged per
    /// call, from `heartbeat_at`.
    state: OnceLock<Option<NodeState>>,
    /// [`NodeFacts::heartbeat`]'s time, copied here so that a ranking judges staleness
    /// without reading the entry.
    heartbeat_at: Option<f64>,
}

/// What the index knows of one node, from every source, in one entry: a ranking call looks each
/// of thousands of candidates up once, where one map per source cost a lookup per source. An
/// entry lives while any source has something for its node ([`NodeFacts::is_empty`]); its
/// slot (see [`Index::slot_of`]) is its number among the entries for that long: a ranking call
/// marks the nodes it has seen in a vector by slot, not in a map of names.
#[derive(Debug, Default)]
struct NodeFacts {
    /// Its device profile from the plugin configuration, computed once per configuration
    /// change. Keyed by a shared name, as scheduler-core takes it: every ranking input shares
    /// the name and the profile's strings instead of copying them.
    known: Option<DeviceProfile>,
    /// The Node object (Node watch).
    info: Option<NodeInfo>,
    /// The profile its Node's `kudos.dev/gpu-*` labels describe, computed when the Node
    /// changes, with shared strings like `known`'s (ranking reads it when `known` is `None`).
    labelled: Option<DeviceProfile>,
    /// What the pods bound to it request (Pod watch).
    used: Requests,
    /// Per vendor, `(healthy, total)` devices as its device plugin last reported.
    device_health: BTreeMap<String, (u32, u32)>,
    /// Its node agent's latest heartbeat.
    heartbeat: Option<HeartbeatInfo>,
}

impl NodeFacts {
    fn is_empty(&self) -> bool {
        self.known.is_none()
            && self.info.is_none()
            && self.used == Requests::default()
            && self.device_health.is_empty()
            && self.heartbeat.is_none()
    }

    /// `(healthy, total)` devices over the vendors its plugins reported, if any did. The sum
    /// saturates: a plugin's report is outside input.
    fn reported_devices(&self) -> Option<(u32, u32)> {
        (!self.device_health.is_empty()).then(|| {
            self.device_health
                .values()
                .fold((0u32, 0u32), |(a, b), (h, t)| {
                    (a.saturating_add(*h), b.saturating_add(*t))
                })
        })
    }

    /// Forgets the Node object; true when it had one.
    fn take_info(&mut self) -> bool {
        self.labelled = None;
        self.info.take().is_some()
    }
}

/// Ended pods remembered (by UID) so that the extender's assumed binds of them are dropped:
/// far more than end within the extender's assume window (5 min).
const MAX_ENDED_PODS: usize = 65_536;

/// Classes whose latest third queue is kept (the oldest is dropped beyond).
const MAX_THIRD_QUEUES: usize = 1024;

/// The third queue of a class: the nodes its latest observed run re-scored, best first.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ThirdQueue {
    /// Unix seconds of the run's acceptance.
    pub observed_at: f64,
    /// `(node, score 0..=10)`, best first.
    pub nodes: Vec<(String, u8)>,
}

/// The latest node-monitoring pass, as `GET /state` shows it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MonitorView {
    /// Unix seconds of the pass.
    pub computed_at: f64,
    /// Where the DaemonSet rollout state comes from (`daemonSetWatch`, or `unknown` when the
    /// DaemonSets are not watched, e.g. in a dry run).
    pub rollout_source: &'static str,
    /// One entry per configured node, sorted by node name.
    pub nodes: Vec<kudos_rollout::NodeMonitor>,
}

/// Why a node could not be turned into a `NodeState`.
pub type Unknown = (String, String);

impl Index {
    /// An empty index. `cluster` = false (standalone) counts nodes and pods as synced.
    pub fn new(unified: &str, heartbeat_max_age: f64, scheduler: Scheduler, cluster: bool) -> Self {
        Self {
            unified: unified.to_owned(),
            heartbeat_max_age,
            slot_of: NameSlots::default(),
            entries: Vec::new(),
            node_objects: 0,
            free_slots: Vec::new(),
            lent: Vec::new(),
            interned: Vec::new(),
            pods: FastMap::default(),
            ended: FifoMap::new(MAX_ENDED_PODS),
            plugin_config: PluginConfig {
                unified_resource_name: unified.to_owned(),
                ..Default::default()
            },
            scheduler: Arc::new(scheduler),
            applied_seq: 0,
            nodes_synced: !cluster,
            pods_synced: !cluster,
            generation: 0,
            monitor: None,
            excluded: FastMap::default(),
            third_queues: BTreeMap::new(),
            allocation_policy: crate::dra::AllocationPolicy::default(),
            slices: slices::SliceInventory::default(),
        }
    }

    /// Adds, replaces or (`None`) forgets ResourceSlice `name` (the slice watch). A slice event
    /// that changes nothing Kudos summarises of it (another field, a resync) changes nothing
    /// here either.
    pub fn apply_slice(&mut self, name: &str, devices: Option<slices::SliceDevices>) {
        if self.slices.apply(name, devices) {
            self.generation += 1;
            self.forget_states();
        }
    }

    /// Replaces every ResourceSlice (the slice watch's full list).
    pub fn reset_slices(&mut self, all: Vec<(String, slices::SliceDevices)>) {
        self.generation += 1;
        self.slices.reset(all);
        self.forget_states();
    }

    /// Sets the cluster-wide allocation-API policy (`nodes.allocationApi`).
    pub fn set_allocation_policy(&mut self, policy: crate::dra::AllocationPolicy) {
        self.allocation_policy = policy;
        self.forget_states();
    }

    /// Empties every node's lent state, after a change that any of them may read.
    fn forget_states(&mut self) {
        for lent in &mut self.lent {
            lent.state.take();
        }
    }

    /// Empties the lent state of the entry in `slot`.
    fn forget_state(&mut self, slot: u32) {
        if let Some(lent) = self.lent.get_mut(slot as usize) {
            lent.state.take();
        }
    }

    /// What a ranking reads of the entry in `slot`.
    fn lent(&self, slot: u32) -> Option<&Lent> {
        self.lent.get(slot as usize)
    }

    /// `name`'s entry, if it has one.
    fn facts(&self, name: &str) -> Option<&NodeFacts> {
        let slot = self.slot_of.get(name)?;
        self.entries.get(slot as usize)
    }

    /// The entry in `slot`, beside its node's name as the index keeps it (by slot).
    fn facts_at(&self, slot: u32) -> Option<(&Name, &NodeFacts)> {
        Some((self.slot_of.name(slot)?, self.entries.get(slot as usize)?))
    }

    /// `name`'s entry to change and its slot, if it has one; its lent state is emptied.
    fn existing_facts_mut(&mut self, name: &str) -> Option<(u32, &mut NodeFacts)> {
        let slot = self.slot_of.get(name)?;
        self.forget_state(slot);
        Some((slot, self.entries.get_mut(slot as usize)?))
    }

    /// Every entry, with its node's name.
    fn all_facts(&self) -> impl Iterator<Item = (&Name, &NodeFacts)> {
        self.slot_of
            .iter()
            .filter_map(|(name, slot)| Some((name, self.entries.get(slot as usize)?)))
    }

    /// Sets (or clears) the heartbeat of the entry in `slot`, and the copy of its time that
    /// rankings read ([`Lent::heartbeat_at`]): the one writer of both.
    fn set_heartbeat(&mut self, slot: u32, hb: Option<HeartbeatInfo>) {
        if let Some(lent) = self.lent.get_mut(slot as usize) {
            lent.heartbeat_at = hb.as_ref().map(|hb| hb.at);
        }
        if let Some(facts) = self.entries.get_mut(slot as usize) {
            facts.heartbeat = hb;
        }
    }

    /// The allocation API `node` uses for the unified resource, and why.
    pub fn allocation_api(&self, node: &str) -> (kudos_api::dra::AllocationApi, &'static str) {
        crate::dra::decide(self.allocation_policy, self.node(node))
    }

    /// How many of `names` have an entry: the lookup every ranking call starts with, one per
    /// name, and nothing else (the `prioritize` bench times it as part of what any extender
    /// that scores nodes one by one must pay).
    pub fn known_nodes(&self, names: &[&str]) -> usize {
        let mut known = 0;
        self.slot_of
            .get_each(names, |_, _, slot| known += usize::from(slot.is_some()));
        known
    }

    /// Changes whenever a score input changes (see the field).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The unified resource name.
    pub fn unified(&self) -> &str {
        &self.unified
    }

    // === writers: watchers ===

    /// Adds or replaces a node. An update that changes nothing Kudos reads (the kubelet
    /// rewrites its Node's status every few minutes; other fields change for other readers)
    /// changes nothing here either.
    pub fn apply_node(&mut self, info: NodeInfo) {
        if self.node(&info.name) == Some(&info) {
            return;
        }
        self.generation += 1;
        self.put_node(info);
    }

    /// Sets a node's Node object and the profile its labels describe.
    fn put_node(&mut self, info: NodeInfo) {
        let labelled = info
            .label_profile
            .as_ref()
            .map(|p| intern_profile(&mut self.interned, p));
        let facts = self.facts_mut(&info.name);
        facts.labelled = labelled;
        let new = facts.info.replace(info).is_none();
        self.node_objects += usize::from(new);
    }

    /// Nodes from the Node watch.
    pub fn node_count(&self) -> usize {
        self.node_objects
    }

    /// Removes a node, with its heartbeats and device health (its plugin configuration is
    /// pruned by [`crate::grpc::Ingest::forget_node`], which persists it).
    pub fn delete_node(&mut self, name: &str) {
        self.generation += 1;
        if let Some((slot, facts)) = self.existing_facts_mut(name) {
            let had_info = facts.take_info();
            facts.device_health.clear();
            self.node_objects -= usize::from(had_info);
            self.set_heartbeat(slot, None);
            self.prune(name);
        }
    }

    /// The Node object of `name`, if the Node watch has shown one.
    fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.facts(name).and_then(|f| f.info.as_ref())
    }

    /// `name`'s entry to change, created empty when it has none; its lent state is emptied.
    fn facts_mut(&mut self, name: &str) -> &mut NodeFacts {
        let slot = self.slot(name);
        self.forget_state(slot);
        &mut self.entries[slot as usize]
    }

    /// `name`'s slot, given an empty entry when it has none (the name is copied only then: pod
    /// and heartbeat events mostly update an entry that exists). Its lent state stays.
    fn slot(&mut self, name: &str) -> u32 {
        if let Some(slot) = self.slot_of.get(name) {
            return slot;
        }
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.entries.push(NodeFacts::default());
            self.lent.push(Lent::default());
            (self.entries.len() - 1) as u32
        });
        self.slot_of.insert(Name::from(name), slot);
        slot
    }

    /// Drops `name`'s entry when no source has anything left for it.
    fn prune(&mut self, name: &str) {
        if self.facts(name).is_some_and(NodeFacts::is_empty)
            && let Some(slot) = self.slot_of.remove(name)
        {
            self.free_slot(slot);
        }
    }

    /// Drops every entry no source has anything left for.
    fn prune_all(&mut self) {
        let entries = &self.entries;
        let mut freed = Vec::new();
        self.slot_of.retain(|_, slot| {
            let keep = entries.get(slot as usize).is_some_and(|f| !f.is_empty());
            if !keep {
                freed.push(slot);
            }
            keep
        });
        for slot in freed {
            self.free_slot(slot);
        }
    }

    /// Empties the entry in `slot`, whose name is gone, and gives the slot to the next new one.
    fn free_slot(&mut self, slot: u32) {
        if let Some(facts) = self.entries.get_mut(slot as usize) {
            *facts = NodeFacts::default();
        }
        if let Some(lent) = self.lent.get_mut(slot as usize) {
            *lent = Lent::default();
        }
        self.free_slots.push(slot);
    }

    /// Nodes in the plugin configuration that the Node watch does not list (deleted while the
    /// orchestrator was not watching).
    pub fn configured_nodes_not_listed(&self) -> Vec<String> {
        self.plugin_config
            .nodes
            .keys()
            .filter(|n| self.node(n).is_none())
            .cloned()
            .collect()
    }

    /// Replaces all nodes (after a watch restart) and marks nodes synced.
    pub fn reset_nodes(&mut self, nodes: Vec<NodeInfo>) {
        self.generation += 1;
        self.forget_states();
        for facts in &mut self.entries {
            facts.take_info();
        }
        self.node_objects = 0;
        for info in nodes {
            self.put_node(info);
        }
        self.prune_all();
        self.nodes_synced = true;
    }

    /// Adds, replaces or (when ended or unbound) removes a pod's resource use.
    pub fn apply_pod(&mut self, pod: &PodFacts) {
        let key = pod_key(pod);
        self.remove_pod(&key);
        if pod.terminated {
            self.ended.insert(key.clone(), ());
        }
        if let (Some(node), false) = (&pod.node_name, pod.terminated) {
            self.facts_mut(node).used.add(pod.requests);
            self.pods.insert(key, (node.clone(), pod.requests));
        }
    }

    /// Removes a pod.
    pub fn delete_pod(&mut self, pod: &PodFacts) {
        let key = pod_key(pod);
        self.ended.insert(key.clone(), ());
        self.remove_pod(&key);
    }

    /// Forgets a pod's resource use.
    fn remove_pod(&mut self, key: &str) {
        let Some((node, r)) = self.pods.remove(key) else {
            return;
        };
        if let Some((_, facts)) = self.existing_facts_mut(&node) {
            facts.used.sub(r);
            self.prune(&node);
        }
    }

    /// Replaces all pods and marks pods synced.
    pub fn reset_pods(&mut self, pods: &[PodFacts]) {
        self.pods.clear();
        self.forget_states();
        for facts in &mut self.entries {
            facts.used = Requests::default();
        }
        self.prune_all();
        for p in pods {
            self.apply_pod(p);
        }
        self.pods_synced = true;
    }

    /// Whether the Pod watch accounts for the pod (by UID): bound and counted, or already ended
    /// or deleted. Either way an assumed bind of it must not count: a pod that ended before the
    /// assumption expired would otherwise hold its devices for the rest of the assume window.
    pub fn knows_bound_pod(&self, uid: &str) -> bool {
        self.pods.contains_key(uid) || self.ended.get(uid).is_some()
    }

    /// Ready to answer the extender: node (and pod) lists synced at least once.
    pub fn ready(&self) -> bool {
        self.nodes_synced && self.pods_synced
    }

    // === writers: ingestion ===

    /// Records the device health a plugin reported: `(healthy, total)` for one vendor. Plugins
    /// report again every few minutes with nothing new (`--report-interval`); the same health
    /// again leaves the generation, and so the filter → prioritize reuse, alone.
    pub fn set_device_health(&mut self, node: &str, vendor: &str, health: (u32, u32)) {
        if self.facts(node).and_then(|f| f.device_health.get(vendor)) == Some(&health) {
            return;
        }
        self.generation += 1;
        self.facts_mut(node)
            .device_health
            .insert(vendor.to_owned(), health);
    }

    /// Replaces the plugin configuration (at start, and after the registry persisted a change).
    pub fn set_plugin_config(&mut self, cfg: PluginConfig) {
        self.generation += 1;
        self.forget_states();
        for facts in &mut self.entries {
            facts.known = None;
        }
        let interned = &mut self.interned;
        let profiles: Vec<(&String, DeviceProfile)> = cfg
            .nodes
            .keys()
            .filter_map(|n| Some((n, intern_profile(interned, &cfg.profile(n)?))))
            .collect();
        for (name, profile) in profiles {
            self.facts_mut(name).known = Some(profile);
        }
        self.prune_all();
        self.plugin_config = cfg;
    }

    /// Records a heartbeat.
    pub fn heartbeat(&mut self, node: &str, hb: HeartbeatInfo) {
        // The lent state stays: it does not read the heartbeat (staleness is judged per call).
        let slot = self.slot(node);
        self.set_heartbeat(slot, Some(hb));
    }

    /// Feeds an accepted, stored run to the model, in `seq` order (at start, before the index
    /// is shared; live runs go through [`crate::learn`]). Returns the feedback when the run was
    /// observed; unobservable runs only advance `applied_seq`.
    pub fn apply_run(&mut self, run: &StoredRun) -> Result<Option<Feedback>, String> {
        self.generation += 1;
        self.applied_seq = self.applied_seq.max(run.seq);
        let fb = apply_run(Arc::make_mut(&mut self.scheduler), run)?;
        if let Some(fb) = &fb {
            self.keep_third_queue(&run.class, run.received_at, fb);
        }
        Ok(fb)
    }

    /// Keeps `fb`'s third queue as `class`'s latest, dropping the oldest class's beyond
    /// [`MAX_THIRD_QUEUES`].
    pub fn keep_third_queue(&mut self, class: &str, observed_at: f64, fb: &Feedback) {
        if self.third_queues.len() >= MAX_THIRD_QUEUES && !self.third_queues.contains_key(class) {
            let oldest = self
                .third_queues
                .iter()
                .min_by(|a, b| a.1.observed_at.total_cmp(&b.1.observed_at))
                .map(|(c, _)| c.clone());
            oldest.map(|c| self.third_queues.remove(&c));
        }
        let queue = ThirdQueue {
            observed_at,
            nodes: fb.third_queue.clone(),
        };
        self.third_queues.insert(class.to_owned(), queue);
    }

    /// Replaces the model with one that includes every run up to `applied_seq`: a pointer
    /// swap, so the write lock is held for nanoseconds however large the model is. Returns the
    /// model it replaced, for the caller to drop after releasing the lock: freeing a model of
    /// thousands of classes takes milliseconds, and every ranking would wait for it.
    #[must_use = "drop the replaced model after the index lock is released"]
    pub fn publish_model(&mut self, model: Arc<Scheduler>, applied_seq: u64) -> Arc<Scheduler> {
        debug_assert!(
            model.is_settled(),
            "a model owing a deferred refit must be settled before it ranks"
        );
        self.generation += 1;
        self.applied_seq = self.applied_seq.max(applied_seq);
        std::mem::replace(&mut self.scheduler, model)
    }

    /// The published model, to rank with after the lock is released or to copy for learning.
    pub fn model(&self) -> Arc<Scheduler> {
        self.scheduler.clone()
    }

    /// Stores a node-monitoring pass. The ranking generation moves only when the set of
    /// excluded nodes or their reasons change.
    pub fn set_monitor(&mut self, view: MonitorView) {
        let excluded: FastMap<String, String> = view
            .nodes
            .iter()
            .filter(|m| m.exclude_from_ranking)
            .map(|m| (m.node.clone(), exclusion_reason(m)))
            .collect();
        if excluded != self.excluded {
            self.generation += 1;
            self.excluded = excluded;
        }
        self.monitor = Some(view);
    }

    // === readers ===

    /// The latest third queue of `class`, if a run of it was observed.
    pub fn third_queue(&self, class: &str) -> Option<&ThirdQueue> {
        self.third_queues.get(class)
    }

    /// Why node monitoring excludes `node` from ranking, if it does.
    pub fn exclusion(&self, node: &str) -> Option<&str> {
        if self.excluded.is_empty() {
            return None;
        }
        self.excluded.get(node).map(String::as_str)
    }

    /// The latest node-monitoring pass.
    pub fn monitor(&self) -> Option<&MonitorView> {
        self.monitor.as_ref()
    }

    /// The scheduler (for `rank` / `place_gang` under a read lock).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// The plugin configuration.
    pub fn plugin_config(&self) -> &PluginConfig {
        &self.plugin_config
    }

    /// Highest run `seq` the model includes.
    pub fn applied_seq(&self) -> u64 {
        self.applied_seq
    }

    /// Model snapshot as JSON with the `seq` it includes.
    pub fn model_snapshot(&self) -> Result<(Vec<u8>, u64), serde_json::Error> {
        Ok((
            serde_json::to_vec(self.scheduler.state())?,
            self.applied_seq,
        ))
    }

    /// The device profile of a node: the plugin's report first (it saw the devices), else the
    /// node's `kudos.dev/gpu-*` labels.
    pub fn profile(&self, node: &str) -> Option<ProfileRecord> {
        let facts = self.facts(node)?;
        match facts.known.as_ref() {
            Some(p) => Some(ProfileRecord {
                vendor: p.vendor.to_string(),
                model: p.model.to_string(),
                count: p.count,
                memory_bytes: p.memory_bytes,
            }),
            None => facts.info.as_ref().and_then(|n| n.label_profile.clone()),
        }
    }

    /// `devices`: the node's (healthy, total) devices as its device plugin reports them.
    fn health(
        &self,
        info: Option<&NodeInfo>,
        heartbeat: Option<&HeartbeatInfo>,
        devices: Option<(u32, u32)>,
        now: f64,
    ) -> NodeHealth {
        if let Some(Err(reason)) = info.map(|i| &i.ready) {
            return NodeHealth::Unhealthy {
                reason: reason.clone(),
            };
        }
        if let Some((0, t)) = devices.filter(|&(_, t)| t > 0) {
            return NodeHealth::Unhealthy {
                reason: format!("the device plugin reports all {t} devices unhealthy"),
            };
        }
        if let Some(hb) = heartbeat {
            let age = now - hb.at;
            if age > self.heartbeat_max_age {
                return NodeHealth::Stale { age_seconds: age };
            }
        }
        NodeHealth::Healthy
    }
}

/// The monitor's reasons as one line for the extender's `FailedAndUnresolvableNodes`.
fn exclusion_reason(m: &kudos_rollout::NodeMonitor) -> String {
    let reasons: Vec<&str> = m
        .reasons
        .iter()
        .map(|r| match r {
            kudos_rollout::ExclusionReason::NodeNotFound => "nodeNotFound (no Node object)",
            kudos_rollout::ExclusionReason::NodeNotReady => "nodeNotReady",
            kudos_rollout::ExclusionReason::NoHeartbeat => {
                "noHeartbeat (no node-agent heartbeat yet)"
            }
            kudos_rollout::ExclusionReason::HeartbeatStale => "heartbeatStale",
            kudos_rollout::ExclusionReason::NoAllocatable => {
                "noAllocatable (configured devices but none of the unified resource allocatable)"
            }
        })
        .collect();
    format!("excluded by Kudos node monitoring: {}", reasons.join(", "))
}

fn pod_key(pod: &PodFacts) -> String {
    if pod.uid.is_empty() {
        format!("{}/{}", pod.namespace, pod.name)
    } else {
        pod.uid.clone()
    }
}

/// Feeds one stored run to `scheduler`, refitting the whole model; `Ok(None)` when the run is
/// not observable (failed, unclassified, or no device profile).
pub fn apply_run(scheduler: &mut Scheduler, run: &StoredRun) -> Result<Option<Feedback>, String> {
    apply_run_with(scheduler, run, Refit::EveryRun)
}

/// [`apply_run`] with the refit chosen: the learner defers the model-wide refit to the copy it
/// publishes ([`Refit::Deferred`], then [`Scheduler::settle`]).
pub fn apply_run_with(
    scheduler: &mut Scheduler,
    run: &StoredRun,
    refit: Refit,
) -> Result<Option<Feedback>, String> {
    // Final runs, failed ones included, count per vendor: failures on a vendor the class never
    // completes on keep it off that vendor (scheduler-core `vendor_outcomes`).
    if let Some(p) = &run.profile
        && !run.class.is_empty()
        && run.outcome != RunOutcome::InProgress
    {
        let completed = run.outcome == RunOutcome::Completed;
        scheduler.record_outcome(&run.class, &p.vendor, completed);
    }
    let (true, Some(p)) = (run.observable(), run.profile.as_ref()) else {
        return Ok(None);
    };
    let obs = RunObservation {
        node: run.node.clone(),
        class: run.class.clone(),
        profile: to_profile(p),
        gpus: run.device_ids.len().max(1) as u32,
        start: run.start,
        end: run.end,
        completed: run.outcome == RunOutcome::Completed,
        progress: run.progress,
        gpu_busy_seconds: (run.gpu_busy_seconds > 0.0).then_some(run.gpu_busy_seconds),
        work_units: run.work_done,
    };
    // One observation per run: its snapshots (same run ID) replace each other.
    let key = (!run.run_id.is_empty()).then_some(run.run_id.as_str());
    let fb = scheduler
        .observe_with(key, &obs, run.received_at, refit)
        .map_err(|e| e.to_string())?;
    Ok(Some(fb))
}

/// `p` with vendor and model names shared with other nodes' profiles: ranking matches a node's
/// profile by those allocations before it hashes any text (scheduler-core's node_set).
fn intern_profile(interned: &mut Vec<Name>, p: &ProfileRecord) -> DeviceProfile {
    let mut intern = |text: &str| match interned.iter().find(|n| n.as_str() == text) {
        Some(n) => n.clone(),
        None => {
            let n = Name::from(text);
            if interned.len() < MAX_INTERNED_NAMES {
                interned.push(n.clone());
            }
            n
        }
    };
    DeviceProfile {
        vendor: intern(&p.vendor),
        model: intern(&p.model),
        count: p.count,
        memory_bytes: p.memory_bytes,
    }
}

/// Converts a persisted profile to scheduler-core's.
pub fn to_profile(p: &ProfileRecord) -> DeviceProfile {
    DeviceProfile {
        vendor: p.vendor.as_str().into(),
        model: p.model.as_str().into(),
        count: p.count,
        memory_bytes: p.memory_bytes,
    }
}

/// Builds the scheduler from config and an optional snapshot.
pub fn scheduler_from(
    config: SchedulerConfig,
    snapshot: Option<&[u8]>,
) -> Result<Scheduler, serde_json::Error> {
    Ok(match snapshot {
        Some(bytes) => Scheduler::with_state(config, serde_json::from_slice::<ModelState>(bytes)?),
        None => Scheduler::new(config),
    })
}

#[cfg(test)]
mod tests;
