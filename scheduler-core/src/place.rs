//! Placement (§2.2 step 6): one node for a single pod, `k` slots chosen together for a gang.
//!
//! A distributed job runs at the pace of its slowest member, so a gang is placed to minimise the
//! predicted time of its slowest slot, not the sum. Mixed device types also make collective
//! communication and checkpoints awkward, so one device profile is preferred: the best
//! single-profile set wins unless a mixed set's slowest member is faster by more than
//! `gang_profile_tolerance`. Within a set, slots are taken greedily by predicted time, then by
//! recommended rank (which carries the default plugins' packing preferences); greedy by time is
//! optimal for a min-max objective. The placement carries an expiry (`now + TTL`): the caller
//! reserves the slots so the gang's later pods are steered there, and releases them when it lapses.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};

use thiserror::Error;

use crate::nodeset::slots;
use crate::types::{GangPlacement, GangSlot, NodeState, PodSpec, Ranking, Timestamp};

/// Why a gang (or a single pod) could not be placed.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PlaceError {
    /// A gang must have at least one member.
    #[error("gang size must be at least 1")]
    EmptyGang,
    /// Not enough slots among the fitting nodes.
    #[error("needs {needed} slot(s), only {available} available ({rejected} node(s) rejected)")]
    InsufficientCapacity {
        /// Members to place.
        needed: u32,
        /// Slots available on fitting nodes.
        available: u32,
        /// Nodes rejected by step 1.
        rejected: usize,
    },
}

struct Slot<'a> {
    node: &'a str,
    profile: String,
    seconds: f64,
    rank: usize,
    slots: u32,
}

/// A chosen set: `(index into the candidates, members on it)`, slowest predicted time, worst rank.
type Choice = (Vec<(usize, u32)>, f64, usize);

/// Greedy min-max choice over `slots` (already sorted).
fn take(slots: &[&Slot<'_>], k: u32) -> Option<Choice> {
    let mut left = k;
    let mut out = Vec::new();
    let (mut slowest, mut worst_rank) = (0f64, 0usize);
    for (i, s) in slots.iter().enumerate() {
        if left == 0 {
            break;
        }
        let n = s.slots.min(left);
        if n == 0 {
            continue;
        }
        out.push((i, n));
        left -= n;
        slowest = slowest.max(s.seconds);
        worst_rank = worst_rank.max(s.rank);
    }
    (left == 0).then_some((out, slowest, worst_rank))
}

/// Places `pod`'s gang (size 1 without a gang) from a ranking of the same nodes.
pub fn place(
    ranking: &Ranking,
    nodes: &[impl Borrow<NodeState>],
    pod: &PodSpec,
    tolerance: f64,
    ttl: f64,
    now: Timestamp,
) -> Result<GangPlacement, PlaceError> {
    let k = pod.gang.as_ref().map_or(1, |g| g.size);
    if k == 0 {
        return Err(PlaceError::EmptyGang);
    }
    let by_name: HashMap<&str, &NodeState> = nodes
        .iter()
        .map(Borrow::borrow)
        .map(|n: &NodeState| (n.name.as_str(), n))
        .collect();
    let mut all: Vec<Slot<'_>> = ranking
        .entries
        .iter()
        .filter_map(|e| {
            let node = by_name.get(e.node.as_str())?;
            Some(Slot {
                node: &e.node,
                profile: node.profile.key(),
                seconds: e.prediction.as_ref().map_or(0.0, |p| p.seconds),
                rank: e.rank,
                slots: slots(node, pod, k),
            })
        })
        .filter(|s| s.slots > 0)
        .collect();
    if k == 1 {
        // A single pod goes to the head of the recommended queue.
        all.sort_by_key(|s| s.rank);
    } else {
        all.sort_by(|a, b| a.seconds.total_cmp(&b.seconds).then(a.rank.cmp(&b.rank)));
    }
    let available: u32 = all.iter().map(|s| s.slots).sum();
    let refs: Vec<&Slot<'_>> = all.iter().collect();
    let Some(mixed) = take(&refs, k) else {
        return Err(PlaceError::InsufficientCapacity {
            needed: k,
            available,
            rejected: ranking.rejected.len(),
        });
    };
    let mut groups: BTreeMap<&str, Vec<&Slot<'_>>> = BTreeMap::new();
    for s in &all {
        groups.entry(s.profile.as_str()).or_default().push(s);
    }
    let single = groups
        .values()
        .filter_map(|g| take(g, k).map(|t| (g, t)))
        .min_by(|a, b| (a.1.1).total_cmp(&b.1.1).then(a.1.2.cmp(&b.1.2)));
    let (chosen, slowest): (Vec<(&str, u32)>, f64) = match single {
        Some((group, (members, slowest, _))) if slowest <= mixed.1 * tolerance => (
            members.iter().map(|&(i, n)| (group[i].node, n)).collect(),
            slowest,
        ),
        _ => (
            mixed.0.iter().map(|&(i, n)| (refs[i].node, n)).collect(),
            mixed.1,
        ),
    };
    let members = chosen
        .into_iter()
        .flat_map(|(node, n)| {
            (0..n).map(move |_| GangSlot {
                node: node.to_owned(),
                gpus: pod.gpus,
            })
        })
        .collect();
    Ok(GangPlacement {
        members,
        expires_at: now + ttl,
        predicted_seconds: slowest,
    })
}
