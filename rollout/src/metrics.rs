//! Prometheus metrics of the rollout, in base units (seconds, counts).
//!
//! [`RolloutMetrics`] counts what the writer does (pushes, applies, deletes, failures);
//! [`MonitorMetrics`] exports the latest [`crate::monitor::NodeMonitor`] views per node.
//! Both are cheap clones sharing the same atomics; register them once on the
//! orchestrator's registry.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::monitor::NodeMonitor;

/// Outcome label of an operation.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Outcome {
    /// It worked.
    Success,
    /// It failed (after retries, for pushes).
    Failure,
}

/// Labels of per-group operations.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabels {
    /// Plugin group (vendor set), e.g. `nvidia`.
    pub group: String,
    /// Outcome.
    pub outcome: Outcome,
}

/// Labels of per-node gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    /// Node name.
    pub node: String,
}

/// Counters and timings of image derivation and DaemonSet apply.
#[derive(Clone, Debug)]
pub struct RolloutMetrics {
    /// Derived-image pushes by group and outcome (a failure counts once, after retries).
    pub image_pushes: Family<GroupLabels, Counter>,
    /// Push attempts that failed and were retried.
    pub image_push_retries: Counter,
    /// Time to derive and push one image, in seconds.
    pub image_push_duration_seconds: Histogram,
    /// Server-side applies of DaemonSets by group and outcome.
    pub daemonset_applies: Family<GroupLabels, Counter>,
    /// DaemonSets deleted because their group left the configuration.
    pub daemonset_deletes: Counter,
    /// Reconcile passes that failed.
    pub reconcile_failures: Counter,
}

impl Default for RolloutMetrics {
    fn default() -> Self {
        Self {
            image_pushes: Family::default(),
            image_push_retries: Counter::default(),
            image_push_duration_seconds: Histogram::new(exponential_buckets(0.05, 2.0, 12)),
            daemonset_applies: Family::default(),
            daemonset_deletes: Counter::default(),
            reconcile_failures: Counter::default(),
        }
    }
}

impl RolloutMetrics {
    /// Registers every metric under `registry` (prefix it, e.g. `kudos_rollout`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "image_pushes",
            "Derived plugin image pushes by group and outcome",
            self.image_pushes.clone(),
        );
        registry.register(
            "image_push_retries",
            "Failed push attempts that were retried",
            self.image_push_retries.clone(),
        );
        registry.register(
            "image_push_duration_seconds",
            "Time to derive and push one plugin image",
            self.image_push_duration_seconds.clone(),
        );
        registry.register(
            "daemonset_applies",
            "Server-side applies of plugin DaemonSets by group and outcome",
            self.daemonset_applies.clone(),
        );
        registry.register(
            "daemonset_deletes",
            "Plugin DaemonSets deleted because their group left the configuration",
            self.daemonset_deletes.clone(),
        );
        registry.register(
            "reconcile_failures",
            "Rollout reconcile passes that failed",
            self.reconcile_failures.clone(),
        );
    }
}

/// Per-node gauges from the latest monitoring pass.
#[derive(Clone, Debug, Default)]
pub struct MonitorMetrics {
    /// Node capacity of the unified resource (devices).
    pub capacity: Family<NodeLabels, Gauge>,
    /// Node allocatable of the unified resource (devices).
    pub allocatable: Family<NodeLabels, Gauge>,
    /// Healthy devices per the plugin's latest report.
    pub healthy_devices: Family<NodeLabels, Gauge>,
    /// Devices the configuration lists for the node.
    pub configured_devices: Family<NodeLabels, Gauge>,
    /// Seconds since the node agent's last heartbeat.
    pub heartbeat_age_seconds: Family<NodeLabels, Gauge<f64, AtomicU64>>,
    /// 1 when the node is excluded from ranking, else 0.
    pub excluded: Family<NodeLabels, Gauge>,
}

impl MonitorMetrics {
    /// Registers every gauge under `registry` (prefix it, e.g. `kudos_node`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "unified_capacity",
            "Node capacity of the unified resource",
            self.capacity.clone(),
        );
        registry.register(
            "unified_allocatable",
            "Node allocatable of the unified resource",
            self.allocatable.clone(),
        );
        registry.register(
            "healthy_devices",
            "Healthy devices per the plugin's latest report",
            self.healthy_devices.clone(),
        );
        registry.register(
            "configured_devices",
            "Devices the plugin configuration lists for the node",
            self.configured_devices.clone(),
        );
        registry.register(
            "heartbeat_age_seconds",
            "Seconds since the node agent's last heartbeat",
            self.heartbeat_age_seconds.clone(),
        );
        registry.register(
            "excluded",
            "1 when the node is excluded from ranking",
            self.excluded.clone(),
        );
    }

    /// Replaces every gauge with the values of `monitors`; nodes that left the configuration
    /// disappear. Unknown values (no report yet) are left out rather than exported as 0.
    pub fn observe(&self, monitors: &[NodeMonitor]) {
        for f in [
            &self.capacity,
            &self.allocatable,
            &self.healthy_devices,
            &self.configured_devices,
            &self.excluded,
        ] {
            f.clear();
        }
        self.heartbeat_age_seconds.clear();
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        for m in monitors {
            let l = NodeLabels {
                node: m.node.clone(),
            };
            if let Some(v) = m.capacity {
                self.capacity.get_or_create(&l).set(clamp(v));
            }
            if let Some(v) = m.allocatable {
                self.allocatable.get_or_create(&l).set(clamp(v));
            }
            if let Some(v) = m.healthy_devices {
                self.healthy_devices.get_or_create(&l).set(clamp(v));
            }
            self.configured_devices
                .get_or_create(&l)
                .set(clamp(m.configured_devices));
            if let Some(age) = m.heartbeat_age_seconds {
                self.heartbeat_age_seconds.get_or_create(&l).set(age);
            }
            self.excluded
                .get_or_create(&l)
                .set(i64::from(m.exclude_from_ranking));
        }
    }
}
