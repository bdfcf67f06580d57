//! Workload generators: the job streams the policies are compared on.
//!
//! - **B0** is Gavel's own generator (job type uniform, log-uniform durations, Poisson
//!   arrivals) so results can be set beside Gavel's published numbers.
//! - **B1** replaces Gavel's synthetic durations and GPU counts with real Philly pairs and adds
//!   lognormal run-time noise calibrated on Alibaba PAI, so a learned scheduler meets the
//!   variation it would meet in production.
//! - **B2** replays a Philly virtual-cluster trace as recorded.
//!
//! Gavel's convention holds throughout: a job of type T with duration d has
//! `steps = d * throughput_ref(T)` on the reference GPU type, and its true run time on type g is
//! `steps / throughput_g(T) * noise`. The scheduler sees only the model family (the class).

use crate::data::{PhillyJob, TraceJob};
use crate::throughput::ThroughputTable;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, LogNormal};

/// One job, with its hidden ground truth.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// Position in arrival order.
    pub id: usize,
    /// Arrival time, seconds.
    pub arrival: f64,
    /// Index of the job type in the throughput table (hidden from all but the oracle).
    pub job_type: usize,
    /// GPUs requested; a scale factor the job type has a row for.
    pub gpus: u32,
    /// Total steps (the declared work, when work is declared).
    pub steps: f64,
    /// Multiplicative run-time noise, drawn once per job (hidden from all but the oracle).
    pub noise: f64,
}

/// Which workload to generate.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkloadKind {
    /// Gavel's generator; `multi_gpu` draws GPU counts 1/2/4/8 at 0.70/0.10/0.15/0.05.
    B0 {
        /// Draw multi-GPU jobs too.
        multi_gpu: bool,
    },
    /// Philly (duration, GPU count) pairs with PAI-calibrated noise.
    B1 {
        /// The pairs to draw from.
        philly: Vec<PhillyJob>,
    },
    /// A recorded Philly VC trace.
    B2 {
        /// The trace's jobs in file order.
        trace: Vec<TraceJob>,
    },
}

/// Everything a generator needs besides the throughput table.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadConfig {
    /// The generator.
    pub kind: WorkloadKind,
    /// Number of jobs (B2: at most this many trace jobs).
    pub jobs: usize,
    /// Poisson arrival rate, jobs per hour (B0, B1).
    pub rate_per_hour: f64,
    /// GPU type whose throughput converts durations into steps.
    pub reference_gpu: usize,
    /// Sigma of the lognormal run-time noise (0: none).
    pub noise_sigma: f64,
}

/// Generates the job list, sorted by arrival, deterministically from `seed`.
pub fn generate(cfg: &WorkloadConfig, table: &ThroughputTable, seed: u64) -> Vec<Job> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let noise = (cfg.noise_sigma > 0.0)
        .then(|| LogNormal::new(0.0, cfg.noise_sigma).ok())
        .flatten();
    let draw_noise = |rng: &mut ChaCha8Rng| noise.map_or(1.0, |d| d.sample(rng));
    let mut jobs = Vec::with_capacity(cfg.jobs);
    match &cfg.kind {
        WorkloadKind::B2 { trace } => {
            for t in trace.iter().take(cfg.jobs) {
                let jt = &table.job_types[t.job_type];
                let gpus = jt.fit_scale_factor(t.gpus);
                let n = draw_noise(&mut rng);
                jobs.push(Job {
                    id: 0,
                    arrival: t.arrival_s,
                    job_type: t.job_type,
                    gpus,
                    steps: t.total_steps.max(1.0),
                    noise: n,
                });
            }
            jobs.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
        }
        kind => {
            let rate = cfg.rate_per_hour.max(1e-9) / 3600.0;
            let Ok(gap) = Exp::new(rate) else { return jobs };
            let mut t = 0.0;
            while jobs.len() < cfg.jobs {
                let job_type = rng.random_range(0..table.job_types.len());
                let (duration, want_gpus) = match kind {
                    WorkloadKind::B0 { multi_gpu } => (
                        gavel_duration(&mut rng),
                        if *multi_gpu { gavel_gpus(&mut rng) } else { 1 },
                    ),
                    WorkloadKind::B1 { philly } => {
                        let p = philly[rng.random_range(0..philly.len())];
                        (p.duration_s, p.gpus)
                    }
                    WorkloadKind::B2 { .. } => unreachable!("handled above"),
                };
                let jt = &table.job_types[job_type];
                let gpus = jt.fit_scale_factor(want_gpus);
                // A job type not measured on the reference GPU has no step count: redraw.
                let Some(reference) = table.throughput(job_type, gpus, cfg.reference_gpu, false)
                else {
                    continue;
                };
                let n = draw_noise(&mut rng);
                jobs.push(Job {
                    id: 0,
                    arrival: t,
                    job_type,
                    gpus,
                    steps: duration * reference,
                    noise: n,
                });
                t += gap.sample(&mut rng);
            }
        }
    }
    for (i, j) in jobs.iter_mut().enumerate() {
        j.id = i;
    }
    jobs
}

