//! Prometheus metrics (base units) and the small HTTP server that exposes them with
//! `/healthz` and `/ready` (ready once the plugin is registered with the kubelet).

use crate::backend::{Backends, Health};
use crate::health::HealthMap;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HealthLabels {
    vendor: String,
    health: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

struct Inner {
    registry: Registry,
    registrations: Family<ResultLabels, Counter>,
    allocations: Family<ResultLabels, Counter>,
    allocate_seconds: Histogram,
    transitions: Family<HealthLabels, Counter>,
    devices: Family<HealthLabels, Gauge>,
    stream_restarts: Family<ReasonLabels, Counter>,
    reports: Family<ResultLabels, Counter>,
    ready: AtomicBool,
}

/// All plugin metrics; cheap to clone.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kudos_device_plugin");
        let registrations = Family::<ResultLabels, Counter>::default();
        registry.register(
            "registrations",
            "Registrations with the kubelet, by result",
            registrations.clone(),
        );
        let allocations = Family::<ResultLabels, Counter>::default();
        registry.register(
            "allocations",
            "Allocate calls, by result",
            allocations.clone(),
        );
        let allocate_seconds = Histogram::new(exponential_buckets(0.000_025, 2.0, 16));
        registry.register(
            "allocate_duration_seconds",
            "Time to answer Allocate",
            allocate_seconds.clone(),
        );
        let transitions = Family::<HealthLabels, Counter>::default();
        registry.register(
            "health_transitions",
            "Device health transitions, by vendor and new health",
            transitions.clone(),
        );
        let devices = Family::<HealthLabels, Gauge>::default();
        registry.register(
            "devices",
            "Devices served, by vendor and health",
            devices.clone(),
        );
        let stream_restarts = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "reregistrations",
            "Re-registrations with the kubelet, by trigger (kubelet socket recreated, own socket removed, ListAndWatch stream closed, name changed)",
            stream_restarts.clone(),
        );
        let reports = Family::<ResultLabels, Counter>::default();
        registry.register(
            "orchestrator_reports",
            "ReportPlugin calls to the orchestrator, by result",
            reports.clone(),
        );
        Metrics(Arc::new(Inner {
            registry,
            registrations,
            allocations,
            allocate_seconds,
            transitions,
            devices,
            stream_restarts,
            reports,
            ready: AtomicBool::new(false),
        }))
    }

    fn result(ok: bool) -> ResultLabels {
        ResultLabels {
            result: if ok { "ok" } else { "error" }.into(),
        }
    }

    /// Counts one registration attempt.
    pub fn registration(&self, ok: bool) {
        self.0.registrations.get_or_create(&Self::result(ok)).inc();
        if ok {
            self.0.ready.store(true, Ordering::Relaxed);
        }
    }

    /// Counts one Allocate call and its latency.
    pub fn allocation(&self, ok: bool, seconds: f64) {
        self.0.allocations.get_or_create(&Self::result(ok)).inc();
        self.0.allocate_seconds.observe(seconds);
    }

    /// Counts one health transition.
    pub fn health_transition(&self, vendor: &str, to: Health) {
        let health = to.as_str().to_ascii_lowercase();
        self.0
            .transitions
            .get_or_create(&HealthLabels {
                vendor: vendor.into(),
                health,
            })
            .inc();
    }

    /// Sets the device gauges from a health snapshot.
    pub fn set_devices(&self, backends: &Backends, health: &HealthMap) {
        for b in backends.iter() {
            let vendor = &b.vendor().key;
            for h in [Health::Healthy, Health::Unhealthy] {
                let n = b
                    .devices()
                    .iter()
                    .filter(|d| health.get(&d.id).copied().unwrap_or(Health::Healthy) == h)
                    .count();
                let labels = HealthLabels {
                    vendor: vendor.clone(),
                    health: h.as_str().to_ascii_lowercase(),
                };
                self.0
                    .devices
                    .get_or_create(&labels)
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
    }

    /// Counts a re-registration and its trigger.
    pub fn reregistration(&self, reason: &str) {
        self.0
            .stream_restarts
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts one orchestrator report.
    pub fn report(&self, ok: bool) {
        self.0.reports.get_or_create(&Self::result(ok)).inc();
    }

    /// Whether the plugin has registered at least once.
    pub fn is_ready(&self) -> bool {
        self.0.ready.load(Ordering::Relaxed)
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.0.registry);
        out
    }

    /// `/metrics`, `/healthz`, `/ready`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(|| async { "ok" }))
            .route("/ready", get(ready))
            .with_state(self.clone())
    }
}

/// OpenMetrics when the scraper asks for it, Prometheus text otherwise.
async fn metrics(State(m): State<Metrics>, headers: axum::http::HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = kudos_common::exposition::negotiate(accept, m.encode());
    ([(header::CONTENT_TYPE, content_type)], body)
}

async fn ready(State(m): State<Metrics>) -> impl IntoResponse {
    if m.is_ready() {
        (StatusCode::OK, "registered")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not registered yet")
    }
}
