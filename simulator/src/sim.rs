//! The discrete-event loop: arrivals, placement, completions, retries.
//!
//! Placement is non-preemptive. A job that fits nowhere waits in a FIFO queue; whenever GPUs
//! are freed the whole queue is retried in arrival order and every job that now fits is placed,
//! as kube-scheduler moves unschedulable pods back to its active queue on a cluster event (no
//! head-of-line blocking). The loop checks before calling a policy that a placement exists
//! (exactly: a node with enough free GPUs of a usable type, or enough usable free GPUs for a
//! gang), so policies never pay for hopeless attempts and a saturated queue stays cheap.

use crate::cluster::Cluster;
use crate::events::{Action, Event};
use crate::policy::{Ctx, FinishedRun, Policy, ProgressReport, true_runtime};
use crate::throughput::ThroughputTable;
use crate::workload::Job;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// What happened to one job.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    /// Job id.
    pub id: usize,
    /// Arrival, seconds.
    pub arrival: f64,
    /// Start, seconds.
    pub start: f64,
    /// End, seconds.
    pub end: f64,
    /// GPUs held.
    pub gpus: u32,
    /// Ran on the fastest GPU type present in the cluster for its job type.
    pub on_fastest: bool,
    /// The policy's prediction of the run time.
    pub predicted: Option<f64>,
    /// Runs of this (class, GPU type) finished before this job was placed (class as the policy
    /// labels it: see [`Policy::class_label`]).
    pub history_runs: u32,
    /// Position in placement order.
    pub placed_order: usize,
    /// `(node index, GPUs)` it held.
    pub slots: Vec<(usize, u32)>,
}

impl JobRecord {
    /// Job completion time: end minus arrival.
    pub fn jct(&self) -> f64 {
        self.end - self.arrival
    }
    /// Run time: end minus start.
    pub fn runtime(&self) -> f64 {
        self.end - self.start
    }
}

/// The outcome of one simulation.
#[derive(Clone, Debug, PartialEq)]
pub struct SimResult {
    /// One record per job, by job id; `None` for jobs that never ran (see `stranded`).
    pub records: Vec<Option<JobRecord>>,
    /// GPUs in the cluster.
    pub total_gpus: u32,
    /// The cluster after the last job finished (all GPUs should be free again).
    pub final_cluster: Cluster,
    /// Jobs that could run on this cluster but that the policy never placed (still queued when
    /// nothing else was left to happen).
    pub stranded: Vec<usize>,
}

/// A policy broke the placement contract.
#[derive(Debug, thiserror::Error)]
#[error("policy {policy} gave job {job} an invalid placement: {reason}")]
pub struct InvalidPlacement {
    /// The policy.
    pub policy: String,
    /// The job.
    pub job: usize,
    /// What is wrong.
    pub reason: String,
}

/// Something due at time `t` for job `id` (its end, or its `k`-th in-progress report), ordered
/// for a min-heap on time, then id for determinism.
#[derive(PartialEq)]
struct Due {
    t: f64,
    id: usize,
    k: u32,
}
impl Eq for Due {}
impl Ord for Due {
    fn cmp(&self, o: &Self) -> Ordering {
        o.t.total_cmp(&self.t).then(o.id.cmp(&self.id))
    }
}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// First in-progress report of a run, seconds after its start; later ones double the interval
/// (1 h, 2 h, 4 h, ...), so a long run reports early and a bounded number of times.
pub const FIRST_SNAPSHOT_S: f64 = 3600.0;

/// Per-job facts the loop needs, computed once.
struct JobInfo {
    gang: bool,
    feasible: Vec<bool>,
    family: usize,
}

impl JobInfo {
    fn ctx<'a>(&'a self, table: &'a ThroughputTable, cluster: &'a Cluster, now: f64) -> Ctx<'a> {
        Ctx {
            table,
            cluster,
            now,
            feasible: &self.feasible,
            gang: self.gang,
        }
    }
}

/// Runs `jobs` (sorted by arrival) on `cluster` under `policy`. `on_done` is called once per
/// finished job (for progress bars).
pub fn simulate(
    jobs: &[Job],
    table: &ThroughputTable,
    cluster: Cluster,
    policy: &mut dyn Policy,
    on_done: &mut dyn FnMut(),
) -> Result<SimResult, InvalidPlacement> {
    simulate_with_events(jobs, table, cluster, &[], policy, on_done)
}

