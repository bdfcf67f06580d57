//! The Kudos test kit: every test that needs a real peer starts it through here, once. It runs
//! upstream Kubernetes components on loopback (etcd, kube-apiserver with static-token auth and
//! generated certificates, kube-scheduler optionally wired to the Kudos extender, and
//! `kubelet-dm`, the kubelet's own device manager and PodResources server from
//! `e2e/cmd/kubelet-dm`), real nodes ([`realnode`]: kube-controller-manager and fenced kubelets,
//! each with its own containerd and runc), `kudos-orchestrator`, Debian's `docker-registry` (read
//! back with `skopeo`) and `promtool`; and the fakes several crates share (an in-process
//! `TelemetryService` receiver standing in for the orchestrator).
//!
//! A dev-dependency only (ripgrep's `tests/util.rs`, linkerd2's `policy-test`): no production
//! crate links it, so nothing here ships.
//!
//! The upstream binaries are built by `e2e/build` into `e2e/_out/bin` (`$KUDOS_E2E_BIN_DIR`);
//! the Kudos binaries are the workspace's `target/debug` (or `$KUDOS_BIN_DIR`) builds. When a
//! binary is missing, tests print `SKIP:` and pass, unless `KUDOS_E2E_REQUIRE=1` (what CI
//! sets), where they fail ([`require_bins`]).
//!
//! Every process runs with its log in `e2e/_work/<run>/<name>.log` ([`RunDir`]); [`Proc`]
//! stops it by PID (SIGTERM, then SIGKILL after a timeout) when dropped, so a failing or
//! panicking test leaves nothing running. On failure the run directory is kept and its path
//! printed.
//!
//! Where to start: [`ControlPlane::for_test`] in a test, [`ControlPlane::start`] elsewhere.
#![forbid(unsafe_code)]

pub mod cluster;
pub mod dra;
pub mod http;
pub mod kubelet;
pub mod nodes;
pub mod orchestrator;
pub mod paths;
pub mod pki;
pub mod proc;
pub mod promtool;
pub mod realnode;
pub mod registry;
pub mod telemetry_receiver;

pub use cluster::{ControlPlane, ControlPlaneOptions, ExtenderOptions};
pub use kubelet::KubeletDm;
pub use paths::{RunDir, require_bins};
pub use proc::Proc;
pub use promtool::{PromtoolReport, promtool_check_metrics};
