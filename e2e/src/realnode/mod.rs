//! Real-node scenarios: Kudos installed with its chart on a [`RealCluster`], the test kit's real
//! nodes (etcd, kube-apiserver, kube-controller-manager and fenced kubelets with their own
//! containerd; re-exported here under their old paths), reached as its users reach it
//! ([`access`]), and the steps the scenarios share ([`scenario`]).

pub use kudos_testkit::realnode::*;

pub mod access;
pub mod kudos;
pub mod scenario;
