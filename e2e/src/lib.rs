//! Test support for Kudos end-to-end tests against real upstream Kubernetes components on
//! loopback: etcd, kube-apiserver (static-token auth, generated certificates), kube-scheduler
//! (optionally wired to the Kudos extender) and `kubelet-dm`, a harness that runs the kubelet's
//! own device manager and PodResources server (see `e2e/cmd/kubelet-dm`).
//!
//! The upstream binaries are built by `e2e/build` into `e2e/_out/bin`; the Kudos binaries are
//! the workspace's `target/debug` (or `$KUDOS_BIN_DIR`) builds. When a binary is missing, tests
//! print `SKIP:` and pass, unless `KUDOS_E2E_REQUIRE=1` (what CI sets), where they fail.
//!
//! Every process runs with its log in `e2e/_work/<run>/<name>.log`; [`Proc`] stops it by PID
//! (SIGTERM, then SIGKILL after a timeout) when dropped, so a failing or panicking test leaves
//! nothing running. On failure the run directory is kept and its path printed.
//!
//! Where to start: [`ControlPlane::start`].
#![forbid(unsafe_code)]

pub mod cluster;
pub mod http;
pub mod kubelet;
pub mod nodes;
pub mod null_extender;
pub mod orchestrator;
pub mod paths;
pub mod proc;
pub mod realnode;
pub mod telemetry;

pub use cluster::{ControlPlane, ControlPlaneOptions, ExtenderOptions};
pub use kubelet::KubeletDm;
pub use paths::{RunDir, require_bins};
pub use proc::Proc;
