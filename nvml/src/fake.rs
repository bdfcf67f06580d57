//! The fake `libnvidia-ml.so.1` built from `fake/fake_nvml.c`, and a typed writer for its
//! configuration, for tests of this crate and of every crate that uses it.
//!
//! ```no_run
//! use kudos_nvml::fake::{FakeDevice, FakeNvml};
//! let dir = tempfile::tempdir().unwrap();
//! let mut fake = FakeNvml::new(dir.path(), 2).unwrap(); // copies the library, writes its config
//! let nvml = kudos_nvml::Nvml::init(Some(fake.library())).unwrap();
//! fake.devices[0].gpu_utilization_percent = 90;
//! fake.xid(1, 79);                                    // inject XID 79 on device 1
//! fake.write().unwrap();                              // the library re-reads on change
//! ```
//!
//! Every [`FakeNvml`] gets its own copy of the library, and the dynamic loader keeps one
//! state per file, so tests running in parallel in one process do not see each other.
//! Processes that cannot pass a path (a binary under test) can point `KUDOS_FAKE_NVML_CONFIG`
//! at a configuration file instead; the variable wins over the file beside the library.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Path of the fake library as built into this crate's `OUT_DIR`.
pub const FAKE_NVML_LIBRARY: &str = env!("KUDOS_FAKE_NVML_LIBRARY");
/// Environment variable naming the configuration file (overrides `fake-nvml.conf` beside the
/// library).
pub const FAKE_NVML_CONFIG_ENV: &str = "KUDOS_FAKE_NVML_CONFIG";
/// Configuration file name looked up beside the library.
pub const FAKE_NVML_CONFIG_FILE: &str = "fake-nvml.conf";

/// NVML error code `NVML_ERROR_GPU_IS_LOST`.
pub const NVML_ERROR_GPU_IS_LOST: u32 = 15;
/// NVML error code `NVML_ERROR_DRIVER_NOT_LOADED`.
pub const NVML_ERROR_DRIVER_NOT_LOADED: u32 = 9;
/// NVML error code `NVML_ERROR_UNKNOWN`.
pub const NVML_ERROR_UNKNOWN: u32 = 999;

/// One fake GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeDevice {
    /// `GPU-...`.
    pub uuid: String,
    /// Model name.
    pub name: String,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// Memory used in bytes.
    pub memory_used_bytes: u64,
    /// PCI bus ID, `dddd:bb:dd.f`.
    pub pci_bus_id: String,
    /// Minor number (`/dev/nvidia<minor>`).
    pub minor: u32,
    /// NUMA node; `None` makes NVML answer "not supported".
    pub numa_node: Option<u32>,
    /// GPU utilisation, percent.
    pub gpu_utilization_percent: u32,
    /// Memory utilisation, percent.
    pub memory_utilization_percent: u32,
    /// Power draw in milliwatts (NVML's unit).
    pub power_milliwatts: u32,
    /// SM clock in MHz (NVML's unit).
    pub sm_clock_mhz: u32,
    /// Temperature in degrees Celsius.
    pub temperature_celsius: u32,
    /// Energy since driver load in millijoules (NVML's unit).
    pub energy_millijoules: u64,
    /// When set, every query on this device fails with this NVML error code.
    pub fail: Option<u32>,
    /// CUDA compute capability (major, minor); `None`: the query is not supported.
    pub compute_capability: Option<(u32, u32)>,
}

impl FakeDevice {
    /// A plausible H100 at position `index`, NUMA node `index / 4`.
    pub fn new(index: u32) -> Self {
        FakeDevice {
            uuid: format!("GPU-{index:08x}-1111-2222-3333-444444444444"),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_bytes: 80 * 1024 * 1024 * 1024,
            memory_used_bytes: 0,
            pci_bus_id: format!("0000:{:02x}:00.0", 0x10 + index),
            minor: index,
            numa_node: Some(index / 4),
            gpu_utilization_percent: 0,
            memory_utilization_percent: 0,
            power_milliwatts: 70_000,
            sm_clock_mhz: 1980,
            temperature_celsius: 35,
            energy_millijoules: 0,
            fail: None,
            compute_capability: Some((9, 0)),
        }
    }
}

/// A process on a fake GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeProcess {
    /// Index of the device in [`FakeNvml::devices`].
    pub device: u32,
    /// PID.
    pub pid: u32,
    /// Memory used in bytes.
    pub memory_bytes: u64,
    /// SM utilisation, percent.
    pub sm_percent: u32,
    /// Memory utilisation, percent.
    pub memory_percent: u32,
}

