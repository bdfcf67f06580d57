//! Configuration: the versioned YAML file, the command line, and the validated [`Settings`]
//! built from both before anything starts.
//!
//! Two stages (style guide, "Applied to Kudos" 8): [`FileConfig`] is the raw file
//! (`apiVersion: kudos.dev/v1alpha1`, `kind: OrchestratorConfig`, unknown fields rejected so a
//! typo fails at start instead of being silently ignored); [`crate::Args`] are the raw flags.
//! [`Settings::resolve`] merges them with precedence **CLI > environment > file > default**
//! (clap applies CLI over env; a flag or env value that is set replaces the file's value) and
//! validates the result. Errors name the field: serde_yaml prefixes its messages with the path
//! (`store.kind: unknown variant ...`), and our own checks use the YAML field names.

use crate::limits;
use kudos_scheduler_core::SchedulerConfig;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The only `apiVersion` this binary reads.
pub const API_VERSION: &str = "kudos.dev/v1alpha1";
/// The only `kind` this binary reads.
pub const KIND: &str = "OrchestratorConfig";
/// Default path prefix of the extender verbs (`<prefix>/filter`, ...).
pub const DEFAULT_EXTENDER_PREFIX: &str = "/kudos/v1";

/// Errors while reading or validating configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// File path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The YAML did not match the schema; the message names the field.
    #[error("parsing {path}: {source}")]
    Parse {
        /// File path.
        path: PathBuf,
        /// Cause, with the field path.
        #[source]
        source: serde_yaml::Error,
    },
    /// A field has a value this binary cannot use.
    #[error("invalid value for `{field}`: {reason}")]
    Invalid {
        /// YAML field path (or flag) at fault.
        field: &'static str,
        /// What is wrong and what is expected.
        reason: String,
    },
}

// === file format ===

/// The configuration file, `kudos.dev/v1alpha1` `OrchestratorConfig`. Every field but the two
/// type fields is optional; see `orchestrator/examples/config.yaml`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileConfig {
    /// Must be `kudos.dev/v1alpha1`.
    pub api_version: String,
    /// Must be `OrchestratorConfig`.
    pub kind: String,
    /// Unified resource name, default `kudos.dev/gpu`.
    #[serde(default)]
    pub unified_resource_name: Option<String>,
    /// Listen addresses.
    #[serde(default)]
    pub listen: ListenConfig,
    /// Extender limits and prefix.
    #[serde(default)]
    pub extender: ExtenderConfig,
    /// Where state lives.
    #[serde(default)]
    pub store: StoreConfig,
    /// Node monitoring.
    #[serde(default)]
    pub nodes: NodesConfig,
    /// Caller authentication for the gRPC API.
    #[serde(default)]
    pub auth: AuthConfig,
    /// HTTPS for the HTTP listener.
    #[serde(default)]
    pub tls: TlsConfig,
    /// Who may call the extender verbs and the read endpoints of the HTTP listener.
    #[serde(default)]
    pub access: AccessConfig,
    /// The mutating admission webhook `POST /mutate/pods`.
    #[serde(default)]
    pub admission: AdmissionConfig,
    /// `KudosNode` and `KudosClass` objects for `kubectl get` (see [`crate::publish`]).
    #[serde(default)]
    pub publish: PublishConfig,
    /// Scheduling policy handed to scheduler-core as is: classes (allowed vendors and models,
    /// minimum device memory, threshold factor), weights, priors.
    #[serde(default)]
    pub scheduler: Option<SchedulerConfig>,
    /// Plugin image derivation, DaemonSet rollout and node monitoring (off by default); see
    /// [`crate::rollout::config`].
    #[serde(default)]
    pub rollout: crate::rollout::config::RolloutFileConfig,
    /// Several replicas, one leading (off by default); see [`crate::leader`].
    #[serde(default)]
    pub leader_election: crate::leader::LeaderElectionFile,
}

/// Listen addresses.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListenConfig {
    /// HTTP: extender, health, metrics, explain, state. Default `0.0.0.0:8888`.
    pub http: Option<SocketAddr>,
    /// gRPC: RegistryService, TelemetryService. Default `0.0.0.0:8889`.
    pub grpc: Option<SocketAddr>,
}

