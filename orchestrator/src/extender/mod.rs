//! The kube-scheduler extender: `filter`, `prioritize`, `bind`.
//!
//! kube-scheduler calls these on its serial path, so filter and prioritize answer from the
//! index in memory (no API server call) and let scheduler-core do every scheduling step:
//! `rank` for the node set, predictions, reviews and scores; `place_gang` for gangs. This module
//! only translates: Kubernetes objects to `PodSpec`/`NodeState`, a `Ranking` to the wire types.
//!
//! - Pods that do not request the unified resource are not Kudos's business: filter echoes its
//!   input and prioritize gives every node 0 (no opinion).
//! - Rejected nodes go to `FailedNodes` with scheduler-core's reason when the rejection is
//!   transient (no room now, stale, unhealthy); permanent mismatches
//!   (`RejectionKind::is_permanent`: the class forbids the devices, too little device memory,
//!   fewer devices than requested) and nodes where Kudos knows no accelerators go to
//!   `FailedAndUnresolvableNodes` (preemption cannot fix those).
//! - A gang's first evaluated member reserves slots for the whole gang (`place_gang`); while the
//!   reservation lives, each evaluated member claims one slot (see [`ledger`]): filter passes
//!   only that slot's node, prioritize scores it 10 and the others 0, and bind refuses a node
//!   where the member holds no slot. Members in flight together thus never share a slot.
//!   Unbound slots count as used for every pod outside the gang
//!   ([`Ledger::reserved_by_node`]): no other pod takes them, and another gang cannot reserve
//!   them, so two gangs never deadlock each holding part of what it needs.
//! - The exploration seed is a hash of the pod UID, so retries of a pod rank alike.
//! - Every ranking is kept for `GET /explain/{namespace}/{pod}`.

mod args_json;
pub mod bind;
mod explain;
pub mod ledger;
mod reuse;
pub mod types;

pub use bind::BindRefusal;
pub use explain::{ExplainCache, Explained};
pub use reuse::LastFilter;

use crate::index::SharedIndex;
use crate::kobj::{self, NodeInfo, PodFacts};
use crate::metrics::Metrics;
use bind::Binder;
use kudos_scheduler_core::{GangSpec, LazyRanking, PodSpec};
use ledger::Ledger;
use std::borrow::Cow;
use std::sync::Arc;
use types::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, HostPriority,
};

/// How long after its ranking a pod may be bound. kube-scheduler binds right after
/// prioritize; a Permit plugin (coscheduling) may hold a pod for a while first.
pub const BIND_AFTER_RANKING_SECONDS: f64 = 600.0;
/// Unknown nodes kept per explained ranking (the count is kept in full).
const MAX_EXPLAINED_UNKNOWN: usize = 100;

use crate::fasthash::FastSet;

/// Everything the extender reads.
pub struct Extender {
    /// The shared index (read only here).
    pub index: SharedIndex,
    /// Own binds and gang reservations.
    pub ledger: Ledger,
    /// Last rankings.
    pub explain: ExplainCache,
    /// Binds pods.
    pub binder: Arc<dyn Binder>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Unified resource name.
    pub unified: String,
    /// Filter → prioritize reuse.
    pub last_filter: LastFilter,
    /// How many of the best-ranked nodes `filter` passes (`None`: every node that fits).
    pub filter_top_nodes: Option<usize>,
    /// One event per ranked pod (with a cluster).
    pub events: Option<Arc<crate::events::PodEvents>>,
}

/// The outcome of evaluating one pod against candidate nodes.
struct Evaluation {
    /// The ranking and unknown nodes, shared with the explain cache (no copy).
    explained: Arc<Explained>,
    /// The node of the gang slot this pod claims, when it is in a gang with a live reservation.
    gang_node: Option<String>,
    /// Why a gang could not be placed.
    gang_error: Option<String>,
    /// Every node Kudos could not rank, with its reason.
    unknown: Vec<crate::index::Unknown>,
    /// Per candidate name, in request order: its index among the ranking's ranked nodes, or
    /// `None` (unknown, excluded or rejected). A repeated name shares its first occurrence's.
    ranked_of: Vec<Option<u32>>,
}

