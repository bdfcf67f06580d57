//! Flags, and their validation into [`Settings`] before anything starts.
//!
//! Raw [`Args`] (what clap parsed: flags with their environment fallbacks) become [`Settings`]
//! through `TryFrom`, which also reads the per-vendor plugin configuration a derived image
//! carries. Precedence, for every value: flag > environment variable > per-vendor file >
//! default. Errors name the flag.

use crate::health::XidIgnoreList;
use clap::{Parser, ValueEnum};
use kudos_api::config::v1::{Device as ExpectedDevice, VendorPluginConfig};
use kudos_api::{VendorPluginConfigError, env};
use kudos_common::duration;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Name cache used when neither --name-cache nor --state-dir is given.
pub const DEFAULT_NAME_CACHE: &str = "/var/lib/kudos/device-plugin/resource-name";

/// A discovery backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// NVIDIA GPUs through NVML.
    Nvidia,
    /// AMD GPUs through sysfs and /dev/kfd.
    Amd,
    /// Devices listed in the --static-devices file.
    Static,
}

impl BackendKind {
    /// The backend serving `vendor`: NVML for `nvidia`, sysfs for `amd`, the static device
    /// file for any other vendor.
    pub fn for_vendor(vendor: &str) -> Self {
        match vendor {
            "nvidia" => BackendKind::Nvidia,
            "amd" => BackendKind::Amd,
            _ => BackendKind::Static,
        }
    }
}

/// Command-line arguments, as parsed (flag, else environment variable); see [`Settings`].
#[derive(Debug, Parser)]
#[command(
    name = "kudos-device-plugin",
    version,
    about = "Kudos device plugin: discovers accelerators on a node and serves them to the kubelet under one unified resource name, through the kubelet's device-plugin API or, in DRA mode (--allocation-api), as a ResourceSlice and a DRA kubelet plugin.",
    after_help = "Precedence: a flag overrides its environment variable, which overrides the per-vendor plugin configuration file (--plugin-config-dir/<vendor>.json, baked into derived images by the orchestrator's rollout), which overrides the default.\nDurations take a unit: 500ms, 30s, 5m, 1h (a bare number is seconds; at most 7 days)."
)]
pub struct Args {
    #[command(flatten)]
    pub log: kudos_common::LogArgs,

    /// This node's name, as reported to the orchestrator (Kubernetes downward API:
    /// spec.nodeName). Defaults to the host name.
    #[arg(long, env = env::NODE_NAME)]
    pub node_name: Option<String>,

    /// The kubelet's device-plugin directory (holds kubelet.sock and our socket).
    #[arg(long, env = "KUDOS_DEVICE_PLUGIN_DIR", default_value = kudos_proto::deviceplugin::v1beta1::DEVICE_PLUGIN_PATH)]
    pub device_plugin_dir: PathBuf,

    /// File name of this plugin's socket inside --device-plugin-dir.
    #[arg(long, env = "KUDOS_PLUGIN_SOCKET", default_value = "kudos.sock")]
    pub socket_name: String,

    /// Backends to use, comma-separated. When neither this nor --vendor is given, every
    /// backend that finds devices is used and a missing NVML is not an error; when given, a
    /// failing backend stops the plugin.
    #[arg(long, env = "KUDOS_BACKENDS", value_enum, value_delimiter = ',')]
    pub backends: Option<Vec<BackendKind>>,

    /// Vendors this plugin serves, comma-separated (set by a derived image): selects the
    /// backends (nvidia: NVML, amd: sysfs, others: --static-devices) and the files read from
    /// --plugin-config-dir.
    #[arg(long, env = env::VENDOR, value_delimiter = ',')]
    pub vendor: Option<Vec<String>>,

    /// Directory holding one plugin configuration file per vendor, <vendor>.json (set by a
    /// derived image). Needs --vendor.
    #[arg(long, env = env::PLUGIN_CONFIG_DIR)]
    pub plugin_config_dir: Option<PathBuf>,

    /// State directory on the host; the name cache defaults to
    /// <state-dir>/device-plugin/resource-name.
    #[arg(long, env = env::STATE_DIR)]
    pub state_dir: Option<PathBuf>,

    /// Path of libnvidia-ml.so.1 (default: in --nvml-library-dir, else found by the dynamic
    /// loader).
    #[arg(long, env = "KUDOS_NVML_LIBRARY")]
    pub nvml_library: Option<PathBuf>,