/// A link between two fake GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeLink {
    /// Device index.
    pub a: u32,
    /// Device index.
    pub b: u32,
    /// NVML topology level (0, 10, 20, 30, 40, 50); 0 = derive from NUMA nodes.
    pub level: u32,
    /// Active NVLinks between them.
    pub nvlinks: u32,
}

/// The whole fake NVML state, written to the configuration file by [`FakeNvml::write`].
#[derive(Clone, Debug)]
pub struct FakeNvml {
    /// Devices, in NVML index order.
    pub devices: Vec<FakeDevice>,
    /// Running processes.
    pub processes: Vec<FakeProcess>,
    /// Links.
    pub links: Vec<FakeLink>,
    /// XID events so far as (device index, xid); append to inject.
    pub xids: Vec<(u32, u64)>,
    /// When set, every NVML call (init included) fails with this code: NVML not answering.
    pub fail: Option<u32>,
    library: PathBuf,
    config: PathBuf,
}

impl FakeNvml {
    /// Copies the fake library into `dir` (its own instance), and writes a configuration with
    /// `devices` default devices beside it.
    pub fn new(dir: &Path, devices: u32) -> std::io::Result<Self> {
        let library = dir.join("libnvidia-ml.so.1");
        std::fs::copy(FAKE_NVML_LIBRARY, &library)?;
        let fake = FakeNvml {
            devices: (0..devices).map(FakeDevice::new).collect(),
            processes: Vec::new(),
            links: Vec::new(),
            xids: Vec::new(),
            fail: None,
            library,
            config: dir.join(FAKE_NVML_CONFIG_FILE),
        };
        fake.write()?;
        Ok(fake)
    }

    /// Path of this instance's library copy, for [`crate::Nvml::init`].
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// Path of this instance's configuration file.
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// Appends an XID event for device `index`; call [`FakeNvml::write`] to deliver it.
    pub fn xid(&mut self, index: u32, xid: u64) {
        self.xids.push((index, xid));
    }

    /// The configuration file text.
    pub fn render(&self) -> String {
        let mut s = String::from("# written by kudos_nvml::fake\n");
        if let Some(code) = self.fail {
            let _ = writeln!(s, "nvml: fail={code}");
        }
        for d in &self.devices {
            let _ = writeln!(
                s,
                "device: uuid={}; name={}; memory={}; memused={}; pci={}; minor={}; numa={}; \
                 util={}; memutil={}; power={}; sm_clock={}; temp={}; energy={}; fail={}",
                d.uuid,
                d.name,
                d.memory_bytes,
                d.memory_used_bytes,
                d.pci_bus_id,
                d.minor,
                d.numa_node.map_or(-1, i64::from),
                d.gpu_utilization_percent,
                d.memory_utilization_percent,
                d.power_milliwatts,
                d.sm_clock_mhz,
                d.temperature_celsius,
                d.energy_millijoules,
                d.fail.unwrap_or(0),
            );
            if let Some((major, minor)) = d.compute_capability {
                // Appended to the device line just written: `; cc=9.0`.
                s.pop();
                let _ = writeln!(s, "; cc={major}.{minor}");
            }
        }
        for p in &self.processes {
            let _ = writeln!(
                s,
                "process: device={}; pid={}; mem={}; sm={}; memutil={}",
                p.device, p.pid, p.memory_bytes, p.sm_percent, p.memory_percent
            );
        }
        for l in &self.links {
            let _ = writeln!(
                s,
                "link: a={}; b={}; level={}; nvlinks={}",
                l.a, l.b, l.level, l.nvlinks
            );
        }
        for (d, x) in &self.xids {
            s.push_str(&xid_record(*d, *x));
        }
        s
    }

    /// Writes the configuration atomically (temporary file + rename), so the library never
    /// reads half a file.
    pub fn write(&self) -> std::io::Result<()> {
        let tmp = self.config.with_extension("tmp");
        std::fs::write(&tmp, self.render())?;
        std::fs::rename(&tmp, &self.config)
    }
}

/// One XID record of the configuration file.
fn xid_record(index: u32, xid: u64) -> String {
    format!("xid: device={index}; value={xid}\n")
}

/// Appends an XID for device `index` to the configuration file `config` in place. Unlike
/// [`FakeNvml::write`] (a rename), this reaches a process that sees the file through a bind
/// mount of the file itself, as a container given the driver does; the library delivers the
/// records appended after an event set registered.
pub fn append_xid(config: &Path, index: u32, xid: u64) -> std::io::Result<()> {
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .append(true)
        .open(config)?
        .write_all(xid_record(index, xid).as_bytes())
}
