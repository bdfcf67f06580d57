//! CDI (Container Device Interface) spec files: how a prepared claim reaches the container.
//!
//! The kubelet passes the CDI device IDs NodePrepareResources answers to the container runtime,
//! which looks them up in the spec files under `--cdi-root` (`/var/run/cdi`) and applies their
//! container edits (device nodes, environment). One file per claim
//! (`gpu.kudos.dev-<claim uid>.json`), one CDI device per (claim, device):
//! `gpu.kudos.dev/gpu=<claim uid>-<device name>`. The edits come from the same per-backend
//! [`Allocation`] the device-plugin `Allocate` answers, so no vendor logic is repeated here.

use crate::backend::Allocation;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The CDI specification version written (device annotations need 0.6.0).
pub const CDI_VERSION: &str = "0.6.0";
/// The CDI kind (`<vendor>/<class>`) of every device this plugin writes.
pub const KIND: &str = "gpu.kudos.dev/gpu";

/// A CDI spec file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// CDI version.
    pub cdi_version: String,
    /// `<vendor>/<class>`.
    pub kind: String,
    /// The devices.
    pub devices: Vec<CdiDevice>,
}

/// One CDI device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CdiDevice {
    /// Name, unique in the kind.
    pub name: String,
    /// Annotations from the backend's allocation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// What the runtime changes in the container.
    pub container_edits: ContainerEdits,
}

/// Container edits of one device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// `KEY=VALUE` environment entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
}

/// A device node: `path` in the container, `host_path` on the host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host.
    pub host_path: String,
    /// cgroup permissions (`rw`, `rwm`).
    pub permissions: String,
}

/// The CDI device name of `device` in the claim `claim_uid`.
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The fully qualified CDI device ID (`gpu.kudos.dev/gpu=<name>`) the kubelet passes on.
pub fn qualified(name: &str) -> String {
    format!("{KIND}={name}")
}

/// One CDI device: the environment and annotations of its request's allocation `group`
/// (identical for every device of the request, so several of them in one container agree),
/// the device nodes of its own allocation `own`.
pub fn device(name: String, group: &Allocation, own: &Allocation) -> CdiDevice {
    CdiDevice {
        name,
        annotations: group.annotations.clone(),
        container_edits: ContainerEdits {
            env: group.envs.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            device_nodes: own
                .device_specs
                .iter()
                .map(|(host, container, permissions)| DeviceNode {
                    path: container.clone(),
                    host_path: host.clone(),
                    permissions: permissions.clone(),
                })
                .collect(),
        },
    }
}

/// A spec of `devices`.
pub fn spec(devices: Vec<CdiDevice>) -> Spec {
    Spec {
        cdi_version: CDI_VERSION.into(),
        kind: KIND.into(),
        devices,
    }
}

/// The CDI spec directory.
#[derive(Clone, Debug)]
pub struct CdiDir {
    root: PathBuf,
}

impl CdiDir {
    /// Specs under `root`.
    pub fn new(root: PathBuf) -> Self {
        CdiDir { root }
    }

    /// The spec file of a claim (the UID is checked by the caller: `[A-Za-z0-9-]` only).
    pub fn path(&self, claim_uid: &str) -> PathBuf {
        self.root
            .join(format!("{}-{claim_uid}.json", kudos_api::dra::DRIVER))
    }

    /// Whether the claim's spec file exists.
    pub fn exists(&self, claim_uid: &str) -> bool {
        self.path(claim_uid).is_file()
    }

    /// Writes the claim's spec atomically (a runtime never reads half a file).
    pub fn write(&self, claim_uid: &str, spec: &Spec) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(spec).map_err(std::io::Error::other)?;
        super::write_atomic(&self.path(claim_uid), &bytes)
    }

    /// Removes the claim's spec; a missing file is fine. Returns whether one was removed.
    pub fn remove(&self, claim_uid: &str) -> std::io::Result<bool> {
        match std::fs::remove_file(self.path(claim_uid)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_takes_its_requests_environment_and_its_own_device_nodes() {
        let mut group = Allocation::default();
        group
            .envs
            .insert("NVIDIA_VISIBLE_DEVICES".into(), "GPU-a,GPU-b".into());
        group.annotations.insert("a".into(), "b".into());
        group
            .device_specs
            .push(("/h/dev/nvidia1".into(), "/dev/nvidia1".into(), "rw".into()));
        let mut own = Allocation::default();
        own.device_specs.push((
            "/h/dev/nvidiactl".into(),
            "/dev/nvidiactl".into(),
            "rw".into(),
        ));
        own.device_specs
            .push(("/h/dev/nvidia0".into(), "/dev/nvidia0".into(), "rw".into()));
        let d = device(device_name("uid-1", "nv-gpu-a"), &group, &own);
        let s = spec(vec![d]);
        let json: serde_json::Value = serde_json::to_value(&s).expect("json");
        assert_eq!(
            json,
            serde_json::json!({
                "cdiVersion": "0.6.0",
                "kind": "gpu.kudos.dev/gpu",
                "devices": [{
                    "name": "uid-1-nv-gpu-a",
                    "annotations": {"a": "b"},
                    "containerEdits": {
                        "env": ["NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"],
                        "deviceNodes": [
                            {"path": "/dev/nvidiactl", "hostPath": "/h/dev/nvidiactl", "permissions": "rw"},
                            {"path": "/dev/nvidia0", "hostPath": "/h/dev/nvidia0", "permissions": "rw"}
                        ]
                    }
                }]
            })
        );
        assert_eq!(
            qualified("uid-1-nv-gpu-a"),
            "gpu.kudos.dev/gpu=uid-1-nv-gpu-a"
        );
        // Empty edits are left out, as CDI allows.
        let bare = device("x".into(), &Allocation::default(), &Allocation::default());
        let json = serde_json::to_value(&bare).expect("json");
        assert_eq!(json, serde_json::json!({"name": "x", "containerEdits": {}}));
    }

    #[test]
    fn files_are_written_atomically_per_claim_and_removal_is_idempotent() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = CdiDir::new(tmp.path().join("cdi"));
        let s = spec(vec![]);
        dir.write("u-1", &s).expect("write");
        assert!(dir.exists("u-1"));
        assert_eq!(
            dir.path("u-1").file_name().and_then(|n| n.to_str()),
            Some("gpu.kudos.dev-u-1.json")
        );
        let back: Spec =
            serde_json::from_slice(&std::fs::read(dir.path("u-1")).expect("read")).expect("parse");
        assert_eq!(back, s);
        // Nothing but the spec is left in the directory (no temporary file).
        assert_eq!(std::fs::read_dir(dir.root()).expect("ls").count(), 1);
        assert!(dir.remove("u-1").expect("remove"));
        assert!(!dir.remove("u-1").expect("again"));
    }
}
