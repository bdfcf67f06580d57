//! Presenting results: a plain-text table, JSON, and an SVG plot of a sweep.

use crate::cli::Settings;
use crate::metrics::Metrics;
use crate::sim::SimResult;
use crate::workload::Job;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// One (arrival rate, policy) cell: the mean over seeds and each seed's metrics.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    /// Arrival rate, jobs/hour (`None` for a replayed trace).
    pub rate_per_hour: Option<f64>,
    /// Policy name.
    pub policy: String,
    /// Seeds run.
    pub seeds: Vec<u64>,
    /// Mean over seeds.
    pub mean: Metrics,
    /// Per seed, in `seeds` order.
    pub per_seed: Vec<Metrics>,
}

fn opt_pct(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        // Cold-start predictions can be off by orders of magnitude; the JSON has the value.
        Some(x) if x >= 10.0 => ">999%".into(),
        Some(x) => format!("{:.1}%", 100.0 * x),
    }
}

/// The lowest and highest per-seed average JCT.
fn spread(c: &Cell) -> String {
    let v = c.per_seed.iter().map(|m| m.avg_jct_h);
    let (lo, hi) = v.fold((f64::INFINITY, 0.0f64), |(l, h), x| (l.min(x), h.max(x)));
    if lo.is_finite() {
        format!("{lo:.1}-{hi:.1}")
    } else {
        "-".into()
    }
}

/// Renders the comparison table: one block per rate, one row per policy, with JCT ratios to
/// kube-default and to the greedy oracle when those policies ran.
pub fn table(cells: &[Cell]) -> String {
    let mut out = String::new();
    let mut rates: Vec<Option<f64>> = Vec::new();
    for c in cells {
        if !rates.contains(&c.rate_per_hour) {
            rates.push(c.rate_per_hour);
        }
    }
    for rate in rates {
        let block: Vec<&Cell> = cells.iter().filter(|c| c.rate_per_hour == rate).collect();
        let avg_of = |name: &str| {
            block
                .iter()
                .find(|c| c.policy == name)
                .map(|c| c.mean.avg_jct_h)
        };
        let (kube, oracle) = (avg_of("kube-default"), avg_of("greedy-oracle"));
        let jobs = block.first().map_or(0, |c| c.mean.jobs);
        let seeds = block.first().map_or(0, |c| c.seeds.len());
        match rate {
            Some(r) => {
                let _ = writeln!(
                    out,
                    "arrival rate {r} jobs/h ({jobs} measured jobs, {seeds} seed(s); times in hours)"
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "trace replay ({jobs} measured jobs, {seeds} seed(s); times in hours)"
                );
            }
        }
        let _ = writeln!(
            out,
            "{:<13} {:>8} {:>13} {:>8} {:>8} {:>8} {:>8} {:>9} {:>6} {:>8} {:>8} {:>8} {:>7} {:>9}",
            "policy",
            "avg JCT",
            "seeds min-max",
            "p50",
            "p95",
            "p99",
            "queue",
            "makespan",
            "util",
            "fastest",
            "MAPE",
            "MAPE@5",
            "/kube",
            "/g-oracle"
        );
        for c in block {
            let m = &c.mean;
            let ratio = |base: Option<f64>| {
                base.filter(|b| *b > 0.0)
                    .map_or_else(|| "-".into(), |b| format!("{:.2}x", m.avg_jct_h / b))
            };
            let _ = writeln!(
                out,
                "{:<13} {:>8.2} {:>13} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9.1} {:>5.0}% {:>7.0}% {:>8} {:>8} {:>7} {:>9}",
                c.policy,
                m.avg_jct_h,
                spread(c),
                m.p50_jct_h,
                m.p95_jct_h,
                m.p99_jct_h,
                m.avg_queue_h,
                m.makespan_h,
                100.0 * m.utilization,
                100.0 * m.fastest_share,
                opt_pct(m.mape),
                opt_pct(m.mape_after5),
                ratio(kube),
                ratio(oracle),
            );
        }
        for c in cells.iter().filter(|c| {
            c.rate_per_hour == rate && !c.mean.mape_over_time.is_empty() && c.policy == "kudos"
        }) {
            let series: Vec<String> = c
                .mean
                .mape_over_time
                .iter()
                .map(|x| opt_pct(Some(*x)))
                .collect();
            let _ = writeln!(
                out,
                "  {} MAPE by tenth of the run: {}",
                c.policy,
                series.join(" ")
            );
        }
        for c in cells
            .iter()
            .filter(|c| c.rate_per_hour == rate && c.mean.stranded > 0)
        {
            let _ = writeln!(
                out,
                "  warning: {} left {} placeable job(s) queued forever (all seeds together)",
                c.policy, c.mean.stranded
            );
        }
        if let Some(u) = cells
            .iter()
            .find(|c| c.rate_per_hour == rate)
            .map(|c| c.mean.unplaceable)
            .filter(|u| *u > 0)
        {
            let _ = writeln!(
                out,
                "  note: {u} job(s) need more GPUs of a usable type than the cluster has and never ran"
            );
        }
        out.push('\n');
    }
    out
}

/// Opens the per-job CSV and writes its header.
pub fn jobs_writer(path: &Path) -> anyhow::Result<csv::Writer<std::fs::File>> {
    let mut w = csv::Writer::from_path(path)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
    w.write_record([
        "policy",
        "rate_per_hour",
        "seed",
        "job",
        "class",
        "job_type",
        "gpus",
        "arrival_s",
        "start_s",
        "end_s",
        "gpu_types",
        "on_fastest",
        "predicted_s",
        "history_runs",
    ])?;
    Ok(w)
}

/// Writes one row per job of one run.
#[allow(clippy::too_many_arguments)]
pub fn write_jobs(
    w: &mut csv::Writer<std::fs::File>,
    s: &Settings,
    policy: &str,
    rate: f64,
    seed: u64,
    jobs: &[Job],
    result: &SimResult,
) -> anyhow::Result<()> {
    for (job, rec) in jobs.iter().zip(&result.records) {
        let Some(r) = rec else { continue };
        let jt = &s.table.job_types[job.job_type];
        let mut types: Vec<&str> = r
            .slots
            .iter()
            .map(|x| s.table.gpu_types[s.cluster.nodes[x.0].gpu_type].as_str())
            .collect();
        types.dedup();
        w.write_record([
            policy.to_owned(),
            rate.to_string(),
            seed.to_string(),
            job.id.to_string(),
            jt.family.clone(),
            jt.name.clone(),
            job.gpus.to_string(),
            format!("{:.1}", r.arrival),
            format!("{:.1}", r.start),
            format!("{:.1}", r.end),
            types.join("+"),
            r.on_fastest.to_string(),
            r.predicted.map_or_else(String::new, |p| format!("{p:.1}")),
            r.history_runs.to_string(),
        ])?;
    }
    Ok(())
}
