//! The device plugin's integration tests, one binary (ripgrep's `tests/tests.rs` layout): every
//! module shares `support`'s kubelet stand-in, plugin runner and registry stub, compiled and
//! linked once.

mod support;

mod conformance;
mod derived_image;
mod dra;
mod handover;
mod multi_vendor;
mod orchestrator;
mod process;
