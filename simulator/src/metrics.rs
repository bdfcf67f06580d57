//! Metrics of one simulation, and their mean over seeds.
//!
//! JCT statistics are over a measurement window of jobs (Gavel measures jobs 4000–4999 so the
//! cluster is in steady state, neither filling up nor draining); makespan and utilisation are
//! over the whole run. Prediction error is MAPE of the policy's predicted run time against the
//! true one, over time (placement order) and restricted to predictions made once the (class,
//! GPU type) pair had at least 5 finished runs.

use crate::sim::{JobRecord, SimResult};
use serde::Serialize;
use std::ops::Range;

/// Runs of a (class, type) pair before a prediction counts towards `mape_after5`.
pub const WARM_RUNS: u32 = 5;
/// Buckets of the MAPE-over-time series.
pub const MAPE_BUCKETS: usize = 10;

/// Metrics of one run (or the mean of several).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Metrics {
    /// Jobs measured (in the window and placeable).
    pub jobs: usize,
    /// Jobs that can never run on this cluster (more GPUs than it has of usable types).
    pub unplaceable: usize,
    /// Jobs that could have run but that the policy never placed.
    pub stranded: usize,
    /// Mean job completion time, hours.
    pub avg_jct_h: f64,
    /// Median JCT, hours.
    pub p50_jct_h: f64,
    /// 95th percentile JCT, hours.
    pub p95_jct_h: f64,
    /// 99th percentile JCT, hours.
    pub p99_jct_h: f64,
    /// Mean queueing delay (start minus arrival), hours.
    pub avg_queue_h: f64,
    /// First arrival to last completion, hours.
    pub makespan_h: f64,
    /// GPU-seconds used over GPU-seconds available during the makespan.
    pub utilization: f64,
    /// Share of measured jobs placed on their fastest GPU type.
    pub fastest_share: f64,
    /// MAPE of all predictions, when the policy predicts.
    pub mape: Option<f64>,
    /// MAPE of predictions made after at least 5 runs of the (class, type) pair.
    pub mape_after5: Option<f64>,
    /// MAPE per tenth of the run, in placement order.
    pub mape_over_time: Vec<f64>,
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ape(r: &JobRecord) -> Option<f64> {
    r.predicted
        .map(|p| (p - r.runtime()).abs() / r.runtime().max(1e-9))
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| s / n as f64)
}

/// Computes the metrics of `result`, with JCTs over the jobs whose ids are in `window`.
pub fn compute(result: &SimResult, window: Range<usize>) -> Metrics {
    let all: Vec<&JobRecord> = result.records.iter().flatten().collect();
    let stranded = result.stranded.len();
    let unplaceable = result.records.iter().filter(|r| r.is_none()).count() - stranded;
    let measured: Vec<&JobRecord> = all
        .iter()
        .copied()
        .filter(|r| window.contains(&r.id))
        .collect();
    let mut jct: Vec<f64> = measured.iter().map(|r| r.jct() / 3600.0).collect();
    jct.sort_by(f64::total_cmp);
    let first = all.iter().map(|r| r.arrival).fold(f64::INFINITY, f64::min);
    let last = all.iter().map(|r| r.end).fold(0.0, f64::max);
    let makespan = if all.is_empty() { 0.0 } else { last - first };
    let busy: f64 = all.iter().map(|r| r.runtime() * f64::from(r.gpus)).sum();
    let mut by_order: Vec<&JobRecord> = all
        .iter()
        .copied()
        .filter(|r| r.predicted.is_some())
        .collect();
    by_order.sort_by_key(|r| r.placed_order);
    let mape_over_time = if by_order.is_empty() {
        Vec::new()
    } else {
        let per = by_order.len().div_ceil(MAPE_BUCKETS);
        by_order
            .chunks(per)
            .filter_map(|c| mean(c.iter().filter_map(|r| ape(r))))
            .collect()
    };
    Metrics {
        jobs: measured.len(),
        unplaceable,
        stranded,
        avg_jct_h: mean(jct.iter().copied()).unwrap_or(0.0),
        p50_jct_h: percentile(&jct, 50.0),
        p95_jct_h: percentile(&jct, 95.0),
        p99_jct_h: percentile(&jct, 99.0),
        avg_queue_h: mean(measured.iter().map(|r| (r.start - r.arrival) / 3600.0)).unwrap_or(0.0),
        makespan_h: makespan / 3600.0,
        utilization: if makespan > 0.0 {
            busy / (makespan * f64::from(result.total_gpus))
        } else {
            0.0
        },
        fastest_share: mean(measured.iter().map(|r| f64::from(u8::from(r.on_fastest))))
            .unwrap_or(0.0),
        mape: mean(all.iter().filter_map(|r| ape(r))),
        mape_after5: mean(
            all.iter()
                .filter(|r| r.history_runs >= WARM_RUNS)
                .filter_map(|r| ape(r)),
        ),
        mape_over_time,
    }
}

