//! Placement policies behind one trait, so every policy runs through the same event loop.
//!
//! A policy sees the job's class, GPU count and declared work, and the cluster's free GPUs; only
//! the greedy oracle reads the hidden job type and noise. The event loop calls a policy only when a
//! placement exists, and only offers nodes whose GPU type can run the job at all (a type with no
//! measured throughput for the job is filtered out, as a memory-fit filter would): the policies
//! differ only in *where* they place, which is what is being measured.

use crate::cluster::{Cluster, Node};
use crate::throughput::ThroughputTable;
use crate::workload::Job;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What a policy sees when placing one job.
pub struct Ctx<'a> {
    /// The throughput table (only the oracle reads throughputs from it; others may read names).
    pub table: &'a ThroughputTable,
    /// The cluster with current free GPUs.
    pub cluster: &'a Cluster,
    /// Simulated time, seconds.
    pub now: f64,
    /// Per GPU type: can this job run there at all.
    pub feasible: &'a [bool],
    /// The job needs more GPUs than any node has: it runs as a gang of one-GPU pods.
    pub gang: bool,
}

/// Where a job runs: `(node index, GPUs)` slots, and the policy's predicted run time if it has
/// one (for prediction-error metrics).
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Nodes and GPUs taken on each; one slot for a non-gang job.
    pub slots: Vec<(usize, u32)>,
    /// The policy's prediction of the run time, seconds.
    pub predicted_seconds: Option<f64>,
}

/// A job that has finished, as reported back to the policy.
pub struct FinishedRun<'a> {
    /// The job.
    pub job: &'a Job,
    /// Where it ran.
    pub slots: &'a [(usize, u32)],
    /// Start time, seconds.
    pub start: f64,
    /// End time, seconds.
    pub end: f64,
}

/// An in-progress report of a running job, as a node agent sends it: work done so far.
pub struct ProgressReport<'a> {
    /// The job.
    pub job: &'a Job,
    /// Where it runs.
    pub slots: &'a [(usize, u32)],
    /// Start time, seconds.
    pub start: f64,
    /// Snapshot time, seconds.
    pub now: f64,
    /// Steps done by `now` (the workload's `kudos.dev/progress`).
    pub work_done: f64,
}

/// A placement policy.
pub trait Policy {
    /// Name shown in tables.
    fn name(&self) -> &str;
    /// Chooses where `job` runs now, or `None` to leave it queued.
    fn place(&mut self, job: &Job, ctx: &Ctx<'_>) -> Option<Placement>;
    /// The class a job counts under for "runs seen per (class, GPU type)" (prediction-error
    /// metrics); the default is the model family, the class the scheduler is shown.
    fn class_label<'t>(&self, job: &Job, table: &'t ThroughputTable) -> &'t str {
        &table.job_types[job.job_type].family
    }
    /// Learns from a finished job; the default ignores it.
    fn observe(&mut self, _run: &FinishedRun<'_>, _ctx: &Ctx<'_>) {}
    /// Whether the event loop should send in-progress reports of running jobs.
    fn wants_progress(&self) -> bool {
        false
    }
    /// Learns from an in-progress report; the default ignores it.
    fn observe_progress(&mut self, _run: &ProgressReport<'_>, _ctx: &Ctx<'_>) {}
    /// The learned state to carry into a later run (`--state-out`), if the policy learns.
    fn learned_state(&self) -> Option<serde_json::Value> {
        None
    }
}

/// Names of the built-in policies, in table order.
pub const POLICY_NAMES: [&str; 5] = [
    "kube-default",
    "random",
    "fastest-type",
    "kudos",
    "greedy-oracle",
];

