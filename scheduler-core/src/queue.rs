//! Queues (§2.2 steps 4 and 5): the first queue (nodes by kudos score), the second queue
//! (kube-scheduler's default scoring, reproduced) and their merge into the recommended queue.
//!
//! The second queue reproduces the two default scoring plugins that look at the fields Kudos has,
//! with kube-scheduler's integer arithmetic, so `/explain` and the simulator show what the real
//! scheduler would add to the extender's score:
//!
//! * **NodeResourcesFit, LeastAllocated**: per resource `(allocatable - requested) * 100 /
//!   allocatable` after adding the pod, averaged with weight 1 over CPU, memory and, when the pod
//!   requests it, the GPU resource. Like kube-scheduler it uses the non-zero defaults for the pod's
//!   CPU (100m) and memory (200 MiB) when they are not requested, and skips resources a node does
//!   not have.
//! * **BalancedAllocation**: `(1 - std(requested / allocatable)) * 100` over the same resources
//!   (with actual requests), so nodes whose resources are used evenly are preferred.
//!
//! Both plugins have weight 1 in the default profile, so the second-queue score is in 0..=200.
//! In extender mode kube-scheduler adds the extender's score times `100 / 10` times its weight;
//! [`merge`] does the same with [`MergeWeights`] (default 5 vs 1). Ties break deterministically:
//! by position in the first queue when the kudos weight is positive, else in the second (both end
//! in node name), so a zero weight on either side reproduces the other queue exactly.
//!
//! The sorts run on packed integer keys (no string comparison unless two names agree on the eight
//! bytes after their common prefix): they are most of the cost of ranking 5,000 nodes.

use crate::config::MergeWeights;
use crate::types::{NodeState, PodSpec};

/// Maximum plugin score in kube-scheduler.
pub const MAX_NODE_SCORE: u64 = 100;
/// Maximum extender score.
pub const MAX_EXTENDER_SCORE: u64 = 10;
/// kube-scheduler's non-zero default CPU request, millicores.
pub const DEFAULT_MILLI_CPU_REQUEST: u64 = 100;
/// kube-scheduler's non-zero default memory request, bytes.
pub const DEFAULT_MEMORY_REQUEST: u64 = 200 * 1024 * 1024;

/// What the queues need to know about one candidate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate<'a> {
    /// Node name (the final tie-break).
    pub name: &'a str,
    /// Kudos score 0..=10.
    pub score: u8,
    /// The rate behind the score (breaks ties between equal rounded scores).
    pub rate: f64,
    /// Predicted log time (lower is better; 0 without a prediction).
    pub log_time: f64,
    /// Default plugins' score.
    pub default_score: f64,
}

/// `x as f64` through a signed conversion (one instruction on x86-64; the unsigned one is a
/// branchy sequence), identical for every value below 2^63.
#[inline]
fn to_f64(x: u64) -> f64 {
    match i64::try_from(x) {
        Ok(v) => v as f64,
        Err(_) => x as f64,
    }
}

#[inline]
fn least_requested(requested: u64, allocatable: u64) -> u64 {
    if requested > allocatable {
        return 0;
    }
    let free = allocatable - requested;
    // Integer division, as upstream computes it. (A float quotient truncated to an integer
    // was tried: the same result, but the conversions and the dependent divisions cost ~1.7x
    // the wall time per node on the hot path, though fewer instructions.)
    match free.checked_mul(MAX_NODE_SCORE) {
        Some(scaled) => scaled / allocatable,
        None => ((u128::from(free) * u128::from(MAX_NODE_SCORE)) / u128::from(allocatable)) as u64,
    }
}

/// BalancedAllocation's fraction of one resource: requested over allocatable, at most 1.
#[inline]
fn fraction(requested: u64, allocatable: u64) -> f64 {
    (to_f64(requested) / to_f64(allocatable)).min(1.0)
}

/// The population standard deviation of three fractions, as BalancedAllocation computes it.
#[inline]
fn std_of_three(f: [f64; 3]) -> f64 {
    let mean = (f[0] + f[1] + f[2]) / 3.0;
    let (a, b, c) = (f[0] - mean, f[1] - mean, f[2] - mean);
    ((a * a + b * b + c * c) / 3.0).sqrt()
}

