//! The `kudos` policy: `kudos-scheduler-core` driven exactly as the orchestrator drives it.
//!
//! It starts with an empty history (or the state of an earlier run, `--state-in`) and learns
//! online: every finished job is reported through `observe_run`, one run per node the job ran
//! on, as the node agents would report it. What Kudos is told depends on the information mode
//! ([`InfoMode`]): the declared total work, measured progress (work done so far, reported while
//! the job runs, no total), or nothing but run times. A
//! single pod goes to the head of the recommended queue (`ranking.entries[0]`, Kudos merged
//! with the default ranking, as in production); a gang is placed by `place_gang`. Nothing of
//! the scheduler is re-implemented here: this file only translates between the simulator's
//! cluster and scheduler-core's types.

use crate::cluster::Cluster;
use crate::policy::{Ctx, FinishedRun, Placement, Policy, ProgressReport};
use crate::throughput::ThroughputTable;
use crate::workload::Job;
use kudos_scheduler_core::{
    DeviceProfile, GangSpec, ModelState, NodeHealth, NodeState, PodSpec, RunObservation, Scheduler,
    SchedulerConfig,
};
use std::collections::HashMap;

/// CPU given to every simulated node, millicores (the simulator does not model CPU contention).
const NODE_CPU_MILLI: u64 = 64_000;
/// Memory given to every simulated node, bytes.
const NODE_MEMORY_BYTES: u64 = 256 << 30;

/// What Kudos learns a job's size from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InfoMode {
    /// Each pod declares its total steps (`kudos.dev/work`); runs report them when they end.
    #[default]
    Declared,
    /// Nothing is declared; running jobs report the steps done so far (`kudos.dev/progress`) at
    /// 1 h, 2 h, 4 h, ... after their start, and at the end. Kudos learns time per step.
    Progress,
    /// Nothing is declared and nothing is reported but start and end: Kudos learns whole-run
    /// times per class.
    None,
}

impl InfoMode {
    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            InfoMode::Declared => "declared",
            InfoMode::Progress => "progress",
            InfoMode::None => "none",
        }
    }
}

/// How the simulator drives scheduler-core.
#[derive(Clone, Debug, Default)]
pub struct KudosOptions {
    /// scheduler-core's configuration.
    pub config: SchedulerConfig,
    /// What Kudos is told about each job's size.
    pub info: InfoMode,
    /// Learned state to start from (`--state-in`).
    pub state_in: Option<ModelState>,
    /// The class label is the job type (model and batch size) instead of the model family:
    /// what finer labels by users would give.
    pub class_by_job_type: bool,
}

/// What one report of a run says besides where and when it started.
struct Report {
    end: f64,
    completed: bool,
    work_units: Option<f64>,
}

/// Kudos through scheduler-core.
pub struct KudosPolicy {
    scheduler: Scheduler,
    seed: u64,
    info: InfoMode,
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
                model: table.gpu_types[n.gpu_type].as_str().into(),
                count: n.total,
                memory_bytes: 0,
            })
            .collect();
        KudosPolicy {
            scheduler: match &options.state_in {
                Some(state) => Scheduler::with_state(options.config.clone(), state.clone()),
                None => Scheduler::new(options.config.clone()),
            },
            seed,
            info: options.info,
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

    /// A prediction as a whole run's time, for the prediction-error metrics only: without
    /// declared work Kudos predicts time per step, which the harness (not Kudos) scales by the
    /// job's steps, so MAPE in every mode measures the per-unit model.
    fn whole_run(&self, predicted: f64, job: &Job) -> f64 {
        match self.info {
            InfoMode::Progress => predicted * job.steps,
            InfoMode::Declared | InfoMode::None => predicted,
        }
    }

    /// Reports a job's run on each of its nodes, one run key per pod (a gang's members are
    /// pods), as the node agents would.
    fn report_slots(
        &mut self,
        job: &Job,
        slots: &[(usize, u32)],
        start: f64,
        r: Report,
        ctx: &Ctx<'_>,
    ) {
        let class = self.class(job, ctx.table);
        for &(i, gpus) in slots {
            let obs = RunObservation {
                node: ctx.cluster.nodes[i].name.clone(),
                class: class.clone(),
                profile: self.profiles[i].clone(),
                gpus,
                start,
                end: r.end,
                completed: r.completed,
                progress: r.completed.then_some(1.0),
                // Devices busy throughout (scheduler-core bounds this by the elapsed time).
                gpu_busy_seconds: Some(r.end - start),
                work_units: r.work_units,
            };
            self.report(&format!("job-{}/{}", job.id, obs.node), &obs, r.end);
        }
    }

    fn report(&mut self, key: &str, obs: &RunObservation, now: f64) {
        if let Err(e) = self.scheduler.observe_run(key, obs, now) {
            self.rejected += 1;
            if self.rejected == 1 {
                tracing::warn!(error = %e, node = %obs.node, "scheduler-core rejected an observation (further ones logged at debug)");
            } else {
                tracing::debug!(error = %e, node = %obs.node, "scheduler-core rejected an observation");
            }
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
            .filter(|(n, _)| n.online && ctx.feasible[n.gpu_type])
            .map(|(n, p)| NodeState {
                name: n.name.as_str().into(),
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
            work_units: (self.info == InfoMode::Declared).then_some(job.steps),
            deadline_seconds: None,
            gang: ctx.gang.then(|| GangSpec {
                name: format!("job-{}", job.id),
                size: job.gpus,
            }),
            // The simulated cluster is all NVIDIA (Gavel's and Alibaba's GPU types).
            vendors: Vec::new(),
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
                predicted_seconds: (g.predicted_seconds > 0.0)
                    .then(|| self.whole_run(g.predicted_seconds, job)),
            });
        }
        let ranking = self.scheduler.rank(&pod, &nodes, ctx.now, seed);
        let best = ranking.entries.first()?;
        Some(Placement {
            slots: vec![(*self.index.get(best.node.as_str())?, job.gpus)],
            predicted_seconds: best
                .prediction
                .as_ref()
                .map(|p| self.whole_run(p.seconds, job)),
        })
    }

    fn wants_progress(&self) -> bool {
        self.info == InfoMode::Progress
    }

    fn observe_progress(&mut self, run: &ProgressReport<'_>, ctx: &Ctx<'_>) {
        // No declared total: the fraction done is unknown, the steps done are not.
        let report = Report {
            end: run.now,
            completed: false,
            work_units: Some(run.work_done),
        };
        self.report_slots(run.job, run.slots, run.start, report, ctx);
    }

    fn learned_state(&self) -> Option<serde_json::Value> {
        serde_json::to_value(self.scheduler.state()).ok()
    }

    fn observe(&mut self, run: &FinishedRun<'_>, ctx: &Ctx<'_>) {
        let report = Report {
            end: run.end,
            completed: true,
            work_units: (self.info != InfoMode::None).then_some(run.job.steps),
        };
        self.report_slots(run.job, run.slots, run.start, report, ctx);
    }
}
