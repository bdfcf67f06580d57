//! Configuration files, as an operator (or a broken ConfigMap) hands them over.
//!
//! Input: the first byte picks the file, the rest is its text:
//! - the orchestrator's YAML (`OrchestratorConfig`): parsed, merged with no flags, validated,
//!   and, when valid, turned into what the process builds from it at start (the HTTP router
//!   with its prefix and limits, the scheduler, the index), since a value that validates but
//!   panics at start (a route prefix with `{`, a semaphore of 2^61 permits) is the failure
//!   that matters;
//! - a per-vendor plugin configuration (`kudos-api`'s `VendorPluginConfig`, JSON, what the
//!   rollout writes and the device plugin reads);
//! - the device plugin's static device file (JSON).

use clap::Parser;
use kudos_orchestrator::config::{FileConfig, Settings};
use std::path::Path;
use std::sync::Arc;

/// One input; see the module docs.
pub fn run(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    match first % 3 {
        0 => {
            let Ok(text) = std::str::from_utf8(rest) else {
                return;
            };
            orchestrator(text);
        }
        1 => {
            let _ = kudos_api::config::v1::VendorPluginConfig::from_file_bytes(
                Path::new("fuzz.json"),
                rest,
            );
        }
        _ => {
            let Ok(text) = std::str::from_utf8(rest) else {
                return;
            };
            let _ = kudos_device_plugin::backend::static_file::StaticBackend::parse(text, "fuzz");
        }
    }
}

fn orchestrator(text: &str) {
    let Ok(file) = FileConfig::parse(text) else {
        return;
    };
    // No flags and no environment: what the file alone says.
    let args = match kudos_orchestrator::Args::try_parse_from(["kudos-orchestrator"]) {
        Ok(a) => a,
        Err(e) => panic!("the orchestrator's arguments without flags do not parse: {e}"),
    };
    let Ok(s) = Settings::merge(&args, file) else {
        return;
    };
    // What `run` builds from valid settings before it touches the network.
    let index = kudos_orchestrator::index::scheduler_from(s.scheduler.clone(), None).map(|sched| {
        kudos_orchestrator::index::Index::new(
            &s.unified_resource_name,
            s.heartbeat_max_age_seconds,
            sched,
            false,
        )
    });
    let Ok(index) = index else {
        panic!("settings validated, but their scheduler section does not build");
    };
    let index = Arc::new(parking_lot::RwLock::new(index));
    let metrics = Arc::new(kudos_orchestrator::metrics::Metrics::new());
    let extender = crate::extender_for(index.clone(), metrics.clone(), &s.unified_resource_name);
    let state = Arc::new(kudos_orchestrator::http::HttpState::new(
        extender, index, metrics,
    ));
    let limits = kudos_orchestrator::http::HttpLimits {
        prefix: s.extender_prefix.clone(),
        max_body_bytes: s.max_body_bytes,
        timeout: s.request_timeout,
        bind_timeout: s.bind_timeout,
        max_concurrent: s.max_concurrent_requests,
    };
    let _router = kudos_orchestrator::http::router(state, &limits);
    let _connections = tokio::sync::Semaphore::new(s.max_connections);
}
