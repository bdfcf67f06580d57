//! The extender's HTTP routes, as kube-scheduler (or anyone who reaches the port) calls them.
//!
//! Input: up to [`MAX_REQUESTS`] requests separated by the byte `0x1e`; each request's first
//! byte picks the route (`filter`, `prioritize`, `bind`, `GET /explain/...`, `GET /state`) and
//! the rest is its body (for explain, the path after `/explain/`). The requests run in order
//! against one fresh orchestrator (three GPU nodes of two vendors, open access, standalone), so
//! a `bind` can follow the `filter` of the same pod.
//!
//! Checked besides "no panic": no answer is a 5xx; every answer is JSON (except the router's
//! empty 404 for a path no route matches); a filter answer names only nodes the request offered, as passing or
//! failing, never both; prioritize scores only offered nodes, within kube-scheduler's
//! extender range.

use kudos_orchestrator::http::{HttpLimits, HttpState, router};
use kudos_orchestrator::index::Index;
use kudos_orchestrator::metrics::Metrics;
use kudos_orchestrator::state::{DeviceRecord, PluginConfig, VendorEntry};
use kudos_scheduler_core::queue::MAX_EXTENDER_SCORE;
use kudos_scheduler_core::{Scheduler, SchedulerConfig};
use parking_lot::RwLock;
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

/// Requests per input at most.
pub const MAX_REQUESTS: usize = 4;
/// The separator between requests.
pub const SEPARATOR: u8 = 0x1e;
const UNIFIED: &str = "kudos.dev/gpu";
const PREFIX: &str = "/kudos/v1";
/// The fixture's nodes: name, vendor, model, devices.
pub const NODES: [(&str, &str, &str, usize); 3] = [
    ("gpu-a", "nvidia", "NVIDIA H100 80GB HBM3", 4),
    ("gpu-b", "amd", "AMD Instinct MI300X", 8),
    ("gpu-c", "nvidia", "Tesla V100-SXM2-16GB", 2),
];

/// A standalone index (ready at once) holding [`NODES`].
pub fn index() -> kudos_orchestrator::index::SharedIndex {
    let mut idx = Index::new(
        UNIFIED,
        120.0,
        Scheduler::new(SchedulerConfig::default()),
        false,
    );
    let mut cfg = PluginConfig::default();
    for (name, vendor, model, n) in NODES {
        let entry = VendorEntry {
            vendor_resource_name: format!("{vendor}.com/gpu"),
            devices: (0..n)
                .map(|i| DeviceRecord {
                    id: format!("{name}-{i}"),
                    model: model.into(),
                    memory_bytes: 80 << 30,
                    ..Default::default()
                })
                .collect(),
            plugin_version: "fuzz".into(),
        };
        cfg.upsert(name, vendor, entry, UNIFIED);
    }
    idx.set_plugin_config(cfg);
    Arc::new(RwLock::new(idx))
}