/// Current Unix time in seconds.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn pod_spec(f: &PodFacts) -> PodSpec {
    PodSpec {
        namespace: f.namespace.clone(),
        name: f.name.clone(),
        class: f.class.clone(),
        gpus: f.requests.gpus.min(u64::from(u32::MAX)) as u32,
        cpu_milli: f.requests.cpu_milli,
        memory_bytes: f.requests.memory_bytes,
        work_units: f.work_units,
        deadline_seconds: f.deadline_seconds,
        gang: f.gang.as_ref().map(|(name, size)| GangSpec {
            name: name.clone(),
            size: *size,
        }),
        vendors: f.vendors.clone(),
    }
}

/// Checks the sizes of an extender request before any work proportional to it: the number
/// of candidate nodes and the length of every name, and the pod's identifying strings (they
/// key the explain cache and the ledger).
fn check_request(args: &ExtenderArgs, facts: &PodFacts) -> Result<(), String> {
    use crate::limits::{
        MAX_LABEL_VALUE_LEN, MAX_NODE_NAMES, MAX_OBJECT_NAME_LEN, MAX_REPORT_ID_LEN, check_len,
    };
    // The first name over the limit and its length, checked in place (at 5,000 names,
    // collecting them first cost an allocation per call).
    fn too_long<'n>(names: impl Iterator<Item = &'n str>) -> Option<(usize, usize)> {
        names
            .map(str::len)
            .enumerate()
            .find(|&(_, len)| len > MAX_OBJECT_NAME_LEN)
    }
    let (field, count, long) = match (&args.node_names, &args.nodes) {
        (Some(n), _) => ("NodeNames", n.len(), too_long(n.iter().map(|n| n.as_ref()))),
        (None, Some(l)) => (
            "Nodes.items",
            l.items.len(),
            too_long(
                l.items
                    .iter()
                    .map(|n| n.metadata.name.as_deref().unwrap_or("")),
            ),
        ),
        (None, None) => ("NodeNames", 0, None),
    };
    if count > MAX_NODE_NAMES {
        return Err(format!(
            "{field} has {count} nodes; at most {MAX_NODE_NAMES} are accepted per call"
        ));
    }
    if let Some((i, len)) = long {
        return Err(format!(
            "{field}[{i}] is {len} bytes; node names are at most {MAX_OBJECT_NAME_LEN}"
        ));
    }
    check_len(
        "Pod.metadata.namespace",
        &facts.namespace,
        MAX_LABEL_VALUE_LEN,
    )?;
    check_len("Pod.metadata.name", &facts.name, MAX_OBJECT_NAME_LEN)?;
    check_len("Pod.metadata.uid", &facts.uid, MAX_REPORT_ID_LEN)?;
    if let Some(c) = &facts.class {
        check_len(kudos_api::labels::CLASS, c, MAX_LABEL_VALUE_LEN)?;
    }
    if let Some((g, _)) = &facts.gang {
        check_len(kudos_api::labels::GANG_NAME, g, MAX_OBJECT_NAME_LEN)?;
    }
    Ok(())
}

/// Candidate names in request order: `NodeNames` moved out of the request (borrowed from the
/// body, no copy), or else the names of `Nodes`.
fn candidate_names<'a>(args: &mut ExtenderArgs<'a>) -> Vec<Cow<'a, str>> {
    match (args.node_names.take(), &args.nodes) {
        (Some(names), _) => names,
        (None, Some(list)) => list
            .items
            .iter()
            .filter_map(|n| n.metadata.name.clone().map(Cow::Owned))
            .collect(),
        (None, None) => Vec::new(),
    }
}

/// Per candidate name, its index among `ranking`'s ranked nodes, from the name's state
/// ([`crate::index::NodeStates::of_name`]) and each ranked node's position among the `states`
/// ranked: two vector lookups per name, where a map from name to entry cost a hash and a string
/// comparison per node on every call.
fn ranked_by_name(
    of_name: &[Option<u32>],
    states: usize,
    ranking: &LazyRanking,
) -> Vec<Option<u32>> {
    let mut of_state = vec![None; states];
    for i in 0..ranking.len() {
        if let Some(x) = ranking.candidate(i).and_then(|c| of_state.get_mut(c)) {
            *x = Some(i as u32);
        }
    }
    of_name
        .iter()
        .map(|s| of_state.get((*s)? as usize).copied().flatten())
        .collect()
}

