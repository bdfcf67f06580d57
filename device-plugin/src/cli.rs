//! Flags (each with an environment fallback; flag > env > default) and their validation into
//! [`Settings`] before anything starts.

use crate::health::XidIgnoreList;
use clap::{Parser, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "kudos-device-plugin",
    version,
    about = "Kudos device plugin: discovers accelerators on a node and serves them to the kubelet under one unified resource name."
)]
pub struct Args {
    #[command(flatten)]
    pub log: kudos_common::LogArgs,

    /// This node's name, as reported to the orchestrator (Kubernetes downward API:
    /// spec.nodeName). Defaults to the host name.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// The kubelet's device-plugin directory (holds kubelet.sock and our socket).
    #[arg(long, env = "KUDOS_DEVICE_PLUGIN_DIR", default_value = kudos_proto::deviceplugin::v1beta1::DEVICE_PLUGIN_PATH)]
    pub device_plugin_dir: PathBuf,

    /// File name of this plugin's socket inside --device-plugin-dir.
    #[arg(long, env = "KUDOS_PLUGIN_SOCKET", default_value = "kudos.sock")]
    pub socket_name: String,

    /// Backends to use, comma-separated. When not given, every backend that finds devices is
    /// used and a missing NVML is not an error; when given, a failing backend stops the plugin.
    #[arg(long, env = "KUDOS_BACKENDS", value_enum, value_delimiter = ',')]
    pub backends: Option<Vec<BackendKind>>,

    /// Path of libnvidia-ml.so.1 (default: found by the dynamic loader).
    #[arg(long, env = "KUDOS_NVML_LIBRARY")]
    pub nvml_library: Option<PathBuf>,

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

    /// Resource name used when the orchestrator has never answered (and no cached name exists).
    #[arg(long, env = "KUDOS_RESOURCE_NAME", default_value = kudos_api::DEFAULT_UNIFIED_RESOURCE_NAME)]
    pub resource_name: String,

    /// File caching the last unified name the orchestrator gave.
    #[arg(
        long,
        env = "KUDOS_NAME_CACHE",
        default_value = "/var/lib/kudos/device-plugin/resource-name"
    )]
    pub name_cache: PathBuf,

    /// Orchestrator gRPC address, e.g. http://kudos-orchestrator.kudos-system.svc:8889 (also
    /// accepted as --orchestrator-url, the node agent's name). When absent the plugin registers
    /// under --resource-name and reports nothing.
    #[arg(
        long,
        env = "KUDOS_ORCHESTRATOR_ADDR",
        visible_alias = "orchestrator-url"
    )]
    pub orchestrator_addr: Option<String>,

    /// Projected service-account token sent as a bearer token to the orchestrator (re-read on
    /// every report; skipped when missing).
    #[arg(
        long,
        env = "KUDOS_TOKEN_FILE",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )]
    pub token_file: PathBuf,

    /// Timeout of each orchestrator call, in seconds.
    #[arg(
        long,
        env = "KUDOS_ORCHESTRATOR_TIMEOUT_SECONDS",
        default_value_t = 3.0
    )]
    pub orchestrator_timeout_seconds: f64,

    /// Seconds between reports after a successful one.
    #[arg(long, env = "KUDOS_REPORT_INTERVAL_SECONDS", default_value_t = 300.0)]
    pub report_interval_seconds: f64,

    /// Largest back-off between failed reports, in seconds.
    #[arg(long, env = "KUDOS_REPORT_MAX_BACKOFF_SECONDS", default_value_t = 60.0)]
    pub report_max_backoff_seconds: f64,

    /// XIDs that do not mark a GPU unhealthy: a comma-separated list, "default"
    /// (13,31,43,45,68,109) or "none".
    #[arg(long, env = "KUDOS_IGNORE_XIDS", default_value = "default")]
    pub ignore_xids: XidIgnoreList,

    /// An unhealthy device recovers when its probe passes and no critical event arrived for
    /// this many seconds.
    #[arg(long, env = "KUDOS_RECOVERY_QUIET_SECONDS", default_value_t = 60.0)]
    pub recovery_quiet_seconds: f64,

    /// Seconds between device probes (NVML answering, device present).
    #[arg(long, env = "KUDOS_PROBE_INTERVAL_SECONDS", default_value_t = 5.0)]
    pub probe_interval_seconds: f64,

    /// Address for /metrics, /healthz and /ready; "off" disables.
    #[arg(long, env = "KUDOS_METRICS_ADDR", default_value = "0.0.0.0:9401")]
    pub metrics_addr: String,
}