/// [`simulate`] with mid-run `events` (sorted by time; see [`crate::events`]). Policies that
/// ask for progress ([`Policy::wants_progress`]) get in-progress reports of running jobs.
pub fn simulate_with_events(
    jobs: &[Job],
    table: &ThroughputTable,
    mut cluster: Cluster,
    events: &[Event],
    policy: &mut dyn Policy,
    on_done: &mut dyn FnMut(),
) -> Result<SimResult, InvalidPlacement> {
    let n_types = table.gpu_types.len();
    let mut families: HashMap<&str, usize> = HashMap::new();
    let infos: Vec<JobInfo> = jobs
        .iter()
        .map(|j| {
            let gang = j.gpus > cluster.max_node_gpus;
            let feasible = (0..n_types)
                .map(|g| {
                    cluster.total_of_type(g) > 0
                        && table.throughput(j.job_type, j.gpus, g, gang).is_some()
                })
                .collect();
            let next = families.len();
            let family = *families.entry(policy.class_label(j, table)).or_insert(next);
            JobInfo {
                gang,
                feasible,
                family,
            }
        })
        .collect();
    let mut runs_seen = vec![0u32; families.len() * n_types];
    let mut records: Vec<Option<JobRecord>> = vec![None; jobs.len()];
    let mut slots_of: Vec<Vec<(usize, u32)>> = vec![Vec::new(); jobs.len()];
    let mut running = BinaryHeap::new();
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut next_arrival = 0;
    let mut placed = 0usize;

    // Can a job ever run here (on an empty cluster)?
    let placeable = |j: &Job, info: &JobInfo, c: &Cluster| {
        if info.gang {
            (0..n_types)
                .filter(|g| info.feasible[*g])
                .map(|g| c.total_of_type(g))
                .sum::<u32>()
                >= j.gpus
        } else {
            c.nodes
                .iter()
                .any(|n| info.feasible[n.gpu_type] && n.total >= j.gpus)
        }
    };
    let mut max_free = vec![0u32; n_types];
    let refresh_max_free = |c: &Cluster, m: &mut Vec<u32>| {
        m.iter_mut().for_each(|x| *x = 0);
        for n in &c.nodes {
            m[n.gpu_type] = m[n.gpu_type].max(n.free);
        }
    };

    let progress = policy.wants_progress();
    let mut snapshots: BinaryHeap<Due> = BinaryHeap::new();
    let mut next_event = 0usize;
    let mut run_factor = vec![1.0f64; table.job_types.len()];
    let mut runtimes = vec![0.0f64; jobs.len()];

    loop {
        let t_arr = jobs.get(next_arrival).map(|j| j.arrival);
        let t_done = running.peek().map(|r: &Due| r.t);
        let t_next = match (t_arr, t_done) {
            (Some(a), Some(d)) => Some(a.min(d)),
            (a, d) => a.or(d),
        };
        // Events happen before arrivals and completions at the same time; an event after the
        // last one still matters while jobs wait (they may be waiting for joining nodes).
        let mut retry_at = None;
        if let Some(ev) = events.get(next_event)
            && t_next.map_or(!queue.is_empty(), |t| ev.at <= t)
        {
            next_event += 1;
            if !apply_event(ev, &mut cluster, &mut run_factor) {
                continue;
            }
            retry_at = Some(ev.at);
        }
        if let Some(sn) = snapshots.peek()
            && retry_at.is_none()
            && t_next.is_some_and(|t| sn.t < t)
        {
            let Some(sn) = snapshots.pop() else { break };
            let rec = records[sn.id]
                .as_ref()
                .expect("snapshots are of running jobs");
            let job = &jobs[sn.id];
            let ctx = infos[sn.id].ctx(table, &cluster, sn.t);
            policy.observe_progress(
                &ProgressReport {
                    job,
                    slots: &slots_of[sn.id],
                    start: rec.start,
                    now: sn.t,
                    work_done: job.steps * (sn.t - rec.start) / runtimes[sn.id],
                },
                &ctx,
            );
            let next = rec.start + FIRST_SNAPSHOT_S * f64::from(1u32 << (sn.k + 1).min(30));
            if next < rec.end {
                snapshots.push(Due {
                    t: next,
                    id: sn.id,
                    k: sn.k + 1,
                });
            }
            continue;
        }
        // New capacity joined: retry every waiting job.
        let (now, candidates): (f64, Vec<usize>) = if let Some(at) = retry_at {
            (at, queue.iter().copied().collect())
        } else {
            match (t_arr, t_done) {
                (_, Some(d)) if t_arr.is_none_or(|a| d <= a) => {
                    let Some(r) = running.pop() else { break };
                    let job = &jobs[r.id];
                    for &(i, g) in &slots_of[r.id] {
                        cluster.release(i, g);
                    }
                    let rec = records[r.id].as_ref().expect("running jobs have records");
                    let fam = infos[r.id].family;
                    let mut types: Vec<usize> = slots_of[r.id]
                        .iter()
                        .map(|s| cluster.nodes[s.0].gpu_type)
                        .collect();
                    types.sort_unstable();
                    types.dedup();
                    for g in types {
                        runs_seen[fam * n_types + g] += 1;
                    }
                    let ctx = infos[r.id].ctx(table, &cluster, d);
                    policy.observe(
                        &FinishedRun {
                            job,
                            slots: &slots_of[r.id],
                            start: rec.start,
                            end: rec.end,
                        },
                        &ctx,
                    );
                    on_done();
                    (d, queue.iter().copied().collect())
                }
                (Some(a), _) => {
                    let id = next_arrival;
                    next_arrival += 1;
                    if !placeable(&jobs[id], &infos[id], &cluster) {
                        on_done();
                        continue;
                    }
                    queue.push_back(id);
                    (a, vec![id])
                }
                _ => break,
            }
        };

        refresh_max_free(&cluster, &mut max_free);
        let mut started = Vec::new();
        for id in candidates {
            if cluster.free_gpus() == 0 {
                break;
            }
            let (job, info) = (&jobs[id], &infos[id]);
            let fits = if info.gang {
                (0..n_types)
                    .filter(|g| info.feasible[*g])
                    .map(|g| cluster.free_of_type(g))
                    .sum::<u32>()
                    >= job.gpus
            } else {
                (0..n_types).any(|g| info.feasible[g] && max_free[g] >= job.gpus)
            };
            if !fits {
                continue;
            }
            let ctx = info.ctx(table, &cluster, now);
            let Some(p) = policy.place(job, &ctx) else {
                continue;
            };
            let invalid = |reason: String| InvalidPlacement {
                policy: policy.name().to_owned(),
                job: id,
                reason,
            };
            validate(job, info, &p.slots, &cluster).map_err(invalid)?;
            let runtime = true_runtime(job, &p.slots, &cluster, table)
                .ok_or_else(|| invalid("a member's GPU type cannot run this job".into()))?
                * run_factor[job.job_type];
            runtimes[id] = runtime;
            if progress && FIRST_SNAPSHOT_S < runtime {
                snapshots.push(Due {
                    t: now + FIRST_SNAPSHOT_S,
                    id,
                    k: 0,
                });
            }
            for &(i, g) in &p.slots {
                cluster.allocate(i, g);
            }
            refresh_max_free(&cluster, &mut max_free);
            let primary = cluster.nodes[p.slots[0].0].gpu_type;
            records[id] = Some(JobRecord {
                id,
                arrival: job.arrival,
                start: now,
                end: now + runtime,
                gpus: job.gpus,
                on_fastest: on_fastest(job, info, &p.slots, &cluster, table),
                predicted: p.predicted_seconds,
                history_runs: runs_seen[info.family * n_types + primary],
                placed_order: placed,
                slots: p.slots.clone(),
            });
            placed += 1;
            running.push(Due {
                t: now + runtime,
                id,
                k: 0,
            });
            slots_of[id] = p.slots;
            started.push(id);
        }
        if !started.is_empty() {
            queue.retain(|id| !started.contains(id));
        }
    }
    Ok(SimResult {
        records,
        total_gpus: cluster.total_gpus(),
        final_cluster: cluster,
        stranded: queue.into_iter().collect(),
    })
}

