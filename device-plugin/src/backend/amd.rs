//! AMD GPUs through sysfs: `/sys/class/drm/card*` whose PCI vendor is 0x1002, served with
//! `/dev/kfd` and the card's `/dev/dri/renderD*` node. Both roots are configurable so tests
//! run against a fake tree.

use super::{Allocation, BackendError, Device, DeviceBackend, Inventory, Vendor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Device-ID prefix: `amd-<pci-bdf>`.
pub const PREFIX: &str = "amd-";
const AMD_PCI_VENDOR: &str = "0x1002";

/// AMD backend.
#[derive(Debug)]
pub struct AmdBackend {
    inventory: Inventory,
    /// Device ID -> (sysfs device dir, render node name such as `renderD128`).
    nodes: HashMap<String, (PathBuf, String)>,
    dev_root: PathBuf,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BackendError {
    let what = what.into();
    move |source| BackendError::Io { what, source }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned())
}

/// PCI address (`0000:3b:00.0`) → gfx target (`gfx942`) of every GPU node in the KFD topology
/// (`<sys>/class/kfd/kfd/topology/nodes/*/properties`: `gfx_target_version` is
/// major·10000 + minor·100 + stepping, `location_id` is bus·256 + device·8 + function, and
/// `domain` the PCI domain). CPU nodes have version 0 and are skipped; missing files give an
/// empty map (the attribute is then absent).
fn gfx_targets(sys_root: &Path) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let Ok(nodes) = std::fs::read_dir(sys_root.join("class/kfd/kfd/topology/nodes")) else {
        return out;
    };
    for n in nodes.flatten() {
        let Ok(text) = std::fs::read_to_string(n.path().join("properties")) else {
            continue;
        };
        let prop = |key: &str| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse::<u64>().ok())?
            })
        };
        let (Some(version), Some(location)) = (prop("gfx_target_version"), prop("location_id"))
        else {
            continue;
        };
        if version == 0 {
            continue;
        }
        let domain = prop("domain").unwrap_or(0);
        let bdf = format!(
            "{domain:04x}:{:02x}:{:02x}.{:x}",
            location >> 8,
            (location >> 3) & 0x1f,
            location & 0x7
        );
        let gfx = format!(
            "gfx{}{}{:x}",
            version / 10000,
            (version / 100) % 100,
            version % 100
        );
        out.insert(bdf, gfx);
    }
    out
}

