//! scheduler-core's integration tests, one binary (ripgrep's `tests/tests.rs` layout): the
//! modules share `common`'s Gavel table and run reports, compiled and linked once.
//! (`tests/allocations.rs` stays a binary of its own: it installs a counting global allocator.)

mod common;

mod closed_loop;
mod learning;
mod properties;
mod run_reports;