/// The element-wise mean of several runs' metrics (seeds).
pub fn mean_of(runs: &[Metrics]) -> Metrics {
    let n = runs.len().max(1) as f64;
    let avg = |f: fn(&Metrics) -> f64| runs.iter().map(f).sum::<f64>() / n;
    let avg_opt = |f: fn(&Metrics) -> Option<f64>| mean(runs.iter().filter_map(f));
    let buckets = runs
        .iter()
        .map(|m| m.mape_over_time.len())
        .min()
        .unwrap_or(0);
    Metrics {
        jobs: runs.iter().map(|m| m.jobs).sum::<usize>() / runs.len().max(1),
        unplaceable: runs.iter().map(|m| m.unplaceable).sum::<usize>() / runs.len().max(1),
        stranded: runs.iter().map(|m| m.stranded).sum::<usize>(),
        avg_jct_h: avg(|m| m.avg_jct_h),
        p50_jct_h: avg(|m| m.p50_jct_h),
        p95_jct_h: avg(|m| m.p95_jct_h),
        p99_jct_h: avg(|m| m.p99_jct_h),
        avg_queue_h: avg(|m| m.avg_queue_h),
        makespan_h: avg(|m| m.makespan_h),
        utilization: avg(|m| m.utilization),
        fastest_share: avg(|m| m.fastest_share),
        mape: avg_opt(|m| m.mape),
        mape_after5: avg_opt(|m| m.mape_after5),
        mape_over_time: (0..buckets)
            .map(|b| runs.iter().map(|m| m.mape_over_time[b]).sum::<f64>() / n)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(
        id: usize,
        arrival: f64,
        start: f64,
        end: f64,
        predicted: Option<f64>,
        history_runs: u32,
    ) -> Option<JobRecord> {
        Some(JobRecord {
            id,
            arrival,
            start,
            end,
            gpus: 1,
            on_fastest: id.is_multiple_of(2),
            predicted,
            history_runs,
            placed_order: id,
            slots: vec![(0, 1)],
        })
    }

    #[test]
    fn computes_jct_queue_utilisation_and_mape() {
        let result = SimResult {
            records: vec![
                rec(0, 0.0, 0.0, 3600.0, Some(1800.0), 0),
                rec(1, 0.0, 3600.0, 7200.0, Some(3600.0), 5),
                None,
            ],
            total_gpus: 2,
            final_cluster: crate::cluster::Cluster::new(Vec::new(), 0),
            stranded: Vec::new(),
        };
        let m = compute(&result, 0..10);
        assert_eq!(m.jobs, 2);
        assert_eq!(m.unplaceable, 1);
        assert_eq!(m.avg_jct_h, 1.5);
        assert_eq!(m.p50_jct_h, 1.0);
        assert_eq!(m.p99_jct_h, 2.0);
        assert_eq!(m.avg_queue_h, 0.5);
        assert_eq!(m.makespan_h, 2.0);
        assert_eq!(m.utilization, 0.5);
        assert_eq!(m.fastest_share, 0.5);
        assert_eq!(m.mape, Some(0.25));
        assert_eq!(m.mape_after5, Some(0.0));
        assert_eq!(m.mape_over_time, vec![0.5, 0.0]);
        let w = compute(&result, 1..2);
        assert_eq!((w.jobs, w.avg_jct_h), (1, 2.0));
        let avg = mean_of(&[m.clone(), w]);
        assert_eq!(avg.avg_jct_h, 1.75);
    }
}