impl Extender {
    fn evaluate(
        &self,
        verb: &'static str,
        args: &ExtenderArgs,
        facts: &PodFacts,
        names: &[Cow<str>],
    ) -> Evaluation {
        let now = unix_now();
        let from_request: crate::fasthash::FastMap<String, NodeInfo> = args
            .nodes
            .as_ref()
            .map(|l| {
                l.items
                    .iter()
                    .map(|n| kobj::node_info(n, &self.unified))
                    .filter(|i| !i.name.is_empty())
                    .map(|i| (i.name.clone(), i))
                    .collect()
            })
            .unwrap_or_default();
        let spec = pod_spec(facts);
        let seed = kobj::seed_of(if facts.uid.is_empty() {
            &facts.name
        } else {
            &facts.uid
        });
        let gang_key = facts
            .gang
            .as_ref()
            .map(|(g, _)| format!("{}/{g}", facts.namespace));
        self.ledger
            .saw(&facts.uid, facts.requests, gang_key.clone(), now);
        let index = self.index.read();
        let mut assumed = self
            .ledger
            .assumed_by_node(|uid| index.knows_bound_pod(uid), now);
        for (node, gpus) in self.ledger.reserved_by_node(gang_key.as_deref(), now) {
            assumed.entry(node).or_default().gpus += gpus;
        }
        // Nodes node monitoring excludes (rollout enabled) are not ranked; they are reported
        // with the monitor's reason, computed per monitoring pass, not per request.
        let crate::index::NodeStates {
            states,
            unknown,
            of_name,
        } = index.node_states(
            names.iter().map(|n| n.as_ref()),
            crate::index::Exclusions::Apply,
            &from_request,
            &assumed,
            now,
        );
        // The states are lent by the index, so the read lock is held until the ranking (and a
        // gang's placement) is done: a writer waits for at most one ranking (0.4 ms at 5,000
        // nodes), where copying the states out to let go sooner cost as much as the ranking.
        let model = index.scheduler();
        let unknown_nodes_total = unknown.len();
        let ranking = model.rank_lazily(&spec, &states, now, seed);
        let ranked_of = ranked_by_name(&of_name, states.len(), &ranking);
        self.count_rejections(ranking.rejected(), unknown_nodes_total);
        let (mut gang_node, mut gang_error, mut reservation) = (None, None, None);
        if let Some(key) = &gang_key {
            let live = match self.ledger.reservation(key, now) {
                Some(r) => Ok(r),
                None => model
                    .place_gang(&spec, &states, now, seed)
                    .map(|p| self.ledger.reserve(key, p)),
            };
            match live {
                Ok(r) => {
                    // One slot for this member, on a node the ranking accepts.
                    let rankable: FastSet<&str> =
                        (0..ranking.len()).filter_map(|i| ranking.node(i)).collect();
                    let member = if facts.uid.is_empty() {
                        format!("{}/{}", facts.namespace, facts.name)
                    } else {
                        facts.uid.clone()
                    };
                    match self
                        .ledger
                        .claim(key, &member, |n| rankable.contains(n), now)
                    {
                        Ok((node, r)) => {
                            gang_node = Some(node);
                            reservation = Some(r);
                        }
                        Err(e) => {
                            gang_error = Some(e.to_string());
                            reservation = Some(r);
                        }
                    }
                }
                Err(e) => gang_error = Some(format!("gang {key} cannot be placed now: {e}")),
            }
        }
        drop(states);
        drop(index);
        let explained = Arc::new(Explained {
            verb,
            pod_uid: facts.uid.clone(),
            computed_at: now,
            seed,
            ranking,
            gang_reservation: reservation,
            unknown_nodes: unknown
                .iter()
                .take(MAX_EXPLAINED_UNKNOWN)
                .cloned()
                .collect(),
            unknown_nodes_total,
        });
        let (kept, lines) = self.explain.put(
            format!("{}/{}", facts.namespace, facts.name),
            explained.clone(),
        );
        self.metrics.explanations.set(kept as i64);
        self.metrics.explanation_node_lines.set(lines as i64);
        Evaluation {
            explained,
            gang_node,
            gang_error,
            unknown,
            ranked_of,
        }
    }

