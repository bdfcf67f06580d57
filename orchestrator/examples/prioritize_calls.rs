//! The orchestrator's `/prioritize` handler without the network, for instruction counts: per
//! call the JSON request is parsed, the candidates are looked up in the index, ranked, and the
//! answer is serialised, as the HTTP route does. Each call is for a new pod, so no ranking is
//! reused. `scripts/bench-gate` counts its instructions:
//!
//! ```text
//! cargo build --release -p kudos-orchestrator --example prioritize_calls
//! valgrind --tool=callgrind --toggle-collect='*prioritize_calls::one_call*' \
//!     target/release/examples/prioritize_calls 5000 10
//! ```
//!
//! Arguments: nodes (default 5,000) and calls (default 10); one warm-up call comes first, so
//! callgrind counts `calls + 1` calls. With a third argument `pair`, each call is one pod as
//! kube-scheduler sends it: `/filter` over all nodes, then `/prioritize` over those that passed,
//! which may reuse the filter's ranking; count both verbs with
//! `--toggle-collect='*prioritize_calls::filter_call*' --toggle-collect='*prioritize_calls::one_call*'`.
//! With `KUDOS_BENCH_LABELLED=1` the nodes are described by their labels, not plugin reports.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../benches/fixture/mod.rs"]
mod fixture;

use kudos_orchestrator::extender::Extender;
use kudos_orchestrator::extender::types::ExtenderArgs;
use kudos_orchestrator::metrics::Metrics;
use std::sync::Arc;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// One `/prioritize` call as the route makes it; returns the response's length.
#[inline(never)]
fn one_call(extender: &Extender, body: &[u8]) -> usize {
    let args = match ExtenderArgs::from_json(body) {
        Ok(a) => a,
        Err(e) => panic!("fixture request does not parse: {e}"),
    };
    match extender.prioritize(args) {
        Ok(list) => kudos_orchestrator::extender::types::host_priorities_json(&list).len(),
        Err(e) => panic!("prioritize failed: {e}"),
    }
}

/// One `/filter` call as the route makes it; returns the answer.
#[inline(never)]
fn filter_call(extender: &Extender, body: &[u8]) -> Vec<u8> {
    let args = match ExtenderArgs::from_json(body) {
        Ok(a) => a,
        Err(e) => panic!("fixture request does not parse: {e}"),
    };
    kudos_orchestrator::extender::types::filter_result_json(&extender.filter(args))
}

fn main() {
    let (nodes, calls) = (arg(1, 5_000), arg(2, 10));
    let index = match std::env::var("KUDOS_BENCH_LABELLED").as_deref() {
        Ok("1") => fixture::labelled_index(nodes),
        _ => fixture::index(nodes),
    };
    let extender = common::mk_extender(index, Arc::new(Metrics::new()));
    let bodies: Vec<Vec<u8>> = (0..=calls)
        .map(|i| fixture::body_for(&format!("train-{i}"), nodes))
        .collect();
    let pairs = std::env::args().nth(3).as_deref() == Some("pair");
    let mut bytes = 0;
    for b in &bodies {
        bytes = if pairs {
            let answer = filter_call(&extender, b);
            answer.len() + one_call(&extender, &fixture::prioritize_after(b, &answer).0)
        } else {
            one_call(&extender, b)
        };
    }
    println!("nodes {nodes} calls {} response {bytes} B", calls + 1);
}
