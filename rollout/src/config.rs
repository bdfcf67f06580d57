//! The rollout's view of the plugin configuration, and how it splits into plugin groups.
//!
//! The orchestrator owns the real, versioned, persisted plugin configuration; this crate only
//! reads a [`PluginConfigView`] of it, so the two can evolve apart. The view is
//! `node → vendor → devices` plus the configuration generation and the derived image each
//! plugin group runs.
//!
//! ## Plugin groups
//! One kubelet keeps one endpoint per resource name and every vendor registers under the same
//! unified name, so a node with accelerators from two vendors must run *one* plugin process
//! serving both (design §2.1). Nodes are therefore grouped by their *set* of vendors: a node
//! with only NVIDIA devices is in group `nvidia`, one with AMD and NVIDIA devices in group
//! `amd-nvidia`. In the common case (one vendor per node) a group is exactly a vendor. Each
//! group gets one derived image and one DaemonSet, and every node is in exactly one group.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Longest vendor name accepted; keeps DaemonSet and pod names inside 63 characters.
pub const MAX_VENDOR_LEN: usize = 20;

/// Errors in a plugin configuration view.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A vendor name is not a lowercase DNS label of at most [`MAX_VENDOR_LEN`] characters;
    /// it becomes part of object names, labels and image tags.
    #[error(
        "vendor name {0:?} must be a lowercase DNS label of at most {MAX_VENDOR_LEN} characters"
    )]
    InvalidVendor(String),
    /// A node entry lists no vendors; it has nothing for a plugin to serve.
    #[error("node {0:?} lists no vendors")]
    NodeWithoutVendors(String),
    /// The unified resource name is empty or not of the form `domain/name`.
    #[error("unified resource name {0:?} is not of the form domain/name")]
    InvalidResourceName(String),
    /// The plugin group name (vendors joined by `-`) is too long for object names.
    #[error("plugin group {0:?} is longer than 40 characters")]
    GroupNameTooLong(String),
}

/// The rollout's input: a read-only view of the orchestrator's plugin configuration.
///
/// Wiring: the orchestrator converts its own configuration type into this one (field for
/// field) whenever the configuration changes, and stores back the [`DerivedImage`]s that
/// [`crate::ImageDeriver`] returns into its own configuration, so that the next view carries
/// them in [`PluginConfigView::images`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginConfigView {
    /// The configuration generation; increases with every change.
    pub generation: u64,
    /// The unified resource name every plugin registers under (e.g. `kudos.dev/gpu`).
    pub unified_resource_name: String,
    /// Node name → vendor name (`nvidia`, `amd`, …) → what the node's plugin reported.
    pub nodes: BTreeMap<String, BTreeMap<String, VendorEntry>>,
    /// Plugin group name → the image derived for it (by digest). Absent until derived.
    #[serde(default)]
    pub images: BTreeMap<String, DerivedImage>,
}

/// What a node's plugin reported for one vendor.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VendorEntry {
    /// The vendor's own resource name, rewritten to the unified one (e.g. `nvidia.com/gpu`).
    pub vendor_resource_name: String,
    /// The plugin version that reported.
    #[serde(default)]
    pub plugin_version: String,
    /// The devices reported.
    pub devices: Vec<DeviceEntry>,
}

/// One reported device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceEntry {
    /// Stable, vendor-prefixed device ID (`nv-GPU-…`, `amd-0000:03:00.0`).
    pub id: String,
    /// Model name.
    #[serde(default)]
    pub model: String,
    /// Device memory in bytes.
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
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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

/// A set of nodes sharing one set of vendors: one derived image, one DaemonSet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginGroup {
    /// Group name: the sorted vendor names joined by `-`.
    pub name: String,
    /// The vendors, sorted.
    pub vendors: Vec<String>,
    /// The nodes in the group, sorted.
    pub nodes: Vec<String>,
}

