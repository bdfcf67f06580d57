//! Command-line flags (raw) and the validated settings built from them.
//!
//! Flags are kept apart from [`Settings`] so every input file is loaded and every name
//! resolved before the first job is simulated: a typo fails in milliseconds, not after a sweep.

use crate::cluster::{self, Cluster, ClusterShape};
use crate::data::{self, paths};
use crate::events::{Event, EventSpec};
use crate::kudos::{InfoMode, KudosOptions};
use crate::policy::POLICY_NAMES;
use crate::throughput::ThroughputTable;
use crate::workload::{WorkloadConfig, WorkloadKind};
use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Workload generators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkloadName {
    /// Gavel's generator: job type uniform, duration 60*10^U(1.5,3) s (80%) or 60*10^U(3,4) s (20%), Poisson arrivals.
    B0,
    /// As B0 with (duration, GPUs) drawn from the Philly job distribution and lognormal run-time noise (sigma = median PAI CoV).
    B1,
    /// A Philly virtual-cluster trace replayed (needs --vc and the full data).
    B2,
}

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "kudos-sim",
    version,
    about = "Trace-driven simulator of a heterogeneous GPU cluster: compares Kudos with kube-scheduler's default, random, a static fastest-type preference and a greedy oracle (knows true throughputs, places each job where it finishes first; not a bound) on measured throughputs.",
    after_help = "With no arguments: a B1 comparison of all policies on 108 GPUs (9 nodes x 4 GPUs per type) from data compiled into the binary. Data: Gavel (Narayanan et al., OSDI 2020, MIT), Philly (CC-BY-4.0), Alibaba PAI (CC-BY-4.0); see simulator/data/README.md."
)]
pub struct Args {
    /// Workload generator.
    #[arg(long, value_enum, default_value_t = WorkloadName::B1)]
    pub workload: WorkloadName,
    /// Directory holding the full data sets (layout of shared/data: gavel/, alibaba_*/). Without it the embedded extracts are used.
    #[arg(long, env = "KUDOS_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Throughput table in the layout of Gavel's isolated_throughputs.csv (GPU type names are taken from its `<gpu>_steps_per_s` headers), or `builtin:gavel` / `builtin:spec` (the second, spec-modelled table: T4, A10, A100, H100, L40S). Default: from --data-dir, else embedded Gavel.
    #[arg(long, value_name = "FILE")]
    pub throughputs: Option<PathBuf>,
    /// Cluster shape: `per-type:NxG` (N nodes of G GPUs for every GPU type of the table; per-type:36x1 is Gavel's 108 one-GPU nodes), `TYPE=NxG,...`, or `alibaba[:FILE]` (Alibaba 2023 node list).
    #[arg(long, default_value = "per-type:9x4")]
    pub cluster: String,
    /// Alibaba GPU model -> table GPU type mapping for `--cluster alibaba`; unmapped models (G1/G2/G3 by default) are left out and counted.
    #[arg(long, value_name = "MODEL=TYPE,...", default_value = cluster::DEFAULT_GPU_MAP)]
    pub gpu_map: String,
    /// Jobs to generate (B2: at most this many trace jobs). Default: 6000 for B0, 2000 for B1 and B2.
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Poisson arrival rate, jobs per hour (B0, B1). Default: 4 for B0, 0.3 for B1 (near where kube-default saturates on the default cluster).
    #[arg(long, conflicts_with = "sweep")]
    pub rate: Option<f64>,
    /// Sweep these arrival rates (comma-separated jobs/hour) and write an SVG plot of average JCT per policy.
    #[arg(long, value_delimiter = ',', value_name = "RATES")]
    pub sweep: Option<Vec<f64>>,
    /// Seeds; each (rate, policy) is run once per seed and averaged. Default: 0 for a single rate, 0-9 for a sweep (published tables use 10 seeds).
    #[arg(long, value_delimiter = ',')]
    pub seeds: Option<Vec<u64>>,
    /// Policies to compare: kube-default, random, fastest-type, kudos, greedy-oracle (`oracle` is accepted for it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kube-default,random,fastest-type,kudos,greedy-oracle"
    )]
    pub policies: Vec<String>,
    /// B0: draw GPU counts 1/2/4/8 with probability 0.70/0.10/0.15/0.05 (default: single-GPU jobs).
    #[arg(long)]
    pub multi_gpu: bool,
    /// B2: the Philly VC trace, as an id under <data-dir>/gavel/philly_vc_traces/ (e.g. b436b2) or a path to a .tsv.
    #[arg(long)]
    pub vc: Option<String>,
    /// GPU type whose throughput turns durations into steps (Gavel: v100). Default: `v100` if the table has it, else its first GPU type.
    #[arg(long, value_name = "TYPE")]
    pub reference_gpu: Option<String>,
    /// Sigma of the lognormal run-time noise. Default: the median per-job mini-batch CoV of Alibaba PAI for B1/B2, 0 for B0.
    #[arg(long, value_name = "SIGMA")]
    pub noise_sigma: Option<f64>,
    /// Jobs (by arrival index) whose JCT is measured, `START:END`. Default: 4000:5000 (Gavel's steady state) when there are at least 5000 jobs, else the middle half.
    #[arg(long, value_name = "START:END")]
    pub window: Option<String>,
    /// fastest-type's static preference, most preferred first. Default: GPU types by geometric-mean throughput over the table.
    #[arg(long, value_delimiter = ',', value_name = "TYPES")]
    pub prefer: Option<Vec<String>>,
    /// Label each pod's class with its job type (model and batch size) instead of its model family, to see what finer class labels would give Kudos.
    #[arg(long)]
    pub class_by_job_type: bool,
    /// What Kudos is told about each job's size: `declared` (each pod declares its total steps, kudos.dev/work), `progress` (running jobs report steps done so far at 1 h, 2 h, 4 h, ... and at the end; nothing declared) or `none` (start and end times only).
    #[arg(long, value_enum, default_value_t = InfoMode::Declared)]
    pub info: InfoMode,
    /// Same as `--info none` (kept for older command lines).
    #[arg(long, hide = true)]
    pub no_work: bool,
    /// A mid-run event (repeatable): `slow:NODE@HOURS:FACTOR` (runs starting on NODE from then on take FACTOR times longer), `join:TYPE=NxG@HOURS` (N nodes of G GPUs of TYPE join), `class:FAMILY@HOURS:FACTOR` (runs of a model family take FACTOR times longer everywhere).
    #[arg(long = "event", value_name = "EVENT")]
    pub events: Vec<String>,
    /// Start Kudos from the learned state saved by an earlier run (`--state-out`) instead of an empty history.
    #[arg(long, value_name = "FILE")]
    pub state_in: Option<PathBuf>,
    /// Write Kudos' learned state after the last kudos run (last rate, last seed) to FILE, as JSON.
    #[arg(long, value_name = "FILE")]
    pub state_out: Option<PathBuf>,
    /// scheduler-core configuration for the kudos policy, as JSON (`SchedulerConfig`; omitted fields keep their defaults), e.g. {"threshold_factor": 1.1}.
    #[arg(long, value_name = "FILE")]
    pub kudos_config: Option<PathBuf>,
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Where a sweep writes its SVG plot.
    #[arg(long, default_value = "kudos-sim-sweep.svg", value_name = "FILE")]
    pub plot: PathBuf,
    /// Also write a markdown summary of the results to FILE: per rate, every policy's average JCT with its spread over seeds, Kudos' ratios to kube-default, the greedy oracle and fastest-type with their per-seed spread, MAPE@5, and which headline targets are missed.
    #[arg(long, value_name = "FILE")]
    pub summary: Option<PathBuf>,
    /// Also write one CSV row per (rate, policy, seed) with its metrics to FILE.
    #[arg(long, value_name = "FILE")]
    pub seeds_csv: Option<PathBuf>,
    /// Also write one CSV row per job and run (policy, rate, seed, class, job type, GPUs, arrival, start, end, GPU types used, prediction) to FILE.
    #[arg(long, value_name = "FILE")]
    pub jobs_csv: Option<PathBuf>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub log: kudos_common::LogArgs,
}

