//! The persisted plugin configuration: which vendors' devices each node has, under which
//! unified name, and which derived image each plugin group runs.
//!
//! The orchestrator writes it (on a plugin report, and when the rollout records a derived
//! image) and persists it as JSON; the rollout reads it to group nodes, derive images and
//! render DaemonSets. Both use this one type, so no conversion sits between them.
//!
//! The JSON is camelCase and loading is lenient (missing optional fields default, unknown
//! fields are ignored) so state written by an older or newer orchestrator still loads; the
//! stored shape is the one the first release wrote.
//!
//! ## Plugin groups
//! One kubelet keeps one endpoint per resource name and every vendor registers under the same
//! unified name, so a node with accelerators from two vendors must run *one* plugin process
//! serving both (design §2.1). Nodes are therefore grouped by their *set* of vendors: a node
//! with only NVIDIA devices is in group `nvidia`, one with AMD and NVIDIA devices in group
//! `amd-nvidia`. Each group gets one derived image and one DaemonSet, and every node is in
//! exactly one group.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::bounds::{self, BoundsError};
use crate::config::v1::VendorPluginConfig;
use crate::resource_name::{self, ResourceNameError};

/// The plugin configuration, as persisted.
///
/// `generation` is bumped only on a real change (a new node, vendor, device list, resource
/// name, plugin version or recorded image), so the rollout can key on it and plugins can tell
/// nothing changed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginConfig {
    /// Bumped on every real change; 0 means empty.
    pub generation: u64,
    /// Unified resource name all vendors register under (e.g. `kudos.dev/gpu`); empty until
    /// the first plugin report.
    pub unified_resource_name: String,
    /// Node name → vendor key (`nvidia`, `amd`, …) → what that node's plugin reported.
    pub nodes: BTreeMap<String, BTreeMap<String, VendorEntry>>,
    /// Plugin group name → the image derived for it (by digest). Absent until derived.
    #[serde(default)]
    pub images: BTreeMap<String, DerivedImage>,
}

/// One vendor's plugin on one node, as reported.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VendorEntry {
    /// The vendor's own resource name (e.g. `nvidia.com/gpu`), rewritten to the unified one.
    pub vendor_resource_name: String,
    /// Devices, sorted by ID. Health is not part of the configuration (it flaps), so it never
    /// bumps the generation.
    pub devices: Vec<DeviceRecord>,
    /// The plugin version that reported.
    #[serde(default)]
    pub plugin_version: String,
}

/// One device as reported.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRecord {
    /// Stable, vendor-prefixed ID (`nv-GPU-…`, `amd-0000:03:00.0`).
    pub id: String,
    /// Model name.
    #[serde(default)]
    pub model: String,
    /// Device memory in bytes (0 when unknown).
    #[serde(default)]
    pub memory_bytes: u64,
    /// Vendor UUID or PCI bus ID.
    #[serde(default)]
    pub uuid: String,
    /// NUMA node, when known.
    #[serde(default)]
    pub numa_node: Option<i64>,
}

/// An image derived for a plugin group, recorded in the configuration by digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DerivedImage {
    /// Pullable reference by digest: `registry/repository@sha256:…`.
    pub reference: String,
    /// The manifest digest (`sha256:…`).
    pub digest: String,
    /// The tag it was also pushed under (`<group>-g<generation>`), for humans.
    pub tag: String,
    /// The configuration generation it was derived at.
    pub generation: u64,
    /// The base image it was derived from, as configured.
    pub base_image: String,
    /// `diff_id` (sha256 of the uncompressed tar) of the configuration layer. Equal layers
    /// mean equal plugin configuration, so no re-derivation is needed.
    pub config_layer_diff_id: String,
}

/// A node's device profile derived from its reported devices, as persisted with a run (so a
/// replay observes exactly what was observed live, even if the node's devices changed since).
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

/// A set of nodes sharing one set of vendors: one derived image, one DaemonSet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginGroup {
    /// Group name: the sorted vendor names joined by `-`; the value of
    /// [`crate::labels::PLUGIN_GROUP`].
    pub name: String,
    /// The vendors, sorted.
    pub vendors: Vec<String>,
    /// The nodes in the group, sorted.
    pub nodes: Vec<String>,
}

