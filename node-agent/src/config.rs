//! Command-line flags (each with an environment fallback) and their validation.
//!
//! Raw flags ([`Args`]) are parsed by clap; [`Args::validate`] checks them together so the
//! agent refuses a bad combination at start-up instead of misbehaving later.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// Where GPU readings come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GpuBackendKind {
    /// NVML if it loads, otherwise no GPUs (AMD or CPU-only nodes keep reporting runs).
    Auto,
    /// NVML; fail at start-up if it does not load.
    Nvml,
    /// No sampling; runs are still reported from PodResources, without GPU figures.
    None,
    /// In-memory fake GPUs (`--fake-gpus`), for tests and benchmarks only.
    Fake,
}

/// Where pod labels and annotations come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PodMetadataKind {
    /// Watch the pods of this node on the API server (in-cluster config or kubeconfig).
    Kube,
    /// No API server: class, work and UID are reported empty, runs timed from allocation.
    None,
}

/// Kudos node agent: samples GPUs while pods run, attributes them to pods through the kubelet
/// PodResources API and reports each run to the orchestrator through a durable outbox.
#[derive(Clone, Debug, Parser)]
#[command(name = "kudos-node-agent", version, about, long_about = None)]
pub struct Args {
    /// This node's name (the Kubernetes node name; set it from the downward API `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,

    /// Sampling period, e.g. `1s`, `500ms`.
    #[arg(long, env = "KUDOS_SAMPLE_PERIOD", default_value = "1s", value_parser = kudos_common::duration::parse_positive)]
    pub sample_period: Duration,

    /// Deadline for reading one device; a slower device is reported as failing for that round.
    #[arg(long, env = "KUDOS_SAMPLE_TIMEOUT", default_value = "800ms", value_parser = kudos_common::duration::parse_positive)]
    pub sample_timeout: Duration,

    /// A device counts as busy above this utilisation, in percent.
    #[arg(long, env = "KUDOS_BUSY_THRESHOLD_PERCENT", default_value_t = 10.0)]
    pub busy_threshold_percent: f64,

    /// Period of in-progress snapshots of a running run (`0` disables them).
    #[arg(long, env = "KUDOS_PROGRESS_PERIOD", default_value = "60s", value_parser = kudos_common::duration::parse)]
    pub progress_period: Duration,

    /// GPU backend.
    #[arg(long, env = "KUDOS_GPU_BACKEND", value_enum, default_value_t = GpuBackendKind::Auto)]
    pub gpu_backend: GpuBackendKind,

    /// Path of `libnvidia-ml.so.1` (default: the dynamic loader's search path).
    #[arg(long, env = "KUDOS_NVML_LIBRARY")]
    pub nvml_library: Option<PathBuf>,

    /// Number of fake GPUs for `--gpu-backend fake` (tests and benchmarks only).
    #[arg(long, env = "KUDOS_FAKE_GPUS", default_value_t = 8, hide = true)]
    pub fake_gpus: u32,

    /// Kubelet PodResources socket.
    #[arg(long, env = "KUDOS_POD_RESOURCES_SOCKET", default_value = kudos_proto::podresources::v1::DEFAULT_SOCKET)]
    pub pod_resources_socket: PathBuf,

    /// Extended resource names whose devices are attributed (comma-separated or repeated): the
    /// unified name first, then vendor names.
    #[arg(
        long = "resource-name",
        env = "KUDOS_RESOURCE_NAMES",
        value_delimiter = ',',
        default_value = "kudos.dev/gpu,nvidia.com/gpu,amd.com/gpu"
    )]
    pub resource_names: Vec<String>,

    /// Source of pod class, work, UID and container start/finish times (which time runs from
    /// container start; without them, from device allocation).
    #[arg(long, env = "KUDOS_POD_METADATA", value_enum, default_value_t = PodMetadataKind::None)]
    pub pod_metadata: PodMetadataKind,

    /// How long a run whose pod the metadata does not show may be missing from successful
    /// PodResources listings before it ends, counted from the first listing that lacks it and
    /// only since the kubelet last answered (its end is still reported as that listing). A
    /// restarted kubelet lists its pods again within seconds; `0` ends a run at the first
    /// listing that lacks it. With pod metadata a run ends when its pod or container does.
    #[arg(long, env = "KUDOS_RUN_END_GRACE", default_value = "10s", value_parser = kudos_common::duration::parse)]
    pub run_end_grace: Duration,

    /// Orchestrator gRPC URL, e.g. `http://kudos-orchestrator.kudos-system.svc:8889` (also
    /// accepted as `--orchestrator-addr`, the device plugin's name). Without it reports are kept
    /// in the outbox until an agent with a URL sends them.
    #[arg(
        long,
        env = "KUDOS_ORCHESTRATOR_URL",
        visible_alias = "orchestrator-addr"
    )]
    pub orchestrator_url: Option<String>,

    /// PEM CA bundle that signs the orchestrator's certificate; required when
    /// --orchestrator-url is https:// (the token then never crosses the network in the clear).
    #[arg(long, env = "KUDOS_ORCHESTRATOR_CA_FILE")]
    pub orchestrator_ca_file: Option<PathBuf>,

    /// Projected service-account token sent as `authorization: Bearer`; re-read for every stream
    /// and heartbeat, so rotation needs no restart.
    #[arg(long, env = "KUDOS_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,

    /// Heartbeat period (the orchestrator may suggest another).
    #[arg(long, env = "KUDOS_HEARTBEAT_PERIOD", default_value = "15s", value_parser = kudos_common::duration::parse_positive)]
    pub heartbeat_period: Duration,

    /// First reconnect delay; doubles per failure up to `--backoff-max`, half of it random.
    #[arg(long, env = "KUDOS_BACKOFF_MIN", default_value = "500ms", value_parser = kudos_common::duration::parse_positive)]
    pub backoff_min: Duration,

    /// Largest reconnect delay.
    #[arg(long, env = "KUDOS_BACKOFF_MAX", default_value = "30s", value_parser = kudos_common::duration::parse_positive)]
    pub backoff_max: Duration,

    /// Reports sent but not yet acknowledged, at most.
    #[arg(long, env = "KUDOS_MAX_IN_FLIGHT", default_value_t = 256)]
    pub max_in_flight: usize,

    /// Connect and call timeout towards the kubelet and the orchestrator.
    #[arg(long, env = "KUDOS_RPC_TIMEOUT", default_value = "5s", value_parser = kudos_common::duration::parse_positive)]
    pub rpc_timeout: Duration,

    /// Outbox directory (created `0700`); must survive agent restarts (a hostPath).
    #[arg(
        long,
        env = "KUDOS_OUTBOX_DIR",
        default_value = "/var/lib/kudos/node-agent"
    )]
    pub outbox_dir: PathBuf,

    /// Outbox capacity in reports; when full, in-progress snapshots are dropped first and
    /// completed runs are refused with an error, never dropped silently.
    #[arg(long, env = "KUDOS_OUTBOX_MAX_REPORTS", default_value_t = 50_000)]
    pub outbox_max_reports: u64,

    /// Address of `/metrics` and `/healthz`.
    #[arg(long, env = "KUDOS_METRICS_ADDR", default_value = "0.0.0.0:9410")]
    pub metrics_addr: SocketAddr,

    /// TEST ONLY: put this many synthetic completed-run reports in the outbox at start-up, once
    /// per outbox (IDs `synthetic-<node>-<i>`). Used by the crash-recovery integration test.
    #[arg(long, env = "KUDOS_SYNTHETIC_REPORTS", hide = true)]
    pub synthetic_reports: Option<u32>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub log: kudos_common::LogArgs,
}