/// Validated settings: every file loaded, every name resolved.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The ground truth.
    pub table: ThroughputTable,
    /// The cluster, all GPUs free.
    pub cluster: Cluster,
    /// The workload (its rate is replaced per sweep point).
    pub workload: WorkloadConfig,
    /// Arrival rates to run.
    pub rates: Vec<f64>,
    /// Seeds.
    pub seeds: Vec<u64>,
    /// Policy names.
    pub policies: Vec<String>,
    /// fastest-type's preference (GPU type indices).
    pub preference: Vec<usize>,
    /// How the kudos policy drives scheduler-core.
    pub kudos: KudosOptions,
    /// JSON output.
    pub json: bool,
    /// Plot path.
    pub plot: PathBuf,
    /// Per-job CSV path.
    pub jobs_csv: Option<PathBuf>,
    /// Markdown summary path.
    pub summary: Option<PathBuf>,
    /// Per-seed CSV path.
    pub seeds_csv: Option<PathBuf>,
    /// Mid-run events, sorted by time (joining nodes are in `cluster`, offline).
    pub events: Vec<Event>,
    /// Where to write Kudos' learned state.
    pub state_out: Option<PathBuf>,
    /// Explicit measurement window.
    pub window: Option<Range<usize>>,
    /// A trace is replayed: the rate does not apply.
    pub trace_replay: bool,
    /// Where the data came from, for the header.
    pub sources: String,
    /// Cluster notes (left-out nodes), for the header.
    pub cluster_note: String,
}