impl AmdBackend {
    /// Scans `<sys_root>/class/drm` for AMD cards with a render node. Requires
    /// `<dev_root>/dev/kfd` when any card is found (ROCm cannot run without it).
    pub fn discover(sys_root: &Path, dev_root: &Path) -> Result<Self, BackendError> {
        let drm = sys_root.join("class/drm");
        let gfx_targets = gfx_targets(sys_root);
        let mut entries: Vec<_> = match std::fs::read_dir(&drm) {
            Ok(rd) => rd
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io(drm.display().to_string())(e)),
        };
        entries.sort();
        let mut devices = Vec::new();
        let mut nodes = HashMap::new();
        for name in entries {
            // card0, card1 ... but not card0-DP-1 connectors.
            if !name
                .strip_prefix("card")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            {
                continue;
            }
            let dev_dir = drm.join(&name).join("device");
            if read_trim(&dev_dir.join("vendor")).as_deref() != Some(AMD_PCI_VENDOR) {
                continue;
            }
            let bdf = std::fs::canonicalize(&dev_dir)
                .map_err(io(dev_dir.display().to_string()))?
                .file_name()
                .map(|s| s.to_string_lossy().to_ascii_lowercase())
                .unwrap_or_default();
            let render = std::fs::read_dir(dev_dir.join("drm"))
                .map_err(io(format!("{}/drm", dev_dir.display())))?
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|n| n.starts_with("renderD"));
            let Some(render) = render else {
                tracing::warn!(card = %name, "AMD card without a render node; skipping");
                continue;
            };
            let id = format!("{PREFIX}{bdf}");
            let model = read_trim(&dev_dir.join("product_name"))
                .filter(|s| !s.is_empty())
                .or_else(|| read_trim(&dev_dir.join("device")).map(|d| format!("AMD GPU {d}")))
                .unwrap_or_else(|| "AMD GPU".into());
            let memory_bytes = read_trim(&dev_dir.join("mem_info_vram_total"))
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let numa_node = read_trim(&dev_dir.join("numa_node"))
                .and_then(|s| s.parse::<i64>().ok())
                .filter(|n| *n >= 0);
            let uuid = read_trim(&dev_dir.join("unique_id"))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| bdf.clone());
            nodes.insert(id.clone(), (dev_dir.clone(), render));
            let arch = gfx_targets.get(&bdf).cloned().map(super::Arch::Gfx);
            devices.push(Device {
                id,
                vendor: "amd".into(),
                model,
                memory_bytes,
                uuid,
                numa_node,
                arch,
            });
        }
        if !devices.is_empty() {
            let kfd = dev_root.join("dev/kfd");
            if !kfd.exists() {
                return Err(BackendError::Invalid {
                    what: kfd.display().to_string(),
                    reason: "AMD GPUs found but /dev/kfd is missing (is the amdgpu driver loaded?)"
                        .into(),
                });
            }
        }
        let vendor = Vendor {
            key: "amd".into(),
            resource_name: "amd.com/gpu".into(),
            id_prefix: PREFIX.into(),
        };
        Ok(AmdBackend {
            inventory: Inventory { vendor, devices },
            nodes,
            dev_root: dev_root.to_owned(),
        })
    }
}

impl DeviceBackend for AmdBackend {
    fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    fn allocate(&self, devices: &[&Device]) -> Allocation {
        let mut a = Allocation::default();
        let host = |p: &str| {
            self.dev_root
                .join(p.trim_start_matches('/'))
                .to_string_lossy()
                .into_owned()
        };
        a.device_specs
            .push((host("/dev/kfd"), "/dev/kfd".into(), "rw".into()));
        for d in devices {
            if let Some((_, render)) = self.nodes.get(&d.id) {
                let p = format!("/dev/dri/{render}");
                a.device_specs.push((host(&p), p, "rw".into()));
            }
        }
        a
    }

    fn probe(&self, device: &Device) -> Result<(), String> {
        match self.nodes.get(&device.id) {
            Some((dir, _)) if dir.join("vendor").exists() => Ok(()),
            Some((dir, _)) => Err(format!("{} vanished", dir.display())),
            None => Err("unknown device".into()),
        }
    }
}

#[cfg(test)]
mod gfx_tests {
    use super::gfx_targets;

    #[test]
    fn gfx_targets_come_from_the_kfd_topology_by_pci_address() {
        let sys = tempfile::tempdir().expect("tempdir");
        let nodes = sys.path().join("class/kfd/kfd/topology/nodes");
        for (n, props) in [
            (
                "0",
                "cpu_cores_count 64\ngfx_target_version 0\nlocation_id 0\n",
            ),
            (
                "1",
                "gfx_target_version 90402\nlocation_id 15104\ndomain 0\n",
            ),
            (
                "2",
                "gfx_target_version 100300\nlocation_id 49408\ndomain 1\n",
            ),
            ("3", "garbage\n"),
        ] {
            std::fs::create_dir_all(nodes.join(n)).expect("mkdir");
            std::fs::write(nodes.join(n).join("properties"), props).expect("write");
        }
        let t = gfx_targets(sys.path());
        assert_eq!(t.len(), 2, "{t:?}");
        assert_eq!(t["0000:3b:00.0"], "gfx942");
        assert_eq!(t["0001:c1:00.0"], "gfx1030");
        assert!(gfx_targets(&sys.path().join("none")).is_empty());
    }
}
