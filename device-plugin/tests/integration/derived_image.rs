//! The plugin reads what the rollout writes: the per-vendor configuration files and the env of
//! a derived image, produced by `kudos-rollout`'s own functions, drive the real plugin binary.

use crate::support;

use kudos_api::{DeviceRecord, PluginConfig, VendorEntry, env};
use kudos_nvml::fake::FakeNvml;
use std::path::Path;
use std::process::{Child, Command};
use support::Kubelet;

/// Node `node-a` with the fake GPUs, under a unified name that is not the default.
fn plugin_config(fake: &FakeNvml) -> PluginConfig {
    let devices = fake
        .devices
        .iter()
        .map(|d| DeviceRecord {
            id: format!("nv-{}", d.uuid),
            model: d.name.clone(),
            memory_bytes: 80 << 30,
            uuid: d.uuid.clone(),
            numa_node: None,
        })
        .collect();
    let entry = VendorEntry {
        vendor_resource_name: "nvidia.com/gpu".into(),
        devices,
        plugin_version: "0.1.0".into(),
    };
    let mut cfg = PluginConfig::default();
    cfg.upsert("node-a", "nvidia", entry, "example.com/accel");
    cfg
}

/// Writes the group's image files under `root` (as the image's layer would) and returns the
/// env the derived image sets, with the configuration directory moved under `root`.
fn derive_into(root: &Path, cfg: &PluginConfig) -> Vec<(String, String)> {
    let group = &cfg.groups().expect("valid")[0];
    for (path, body) in kudos_rollout::image::group_config_files(cfg, group).expect("files") {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, body).expect("write");
    }
    kudos_rollout::image::group_env(cfg, group)
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            env::PLUGIN_CONFIG_DIR => {
                let dir = root.join(v.trim_start_matches('/'));
                (k, dir.display().to_string())
            }
            _ => (k, v),
        })
        .collect()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_plugin_binary_serves_what_the_derived_image_configures() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("device-plugins");
    let nvml_dir = tmp.path().join("nvml");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::create_dir_all(&nvml_dir).expect("dir");
    let fake = FakeNvml::new(&nvml_dir, 2).expect("fake nvml");
    let cfg = plugin_config(&fake);
    let image_env = derive_into(&tmp.path().join("image"), &cfg);
    let names: Vec<&str> = image_env.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [env::RESOURCE_NAME, env::VENDOR, env::PLUGIN_CONFIG_DIR]
    );

    let mut kubelet = Kubelet::new(&dir);
    kubelet.start();
    // What the rendered DaemonSet adds: node name, state and NVML directories.
    let child = Command::new(env!("CARGO_BIN_EXE_kudos-device-plugin"))
        .envs(image_env)
        .env(env::NODE_NAME, "node-a")
        .env(env::STATE_DIR, tmp.path().join("state"))
        .env(env::NVML_LIBRARY_DIR, &nvml_dir)
        .args([
            &format!("--device-plugin-dir={}", dir.display()),
            "--metrics-addr=off",
        ])
        .spawn()
        .expect("start the plugin binary");
    let _child = Killed(child);

    let (req, _) = kubelet.registration().await;
    assert_eq!(req.resource_name, "example.com/accel");
    let listed = kubelet.list_where(|l| l.len() == 2).await;
    let mut ids: Vec<String> = listed.into_iter().map(|d| d.id).collect();
    ids.sort();
    let mut want: Vec<String> = cfg.nodes["node-a"]["nvidia"]
        .devices
        .iter()
        .map(|d| d.id.clone())
        .collect();
    want.sort();
    assert_eq!(ids, want);
}
