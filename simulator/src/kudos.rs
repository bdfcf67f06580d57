//! The `kudos` policy: `kudos-scheduler-core` driven exactly as the orchestrator drives it.
//!
//! It starts with an empty history and learns online: every finished job is reported through
//! `observe`, one observation per node the job ran on, as the node agents would report it. A
//! single pod goes to the head of the recommended queue (`ranking.entries[0]`, Kudos merged
//! with the default ranking, as in production); a gang is placed by `place_gang`. Nothing of
//! the scheduler is re-implemented here: this file only translates between the simulator's
//! cluster and scheduler-core's types.

use crate::cluster::Cluster;
use crate::policy::{Ctx, FinishedRun, Placement, Policy};
use crate::throughput::ThroughputTable;
use crate::workload::Job;
use kudos_scheduler_core::{
    DeviceProfile, GangSpec, NodeHealth, NodeState, PodSpec, RunObservation, Scheduler,
    SchedulerConfig,
};
use std::collections::HashMap;

/// CPU given to every simulated node, millicores (the simulator does not model CPU contention).
const NODE_CPU_MILLI: u64 = 64_000;
/// Memory given to every simulated node, bytes.
const NODE_MEMORY_BYTES: u64 = 256 << 30;

/// How the simulator drives scheduler-core.
#[derive(Clone, Debug, Default)]
pub struct KudosOptions {
    /// scheduler-core's configuration.
    pub config: SchedulerConfig,
    /// Pods declare their step count as `kudos.dev/work`.
    pub declare_work: bool,
    /// The class label is the job type (model and batch size) instead of the model family:
    /// what finer labels by users would give.
    pub class_by_job_type: bool,
}

/// Kudos through scheduler-core.
pub struct KudosPolicy {
    scheduler: Scheduler,
    seed: u64,
    declare_work: bool,
    class_by_job_type: bool,
    profiles: Vec<DeviceProfile>,
    index: HashMap<String, usize>,
    rejected: u64,
}

impl KudosPolicy {
    /// A fresh scheduler (no history) for `cluster`, configured by `options`.
    pub fn new(
        cluster: &Cluster,
        table: &ThroughputTable,
        seed: u64,
        options: &KudosOptions,
    ) -> Self {
        let profiles = cluster
            .nodes
            .iter()
            .map(|n| DeviceProfile {
                vendor: "nvidia".into(),
                model: table.gpu_types[n.gpu_type].clone(),
                count: n.total,
                memory_bytes: 0,
            })
            .collect();
        KudosPolicy {
            scheduler: Scheduler::new(options.config.clone()),
            seed,
            declare_work: options.declare_work,
            class_by_job_type: options.class_by_job_type,
            profiles,
            index: cluster
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name.clone(), i))
                .collect(),
            rejected: 0,
        }
    }

    fn class(&self, job: &Job, table: &ThroughputTable) -> String {
        self.class_label(job, table).to_owned()
    }

    fn node_states(&self, ctx: &Ctx<'_>) -> Vec<NodeState> {
        ctx.cluster
            .nodes
            .iter()
            .zip(&self.profiles)
            .filter(|(n, _)| ctx.feasible[n.gpu_type])
            .map(|(n, p)| NodeState {
                name: n.name.clone(),
                profile: p.clone(),
                free_devices: n.free,
                cpu_allocatable_milli: NODE_CPU_MILLI,
                cpu_requested_milli: 0,
                memory_allocatable_bytes: NODE_MEMORY_BYTES,
                memory_requested_bytes: 0,
                health: NodeHealth::Healthy,
            })
            .collect()
    }
}

impl Policy for KudosPolicy {
    fn name(&self) -> &str {
        "kudos"
    }

    fn class_label<'t>(&self, job: &Job, table: &'t ThroughputTable) -> &'t str {
        let jt = &table.job_types[job.job_type];
        if self.class_by_job_type {
            &jt.name
        } else {
            &jt.family
        }
    }

    fn place(&mut self, job: &Job, ctx: &Ctx<'_>) -> Option<Placement> {
        let pod = PodSpec {
            namespace: "sim".into(),
            name: format!("job-{}", job.id),
            class: Some(self.class(job, ctx.table)),
            gpus: if ctx.gang { 1 } else { job.gpus },
            cpu_milli: 0,
            memory_bytes: 0,
            work_units: self.declare_work.then_some(job.steps),
            deadline_seconds: None,
            gang: ctx.gang.then(|| GangSpec {
                name: format!("job-{}", job.id),
                size: job.gpus,
            }),
        };
        let nodes = self.node_states(ctx);
        let seed = self.seed ^ (job.id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        if ctx.gang {
            let g = self
                .scheduler
                .place_gang(&pod, &nodes, ctx.now, seed)
                .ok()?;
            let mut slots: Vec<(usize, u32)> = Vec::new();
            for m in &g.members {
                let i = *self.index.get(&m.node)?;
                match slots.iter_mut().find(|s| s.0 == i) {
                    Some(s) => s.1 += m.gpus,
                    None => slots.push((i, m.gpus)),
                }
            }
            return Some(Placement {
                slots,
                predicted_seconds: (g.predicted_seconds > 0.0).then_some(g.predicted_seconds),
            });
        }
        let ranking = self.scheduler.rank(&pod, &nodes, ctx.now, seed);
        let best = ranking.entries.first()?;
        Some(Placement {
            slots: vec![(*self.index.get(&best.node)?, job.gpus)],
            predicted_seconds: best.prediction.as_ref().map(|p| p.seconds),
        })
    }

    fn observe(&mut self, run: &FinishedRun<'_>, ctx: &Ctx<'_>) {
        let class = self.class(run.job, ctx.table);
        let runtime = run.end - run.start;
        for &(i, gpus) in run.slots {
            let obs = RunObservation {
                node: ctx.cluster.nodes[i].name.clone(),
                class: class.clone(),
                profile: self.profiles[i].clone(),
                gpus,
                start: run.start,
                end: run.end,
                completed: true,
                progress: Some(1.0),
                // Devices busy for the whole run (scheduler-core bounds this by the elapsed time).
                gpu_busy_seconds: Some(runtime),
                work_units: self.declare_work.then_some(run.job.steps),
            };
            // One run key per pod, as the node agent reports it (a gang's members are pods).
            let key = format!("job-{}/{}", run.job.id, obs.node);
            if let Err(e) = self.scheduler.observe_run(&key, &obs, run.end) {
                self.rejected += 1;
                if self.rejected == 1 {
                    tracing::warn!(error = %e, node = %obs.node, "scheduler-core rejected an observation (further ones logged at debug)");
                } else {
                    tracing::debug!(error = %e, node = %obs.node, "scheduler-core rejected an observation");
                }
            }
        }
    }
}
