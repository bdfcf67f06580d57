use super::*;
use crate::config::v1::Device;

/// A plugin configuration as the orchestrator of commit dac9549 stored it: serialized by that
/// commit's `orchestrator/src/state.rs` (`PluginConfig::upsert` three times), with an image
/// recorded the way its `rollout/mod.rs` recorder did (`serde_json::to_value(DerivedImage)`).
const STORED_BY_DAC9549: &str = include_str!("stored-by-dac9549.json");

fn mk_device(id: &str) -> DeviceRecord {
    DeviceRecord {
        id: id.into(),
        model: "model".into(),
        memory_bytes: 16 << 30,
        uuid: format!("uuid-{id}"),
        numa_node: Some(0),
    }
}

fn entry(resource: &str, ids: &[&str]) -> VendorEntry {
    VendorEntry {
        vendor_resource_name: resource.into(),
        plugin_version: "0.1.0".into(),
        devices: ids.iter().map(|i| mk_device(i)).collect(),
    }
}

/// `n1`, `n2`: nvidia; `n3`: amd; `n4`: amd + nvidia.
fn mk_config() -> PluginConfig {
    let mut c = PluginConfig::default();
    let unified = "kudos.dev/gpu";
    c.upsert(
        "n2",
        "nvidia",
        entry("nvidia.com/gpu", &["nv-GPU-b", "nv-GPU-a"]),
        unified,
    );
    c.upsert(
        "n1",
        "nvidia",
        entry("nvidia.com/gpu", &["nv-GPU-c"]),
        unified,
    );
    c.upsert(
        "n3",
        "amd",
        entry("amd.com/gpu", &["amd-0000:03:00.0"]),
        unified,
    );
    c.upsert(
        "n4",
        "amd",
        entry("amd.com/gpu", &["amd-0000:04:00.0"]),
        unified,
    );
    c.upsert(
        "n4",
        "nvidia",
        entry("nvidia.com/gpu", &["nv-GPU-d"]),
        unified,
    );
    c
}

#[test]
fn state_stored_by_the_previous_release_loads_and_stores_unchanged() {
    let stored: serde_json::Value = serde_json::from_str(STORED_BY_DAC9549).expect("fixture");
    let cfg: PluginConfig = serde_json::from_str(STORED_BY_DAC9549).expect("loads");
    assert_eq!(cfg.generation, 4);
    assert_eq!(cfg.nodes["node-b"]["amd"].devices[0].numa_node, None);
    assert_eq!(cfg.images["nvidia"].tag, "nvidia-g3");
    assert_eq!(serde_json::to_value(&cfg).expect("serializes"), stored);
    let groups: Vec<_> = cfg
        .groups()
        .expect("valid")
        .into_iter()
        .map(|g| g.name)
        .collect();
    assert_eq!(groups, ["amd-nvidia", "nvidia"]);
}

#[test]
fn loading_is_lenient_where_state_may_come_from_another_release() {
    let cfg: PluginConfig = serde_json::from_value(serde_json::json!({
        "generation": 3,
        "unifiedResourceName": "kudos.dev/gpu",
        "nodes": {"n1": {"nvidia": {
            "vendorResourceName": "nvidia.com/gpu",
            "devices": [{"id": "nv-GPU-1", "futureField": true}]}}}
    }))
    .expect("loads");
    assert!(cfg.images.is_empty());
    assert_eq!(cfg.nodes["n1"]["nvidia"].devices[0].memory_bytes, 0);
}

#[test]
fn generation_bumps_only_on_change() {
    let mut c = PluginConfig::default();
    let two = entry("nvidia.com/gpu", &["nv-0", "nv-1"]);
    assert!(c.upsert("n1", "nvidia", two.clone(), "kudos.dev/gpu"));
    assert_eq!(c.generation, 1);
    assert!(!c.upsert("n1", "nvidia", two, "kudos.dev/gpu"));
    assert_eq!(c.generation, 1);
    let three = entry("nvidia.com/gpu", &["nv-0", "nv-1", "nv-2"]);
    assert!(c.upsert("n1", "nvidia", three, "kudos.dev/gpu"));
    assert_eq!(c.generation, 2);
    let p = c.profile("n1").expect("profile");
    assert_eq!((p.vendor.as_str(), p.count), ("nvidia", 3));
}