/// Places greedily by a node score, breaking ties uniformly at random (as kube-scheduler does).
///
/// A non-gang job takes one node with enough free GPUs; a gang places its one-GPU members one at
/// a time, each on the best-scoring node given the members already placed. `score(node, free)`
/// sees the node and its free GPUs before this pick.
pub fn greedy(
    job: &Job,
    ctx: &Ctx<'_>,
    rng: &mut impl Rng,
    mut score: impl FnMut(&Node, u32) -> f64,
) -> Option<Vec<(usize, u32)>> {
    let nodes = &ctx.cluster.nodes;
    let mut pick = |need: u32, free: &dyn Fn(usize) -> u32| -> Option<usize> {
        let mut best: Option<(f64, usize)> = None;
        let mut ties = 0u32;
        for (i, n) in nodes.iter().enumerate() {
            if !ctx.feasible[n.gpu_type] || free(i) < need {
                continue;
            }
            let s = score(n, free(i));
            match best {
                Some((b, _)) if s < b => {}
                Some((b, _)) if s == b => {
                    ties += 1;
                    if rng.random_range(0..ties) == 0 {
                        best = Some((s, i));
                    }
                }
                _ => {
                    best = Some((s, i));
                    ties = 1;
                }
            }
        }
        best.map(|(_, i)| i)
    };
    if !ctx.gang {
        return pick(job.gpus, &|i| nodes[i].free).map(|i| vec![(i, job.gpus)]);
    }
    let mut taken: Vec<(usize, u32)> = Vec::new();
    for _ in 0..job.gpus {
        let used = taken.clone();
        let free =
            move |i: usize| nodes[i].free - used.iter().find(|s| s.0 == i).map_or(0, |s| s.1);
        let i = pick(1, &free)?;
        match taken.iter_mut().find(|s| s.0 == i) {
            Some(s) => s.1 += 1,
            None => taken.push((i, 1)),
        }
    }
    Some(taken)
}

/// Least-allocated score of kube-scheduler's NodeResourcesFit on the GPU count alone: the share
/// of the node's GPUs still free after this pick.
fn least_allocated(n: &Node, free: u32, need: u32) -> f64 {
    f64::from(free.saturating_sub(need)) / f64::from(n.total.max(1))
}

// === impl Baseline ===

/// The baselines: greedy placement by a fixed node score, ties broken at random, no prediction.
/// They differ only in the score.
pub struct Baseline {
    kind: BaselineKind,
    rng: ChaCha8Rng,
}

enum BaselineKind {
    /// kube-scheduler's default as a GPU cluster sees it: counts GPUs only, spreads by
    /// least-allocated.
    KubeDefault,
    /// Uniformly random among nodes that fit.
    Random,
    /// A static preference list of GPU types: the most preferred type that fits,
    /// least-allocated within a type. Knows nothing about the job. `rank` is by GPU type.
    FastestType { rank: Vec<usize> },
}