/// Nodes `filter` passes by default: kube-scheduler's own least number of feasible nodes to
/// score in a large cluster (`minFeasibleNodesToFind`), so its preferences still choose among
/// as many nodes as it scores at the least without Kudos; a pod that fewer nodes fit is not
/// narrowed at all.
pub const DEFAULT_FILTER_TOP_NODES: usize = 100;

/// Extender settings.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExtenderConfig {
    /// Path prefix of the verbs, default `/kudos/v1`; set kube-scheduler's `urlPrefix` to
    /// `http://<host>:<port><prefix>`.
    pub path_prefix: Option<String>,
    /// Largest accepted request body, default 4 MiB (enough for 20,000 `NodeNames`); raise it
    /// for `nodeCacheCapable: false`, whose full `NodeList` for 5,000 nodes is ~30 MiB.
    pub max_body_bytes: Option<usize>,
    /// Per-request timeout for filter/prioritize, default 5 s.
    pub timeout_seconds: Option<f64>,
    /// Timeout for bind (it calls the API server), default 15 s.
    pub bind_timeout_seconds: Option<f64>,
    /// Requests served at once; more wait. Default 64.
    pub max_concurrent_requests: Option<usize>,
    /// Open HTTP connections; more are refused when accepted. Default 1024.
    pub max_connections: Option<usize>,
    /// Seconds a client has to send a request's headers before the connection is closed.
    /// Default 10.
    pub header_read_timeout_seconds: Option<f64>,
    /// A Kubernetes Event per GPU pod saying why Kudos ranked its nodes as it did (what
    /// `kubectl describe pod` shows), for pods Kudos does not bind itself: those it binds carry
    /// the line as their `kudos.dev/placement` annotation. Default true. Each Event is one
    /// more API-server write per pod; `/explain` answers the same question without it.
    pub pod_events: Option<bool>,
    /// `filter` passes only this many nodes, the best Kudos ranks for the pod; 0: every node
    /// that fits. Default [`DEFAULT_FILTER_TOP_NODES`]. kube-scheduler then runs its score
    /// plugins on those alone, most of its cost per pod in a large cluster, while its own
    /// preferences (image locality, preferred affinity, spreading) still choose among them.
    /// Gang members are not affected: their filter passes one node already.
    pub filter_top_nodes: Option<usize>,
}

/// Store kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "camelCase")]
pub enum StoreKind {
    /// Embedded redb file (default): the binary runs with no cluster.
    #[default]
    File,
    /// A ConfigMap in the cluster, so another replica can follow it and take over.
    ConfigMap,
}

/// Store settings.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoreConfig {
    /// `file` (default) or `configMap`.
    pub kind: Option<StoreKind>,
    /// File store path, default `kudos-orchestrator.redb` in the working directory.
    pub path: Option<PathBuf>,
    /// ConfigMap store namespace, default `kudos-system`.
    pub namespace: Option<String>,
    /// ConfigMap store name, default `kudos-orchestrator-state`.
    pub name: Option<String>,
    /// Seconds between model snapshots (reports are durable on their own), default 30.
    pub snapshot_interval_seconds: Option<f64>,
}

/// Node monitoring settings.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodesConfig {
    /// A node whose agent last sent a heartbeat longer ago than this is stale and excluded
    /// from ranking. Default 120 s. Nodes that never sent one are not stale (agents may not
    /// be deployed, and heartbeats are not persisted across restarts).
    pub heartbeat_max_age_seconds: Option<f64>,
    /// How nodes' kubelets allocate the unified resource: `devicePlugin` (default), `dra` or
    /// `auto` (DRA where the kubelet is v1.37+); a node's `kudos.dev/allocation-api` label
    /// overrides it.
    pub allocation_api: Option<crate::dra::AllocationPolicy>,
}

/// Authenticator kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "camelCase")]
pub enum AuthMode {
    /// TokenReview against the API server (default when a cluster is reachable).
    #[default]
    TokenReview,
    /// A static token → node file, for development and tests.
    Static,
}

/// Authentication settings.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthConfig {
    /// `tokenReview` or `static`.
    pub mode: Option<AuthMode>,
    /// For `static`: a YAML map `token: node-name`.
    pub static_tokens_file: Option<PathBuf>,
    /// TokenReview audiences to request (empty: the API server's default).
    #[serde(default)]
    pub audiences: Vec<String>,
    /// Usernames allowed to call (e.g. `system:serviceaccount:kudos-system:kudos-node-agent`);
    /// empty allows every node-bound service-account token.
    #[serde(default)]
    pub allowed_users: Vec<String>,
    /// How long a TokenReview answer is cached, default 60 s.
    pub cache_seconds: Option<f64>,
}

