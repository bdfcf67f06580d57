//! The extender's own short-lived decisions: binds the Pod watch has not shown yet, gang
//! reservations, and the pods it recently evaluated.
//!
//! This is not cluster state, so it is kept apart from the index (which only watchers and
//! ingestion write). Assumed binds count against a node's free devices until the Pod watch
//! reports the pod (then the index counts it) or, in a cluster, for at most
//! [`ASSUME_TTL_SECONDS`]. In standalone mode there is no Pod watch and assumed binds stay
//! until restart: the only accounting available there.

use crate::kobj::Requests;
use kudos_scheduler_core::{GangPlacement, GangSlot};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Mutex;

/// How long an assumed bind counts in a cluster when the watch never shows the pod.
pub const ASSUME_TTL_SECONDS: f64 = 300.0;
const MAX_SEEN: usize = 50_000;

#[derive(Clone, Debug)]
struct Seen {
    requests: Requests,
    gang: Option<String>,
    at: f64,
}

#[derive(Clone, Debug)]
struct Assumed {
    node: String,
    requests: Requests,
    at: f64,
}

/// A gang's reservation: its slots, which pod bound each, and when it lapses.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    /// Slots chosen by `place_gang`.
    pub slots: Vec<GangSlot>,
    /// Pod UID bound to each slot, by index.
    pub bound: Vec<Option<String>>,
    /// Unix seconds when it lapses.
    pub expires_at: f64,
    /// Predicted time of the slowest member.
    pub predicted_seconds: f64,
}

impl Reservation {
    /// Nodes with at least one unbound slot.
    pub fn open_nodes(&self) -> impl Iterator<Item = &str> {
        self.slots
            .iter()
            .zip(&self.bound)
            .filter(|(_, b)| b.is_none())
            .map(|(s, _)| s.node.as_str())
    }
}

#[derive(Default)]
struct Inner {
    generation: u64,
    seen: HashMap<String, Seen>,
    assumed: HashMap<String, Assumed>,
    gangs: HashMap<String, Reservation>,
}

/// See the module docs.
#[derive(Default)]
pub struct Ledger {
    inner: Mutex<Inner>,
    cluster: bool,
}

impl Ledger {
    /// `cluster`: a Pod watch exists, so assumed binds expire.
    pub fn new(cluster: bool) -> Self {
        Self {
            inner: Mutex::default(),
            cluster,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves only caches behind; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers a pod's requests and gang for its bind.
    pub fn saw(&self, uid: &str, requests: Requests, gang: Option<String>, now: f64) {
        if uid.is_empty() {
            return;
        }
        let mut g = self.lock();
        if g.seen.len() >= MAX_SEEN {
            g.seen.retain(|_, s| now - s.at < 600.0);
            if g.seen.len() >= MAX_SEEN {
                g.seen.clear();
            }
        }
        g.seen.insert(
            uid.to_owned(),
            Seen {
                requests,
                gang,
                at: now,
            },
        );
    }

    /// Resources of assumed binds per node, leaving out pods the index already counts.
    pub fn assumed_by_node(
        &self,
        index_knows: impl Fn(&str) -> bool,
        now: f64,
    ) -> HashMap<String, Requests> {
        let g = self.lock();
        let mut out: HashMap<String, Requests> = HashMap::new();
        for (uid, a) in &g.assumed {
            if index_knows(uid) || (self.cluster && now - a.at > ASSUME_TTL_SECONDS) {
                continue;
            }
            out.entry(a.node.clone()).or_default().add(a.requests);
        }
        out
    }

    /// Records a successful bind: the pod's resources count on `node`, and its gang slot is
    /// taken. Returns the gang key when a slot was taken.
    pub fn bound(&self, uid: &str, node: &str, now: f64) -> Option<String> {
        let mut g = self.lock();
        if self.cluster {
            g.assumed.retain(|_, a| now - a.at <= ASSUME_TTL_SECONDS);
        }
        g.generation += 1;
        let seen = g.seen.get(uid).cloned();
        let requests = seen.as_ref().map(|s| s.requests).unwrap_or_default();
        g.assumed.insert(
            uid.to_owned(),
            Assumed {
                node: node.to_owned(),
                requests,
                at: now,
            },
        );
        let key = seen?.gang?;
        let r = g.gangs.get_mut(&key)?;
        if r.bound.iter().any(|b| b.as_deref() == Some(uid)) {
            return Some(key);
        }
        let slot = r
            .slots
            .iter()
            .zip(r.bound.iter())
            .position(|(s, b)| s.node == node && b.is_none())?;
        r.bound[slot] = Some(uid.to_owned());
        // A gang whose members all bound keeps its reservation only until it lapses.
        Some(key)
    }

    /// Changes whenever a bind or a reservation is recorded.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// The live reservation of a gang, if any.
    pub fn reservation(&self, key: &str, now: f64) -> Option<Reservation> {
        let mut g = self.lock();
        g.gangs.retain(|_, r| r.expires_at > now);
        g.gangs.get(key).cloned()
    }

    /// Reserves a placement unless another call reserved first; returns the live one.
    pub fn reserve(&self, key: &str, p: GangPlacement) -> Reservation {
        let mut g = self.lock();
        g.generation += 1;
        g.gangs
            .entry(key.to_owned())
            .or_insert_with(|| Reservation {
                bound: vec![None; p.members.len()],
                slots: p.members,
                expires_at: p.expires_at,
                predicted_seconds: p.predicted_seconds,
            })
            .clone()
    }

    /// All live reservations (for `/state`).
    pub fn reservations(&self, now: f64) -> HashMap<String, Reservation> {
        let g = self.lock();
        g.gangs
            .iter()
            .filter(|(_, r)| r.expires_at > now)
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect()
    }
}
