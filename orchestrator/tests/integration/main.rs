//! The real `kudos-orchestrator` binary, run by `kudos-testkit`, in one test binary (ripgrep's
//! `tests/tests.rs` shape): crash safety and shutdown (`process`), a plugin report to a derived
//! image and an applied DaemonSet against `docker-registry` and kube-apiserver (`rollout_e2e`),
//! gRPC callers bound to their node by kube-apiserver's TokenReview (`token_review`), leader
//! election and failover between two replicas (`failover`). New tests
//! of the binary go here as modules.

#[path = "../common/mod.rs"]
mod common;
mod failover;
mod kubectl_state;
mod process;
mod rollout_e2e;
mod store_configmap;
mod token_review;