fn app() -> axum::Router {
    let index = index();
    let metrics = Arc::new(Metrics::new());
    let extender = crate::extender_for(index.clone(), metrics.clone(), UNIFIED);
    let state = Arc::new(HttpState::new(extender, index, metrics));
    router(
        state,
        &HttpLimits {
            prefix: PREFIX.into(),
            max_body_bytes: 1 << 20,
            timeout: Duration::from_secs(5),
            bind_timeout: Duration::from_secs(5),
            max_concurrent: 16,
        },
    )
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Route {
    Filter,
    Prioritize,
    Bind,
    Explain,
    State,
}

impl Route {
    fn from_byte(b: u8) -> Self {
        [
            Route::Filter,
            Route::Prioritize,
            Route::Bind,
            Route::Explain,
            Route::State,
        ][usize::from(b) % 5]
    }
}

/// One input; see the module docs.
pub fn run(data: &[u8]) {
    let rt = crate::runtime();
    let app = app();
    for request in data.split(|b| *b == SEPARATOR).take(MAX_REQUESTS) {
        let Some((&first, body)) = request.split_first() else {
            continue;
        };
        let route = Route::from_byte(first);
        let Some(req) = build(route, body) else {
            continue;
        };
        let (status, answer) = rt.block_on(async {
            let resp = match app.clone().oneshot(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            let status = resp.status();
            let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20).await;
            (status, bytes)
        });
        let answer = match answer {
            Ok(a) => a,
            Err(e) => panic!("{route:?}: the answer's body failed: {e}"),
        };
        assert!(
            !status.is_server_error(),
            "{route:?} answered {status}: {}",
            String::from_utf8_lossy(&answer)
        );
        // The router's own answer to a path no route matches (an explain path with more
        // segments) has no body.
        if answer.is_empty() && status == http::StatusCode::NOT_FOUND && route == Route::Explain {
            continue;
        }
        let Ok(json) = serde_json::from_slice::<Value>(&answer) else {
            panic!(
                "{route:?} answered {status} with a body that is not JSON: {:?}",
                String::from_utf8_lossy(&answer)
            );
        };
        if status.is_success() {
            check_answer(route, body, &json);
        } else {
            assert!(
                json.get("error").and_then(Value::as_str).is_some(),
                "{route:?} refused ({status}) without an error message: {json}"
            );
        }
    }
}

fn build(route: Route, body: &[u8]) -> Option<http::Request<axum::body::Body>> {
    let post = |verb: &str| {
        http::Request::post(format!("{PREFIX}/{verb}"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from(body.to_vec()))
            .ok()
    };
    match route {
        Route::Filter => post("filter"),
        Route::Prioritize => post("prioritize"),
        Route::Bind => post("bind"),
        // A path kube-scheduler never sends, but anyone may: any bytes that make a URI.
        Route::Explain => {
            let path = std::str::from_utf8(body).ok()?;
            http::Request::get(format!("/explain/{path}"))
                .body(axum::body::Body::empty())
                .ok()
        }
        Route::State => http::Request::get("/state")
            .body(axum::body::Body::empty())
            .ok(),
    }
}

/// The node names a filter/prioritize request offers (`NodeNames`, or `Nodes.items[].metadata.name`).
fn offered(request: &[u8]) -> BTreeSet<String> {
    // Lossy: the extender skips fields it ignores without checking their UTF-8, so a request
    // it accepts may hold bytes a strict parse refuses; names themselves are checked strings.
    let Ok(v) = serde_json::from_str::<Value>(&String::from_utf8_lossy(request)) else {
        return BTreeSet::new();
    };
    let mut names = BTreeSet::new();
    if let Some(list) = v.get("NodeNames").and_then(Value::as_array) {
        names.extend(list.iter().filter_map(Value::as_str).map(str::to_owned));
    }
    if let Some(items) = v.pointer("/Nodes/items").and_then(Value::as_array) {
        names.extend(
            items
                .iter()
                .filter_map(|n| n.pointer("/metadata/name").and_then(Value::as_str))
                .map(str::to_owned),
        );
    }
    names
}

fn check_answer(route: Route, request: &[u8], answer: &Value) {
    match route {
        Route::Filter => {
            let offered = offered(request);
            let mut passed: BTreeSet<&str> = BTreeSet::new();
            if let Some(names) = answer.get("NodeNames").and_then(Value::as_array) {
                passed.extend(names.iter().filter_map(Value::as_str));
            }
            if let Some(items) = answer.pointer("/Nodes/items").and_then(Value::as_array) {
                passed.extend(
                    items
                        .iter()
                        .filter_map(|n| n.pointer("/metadata/name").and_then(Value::as_str)),
                );
            }
            for n in &passed {
                assert!(
                    offered.contains(*n),
                    "filter passed {n:?}, which the request did not offer: {answer}"
                );
            }
            for failed in ["FailedNodes", "FailedAndUnresolvableNodes"] {
                if let Some(map) = answer.get(failed).and_then(Value::as_object) {
                    for n in map.keys() {
                        assert!(
                            offered.contains(n),
                            "filter failed {n:?}, which the request did not offer"
                        );
                        assert!(
                            !passed.contains(n.as_str()),
                            "filter both passed and failed {n:?}"
                        );
                    }
                }
            }
        }
        Route::Prioritize => {
            let offered = offered(request);
            let Some(list) = answer.as_array() else {
                panic!("prioritize answered something other than a list: {answer}");
            };
            for hp in list {
                let host = hp.get("Host").and_then(Value::as_str).unwrap_or_default();
                assert!(
                    offered.contains(host),
                    "prioritize scored {host:?}, which the request did not offer"
                );
                let score = hp.get("Score").and_then(Value::as_i64).unwrap_or(-1);
                assert!(
                    (0..=MAX_EXTENDER_SCORE as i64).contains(&score),
                    "prioritize scored {host:?} {score}, outside 0..={MAX_EXTENDER_SCORE}"
                );
            }
        }
        Route::Bind | Route::Explain | Route::State => {}
    }
}
