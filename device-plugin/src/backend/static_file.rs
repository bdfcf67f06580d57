//! Any other vendor, described by a versioned JSON file: the devices, the device nodes and the
//! environment a container needs. Unknown versions and fields are rejected, so a typo never
//! silently drops a device.
//!
//! ```json
//! { "version": "v1", "vendor": "acme", "resourceName": "acme.com/npu",
//!   "visibleDevicesEnv": "ACME_VISIBLE_DEVICES",
//!   "devices": [ { "id": "npu0", "model": "Acme N1", "memoryBytes": 17179869184,
//!                  "numaNode": 0, "deviceNodes": ["/dev/acme0"] } ] }
//! ```

use super::{Allocation, BackendError, Device, DeviceBackend, Inventory, Vendor};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileV1 {
    version: String,
    vendor: String,
    resource_name: String,
    #[serde(default)]
    visible_devices_env: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    devices: Vec<DeviceV1>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DeviceV1 {
    id: String,
    #[serde(default)]
    model: String,
    #[serde(default)]
    memory_bytes: u64,
    #[serde(default)]
    numa_node: Option<i64>,
    #[serde(default)]
    uuid: Option<String>,
    #[serde(default)]
    device_nodes: Vec<String>,
}

/// A vendor described by a static file.
#[derive(Debug)]
pub struct StaticBackend {
    inventory: Inventory,
    nodes: HashMap<String, Vec<String>>,
    visible_env: Option<String>,
    env: BTreeMap<String, String>,
}

impl StaticBackend {
    /// Reads and validates the file.
    pub fn load(path: &Path) -> Result<Self, BackendError> {
        let text = std::fs::read_to_string(path).map_err(|source| BackendError::Io {
            what: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses file contents; `what` names the source in errors.
    pub fn parse(text: &str, what: &str) -> Result<Self, BackendError> {
        let invalid = |reason: String| BackendError::Invalid {
            what: what.to_owned(),
            reason,
        };
        let version: serde_json::Value =
            serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        match version.get("version").and_then(|v| v.as_str()) {
            Some("v1") => {}
            Some(v) => return Err(invalid(format!("unknown version {v:?} (supported: v1)"))),
            None => return Err(invalid("missing \"version\" (supported: v1)".into())),
        }
        let file: FileV1 = serde_json::from_value(version).map_err(|e| invalid(e.to_string()))?;
        debug_assert_eq!(file.version, "v1");
        let key = file.vendor.to_ascii_lowercase();
        if key.is_empty()
            || !key.bytes().all(|b| b.is_ascii_alphanumeric())
            || key == "nv"
            || key == "amd"
        {
            return Err(invalid(format!(
                "vendor {:?} must be alphanumeric and not nv/amd",
                file.vendor
            )));
        }
        // The orchestrator refuses reports of vendors out of these bounds (kudos-api).
        kudos_api::bounds::validate_vendor_name(&key).map_err(|e| invalid(e.to_string()))?;
        kudos_api::resource_name::validate(&file.resource_name)
            .map_err(|e| invalid(e.to_string()))?;
        let prefix = format!("{key}-");
        let mut devices = Vec::new();
        let mut nodes = HashMap::new();
        for d in file.devices {
            let id = format!("{prefix}{}", d.id);
            super::validate_device_id(&id, &prefix)?;
            nodes.insert(id.clone(), d.device_nodes);
            devices.push(Device {
                uuid: d.uuid.unwrap_or_else(|| d.id.clone()),
                id,
                vendor: key.clone(),
                model: d.model,
                memory_bytes: d.memory_bytes,
                numa_node: d.numa_node,
                arch: None,
            });
        }
        let vendor = Vendor {
            key,
            resource_name: file.resource_name,
            id_prefix: prefix,
        };
        Ok(StaticBackend {
            inventory: Inventory { vendor, devices },
            nodes,
            visible_env: file.visible_devices_env,
            env: file.env,
        })
    }
}

impl DeviceBackend for StaticBackend {
    fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    fn allocate(&self, devices: &[&Device]) -> Allocation {
        let mut a = Allocation {
            envs: self.env.clone(),
            ..Allocation::default()
        };
        if let Some(var) = &self.visible_env {
            let ids: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
            a.envs.insert(var.clone(), ids.join(","));
        }
        for d in devices {
            for n in self.nodes.get(&d.id).into_iter().flatten() {
                a.device_specs.push((n.clone(), n.clone(), "rw".into()));
            }
        }
        a
    }

    fn probe(&self, device: &Device) -> Result<(), String> {
        for n in self.nodes.get(&device.id).into_iter().flatten() {
            if !Path::new(n).exists() {
                return Err(format!("{n} is missing"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v1_and_rejects_unknown_versions_and_fields() {
        let ok = r#"{"version":"v1","vendor":"acme","resourceName":"acme.com/npu","visibleDevicesEnv":"ACME_VISIBLE",
                     "devices":[{"id":"npu0","model":"N1","numaNode":1,"deviceNodes":["/dev/null"]}]}"#;
        let b = StaticBackend::parse(ok, "t").expect("valid");
        assert_eq!(b.devices()[0].id, "acme-npu0");
        assert_eq!(b.devices()[0].numa_node, Some(1));
        let devs: Vec<&Device> = b.devices().iter().collect();
        let a = b.allocate(&devs);
        assert_eq!(a.envs.get("ACME_VISIBLE").map(String::as_str), Some("npu0"));
        assert_eq!(
            a.device_specs,
            vec![("/dev/null".into(), "/dev/null".into(), "rw".into())]
        );
        assert!(b.probe(&b.devices()[0]).is_ok());

        let v2 = ok.replace("\"v1\"", "\"v2\"");
        assert!(
            StaticBackend::parse(&v2, "t")
                .unwrap_err()
                .to_string()
                .contains("unknown version")
        );
        let extra = ok.replace("\"model\"", "\"modle\"");
        assert!(StaticBackend::parse(&extra, "t").is_err());
        let bad_name = ok.replace("acme.com/npu", "kubernetes.io/npu");
        assert!(StaticBackend::parse(&bad_name, "t").is_err());
        let long = ok.replace("npu0", &"x".repeat(80));
        assert!(StaticBackend::parse(&long, "t").is_err());
    }

    #[test]
    fn vendors_the_orchestrator_would_refuse_are_refused_here() {
        let file = |vendor: &str| {
            format!(
                r#"{{"version":"v1","vendor":"{vendor}","resourceName":"acme.com/npu","devices":[{{"id":"0"}}]}}"#
            )
        };
        assert!(StaticBackend::parse(&file(&"a".repeat(20)), "t").is_ok());
        let Err(e) = StaticBackend::parse(&file(&"a".repeat(21)), "t") else {
            panic!("21 characters accepted")
        };
        assert!(e.to_string().contains("more than 20"), "{e}");
    }
}