/// Settings of the `kubectl get` objects.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PublishConfig {
    /// Write `KudosNode` and `KudosClass` objects (the chart's CRDs must be installed).
    /// Default false; ignored in standalone mode.
    #[serde(default)]
    pub enabled: bool,
    /// Seconds between passes, default 15.
    pub interval_seconds: Option<f64>,
}

/// Admission webhook settings.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Serve `POST /mutate/pods`, which gives pods that request the unified resource and are
    /// left to `default-scheduler` this `schedulerName` (Kudos' own scheduler). Unset: no
    /// webhook route.
    pub pod_scheduler_name: Option<String>,
}

/// HTTPS settings: PEM files, usually a mounted Secret (`tls.crt`, `tls.key`, `ca.crt`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsConfig {
    /// Serving certificate chain; with `keyFile`, the HTTP listener speaks HTTPS only.
    pub cert_file: Option<PathBuf>,
    /// Private key of `certFile`.
    pub key_file: Option<PathBuf>,
    /// CA bundle that signs client certificates (kube-scheduler's); needed by
    /// `access.extender: clientCertificate`.
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<PathBuf>,
    /// Seconds between checks of the files for a renewed certificate, default 30.
    pub reload_interval_seconds: Option<f64>,
}

/// How a group of HTTP routes is authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ExtenderAccessMode {
    /// Anyone who reaches the port.
    Open,
    /// A client certificate signed by `tls.clientCAFile`.
    ClientCertificate,
}

/// How the read endpoints are authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReadAccessMode {
    /// Anyone who reaches the port.
    Open,
    /// A bearer token that TokenReview accepts, allowed `get` on the path by
    /// SubjectAccessReview.
    Kubernetes,
}

/// Access settings of the HTTP listener. Without them everything is open (and the
/// orchestrator says so at start); the Helm chart turns both on.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccessConfig {
    /// `clientCertificate` (default when `tls.clientCAFile` is set) or `open`.
    pub extender: Option<ExtenderAccessMode>,
    /// DNS names a client certificate must carry (one of) to call the extender; empty
    /// accepts any certificate the client CA signed.
    #[serde(default)]
    pub extender_client_names: Vec<String>,
    /// `kubernetes` or `open` (default).
    pub read: Option<ReadAccessMode>,
    /// Seconds an allowing review is cached, default 60.
    pub cache_seconds: Option<f64>,
}

impl FileConfig {
    /// Reads and parses a file, checking `apiVersion` and `kind`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { source, .. } => ConfigError::Parse {
                path: path.to_owned(),
                source,
            },
            other => other,
        })
    }

    /// Parses YAML text, checking `apiVersion` and `kind`.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let cfg: FileConfig = serde_yaml::from_str(text).map_err(|source| ConfigError::Parse {
            path: PathBuf::from("<config>"),
            source,
        })?;
        if cfg.api_version != API_VERSION {
            return Err(ConfigError::Invalid {
                field: "apiVersion",
                reason: format!(
                    "{:?} is not supported; use {API_VERSION:?}",
                    cfg.api_version
                ),
            });
        }
        if cfg.kind != KIND {
            return Err(ConfigError::Invalid {
                field: "kind",
                reason: format!("{:?} is not supported; use {KIND:?}", cfg.kind),
            });
        }
        Ok(cfg)
    }
}

// === validated settings ===