fn load(dir: Option<&Path>, rel: &str, embedded: &'static str) -> anyhow::Result<(String, String)> {
    match dir {
        Some(d) => {
            let p = d.join(rel);
            Ok((data::read(&p)?, p.display().to_string()))
        }
        None => Ok((
            embedded.to_owned(),
            format!(
                "embedded {}",
                Path::new(rel)
                    .file_name()
                    .and_then(|f| f.to_str())
                    .unwrap_or(rel)
            ),
        )),
    }
}

impl Settings {
    /// Loads and checks everything the flags name.
    pub fn from_args(a: &Args) -> anyhow::Result<Self> {
        let dir = a.data_dir.as_deref();
        if let Some(d) = dir
            && !d.is_dir()
        {
            bail!("--data-dir {} is not a directory", d.display());
        }
        let (text, tfile) = match &a.throughputs {
            Some(p) if p.as_os_str() == "builtin:gavel" => (
                data::EMBEDDED_THROUGHPUTS.to_owned(),
                "embedded isolated_throughputs.csv".to_owned(),
            ),
            Some(p) if p.as_os_str() == "builtin:spec" => (
                data::EMBEDDED_SPEC_THROUGHPUTS.to_owned(),
                "embedded spec_throughputs.csv (modelled from GPU specs)".to_owned(),
            ),
            Some(p) => (data::read(p)?, p.display().to_string()),
            None => load(dir, paths::THROUGHPUTS, data::EMBEDDED_THROUGHPUTS)?,
        };
        let table = ThroughputTable::parse(&text, &tfile)?;
        let mut sources = format!("throughputs: {tfile}");

        let shape: ClusterShape = a
            .cluster
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--cluster: {e}"))?;
        let mut cluster_note = String::new();
        let cluster = match &shape {
            ClusterShape::Alibaba(path) => {
                let path = match (path, dir) {
                    (Some(p), _) => p.clone(),
                    (None, Some(d)) => d.join(paths::ALIBABA_NODES),
                    (None, None) => bail!("--cluster alibaba needs --data-dir (or alibaba:FILE)"),
                };
                let list =
                    data::parse_alibaba_nodes(&data::read(&path)?, &path.display().to_string())?;
                let map = cluster::parse_gpu_map(&a.gpu_map)
                    .map_err(|e| anyhow::anyhow!("--gpu-map: {e}"))?;
                let (c, skipped) =
                    Cluster::from_alibaba(&list, &map, &table).map_err(|e| anyhow::anyhow!(e))?;
                if !skipped.is_empty() {
                    let s: Vec<String> = skipped.iter().map(|(m, n)| format!("{n} {m}")).collect();
                    cluster_note = format!(" (left out, unmapped models: {} nodes)", s.join(", "));
                }
                c
            }
            other => {
                Cluster::from_shape(other, &table).map_err(|e| anyhow::anyhow!("--cluster: {e}"))?
            }
        };

        let mut cluster = cluster;
        let specs = a
            .events
            .iter()
            .map(|e| {
                e.parse::<EventSpec>()
                    .map_err(|m| anyhow::anyhow!("--event {e:?}: {m}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let events =
            crate::events::resolve(&specs, &mut cluster, &table).map_err(|m| anyhow::anyhow!(m))?;
        let state_in = match &a.state_in {
            Some(p) => {
                let text = data::read(p)?;
                let state: kudos_scheduler_core::ModelState = serde_json::from_str(&text)
                    .with_context(|| {
                        format!("--state-in {}: not a Kudos state file", p.display())
                    })?;
                sources.push_str(&format!(", kudos state: {}", p.display()));
                Some(state)
            }
            None => None,
        };
        let reference_gpu = match &a.reference_gpu {
            Some(n) => table.gpu_index(n).with_context(|| {
                format!(
                    "--reference-gpu {n:?} is not in the table ({:?})",
                    table.gpu_types
                )
            })?,
            None => table.gpu_index("v100").unwrap_or(0),
        };
        let cov_sigma = |sources: &mut String| -> anyhow::Result<f64> {
            let (text, file) = load(dir, paths::COV, data::EMBEDDED_COV)?;
            sources.push_str(&format!(", noise: {file}"));
            Ok(data::parse_cov_sigma(&text, &file)?)
        };
        let (kind, default_jobs, default_rate, default_sigma) = match a.workload {
            WorkloadName::B0 => (
                WorkloadKind::B0 {
                    multi_gpu: a.multi_gpu,
                },
                6000,
                4.0,
                0.0,
            ),
            WorkloadName::B1 => {
                let (text, file) = load(dir, paths::PHILLY, data::EMBEDDED_PHILLY)?;
                sources.push_str(&format!(", jobs: {file}"));
                let philly = data::parse_philly_distribution(&text, &file)?;
                let sigma = match a.noise_sigma {
                    Some(s) => s,
                    None => cov_sigma(&mut sources)?,
                };
                (WorkloadKind::B1 { philly }, 2000, 0.3, sigma)
            }
            WorkloadName::B2 => {
                let vc =
                    a.vc.as_deref()
                        .context("--workload b2 needs --vc ID or --vc FILE.tsv")?;
                let path = if vc.ends_with(".tsv") {
                    PathBuf::from(vc)
                } else {
                    dir.context("--vc ID needs --data-dir (or give a .tsv path)")?
                        .join(paths::VC_TRACES)
                        .join(format!("{vc}.tsv"))
                };
                let trace =
                    data::parse_vc_trace(&data::read(&path)?, &path.display().to_string(), &table)?;
                sources.push_str(&format!(", trace: {}", path.display()));
                let sigma = match a.noise_sigma {
                    Some(s) => s,
                    None => cov_sigma(&mut sources)?,
                };
                (WorkloadKind::B2 { trace }, 2000, 0.0, sigma)
            }
        };
        let noise_sigma = a.noise_sigma.unwrap_or(default_sigma);
        if !(noise_sigma.is_finite() && noise_sigma >= 0.0) {
            bail!("--noise-sigma must be a finite number >= 0");
        }
        let rates = match (&a.sweep, a.rate) {
            (Some(r), _) => r.clone(),
            (None, Some(r)) => vec![r],
            (None, None) => vec![default_rate],
        };
        if a.workload != WorkloadName::B2 && rates.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
            bail!("arrival rates must be positive");
        }
        // `oracle` is the greedy oracle's older name.
        let policies: Vec<String> = a
            .policies
            .iter()
            .map(|p| {
                if p == "oracle" {
                    "greedy-oracle".to_owned()
                } else {
                    p.clone()
                }
            })
            .collect();
        for p in &policies {
            if !POLICY_NAMES.contains(&p.as_str()) {
                bail!("unknown policy {p:?} (known: {})", POLICY_NAMES.join(", "));
            }
        }
        let seeds = match &a.seeds {
            Some(s) => s.clone(),
            None if a.sweep.is_some() => (0..10).collect(),
            None => vec![0],
        };
        if seeds.is_empty() || policies.is_empty() {
            bail!("need at least one seed and one policy");
        }
        let preference = match &a.prefer {
            Some(names) => names
                .iter()
                .map(|n| {
                    table.gpu_index(n).with_context(|| {
                        format!(
                            "--prefer: {n:?} is not in the table ({:?})",
                            table.gpu_types
                        )
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?,
            None => table.types_by_mean_speed(),
        };
        let window = a.window.as_deref().map(parse_window).transpose()?;
        let kudos_config = match &a.kudos_config {
            Some(p) => {
                let text = data::read(p)?;
                let c: kudos_scheduler_core::SchedulerConfig = serde_json::from_str(&text)
                    .with_context(|| format!("--kudos-config {}", p.display()))?;
                c.validate()
                    .with_context(|| format!("--kudos-config {}", p.display()))?;
                sources.push_str(&format!(", kudos config: {}", p.display()));
                c
            }
            None => kudos_scheduler_core::SchedulerConfig::default(),
        };
        let jobs = a.jobs.unwrap_or(default_jobs);
        if jobs == 0 {
            bail!("--jobs must be at least 1");
        }
        Ok(Settings {
            workload: WorkloadConfig {
                kind,
                jobs,
                rate_per_hour: rates[0],
                reference_gpu,
                noise_sigma,
            },
            trace_replay: a.workload == WorkloadName::B2,
            rates: if a.workload == WorkloadName::B2 {
                vec![0.0]
            } else {
                rates
            },
            seeds,
            policies,
            preference,
            kudos: KudosOptions {
                config: kudos_config,
                info: if a.no_work { InfoMode::None } else { a.info },
                state_in,
                class_by_job_type: a.class_by_job_type,
            },
            events,
            state_out: a.state_out.clone(),
            json: a.json,
            plot: a.plot.clone(),
            jobs_csv: a.jobs_csv.clone(),
            summary: a.summary.clone(),
            seeds_csv: a.seeds_csv.clone(),
            window,
            sources,
            cluster_note,
            table,
            cluster,
        })
    }

    /// The measurement window for a run of `n` jobs.
    pub fn window_for(&self, n: usize) -> Range<usize> {
        match &self.window {
            Some(w) => w.clone(),
            None if n >= 5000 => 4000..5000,
            None => n / 4..(3 * n).div_ceil(4),
        }
    }

    /// Short workload name.
    pub fn workload_name(&self) -> &'static str {
        match self.workload.kind {
            WorkloadKind::B0 { .. } => "B0",
            WorkloadKind::B1 { .. } => "B1",
            WorkloadKind::B2 { .. } => "B2",
        }
    }

    fn cluster_text(&self) -> String {
        format!(
            "{} nodes, {} GPUs ({}), largest node {} GPUs{}",
            self.cluster.nodes.len(),
            self.cluster.total_gpus(),
            self.cluster_types(),
            self.cluster.max_node_gpus,
            self.cluster_note
        )
    }

    /// The sweep plot's title: workload, information mode, table, cluster and seeds.
    pub fn plot_title(&self) -> String {
        let table = self
            .sources
            .split(", ")
            .next()
            .unwrap_or("")
            .trim_start_matches("throughputs: ");
        let seeds = match (self.seeds.first(), self.seeds.last()) {
            (Some(a), Some(b)) if self.seeds.len() > 1 => {
                format!("{} seeds ({a}..{b})", self.seeds.len())
            }
            (Some(a), _) => format!("seed {a}"),
            _ => String::new(),
        };
        format!(
            "{}, info: {}, {} jobs; table: {table}; {} nodes, {} GPUs ({}); {seeds}",
            self.workload_name(),
            self.kudos.info.name(),
            self.workload.jobs,
            self.cluster.nodes.len(),
            self.cluster.total_gpus(),
            self.cluster_types()
        )
    }

    fn cluster_types(&self) -> String {
        (0..self.table.gpu_types.len())
            .filter(|g| self.cluster.total_of_type(*g) > 0)
            .map(|g| {
                format!(
                    "{} {}",
                    self.cluster.total_of_type(g),
                    self.table.gpu_types[g]
                )
            })
            .collect::<Vec<_>>()
            .join(" + ")
    }

    /// A one-paragraph header for the table.
    pub fn describe_text(&self) -> String {
        let w = self.window_for(self.workload.jobs);
        format!(
            "kudos-sim: workload {}, {} jobs (JCT over jobs {}..{}), noise sigma {:.4}, information given to Kudos: {}, class: {}\n\
             cluster: {}\n{}\n",
            self.workload_name(),
            self.workload.jobs,
            w.start,
            w.end,
            self.workload.noise_sigma,
            self.kudos.info.name(),
            if self.kudos.class_by_job_type {
                "job type"
            } else {
                "model family"
            },
            self.cluster_text(),
            if self.sources.contains("embedded") {
                format!(
                    "{} (embedded extracts: see simulator/data/README.md)",
                    self.sources
                )
            } else {
                self.sources.clone()
            }
        )
    }

    /// The settings as JSON.
    pub fn describe(&self) -> serde_json::Value {
        let w = self.window_for(self.workload.jobs);
        serde_json::json!({
            "workload": self.workload_name(),
            "jobs": self.workload.jobs,
            "window": [w.start, w.end],
            "noise_sigma": self.workload.noise_sigma,
            "reference_gpu": self.table.gpu_types[self.workload.reference_gpu],
            "info": self.kudos.info.name(),
            "events": self.events.len(),
            "class_by_job_type": self.kudos.class_by_job_type,
            "cluster": self.cluster_text(),
            "sources": self.sources,
            "rates": self.rates,
            "seeds": self.seeds,
            "policies": self.policies,
        })
    }
}

fn parse_window(s: &str) -> anyhow::Result<Range<usize>> {
    let (a, b) = s.split_once(':').context("--window: expected START:END")?;
    let (a, b): (usize, usize) = (
        a.trim().parse().context("--window START")?,
        b.trim().parse().context("--window END")?,
    );
    if a >= b {
        bail!("--window: START must be below END");
    }
    Ok(a..b)
}