/// Invalid flag values.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A resource name breaks the kubelet's rules.
    #[error("--resource-name: {0}")]
    ResourceName(#[from] kudos_api::ResourceNameError),
    /// A duration is negative, zero or not finite.
    #[error("--{0} must be a positive number of seconds")]
    Duration(&'static str),
    /// The metrics address is not an address.
    #[error("--metrics-addr {0:?} is not host:port or \"off\"")]
    MetricsAddr(String),
    /// The socket name is not a plain file name.
    #[error("--socket-name {0:?} must be a file name (no '/') other than kubelet.sock")]
    SocketName(String),
    /// No node name and no host name.
    #[error("--node-name is not set and the host name cannot be read")]
    NodeName,
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
    /// Whether backends were named explicitly.
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
    /// Metrics address; `None` = off.
    pub metrics_addr: Option<SocketAddr>,
}

fn secs(v: f64, flag: &'static str) -> Result<Duration, ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(ConfigError::Duration(flag))
    }
}

impl Args {
    /// Validates the arguments.
    pub fn settings(self) -> Result<Settings, ConfigError> {
        kudos_api::resource_name::validate(&self.resource_name)?;
        if self.socket_name.is_empty()
            || self.socket_name.contains('/')
            || self.socket_name == kudos_proto::deviceplugin::v1beta1::KUBELET_SOCKET
        {
            return Err(ConfigError::SocketName(self.socket_name));
        }
        let metrics_addr = match self.metrics_addr.as_str() {
            "off" | "" => None,
            a => Some(a.parse().map_err(|_| ConfigError::MetricsAddr(a.into()))?),
        };
        let node_name = match self.node_name.filter(|n| !n.is_empty()) {
            Some(n) => n,
            None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .ok()
                .filter(|h| !h.is_empty())
                .ok_or(ConfigError::NodeName)?,
        };
        let backends_explicit = self.backends.is_some();
        let mut backends = self
            .backends
            .unwrap_or_else(|| vec![BackendKind::Nvidia, BackendKind::Amd, BackendKind::Static]);
        backends.dedup();
        Ok(Settings {
            node_name,
            device_plugin_dir: self.device_plugin_dir,
            socket_name: self.socket_name,
            backends,
            backends_explicit,
            nvidia: crate::backend::nvidia::NvidiaOptions {
                library: self.nvml_library,
                device_specs: self.nvidia_device_specs,
                dev_root: self.dev_root.clone(),
                cdi: self.cdi,
                ignored_xids: self.ignore_xids,
            },
            sysfs_root: self.sysfs_root,
            static_devices: self.static_devices,
            default_name: self.resource_name,
            name_cache: self.name_cache,
            orchestrator_addr: self.orchestrator_addr.filter(|a| !a.is_empty()),
            token_file: self.token_file,
            orchestrator_timeout: secs(
                self.orchestrator_timeout_seconds,
                "orchestrator-timeout-seconds",
            )?,
            report: crate::registry::ReportPolicy {
                initial_backoff: Duration::from_millis(500),
                max_backoff: secs(
                    self.report_max_backoff_seconds,
                    "report-max-backoff-seconds",
                )?,
                interval: secs(self.report_interval_seconds, "report-interval-seconds")?,
            },
            recovery_quiet: secs(self.recovery_quiet_seconds, "recovery-quiet-seconds")?,
            probe_interval: secs(self.probe_interval_seconds, "probe-interval-seconds")?,
            metrics_addr,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Settings, ConfigError> {
        let mut argv = vec!["kudos-device-plugin", "--node-name=n1"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).expect("parses").settings()
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
        assert!(matches!(
            parse(&["--probe-interval-seconds=0"]),
            Err(ConfigError::Duration(_))
        ));
        assert!(Args::try_parse_from(["x", "--ignore-xids=13,abc"]).is_err());
        assert!(Args::try_parse_from(["x", "--backends=nvidia,intel"]).is_err());
        let s =
            parse(&["--backends=amd", "--metrics-addr=off", "--ignore-xids=none"]).expect("valid");
        assert!(
            s.backends_explicit && s.metrics_addr.is_none() && !s.nvidia.ignored_xids.ignores(13)
        );
    }
}
