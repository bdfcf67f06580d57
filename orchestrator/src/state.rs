//! The persisted domain types: the versioned plugin configuration and accepted run records.
//!
//! They are plain serde structs so every store (redb file, ConfigMap) writes the same JSON,
//! and `GET /state` shows exactly what is persisted.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The plugin configuration: which vendors' devices each node has, under which unified name.
///
/// `generation` is bumped only on a real change (a new node, vendor, device list, resource
/// name or plugin version), so rollout can key on it and plugins can tell nothing changed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginConfig {
    /// Bumped on every real change; 0 means empty.
    pub generation: u64,
    /// Unified resource name all vendors register under.
    pub unified_resource_name: String,
    /// Node name → vendor key → entry.
    pub nodes: BTreeMap<String, BTreeMap<String, VendorEntry>>,
    /// Plugin group → derived plugin image (by digest), recorded by the rollout (issue 8);
    /// opaque here. The JSON of this struct is what rollout's `PluginConfigView` reads.
    #[serde(default)]
    pub images: BTreeMap<String, serde_json::Value>,
}

/// One vendor's plugin on one node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VendorEntry {
    /// The vendor's own resource name (e.g. `nvidia.com/gpu`), rewritten to the unified one.
    pub vendor_resource_name: String,
    /// Devices, sorted by ID. Health is not part of the configuration (it flaps; it lives in
    /// the index), so it never bumps the generation.
    pub devices: Vec<DeviceRecord>,
    /// Plugin version string.
    pub plugin_version: String,
}

/// One device as reported.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRecord {
    /// Stable, vendor-prefixed ID.
    pub id: String,
    /// Model name.
    pub model: String,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// Vendor UUID or PCI bus ID.
    pub uuid: String,
    /// NUMA node when known.
    pub numa_node: Option<i64>,
}

impl PluginConfig {
    /// Inserts or replaces `node`/`vendor`; bumps the generation and returns true only if
    /// something changed (also when the unified name changed since the last write).
    pub fn upsert(
        &mut self,
        node: &str,
        vendor: &str,
        mut entry: VendorEntry,
        unified: &str,
    ) -> bool {
        entry.devices.sort_by(|a, b| a.id.cmp(&b.id));
        let mut changed = false;
        if self.unified_resource_name != unified {
            self.unified_resource_name = unified.to_owned();
            changed = true;
        }
        let vendors = self.nodes.entry(node.to_owned()).or_default();
        if vendors.get(vendor) != Some(&entry) {
            vendors.insert(vendor.to_owned(), entry);
            changed = true;
        }
        if changed {
            self.generation += 1;
        }
        changed
    }

    /// The device profile of a node from its reported devices: the vendor with the most
    /// devices, its most common model, the smallest memory among those, and the count.
    pub fn profile(&self, node: &str) -> Option<ProfileRecord> {
        let vendors = self.nodes.get(node)?;
        let (vendor, entry) = vendors
            .iter()
            .filter(|(_, e)| !e.devices.is_empty())
            .max_by_key(|(_, e)| e.devices.len())?;
        let mut models: BTreeMap<&str, usize> = BTreeMap::new();
        for d in &entry.devices {
            *models.entry(d.model.as_str()).or_default() += 1;
        }
        let model = models.iter().max_by_key(|(_, n)| **n).map(|(m, _)| *m)?;
        let memory_bytes = entry
            .devices
            .iter()
            .filter(|d| d.model == model)
            .map(|d| d.memory_bytes)
            .min()
            .unwrap_or(0);
        Some(ProfileRecord {
            vendor: vendor.clone(),
            model: model.to_owned(),
            count: entry.devices.len() as u32,
            memory_bytes,
        })
    }
}

/// A device profile as persisted with a run (so a replay observes exactly what was observed
/// live, even if the node's devices changed since).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileRecord {
    /// Vendor key.
    pub vendor: String,
    /// Model name.
    pub model: String,
    /// Devices on the node.
    pub count: u32,
    /// Memory per device, bytes.
    pub memory_bytes: u64,
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: usize) -> VendorEntry {
        VendorEntry {
            vendor_resource_name: "nvidia.com/gpu".into(),
            devices: (0..n)
                .map(|i| DeviceRecord {
                    id: format!("nv-{i}"),
                    model: "H100".into(),
                    memory_bytes: 80 << 30,
                    ..Default::default()
                })
                .collect(),
            plugin_version: "1".into(),
        }
    }

    #[test]
    fn json_shape_is_the_rollout_view() {
        let mut c = PluginConfig::default();
        c.upsert("n1", "nvidia", entry(1), "kudos.dev/gpu");
        let v = serde_json::to_value(&c).unwrap();
        let e = &v["nodes"]["n1"]["nvidia"];
        assert_eq!(v["unifiedResourceName"], "kudos.dev/gpu");
        assert_eq!(v["generation"], 1);
        assert!(v["images"].is_object());
        assert_eq!(e["vendorResourceName"], "nvidia.com/gpu");
        assert_eq!(e["pluginVersion"], "1");
        let d = &e["devices"][0];
        for k in ["id", "model", "memoryBytes", "uuid", "numaNode"] {
            assert!(d.get(k).is_some(), "{k} missing: {d}");
        }
    }

    #[test]
    fn generation_bumps_only_on_change() {
        let mut c = PluginConfig::default();
        assert!(c.upsert("n1", "nvidia", entry(2), "kudos.dev/gpu"));
        assert_eq!(c.generation, 1);
        assert!(!c.upsert("n1", "nvidia", entry(2), "kudos.dev/gpu"));
        assert_eq!(c.generation, 1);
        assert!(c.upsert("n1", "nvidia", entry(3), "kudos.dev/gpu"));
        assert_eq!(c.generation, 2);
        let p = c.profile("n1").unwrap();
        assert_eq!((p.vendor.as_str(), p.count), ("nvidia", 3));
    }
}
