//! The extender's own short-lived decisions: binds the Pod watch has not shown yet, gang
//! reservations, and the pods it recently evaluated.
//!
//! This is not cluster state, so it is kept apart from the index (which only watchers and
//! ingestion write). Assumed binds count against a node's free devices until the Pod watch
//! reports the pod (then the index counts it) or, in a cluster, for at most
//! [`ASSUME_TTL_SECONDS`]. In standalone mode there is no Pod watch and assumed binds stay
//! until restart: the only accounting available there.
//!
//! A gang reservation is consumed per slot, not per node. kube-scheduler binds asynchronously:
//! it evaluates the next member while the previous member's bind is still in flight, so a
//! slot is handed to one member when that member is filtered (a [`Claim`], refreshed on every
//! evaluation, lapsing after [`CLAIM_TTL_SECONDS`]) and taken at its bind, which refuses a node
//! where the member holds no slot. Claims and bound slots lapse with the reservation.

use crate::fasthash::FastMap;
use crate::kobj::Requests;
use kudos_scheduler_core::{GangPlacement, GangSlot};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Mutex;

/// How long an assumed bind counts in a cluster when the watch never shows the pod.
pub const ASSUME_TTL_SECONDS: f64 = 300.0;
const MAX_SEEN: usize = 50_000;
/// How long a member's claim on a slot holds when the member is neither evaluated again nor
/// bound (a deleted pod, a bind that never came): then another member may have the slot.
pub const CLAIM_TTL_SECONDS: f64 = 30.0;

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

/// A member holding an unbound slot between its evaluation and its bind.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    /// Pod UID (`namespace/name` when the pod has none).
    pub pod: String,
    /// Unix seconds of the member's latest evaluation.
    pub at: f64,
}

/// A gang's reservation: its slots, which pod claims or bound each, and when it lapses.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    /// Slots chosen by `place_gang`.
    pub slots: Vec<GangSlot>,
    /// Pod UID bound to each slot, by index.
    pub bound: Vec<Option<String>>,
    /// Member holding each unbound slot, by index (may have lapsed; see `CLAIM_TTL_SECONDS`).
    pub claimed: Vec<Option<Claim>>,
    /// Unix seconds when it lapses.
    pub expires_at: f64,
    /// Predicted time of the slowest member.
    pub predicted_seconds: f64,
}

impl Reservation {
    /// The slot `pod` is bound to.
    fn bound_slot(&self, pod: &str) -> Option<usize> {
        self.bound.iter().position(|b| b.as_deref() == Some(pod))
    }

    /// The unbound slot `pod` holds by a live claim.
    fn claimed_slot(&self, pod: &str, now: f64) -> Option<usize> {
        self.claimed.iter().zip(&self.bound).position(|(c, b)| {
            b.is_none() && c.as_ref().is_some_and(|c| c.pod == pod && live(c, now))
        })
    }

    /// Neither bound nor held by a live claim.
    fn is_free(&self, i: usize, now: f64) -> bool {
        self.bound[i].is_none() && self.claimed[i].as_ref().is_none_or(|c| !live(c, now))
    }

    fn drop_claims_of(&mut self, pod: &str) {
        for c in &mut self.claimed {
            if c.as_ref().is_some_and(|c| c.pod == pod) {
                *c = None;
            }
        }
    }
}

fn live(c: &Claim, now: f64) -> bool {
    now - c.at <= CLAIM_TTL_SECONDS
}

/// Why a gang member gets no slot, or may not bind where asked.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GangError {
    /// The reservation lapsed between reading and claiming it.
    #[error("gang {gang} has no live reservation")]
    NoReservation {
        /// `namespace/gang-name`.
        gang: String,
    },
    /// Every slot on the candidate nodes is bound or claimed by another member.
    #[error(
        "gang {gang} has no open slot on the candidate nodes: its slots on {slots:?} are bound or held by other members"
    )]
    NoOpenSlot {
        /// `namespace/gang-name`.
        gang: String,
        /// Nodes of all the gang's slots.
        slots: Vec<String>,
    },
    /// A bind to a node where the member holds no slot.
    #[error("gang {gang} holds no open slot for pod {pod} on node {node} (its slot: {held})")]
    NotReserved {
        /// `namespace/gang-name`.
        gang: String,
        /// Pod UID.
        pod: String,
        /// Node asked for.
        node: String,
        /// Node of the slot the pod holds, or "none".
        held: String,
    },
}

