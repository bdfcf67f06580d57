//! Kudos end-to-end scenarios against real upstream Kubernetes components on loopback. The
//! runners (etcd, kube-apiserver, kube-scheduler, `kubelet-dm`, `kudos-orchestrator`) live in
//! `kudos-testkit`, re-exported here under their old paths; this crate adds what only the
//! scenarios use: run reports over gRPC, waits on pods, a do-nothing extender for the
//! throughput baseline and the device-plugin side-by-side with the upstream sample plugin
//! ([`plugin_bench`]).
//!
//! Where to start: [`ControlPlane::start`].
#![forbid(unsafe_code)]

pub use kudos_testkit::{cluster, dra, http, kubelet, nodes, orchestrator, paths, pki, proc};
pub mod browser;
pub mod null_extender;
pub mod plugin_bench;
pub mod pods;
pub mod realnode;
pub mod spread;
pub mod telemetry;

pub use cluster::{ControlPlane, ControlPlaneOptions, ExtenderOptions};
pub use kubelet::KubeletDm;
pub use paths::{RunDir, require_bins};
pub use proc::Proc;
