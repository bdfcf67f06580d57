//! Plugin configurations shared by this crate's unit tests.

use std::collections::BTreeMap;

use kudos_api::{DeviceRecord, PluginConfig, VendorEntry};

pub(crate) fn mk_device(id: &str) -> DeviceRecord {
    DeviceRecord {
        id: id.into(),
        model: "model".into(),
        memory_bytes: 16 << 30,
        uuid: format!("uuid-{id}"),
        numa_node: Some(0),
    }
}

/// `n1`, `n2`: nvidia; `n3`: amd; `n4`: amd + nvidia.
pub(crate) fn mk_view() -> PluginConfig {
    let entry = |resource: &str, ids: &[&str]| VendorEntry {
        vendor_resource_name: resource.into(),
        plugin_version: "0.1.0".into(),
        devices: ids.iter().map(|i| mk_device(i)).collect(),
    };
    let nv = |ids: &[&str]| entry("nvidia.com/gpu", ids);
    let amd = |ids: &[&str]| entry("amd.com/gpu", ids);
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
    PluginConfig {
        generation: 7,
        unified_resource_name: "kudos.dev/gpu".into(),
        nodes,
        images: BTreeMap::new(),
    }
}