/// Everything the runtime needs, validated.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Unified resource name.
    pub unified_resource_name: String,
    /// HTTP listen address.
    pub http_listen: SocketAddr,
    /// gRPC listen address.
    pub grpc_listen: SocketAddr,
    /// Extender path prefix, starts with `/`, no trailing `/` (may be empty).
    pub extender_prefix: String,
    /// Body limit.
    pub max_body_bytes: usize,
    /// Filter/prioritize timeout.
    pub request_timeout: Duration,
    /// Bind timeout.
    pub bind_timeout: Duration,
    /// Concurrency limit of the HTTP server.
    pub max_concurrent_requests: usize,
    /// Open HTTP connections at most.
    pub max_connections: usize,
    /// Time a client has to send request headers.
    pub header_read_timeout: Duration,
    /// Whether the extender writes an Event per GPU pod it does not bind.
    pub pod_events: bool,
    /// How many of the best-ranked nodes `filter` passes, `None` for all that fit.
    pub filter_top_nodes: Option<usize>,
    /// Store kind.
    pub store_kind: StoreKind,
    /// File store path.
    pub store_path: PathBuf,
    /// ConfigMap store namespace.
    pub store_namespace: String,
    /// ConfigMap store name.
    pub store_name: String,
    /// Model snapshot period.
    pub snapshot_interval: Duration,
    /// Heartbeat max age, seconds.
    pub heartbeat_max_age_seconds: f64,
    /// How nodes' kubelets allocate the unified resource.
    pub allocation_policy: crate::dra::AllocationPolicy,
    /// Authenticator.
    pub auth_mode: AuthMode,
    /// Static token file.
    pub static_tokens_file: Option<PathBuf>,
    /// TokenReview audiences.
    pub audiences: Vec<String>,
    /// Allowed usernames (empty: any).
    pub allowed_users: Vec<String>,
    /// TokenReview cache lifetime.
    pub auth_cache: Duration,
    /// Kubeconfig path, if given.
    pub kubeconfig: Option<PathBuf>,
    /// Run without any cluster even if one is reachable.
    pub standalone: bool,
    /// Scheduling policy.
    pub scheduler: SchedulerConfig,
    /// Rollout (derived images, DaemonSets, node monitoring).
    pub rollout: crate::rollout::config::RolloutConfig,
    /// HTTPS material, if the listener speaks HTTPS.
    pub tls: Option<crate::tls::TlsFiles>,
    /// Seconds between TLS file checks.
    pub tls_reload_interval: Duration,
    /// Extender verbs: client certificate required.
    pub extender_access: ExtenderAccessMode,
    /// Allowed client certificate names.
    pub extender_client_names: Vec<String>,
    /// Read endpoints.
    pub read_access: ReadAccessMode,
    /// Cache lifetime of allowing reviews.
    pub access_cache: Duration,
    /// The admission webhook's scheduler name, if it is served.
    pub pod_scheduler_name: Option<String>,
    /// Period of the `kubectl get` objects, if they are written.
    pub publish_interval: Option<Duration>,
    /// Leader election, when several replicas run.
    pub leader_election: Option<crate::leader::ElectionConfig>,
}

/// The store's name: it names ConfigMaps and is their `kudos.dev/store` label value.
fn store_name(name: Option<String>) -> Result<String, ConfigError> {
    let name = name.unwrap_or_else(|| "kudos-orchestrator-state".to_owned());
    if name.len() > crate::store_k8s::MAX_NAME_LEN || !kudos_api::bounds::is_dns_label(&name) {
        return Err(ConfigError::Invalid {
            field: "store.name",
            reason: format!(
                "'{name}' must be a DNS label (lower-case letters, digits, '-') of at most {} characters",
                crate::store_k8s::MAX_NAME_LEN
            ),
        });
    }
    Ok(name)
}

fn positive_secs(field: &'static str, v: f64) -> Result<Duration, ConfigError> {
    if v.is_finite() && v > 0.0 && v < 1e9 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(ConfigError::Invalid {
            field,
            reason: format!("{v} must be a positive number of seconds"),
        })
    }
}