    /// Directory holding the driver's libnvidia-ml.so.1, mounted from the host.
    #[arg(long, env = env::NVML_LIBRARY_DIR)]
    pub nvml_library_dir: Option<PathBuf>,

    /// Pass /dev/nvidia* device nodes in Allocate (when the container runtime does not inject
    /// them from NVIDIA_VISIBLE_DEVICES).
    #[arg(long, env = "KUDOS_NVIDIA_DEVICE_SPECS")]
    pub nvidia_device_specs: bool,

    /// Pass CDI device names (nvidia.com/gpu=<uuid>) in Allocate.
    #[arg(long, env = "KUDOS_CDI")]
    pub cdi: bool,

    /// Root of the sysfs tree scanned for AMD GPUs.
    #[arg(long, env = "KUDOS_SYSFS_ROOT", default_value = "/sys")]
    pub sysfs_root: PathBuf,

    /// Root under which /dev lives on the host (device nodes are passed as <root>/dev/...).
    #[arg(long, env = "KUDOS_DEV_ROOT", default_value = "/")]
    pub dev_root: PathBuf,

    /// JSON file describing devices of another vendor (see backend::static_file).
    #[arg(long, env = "KUDOS_STATIC_DEVICES")]
    pub static_devices: Option<PathBuf>,

    /// Resource name used when the orchestrator has never answered and no cached name exists
    /// [default: the per-vendor file's unifiedResourceName, else kudos.dev/gpu].
    #[arg(long, env = env::RESOURCE_NAME)]
    pub resource_name: Option<String>,

    /// File caching the last unified name the orchestrator gave [default:
    /// <state-dir>/device-plugin/resource-name, else /var/lib/kudos/device-plugin/resource-name].
    #[arg(long, env = "KUDOS_NAME_CACHE")]
    pub name_cache: Option<PathBuf>,

    /// Orchestrator gRPC address, e.g. http://kudos-orchestrator.kudos-system.svc:8889 (also
    /// accepted as --orchestrator-url, the node agent's name). When absent the plugin registers
    /// under --resource-name and reports nothing.
    #[arg(
        long,
        env = env::ORCHESTRATOR_ADDR,
        visible_alias = "orchestrator-url"
    )]
    pub orchestrator_addr: Option<String>,

    /// PEM CA bundle that signs the orchestrator's certificate; required when
    /// --orchestrator-addr is https:// (the token then never crosses the network in the clear).
    #[arg(long, env = "KUDOS_ORCHESTRATOR_CA_FILE")]
    pub orchestrator_ca_file: Option<PathBuf>,

    /// Projected service-account token sent as a bearer token to the orchestrator (re-read on
    /// every report; skipped when missing).
    #[arg(
        long,
        env = "KUDOS_TOKEN_FILE",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )]
    pub token_file: PathBuf,

    /// Timeout of each orchestrator call.
    #[arg(long, env = "KUDOS_ORCHESTRATOR_TIMEOUT", default_value = "3s", value_parser = duration::parse_positive, alias = "orchestrator-timeout-seconds")]
    pub orchestrator_timeout: Duration,

    /// Time between reports after a successful one.
    #[arg(long, env = "KUDOS_REPORT_INTERVAL", default_value = "5m", value_parser = duration::parse_positive, alias = "report-interval-seconds")]
    pub report_interval: Duration,

    /// Largest back-off between failed reports.
    #[arg(long, env = "KUDOS_REPORT_MAX_BACKOFF", default_value = "60s", value_parser = duration::parse_positive, alias = "report-max-backoff-seconds")]
    pub report_max_backoff: Duration,

    /// XIDs that do not mark a GPU unhealthy: a comma-separated list, "default"
    /// (13,31,43,45,68,109) or "none".
    #[arg(long, env = "KUDOS_IGNORE_XIDS", default_value = "default")]
    pub ignore_xids: XidIgnoreList,

    /// An unhealthy device recovers when its probe passes and no critical event arrived for
    /// this long.
    #[arg(long, env = "KUDOS_RECOVERY_QUIET", default_value = "60s", value_parser = duration::parse_positive, alias = "recovery-quiet-seconds")]
    pub recovery_quiet: Duration,

    /// Time between device probes (NVML answering, device present).
    #[arg(long, env = "KUDOS_PROBE_INTERVAL", default_value = "5s", value_parser = duration::parse_positive, alias = "probe-interval-seconds")]
    pub probe_interval: Duration,

    /// Bound on each Register call to the kubelet; an unresponsive kubelet is retried.
    #[arg(long, env = "KUDOS_REGISTER_TIMEOUT", default_value = "5s", value_parser = duration::parse_positive)]
    pub register_timeout: Duration,

    /// Address for /metrics, /healthz and /readyz (/ready is an alias); "off" disables.
    #[arg(long, env = "KUDOS_METRICS_ADDR", default_value = "0.0.0.0:9401")]
    pub metrics_addr: String,

    #[command(flatten)]
    pub dra: crate::dra::DraArgs,
}