/// Errors in a plugin configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PluginConfigError {
    /// A vendor name is out of bounds; it becomes part of object names, labels and image tags.
    #[error("node {node:?}: {source}")]
    InvalidVendor {
        /// The node listing it.
        node: String,
        /// Why.
        #[source]
        source: BoundsError,
    },
    /// A node entry lists no vendors; it has nothing for a plugin to serve.
    #[error("node {0:?} lists no vendors")]
    NodeWithoutVendors(String),
    /// The unified resource name breaks the kubelet's rules.
    #[error("unified resource name: {0}")]
    InvalidResourceName(#[source] ResourceNameError),
    /// The plugin group name (vendors joined by `-`) is too long for object names.
    #[error("plugin group: {0}")]
    InvalidGroup(#[source] BoundsError),
}

// === impl VendorEntry ===

impl VendorEntry {
    /// Checks a reported entry of `vendor` against the bounds both ends share: the plugin
    /// checks what it discovered before reporting, the orchestrator what it received.
    pub fn validate(&self, vendor: &str) -> Result<(), BoundsError> {
        bounds::validate_vendor_name(vendor)?;
        if !self.vendor_resource_name.is_empty()
            && resource_name::validate(&self.vendor_resource_name).is_err()
        {
            return Err(BoundsError::Syntax {
                what: "vendor resource name",
                value: self.vendor_resource_name.chars().take(80).collect(),
                expected: "an extended resource name (domain/name)",
            });
        }
        bounds::validate_plugin_version(&self.plugin_version)?;
        bounds::validate_device_count("reported devices", self.devices.len())?;
        for d in &self.devices {
            bounds::validate_device_id(&d.id)?;
            bounds::validate_model_name(&d.model)?;
            bounds::validate_device_uuid(&d.uuid)?;
        }
        Ok(())
    }
}

// === impl PluginConfig ===

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

    /// Forgets `node` (deleted from the cluster); bumps the generation and returns true only if
    /// it was there.
    pub fn remove_node(&mut self, node: &str) -> bool {
        let removed = self.nodes.remove(node).is_some();
        if removed {
            self.generation += 1;
        }
        removed
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
            count: u32::try_from(entry.devices.len()).unwrap_or(u32::MAX),
            memory_bytes,
        })
    }

    /// Checks names that end up in object names, labels, tags and resource names.
    pub fn validate(&self) -> Result<(), PluginConfigError> {
        resource_name::validate(&self.unified_resource_name)
            .map_err(PluginConfigError::InvalidResourceName)?;
        for (node, vendors) in &self.nodes {
            if vendors.is_empty() {
                return Err(PluginConfigError::NodeWithoutVendors(node.clone()));
            }
            for vendor in vendors.keys() {
                bounds::validate_vendor_name(vendor).map_err(|source| {
                    PluginConfigError::InvalidVendor {
                        node: node.clone(),
                        source,
                    }
                })?;
            }
        }
        Ok(())
    }

    /// Splits the nodes into plugin groups by vendor set, sorted by group name.
    pub fn groups(&self) -> Result<Vec<PluginGroup>, PluginConfigError> {
        self.validate()?;
        let mut by_set: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
        for (node, entry) in &self.nodes {
            let vendors: Vec<String> = entry.keys().cloned().collect();
            by_set.entry(vendors).or_default().push(node.clone());
        }
        let mut groups = Vec::with_capacity(by_set.len());
        for (vendors, nodes) in by_set {
            let name = vendors.join("-");
            bounds::validate_plugin_group(&name).map_err(PluginConfigError::InvalidGroup)?;
            groups.push(PluginGroup {
                name,
                vendors,
                nodes,
            });
        }
        groups.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(groups)
    }

    /// The per-vendor plugin configuration files of one group, sorted by vendor. Each lists
    /// only the group's nodes, so the files (and the derived image) change only when this
    /// group's slice of the configuration changes.
    pub fn vendor_configs(&self, group: &PluginGroup) -> Vec<VendorPluginConfig> {
        let members: BTreeSet<&str> = group.nodes.iter().map(String::as_str).collect();
        group
            .vendors
            .iter()
            .map(|vendor| {
                let mut nodes = BTreeMap::new();
                let mut vendor_resource_name = String::new();
                for (node, entry) in &self.nodes {
                    if !members.contains(node.as_str()) {
                        continue;
                    }
                    if let Some(v) = entry.get(vendor) {
                        let mut devices: Vec<_> = v.devices.iter().map(Into::into).collect();
                        devices.sort_by(|a: &crate::config::v1::Device, b| a.id.cmp(&b.id));
                        nodes.insert(node.clone(), devices);
                        if vendor_resource_name.is_empty() {
                            vendor_resource_name.clone_from(&v.vendor_resource_name);
                        }
                    }
                }
                VendorPluginConfig {
                    version: crate::config::v1::Version::V1,
                    vendor: vendor.clone(),
                    vendor_resource_name,
                    unified_resource_name: self.unified_resource_name.clone(),
                    nodes,
                }
            })
            .collect()
    }

    /// Number of devices the configuration lists for a node, over all vendors.
    pub fn device_count(&self, node: &str) -> u64 {
        self.nodes
            .get(node)
            .map_or(0, |e| e.values().map(|v| v.devices.len() as u64).sum())
    }
}

#[cfg(test)]
mod tests;