impl Settings {
    /// Merges CLI/env (already in `args`) over the file, applies defaults and validates.
    pub fn resolve(args: &crate::Args) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(p) => FileConfig::load(p)?,
            None => FileConfig::default(),
        };
        Self::merge(args, file)
    }

    /// [`Self::resolve`] with the file already parsed: reads no file named in `file` (token
    /// and certificate files are read when the servers start).
    pub fn merge(args: &crate::Args, file: FileConfig) -> Result<Self, ConfigError> {
        let unified = args
            .unified_resource_name
            .clone()
            .or(file.unified_resource_name)
            .unwrap_or_else(|| kudos_api::DEFAULT_UNIFIED_RESOURCE_NAME.to_owned());
        // The device plugin checks the name it is given with the same rules (the kubelet's).
        if let Err(e) = kudos_api::resource_name::validate(&unified) {
            return Err(ConfigError::Invalid {
                field: "unifiedResourceName",
                reason: e.to_string(),
            });
        }
        let prefix = extender_prefix(
            args.extender_prefix
                .clone()
                .or(file.extender.path_prefix)
                .unwrap_or_else(|| DEFAULT_EXTENDER_PREFIX.to_owned()),
        )?;
        let max_body_bytes = in_range(
            "extender.maxBodyBytes",
            file.extender.max_body_bytes,
            limits::DEFAULT_MAX_BODY_BYTES,
            1024..=limits::MAX_BODY_BYTES,
        )?;
        let max_concurrent_requests = in_range(
            "extender.maxConcurrentRequests",
            file.extender.max_concurrent_requests,
            64,
            1..=limits::MAX_CONCURRENT_REQUESTS,
        )?;
        let max_connections = in_range(
            "extender.maxConnections",
            file.extender.max_connections,
            limits::DEFAULT_MAX_CONNECTIONS,
            1..=limits::MAX_CONNECTIONS,
        )?;
        let header_read_timeout = positive_secs(
            "extender.headerReadTimeoutSeconds",
            file.extender
                .header_read_timeout_seconds
                .unwrap_or(limits::DEFAULT_HEADER_READ_TIMEOUT_SECONDS),
        )?;
        let heartbeat_max_age_seconds = args
            .heartbeat_max_age_seconds
            .or(file.nodes.heartbeat_max_age_seconds)
            .unwrap_or(120.0);
        positive_secs("nodes.heartbeatMaxAgeSeconds", heartbeat_max_age_seconds)?;
        let auth_mode = args.auth_mode.or(file.auth.mode).unwrap_or_default();
        let static_tokens_file = args
            .static_tokens_file
            .clone()
            .or(file.auth.static_tokens_file);
        if auth_mode == AuthMode::Static && static_tokens_file.is_none() {
            return Err(ConfigError::Invalid {
                field: "auth.staticTokensFile",
                reason: "required when auth.mode is `static` (--static-tokens-file)".into(),
            });
        }
        let rollout = crate::rollout::config::RolloutConfig::resolve(
            file.rollout,
            args.rollout,
            args.dry_run_rollout,
        )?;
        let (tls, extender_access) = tls_and_extender_access(&file.tls, &file.access)?;
        let scheduler = file.scheduler.unwrap_or_default();
        scheduler.validate().map_err(|e| ConfigError::Invalid {
            field: "scheduler",
            reason: e.to_string(),
        })?;
        let store_kind = args.store.or(file.store.kind).unwrap_or_default();
        let store_namespace = file
            .store
            .namespace
            .clone()
            .unwrap_or_else(|| "kudos-system".to_owned());
        let leader_election = crate::leader::resolve(
            &file.leader_election,
            args.leader_elect,
            store_kind,
            &store_namespace,
        )?;
        Ok(Settings {
            leader_election,
            unified_resource_name: unified,
            http_listen: args
                .http_listen
                .or(file.listen.http)
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8888))),
            grpc_listen: args
                .grpc_listen
                .or(file.listen.grpc)
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8889))),
            extender_prefix: prefix,
            max_body_bytes,
            request_timeout: positive_secs(
                "extender.timeoutSeconds",
                file.extender.timeout_seconds.unwrap_or(5.0),
            )?,
            bind_timeout: positive_secs(
                "extender.bindTimeoutSeconds",
                file.extender.bind_timeout_seconds.unwrap_or(15.0),
            )?,
            max_concurrent_requests,
            max_connections,
            header_read_timeout,
            pod_events: args.pod_events.or(file.extender.pod_events).unwrap_or(true),
            filter_top_nodes: Some(
                args.filter_top_nodes
                    .or(file.extender.filter_top_nodes)
                    .unwrap_or(DEFAULT_FILTER_TOP_NODES),
            )
            .filter(|&n| n > 0),
            store_kind,
            store_path: args
                .store_path
                .clone()
                .or(file.store.path)
                .unwrap_or_else(|| PathBuf::from("kudos-orchestrator.redb")),
            store_namespace,
            store_name: store_name(file.store.name)?,
            snapshot_interval: positive_secs(
                "store.snapshotIntervalSeconds",
                file.store.snapshot_interval_seconds.unwrap_or(30.0),
            )?,
            heartbeat_max_age_seconds,
            allocation_policy: args
                .allocation_api
                .or(file.nodes.allocation_api)
                .unwrap_or_default(),
            auth_mode,
            static_tokens_file,
            audiences: file.auth.audiences,
            allowed_users: file.auth.allowed_users,
            auth_cache: positive_secs(
                "auth.cacheSeconds",
                file.auth.cache_seconds.unwrap_or(60.0),
            )?,
            kubeconfig: args.kubeconfig.clone(),
            standalone: args.standalone,
            scheduler,
            rollout,
            tls,
            tls_reload_interval: positive_secs(
                "tls.reloadIntervalSeconds",
                file.tls.reload_interval_seconds.unwrap_or(30.0),
            )?,
            extender_access,
            extender_client_names: file.access.extender_client_names,
            read_access: file.access.read.unwrap_or(ReadAccessMode::Open),
            access_cache: positive_secs(
                "access.cacheSeconds",
                file.access.cache_seconds.unwrap_or(60.0),
            )?,
            pod_scheduler_name: pod_scheduler_name(file.admission.pod_scheduler_name)?,
            publish_interval: match file.publish.enabled {
                true => Some(positive_secs(
                    "publish.intervalSeconds",
                    file.publish.interval_seconds.unwrap_or(15.0),
                )?),
                false => None,
            },
        })
    }
}