/// Invalid flag values.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A resource name breaks the kubelet's rules.
    #[error("--resource-name: {0}")]
    ResourceName(#[from] kudos_api::ResourceNameError),
    /// The metrics address is not an address.
    #[error("--metrics-addr {0:?} is not host:port or \"off\"")]
    MetricsAddr(String),
    /// The socket name is not a plain file name.
    #[error("--socket-name {0:?} must be a file name (no '/') other than kubelet.sock")]
    SocketName(String),
    /// No node name and no host name.
    #[error("--node-name is not set and the host name cannot be read")]
    NodeName,
    /// A vendor name is out of the bounds the orchestrator accepts.
    #[error("--vendor: {0}")]
    Vendor(#[source] kudos_api::BoundsError),
    /// --plugin-config-dir without --vendor: which file to read is unknown.
    #[error(
        "--plugin-config-dir needs --vendor (KUDOS_VENDOR) to know which <vendor>.json to read"
    )]
    PluginConfigWithoutVendor,
    /// A per-vendor plugin configuration file cannot be used.
    #[error("--plugin-config-dir: {0}")]
    PluginConfig(#[source] VendorPluginConfigError),
    /// The static device file cannot be used (unreadable, invalid, or a vendor name, device
    /// ID or resource name out of the bounds the orchestrator and the kubelet accept).
    #[error("--static-devices: {0}")]
    StaticDevices(#[source] crate::backend::BackendError),
    /// Two per-vendor files name different unified resource names.
    #[error("--plugin-config-dir: the files name different unified resource names {0:?} and {1:?}")]
    ConflictingResourceNames(String, String),
}

/// Validated settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Node name.
    pub node_name: String,
    /// Device-plugin directory.
    pub device_plugin_dir: PathBuf,
    /// Our socket's file name.
    pub socket_name: String,
    /// Backends, and whether failure is fatal (explicitly requested).
    pub backends: Vec<BackendKind>,
    /// Whether backends were named explicitly (by --backends or --vendor).
    pub backends_explicit: bool,
    /// NVIDIA backend options.
    pub nvidia: crate::backend::nvidia::NvidiaOptions,
    /// sysfs root.
    pub sysfs_root: PathBuf,
    /// Static device file.
    pub static_devices: Option<PathBuf>,
    /// Default unified name.
    pub default_name: String,
    /// Name cache.
    pub name_cache: PathBuf,
    /// Orchestrator address.
    pub orchestrator_addr: Option<String>,
    /// CA of the orchestrator's certificate (https:// addresses).
    pub orchestrator_ca_file: Option<PathBuf>,
    /// Token file.
    pub token_file: PathBuf,
    /// Orchestrator call timeout.
    pub orchestrator_timeout: Duration,
    /// Reporting policy.
    pub report: crate::registry::ReportPolicy,
    /// Recovery quiet period.
    pub recovery_quiet: Duration,
    /// Probe period.
    pub probe_interval: Duration,
    /// Bound on each Register call.
    pub register_timeout: Duration,
    /// Metrics address; `None` = off.
    pub metrics_addr: Option<SocketAddr>,
    /// Vendor → the devices its per-vendor file expects on this node (empty without
    /// --plugin-config-dir); compared with what discovery finds.
    pub expected_devices: Vec<(String, Vec<ExpectedDevice>)>,
    /// The allocation API flag and DRA mode's paths.
    pub dra: crate::dra::DraSettings,
}

