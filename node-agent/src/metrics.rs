//! `/metrics` and `/healthz`.
//!
//! GPU gauges use the DCGM exporter's names and labels (`DCGM_FI_DEV_GPU_UTIL{gpu, UUID,
//! modelName, Hostname, pod, namespace, container}`), so dashboards and alerts written for
//! `dcgm-exporter` work unchanged on Kudos nodes; they keep DCGM's units (percent, MiB, MHz).
//! Everything else is `kudos_*` in base units (bytes, seconds, hertz, watts, ratios).
//!
//! Pod labels follow the device: when a device moves to another pod, the old series is removed
//! rather than left frozen.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::sample::DeviceReading;

type Labels = Vec<(String, String)>;
type FGauge = Family<Labels, Gauge<f64, AtomicU64>>;
type FCounter = Family<Labels, Counter>;

/// Pod, namespace and container holding a device, for metric labels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    /// Pod name.
    pub pod: String,
    /// Pod namespace.
    pub namespace: String,
    /// Container name.
    pub container: String,
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    hostname: String,
    dcgm: [FGauge; 6],
    util_ratio: FGauge,
    mem_used: FGauge,
    mem_total: FGauge,
    power: FGauge,
    sm_clock: FGauge,
    temp: FGauge,
    processes: FGauge,
    xid_total: FCounter,
    xid_seen: Mutex<HashMap<String, u64>>,
    sample_errors: FCounter,
    /// Seconds one sampling round took.
    pub sample_duration: Histogram,
    /// Reports waiting in the outbox.
    pub outbox_depth: Gauge,
    /// Outbox capacity in reports.
    pub outbox_capacity: Gauge,
    /// Reports dropped from (or refused by) the outbox, by `state` and `reason`.
    pub outbox_dropped: FCounter,
    /// Outbox write failures.
    pub outbox_errors: Counter,
    /// Damaged outbox files set aside at start (the agent started with an empty outbox).
    pub outbox_recoveries: Counter,
    /// Reports written to the orchestrator stream.
    pub reports_sent: Counter,
    /// Acknowledgements by `status`.
    pub reports_acked: FCounter,
    /// Runs in progress.
    pub runs_active: Gauge,
    /// Runs ended, by `state` and `time_source` (`container`: timed from the container's
    /// status; `allocation`: from the devices' allocation, without pod metadata).
    pub runs_ended: FCounter,
    /// 1 while a report stream to the orchestrator is open.
    pub orchestrator_connected: Gauge,
    /// Heartbeats by `result`.
    pub heartbeats: FCounter,
    /// Failed PodResources calls.
    pub podresources_errors: Counter,
    last_labels: Mutex<HashMap<String, Labels>>,
    last_tick_ms: AtomicI64,
}