/// `admission.podSchedulerName`: a DNS subdomain, as `spec.schedulerName` must be.
fn pod_scheduler_name(name: Option<String>) -> Result<Option<String>, ConfigError> {
    let Some(name) = name else { return Ok(None) };
    if !kudos_api::bounds::is_dns_subdomain(&name) {
        return Err(ConfigError::Invalid {
            field: "admission.podSchedulerName",
            reason: format!("{name:?} is not a scheduler name (a lowercase DNS subdomain)"),
        });
    }
    if name == crate::admission::DEFAULT_SCHEDULER {
        return Err(ConfigError::Invalid {
            field: "admission.podSchedulerName",
            reason: "must name Kudos' scheduler, not default-scheduler".into(),
        });
    }
    Ok(Some(name))
}

/// The TLS files and the extender's access mode, checked together: a client certificate
/// can only be required over HTTPS with a client CA.
fn tls_and_extender_access(
    tls: &TlsConfig,
    access: &AccessConfig,
) -> Result<(Option<crate::tls::TlsFiles>, ExtenderAccessMode), ConfigError> {
    let files = match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => Some(crate::tls::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: tls.client_ca_file.clone(),
        }),
        (None, None) if tls.client_ca_file.is_none() => None,
        _ => {
            return Err(ConfigError::Invalid {
                field: "tls",
                reason: "certFile and keyFile go together (and clientCAFile needs both)".into(),
            });
        }
    };
    let has_client_ca = files.as_ref().is_some_and(|f| f.client_ca.is_some());
    let mode = access.extender.unwrap_or(if has_client_ca {
        ExtenderAccessMode::ClientCertificate
    } else {
        ExtenderAccessMode::Open
    });
    if mode == ExtenderAccessMode::ClientCertificate && !has_client_ca {
        return Err(ConfigError::Invalid {
            field: "access.extender",
            reason: "clientCertificate needs tls.certFile, tls.keyFile and tls.clientCAFile".into(),
        });
    }
    Ok((files, mode))
}

/// A count from the file within `range`, or `default` when absent.
fn in_range(
    field: &'static str,
    v: Option<usize>,
    default: usize,
    range: std::ops::RangeInclusive<usize>,
) -> Result<usize, ConfigError> {
    let v = v.unwrap_or(default);
    if range.contains(&v) {
        Ok(v)
    } else {
        Err(ConfigError::Invalid {
            field,
            reason: format!("{v} is outside {}..={}", range.start(), range.end()),
        })
    }
}

