//! How big the learned state gets, and how long a restart takes to read it back:
//!
//! ```text
//! cargo run --release -p kudos-scheduler-core --example state_size -- 5000 1000 400000
//! ```
//!
//! Arguments: nodes (default 5,000), classes (default 1,000), runs (default 400,000). Each run is
//! one class on one node drawn uniformly (a seeded generator), on one of 8 GPU models by node,
//! so every (class, node) cell is offered and the model's bounds decide what stays. Prints the
//! snapshot's size, the cells kept, the resident memory, the time to copy the model and to free
//! the copy, and the time to serialise and read it.

use kudos_scheduler_core::{DeviceProfile, RunObservation, Scheduler, SchedulerConfig};
use rand::{Rng, SeedableRng};
use std::time::Instant;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    let (nodes, classes, runs) = (arg(1, 5_000), arg(2, 1_000), arg(3, 400_000));
    let models = ["V100", "T4", "A100", "H100", "L4", "K80", "P100", "MI300X"];
    let mut s = Scheduler::new(SchedulerConfig::default());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let started = Instant::now();
    for i in 0..runs {
        let node = rng.random_range(0..nodes);
        let class = rng.random_range(0..classes);
        let end = 1.0e6 + i as f64 * 10.0;
        let r = RunObservation {
            node: format!("gpu-node-{node:05}"),
            class: format!("class-{class:04}"),
            profile: DeviceProfile {
                vendor: "nvidia".into(),
                model: models[node % models.len()].into(),
                count: 8,
                memory_bytes: 80 << 30,
            },
            gpus: 1,
            start: end - 3600.0,
            end,
            completed: true,
            progress: None,
            gpu_busy_seconds: None,
            work_units: Some(1000.0 * (1.0 + (class % 7) as f64)),
        };
        if let Err(e) = s.observe(&r, end) {
            eprintln!("run {i} refused: {e}");
        }
    }
    let learn = started.elapsed();
    // The orchestrator's learner publishes a copy after each batch.
    let t = Instant::now();
    let copy = s.clone();
    let clone = t.elapsed();
    // What the orchestrator's learner frees when the next copy replaces it.
    let t = Instant::now();
    drop(copy);
    let free = t.elapsed();
    let t = Instant::now();
    let json = serde_json::to_vec(s.state()).expect("serialise");
    let ser = t.elapsed();
    let t = Instant::now();
    let back: kudos_scheduler_core::ModelState = serde_json::from_slice(&json).expect("read back");
    let de = t.elapsed();
    println!(
        "nodes {nodes}, classes {classes}, runs {runs}: {} classes and {} (class, node) cells kept \
         (max {}); snapshot {:.1} MB; RSS {:.0} MiB; learning {:.1} s ({:.2} ms per run); \
         copy {:.1} ms, freeing it {:.1} ms; serialise {:.2} s, read back {:.2} s",
        back.classes().count(),
        back.node_cells(),
        SchedulerConfig::default().max_node_cells,
        json.len() as f64 / 1e6,
        rss_mib(),
        learn.as_secs_f64(),
        learn.as_secs_f64() * 1e3 / runs.max(1) as f64,
        clone.as_secs_f64() * 1e3,
        free.as_secs_f64() * 1e3,
        ser.as_secs_f64(),
        de.as_secs_f64(),
    );
}
