//! `rank` over 5,000 nodes, repeated, for instruction counts (`valgrind --tool=callgrind
//! --toggle-collect='*rank::rank*'`): the bench's cluster and model without criterion.

#[path = "../benches/fixture/mod.rs"]
mod fixture;
use fixture::{cluster, pod, trained};

fn main() {
    let pod = pod();
    let nodes = cluster(5_000);
    let s = trained(&nodes);
    let mut total = 0usize;
    for seed in 0..10 {
        total += s.rank(&pod, &nodes, 1.0e6, seed).entries.len();
    }
    println!("{total}");
}