    /// `extender_nodes_rejected_total`: one increment per reason present, not per node.
    fn count_rejections(&self, rejected: &[kudos_scheduler_core::Rejection], unknown: usize) {
        use kudos_scheduler_core::RejectionKind;
        let mut by_kind = [0u64; RejectionKind::ALL.len()];
        for r in rejected {
            by_kind[r.kind as usize] += 1;
        }
        let reasons = RejectionKind::ALL.map(RejectionKind::as_str);
        let unknown = (crate::metrics::UNKNOWN_NODE_METRIC_REASON, unknown as u64);
        for (reason, n) in reasons.into_iter().zip(by_kind).chain([unknown]) {
            if n > 0 {
                self.metrics
                    .nodes_rejected
                    .get_or_create(&crate::metrics::ReasonLabels { reason })
                    .inc_by(n);
            }
        }
    }

    /// `POST <prefix>/filter`.
    pub fn filter<'a>(&self, mut args: ExtenderArgs<'a>) -> ExtenderFilterResult<'a> {
        let Some(pod) = args.pod.as_ref() else {
            return ExtenderFilterResult {
                error: "request has no Pod".into(),
                ..Default::default()
            };
        };
        let facts = match kobj::pod_facts(pod, &self.unified)
            .map_err(|e| e.to_string())
            .and_then(|f| check_request(&args, &f).map(|()| f))
        {
            Ok(f) => f,
            Err(error) => {
                return ExtenderFilterResult {
                    error,
                    ..Default::default()
                };
            }
        };
        if facts.requests.gpus == 0 {
            return ExtenderFilterResult {
                nodes: args.nodes,
                node_names: args.node_names,
                ..Default::default()
            };
        }
        let names_form = args.node_names.is_some();
        let names = candidate_names(&mut args);
        let span = tracing::debug_span!("filter", pod = %format!("{}/{}", facts.namespace, facts.name), class = facts.class.as_deref().unwrap_or(""), nodes = names.len());
        let _g = span.enter();
        let generation = self.index.read().generation();
        let ev = self.evaluate("filter", &args, &facts, &names);
        // Permanent mismatches (the class forbids the devices, too little device memory, fewer
        // devices than requested) and nodes without known accelerators cannot be fixed by
        // preemption, so kube-scheduler should not try; the rest (no room now, stale,
        // unhealthy) may pass later.
        let (permanent, transient): (Vec<_>, Vec<_>) = ev
            .explained
            .ranking
            .rejected()
            .iter()
            .partition(|r| r.kind.is_permanent());
        let mut failed: std::collections::BTreeMap<String, String> = transient
            .into_iter()
            .map(|r| (r.node.to_string(), r.reason.clone()))
            .collect();
        let unresolvable: std::collections::BTreeMap<String, String> = ev
            .unknown
            .into_iter()
            .chain(
                permanent
                    .into_iter()
                    .map(|r| (r.node.to_string(), r.reason.clone())),
            )
            .collect();
        // Per candidate: its index among the ranked nodes if it passes.
        let mut answered = ev.ranked_of;
        if let Some(err) = &ev.gang_error {
            for (n, a) in names.iter().zip(&mut answered) {
                if a.take().is_some() {
                    failed.insert(n.to_string(), err.clone());
                }
            }
        } else if let Some(slot) = &ev.gang_node {
            for (n, a) in names.iter().zip(&mut answered) {
                if a.is_some() && n.as_ref() != slot.as_str() {
                    *a = None;
                    failed.insert(
                        n.to_string(),
                        format!(
                            "gang {} holds this member's slot on node {slot}",
                            facts.gang.as_ref().map_or("", |g| g.0.as_str())
                        ),
                    );
                }
            }
        }
        for (n, a) in names.iter().zip(&answered) {
            if a.is_none()
                && !failed.contains_key(n.as_ref())
                && !unresolvable.contains_key(n.as_ref())
            {
                failed.insert(n.to_string(), "not ranked by Kudos".into());
            }
        }
        // Only the best `filter_top_nodes` pass. The others are left out of the answer, not
        // listed as failed: kube-scheduler drops a node missing from both, and a failed list of
        // thousands would cost it more than it saves.
        let mut beyond_top = 0usize;
        let ranking = &ev.explained.ranking;
        if let Some(top) = self.filter_top_nodes
            && facts.gang.is_none()
            && top < ranking.len()
        {
            let mut in_top = vec![false; ranking.len()];
            for &i in ranking.best(top) {
                in_top[i as usize] = true;
            }
            for a in &mut answered {
                if a.is_some_and(|i| !in_top.get(i as usize).copied().unwrap_or(false)) {
                    *a = None;
                    beyond_top += 1;
                }
            }
        }
        let passed = answered.iter().flatten().count();
        tracing::debug!(passed, beyond_top, failed = failed.len(), "filtered");
        // kube-scheduler skips scoring when one node is feasible, and the extender's filter is
        // its last: with one node passing, no prioritize follows, so the pod's ranking event
        // is written here (once per pod either way).
        if passed == 1
            && let Some(events) = &self.events
        {
            events.ranked(&facts, &ev.explained);
        }
        self.last_filter
            .remember(&facts, generation, &ev.explained, || {
                answered.iter().flatten().copied().collect()
            });
        // The `Nodes` form (kube-scheduler without nodeCacheCapable): full objects, by name.
        let nodes = args.nodes.map(|mut l| {
            let passed: FastSet<&str> = names
                .iter()
                .zip(&answered)
                .filter_map(|(n, a)| a.map(|_| n.as_ref()))
                .collect();
            l.items.retain(|n| {
                n.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| passed.contains(n))
            });
            l
        });
        let node_names = names_form.then(|| {
            names
                .into_iter()
                .zip(&answered)
                .filter_map(|(n, a)| a.map(|_| n))
                .collect()
        });
        ExtenderFilterResult {
            nodes,
            node_names,
            failed_nodes: failed,
            failed_and_unresolvable_nodes: unresolvable,
            ..Default::default()
        }
    }

    /// `POST <prefix>/prioritize`. Errors are only for requests without a pod.
    pub fn prioritize<'a>(
        &self,
        mut args: ExtenderArgs<'a>,
    ) -> Result<Vec<HostPriority<'a>>, String> {
        let pod = args.pod.as_ref().ok_or("request has no Pod")?;
        let facts = kobj::pod_facts(pod, &self.unified).map_err(|e| e.to_string())?;
        check_request(&args, &facts)?;
        let names = candidate_names(&mut args);
        if facts.requests.gpus == 0 {
            return Ok(names
                .into_iter()
                .map(|host| HostPriority { host, score: 0 })
                .collect());
        }
        let span = tracing::debug_span!("prioritize", pod = %format!("{}/{}", facts.namespace, facts.name), class = facts.class.as_deref().unwrap_or(""), nodes = names.len());
        let _g = span.enter();
        let generation = || self.index.read().generation();
        if let Some((explained, scores)) = self.last_filter.reusable(&facts, &names, generation) {
            tracing::debug!("reusing the filter ranking");
            if let Some(events) = &self.events {
                events.ranked(&facts, &explained);
            }
            return Ok(names
                .into_iter()
                .zip(scores)
                .map(|(host, score)| HostPriority {
                    host,
                    score: i64::from(score.min(10)),
                })
                .collect());
        }
        let ev = self.evaluate("prioritize", &args, &facts, &names);
        let (explained, gang_node) = (ev.explained, ev.gang_node);
        if let Some(events) = &self.events {
            events.ranked(&facts, &explained);
        }
        let ranking = &explained.ranking;
        Ok(names
            .into_iter()
            .zip(ev.ranked_of)
            .map(|(host, ranked)| {
                let score = ranked.and_then(|i| ranking.score(i as usize)).unwrap_or(0);
                let base = i64::from(score.min(10));
                let score = match &gang_node {
                    Some(slot) if slot.as_str() == host.as_ref() => 10,
                    Some(_) => 0,
                    None => base,
                };
                HostPriority { host, score }
            })
            .collect())
    }

    /// Whether this extender ranked `namespace/name` (same UID) within
    /// [`BIND_AFTER_RANKING_SECONDS`] and `node` passed. `bind` acts with the orchestrator's
    /// cluster-wide `pods/binding` grant, so it binds only what Kudos itself just placed: a
    /// caller cannot use it to put an arbitrary pod on an arbitrary node.
    fn ranked_here(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        node: &str,
        now: f64,
    ) -> Result<Arc<Explained>, BindRefusal> {
        let pod = || format!("{ns}/{name}");
        let Some(e) = self.explain.get(ns, name) else {
            return Err(BindRefusal::NotRanked { pod: pod() });
        };
        if !uid.is_empty() && !e.pod_uid.is_empty() && e.pod_uid != uid {
            return Err(BindRefusal::NotRanked { pod: pod() });
        }
        let age = now - e.computed_at;
        if age > BIND_AFTER_RANKING_SECONDS {
            return Err(BindRefusal::Stale { pod: pod(), age });
        }
        let r = &e.ranking;
        if !(0..r.len()).any(|i| r.node(i) == Some(node)) {
            return Err(BindRefusal::NodeDidNotPass {
                pod: pod(),
                node: node.to_owned(),
            });
        }
        Ok(e)
    }

    /// `POST <prefix>/bind`.
    pub async fn bind(&self, args: ExtenderBindingArgs) -> ExtenderBindingResult {
        let (Some(ns), Some(name), Some(node)) = (
            args.pod_namespace.filter(|s| !s.is_empty()),
            args.pod_name.filter(|s| !s.is_empty()),
            args.node.filter(|s| !s.is_empty()),
        ) else {
            return ExtenderBindingResult {
                error: "bind needs PodNamespace, PodName and Node".into(),
            };
        };
        let uid = args.pod_uid.unwrap_or_default();
        let explained = match self.ranked_here(&ns, &name, &uid, &node, unix_now()) {
            Ok(e) => e,
            Err(e) => {
                self.metrics
                    .bind_refused
                    .get_or_create(&crate::metrics::ReasonLabels { reason: e.reason() })
                    .inc();
                tracing::warn!(pod = %format!("{ns}/{name}"), node, error = %e, "bind refused");
                return ExtenderBindingResult {
                    error: e.to_string(),
                };
            }
        };
        // A gang member binds only where it holds a slot; the slot is taken before the API
        // call so that concurrent binds of members cannot take the same one.
        let taken = match self.ledger.take_slot(&uid, &node, unix_now()) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), node, error = %e, "bind refused");
                return ExtenderBindingResult {
                    error: e.to_string(),
                };
            }
        };
        let explanation = crate::events::note(&ns, &name, &explained);
        match self
            .binder
            .bind(bind::PodBinding {
                namespace: &ns,
                name: &name,
                uid: &uid,
                node: &node,
                explanation: &explanation,
            })
            .await
        {
            Ok(()) => {
                // The explanation is on the pod now: no Event needed for the pods to come.
                if let Some(events) = &self.events {
                    events.explained_by_bind();
                }
                let gang = self.ledger.bound(&uid, &node, unix_now());
                tracing::info!(pod = %format!("{ns}/{name}"), node, gang = gang.as_deref().unwrap_or(""), "bound");
                ExtenderBindingResult::default()
            }
            Err(e) => {
                if let Some(t) = &taken {
                    self.ledger.release(t, &uid, unix_now());
                }
                tracing::warn!(pod = %format!("{ns}/{name}"), node, error = %e, "bind failed");
                ExtenderBindingResult {
                    error: e.to_string(),
                }
            }
        }
    }
}