/// BalancedAllocation from its fractions: `(1 - std) * 100`, truncated. The fractions lie in
/// 0..=1, so the result lies in 0..=100 and a signed truncation is the same as the unsigned one.
#[inline]
fn balanced(std: f64) -> u64 {
    ((1.0 - std) * MAX_NODE_SCORE as f64) as i64 as u64
}

/// NodeResourcesFit (LeastAllocated) score of a node for a pod, 0..=100.
pub fn least_allocated(node: &NodeState, pod: &PodSpec) -> u64 {
    DefaultPlugins::new(pod).least_allocated(node)
}

/// BalancedAllocation score of a node for a pod, 0..=100.
pub fn balanced_allocation(node: &NodeState, pod: &PodSpec) -> u64 {
    DefaultPlugins::new(pod).balanced_allocation(node)
}

/// The default plugins' total score (both at weight 1), 0..=200.
pub fn default_score(node: &NodeState, pod: &PodSpec) -> f64 {
    f64::from(DefaultPlugins::new(pod).score(&NodeResources::of(node)))
}

/// What the default scoring plugins read of a node: allocatable and requested CPU and memory,
/// device count and free devices. Small and plain, so a ranking keeps it per node and scores
/// the second queue only when its order is read (see `rank::lazy`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NodeResources {
    cpu_allocatable_milli: u64,
    cpu_requested_milli: u64,
    memory_allocatable_bytes: u64,
    memory_requested_bytes: u64,
    count: u32,
    free_devices: u32,
}

impl NodeResources {
    pub(crate) fn of(node: &NodeState) -> Self {
        Self {
            cpu_allocatable_milli: node.cpu_allocatable_milli,
            cpu_requested_milli: node.cpu_requested_milli,
            memory_allocatable_bytes: node.memory_allocatable_bytes,
            memory_requested_bytes: node.memory_requested_bytes,
            count: node.profile.count,
            free_devices: node.free_devices,
        }
    }
}

/// Both default scoring plugins for one pod, its requests resolved once for many nodes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DefaultPlugins {
    /// CPU and memory requests as NodeResourcesFit counts them (non-zero defaults).
    cpu_nonzero: u64,
    memory_nonzero: u64,
    /// Actual requests, as BalancedAllocation counts them.
    cpu: u64,
    memory: u64,
    /// Devices requested; the GPU resource counts only when positive.
    gpus: u32,
}

impl DefaultPlugins {
    pub(crate) fn new(pod: &PodSpec) -> Self {
        let nonzero = |v: u64, default: u64| if v == 0 { default } else { v };
        Self {
            cpu_nonzero: nonzero(pod.cpu_milli, DEFAULT_MILLI_CPU_REQUEST),
            memory_nonzero: nonzero(pod.memory_bytes, DEFAULT_MEMORY_REQUEST),
            cpu: pod.cpu_milli,
            memory: pod.memory_bytes,
            gpus: pod.gpus,
        }
    }