/// A slot taken for a bind in flight, given back by [`Ledger::release`] when the bind fails.
#[derive(Clone, Debug, PartialEq)]
pub struct TakenSlot {
    /// `namespace/gang-name`.
    pub gang: String,
    slot: usize,
    /// False when the pod was bound there already (a retried bind): nothing to give back.
    fresh: bool,
}

#[derive(Default)]
struct Inner {
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

    /// Resources of assumed binds per node, leaving out pods the index already counts. Those
    /// are forgotten here: once the Pod watch has shown a bind, the index counts the pod for
    /// good (and remembers it ended), so every call looks up only the binds still in flight,
    /// not every bind of the last [`ASSUME_TTL_SECONDS`].
    pub fn assumed_by_node(
        &self,
        index_knows: impl Fn(&str) -> bool,
        now: f64,
    ) -> FastMap<String, Requests> {
        let mut g = self.lock();
        let mut out: FastMap<String, Requests> = FastMap::default();
        g.assumed.retain(|uid, a| {
            if index_knows(uid) || (self.cluster && now - a.at > ASSUME_TTL_SECONDS) {
                return false;
            }
            out.entry(a.node.clone()).or_default().add(a.requests);
            true
        });
        out
    }

    /// Records a successful bind: the pod's resources count on `node`. Returns the pod's gang
    /// key, if it is in one (its slot was taken by [`Ledger::take_slot`]).
    pub fn bound(&self, uid: &str, node: &str, now: f64) -> Option<String> {
        let mut g = self.lock();
        if self.cluster {
            g.assumed.retain(|_, a| now - a.at <= ASSUME_TTL_SECONDS);
        }
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
        seen?.gang
    }

    /// Gives `pod` one slot of gang `key`'s live reservation on a node `candidate` accepts:
    /// the slot it is bound to or claims already (the claim is refreshed), else the first free
    /// one. Returns the slot's node and the reservation as it now stands.
    pub fn claim(
        &self,
        key: &str,
        pod: &str,
        candidate: impl Fn(&str) -> bool,
        now: f64,
    ) -> Result<(String, Reservation), GangError> {
        let mut g = self.lock();
        let r = match g.gangs.get_mut(key) {
            Some(r) if r.expires_at > now => r,
            _ => {
                return Err(GangError::NoReservation {
                    gang: key.to_owned(),
                });
            }
        };
        if let Some(i) = r.bound_slot(pod) {
            return Ok((r.slots[i].node.clone(), r.clone()));
        }
        let held = r
            .claimed_slot(pod, now)
            .filter(|&i| candidate(&r.slots[i].node));
        let slot = held.or_else(|| {
            (0..r.slots.len()).find(|&i| r.is_free(i, now) && candidate(&r.slots[i].node))
        });
        let Some(i) = slot else {
            return Err(GangError::NoOpenSlot {
                gang: key.to_owned(),
                slots: r.slots.iter().map(|s| s.node.clone()).collect(),
            });
        };
        r.drop_claims_of(pod);
        r.claimed[i] = Some(Claim {
            pod: pod.to_owned(),
            at: now,
        });
        Ok((r.slots[i].node.clone(), r.clone()))
    }

    /// Before binding `uid` to `node`: takes the pod's gang slot there (the slot it claims, or
    /// else a free one on `node`). `Ok(None)` when the pod is in no gang with a live
    /// reservation; an error when the reservation has no slot for it on `node`.
    pub fn take_slot(
        &self,
        uid: &str,
        node: &str,
        now: f64,
    ) -> Result<Option<TakenSlot>, GangError> {
        let mut g = self.lock();
        let Some(key) = g.seen.get(uid).and_then(|s| s.gang.clone()) else {
            return Ok(None);
        };
        let r = match g.gangs.get_mut(&key) {
            Some(r) if r.expires_at > now => r,
            _ => return Ok(None),
        };
        let refuse = |r: &Reservation, held: Option<usize>| GangError::NotReserved {
            gang: key.clone(),
            pod: uid.to_owned(),
            node: node.to_owned(),
            held: held.map_or_else(|| "none".to_owned(), |i| r.slots[i].node.clone()),
        };
        if let Some(i) = r.bound_slot(uid) {
            return if r.slots[i].node == node {
                Ok(Some(TakenSlot {
                    gang: key.clone(),
                    slot: i,
                    fresh: false,
                }))
            } else {
                Err(refuse(r, Some(i)))
            };
        }
        let held = r.claimed_slot(uid, now);
        let slot = held
            .filter(|&i| r.slots[i].node == node)
            .or_else(|| (0..r.slots.len()).find(|&i| r.is_free(i, now) && r.slots[i].node == node));
        let Some(i) = slot else {
            return Err(refuse(r, held));
        };
        r.drop_claims_of(uid);
        r.bound[i] = Some(uid.to_owned());
        Ok(Some(TakenSlot {
            gang: key,
            slot: i,
            fresh: true,
        }))
    }

