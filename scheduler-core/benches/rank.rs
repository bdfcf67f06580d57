//! `rank` latency for one pod over 1,000 and 5,000 candidate nodes (the extender's serial path;
//! target <= 500 us at 5,000). Candidates are what kube-scheduler's filters pass to the extender,
//! so they all have a free device; the `rejecting` case adds 10% unfit nodes. The cluster mixes eight device profiles with varied load, and the
//! model has history for the class on a fifth of the nodes, so the own-history lookup, the
//! per-profile cache and the sorts are all exercised.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

#[path = "fixture/mod.rs"]
mod fixture;
use fixture::{cluster, pod, trained};

fn bench(c: &mut Criterion) {
    let pod = pod();
    let mut group = c.benchmark_group("rank");
    for n in [1_000usize, 5_000] {
        let nodes = cluster(n);
        let s = trained(&nodes);
        group.bench_with_input(BenchmarkId::from_parameter(n), &nodes, |b, nodes| {
            b.iter(|| s.rank(&pod, nodes, 1.0e6, 42));
        });
    }
    let mut nodes = cluster(5_000);
    for n in nodes.iter_mut().step_by(10) {
        n.free_devices = 0;
    }
    let s = trained(&nodes);
    group.bench_function("5000-rejecting-10pct", |b| {
        b.iter(|| s.rank(&pod, &nodes, 1.0e6, 42));
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