    /// Both plugins in one pass over the node's CPU, memory and (when the pod requests devices)
    /// GPU resource, skipping what the node does not have: `(NodeResourcesFit LeastAllocated,
    /// BalancedAllocation)`, each 0..=100.
    #[inline]
    fn scores(&self, node: &NodeResources) -> (u64, u64) {
        let count = u64::from(node.count);
        let gpus = u64::from(self.gpus);
        let (cpu, memory) = (node.cpu_allocatable_milli, node.memory_allocatable_bytes);
        if gpus > 0 && count > 0 && cpu > 0 && memory > 0 {
            // The common case on the extender's path (a GPU pod, a node with all three
            // resources), straight-line so that the three divisions of each plugin overlap.
            let used = count.saturating_sub(u64::from(node.free_devices));
            let least = least_requested(
                node.cpu_requested_milli.saturating_add(self.cpu_nonzero),
                cpu,
            ) + least_requested(
                node.memory_requested_bytes
                    .saturating_add(self.memory_nonzero),
                memory,
            ) + least_requested(used.saturating_add(gpus), count);
            let f = [
                fraction(node.cpu_requested_milli.saturating_add(self.cpu), cpu),
                fraction(
                    node.memory_requested_bytes.saturating_add(self.memory),
                    memory,
                ),
                fraction(used.saturating_add(gpus), count),
            ];
            return (least / 3, balanced(std_of_three(f)));
        }
        let (mut least, mut fractions, mut n) = (0u64, [0f64; 3], 0usize);
        let mut add = |requested: u64, allocatable: u64, nonzero: u64, actual: u64| {
            if allocatable > 0 {
                least += least_requested(requested.saturating_add(nonzero), allocatable);
                fractions[n] = fraction(requested.saturating_add(actual), allocatable);
                n += 1;
            }
        };
        add(node.cpu_requested_milli, cpu, self.cpu_nonzero, self.cpu);
        add(
            node.memory_requested_bytes,
            memory,
            self.memory_nonzero,
            self.memory,
        );
        if gpus > 0 {
            let used = count.saturating_sub(u64::from(node.free_devices));
            add(used, count, gpus, gpus);
        }
        // Constant divisors: a multiply each instead of a 64-bit division.
        let least = match n {
            0 => 0,
            1 => least,
            2 => least / 2,
            _ => least / 3,
        };
        let f = fractions;
        let std = match n {
            0 | 1 => 0.0,
            2 => ((f[0] - f[1]) / 2.0).abs(),
            _ => std_of_three(f),
        };
        (least, balanced(std))
    }

    /// NodeResourcesFit (LeastAllocated), 0..=100.
    pub(crate) fn least_allocated(&self, node: &NodeState) -> u64 {
        self.scores(&NodeResources::of(node)).0
    }

    /// BalancedAllocation, 0..=100: `(1 - std(requested / allocatable)) * 100`.
    pub(crate) fn balanced_allocation(&self, node: &NodeState) -> u64 {
        self.scores(&NodeResources::of(node)).1
    }

    /// Both plugins at weight 1, 0..=200.
    #[inline]
    pub(crate) fn score(&self, node: &NodeResources) -> u8 {
        let (least, balanced) = self.scores(node);
        // Each plugin is at most 100.
        (least + balanced) as u8
    }
}

