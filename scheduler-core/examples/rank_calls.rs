//! `rank` over the bench's cluster and model without criterion, for instruction counts and
//! allocations per call:
//!
//! ```text
//! cargo build --release -p kudos-scheduler-core --example rank_calls
//! valgrind --tool=callgrind --toggle-collect='*Scheduler::rank*' \
//!     target/release/examples/rank_calls 5000 10
//! ```
//!
//! Arguments: nodes (default 5,000) and calls (default 10). Callgrind counts `calls + 1` calls
//! (one warm-up first): its instruction count divided by `(calls + 1) x nodes` is the cost per
//! node. The example prints the heap allocations and bytes per call after the warm-up (counted
//! by its global allocator; the answer itself is one allocation per entry plus the entries),
//! and the wall time per call (minimum, p25, median; run it with a few hundred calls outside
//! callgrind for those: `target/release/examples/rank_calls 5000 500`).

#[path = "../benches/fixture/alloc.rs"]
mod alloc;
#[path = "../benches/fixture/mod.rs"]
mod fixture;
use fixture::{cluster, pod, trained};

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (n, calls) = (arg(1, 5_000), arg(2, 10));
    let pod = pod();
    let nodes = cluster(n);
    let s = trained(&nodes);
    let mut entries = s.rank(&pod, &nodes, 1.0e6, 0).entries.len();
    let (count, bytes) = (alloc::allocations(), alloc::bytes());
    let mut wall = Vec::with_capacity(calls);
    for seed in 1..=calls as u64 {
        let start = std::time::Instant::now();
        entries += s.rank(&pod, &nodes, 1.0e6, seed).entries.len();
        wall.push(start.elapsed());
    }
    let per_call = |n: u64| n as f64 / calls.max(1) as f64;
    let count = per_call(alloc::allocations() - count);
    let bytes = per_call(alloc::bytes() - bytes);
    println!(
        "nodes {n} calls {calls} entries {entries} per call: {count:.1} allocations, {bytes:.0} B"
    );
    wall.sort();
    let at = |q: usize| wall.get(wall.len() * q / 4).map_or(0, |d| d.as_micros());
    println!(
        "wall per call: min {} us, p25 {} us, median {} us",
        at(0),
        at(1),
        at(2)
    );
}
