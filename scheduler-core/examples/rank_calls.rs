//! `rank` over 5,000 nodes, repeated, for instruction counts (`valgrind --tool=callgrind
//! --toggle-collect='*rank::rank*'`): the bench's cluster and model without criterion.
use kudos_scheduler_core::{
    DeviceProfile, NodeHealth, NodeState, PodSpec, RunObservation, Scheduler, SchedulerConfig,
};

const MODELS: &[&str] = &["K80", "P100", "V100", "T4", "A10", "A100", "H100", "MI300X"];

fn profile(i: usize) -> DeviceProfile {
    DeviceProfile {
        vendor: if i == 7 { "amd" } else { "nvidia" }.into(),
        model: MODELS[i % MODELS.len()].into(),
        count: 8,
        memory_bytes: 32 << 30,
    }
}

fn cluster(n: usize) -> Vec<NodeState> {
    (0..n)
        .map(|i| NodeState {
            name: format!("gpu-node-{i:05}"),
            profile: profile(i % MODELS.len()),
            free_devices: 1 + (i % 8) as u32,
            cpu_allocatable_milli: 96_000,
            cpu_requested_milli: (i as u64 * 7_919) % 64_000,
            memory_allocatable_bytes: 768 << 30,
            memory_requested_bytes: ((i as u64 * 104_729) % 512) << 30,
            health: NodeHealth::Healthy,
        })
        .collect()
}

fn trained(nodes: &[NodeState]) -> Scheduler {
    let mut s = Scheduler::new(SchedulerConfig::default());
    let mut t = 0.0;
    for (i, n) in nodes.iter().enumerate().step_by(5) {
        for _ in 0..3 {
            t += 10.0;
            let secs = 100.0 * (1.0 + (i % MODELS.len()) as f64);
            let run = RunObservation {
                node: n.name.clone(),
                class: "resnet".into(),
                profile: n.profile.clone(),
                gpus: 1,
                start: t - secs,
                end: t,
                completed: true,
                progress: None,
                gpu_busy_seconds: None,
                work_units: None,
            };
            s.observe(&run, t).expect("valid");
        }
    }
    s
}

fn main() {
    let pod = PodSpec {
        namespace: "default".into(),
        name: "train".into(),
        class: Some("resnet".into()),
        gpus: 1,
        cpu_milli: 4_000,
        memory_bytes: 16 << 30,
        work_units: None,
        deadline_seconds: None,
        gang: None,
    };
    let nodes = cluster(5_000);
    let s = trained(&nodes);
    let mut total = 0usize;
    for seed in 0..10 {
        total += s.rank(&pod, &nodes, 1.0e6, seed).entries.len();
    }
    println!("{total}");
}