impl Baseline {
    fn new(kind: BaselineKind, seed: u64) -> Self {
        Baseline {
            kind,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// kube-scheduler's default, with its own random stream.
    pub fn kube_default(seed: u64) -> Self {
        Self::new(BaselineKind::KubeDefault, seed)
    }

    /// Uniformly random among nodes that fit, with its own random stream.
    pub fn random(seed: u64) -> Self {
        Self::new(BaselineKind::Random, seed)
    }

    /// A static preference of GPU types: `order` lists GPU type indices, most preferred first;
    /// unlisted types come last.
    pub fn fastest_type(order: &[usize], gpu_types: usize, seed: u64) -> Self {
        let mut rank = vec![order.len(); gpu_types];
        for (r, &g) in order.iter().enumerate() {
            rank[g] = r;
        }
        Self::new(BaselineKind::FastestType { rank }, seed)
    }
}

impl Policy for Baseline {
    fn name(&self) -> &str {
        match self.kind {
            BaselineKind::KubeDefault => "kube-default",
            BaselineKind::Random => "random",
            BaselineKind::FastestType { .. } => "fastest-type",
        }
    }
    fn place(&mut self, job: &Job, ctx: &Ctx<'_>) -> Option<Placement> {
        let need = if ctx.gang { 1 } else { job.gpus };
        let kind = &self.kind;
        let slots = greedy(job, ctx, &mut self.rng, |n, free| match kind {
            BaselineKind::KubeDefault => least_allocated(n, free, need),
            BaselineKind::Random => 0.0,
            BaselineKind::FastestType { rank } => {
                -(rank[n.gpu_type] as f64) + 0.5 * least_allocated(n, free, need)
            }
        })?;
        Some(Placement {
            slots,
            predicted_seconds: None,
        })
    }
}

// === impl Oracle ===

/// The greedy oracle. Knows every job's true throughput and noise: places each job where it finishes earliest
/// among the placements available now (the fastest free GPU type for its job type; for a gang,
/// the best pace its slowest member can reach, on the slowest GPUs that reach it). Non-preemptive and
/// without lookahead, like the others. It is *greedy per job*, not a bound: taking the fastest
/// free GPU now can block a later job that needed it more, and Kudos can beat it.
pub struct Oracle {
    rng: ChaCha8Rng,
}

impl Oracle {
    /// A new policy with its own random stream.
    pub fn new(seed: u64) -> Self {
        Oracle {
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }
}

impl Policy for Oracle {
    fn name(&self) -> &str {
        "greedy-oracle"
    }
    fn place(&mut self, job: &Job, ctx: &Ctx<'_>) -> Option<Placement> {
        let (table, gang) = (ctx.table, ctx.gang);
        let tput = |n: &Node| {
            table
                .throughput(job.job_type, job.gpus, n.gpu_type, gang)
                .unwrap_or(0.0)
                * n.speed
        };
        let slots = if gang {
            // The gang runs at its slowest member's pace: find the best pace reachable now,
            // then take the *slowest* GPUs that still reach it, leaving faster ones free.
            let mut free: Vec<(f64, u32)> = ctx
                .cluster
                .nodes
                .iter()
                .filter(|n| ctx.feasible[n.gpu_type] && n.free > 0)
                .map(|n| (tput(n), n.free))
                .collect();
            free.sort_by(|a, b| b.0.total_cmp(&a.0));
            let mut count = 0;
            let pace = free.iter().find_map(|&(t, f)| {
                count += f;
                (count >= job.gpus).then_some(t)
            })?;
            greedy(job, ctx, &mut self.rng, |n, free| {
                let t = tput(n);
                if t < pace {
                    f64::NEG_INFINITY
                } else {
                    -t + 1e-9 * least_allocated(n, free, 1)
                }
            })?
        } else {
            greedy(job, ctx, &mut self.rng, |n, free| {
                tput(n) * (1.0 + 1e-9 * least_allocated(n, free, job.gpus))
            })?
        };
        let predicted = true_runtime(job, &slots, ctx.cluster, ctx.table);
        Some(Placement {
            slots,
            predicted_seconds: predicted,
        })
    }
}

/// The true run time of `job` on `slots`: steps over the throughput of the slowest member
/// (consolidated on one node, unconsolidated across nodes, times the node's speed), times the
/// job's noise. `None` when some member's GPU type has no measured throughput for the job.
pub fn true_runtime(
    job: &Job,
    slots: &[(usize, u32)],
    cluster: &Cluster,
    table: &ThroughputTable,
) -> Option<f64> {
    let spread = slots.len() > 1;
    let mut slowest = f64::INFINITY;
    for &(i, _) in slots {
        let n = &cluster.nodes[i];
        let t = table.throughput(job.job_type, job.gpus, n.gpu_type, spread)? * n.speed;
        slowest = slowest.min(t);
    }
    (slowest.is_finite() && slowest > 0.0).then(|| job.steps / slowest * job.noise)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ClusterShape;

    fn setup() -> (ThroughputTable, Cluster) {
        let t = ThroughputTable::parse(
            "a,b,c,d,slow_steps_per_s,fast_steps_per_s,fast_unconsolidated_steps_per_s\n\
             A,f,1,1,1,4,4\nA,f,1,2,2,8,3\n",
            "t",
        )
        .unwrap();
        let c = Cluster::from_shape(&ClusterShape::PerType { count: 2, gpus: 1 }, &t).unwrap();
        (t, c)
    }

    /// What a policy sees at time 0.
    fn at_start<'a>(
        table: &'a ThroughputTable,
        cluster: &'a Cluster,
        feasible: &'a [bool],
        gang: bool,
    ) -> Ctx<'a> {
        Ctx {
            table,
            cluster,
            now: 0.0,
            feasible,
            gang,
        }
    }

    fn job(gpus: u32) -> Job {
        Job {
            id: 0,
            arrival: 0.0,
            job_type: 0,
            gpus,
            steps: 100.0,
            noise: 1.0,
        }
    }

    #[test]
    fn oracle_takes_the_fast_type_and_kube_default_spreads() {
        let (t, c) = setup();
        let ctx = at_start(&t, &c, &[true, true], false);
        let p = Oracle::new(0).place(&job(1), &ctx).unwrap();
        assert_eq!(c.nodes[p.slots[0].0].gpu_type, 1);
        assert_eq!(p.predicted_seconds, Some(25.0));
        // Kube-default picks every node about equally often.
        let mut k = Baseline::kube_default(1);
        let mut hits = [0; 4];
        for _ in 0..400 {
            hits[k.place(&job(1), &ctx).unwrap().slots[0].0] += 1;
        }
        assert!(hits.iter().all(|h| *h > 60), "{hits:?}");
    }

    #[test]
    fn gang_runs_at_the_pace_of_its_slowest_member() {
        let (t, c) = setup();
        let ctx = at_start(&t, &c, &[true, true], true);
        let p = Oracle::new(0).place(&job(2), &ctx).unwrap();
        assert_eq!(p.slots.len(), 2);
        assert!(p.slots.iter().all(|s| c.nodes[s.0].gpu_type == 1));
        // With one fast GPU taken, the pace is the slow type's: the oracle then takes both slow
        // GPUs and leaves the remaining fast one free for someone else.
        let mut c2 = c.clone();
        let fast0 = c2.nodes.iter().position(|n| n.gpu_type == 1).unwrap();
        c2.allocate(fast0, 1);
        let ctx2 = Ctx {
            cluster: &c2,
            ..ctx
        };
        let p2 = Oracle::new(0).place(&job(2), &ctx2).unwrap();
        assert!(
            p2.slots.iter().all(|s| c2.nodes[s.0].gpu_type == 0),
            "{p2:?}"
        );
        // Spread over two fast nodes: unconsolidated 3 steps/s.
        assert_eq!(true_runtime(&job(2), &p.slots, &c, &t), Some(100.0 / 3.0));
        // One slow and one fast member: the slow one's 2 steps/s (its unconsolidated column is
        // absent, so the consolidated value stands in).
        let slow = c.nodes.iter().position(|n| n.gpu_type == 0).unwrap();
        let fast = c.nodes.iter().position(|n| n.gpu_type == 1).unwrap();
        assert_eq!(
            true_runtime(&job(2), &[(slow, 1), (fast, 1)], &c, &t),
            Some(50.0)
        );
    }

    #[test]
    fn infeasible_types_are_never_offered() {
        let (t, c) = setup();
        let ctx = at_start(&t, &c, &[false, true], false);
        let mut r = Baseline::random(3);
        for _ in 0..50 {
            let p = r.place(&job(1), &ctx).unwrap();
            assert_eq!(c.nodes[p.slots[0].0].gpu_type, 1);
        }
        let mut f = Baseline::fastest_type(&[0, 1], 2, 0);
        assert_eq!(
            c.nodes[f.place(&job(1), &ctx).unwrap().slots[0].0].gpu_type,
            1
        );
    }
}
