//! The simulator's integration tests, one binary (ripgrep's `tests/tests.rs` layout): the
//! modules share `common`'s settings builders, compiled and linked once.

mod common;

mod events;
mod exploration;
mod simulation;