/// Applies one event; true when waiting jobs should be retried (new capacity).
fn apply_event(ev: &Event, cluster: &mut Cluster, run_factor: &mut [f64]) -> bool {
    match &ev.action {
        Action::Slow(i, factor) => {
            cluster.nodes[*i].speed /= factor;
            false
        }
        Action::Join(nodes) => {
            for &i in nodes {
                cluster.bring_online(i);
            }
            true
        }
        Action::Class(types, factor) => {
            for &t in types {
                run_factor[t] *= factor;
            }
            false
        }
    }
}

fn validate(job: &Job, info: &JobInfo, slots: &[(usize, u32)], c: &Cluster) -> Result<(), String> {
    if slots.is_empty() {
        return Err("no slots".into());
    }
    if !info.gang && slots.len() != 1 {
        return Err(format!(
            "a {}-GPU job fits on one node but was split over {}",
            job.gpus,
            slots.len()
        ));
    }
    let total: u32 = slots.iter().map(|s| s.1).sum();
    if total != job.gpus {
        return Err(format!("{total} GPUs given, {} asked", job.gpus));
    }
    for (k, &(i, g)) in slots.iter().enumerate() {
        let n = c.nodes.get(i).ok_or_else(|| format!("no node {i}"))?;
        if g == 0 || n.free < g {
            return Err(format!(
                "node {} has {} free GPUs, {g} taken",
                n.name, n.free
            ));
        }
        if !info.feasible[n.gpu_type] {
            return Err(format!(
                "node {} has a GPU type that cannot run the job",
                n.name
            ));
        }
        if slots[..k].iter().any(|s| s.0 == i) {
            return Err(format!("node {} appears twice", n.name));
        }
    }
    Ok(())
}

/// Every member is on a GPU type as fast as the fastest usable type present in the cluster.
fn on_fastest(
    job: &Job,
    info: &JobInfo,
    slots: &[(usize, u32)],
    c: &Cluster,
    t: &ThroughputTable,
) -> bool {
    let tput = |g: usize| {
        t.throughput(job.job_type, job.gpus, g, info.gang)
            .unwrap_or(0.0)
    };
    let best = (0..info.feasible.len())
        .filter(|g| info.feasible[*g])
        .map(tput)
        .fold(0.0, f64::max);
    slots.iter().all(|s| tput(c.nodes[s.0].gpu_type) >= best)
}
