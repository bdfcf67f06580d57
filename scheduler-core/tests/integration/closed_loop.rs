//! Closed-loop check of the whole pipeline on Gavel's measured throughputs (Narayanan et al.,
//! OSDI 2020, MIT licence): jobs arrive, Kudos ranks the free nodes, the job runs for its true
//! (noisy) time on the chosen device type, and the run is observed. Average job completion time
//! over the second half of the jobs (after learning and exploring) is compared with a greedy oracle that knows every throughput (fastest free device) and with a
//! random placement. This is a smoke test of the learning loop, not the simulator (which owns the
//! real measurements): small cluster, one GPU per job, FIFO queue.
//!
//! Class = job type (model and batch size) at scale factor 1; GPU types are the consolidated
//! `<gpu>_steps_per_s` columns, parsed generically. Reads `$KUDOS_DATA_DIR` or the embedded copy.

use crate::common;

use kudos_scheduler_core::{
    DeviceProfile, Exploration, NodeHealth, NodeState, PodSpec, Scheduler, SchedulerConfig,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, LogNormal};

/// GPU type names, and per class its name and throughput per type.
type Table = (Vec<String>, Vec<(String, Vec<f64>)>);

fn load() -> Option<Table> {
    let text = common::gavel_table();
    let mut rd = csv::Reader::from_reader(text.as_bytes());
    let headers = rd.headers().ok()?.clone();
    let job = headers.iter().position(|h| h == "job_type")?;
    let scale = headers.iter().position(|h| h == "scale_factor")?;
    let cols: Vec<(usize, String)> = headers
        .iter()
        .enumerate()
        .filter_map(|(i, h)| h.strip_suffix("_steps_per_s").map(|g| (i, g.to_owned())))
        .filter(|(_, g)| !g.contains("unconsolidated"))
        .collect();
    let mut classes = Vec::new();
    for rec in rd.records() {
        let rec = rec.ok()?;
        if rec.get(scale)? != "1" {
            continue;
        }
        let tputs: Option<Vec<f64>> = cols
            .iter()
            .map(|(i, _)| rec.get(*i)?.parse::<f64>().ok().filter(|t| *t > 0.0))
            .collect();
        if let Some(t) = tputs {
            classes.push((rec.get(job)?.to_owned(), t));
        }
    }
    Some((cols.into_iter().map(|(_, g)| g).collect(), classes))
}

#[derive(Clone, PartialEq)]
enum Policy {
    Kudos(Exploration),
    Oracle,
    Random,
}

struct JobSpec {
    class: usize,
    arrival: f64,
    /// Run time on the reference (last) type before noise.
    steps: f64,
    noise: f64,
}

