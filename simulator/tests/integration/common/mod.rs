//! Shared by the simulator's integration tests.

use clap::Parser;
use kudos_sim::cli::{Args, Settings};

/// Settings from flags, always on the embedded data (whatever `KUDOS_DATA_DIR` says), so these
/// tests need nothing outside the repository.
pub fn settings(extra: &[&str]) -> Settings {
    Settings::from_args(&args(extra)).expect("valid settings")
}

/// Flags as `kudos-sim` would parse them, without a data directory.
pub fn args(extra: &[&str]) -> Args {
    let mut argv = vec!["kudos-sim"];
    argv.extend_from_slice(extra);
    let mut a = Args::parse_from(argv);
    a.data_dir = None;
    a
}

/// Average JCT (hours) of one policy at `rate` with `seed`.
pub fn jct(s: &Settings, rate: f64, seed: u64, policy: &str) -> f64 {
    kudos_sim::run_one(s, rate, seed, policy, &mut || {})
        .expect("simulates")
        .avg_jct_h
}