/// Reads the per-vendor files of `vendors` from `dir`.
fn read_vendor_files(
    dir: Option<&std::path::Path>,
    vendors: &[String],
) -> Result<Vec<VendorPluginConfig>, ConfigError> {
    match dir {
        None => Ok(Vec::new()),
        Some(_) if vendors.is_empty() => Err(ConfigError::PluginConfigWithoutVendor),
        Some(dir) => vendors
            .iter()
            .map(|v| VendorPluginConfig::read(dir, v).map_err(ConfigError::PluginConfig))
            .collect(),
    }
}

/// The unified name the files agree on, if any file names one.
fn file_resource_name(files: &[VendorPluginConfig]) -> Result<Option<String>, ConfigError> {
    let mut names = files.iter().map(|f| &f.unified_resource_name);
    let Some(first) = names.next() else {
        return Ok(None);
    };
    match names.find(|n| *n != first) {
        Some(other) => Err(ConfigError::ConflictingResourceNames(
            first.clone(),
            other.clone(),
        )),
        None => Ok(Some(first.clone())),
    }
}

impl TryFrom<Args> for Settings {
    type Error = ConfigError;

    fn try_from(a: Args) -> Result<Self, ConfigError> {
        if a.socket_name.is_empty()
            || a.socket_name.contains('/')
            || a.socket_name == kudos_proto::deviceplugin::v1beta1::KUBELET_SOCKET
        {
            return Err(ConfigError::SocketName(a.socket_name));
        }
        let metrics_addr = match a.metrics_addr.as_str() {
            "off" | "" => None,
            addr => Some(
                addr.parse()
                    .map_err(|_| ConfigError::MetricsAddr(addr.into()))?,
            ),
        };
        let node_name = match a.node_name.filter(|n| !n.is_empty()) {
            Some(n) => n,
            None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .ok()
                .filter(|h| !h.is_empty())
                .ok_or(ConfigError::NodeName)?,
        };
        let mut vendors: Vec<String> = a
            .vendor
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect();
        vendors.sort();
        vendors.dedup();
        for v in &vendors {
            kudos_api::bounds::validate_vendor_name(v).map_err(ConfigError::Vendor)?;
        }
        let files = read_vendor_files(a.plugin_config_dir.as_deref(), &vendors)?;
        // flag/env > per-vendor file > default
        let default_name = match a.resource_name {
            Some(n) => n,
            None => file_resource_name(&files)?
                .unwrap_or_else(|| kudos_api::DEFAULT_UNIFIED_RESOURCE_NAME.to_owned()),
        };
        kudos_api::resource_name::validate(&default_name)?;
        let name_cache = a.name_cache.unwrap_or_else(|| match &a.state_dir {
            Some(dir) => dir.join("device-plugin").join("resource-name"),
            None => PathBuf::from(DEFAULT_NAME_CACHE),
        });
        let library = a
            .nvml_library
            .or_else(|| a.nvml_library_dir.map(|d| d.join(env::NVML_LIBRARY_FILE)));
        let (mut backends, backends_explicit) = match (a.backends, vendors.is_empty()) {
            (Some(b), _) => (b, true),
            (None, false) => (
                vendors.iter().map(|v| BackendKind::for_vendor(v)).collect(),
                true,
            ),
            (None, true) => (
                vec![BackendKind::Nvidia, BackendKind::Amd, BackendKind::Static],
                false,
            ),
        };
        backends.dedup();
        // A file given but unusable is a usage error (exit code 2), not a backend that is
        // quietly skipped at discovery.
        if let Some(path) = &a.static_devices
            && backends.contains(&BackendKind::Static)
        {
            crate::backend::static_file::StaticBackend::load(path)
                .map_err(ConfigError::StaticDevices)?;
        }
        let expected_devices = files
            .iter()
            .map(|f| (f.vendor.clone(), f.devices_on(&node_name).to_vec()))
            .collect();
        Ok(Settings {
            node_name,
            device_plugin_dir: a.device_plugin_dir,
            socket_name: a.socket_name,
            backends,
            backends_explicit,
            nvidia: crate::backend::nvidia::NvidiaOptions {
                library,
                device_specs: a.nvidia_device_specs,
                dev_root: a.dev_root.clone(),
                cdi: a.cdi,
                ignored_xids: a.ignore_xids,
            },
            sysfs_root: a.sysfs_root,
            static_devices: a.static_devices,
            default_name,
            name_cache,
            orchestrator_addr: a.orchestrator_addr.filter(|addr| !addr.is_empty()),
            orchestrator_ca_file: a.orchestrator_ca_file,
            token_file: a.token_file,
            orchestrator_timeout: a.orchestrator_timeout,
            report: crate::registry::ReportPolicy {
                initial_backoff: Duration::from_millis(500).min(a.report_max_backoff),
                max_backoff: a.report_max_backoff,
                interval: a.report_interval,
            },
            recovery_quiet: a.recovery_quiet,
            probe_interval: a.probe_interval,
            register_timeout: a.register_timeout,
            metrics_addr,
            expected_devices,
            dra: a.dra.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Settings, ConfigError> {
        let mut argv = vec!["kudos-device-plugin", "--node-name=n1"];
        argv.extend_from_slice(extra);
        Settings::try_from(Args::try_parse_from(argv).expect("parses"))
    }

    #[test]
    fn defaults_are_production_paths() {
        let s = parse(&[]).expect("valid");
        assert_eq!(s.node_name, "n1");
        assert_eq!(
            s.device_plugin_dir,
            PathBuf::from("/var/lib/kubelet/device-plugins")
        );
        assert_eq!(s.socket_name, "kudos.sock");
        assert_eq!(s.default_name, "kudos.dev/gpu");
        assert!(!s.backends_explicit);
        assert_eq!(
            s.backends,
            vec![BackendKind::Nvidia, BackendKind::Amd, BackendKind::Static]
        );
        assert!(s.nvidia.ignored_xids.ignores(13) && !s.nvidia.ignored_xids.ignores(79));
        assert_eq!(s.metrics_addr, Some("0.0.0.0:9401".parse().expect("addr")));
        assert!(s.orchestrator_addr.is_none());
    }

    #[test]
    fn orchestrator_address_accepts_the_node_agents_flag_name_too() {
        let url = "http://kudos-orchestrator.kudos-system.svc:8889";
        for flag in ["--orchestrator-addr", "--orchestrator-url"] {
            let s = parse(&[flag, url]).expect("valid");
            assert_eq!(s.orchestrator_addr.as_deref(), Some(url), "{flag}");
        }
    }

    #[test]
    fn invalid_values_are_rejected_before_start() {
        assert!(matches!(
            parse(&["--resource-name=gpu"]),
            Err(ConfigError::ResourceName(_))
        ));
        assert!(matches!(
            parse(&["--socket-name=kubelet.sock"]),
            Err(ConfigError::SocketName(_))
        ));
        assert!(matches!(
            parse(&["--socket-name=a/b"]),
            Err(ConfigError::SocketName(_))
        ));
        assert!(matches!(
            parse(&["--metrics-addr=nowhere"]),
            Err(ConfigError::MetricsAddr(_))
        ));
        assert!(Args::try_parse_from(["x", "--probe-interval=0s"]).is_err());
        assert!(Args::try_parse_from(["x", "--ignore-xids=13,abc"]).is_err());
        assert!(Args::try_parse_from(["x", "--backends=nvidia,intel"]).is_err());
        let s =
            parse(&["--backends=amd", "--metrics-addr=off", "--ignore-xids=none"]).expect("valid");
        assert!(
            s.backends_explicit && s.metrics_addr.is_none() && !s.nvidia.ignored_xids.ignores(13)
        );
    }

    #[test]
    fn huge_durations_are_flag_errors_not_panics() {
        for flag in [
            "--probe-interval-seconds=1e300",
            "--recovery-quiet=99999999999h",
            "--orchestrator-timeout-seconds=18446744073709551616",
            "--report-interval=8d",
        ] {
            let e = Args::try_parse_from(["x", flag]).expect_err(flag);
            // The error names the flag (its current name when an old alias was used).
            let name = flag
                .split('=')
                .next()
                .unwrap_or(flag)
                .trim_end_matches("-seconds");
            let text = e.to_string();
            assert!(text.contains(name), "{flag}: {text}");
        }
        let s = parse(&["--probe-interval=250ms", "--report-interval-seconds=2.5"]).expect("valid");
        assert_eq!(s.probe_interval, Duration::from_millis(250));
        assert_eq!(s.report.interval, Duration::from_millis(2500));
    }

    fn write_vendor_file(dir: &std::path::Path, vendor: &str, unified: &str) {
        let cfg = VendorPluginConfig {
            version: kudos_api::config::v1::Version::V1,
            vendor: vendor.into(),
            vendor_resource_name: format!("{vendor}.com/gpu"),
            unified_resource_name: unified.into(),
            nodes: [(
                "n1".to_string(),
                vec![ExpectedDevice {
                    id: format!("{vendor}-1"),
                    ..Default::default()
                }],
            )]
            .into(),
        };
        std::fs::write(
            dir.join(VendorPluginConfig::file_name(vendor)),
            cfg.to_file_bytes().expect("serializes"),
        )
        .expect("write");
    }

    #[test]
    fn flag_overrides_the_per_vendor_file_which_overrides_the_default() {
        let tmp = tempfile::tempdir().expect("tempdir");
        write_vendor_file(tmp.path(), "nvidia", "example.com/accel");
        let dir = format!("--plugin-config-dir={}", tmp.path().display());
        let s = parse(&["--vendor=nvidia", &dir]).expect("valid");
        assert_eq!(s.default_name, "example.com/accel");
        assert_eq!(
            (s.backends.as_slice(), s.backends_explicit),
            (&[BackendKind::Nvidia][..], true)
        );
        assert_eq!(s.expected_devices[0].1[0].id, "nvidia-1");
        let s = parse(&["--vendor=nvidia", &dir, "--resource-name=kudos.dev/gpu"]).expect("valid");
        assert_eq!(s.default_name, "kudos.dev/gpu");
        assert_eq!(parse(&[]).expect("valid").default_name, "kudos.dev/gpu");
    }

    #[test]
    fn state_and_nvml_directories_set_the_cache_and_library_paths() {
        let s = parse(&[
            "--state-dir=/var/lib/kudos",
            "--nvml-library-dir=/run/kudos/nvml-lib",
        ])
        .expect("valid");
        assert_eq!(
            s.name_cache,
            PathBuf::from("/var/lib/kudos/device-plugin/resource-name")
        );
        assert_eq!(
            s.nvidia.library,
            Some(PathBuf::from("/run/kudos/nvml-lib/libnvidia-ml.so.1"))
        );
        let s =
            parse(&["--state-dir=/s", "--name-cache=/c", "--nvml-library=/l.so"]).expect("valid");
        assert_eq!(
            (s.name_cache, s.nvidia.library),
            (PathBuf::from("/c"), Some(PathBuf::from("/l.so")))
        );
    }

    #[test]
    fn bad_vendor_files_and_vendor_names_stop_the_plugin_before_start() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = format!("--plugin-config-dir={}", tmp.path().display());
        assert!(matches!(
            parse(&[&dir]),
            Err(ConfigError::PluginConfigWithoutVendor)
        ));
        assert!(matches!(
            parse(&["--vendor=nvidia", &dir]),
            Err(ConfigError::PluginConfig(_))
        ));
        write_vendor_file(tmp.path(), "amd", "kudos.dev/gpu");
        write_vendor_file(tmp.path(), "nvidia", "example.com/accel");
        assert!(matches!(
            parse(&["--vendor=amd,nvidia", &dir]),
            Err(ConfigError::ConflictingResourceNames(..))
        ));
        let long = format!("--vendor={}", "v".repeat(21));
        let e = parse(&[&long]).expect_err("21 characters");
        assert!(e.to_string().starts_with("--vendor"), "{e}");
    }

    #[test]
    fn a_static_device_file_the_orchestrator_would_refuse_stops_the_plugin_before_start() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("devices.json");
        let flag = format!("--static-devices={}", file.display());
        let write = |vendor: &str| {
            let json = format!(
                r#"{{"version":"v1","vendor":"{vendor}","resourceName":"acme.com/npu","devices":[{{"id":"0"}}]}}"#
            );
            std::fs::write(&file, json).expect("write");
        };
        write(&"a".repeat(kudos_api::bounds::MAX_VENDOR_NAME_LEN));
        assert!(parse(&[&flag]).is_ok());
        write(&"a".repeat(kudos_api::bounds::MAX_VENDOR_NAME_LEN + 1));
        // Given without --backends (every backend tried), and with the static backend named.
        for extra in [None, Some("--backends=static")] {
            let mut args = vec![flag.as_str()];
            args.extend(extra);
            let e = parse(&args).expect_err("21 characters");
            assert!(matches!(e, ConfigError::StaticDevices(_)), "{e}");
            assert!(e.to_string().contains("more than 20"), "{e}");
        }
        // A backend list without the static one does not read the file.
        assert!(parse(&[&flag, "--backends=amd"]).is_ok());
    }
}