fn simulate(
    types: &[String],
    classes: &[(String, Vec<f64>)],
    jobs: &[JobSpec],
    per_type: usize,
    policy: Policy,
) -> f64 {
    let mut nodes: Vec<NodeState> = Vec::new();
    for g in types {
        for i in 0..per_type {
            nodes.push(NodeState {
                name: format!("{g}-{i}").into(),
                profile: DeviceProfile {
                    vendor: "nvidia".into(),
                    model: g.as_str().into(),
                    count: 1,
                    memory_bytes: 16 << 30,
                },
                free_devices: 1,
                cpu_allocatable_milli: 8000,
                cpu_requested_milli: 0,
                memory_allocatable_bytes: 64 << 30,
                memory_requested_bytes: 0,
                health: NodeHealth::Healthy,
            });
        }
    }
    let type_of = |n: usize| n / per_type;
    let exploration = match &policy {
        Policy::Kudos(e) => e.clone(),
        _ => Exploration::default(),
    };
    let mut sched = Scheduler::new(SchedulerConfig {
        exploration,
        ..SchedulerConfig::default()
    });
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    // (finish time, node, job)
    let mut running: Vec<(f64, usize, usize)> = Vec::new();
    let mut queue: std::collections::VecDeque<usize> = Default::default();
    let (mut next, mut total_jct, mut seed) = (0usize, 0.0f64, 0u64);
    let mut now;
    while next < jobs.len() || !queue.is_empty() || !running.is_empty() {
        let finish = running
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.0.total_cmp(&b.1.0));
        let arrival = jobs.get(next).map(|j| j.arrival);
        match (finish.map(|(i, f)| (i, f.0)), arrival) {
            (Some((i, f)), a) if a.is_none_or(|a| f <= a) => {
                let (end, node, job) = running.swap_remove(i);
                now = end;
                let j = &jobs[job];
                nodes[node].free_devices = 1;
                // Measured over the second half, once the first has paid for exploration.
                if job >= jobs.len() / 2 {
                    total_jct += end - j.arrival;
                }
                let seconds = j.steps / classes[j.class].1[type_of(node)] * j.noise;
                let run =
                    common::completed_run(&nodes[node], &classes[j.class].0, end - seconds, end);
                sched.observe(&run, now).expect("valid run");
            }
            (_, Some(a)) => {
                now = a;
                queue.push_back(next);
                next += 1;
            }
            _ => break,
        }
        while let Some(&job) = queue.front() {
            let free: Vec<usize> = (0..nodes.len())
                .filter(|&n| nodes[n].free_devices > 0)
                .collect();
            if free.is_empty() {
                break;
            }
            let j = &jobs[job];
            let tputs = &classes[j.class].1;
            let node = match &policy {
                Policy::Oracle => *free
                    .iter()
                    .max_by(|&&a, &&b| {
                        tputs[type_of(a)]
                            .total_cmp(&tputs[type_of(b)])
                            .then(b.cmp(&a))
                    })
                    .unwrap_or(&free[0]),
                Policy::Random => free[rng.random_range(0..free.len())],
                Policy::Kudos(_) => {
                    seed += 1;
                    let pod = PodSpec {
                        namespace: "sim".into(),
                        name: format!("job-{job}"),
                        class: Some(classes[j.class].0.clone()),
                        gpus: 1,
                        cpu_milli: 1000,
                        memory_bytes: 1 << 30,
                        ..Default::default()
                    };
                    let r = sched.rank(&pod, &nodes, now, seed);
                    let best = r.best().expect("a free node").node.clone();
                    nodes.iter().position(|n| n.name == best).unwrap_or(free[0])
                }
            };
            queue.pop_front();
            nodes[node].free_devices = 0;
            let seconds = j.steps / tputs[type_of(node)] * j.noise;
            running.push((now + seconds, node, job));
        }
    }
    total_jct / (jobs.len() - jobs.len() / 2) as f64
}

#[test]
fn kudos_approaches_the_oracle_jct() {
    let Some((types, classes)) = load() else {
        return;
    };
    let per_type = 4;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let noise = LogNormal::new(0.0, 0.1).expect("valid");
    let reference = types.len() - 1;
    // Mean run ~1 h on the reference type; arrivals keep the cluster busy but not saturated.
    let gap = Exp::new(1.0 / 700.0).expect("valid");
    let mut t = 0.0;
    let jobs: Vec<JobSpec> = (0..1200)
        .map(|_| {
            t += gap.sample(&mut rng);
            let class = rng.random_range(0..classes.len());
            let duration = 3600.0 * LogNormal::new(0.0, 0.5).expect("valid").sample(&mut rng);
            JobSpec {
                class,
                arrival: t,
                steps: duration * classes[class].1[reference],
                noise: noise.sample(&mut rng),
            }
        })
        .collect();
    let oracle = simulate(&types, &classes, &jobs, per_type, Policy::Oracle);
    let random = simulate(&types, &classes, &jobs, per_type, Policy::Random);
    println!(
        "\nclosed loop, {} job types x {:?}, {per_type} nodes per type, jobs 600-1199 of 1200:",
        classes.len(),
        types
    );
    println!(
        "  average JCT: oracle {oracle:.0}s, random {random:.0}s ({:.2}x)",
        random / oracle
    );
    let mut ucb = f64::MAX;
    for e in [
        Exploration::default(),
        Exploration::Ucb { c: 2.0 },
        Exploration::Ucb { c: 3.0 },
        Exploration::Thompson,
        Exploration::None,
    ] {
        let kudos = simulate(&types, &classes, &jobs, per_type, Policy::Kudos(e.clone()));
        println!(
            "  kudos, exploration {e:?}: {kudos:.0}s ({:.2}x)",
            kudos / oracle
        );
        if e == Exploration::default() {
            ucb = kudos;
        }
    }
    assert!(ucb < random, "kudos must beat random placement");
    assert!(
        ucb / oracle <= 1.15,
        "kudos {:.2}x the oracle",
        ucb / oracle
    );
}
