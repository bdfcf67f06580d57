//! rollout's integration tests, one binary (ripgrep's `tests/tests.rs` + `tests/util.rs`):
//! image derivation against a real `docker-registry` and server-side apply against a real
//! kube-apiserver, both run by `kudos-testkit`. New test files go here as modules.

mod apiserver;
mod registry;
mod util;
