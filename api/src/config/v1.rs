//! `v1` of the per-vendor plugin configuration file.
//!
//! The rollout bakes one file per vendor of a plugin group into the derived plugin image, at
//! `$KUDOS_PLUGIN_CONFIG_DIR/<vendor>.json` ([`VendorPluginConfig::file_name`]); the device
//! plugin started from that image reads it with [`VendorPluginConfig::read`]. Writer and
//! reader are the two functions below, so what one writes the other reads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bounds::{self, BoundsError};
use crate::plugin_config::DeviceRecord;
use crate::resource_name::{self, ResourceNameError};

/// The schema version this module reads and writes.
pub const VERSION: &str = "v1";

/// Largest file accepted: far above any real node list, small enough that a wrong path to a
/// large file fails fast instead of filling memory.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// Schema version of a [`VendorPluginConfig`]; only [`Version::V1`] exists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Version {
    /// `v1`; also what a file without `version` is.
    #[default]
    #[serde(rename = "v1")]
    V1,
}

/// One vendor's plugin configuration as carried in a derived image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VendorPluginConfig {
    /// Schema version; `v1` when missing.
    #[serde(default)]
    pub version: Version,
    /// The vendor this file configures (the file is `<vendor>.json`).
    pub vendor: String,
    /// The vendor's own resource name (e.g. `nvidia.com/gpu`).
    pub vendor_resource_name: String,
    /// The unified name to register under.
    pub unified_resource_name: String,
    /// Node → devices the configuration expects the plugin to find there, sorted by ID.
    pub nodes: BTreeMap<String, Vec<Device>>,
}

/// One device the configuration expects on a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// Stable, vendor-prefixed device ID.
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

impl From<&DeviceRecord> for Device {
    fn from(d: &DeviceRecord) -> Self {
        Device {
            id: d.id.clone(),
            model: d.model.clone(),
            memory_bytes: d.memory_bytes,
            uuid: d.uuid.clone(),
            numa_node: d.numa_node,
        }
    }
}

/// Why a per-vendor plugin configuration file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum VendorPluginConfigError {
    /// The file cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error("{path} is {len} bytes, more than {MAX_FILE_BYTES}")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        len: u64,
    },
    /// Not JSON of this schema: a syntax error, an unknown version or an unknown field.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// The file configures another vendor than its name says.
    #[error("{path} configures vendor {found:?}, expected {expected:?}")]
    WrongVendor {
        /// The file.
        path: PathBuf,
        /// The vendor asked for.
        expected: String,
        /// The vendor in the file.
        found: String,
    },
    /// A name or list is out of bounds.
    #[error("{path}: {source}")]
    Bounds {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: BoundsError,
    },
    /// A resource name breaks the kubelet's rules.
    #[error("{path}: {field}: {source}")]
    ResourceName {
        /// The file.
        path: PathBuf,
        /// `vendorResourceName` or `unifiedResourceName`.
        field: &'static str,
        /// The cause.
        #[source]
        source: ResourceNameError,
    },
}

// === impl VendorPluginConfig ===

impl VendorPluginConfig {
    /// The file name of `vendor`'s configuration inside the configuration directory.
    pub fn file_name(vendor: &str) -> String {
        format!("{vendor}.json")
    }

    /// The file's contents as the rollout writes them: pretty JSON and a final newline.
    pub fn to_file_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut body = serde_json::to_vec_pretty(self)?;
        body.push(b'\n');
        Ok(body)
    }

    /// Parses and validates a file's contents; `path` only names the file in errors.
    pub fn from_file_bytes(path: &Path, bytes: &[u8]) -> Result<Self, VendorPluginConfigError> {
        let cfg: Self =
            serde_json::from_slice(bytes).map_err(|source| VendorPluginConfigError::Parse {
                path: path.to_owned(),
                source,
            })?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Reads `dir/<vendor>.json` and checks it configures `vendor`.
    pub fn read(dir: &Path, vendor: &str) -> Result<Self, VendorPluginConfigError> {
        let path = dir.join(Self::file_name(vendor));
        let read = |source| VendorPluginConfigError::Read {
            path: path.clone(),
            source,
        };
        let len = std::fs::metadata(&path).map_err(read)?.len();
        if len > MAX_FILE_BYTES {
            return Err(VendorPluginConfigError::TooLarge { path, len });
        }
        let bytes = std::fs::read(&path).map_err(read)?;
        let cfg = Self::from_file_bytes(&path, &bytes)?;
        if cfg.vendor != vendor {
            return Err(VendorPluginConfigError::WrongVendor {
                path,
                expected: vendor.to_owned(),
                found: cfg.vendor,
            });
        }
        Ok(cfg)
    }

    /// Devices the configuration expects on `node` (empty when the node is not listed).
    pub fn devices_on(&self, node: &str) -> &[Device] {
        self.nodes.get(node).map_or(&[], Vec::as_slice)
    }

    fn validate(&self, path: &Path) -> Result<(), VendorPluginConfigError> {
        let bounds = |source| VendorPluginConfigError::Bounds {
            path: path.to_owned(),
            source,
        };
        let name = |field, source| VendorPluginConfigError::ResourceName {
            path: path.to_owned(),
            field,
            source,
        };
        bounds::validate_vendor_name(&self.vendor).map_err(bounds)?;
        resource_name::validate(&self.unified_resource_name)
            .map_err(|e| name("unifiedResourceName", e))?;
        if !self.vendor_resource_name.is_empty() {
            resource_name::validate(&self.vendor_resource_name)
                .map_err(|e| name("vendorResourceName", e))?;
        }
        for (node, devices) in &self.nodes {
            bounds::validate_node_name(node).map_err(bounds)?;
            bounds::validate_device_count("devices of one node", devices.len()).map_err(bounds)?;
            for d in devices {
                bounds::validate_device_id(&d.id).map_err(bounds)?;
                bounds::validate_model_name(&d.model).map_err(bounds)?;
                bounds::validate_device_uuid(&d.uuid).map_err(bounds)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