/// The extender prefix without trailing `/`: empty, or `/`-separated non-empty segments of
/// unreserved URL characters. Route syntax (`{`, `:`, `*`) would make the router panic.
fn extender_prefix(mut prefix: String) -> Result<String, ConfigError> {
    while prefix.ends_with('/') {
        prefix.pop();
    }
    let invalid = |reason: String| ConfigError::Invalid {
        field: "extender.pathPrefix",
        reason,
    };
    if prefix.is_empty() {
        return Ok(prefix);
    }
    let Some(rest) = prefix.strip_prefix('/') else {
        return Err(invalid(format!("{prefix:?} must start with `/`")));
    };
    let unreserved = |c: char| c.is_ascii_alphanumeric() || "-._~".contains(c);
    if rest
        .split('/')
        .any(|seg| seg.is_empty() || !seg.chars().all(unreserved))
    {
        return Err(invalid(format!(
            "{prefix:?} must be `/`-separated non-empty segments of letters, digits and `-._~`"
        )));
    }
    if prefix.len() > limits::MAX_OBJECT_NAME_LEN {
        return Err(invalid(format!(
            "{prefix:?} is longer than {} characters",
            limits::MAX_OBJECT_NAME_LEN
        )));
    }
    Ok(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_webhook_scheduler_name_is_a_dns_subdomain_other_than_the_default() {
        for ok in ["kudos", "kudos.v1", "gpu-scheduler"] {
            let got = pod_scheduler_name(Some(ok.into())).ok().flatten();
            assert_eq!(got.as_deref(), Some(ok));
        }
        assert!(matches!(pod_scheduler_name(None), Ok(None)));
        let long_label = "a".repeat(64);
        for bad in [
            "",
            "Kudos",
            "-kudos",
            "kudos.",
            "a..b",
            "kudos_1",
            &long_label,
            "default-scheduler",
        ] {
            assert!(pod_scheduler_name(Some(bad.into())).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_store_name_is_a_short_dns_label() {
        assert_eq!(
            store_name(None).ok().as_deref(),
            Some("kudos-orchestrator-state")
        );
        assert!(store_name(Some("kudos-state".into())).is_ok());
        for bad in ["Kudos", "a.b", "-a", &"a".repeat(41), ""] {
            let e = store_name(Some(bad.into())).unwrap_err().to_string();
            assert!(e.contains("store.name") && e.contains("40"), "{e}");
        }
    }

    #[test]
    fn example_config_parses() {
        let text = include_str!("../examples/config.yaml");
        let cfg = FileConfig::parse(text).expect("example parses");
        assert_eq!(cfg.unified_resource_name.as_deref(), Some("kudos.dev/gpu"));
        assert!(cfg.scheduler.is_some());
    }

    #[test]
    fn unknown_field_is_named() {
        let text = "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\nstore:\n  pth: x\n";
        let err = FileConfig::parse(text).unwrap_err().to_string();
        assert!(err.contains("store") && err.contains("pth"), "{err}");
    }

    #[test]
    fn tls_and_access_are_checked_together() {
        let parse = |yaml: &str| {
            let cfg = FileConfig::parse(&format!(
                "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\n{yaml}"
            ))
            .unwrap();
            tls_and_extender_access(&cfg.tls, &cfg.access)
        };
        let err = parse("tls:\n  certFile: /c\n").unwrap_err().to_string();
        assert!(err.contains("`tls`") && err.contains("keyFile"), "{err}");
        let err = parse("access:\n  extender: clientCertificate\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("access.extender") && err.contains("clientCAFile"),
            "{err}"
        );
        let (files, mode) = parse("tls: {certFile: /c, keyFile: /k, clientCAFile: /ca}\n").unwrap();
        assert_eq!(
            mode,
            ExtenderAccessMode::ClientCertificate,
            "a client CA means mTLS"
        );
        assert_eq!(files.unwrap().client_ca.as_deref(), Some(Path::new("/ca")));
        let (files, mode) = parse("").unwrap();
        assert!(files.is_none());
        assert_eq!(mode, ExtenderAccessMode::Open);
        assert!(FileConfig::parse("apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\naccess: {read: everyone}\n").is_err());
    }

    #[test]
    fn wrong_version_is_rejected() {
        let text = "apiVersion: kudos.dev/v9\nkind: OrchestratorConfig\n";
        let err = FileConfig::parse(text).unwrap_err().to_string();
        assert!(err.contains("apiVersion"), "{err}");
    }
}

#[cfg(test)]
mod precedence_tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn cli_overrides_file_and_file_overrides_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(
            &path,
            "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\nlisten:\n  http: 127.0.0.1:1000\n  grpc: 127.0.0.1:2000\nextender:\n  pathPrefix: /x/\n",
        )
        .unwrap();
        let args = crate::Args::try_parse_from([
            "kudos-orchestrator",
            "--config",
            path.to_str().unwrap(),
            "--http-listen",
            "127.0.0.1:3000",
        ])
        .unwrap();
        let s = Settings::resolve(&args).unwrap();
        assert_eq!(s.http_listen.port(), 3000, "CLI wins");
        assert_eq!(s.grpc_listen.port(), 2000, "file beats default");
        assert_eq!(s.extender_prefix, "/x");
        assert_eq!(
            s.unified_resource_name,
            kudos_api::DEFAULT_UNIFIED_RESOURCE_NAME
        );
        assert_eq!(
            s.filter_top_nodes,
            Some(DEFAULT_FILTER_TOP_NODES),
            "filter narrows by default"
        );
    }

    #[test]
    fn filter_top_nodes_comes_from_the_file_or_the_flag_and_zero_means_every_node() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(
            &path,
            "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\nextender:\n  filterTopNodes: 8\n",
        )
        .unwrap();
        let resolve = |extra: &[&str]| {
            let mut argv = vec!["kudos-orchestrator", "--config", path.to_str().unwrap()];
            argv.extend_from_slice(extra);
            Settings::resolve(&crate::Args::try_parse_from(argv).unwrap())
                .unwrap()
                .filter_top_nodes
        };
        assert_eq!(resolve(&[]), Some(8));
        assert_eq!(resolve(&["--filter-top-nodes", "3"]), Some(3));
        assert_eq!(resolve(&["--filter-top-nodes", "0"]), None);
        assert!(
            crate::Args::try_parse_from(["kudos-orchestrator", "--filter-top-nodes", "-1"])
                .is_err()
        );
    }

    #[test]
    fn invalid_values_name_their_field() {
        let text = "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\nscheduler:\n  threshold_factor: 0.5\n";
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, text).unwrap();
        let args = crate::Args::try_parse_from(["x", "--config", path.to_str().unwrap()]).unwrap();
        let e = Settings::resolve(&args).unwrap_err().to_string();
        assert!(
            e.contains("scheduler") && e.contains("threshold_factor"),
            "{e}"
        );
        let args = crate::Args::try_parse_from(["x", "--unified-resource-name", "gpu"]).unwrap();
        let e = Settings::resolve(&args).unwrap_err().to_string();
        assert!(e.contains("unifiedResourceName"), "{e}");
    }

    fn resolve_file(extender: &str) -> Result<Settings, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        let text = format!(
            "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\nextender:\n{extender}"
        );
        std::fs::write(&path, text).unwrap();
        let args = crate::Args::try_parse_from(["x", "--config", path.to_str().unwrap()]).unwrap();
        Settings::resolve(&args)
    }

    /// Values that used to panic at start (a semaphore of 2^61 permits, route syntax in the
    /// prefix) are configuration errors naming their field.
    #[test]
    fn out_of_range_limits_and_route_syntax_are_config_errors() {
        for (yaml, field) in [
            (
                "  maxConcurrentRequests: 2305843009213693952\n",
                "extender.maxConcurrentRequests",
            ),
            (
                "  maxConcurrentRequests: 0\n",
                "extender.maxConcurrentRequests",
            ),
            ("  maxConnections: 0\n", "extender.maxConnections"),
            (
                "  maxBodyBytes: 18446744073709551615\n",
                "extender.maxBodyBytes",
            ),
            (
                "  headerReadTimeoutSeconds: -1\n",
                "extender.headerReadTimeoutSeconds",
            ),
            ("  pathPrefix: /kudos/{v1}\n", "extender.pathPrefix"),
            ("  pathPrefix: /kudos/:verb\n", "extender.pathPrefix"),
            ("  pathPrefix: /kudos/*rest\n", "extender.pathPrefix"),
            ("  pathPrefix: /a//b\n", "extender.pathPrefix"),
        ] {
            let e = resolve_file(yaml).unwrap_err().to_string();
            assert!(e.contains(field), "{yaml}: {e}");
        }
        let s = resolve_file("  pathPrefix: /kudos/v1.2_x~y/\n").unwrap();
        assert_eq!(s.extender_prefix, "/kudos/v1.2_x~y");
        assert_eq!(s.max_body_bytes, limits::DEFAULT_MAX_BODY_BYTES);
    }
}