fn lbl(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

impl Metrics {
    /// Registers every metric; `hostname` is the DCGM `Hostname` label (the node name).
    pub fn new(hostname: &str) -> Arc<Self> {
        let mut r = Registry::default();
        let g = FGauge::default;
        let dcgm = [g(), g(), g(), g(), g(), g()];
        let help = [
            ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)"),
            ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)"),
            ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)"),
            ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)"),
            ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)"),
            (
                "DCGM_FI_DEV_XID_ERRORS",
                "Value of the last XID error encountered",
            ),
        ];
        for ((name, h), f) in help.iter().zip(&dcgm) {
            r.register(*name, *h, f.clone());
        }
        let m = Self {
            hostname: hostname.to_owned(),
            dcgm,
            util_ratio: g(),
            mem_used: g(),
            mem_total: g(),
            power: g(),
            sm_clock: g(),
            temp: g(),
            processes: g(),
            xid_total: FCounter::default(),
            xid_seen: Mutex::default(),
            sample_errors: FCounter::default(),
            sample_duration: Histogram::new(exponential_buckets(0.0005, 4.0, 8)),
            outbox_depth: Gauge::default(),
            outbox_capacity: Gauge::default(),
            outbox_dropped: FCounter::default(),
            outbox_errors: Counter::default(),
            outbox_recoveries: Counter::default(),
            reports_sent: Counter::default(),
            reports_acked: FCounter::default(),
            runs_active: Gauge::default(),
            runs_ended: FCounter::default(),
            orchestrator_connected: Gauge::default(),
            heartbeats: FCounter::default(),
            podresources_errors: Counter::default(),
            last_labels: Mutex::default(),
            last_tick_ms: AtomicI64::new(0),
            registry: Registry::default(),
        };
        r.register(
            "kudos_gpu_utilization_ratio",
            "GPU utilization, 0 to 1",
            m.util_ratio.clone(),
        );
        r.register(
            "kudos_gpu_memory_used_bytes",
            "Device memory in use",
            m.mem_used.clone(),
        );
        r.register(
            "kudos_gpu_memory_total_bytes",
            "Device memory in total",
            m.mem_total.clone(),
        );
        r.register("kudos_gpu_power_watts", "Board power draw", m.power.clone());
        r.register(
            "kudos_gpu_sm_clock_hertz",
            "SM clock frequency",
            m.sm_clock.clone(),
        );
        r.register(
            "kudos_gpu_temperature_celsius",
            "GPU core temperature",
            m.temp.clone(),
        );
        r.register(
            "kudos_gpu_processes",
            "Compute processes running on the device",
            m.processes.clone(),
        );
        r.register(
            "kudos_gpu_xid_errors",
            "XID errors seen on the device",
            m.xid_total.clone(),
        );
        r.register(
            "kudos_gpu_sample_errors",
            "Device reads that failed, by reason",
            m.sample_errors.clone(),
        );
        r.register(
            "kudos_sample_duration_seconds",
            "Time one sampling round took",
            m.sample_duration.clone(),
        );
        r.register(
            "kudos_outbox_reports",
            "Reports waiting for an acknowledgement",
            m.outbox_depth.clone(),
        );
        r.register(
            "kudos_outbox_capacity_reports",
            "Outbox capacity",
            m.outbox_capacity.clone(),
        );
        r.register(
            "kudos_outbox_dropped_reports",
            "Reports dropped or refused by the outbox, by state and reason",
            m.outbox_dropped.clone(),
        );
        r.register(
            "kudos_outbox_errors",
            "Outbox write failures",
            m.outbox_errors.clone(),
        );
        r.register(
            "kudos_outbox_recoveries",
            "Damaged outbox files moved aside at start (the agent started with an empty outbox)",
            m.outbox_recoveries.clone(),
        );
        r.register(
            "kudos_reports_sent",
            "Reports written to the orchestrator",
            m.reports_sent.clone(),
        );
        r.register(
            "kudos_reports_acknowledged",
            "Acknowledgements by status",
            m.reports_acked.clone(),
        );
        r.register(
            "kudos_runs_active",
            "Runs in progress",
            m.runs_active.clone(),
        );
        r.register(
            "kudos_runs_ended",
            "Runs ended, by state and the source of their times (container or allocation)",
            m.runs_ended.clone(),
        );
        r.register(
            "kudos_orchestrator_connected",
            "1 while a report stream to the orchestrator is open",
            m.orchestrator_connected.clone(),
        );
        r.register(
            "kudos_heartbeats",
            "Heartbeats sent, by result",
            m.heartbeats.clone(),
        );
        r.register(
            "kudos_podresources_errors",
            "Failed kubelet PodResources calls",
            m.podresources_errors.clone(),
        );
        Arc::new(Self { registry: r, ..m })
    }

    /// Publishes one round of readings; `holders` maps UUIDs to the container holding them.
    pub fn record(
        &self,
        readings: &[DeviceReading],
        holders: &HashMap<String, Holder>,
        now_ms: i64,
    ) {
        self.last_tick_ms.store(now_ms, Ordering::Relaxed);
        let mut last = self.last_labels.lock().unwrap_or_else(|p| p.into_inner());
        for r in readings {
            let uuid = r.info.uuid.as_str();
            let gpu = r.info.index.to_string();
            let dev = lbl(&[("gpu", &gpu), ("UUID", uuid)]);
            let h = holders.get(uuid).cloned().unwrap_or_default();
            let labels = lbl(&[
                ("gpu", &gpu),
                ("UUID", uuid),
                ("modelName", &r.info.model),
                ("Hostname", &self.hostname),
                ("pod", &h.pod),
                ("namespace", &h.namespace),
                ("container", &h.container),
            ]);
            let stale = match &r.result {
                Ok(_) => last.get(uuid).filter(|old| **old != labels).cloned(),
                Err(_) => last.remove(uuid),
            };
            if let Some(old) = stale {
                self.dcgm.iter().for_each(|f| {
                    f.remove(&old);
                });
            }
            self.mem_total
                .get_or_create(&dev)
                .set(r.info.memory_total_bytes as f64);
            let s = match &r.result {
                Ok(s) => s,
                Err(e) => {
                    let reason = match e {
                        crate::sample::SampleError::Timeout => "timeout",
                        crate::sample::SampleError::Stuck => "stuck",
                        crate::sample::SampleError::Backend(_) => "error",
                        crate::sample::SampleError::Panicked => "panic",
                    };
                    self.sample_errors
                        .get_or_create(&lbl(&[("UUID", uuid), ("reason", reason)]))
                        .inc();
                    for f in [
                        &self.util_ratio,
                        &self.mem_used,
                        &self.power,
                        &self.sm_clock,
                        &self.temp,
                        &self.processes,
                    ] {
                        f.remove(&dev);
                    }
                    continue;
                }
            };
            last.insert(uuid.to_owned(), labels.clone());
            let [util, fb, power, clock, temp, xid] = &self.dcgm;
            util.get_or_create(&labels).set(s.gpu_util_percent);
            fb.get_or_create(&labels)
                .set((s.memory_used_bytes >> 20) as f64);
            self.util_ratio
                .get_or_create(&dev)
                .set(s.gpu_util_percent / 100.0);
            self.mem_used
                .get_or_create(&dev)
                .set(s.memory_used_bytes as f64);
            self.processes
                .get_or_create(&dev)
                .set(s.processes.len() as f64);
            if let Some(w) = s.power_watts {
                power.get_or_create(&labels).set(w);
                self.power.get_or_create(&dev).set(w);
            }
            if let Some(hz) = s.sm_clock_hz {
                clock.get_or_create(&labels).set(hz / 1e6);
                self.sm_clock.get_or_create(&dev).set(hz);
            }
            if let Some(c) = s.temperature_celsius {
                temp.get_or_create(&labels).set(c);
                self.temp.get_or_create(&dev).set(c);
            }
            xid.get_or_create(&labels)
                .set(s.last_xid.unwrap_or(0) as f64);
            let mut seen = self.xid_seen.lock().unwrap_or_else(|p| p.into_inner());
            let prev = seen
                .insert(uuid.to_owned(), s.xid_errors_total)
                .unwrap_or(0);
            self.xid_total
                .get_or_create(&dev)
                .inc_by(s.xid_errors_total.saturating_sub(prev));
        }
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut s = String::with_capacity(8 << 10);
        if encode(&mut s, &self.registry).is_err() {
            s.clear();
        }
        s
    }

    /// The Prometheus text format 0.0.4 (what `curl` and `promtool check metrics` expect).
    pub fn render_prometheus(&self) -> String {
        kudos_common::exposition::prometheus_text(&self.render())
    }

    /// Milliseconds since the Unix epoch of the last sampling round.
    pub fn last_tick_ms(&self) -> i64 {
        self.last_tick_ms.load(Ordering::Relaxed)
    }
}

/// Shared state of the HTTP endpoints.
#[derive(Clone)]
pub struct HttpState {
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// `/healthz` fails when no sampling round finished within this many milliseconds.
    pub stale_after_ms: i64,
}

/// `/metrics` and `/healthz`.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(state)
}

/// OpenMetrics when the scraper asks for it (Prometheus does), the classic text format
/// otherwise.
async fn metrics(State(s): State<HttpState>, headers: axum::http::HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = kudos_common::exposition::negotiate(accept, s.metrics.render());
    ([(header::CONTENT_TYPE, content_type)], body)
}

async fn healthz(State(s): State<HttpState>) -> impl IntoResponse {
    let age = crate::now_ms() - s.metrics.last_tick_ms();
    if age <= s.stale_after_ms {
        (StatusCode::OK, "ok\n".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no sampling round for {age} ms\n"),
        )
    }
}

#[cfg(test)]
mod tests;