/// Gavel's duration: `60 * 10^U(1.5, 3)` s for 80% of jobs, `60 * 10^U(3, 4)` s for 20%.
fn gavel_duration(rng: &mut impl Rng) -> f64 {
    let exponent = if rng.random::<f64>() < 0.8 {
        rng.random_range(1.5..3.0)
    } else {
        rng.random_range(3.0..4.0)
    };
    60.0 * 10f64.powf(exponent)
}

/// Gavel's multi-GPU scale factors: 1/2/4/8 with probability 0.70/0.10/0.15/0.05.
fn gavel_gpus(rng: &mut impl Rng) -> u32 {
    let u: f64 = rng.random();
    match u {
        u if u < 0.70 => 1,
        u if u < 0.80 => 2,
        u if u < 0.95 => 4,
        _ => 8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{EMBEDDED_PHILLY, EMBEDDED_THROUGHPUTS, parse_philly_distribution};

    fn table() -> ThroughputTable {
        ThroughputTable::parse(EMBEDDED_THROUGHPUTS, "t").unwrap()
    }

    #[test]
    fn b0_matches_gavel_shape() {
        let t = table();
        let v100 = t.gpu_index("v100").unwrap();
        let cfg = WorkloadConfig {
            kind: WorkloadKind::B0 { multi_gpu: true },
            jobs: 5000,
            rate_per_hour: 4.0,
            reference_gpu: v100,
            noise_sigma: 0.0,
        };
        let jobs = generate(&cfg, &t, 7);
        assert_eq!(jobs.len(), 5000);
        assert!(jobs.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        // Mean inter-arrival ~ 900 s at 4 jobs/h.
        let mean_gap = jobs.last().unwrap().arrival / 4999.0;
        assert!((mean_gap - 900.0).abs() < 60.0, "{mean_gap}");
        for j in &jobs {
            let d = j.steps / t.throughput(j.job_type, j.gpus, v100, false).unwrap();
            assert!(
                (60.0 * 10f64.powf(1.5) - 1e-6..=600_000.0 + 1e-6).contains(&d),
                "{d}"
            );
            assert!(t.job_types[j.job_type].row(j.gpus).is_some());
            assert_eq!(j.noise, 1.0);
        }
        assert!(jobs.iter().any(|j| j.gpus == 8));
        // Same seed, same jobs.
        assert_eq!(generate(&cfg, &t, 7), jobs);
    }

    #[test]
    fn b1_draws_philly_pairs_with_noise() {
        let t = table();
        let philly = parse_philly_distribution(EMBEDDED_PHILLY, "p").unwrap();
        let cfg = WorkloadConfig {
            kind: WorkloadKind::B1 { philly },
            jobs: 2000,
            rate_per_hour: 1.0,
            reference_gpu: 2,
            noise_sigma: 0.0866,
        };
        let jobs = generate(&cfg, &t, 0);
        let mut logs: Vec<f64> = jobs.iter().map(|j| j.noise.ln()).collect();
        let sd = (logs.iter().map(|x| x * x).sum::<f64>() / logs.len() as f64).sqrt();
        assert!((sd - 0.0866).abs() < 0.01, "{sd}");
        assert!(crate::data::median(&mut logs).unwrap().abs() < 0.01);
        assert!(jobs.iter().any(|j| j.gpus > 1));
    }
}