/// A flag combination that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl Args {
    /// Checks the flags together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError(m.to_owned()));
        if self.node_name.trim().is_empty() {
            return bad("--node-name (NODE_NAME) is empty");
        }
        if self.sample_period < Duration::from_millis(10) {
            return bad("--sample-period must be at least 10ms");
        }
        if self.sample_timeout.is_zero() {
            return bad("--sample-timeout must be positive");
        }
        if !(0.0..100.0).contains(&self.busy_threshold_percent) {
            return bad("--busy-threshold-percent must be in 0..100");
        }
        if self.resource_names.iter().all(|r| r.trim().is_empty()) {
            return bad("--resource-name needs at least one name");
        }
        if self.max_in_flight == 0 || self.outbox_max_reports == 0 {
            return bad("--max-in-flight and --outbox-max-reports must be positive");
        }
        if self.backoff_min.is_zero() {
            return bad("--backoff-min must be positive");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_flags_are_bounded_and_periods_positive() {
        let parse = |flag: &str, v: &str| {
            Args::try_parse_from(["kudos-node-agent", "--node-name", "n1", flag, v])
        };
        let a = parse("--rpc-timeout", "2m").expect("parse");
        assert_eq!(a.rpc_timeout, Duration::from_secs(120));
        // Huge values overflowed `rpc_timeout * 12` and `sample_period * 10` (a panic).
        for (flag, v) in [
            ("--rpc-timeout", "2e18"),
            ("--sample-period", "10000000000000000000"),
            ("--heartbeat-period", "8d"),
            ("--sample-period", "0s"),
        ] {
            let e = parse(flag, v).expect_err(v).to_string();
            assert!(e.contains(flag), "{flag}={v}: {e}");
        }
        assert_eq!(
            parse("--run-end-grace", "0")
                .expect("0 allowed")
                .run_end_grace,
            Duration::ZERO
        );
    }

    #[test]
    fn orchestrator_url_accepts_the_device_plugins_flag_name_too() {
        let url = "http://kudos-orchestrator.kudos-system.svc:8889";
        for flag in ["--orchestrator-url", "--orchestrator-addr"] {
            let a = Args::try_parse_from(["kudos-node-agent", "--node-name", "n1", flag, url])
                .expect("parse");
            assert_eq!(a.orchestrator_url.as_deref(), Some(url), "{flag}");
        }
    }

    #[test]
    fn defaults_validate_and_env_names_are_documented() {
        let a = Args::try_parse_from(["kudos-node-agent", "--node-name", "n1"]).expect("parse");
        a.validate().expect("valid");
        assert_eq!(
            a.resource_names,
            vec!["kudos.dev/gpu", "nvidia.com/gpu", "amd.com/gpu"]
        );
        assert_eq!(a.sample_period, Duration::from_secs(1));
        assert_eq!(a.run_end_grace, Duration::from_secs(10));
        let help = <Args as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        for env in [
            "NODE_NAME",
            "KUDOS_SAMPLE_PERIOD",
            "KUDOS_ORCHESTRATOR_URL",
            "KUDOS_TOKEN_FILE",
            "KUDOS_OUTBOX_DIR",
            "KUDOS_RUN_END_GRACE",
        ] {
            assert!(help.contains(env), "{env} missing from --help");
        }
        let bad = Args::try_parse_from([
            "kudos-node-agent",
            "--node-name",
            "n1",
            "--busy-threshold-percent",
            "120",
        ])
        .expect("parse");
        assert!(bad.validate().is_err());
    }
}
