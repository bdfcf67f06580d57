//! `rank` allocates its answer and nothing else that grows with the nodes (issue 18): per call,
//! the entries (whose names share the candidates' text, see `Name`), plus a few allocations
//! per distinct device profile.

#[path = "../benches/fixture/alloc.rs"]
mod alloc;
#[path = "../benches/fixture/mod.rs"]
mod fixture;

use kudos_scheduler_core::RankEntry;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

/// Allocations and bytes one call makes beyond its entries (after a warm-up).
fn beyond_the_answer(nodes: usize) -> (u64, u64) {
    let pod = fixture::pod();
    let cluster = fixture::cluster(nodes);
    let s = fixture::trained(&cluster);
    let _ = s.rank(&pod, &cluster, 1.0e6, 0);
    let (count, bytes) = (alloc::allocations(), alloc::bytes());
    let ranking = s.rank(&pod, &cluster, 1.0e6, 1);
    let (count, bytes) = (alloc::allocations() - count, alloc::bytes() - bytes);
    assert_eq!(ranking.entries.len(), nodes);
    let answer = nodes * size_of::<RankEntry>();
    (count, bytes.saturating_sub(answer as u64))
}

#[test]
fn a_call_allocates_its_answer_and_a_constant() {
    let (small, small_bytes) = beyond_the_answer(200);
    let (large, large_bytes) = beyond_the_answer(4_000);
    println!("beyond the answer: {small} allocations, {small_bytes} B at 200 nodes");
    println!("beyond the answer: {large} allocations, {large_bytes} B at 4,000 nodes");
    // The fixture has 8 device profiles: a few allocations each (capability lookup), a handful
    // per call (the answer's strings and vectors). Debug builds cross-check the merge order
    // against the generic sort, which allocates a few vectors per call whose bytes grow with the
    // nodes: their bytes are checked in release builds only (`cargo test --release`).
    assert_eq!(small, large, "allocations grew with the nodes");
    let limit = if cfg!(debug_assertions) { 64 } else { 32 };
    assert!(large <= limit, "{large} allocations beyond the entries");
    if !cfg!(debug_assertions) {
        assert!(
            large_bytes <= 16 << 10,
            "{large_bytes} B beyond the entries"
        );
    }
}
