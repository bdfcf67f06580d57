//! The orchestrator's integration tests, one binary (ripgrep's `tests/tests.rs` shape), sharing
//! `common`'s index fixtures and pod builders:
//! - through the router, in process: the extender contract against golden files (`extender`),
//!   gangs (`gang`), the gRPC services (`grpc`), probes (`health`), TLS and authentication
//!   (`https`), request limits (`limits`), image derivation and rollout (`rollout`), `/state`
//!   (`status`);
//! - the real `kudos-orchestrator` binary, run by `kudos-testkit`: crash safety and shutdown
//!   (`process`), a plugin report to a derived image and an applied DaemonSet against
//!   `docker-registry` and kube-apiserver (`rollout_e2e`), gRPC callers bound to their node by
//!   kube-apiserver's TokenReview (`token_review`), leader election and failover between two
//!   replicas (`failover`), the ConfigMap store (`store_configmap`), `kubectl get` through the
//!   chart's CRDs (`kubectl_state`).

#[path = "../common/mod.rs"]
mod common;

mod extender;
mod gang;
mod grpc;
mod health;
mod https;
mod limits;
mod rollout;
mod status;

mod failover;
mod kubectl_state;
mod process;
mod rollout_e2e;
mod store_configmap;
mod token_review;
