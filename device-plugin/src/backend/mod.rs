//! Discovery backends behind one trait, so the kubelet-facing server never knows which vendor
//! it serves (NVIDIA's k8s-device-plugin `ResourceManager` seam, applied to several vendors in
//! one process).
//!
//! ```text
//!   NvidiaBackend (kudos-nvml) ─┐
//!   AmdBackend (sysfs)        ──┼─> Backends (dispatch by ID prefix) ─> server / health / registry
//!   StaticBackend (file)      ──┤
//!   FakeBackend (tests)       ──┘
//! ```
//!
//! Device IDs are `<prefix><vendor id>`, at most 63 characters, so the owning backend of any
//! ID served to the kubelet is found from its prefix alone.

pub mod amd;
#[cfg(test)]
pub(crate) mod fake;
pub mod nvidia;
pub mod static_file;

use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::mpsc;

use kudos_api::bounds::MAX_DEVICE_ID_LEN;

/// Errors from backends.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// NVML failed.
    #[error(transparent)]
    Nvml(#[from] kudos_nvml::Error),
    /// Reading sysfs, /dev or a configuration file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being read.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A configuration file is invalid.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// The file or field.
        what: String,
        /// Why.
        reason: String,
    },
}

/// Static facts about a vendor, reported to the orchestrator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vendor {
    /// Lower-case key, e.g. `nvidia`.
    pub key: String,
    /// The vendor plugin's own resource name, e.g. `nvidia.com/gpu`.
    pub resource_name: String,
    /// Device-ID prefix, e.g. `nv-`.
    pub id_prefix: String,
}

/// What one backend serves: its vendor and the devices discovered at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inventory {
    /// The vendor served.
    pub vendor: Vendor,
    /// The devices, as discovered at start.
    pub devices: Vec<Device>,
}

/// One device as discovered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// Stable, vendor-prefixed ID served to the kubelet.
    pub id: String,
    /// Vendor key of the owning backend.
    pub vendor: String,
    /// Model name.
    pub model: String,
    /// Device memory in bytes (0 when unknown).
    pub memory_bytes: u64,
    /// Vendor UUID, or PCI bus ID when the vendor has none.
    pub uuid: String,
    /// NUMA node, when known.
    pub numa_node: Option<i64>,
    /// What a kernel must be built for, when the driver says.
    pub arch: Option<Arch>,
}

/// The instruction set a device runs: what a workload image must have been compiled for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arch {
    /// NVIDIA CUDA compute capability (major, minor), e.g. 9.0 for H100.
    Cuda(u32, u32),
    /// AMD gfx target, e.g. `gfx942` for MI300X.
    Gfx(String),
}

/// Health as the kubelet sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Health {
    /// Allocatable.
    Healthy,
    /// Must not be allocated.
    Unhealthy,
}

impl Health {
    /// The v1beta1 wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => kudos_proto::deviceplugin::v1beta1::HEALTHY,
            Health::Unhealthy => kudos_proto::deviceplugin::v1beta1::UNHEALTHY,
        }
    }
}

/// What one container gets for the devices of one backend; merged across backends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allocation {
    /// Environment variables.
    pub envs: BTreeMap<String, String>,
    /// Device nodes: (host path, container path, permissions).
    pub device_specs: Vec<(String, String, String)>,
    /// CDI fully-qualified device names.
    pub cdi_devices: Vec<String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
}

impl Allocation {
    /// Adds `other`, keeping the first of duplicate device nodes and CDI names.
    pub fn merge(&mut self, other: Allocation) {
        self.envs.extend(other.envs);
        self.annotations.extend(other.annotations);
        for spec in other.device_specs {
            if !self.device_specs.iter().any(|s| s.0 == spec.0) {
                self.device_specs.push(spec);
            }
        }
        for name in other.cdi_devices {
            if !self.cdi_devices.contains(&name) {
                self.cdi_devices.push(name);
            }
        }
    }
}

/// A signal from a backend's own health source (NVML events); the health tracker turns
/// signals and probes into transitions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HealthSignal {
    /// A critical event on one device (e.g. a non-ignored XID).
    Critical {
        /// Device ID.
        id: String,
        /// Human-readable cause, for logs.
        reason: String,
    },
    /// The backend's management library stopped answering: every device of `vendor` is
    /// suspect.
    BackendDown {
        /// Vendor key.
        vendor: String,
        /// Cause.
        reason: String,
    },
}

/// Keeps a backend's health source running; dropping it stops the source.
pub type HealthGuard = Box<dyn Send + Sync>;

/// One vendor's discovery, allocation and health. Implementations do blocking work only in
/// `discover`, `probe` and `watch` setup; `allocate` and `link_cost` must be cheap, as they
/// run on the kubelet's admission path.
pub trait DeviceBackend: Send + Sync + 'static {
    /// The vendor served and its devices.
    fn inventory(&self) -> &Inventory;

    /// The vendor served.
    fn vendor(&self) -> &Vendor {
        &self.inventory().vendor
    }

    /// The devices, as discovered at start.
    fn devices(&self) -> &[Device] {
        &self.inventory().devices
    }

    /// What a container needs to use `devices` (all owned by this backend, already
    /// validated as known and healthy).
    fn allocate(&self, devices: &[&Device]) -> Allocation;

    /// Cost of putting `a` and `b` in one container: lower is better. The default uses NUMA
    /// nodes only.
    fn link_cost(&self, a: &Device, b: &Device) -> u32 {
        match (a.numa_node, b.numa_node) {
            _ if a.id == b.id => 0,
            (Some(x), Some(y)) if x == y => 50,
            _ => 60,
        }
    }

    /// Checks that the device answers; `Err` carries the reason. Called periodically.
    fn probe(&self, device: &Device) -> Result<(), String>;

    /// Starts the backend's event source (if any), sending signals to `tx`.
    fn watch(
        &self,
        tx: mpsc::UnboundedSender<HealthSignal>,
    ) -> Result<Option<HealthGuard>, BackendError> {
        let _ = tx;
        Ok(None)
    }
}

