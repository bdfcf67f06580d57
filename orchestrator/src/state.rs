//! The persisted domain types: the plugin configuration (defined in `kudos-api`, which the
//! rollout reads too) and accepted run records.
//!
//! They are plain serde structs so every store (redb file, ConfigMap) writes the same JSON,
//! and `GET /state` shows exactly what is persisted.

use serde::{Deserialize, Serialize};

pub use kudos_api::plugin_config::{DeviceRecord, PluginConfig, ProfileRecord, VendorEntry};

/// Outcome of a run as reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RunOutcome {
    /// Still running (a snapshot).
    InProgress,
    /// Finished normally.
    Completed,
    /// Failed: stored, never used as evidence of speed.
    Failed,
}

/// An accepted run report, as stored. `seq` is assigned by the store, in acceptance order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredRun {
    /// Store sequence number (0 until stored).
    pub seq: u64,
    /// De-duplication key.
    pub report_id: String,
    /// Run ID (same across snapshots of one run).
    pub run_id: String,
    /// Node that ran it.
    pub node: String,
    /// Pod namespace.
    pub pod_namespace: String,
    /// Pod name.
    pub pod_name: String,
    /// Class label; empty when none.
    pub class: String,
    /// Devices used.
    pub device_ids: Vec<String>,
    /// Outcome.
    pub outcome: RunOutcome,
    /// Start, Unix seconds.
    pub start: f64,
    /// End (or snapshot time), Unix seconds.
    pub end: f64,
    /// GPU-busy seconds.
    pub gpu_busy_seconds: f64,
    /// Progress 0..=1 when known.
    pub progress: Option<f64>,
    /// Work units done when known.
    pub work_done: Option<f64>,
    /// The node's profile at acceptance, when known.
    pub profile: Option<ProfileRecord>,
    /// Wall-clock time of acceptance, Unix seconds: the `now` given to `observe`.
    pub received_at: f64,
}

impl StoredRun {
    /// Whether the model learns from this run: completed or in progress, with a class and a
    /// known device profile. Failed runs and unclassified runs are stored only.
    pub fn observable(&self) -> bool {
        self.outcome != RunOutcome::Failed && !self.class.is_empty() && self.profile.is_some()
    }
}
