//! Queues (patent steps 4 and 5): the first queue (nodes by kudos score), the second queue
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
//! by the queue the non-zero weight favours, then by node name, so a zero weight on either side
//! reproduces the other queue exactly.

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

fn least_requested(requested: u64, allocatable: u64) -> u64 {
    if requested > allocatable {
        return 0;
    }
    ((u128::from(allocatable - requested) * u128::from(MAX_NODE_SCORE)) / u128::from(allocatable))
        as u64
}

/// NodeResourcesFit (LeastAllocated) score of a node for a pod, 0..=100.
pub fn least_allocated(node: &NodeState, pod: &PodSpec) -> u64 {
    let cpu = if pod.cpu_milli == 0 {
        DEFAULT_MILLI_CPU_REQUEST
    } else {
        pod.cpu_milli
    };
    let mem = if pod.memory_bytes == 0 {
        DEFAULT_MEMORY_REQUEST
    } else {
        pod.memory_bytes
    };
    let mut resources = [(0u64, 0u64); 3];
    resources[0] = (
        node.cpu_requested_milli.saturating_add(cpu),
        node.cpu_allocatable_milli,
    );
    resources[1] = (
        node.memory_requested_bytes.saturating_add(mem),
        node.memory_allocatable_bytes,
    );
    let n = if pod.gpus > 0 {
        resources[2] = gpu_request(node, pod);
        3
    } else {
        2
    };
    let (mut sum, mut weights) = (0u64, 0u64);
    for &(req, alloc) in &resources[..n] {
        if alloc == 0 {
            continue;
        }
        sum += least_requested(req, alloc);
        weights += 1;
    }
    sum.checked_div(weights).unwrap_or(0)
}

fn gpu_request(node: &NodeState, pod: &PodSpec) -> (u64, u64) {
    let count = u64::from(node.profile.count);
    let used = count.saturating_sub(u64::from(node.free_devices));
    (used + u64::from(pod.gpus), count)
}

/// BalancedAllocation score of a node for a pod, 0..=100.
pub fn balanced_allocation(node: &NodeState, pod: &PodSpec) -> u64 {
    let mut fractions = [0f64; 3];
    let mut n = 0;
    let mut push = |req: u64, alloc: u64| {
        if alloc > 0 {
            fractions[n] = (req as f64 / alloc as f64).min(1.0);
            n += 1;
        }
    };
    push(
        node.cpu_requested_milli.saturating_add(pod.cpu_milli),
        node.cpu_allocatable_milli,
    );
    push(
        node.memory_requested_bytes.saturating_add(pod.memory_bytes),
        node.memory_allocatable_bytes,
    );
    if pod.gpus > 0 {
        let (req, alloc) = gpu_request(node, pod);
        push(req, alloc);
    }
    let f = &fractions[..n];
    let std = match f.len() {
        0 | 1 => 0.0,
        2 => ((f[0] - f[1]) / 2.0).abs(),
        len => {
            let mean = f.iter().sum::<f64>() / len as f64;
            (f.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / len as f64).sqrt()
        }
    };
    ((1.0 - std) * MAX_NODE_SCORE as f64) as u64
}

/// The default plugins' total score (both at weight 1), 0..=200.
pub fn default_score(node: &NodeState, pod: &PodSpec) -> f64 {
    (least_allocated(node, pod) + balanced_allocation(node, pod)) as f64
}

/// Positions of the names in ascending order (`out[i]` = rank of `names[i]`).
pub fn name_order(candidates: &[Candidate<'_>]) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..candidates.len() as u32).collect();
    idx.sort_unstable_by(|&a, &b| {
        candidates[a as usize]
            .name
            .cmp(candidates[b as usize].name)
            .then(a.cmp(&b))
    });
    let mut out = vec![0u32; candidates.len()];
    for (pos, &i) in idx.iter().enumerate() {
        out[i as usize] = pos as u32;
    }
    out
}

/// The first queue: score descending, then rate, then predicted time, then name.
pub fn first_queue(c: &[Candidate<'_>], names: &[u32]) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..c.len() as u32).collect();
    idx.sort_unstable_by(|&a, &b| {
        let (x, y) = (&c[a as usize], &c[b as usize]);
        y.score
            .cmp(&x.score)
            .then_with(|| y.rate.total_cmp(&x.rate))
            .then_with(|| x.log_time.total_cmp(&y.log_time))
            .then_with(|| names[a as usize].cmp(&names[b as usize]))
    });
    idx
}

/// The second queue: default score descending, then name.
pub fn second_queue(c: &[Candidate<'_>], names: &[u32]) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..c.len() as u32).collect();
    idx.sort_unstable_by(|&a, &b| {
        c[b as usize]
            .default_score
            .total_cmp(&c[a as usize].default_score)
            .then_with(|| names[a as usize].cmp(&names[b as usize]))
    });
    idx
}

/// Merged score of one candidate: kudos score scaled to 0..=100 times its weight, plus the
/// default plugins' score times theirs.
pub fn merged_score(c: &Candidate<'_>, w: &MergeWeights) -> f64 {
    let scaled = f64::from(c.score) * (MAX_NODE_SCORE / MAX_EXTENDER_SCORE) as f64;
    w.kudos * scaled + w.default_plugins * c.default_score
}

/// The recommended queue: merged score descending; ties by position in the first queue when the
/// kudos weight is positive, else in the second queue. Returns `(candidate, merged score)`.
pub fn merge(
    c: &[Candidate<'_>],
    first: &[u32],
    second: &[u32],
    w: &MergeWeights,
) -> Vec<(u32, f64)> {
    let tie = if w.kudos > 0.0 { first } else { second };
    let mut pos = vec![0u32; c.len()];
    for (p, &i) in tie.iter().enumerate() {
        pos[i as usize] = p as u32;
    }
    let mut out: Vec<(u32, f64)> = (0..c.len() as u32)
        .map(|i| (i, merged_score(&c[i as usize], w)))
        .collect();
    out.sort_unstable_by(|a, b| {
        b.1.total_cmp(&a.1)
            .then_with(|| pos[a.0 as usize].cmp(&pos[b.0 as usize]))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DeviceProfile, NodeHealth};

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
            work_units: None,
            deadline_seconds: None,
            gang: None,
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
    fn balanced_allocation_prefers_even_use() {
        let even = balanced_allocation(&node(0, 0, 4), &pod(2000, 8 << 30, 0));
        let skew = balanced_allocation(&node(0, 0, 4), &pod(4000, 0, 0));
        assert_eq!(even, 100);
        assert_eq!(skew, 50);
    }
}