/// Length of the common prefix of two byte strings.
pub fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    // Eight bytes at a time: the first differing byte is the lowest set byte of the XOR.
    let mut i = 0;
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        let (x, y) = (le_u64(x), le_u64(y));
        if x != y {
            return i + ((x ^ y).trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i + a[i..]
        .iter()
        .zip(&b[i..])
        .take_while(|(x, y)| x == y)
        .count()
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_le_bytes(a)
}

/// The sort key of one name: the (up to) 8 bytes after `lcp`, big-endian and zero-padded.
pub fn name_key(name: &[u8], lcp: usize) -> u64 {
    let rest = name.get(lcp..).unwrap_or_default();
    // Byte by byte: a memcpy into a buffer followed by a wide load stalls store forwarding.
    (0..8).fold(0u64, |k, i| {
        (k << 8) | u64::from(rest.get(i).copied().unwrap_or(0))
    })
}

/// Sort keys of node names: the (up to) 8 bytes that follow the names' longest common prefix,
/// big-endian and zero-padded, so comparing keys compares names (node names contain no NUL).
/// Names equal in those bytes are ordered by a full-name fix-up after each sort. This keeps
/// string comparisons out of the sorts of the ranking hot path.
pub fn name_keys(candidates: &[Candidate<'_>]) -> Vec<u64> {
    let Some(first) = candidates.first() else {
        return Vec::new();
    };
    let lcp = candidates.iter().fold(first.name.len(), |lcp, c| {
        lcp.min(common_prefix(first.name.as_bytes(), c.name.as_bytes()))
    });
    candidates
        .iter()
        .map(|c| name_key(c.name.as_bytes(), lcp))
        .collect()
}

/// An ascending sort key of an `f64` (the IEEE total order as an integer).
pub(crate) fn ordered(f: f64) -> u64 {
    let b = f.to_bits();
    if b >> 63 == 1 { !b } else { b | (1 << 63) }
}

/// Sorts `(key, candidate)` pairs by key, then candidates with equal keys by full name.
fn sort_keyed(mut v: Vec<(u128, u32)>, c: &[Candidate<'_>]) -> Vec<u32> {
    v.sort_unstable_by_key(|x| x.0);
    for run in v.chunk_by_mut(|a, b| a.0 == b.0) {
        if run.len() > 1 {
            run.sort_by(|a, b| {
                c[a.1 as usize]
                    .name
                    .cmp(c[b.1 as usize].name)
                    .then(a.1.cmp(&b.1))
            });
        }
    }
    v.into_iter().map(|x| x.1).collect()
}

pub(crate) fn first_key(x: &Candidate<'_>, name: u64) -> u128 {
    let score = u128::from(MAX_EXTENDER_SCORE as u8 - x.score.min(10));
    let rate = ((x.rate.clamp(0.0, 1.0) * f64::from(0xff_ffff)) as u32).min(0xff_ffff);
    let rate = u128::from(0xff_ffff - rate);
    let time = u128::from(ordered(x.log_time) >> 32);
    (score << 120) | (rate << 96) | (time << 64) | u128::from(name)
}

pub(crate) fn second_key(x: &Candidate<'_>, name: u64) -> u128 {
    (u128::from(!ordered(x.default_score)) << 64) | u128::from(name)
}

/// The first queue: score descending, then rate descending, then predicted time ascending, then
/// name. (Rate and time enter the key with 24 and 32 significant bits: closer values tie and
/// fall through to the next criterion.)
pub fn first_queue(c: &[Candidate<'_>], names: &[u64]) -> Vec<u32> {
    let keys = c
        .iter()
        .zip(names)
        .enumerate()
        .map(|(i, (x, &name))| (first_key(x, name), i as u32))
        .collect();
    sort_keyed(keys, c)
}

/// The second queue: default score descending, then name.
pub fn second_queue(c: &[Candidate<'_>], names: &[u64]) -> Vec<u32> {
    let keys = c
        .iter()
        .zip(names)
        .enumerate()
        .map(|(i, (x, &name))| (second_key(x, name), i as u32))
        .collect();
    sort_keyed(keys, c)
}

/// The recommended queue in one sort, the same order as [`merge`] over the queue its weights
/// break ties with: the merged score and the tie queue's key are sorted together.
pub fn recommended(c: &[Candidate<'_>], names: &[u64], w: &MergeWeights) -> Vec<(u32, f64)> {
    let items: Vec<(Candidate<'_>, u64)> = c.iter().copied().zip(names.iter().copied()).collect();
    recommended_by(&items, |(x, n)| (x, *n), w)
        .into_iter()
        .map(|x| (x.2, x.3))
        .collect()
}

/// A sorted recommended-queue key: `(merged desc, tie key, index, merged score)`.
pub(crate) type MergedKey = (u64, u128, u32, f64);

/// [`recommended`] over any items that carry a candidate and a name key.
pub(crate) fn recommended_by<'a, T: 'a>(
    items: &'a [T],
    get: impl Fn(&'a T) -> (&'a Candidate<'a>, u64),
    w: &MergeWeights,
) -> Vec<MergedKey> {
    let by_kudos = w.kudos > 0.0;
    let mut keys: Vec<MergedKey> = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let (x, name) = get(item);
            let m = merged_score(x, w);
            let tie = if by_kudos {
                first_key(x, name)
            } else {
                second_key(x, name)
            };
            (!ordered(m), tie, i as u32, m)
        })
        .collect();
    keys.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    for run in keys.chunk_by_mut(|a, b| a.0 == b.0 && a.1 == b.1) {
        if run.len() > 1 {
            run.sort_by(|a, b| {
                get(&items[a.2 as usize])
                    .0
                    .name
                    .cmp(get(&items[b.2 as usize]).0.name)
                    .then(a.2.cmp(&b.2))
            });
        }
    }
    keys
}

/// Merged score of one candidate: kudos score scaled to 0..=100 times its weight, plus the
/// default plugins' score times theirs.
pub fn merged_score(c: &Candidate<'_>, w: &MergeWeights) -> f64 {
    let scaled = f64::from(c.score) * (MAX_NODE_SCORE / MAX_EXTENDER_SCORE) as f64;
    w.kudos * scaled + w.default_plugins * c.default_score
}

/// The recommended queue: merged score descending; ties by position in `tie_queue` (the first
/// queue when the kudos weight is positive, else the second). Returns `(candidate, merged score)`.
pub fn merge(c: &[Candidate<'_>], tie_queue: &[u32], w: &MergeWeights) -> Vec<(u32, f64)> {
    let mut pos = vec![0u32; c.len()];
    for (p, &i) in tie_queue.iter().enumerate() {
        pos[i as usize] = p as u32;
    }
    let mut keys: Vec<(u128, u32, f64)> = c
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let m = merged_score(x, w);
            let key = (u128::from(!ordered(m)) << 64) | u128::from(pos[i]);
            (key, i as u32, m)
        })
        .collect();
    keys.sort_unstable_by_key(|x| x.0);
    keys.into_iter().map(|x| (x.1, x.2)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DeviceProfile, NodeHealth};

    #[test]
    fn common_prefix_matches_bytewise() {
        let names: [&[u8]; 7] = [
            b"",
            b"g",
            b"gpu-node-0001",
            b"gpu-node-0002",
            b"gpu-node-00010000",
            b"gpu-node-00010001x",
            b"gpx",
        ];
        for a in names {
            for b in names {
                let slow = a.iter().zip(b).take_while(|(x, y)| x == y).count();
                assert_eq!(common_prefix(a, b), slow, "{a:?} {b:?}");
            }
        }
    }

    fn node(cpu_req: u64, mem_req: u64, free: u32) -> NodeState {
        NodeState {
            name: "n".into(),
            profile: DeviceProfile {
                vendor: "nvidia".into(),
                model: "T4".into(),
                count: 4,
                memory_bytes: 16 << 30,
            },
            free_devices: free,
            cpu_allocatable_milli: 4000,
            cpu_requested_milli: cpu_req,
            memory_allocatable_bytes: 16 << 30,
            memory_requested_bytes: mem_req,
            health: NodeHealth::Healthy,
        }
    }

    fn pod(cpu: u64, mem: u64, gpus: u32) -> PodSpec {
        PodSpec {
            namespace: "d".into(),
            name: "p".into(),
            class: None,
            gpus,
            cpu_milli: cpu,
            memory_bytes: mem,
            ..Default::default()
        }
    }

    #[test]
    fn least_allocated_matches_kube_arithmetic() {
        // cpu: (4000-2000)*100/4000 = 50; mem: (16-4)/16*100 = 75; gpu: (4-2)/4*100 = 50.
        let s = least_allocated(&node(1000, 2 << 30, 3), &pod(1000, 2 << 30, 1));
        assert_eq!(s, (50 + 75 + 50) / 3);
        // Without GPUs requested, only cpu and memory count.
        assert_eq!(
            least_allocated(&node(1000, 2 << 30, 3), &pod(1000, 2 << 30, 0)),
            62
        );
        // Non-zero defaults: a pod requesting nothing is scored as 100m / 200MiB.
        let empty = least_allocated(&node(0, 0, 4), &pod(0, 0, 0));
        assert_eq!(empty, (97 + 98) / 2);
    }

    #[test]
    fn ties_order_by_full_name_even_past_the_key_bytes() {
        let names = [
            "gke-pool-a-0000000000-zz",
            "gke-pool-a-0000000000-aa",
            "gke-pool-b",
            "gke-pool-a",
            "gke-pool-a-0000000000-m",
        ];
        let c: Vec<Candidate<'_>> = names
            .iter()
            .map(|name| Candidate {
                name,
                score: 5,
                rate: 0.5,
                log_time: 1.0,
                default_score: 100.0,
            })
            .collect();
        let keys = name_keys(&c);
        let mut expected: Vec<&str> = names.to_vec();
        expected.sort_unstable();
        for order in [first_queue(&c, &keys), second_queue(&c, &keys)] {
            let got: Vec<&str> = order.iter().map(|&i| c[i as usize].name).collect();
            assert_eq!(got, expected);
        }
    }

    /// Upstream's two scorers as written in Go (`leastResourceScorer`, `balancedResourceScorer`),
    /// over (requested, allocatable) per resource, the pod's request already added.
    fn upstream(least: &[(u64, u64)], balanced: &[(u64, u64)]) -> (u64, u64) {
        let (mut score, mut weights) = (0u128, 0u128);
        for &(req, alloc) in least.iter().filter(|r| r.1 > 0) {
            weights += 1;
            if req <= alloc {
                score += u128::from(alloc - req) * 100 / u128::from(alloc);
            }
        }
        let least = score.checked_div(weights).map_or(0, |l| l as u64);
        let f: Vec<f64> = balanced
            .iter()
            .filter(|r| r.1 > 0)
            .map(|&(req, alloc)| (req as f64 / alloc as f64).min(1.0))
            .collect();
        let std = match f.len() {
            0 | 1 => 0.0,
            2 => ((f[0] - f[1]) / 2.0).abs(),
            n => {
                let mean = f.iter().sum::<f64>() / n as f64;
                (f.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64).sqrt()
            }
        };
        (least, ((1.0 - std) * 100.0) as u64)
    }

    #[test]
    fn both_scores_match_upstreams_arithmetic_on_every_path() {
        // Values around the edges: nothing allocatable, over-committed, exact integer
        // quotients, and sizes where `free * 100` no longer fits in 64 bits.
        let amounts = [
            0u64,
            1,
            3,
            1000,
            4000,
            16 << 30,
            1 << 57,
            u64::MAX / 3,
            u64::MAX,
        ];
        let mut checked = 0;
        for &(cpu_alloc, cpu_req) in &[
            (4000u64, 0u64),
            (4000, 3999),
            (0, 0),
            (3, 1),
            (1 << 60, 1 << 59),
        ] {
            for &mem_alloc in &amounts {
                for &mem_req in &amounts {
                    for (count, free) in [(0u32, 0u32), (4, 4), (4, 1), (8, 0), (3, 2)] {
                        for (pod_cpu, pod_mem, gpus) in
                            [(0, 0, 0), (1000, 2 << 30, 1), (7, 1 << 58, 2)]
                        {
                            let mut n = node(cpu_req, mem_req, free);
                            n.cpu_allocatable_milli = cpu_alloc;
                            n.memory_allocatable_bytes = mem_alloc;
                            n.profile.count = count;
                            let p = pod(pod_cpu, pod_mem, gpus);
                            let nz = |v: u64, d: u64| if v == 0 { d } else { v };
                            let used = u64::from(count.saturating_sub(free));
                            let g = u64::from(gpus);
                            let gpu =
                                (gpus > 0).then_some((used.saturating_add(g), u64::from(count)));
                            let least: Vec<_> = [
                                (
                                    cpu_req.saturating_add(nz(pod_cpu, DEFAULT_MILLI_CPU_REQUEST)),
                                    cpu_alloc,
                                ),
                                (
                                    mem_req.saturating_add(nz(pod_mem, DEFAULT_MEMORY_REQUEST)),
                                    mem_alloc,
                                ),
                            ]
                            .into_iter()
                            .chain(gpu)
                            .collect();
                            let balanced: Vec<_> = [
                                (cpu_req.saturating_add(pod_cpu), cpu_alloc),
                                (mem_req.saturating_add(pod_mem), mem_alloc),
                            ]
                            .into_iter()
                            .chain(gpu)
                            .collect();
                            let got = (least_allocated(&n, &p), balanced_allocation(&n, &p));
                            assert_eq!(got, upstream(&least, &balanced), "{n:?} {p:?}");
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 5 * 9 * 9 * 5 * 3);
    }

    #[test]
    fn balanced_allocation_prefers_even_use() {
        let even = balanced_allocation(&node(0, 0, 4), &pod(2000, 8 << 30, 0));
        let skew = balanced_allocation(&node(0, 0, 4), &pod(4000, 0, 0));
        assert_eq!(even, 100);
        assert_eq!(skew, 50);
    }
}