    /// After a failed bind: the slot taken for it is claimed by the pod again, not bound.
    pub fn release(&self, taken: &TakenSlot, uid: &str, now: f64) {
        if !taken.fresh {
            return;
        }
        let mut g = self.lock();
        let Some(r) = g.gangs.get_mut(&taken.gang) else {
            return;
        };
        if r.bound.get(taken.slot).and_then(Option::as_deref) == Some(uid) {
            r.bound[taken.slot] = None;
            r.claimed[taken.slot] = Some(Claim {
                pod: uid.to_owned(),
                at: now,
            });
        }
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
        g.gangs
            .entry(key.to_owned())
            .or_insert_with(|| Reservation {
                bound: vec![None; p.members.len()],
                claimed: vec![None; p.members.len()],
                slots: p.members,
                expires_at: p.expires_at,
                predicted_seconds: p.predicted_seconds,
            })
            .clone()
    }

    /// Devices held for gangs other than `except` (the asking pod's own gang), per node: the
    /// slots of live reservations that no member has bound yet. They count as used for every
    /// other pod, so a gang keeps what it reserved until its members bind (then the bind
    /// counts instead) or the reservation lapses; and a second gang cannot reserve devices
    /// the first is waiting for, so two gangs never each hold part of what both need.
    pub fn reserved_by_node(&self, except: Option<&str>, now: f64) -> HashMap<String, u64> {
        let g = self.lock();
        let mut out: HashMap<String, u64> = HashMap::new();
        for (key, r) in &g.gangs {
            if r.expires_at <= now || except == Some(key.as_str()) {
                continue;
            }
            for (slot, bound) in r.slots.iter().zip(&r.bound) {
                if bound.is_none() {
                    *out.entry(slot.node.clone()).or_default() += u64::from(slot.gpus);
                }
            }
        }
        out
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

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "default/g1";

    /// Slots t4-2, t4-2, t4-1 (the e2e engineer's reservation), members m0..m2 seen.
    fn ledger(now: f64) -> Ledger {
        let l = Ledger::new(true);
        for m in ["m0", "m1", "m2"] {
            l.saw(m, Requests::default(), Some(KEY.into()), now);
        }
        let slot = |n: &str| GangSlot {
            node: n.into(),
            gpus: 4,
        };
        l.reserve(
            KEY,
            GangPlacement {
                members: vec![slot("t4-2"), slot("t4-2"), slot("t4-1")],
                expires_at: now + 120.0,
                predicted_seconds: 100.0,
            },
        );
        l
    }

    fn claim(l: &Ledger, pod: &str, now: f64) -> Result<String, GangError> {
        l.claim(KEY, pod, |_| true, now).map(|(n, _)| n)
    }

    /// An assumed bind counts until the index counts the pod, and never again after: the
    /// index may forget an ended pod later, and its bind must not count a second time.
    #[test]
    fn an_assumed_bind_counts_until_the_index_counts_the_pod() {
        let l = Ledger::new(true);
        let one_gpu = Requests {
            gpus: 1,
            ..Default::default()
        };
        l.saw("p", one_gpu, None, 0.0);
        l.bound("p", "n1", 0.0);
        let in_flight = l.assumed_by_node(|_| false, 1.0);
        assert_eq!(in_flight.get("n1").map(|r| r.gpus), Some(1));
        assert!(l.assumed_by_node(|uid| uid == "p", 2.0).is_empty());
        assert!(l.assumed_by_node(|_| false, 3.0).is_empty());
    }

    #[test]
    fn members_in_flight_together_get_distinct_slots() {
        let l = ledger(0.0);
        // All three are evaluated before any bind: each gets its own slot.
        let mut nodes = vec![
            claim(&l, "m0", 1.0).unwrap(),
            claim(&l, "m1", 1.0).unwrap(),
            claim(&l, "m2", 1.0).unwrap(),
        ];
        nodes.sort();
        assert_eq!(nodes, ["t4-1", "t4-2", "t4-2"]);
        // Evaluating a member again keeps its slot; a fourth pod finds none.
        assert_eq!(claim(&l, "m2", 2.0).unwrap(), "t4-1");
        assert!(matches!(
            claim(&l, "m3", 2.0),
            Err(GangError::NoOpenSlot { .. })
        ));
    }

    #[test]
    fn bind_takes_only_the_members_slot() {
        let l = ledger(0.0);
        assert_eq!(claim(&l, "m0", 1.0).unwrap(), "t4-2");
        assert_eq!(claim(&l, "m1", 1.0).unwrap(), "t4-2");
        assert_eq!(claim(&l, "m2", 1.0).unwrap(), "t4-1");
        // m0 binding to t4-1 would take m2's slot: refused.
        let e = l.take_slot("m0", "t4-1", 2.0).unwrap_err();
        assert!(
            matches!(&e, GangError::NotReserved { held, .. } if held == "t4-2"),
            "{e}"
        );
        let t = l.take_slot("m0", "t4-2", 2.0).unwrap().unwrap();
        // A retried bind to the same node succeeds; to another node it is refused.
        assert!(l.take_slot("m0", "t4-2", 3.0).unwrap().is_some());
        assert!(l.take_slot("m0", "t4-1", 3.0).is_err());
        // A failed bind gives the slot back to its member, not to others.
        l.release(&t, "m0", 3.0);
        assert!(l.take_slot("m2", "t4-2", 3.0).is_err());
        assert!(l.take_slot("m0", "t4-2", 3.0).unwrap().is_some());
        assert!(l.take_slot("m1", "t4-2", 3.0).unwrap().is_some());
        assert!(l.take_slot("m2", "t4-1", 3.0).unwrap().is_some());
        let r = l.reservation(KEY, 4.0).unwrap();
        assert!(r.bound.iter().all(Option::is_some), "{r:?}");
        // A pod outside any gang is not constrained.
        assert_eq!(l.take_slot("other", "t4-1", 4.0), Ok(None));
    }

    #[test]
    fn unbound_slots_count_for_everyone_but_the_gang_until_bound_or_lapsed() {
        let l = ledger(0.0);
        let held = |except, now| {
            let mut v: Vec<(String, u64)> = l.reserved_by_node(except, now).into_iter().collect();
            v.sort();
            v
        };
        assert_eq!(held(None, 1.0), [("t4-1".into(), 4), ("t4-2".into(), 8)]);
        assert_eq!(
            held(Some(KEY), 1.0),
            [],
            "the gang's own members see its slots free"
        );
        assert_eq!(held(Some("default/other"), 1.0).len(), 2);
        // A bound slot is counted by the bind (assumed, then the Pod watch), not here.
        claim(&l, "m2", 1.0).unwrap();
        l.take_slot("m2", "t4-1", 2.0).unwrap();
        assert_eq!(held(None, 2.0), [("t4-2".into(), 8)]);
        // A lapsed reservation holds nothing.
        assert_eq!(held(None, 121.0), []);
    }

    #[test]
    fn claims_and_reservations_lapse() {
        let l = ledger(0.0);
        assert_eq!(claim(&l, "m0", 1.0).unwrap(), "t4-2");
        assert_eq!(claim(&l, "m1", 1.0).unwrap(), "t4-2");
        // m0 and m1 are never seen again: after the claim TTL m2 may use their slots.
        let later = 2.0 + CLAIM_TTL_SECONDS;
        assert_eq!(
            l.claim(KEY, "m2", |n| n == "t4-2", later).unwrap().0,
            "t4-2"
        );
        // After the reservation lapses, nothing is claimed and binds are unconstrained.
        assert!(matches!(
            claim(&l, "m0", 121.0),
            Err(GangError::NoReservation { .. })
        ));
        assert!(l.reservation(KEY, 121.0).is_none());
        assert_eq!(l.take_slot("m0", "anywhere", 121.0), Ok(None));
    }
}
