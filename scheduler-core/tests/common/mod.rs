//! Shared by the integration tests that run on Gavel's throughput table.

use std::path::PathBuf;

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
        include_str!("../../../simulator/data/isolated_throughputs.csv").to_owned()
    })
}
