//! Design §2.2 step 1 over a call: the node set, and the distinct device profiles in it.

use std::borrow::Borrow;
use std::fmt::Write as _;
use std::hash::Hasher as _;

use super::{Call, Eval, ProfileRow, Row, SHARED, Scratch};
use crate::Name;
use crate::nodeset::{check_devices, check_node_kind, node_kind_fits};
use crate::predict::NameHasher;
use crate::types::{DeviceProfile, NodeState, Rejection};

/// §2.2 step 1: one [`Row`] per node that fits the pod and whose devices the class allows, in
/// the order of `call.nodes`; the others are returned with their reasons. Device-level checks
/// depend only on the profile, so they run once per distinct profile ([`Scratch::profiles`]).
pub(super) fn node_set<N: Borrow<NodeState>>(
    call: &Call<'_, N>,
    s: &mut Scratch,
) -> Vec<Rejection> {
    s.rows.clear();
    s.profiles.clear();
    s.recent_profiles.clear();
    s.recent_profiles.resize(RECENT_SLOTS, 0);
    let mut rejected = Vec::new();
    for (i, node) in call.nodes.iter().map(Borrow::borrow).enumerate() {
        if !node_kind_fits(node, call.pod)
            && let Err((kind, reason)) = check_node_kind(node, call.pod)
        {
            rejected.push(Rejection {
                node: node.name.clone(),
                reason,
                kind,
            });
            continue;
        }
        let profile = profile_index(call, s, i);
        if let Err((kind, reason)) = &s.profiles[profile].allowed {
            rejected.push(Rejection {
                node: node.name.clone(),
                reason: reason.clone(),
                kind: *kind,
            });
            continue;
        }
        s.rows.push(Row {
            node: i as u32,
            profile: profile as u32,
            eval: SHARED,
        });
    }
    rejected
}

fn profile_hash(p: &DeviceProfile) -> u64 {
    let mut h = NameHasher::default();
    h.write(p.vendor.as_bytes());
    h.write_u8(0xff);
    h.write(p.model.as_bytes());
    h.write_u64(u64::from(p.count) ^ p.memory_bytes.rotate_left(32));
    h.finish()
}

/// `a == b` without a `memcmp` call per string: the strings are a few bytes, compared in at
/// most two overlapping words each.
fn same_profile(a: &DeviceProfile, b: &DeviceProfile) -> bool {
    a.count == b.count
        && a.memory_bytes == b.memory_bytes
        && same_bytes(a.model.as_bytes(), b.model.as_bytes())
        && same_bytes(a.vendor.as_bytes(), b.vendor.as_bytes())
}

fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    fn word<const N: usize>(s: &[u8], at: usize) -> [u8; N] {
        let mut w = [0u8; N];
        w.copy_from_slice(&s[at..at + N]);
        w
    }
    let n = a.len();
    // Two windows, first and last, cover every byte of strings of these lengths.
    n == b.len()
        && match n {
            8..=16 => {
                word::<8>(a, 0) == word::<8>(b, 0) && word::<8>(a, n - 8) == word::<8>(b, n - 8)
            }
            4..=7 => {
                word::<4>(a, 0) == word::<4>(b, 0) && word::<4>(a, n - 4) == word::<4>(b, n - 4)
            }
            _ => a == b,
        }
}

/// The index of node `i`'s profile in [`Scratch::profiles`], added (and class-checked) when new.
/// Nodes share few profiles: a linear search comparing hashes, the fields only on a hash match.
/// (Before that, a look among the recently matched profiles for the same allocations.)
fn profile_index<N: Borrow<NodeState>>(call: &Call<'_, N>, s: &mut Scratch, i: usize) -> usize {
    let profile = &call.node(i as u32).profile;
    // Callers that intern profiles (the orchestrator's index does) give nodes of one profile
    // the same vendor and model allocations: a node whose allocations a recent node had is
    // matched without hashing or comparing text.
    // Fibonacci hashing of the address (allocations are a few words apart) with the count and
    // memory mixed in: nodes of one model often differ in device count.
    let identity = profile.model.address() as u64
        ^ (u64::from(profile.count) << 48)
        ^ profile.memory_bytes.rotate_left(17);
    let slot = identity.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - RECENT_BITS);
    let slot = slot as usize;
    if let Some(p) = s.recent_profiles.get(slot).and_then(|p| p.checked_sub(1))
        && let p = p as usize
        && same_allocations(&call.node(s.profiles[p].first).profile, profile)
    {
        return p;
    }
    let p = profile_index_by_content(call, s, i);
    if let Some(r) = s.recent_profiles.get_mut(slot) {
        *r = p as u32 + 1;
    }
    p
}

/// Profiles in [`Scratch::recent_profiles`]: 256, where 32 let a cluster's 20 profiles (five
/// models in four device counts) collide often enough that many nodes went to the hashed search.
pub(super) const RECENT_SLOTS: usize = 1 << RECENT_BITS;
const RECENT_BITS: u32 = 8;

fn same_allocations(a: &DeviceProfile, b: &DeviceProfile) -> bool {
    a.count == b.count
        && a.memory_bytes == b.memory_bytes
        && Name::same_allocation(&a.model, &b.model)
        && Name::same_allocation(&a.vendor, &b.vendor)
}

/// [`profile_index`] by the profile's text.
fn profile_index_by_content<N: Borrow<NodeState>>(
    call: &Call<'_, N>,
    s: &mut Scratch,
    i: usize,
) -> usize {
    let profile = &call.node(i as u32).profile;
    let h = profile_hash(profile);
    if let Some(p) = s
        .profiles
        .iter()
        .position(|p| p.hash == h && same_profile(&call.node(p.first).profile, profile))
    {
        return p;
    }
    let index = s.profiles.len();
    if s.profile_keys.len() <= index {
        s.profile_keys.push(String::new());
    }
    let key = &mut s.profile_keys[index];
    key.clear();
    // Same text as `DeviceProfile::key`, written into a reused buffer.
    let _ = write!(
        key,
        "{}|{}|{}|{}",
        profile.vendor, profile.model, profile.count, profile.memory_bytes
    );
    debug_assert_eq!(*key, profile.key());
    let class = call.class.as_ref().map(|c| (c.name, c.config));
    let allowed = check_devices(call.pod, class, call.config, call.state, profile);
    s.profiles.push(ProfileRow {
        first: i as u32,
        hash: h,
        allowed,
        pred: None,
        shared_rows: 0,
        eval: Eval::NEUTRAL,
    });
    index
}
