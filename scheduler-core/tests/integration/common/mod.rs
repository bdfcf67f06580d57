//! Shared by the integration tests: Gavel's throughput table and the run reports they feed
//! the scheduler.

use kudos_scheduler_core::{NodeState, RunObservation};
use std::path::PathBuf;

/// A completed one-GPU run of `class` on `node`, from `start` to `end`, with nothing measured
/// but its times.
pub fn completed_run(node: &NodeState, class: &str, start: f64, end: f64) -> RunObservation {
    RunObservation {
        node: node.name.to_string(),
        class: class.into(),
        profile: node.profile.clone(),
        gpus: 1,
        start,
        end,
        completed: true,
        progress: None,
        gpu_busy_seconds: None,
        work_units: None,
    }
}

/// Gavel's table (Narayanan et al., OSDI 2020, MIT licence):
/// `$KUDOS_DATA_DIR/gavel/isolated_throughputs.csv` (or `../shared/data` beside the checkout)
/// when present, else the unmodified copy embedded in the simulator (`simulator/data/`), so the
/// tests that use it always run.
pub fn gavel_table() -> String {
    let dir = std::env::var_os("KUDOS_DATA_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"),
        PathBuf::from,
    );
    std::fs::read_to_string(dir.join("gavel/isolated_throughputs.csv")).unwrap_or_else(|_| {
        include_str!("../../../../simulator/data/isolated_throughputs.csv").to_owned()
    })
}
