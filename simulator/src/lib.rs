//! `kudos-sim`: a trace-driven, discrete-event simulator of a heterogeneous GPU cluster that
//! measures how much sooner jobs finish under Kudos than under kube-scheduler's default.
//!
//! Why a simulator: the question "does learning where a job runs fastest pay off?" needs
//! thousands of jobs on a hundred GPUs of several types; a simulator on *measured* throughputs
//! (Gavel's) answers it in seconds, reproducibly, on a laptop. Kudos runs as the real
//! `kudos-scheduler-core` with an empty history, learning online from completions, against four
//! baselines through one event loop (see [`policy`]).
//!
//! Where to start: [`run`] wires the pieces; [`sim::simulate`] is the event loop;
//! [`workload`] generates the job streams (B0/B1/B2); [`throughput`] parses the ground truth.
//! `kudos-sim` with no arguments runs a small B1 comparison from data compiled into the binary.
#![forbid(unsafe_code)]

pub mod cli;
pub mod cluster;
pub mod data;
pub mod error;
pub mod events;
pub mod kudos;
pub mod metrics;
pub mod output;
pub mod plot;
pub mod policy;
pub mod sim;
pub mod summary;
pub mod throughput;
pub mod workload;

use cli::{Args, Settings};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use metrics::Metrics;
use output::Cell;
use policy::Policy;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Parses arguments, runs, and maps the outcome to an exit code.
pub fn main_with_args() -> ExitCode {
    let settings =
        match kudos_common::parse_settings(|a: &Args| &a.log, |a| Settings::from_args(&a)) {
            Ok(s) => s,
            Err(code) => return code,
        };
    match run(&settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Builds the named policy for one run.
pub fn make_policy(name: &str, s: &Settings, seed: u64) -> anyhow::Result<Box<dyn Policy>> {
    let pseed = seed ^ 0x05ee_d0fb_01c1_e5a7;
    Ok(match name {
        "kube-default" => Box::new(policy::Baseline::kube_default(pseed)),
        "random" => Box::new(policy::Baseline::random(pseed)),
        "fastest-type" => Box::new(policy::Baseline::fastest_type(
            &s.preference,
            s.table.gpu_types.len(),
            pseed,
        )),
        "kudos" => Box::new(kudos::KudosPolicy::new(
            &s.cluster, &s.table, seed, &s.kudos,
        )),
        "greedy-oracle" | "oracle" => Box::new(policy::Oracle::new(pseed)),
        other => anyhow::bail!(
            "unknown policy {other:?} (known: {})",
            policy::POLICY_NAMES.join(", ")
        ),
    })
}

/// Simulates one (rate, seed, policy) combination; returns the jobs and what happened to them.
pub fn simulate_run(
    s: &Settings,
    rate: f64,
    seed: u64,
    policy: &str,
    on_done: &mut dyn FnMut(),
) -> anyhow::Result<(Vec<workload::Job>, sim::SimResult)> {
    let mut wl = s.workload.clone();
    wl.rate_per_hour = rate;
    let jobs = workload::generate(&wl, &s.table, seed);
    let mut p = make_policy(policy, s, seed)?;
    let result = sim::simulate_with_events(
        &jobs,
        &s.table,
        s.cluster.clone(),
        &s.events,
        p.as_mut(),
        on_done,
    )?;
    if let (Some(path), Some(state)) = (&s.state_out, p.learned_state()) {
        let text = serde_json::to_string(&state)?;
        std::fs::write(path, text)
            .map_err(|e| anyhow::anyhow!("--state-out {}: {e}", path.display()))?;
    }
    Ok((jobs, result))
}

/// Simulates one (rate, seed, policy) combination and returns its metrics.
pub fn run_one(
    s: &Settings,
    rate: f64,
    seed: u64,
    policy: &str,
    on_done: &mut dyn FnMut(),
) -> anyhow::Result<Metrics> {
    let (jobs, result) = simulate_run(s, rate, seed, policy, on_done)?;
    Ok(metrics::compute(&result, s.window_for(jobs.len())))
}

/// Runs every (rate, policy, seed) combination of the settings and prints the results.
pub fn run(s: &Settings) -> anyhow::Result<()> {
    let runs = s.rates.len() * s.seeds.len() * s.policies.len();
    let progress = ProgressBar::with_draw_target(
        Some((runs * s.workload.jobs) as u64),
        ProgressDrawTarget::hidden(),
    );
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} jobs, ETA {eta}")
    {
        progress.set_style(style.progress_chars("=> "));
    }
    let started = Instant::now();
    let mut shown = false;
    // Without a terminal (CI, `nohup`, a pipe) the bar is invisible: print a line per run.
    let plain = !std::io::stderr().is_terminal();
    let mut done_runs = 0usize;
    let mut cells = Vec::new();
    let mut jobs_csv = match &s.jobs_csv {
        Some(p) => Some(output::jobs_writer(p)?),
        None => None,
    };
    for &rate in &s.rates {
        for name in &s.policies {
            let mut per_seed = Vec::new();
            for &seed in &s.seeds {
                progress.set_message(format!("{name} @ {rate}/h seed {seed}"));
                let mut tick = || {
                    progress.inc(1);
                    if !shown && started.elapsed() > Duration::from_secs(2) {
                        // Only runs longer than a couple of seconds get a bar; indicatif hides
                        // it when stderr is not a terminal.
                        progress.set_draw_target(ProgressDrawTarget::stderr());
                        shown = true;
                    }
                };
                let (jobs, result) = simulate_run(s, rate, seed, name, &mut tick)?;
                if let Some(w) = jobs_csv.as_mut() {
                    output::write_jobs(w, s, name, rate, seed, &jobs, &result)?;
                }
                let m = metrics::compute(&result, s.window_for(jobs.len()));
                done_runs += 1;
                if plain {
                    eprintln!(
                        "[{done_runs}/{runs}] {name} @ {rate}/h seed {seed}: avg JCT {:.2} h ({:.0} s elapsed)",
                        m.avg_jct_h,
                        started.elapsed().as_secs_f64()
                    );
                }
                per_seed.push(m);
            }
            cells.push(Cell {
                rate_per_hour: s.trace_replay.then_some(()).map_or(Some(rate), |_| None),
                policy: name.clone(),
                seeds: s.seeds.clone(),
                mean: metrics::mean_of(&per_seed),
                per_seed,
            });
        }
    }
    progress.finish_and_clear();
    if let Some(mut w) = jobs_csv {
        w.flush()?;
    }
    tracing::debug!(
        seconds = started.elapsed().as_secs_f64(),
        runs,
        "simulation finished"
    );
    if s.json {
        let doc = serde_json::json!({ "settings": s.describe(), "results": cells });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("{}", s.describe_text());
        print!("{}", output::table(&cells));
    }
    if let Some(path) = &s.summary {
        let command: Vec<String> = std::iter::once("kudos-sim".to_owned())
            .chain(std::env::args().skip(1))
            .collect();
        let header = format!(
            "# {}\n\n```\n{}```\n\nCommand: `{}`\n",
            s.plot_title(),
            s.describe_text(),
            command.join(" ")
        );
        std::fs::write(path, summary::markdown(&cells, &header))
            .map_err(|e| anyhow::anyhow!("--summary {}: {e}", path.display()))?;
    }
    if let Some(path) = &s.seeds_csv {
        std::fs::write(path, summary::seeds_csv(&cells, s.kudos.info.name()))
            .map_err(|e| anyhow::anyhow!("--seeds-csv {}: {e}", path.display()))?;
    }
    if s.rates.len() > 1 {
        plot::plot(&cells, &s.plot, &s.plot_title())?;
        eprintln!("plot written to {}", s.plot.display());
    }
    Ok(())
}