/// Checks the ID rules every backend must meet.
pub fn validate_device_id(id: &str, prefix: &str) -> Result<(), BackendError> {
    // The same bounds the orchestrator checks when the plugin reports (kudos-api).
    let ok = id.starts_with(prefix)
        && id.len() > prefix.len()
        && kudos_api::bounds::validate_device_id(id).is_ok();
    if ok {
        Ok(())
    } else {
        Err(BackendError::Invalid {
            what: format!("device ID {id:?}"),
            reason: format!(
                "must start with {prefix:?}, be at most {MAX_DEVICE_ID_LEN} characters of [A-Za-z0-9-_.:]"
            ),
        })
    }
}

// === impl Backends ===

/// All backends of this node, with lookup by device ID.
#[derive(Clone)]
pub struct Backends {
    backends: Arc<Vec<Arc<dyn DeviceBackend>>>,
    index: Arc<BTreeMap<String, (usize, usize)>>,
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.backends.iter().map(|b| &b.vendor().key))
            .finish()
    }
}

impl Backends {
    /// Combines backends. Fails when prefixes overlap or an ID is invalid or duplicated.
    pub fn new(backends: Vec<Arc<dyn DeviceBackend>>) -> Result<Self, BackendError> {
        let mut index = BTreeMap::new();
        for (bi, b) in backends.iter().enumerate() {
            // What the orchestrator checks on every report, checked once here (kudos-api).
            let vendor = &b.vendor().key;
            let bounds = |e: kudos_api::BoundsError| BackendError::Invalid {
                what: format!("vendor {vendor:?}"),
                reason: e.to_string(),
            };
            kudos_api::bounds::validate_vendor_name(vendor).map_err(bounds)?;
            kudos_api::bounds::validate_device_count("devices", b.devices().len())
                .map_err(bounds)?;
            for d in b.devices() {
                kudos_api::bounds::validate_model_name(&d.model).map_err(bounds)?;
                kudos_api::bounds::validate_device_uuid(&d.uuid).map_err(bounds)?;
            }
            let prefix = &b.vendor().id_prefix;
            for (oi, o) in backends.iter().enumerate() {
                let other = &o.vendor().id_prefix;
                if bi != oi
                    && (other.starts_with(prefix.as_str()) || prefix.starts_with(other.as_str()))
                {
                    return Err(BackendError::Invalid {
                        what: "backends".into(),
                        reason: format!("ID prefixes {prefix:?} and {other:?} overlap"),
                    });
                }
            }
            for (di, d) in b.devices().iter().enumerate() {
                validate_device_id(&d.id, prefix)?;
                if index.insert(d.id.clone(), (bi, di)).is_some() {
                    return Err(BackendError::Invalid {
                        what: format!("device ID {:?}", d.id),
                        reason: "discovered twice".into(),
                    });
                }
            }
        }
        Ok(Backends {
            backends: Arc::new(backends),
            index: Arc::new(index),
        })
    }

    /// Every backend.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn DeviceBackend>> {
        self.backends.iter()
    }

    /// Every device of every backend, in backend then discovery order.
    pub fn devices(&self) -> impl Iterator<Item = &Device> {
        self.backends.iter().flat_map(|b| b.devices().iter())
    }

    /// The device with this ID and its backend.
    pub fn lookup(&self, id: &str) -> Option<(&Arc<dyn DeviceBackend>, &Device)> {
        let &(bi, di) = self.index.get(id)?;
        let b = &self.backends[bi];
        Some((b, &b.devices()[di]))
    }

    /// Link cost between two known devices; devices of different vendors cost the most.
    pub fn link_cost(&self, a: &str, b: &str) -> u32 {
        match (self.index.get(a), self.index.get(b)) {
            (Some(&(ba, da)), Some(&(bb, db))) if ba == bb => {
                let backend = &self.backends[ba];
                backend.link_cost(&backend.devices()[da], &backend.devices()[db])
            }
            _ => 1000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_is_held_to_the_bounds_the_orchestrator_checks() {
        let ok: Arc<dyn DeviceBackend> = Arc::new(fake::FakeBackend::new(&"v".repeat(20), 2, 1));
        assert!(Backends::new(vec![ok]).is_ok());
        let long: Arc<dyn DeviceBackend> = Arc::new(fake::FakeBackend::new(&"v".repeat(21), 2, 1));
        let Err(e) = Backends::new(vec![long]) else {
            panic!("21-character vendor accepted")
        };
        assert!(e.to_string().contains("more than 20"), "{e}");
        let many: Arc<dyn DeviceBackend> = Arc::new(fake::FakeBackend::new("many", 257, 1));
        assert!(Backends::new(vec![many]).is_err());
    }
}