#[test]
fn groups_by_vendor_set_each_node_once() {
    let groups = mk_config().groups().expect("valid");
    let names: Vec<_> = groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["amd", "amd-nvidia", "nvidia"]);
    assert_eq!(groups[0].nodes, ["n3"]);
    assert_eq!(groups[1].nodes, ["n4"]);
    assert_eq!(groups[1].vendors, ["amd", "nvidia"]);
    assert_eq!(groups[2].nodes, ["n1", "n2"]);
}

#[test]
fn rejects_bad_vendor_and_resource_names() {
    let mut c = mk_config();
    c.unified_resource_name = "gpu".into();
    assert!(matches!(
        c.validate(),
        Err(PluginConfigError::InvalidResourceName(_))
    ));
    let mut c = mk_config();
    let n1 = c.nodes.get_mut("n1").expect("n1");
    n1.insert("NVIDIA".into(), VendorEntry::default());
    assert!(matches!(
        c.validate(),
        Err(PluginConfigError::InvalidVendor { .. })
    ));
    let mut c = mk_config();
    let n1 = c.nodes.get_mut("n1").expect("n1");
    n1.insert("a".repeat(21), VendorEntry::default());
    assert!(matches!(
        c.validate(),
        Err(PluginConfigError::InvalidVendor {
            source: BoundsError::TooLong { .. },
            ..
        })
    ));
    let mut c = mk_config();
    c.nodes.insert("n9".into(), BTreeMap::new());
    assert_eq!(
        c.validate(),
        Err(PluginConfigError::NodeWithoutVendors("n9".into()))
    );
}

#[test]
fn vendor_configs_cover_only_group_nodes_sorted() {
    let c = mk_config();
    let groups = c.groups().expect("valid");
    let nvidia = c.vendor_configs(&groups[2]);
    assert_eq!(nvidia.len(), 1);
    assert_eq!(nvidia[0].nodes.keys().collect::<Vec<_>>(), ["n1", "n2"]);
    let ids: Vec<_> = nvidia[0].nodes["n2"]
        .iter()
        .map(|d: &Device| d.id.as_str())
        .collect();
    assert_eq!(ids, ["nv-GPU-a", "nv-GPU-b"]);
    assert_eq!(nvidia[0].vendor_resource_name, "nvidia.com/gpu");
    let mixed = c.vendor_configs(&groups[1]);
    assert_eq!(
        mixed.iter().map(|c| c.vendor.as_str()).collect::<Vec<_>>(),
        ["amd", "nvidia"]
    );
    assert!(mixed.iter().all(|c| c.nodes.keys().eq(["n4"].iter())));
}

#[test]
fn reported_entries_are_checked_against_the_shared_bounds() {
    let ok = entry("nvidia.com/gpu", &["nv-GPU-1"]);
    assert_eq!(ok.validate("nvidia"), Ok(()));
    assert!(matches!(
        ok.validate(&"v".repeat(21)),
        Err(BoundsError::TooLong { max: 20, .. })
    ));
    let mut long_id = ok.clone();
    long_id.devices[0].id = "x".repeat(64);
    assert!(long_id.validate("nvidia").is_err());
    let mut many = ok.clone();
    many.devices = (0..=crate::bounds::MAX_DEVICES_PER_NODE)
        .map(|i| mk_device(&format!("nv-{i}")))
        .collect();
    assert!(matches!(
        many.validate("nvidia"),
        Err(BoundsError::TooMany { .. })
    ));
    let mut bad_name = ok;
    bad_name.vendor_resource_name = "gpu".into();
    assert!(bad_name.validate("nvidia").is_err());
}