/// Plugin configuration file carried in a derived image, one per vendor (`version: v1`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VendorPluginConfig {
    /// Schema version of this file; `v1`.
    pub version: String,
    /// The vendor this file configures.
    pub vendor: String,
    /// The vendor's own resource name.
    pub vendor_resource_name: String,
    /// The unified name to register under.
    pub unified_resource_name: String,
    /// Node → devices the configuration expects the plugin to find there.
    pub nodes: BTreeMap<String, Vec<DeviceEntry>>,
}

// === impl PluginConfigView ===

impl PluginConfigView {
    /// Converts any serializable configuration with this JSON shape (e.g. the orchestrator's
    /// `PluginConfig`, optionally extended with `images`) into a view. Unknown fields are
    /// ignored, a missing `images` is empty.
    pub fn from_config<T: Serialize>(config: &T) -> Result<Self, serde_json::Error> {
        serde_json::from_value(serde_json::to_value(config)?)
    }

    /// Checks names that end up in object names, labels, tags and resource names.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let r = &self.unified_resource_name;
        match r.split_once('/') {
            Some((d, n)) if !d.is_empty() && !n.is_empty() && !n.contains('/') => {}
            _ => return Err(ConfigError::InvalidResourceName(r.clone())),
        }
        for (node, vendors) in &self.nodes {
            if vendors.is_empty() {
                return Err(ConfigError::NodeWithoutVendors(node.clone()));
            }
            for vendor in vendors.keys() {
                if !is_vendor_name(vendor) {
                    return Err(ConfigError::InvalidVendor(vendor.clone()));
                }
            }
        }
        Ok(())
    }

    /// Splits the nodes into plugin groups by vendor set, sorted by group name.
    pub fn groups(&self) -> Result<Vec<PluginGroup>, ConfigError> {
        self.validate()?;
        let mut by_set: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
        for (node, entry) in &self.nodes {
            let vendors: Vec<String> = entry.keys().cloned().collect();
            by_set.entry(vendors).or_default().push(node.clone());
        }
        let mut groups = Vec::with_capacity(by_set.len());
        for (vendors, nodes) in by_set {
            let name = vendors.join("-");
            if name.len() > 40 {
                return Err(ConfigError::GroupNameTooLong(name));
            }
            groups.push(PluginGroup {
                name,
                vendors,
                nodes,
            });
        }
        groups.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(groups)
    }

    /// The plugin configuration files of one group's vendors, sorted by vendor. Each lists
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
                        let mut devices = v.devices.clone();
                        devices.sort_by(|a, b| a.id.cmp(&b.id));
                        nodes.insert(node.clone(), devices);
                        if vendor_resource_name.is_empty() {
                            vendor_resource_name.clone_from(&v.vendor_resource_name);
                        }
                    }
                }
                VendorPluginConfig {
                    version: "v1".into(),
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

/// A lowercase DNS label of at most [`MAX_VENDOR_LEN`] characters.
pub fn is_vendor_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_VENDOR_LEN
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn mk_device(id: &str) -> DeviceEntry {
        DeviceEntry {
            id: id.into(),
            model: "model".into(),
            memory_bytes: 16 << 30,
            uuid: format!("uuid-{id}"),
            numa_node: Some(0),
        }
    }

    /// `n1`, `n2`: nvidia; `n3`: amd; `n4`: amd + nvidia.
    pub(crate) fn mk_view() -> PluginConfigView {
        let nv = |ids: &[&str]| VendorEntry {
            vendor_resource_name: "nvidia.com/gpu".into(),
            plugin_version: "0.1.0".into(),
            devices: ids.iter().map(|i| mk_device(i)).collect(),
        };
        let amd = |ids: &[&str]| VendorEntry {
            vendor_resource_name: "amd.com/gpu".into(),
            plugin_version: "0.1.0".into(),
            devices: ids.iter().map(|i| mk_device(i)).collect(),
        };
        let mut nodes = BTreeMap::new();
        nodes.insert(
            "n2".into(),
            [("nvidia".into(), nv(&["nv-GPU-b", "nv-GPU-a"]))].into(),
        );
        nodes.insert("n1".into(), [("nvidia".into(), nv(&["nv-GPU-c"]))].into());
        nodes.insert(
            "n3".into(),
            [("amd".into(), amd(&["amd-0000:03:00.0"]))].into(),
        );
        nodes.insert(
            "n4".into(),
            [
                ("amd".into(), amd(&["amd-0000:04:00.0"])),
                ("nvidia".into(), nv(&["nv-GPU-d"])),
            ]
            .into(),
        );
        PluginConfigView {
            generation: 7,
            unified_resource_name: "kudos.dev/gpu".into(),
            nodes,
            images: BTreeMap::new(),
        }
    }

    #[test]
    fn converts_from_the_orchestrators_json_shape() {
        let orchestrator = serde_json::json!({
            "generation": 3,
            "unifiedResourceName": "kudos.dev/gpu",
            "nodes": {"n1": {"nvidia": {
                "vendorResourceName": "nvidia.com/gpu",
                "devices": [{"id": "nv-GPU-1", "model": "A100", "memoryBytes": 1,
                             "uuid": "GPU-1", "numaNode": null, "futureField": true}],
                "pluginVersion": "0.1.0"}}}
        });
        let v = PluginConfigView::from_config(&orchestrator).unwrap();
        assert_eq!(v.generation, 3);
        assert!(v.images.is_empty());
        assert_eq!(v.nodes["n1"]["nvidia"].devices[0].uuid, "GPU-1");
        assert_eq!(v.groups().unwrap()[0].name, "nvidia");
        let back = PluginConfigView::from_config(&v).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn groups_by_vendor_set_each_node_once() {
        let groups = mk_view().groups().unwrap();
        let names: Vec<_> = groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["amd", "amd-nvidia", "nvidia"]);
        assert_eq!(groups[0].nodes, ["n3"]);
        assert_eq!(groups[1].nodes, ["n4"]);
        assert_eq!(groups[1].vendors, ["amd", "nvidia"]);
        assert_eq!(groups[2].nodes, ["n1", "n2"]);
    }

    #[test]
    fn rejects_bad_vendor_and_resource_names() {
        let mut v = mk_view();
        v.unified_resource_name = "gpu".into();
        assert!(matches!(
            v.validate(),
            Err(ConfigError::InvalidResourceName(_))
        ));
        let mut v = mk_view();
        v.nodes
            .get_mut("n1")
            .unwrap()
            .insert("NVIDIA".into(), VendorEntry::default());
        assert_eq!(
            v.validate(),
            Err(ConfigError::InvalidVendor("NVIDIA".into()))
        );
        let mut v = mk_view();
        v.nodes.insert("n9".into(), BTreeMap::new());
        assert_eq!(
            v.validate(),
            Err(ConfigError::NodeWithoutVendors("n9".into()))
        );
    }

    #[test]
    fn vendor_configs_cover_only_group_nodes_sorted() {
        let v = mk_view();
        let groups = v.groups().unwrap();
        let nvidia = v.vendor_configs(&groups[2]);
        assert_eq!(nvidia.len(), 1);
        assert_eq!(nvidia[0].nodes.keys().collect::<Vec<_>>(), ["n1", "n2"]);
        let ids: Vec<_> = nvidia[0].nodes["n2"]
            .iter()
            .map(|d| d.id.as_str())
            .collect();
        assert_eq!(ids, ["nv-GPU-a", "nv-GPU-b"]);
        assert_eq!(nvidia[0].vendor_resource_name, "nvidia.com/gpu");
        let mixed = v.vendor_configs(&groups[1]);
        assert_eq!(
            mixed.iter().map(|c| c.vendor.as_str()).collect::<Vec<_>>(),
            ["amd", "nvidia"]
        );
        assert!(mixed.iter().all(|c| c.nodes.keys().eq(["n4"].iter())));
    }
}
