use super::*;

fn mk_config() -> VendorPluginConfig {
    VendorPluginConfig {
        version: Version::V1,
        vendor: "nvidia".into(),
        vendor_resource_name: "nvidia.com/gpu".into(),
        unified_resource_name: "kudos.dev/gpu".into(),
        nodes: [(
            "node-a".to_string(),
            vec![Device {
                id: "nv-GPU-1".into(),
                model: "Tesla V100".into(),
                memory_bytes: 16 << 30,
                uuid: "GPU-1".into(),
                numa_node: Some(0),
            }],
        )]
        .into(),
    }
}

fn parse(text: &str) -> Result<VendorPluginConfig, VendorPluginConfigError> {
    VendorPluginConfig::from_file_bytes(Path::new("nvidia.json"), text.as_bytes())
}

#[test]
fn what_is_written_reads_back_from_the_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = mk_config();
    std::fs::write(
        dir.path().join(VendorPluginConfig::file_name("nvidia")),
        cfg.to_file_bytes().expect("serializes"),
    )
    .expect("write");
    let back = VendorPluginConfig::read(dir.path(), "nvidia").expect("reads");
    assert_eq!(back, cfg);
    assert_eq!(back.devices_on("node-a").len(), 1);
    assert!(back.devices_on("node-b").is_empty());
    let text = String::from_utf8(cfg.to_file_bytes().expect("serializes")).expect("utf-8");
    assert!(text.contains("\"version\": \"v1\""), "{text}");
}

#[test]
fn missing_version_means_v1_and_unknown_versions_are_rejected() {
    let body = r#""vendor":"nvidia","vendorResourceName":"nvidia.com/gpu","unifiedResourceName":"kudos.dev/gpu","nodes":{}"#;
    let cfg = parse(&format!("{{{body}}}")).expect("no version is v1");
    assert_eq!(cfg.version, Version::V1);
    let e = parse(&format!("{{\"version\":\"v2\",{body}}}")).expect_err("v2 is unknown");
    assert!(matches!(e, VendorPluginConfigError::Parse { .. }), "{e}");
    assert!(
        e.to_string().contains("v2") && e.to_string().contains("nvidia.json"),
        "{e}"
    );
}

#[test]
fn unknown_fields_are_rejected_at_every_level() {
    let top = r#"{"vendor":"nvidia","vendorResourceName":"","unifiedResourceName":"kudos.dev/gpu","nodes":{},"extra":1}"#;
    let e = parse(top).expect_err("unknown top-level field");
    assert!(e.to_string().contains("extra"), "{e}");
    let nested = r#"{"vendor":"nvidia","vendorResourceName":"","unifiedResourceName":"kudos.dev/gpu","nodes":{"n1":[{"id":"nv-1","colour":"green"}]}}"#;
    let e = parse(nested).expect_err("unknown device field");
    assert!(e.to_string().contains("colour"), "{e}");
}

#[test]
fn out_of_bounds_values_and_a_wrong_vendor_are_rejected() {
    let mut cfg = mk_config();
    cfg.vendor = "a".repeat(21);
    let bytes = cfg.to_file_bytes().expect("serializes");
    assert!(matches!(
        VendorPluginConfig::from_file_bytes(Path::new("x"), &bytes),
        Err(VendorPluginConfigError::Bounds { .. })
    ));
    let mut cfg = mk_config();
    cfg.unified_resource_name = "gpu".into();
    let bytes = cfg.to_file_bytes().expect("serializes");
    assert!(matches!(
        VendorPluginConfig::from_file_bytes(Path::new("x"), &bytes),
        Err(VendorPluginConfigError::ResourceName {
            field: "unifiedResourceName",
            ..
        })
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("amd.json"),
        mk_config().to_file_bytes().expect("serializes"),
    )
    .expect("write");
    assert!(matches!(
        VendorPluginConfig::read(dir.path(), "amd"),
        Err(VendorPluginConfigError::WrongVendor { .. })
    ));
    assert!(matches!(
        VendorPluginConfig::read(dir.path(), "intel"),
        Err(VendorPluginConfigError::Read { .. })
    ));
}
