//! The fixture every real-node scenario uses: two nodes with four fake GPUs each, of different
//! models, delivered like a real driver (see [`super::node::NodeEnv::driver_dir`]).

use super::RealClusterOptions;
use crate::paths::repo_root;
use anyhow::{Context, Result};
use kudos_nvml::fake::FakeNvml;
use std::path::{Path, PathBuf};

/// Node a's GPU model (class X runs fastest here, see `examples/workload`).
pub const MODEL_A: &str = "Tesla V100-SXM2-16GB";
/// Node b's GPU model (class Y runs fastest here).
pub const MODEL_B: &str = "Tesla T4";
/// GPUs per node.
pub const GPUS_PER_NODE: u32 = 4;
/// The images a cluster without Kudos needs (`images/build --archive`), by file stem.
pub const BASE_IMAGES: &[&str] = &["pause", "kudos-workload"];
/// The images a Kudos scenario imports into every node, by file stem.
pub const IMAGES: &[&str] = &[
    "pause",
    "kudos-workload",
    "kudos-orchestrator",
    "kudos-device-plugin",
    "kudos-node-agent",
    "kube-scheduler",
];

/// Where `images/build --archive` put the image tarballs: `$KUDOS_E2E_IMAGE_DIR`, else
/// `e2e/_out/images`.
pub fn image_dir() -> PathBuf {
    std::env::var_os("KUDOS_E2E_IMAGE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("e2e/_out/images"))
}

/// The image tarballs of `images`.
pub fn image_archives(images: &[&str]) -> Vec<PathBuf> {
    images
        .iter()
        .map(|i| image_dir().join(format!("{i}.tar")))
        .collect()
}

/// Writes a fake driver (library + configuration) with `GPUS_PER_NODE` GPUs of `model` into
/// `dir`; UUIDs embed the node name so no two nodes share one.
pub fn fake_driver(dir: &Path, node: &str, model: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let mut fake = FakeNvml::new(dir, GPUS_PER_NODE)
        .with_context(|| format!("fake driver in {}", dir.display()))?;
    for (i, d) in fake.devices.iter_mut().enumerate() {
        d.name = model.into();
        d.memory_bytes = 16 << 30;
        // V100 is Volta (7.0), T4 Turing (7.5).
        d.compute_capability = Some(if model == MODEL_A { (7, 0) } else { (7, 5) });
        d.uuid = format!("GPU-{node:0>8}-0000-4000-8000-{i:012}");
    }
    fake.write()?;
    Ok(dir.to_path_buf())
}

/// Two GPU nodes, `a` (4 × [`MODEL_A`]) and `b` (4 × [`MODEL_B`]), labelled
/// `kudos.dev/gpu-node=true` as the shipped manifests expect, importing `images`.
pub fn two_gpu_nodes(run_dir: &Path, images: &[&str]) -> Result<RealClusterOptions> {
    let mut o = RealClusterOptions {
        images: image_archives(images),
        ..Default::default()
    };
    for (name, model) in [("a", MODEL_A), ("b", MODEL_B)] {
        let driver = fake_driver(&run_dir.join(format!("driver-{name}")), name, model)?;
        o.drivers.insert(name.into(), driver);
        o.nodes.push((
            name.into(),
            vec![("kudos.dev/gpu-node".into(), "true".into())],
        ));
    }
    Ok(o)
}

/// Every file a real-node scenario needs: the upstream binaries `e2e/build` builds, the image
/// archives of `images` and the CNI bridge plugin (Debian's containernetworking-plugins).
pub fn required_files(images: &[&str]) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
    ]
    .iter()
    .map(|b| crate::paths::upstream_bin(b))
    .collect();
    v.extend(image_archives(images));
    v.push("/usr/lib/cni/bridge".into());
    v
}

/// Injects XID `xid` on device `index` of the fake driver in `dir` (see [`fake_driver`]):
/// appended in place, since containers see the configuration through a bind mount of the file.
pub fn inject_xid(dir: &Path, index: u32, xid: u64) -> Result<()> {
    let config = dir.join(kudos_nvml::fake::FAKE_NVML_CONFIG_FILE);
    kudos_nvml::fake::append_xid(&config, index, xid)
        .with_context(|| format!("append an XID to {}", config.display()))
}
