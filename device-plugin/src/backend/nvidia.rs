//! NVIDIA GPUs through kudos-nvml: discovery, topology-aware link costs, XID health.

use super::{
    Allocation, BackendError, Device, DeviceBackend, HealthGuard, HealthSignal, Inventory, Vendor,
};
use crate::health::XidIgnoreList;
use kudos_nvml::{Event, Nvml};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;

/// Device-ID prefix: `nv-GPU-<uuid>`.
pub const PREFIX: &str = "nv-";

/// How the NVIDIA backend is set up.
#[derive(Clone, Debug)]
pub struct NvidiaOptions {
    /// NVML library path; `None` = `libnvidia-ml.so.1` through the loader.
    pub library: Option<PathBuf>,
    /// Pass `/dev/nvidia*` device nodes in `Allocate`.
    pub device_specs: bool,
    /// Root under which device nodes live on the host (normally `/`), for `device_specs`.
    pub dev_root: PathBuf,
    /// Pass CDI names `nvidia.com/gpu=<uuid>` in `Allocate`.
    pub cdi: bool,
    /// XIDs that do not make a device unhealthy.
    pub ignored_xids: XidIgnoreList,
}

/// NVIDIA backend.
pub struct NvidiaBackend {
    nvml: Nvml,
    inventory: Inventory,
    minors: HashMap<String, u32>,
    /// Pairwise link cost by device-ID pair, computed once: topology does not change.
    costs: HashMap<(String, String), u32>,
    options: NvidiaOptions,
}

impl NvidiaBackend {
    /// Loads NVML and discovers every GPU. A GPU that cannot describe itself is skipped with
    /// a warning rather than taking the node's other GPUs down with it.
    pub fn discover(options: NvidiaOptions) -> Result<Self, BackendError> {
        let nvml = Nvml::init(options.library.as_deref())?;
        let mut devices = Vec::new();
        let mut minors = HashMap::new();
        for i in 0..nvml.device_count()? {
            let info = match nvml.device_info(i) {
                Ok(info) => info,
                Err(e) => {
                    tracing::warn!(index = i, error = %e, "skipping an NVIDIA GPU that cannot be described");
                    continue;
                }
            };
            let id = format!("{PREFIX}{}", info.uuid);
            if let Some(m) = info.minor_number {
                minors.insert(id.clone(), m);
            }
            devices.push(Device {
                id,
                vendor: "nvidia".into(),
                model: info.name,
                memory_bytes: info.memory_total_bytes,
                uuid: info.uuid,
                numa_node: info.numa_node.map(i64::from),
                arch: info
                    .compute_capability
                    .map(|(major, minor)| super::Arch::Cuda(major, minor)),
            });
        }
        let mut costs = HashMap::new();
        for a in &devices {
            for b in &devices {
                if a.id < b.id {
                    match nvml.interconnect(&a.uuid, &b.uuid) {
                        Ok(link) => {
                            costs.insert((a.id.clone(), b.id.clone()), link.cost());
                        }
                        Err(e) => tracing::debug!(error = %e, "no NVML topology; using NUMA nodes"),
                    }
                }
            }
        }
        let vendor = Vendor {
            key: "nvidia".into(),
            resource_name: "nvidia.com/gpu".into(),
            id_prefix: PREFIX.into(),
        };
        Ok(NvidiaBackend {
            nvml,
            inventory: Inventory { vendor, devices },
            minors,
            costs,
            options,
        })
    }

    fn uuid_of<'a>(&'a self, id: &'a str) -> &'a str {
        id.strip_prefix(PREFIX).unwrap_or(id)
    }
}

fn dev_path(root: &std::path::Path, name: &str) -> String {
    root.join(name.trim_start_matches('/'))
        .to_string_lossy()
        .into_owned()
}

impl DeviceBackend for NvidiaBackend {
    fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    fn allocate(&self, devices: &[&Device]) -> Allocation {
        let mut a = Allocation::default();
        let uuids: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
        a.envs
            .insert("NVIDIA_VISIBLE_DEVICES".into(), uuids.join(","));
        if self.options.device_specs {
            let root = &self.options.dev_root;
            let mut nodes: Vec<String> = vec!["/dev/nvidiactl".into()];
            for extra in ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] {
                if root.join(extra.trim_start_matches('/')).exists() {
                    nodes.push(extra.into());
                }
            }
            for d in devices {
                if let Some(m) = self.minors.get(&d.id) {
                    nodes.push(format!("/dev/nvidia{m}"));
                }
            }
            for n in nodes {
                a.device_specs.push((dev_path(root, &n), n, "rw".into()));
            }
        }
        if self.options.cdi {
            a.cdi_devices
                .extend(uuids.iter().map(|u| format!("nvidia.com/gpu={u}")));
        }
        a
    }

    fn link_cost(&self, a: &Device, b: &Device) -> u32 {
        if a.id == b.id {
            return 0;
        }
        let key = if a.id < b.id {
            (a.id.clone(), b.id.clone())
        } else {
            (b.id.clone(), a.id.clone())
        };
        match self.costs.get(&key) {
            Some(&c) => c,
            None => match (a.numa_node, b.numa_node) {
                (Some(x), Some(y)) if x == y => 50,
                _ => 60,
            },
        }
    }

    fn probe(&self, device: &Device) -> Result<(), String> {
        self.nvml
            .check(self.uuid_of(&device.id))
            .map_err(|e| e.to_string())
    }

    fn watch(
        &self,
        tx: mpsc::UnboundedSender<HealthSignal>,
    ) -> Result<Option<HealthGuard>, BackendError> {
        let uuids: Vec<String> = self
            .inventory
            .devices
            .iter()
            .map(|d| d.uuid.clone())
            .collect();
        let ignored = self.options.ignored_xids.clone();
        let watcher = self
            .nvml
            .watch_xid(&uuids, Duration::from_millis(500), move |event| {
                let signal = match event {
                    Event::Xid(x) if ignored.ignores(x.xid) => {
                        tracing::info!(uuid = %x.uuid, xid = x.xid, "ignoring application XID");
                        return;
                    }
                    Event::Xid(x) if x.uuid.is_empty() => HealthSignal::BackendDown {
                        vendor: "nvidia".into(),
                        reason: format!("XID {} on an unnamed device", x.xid),
                    },
                    Event::Xid(x) => HealthSignal::Critical {
                        id: format!("{PREFIX}{}", x.uuid),
                        reason: format!("XID {}", x.xid),
                    },
                    Event::WaitFailed(e) => HealthSignal::BackendDown {
                        vendor: "nvidia".into(),
                        reason: e.to_string(),
                    },
                    Event::WaitRecovered => return,
                };
                let _ = tx.send(signal);
            })?;
        Ok(Some(Box::new(watcher)))
    }
}
