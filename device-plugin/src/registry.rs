//! The unified resource name: ask the orchestrator (`RegistryService.ReportPlugin`), cache the
//! answer on disk, and fall back to the cache or the configured default when the control
//! plane cannot be reached, so a node never loses its GPUs because the orchestrator is down.
//! A background task keeps reporting with exponential back-off and publishes name changes.

use crate::backend::Backends;
use crate::health::HealthMap;
use crate::metrics::Metrics;
use kudos_proto::kudos::v1 as kapi;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tonic::transport::Channel;

/// Errors from reporting.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The orchestrator address is not a valid URI.
    #[error("invalid orchestrator address {0:?}: {1}")]
    Address(String, #[source] kudos_common::grpc_tls::ChannelError),
    /// The call failed (unreachable, timeout, refused).
    #[error("ReportPlugin for {vendor} failed: {status}")]
    Call {
        /// Vendor reported.
        vendor: String,
        /// gRPC status.
        #[source]
        status: tonic::Status,
    },
    /// The orchestrator answered a name the kubelet would reject.
    #[error("orchestrator answered an invalid resource name: {0}")]
    BadName(#[from] kudos_api::ResourceNameError),
    /// Vendors were given different names (the orchestrator should answer one name).
    #[error("orchestrator answered different names {0:?} and {1:?}")]
    Conflicting(String, String),
}

/// Reports this node's devices.
#[derive(Clone, Debug)]
pub struct Reporter {
    channel: Channel,
    node: String,
    token_file: Option<PathBuf>,
}

impl Reporter {
    /// Connects lazily to `addr` (`http://host:port`, or `https://` trusting the CA in `ca`);
    /// `timeout` bounds each call.
    pub fn new(
        addr: &str,
        ca: Option<&std::path::Path>,
        node: String,
        token_file: Option<PathBuf>,
        timeout: Duration,
    ) -> Result<Self, ReportError> {
        let channel = kudos_common::grpc_tls::channel(addr, ca, |e| {
            e.connect_timeout(timeout).timeout(timeout)
        })
        .map_err(|e| ReportError::Address(addr.into(), e))?;
        Ok(Reporter {
            channel,
            node,
            token_file,
        })
    }

    /// One report per vendor; returns the unified name.
    pub async fn report(
        &self,
        backends: &Backends,
        health: &HealthMap,
    ) -> Result<String, ReportError> {
        let mut client =
            kapi::registry_service_client::RegistryServiceClient::new(self.channel.clone());
        // Projected tokens rotate: read the file on every call.
        let token = match &self.token_file {
            Some(p) => std::fs::read_to_string(p)
                .ok()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty()),
            None => None,
        };
        let mut name: Option<String> = None;
        for b in backends.iter() {
            let v = b.vendor();
            let msg = kapi::ReportPluginRequest {
                node: self.node.clone(),
                vendor: v.key.clone(),
                vendor_resource_name: v.resource_name.clone(),
                devices: b
                    .devices()
                    .iter()
                    .map(|d| kapi::Device {
                        id: d.id.clone(),
                        model: d.model.clone(),
                        memory_bytes: d.memory_bytes,
                        uuid: d.uuid.clone(),
                        numa_node: d.numa_node,
                        healthy: health.get(&d.id).copied()
                            != Some(crate::backend::Health::Unhealthy),
                    })
                    .collect(),
                plugin_version: env!("CARGO_PKG_VERSION").into(),
            };
            let mut req = tonic::Request::new(msg);
            if let Some(t) = &token
                && let Ok(value) = format!("Bearer {t}").parse()
            {
                req.metadata_mut().insert("authorization", value);
            }
            let answer = client
                .report_plugin(req)
                .await
                .map_err(|status| ReportError::Call {
                    vendor: v.key.clone(),
                    status,
                })?
                .into_inner();
            kudos_api::resource_name::validate(&answer.unified_resource_name)?;
            tracing::info!(vendor = %v.key, name = %answer.unified_resource_name, generation = answer.generation, "orchestrator answered");
            match &name {
                Some(n) if *n != answer.unified_resource_name => {
                    return Err(ReportError::Conflicting(
                        n.clone(),
                        answer.unified_resource_name,
                    ));
                }
                _ => name = Some(answer.unified_resource_name),
            }
        }
        // A node with no devices still learns the name (nothing to register, but consistent).
        Ok(name.unwrap_or_else(|| kudos_api::DEFAULT_UNIFIED_RESOURCE_NAME.into()))
    }
}

/// The last name the orchestrator gave, on disk.
#[derive(Clone, Debug)]
pub struct NameCache {
    path: PathBuf,
}

impl NameCache {
    /// A cache at `path`.
    pub fn new(path: PathBuf) -> Self {
        NameCache { path }
    }

    /// The cached name, if present and valid.
    pub fn load(&self) -> Option<String> {
        let name = std::fs::read_to_string(&self.path).ok()?.trim().to_owned();
        match kudos_api::resource_name::validate(&name) {
            Ok(()) => Some(name),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "ignoring an invalid cached name");
                None
            }
        }
    }

    /// Stores `name` atomically; failures are logged, not fatal.
    pub fn store(&self, name: &str) {
        let write = || -> std::io::Result<()> {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = self.path.with_extension("tmp");
            std::fs::write(&tmp, format!("{name}\n"))?;
            std::fs::rename(&tmp, &self.path)
        };
        if let Err(e) = write() {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot cache the resource name");
        }
    }
}

/// How reporting behaves over time.
#[derive(Clone, Debug)]
pub struct ReportPolicy {
    /// First retry delay after a failure; doubles up to `max_backoff`.
    pub initial_backoff: Duration,
    /// Largest retry delay.
    pub max_backoff: Duration,
    /// Time between reports after a success (keeps the orchestrator's view fresh).
    pub interval: Duration,
}

/// Decides the name to start with: one quick report, else the cache, else `default`.
/// Returns the name and whether it came from the orchestrator.
pub async fn initial_name(
    reporter: Option<&Reporter>,
    cache: &NameCache,
    default: &str,
    backends: &Backends,
    health: &HealthMap,
    metrics: &Metrics,
) -> (String, bool) {
    if let Some(r) = reporter {
        match r.report(backends, health).await {
            Ok(name) => {
                metrics.report(true);
                cache.store(&name);
                return (name, true);
            }
            Err(e) => {
                metrics.report(false);
                tracing::warn!(error = %e, "orchestrator unreachable; using the cached or default name");
            }
        }
    }
    match cache.load() {
        Some(name) => (name, false),
        None => (default.to_owned(), false),
    }
}

/// The background reporter's fixed parts.
#[derive(Clone)]
pub struct ReportTask {
    /// Client.
    pub reporter: Reporter,
    /// Name cache.
    pub cache: NameCache,
    /// Back-off and interval.
    pub policy: ReportPolicy,
    /// Devices to report.
    pub backends: Backends,
    /// Metrics.
    pub metrics: Metrics,
}

/// Reports forever: on failure retries with back-off, on success waits `interval`. Publishes
/// every answered name (the runtime re-registers when it changes) and caches it. `reported`:
/// whether the initial report succeeded.
pub async fn run(
    task: ReportTask,
    health: watch::Receiver<Arc<HealthMap>>,
    reported: bool,
    name_tx: watch::Sender<String>,
) {
    let ReportTask {
        reporter,
        cache,
        policy,
        backends,
        metrics,
    } = task;
    let mut delay = if reported {
        policy.interval
    } else {
        policy.initial_backoff
    };
    loop {
        tokio::time::sleep(delay).await;
        let snapshot = health.borrow().clone();
        match reporter.report(&backends, &snapshot).await {
            Ok(name) => {
                metrics.report(true);
                cache.store(&name);
                name_tx.send_if_modified(|current| {
                    if *current == name {
                        false
                    } else {
                        tracing::info!(from = %current, to = %name, "unified resource name changed");
                        *current = name;
                        true
                    }
                });
                delay = policy.interval;
            }
            Err(e) => {
                metrics.report(false);
                delay = if delay >= policy.interval {
                    policy.initial_backoff
                } else {
                    (delay * 2).min(policy.max_backoff)
                };
                tracing::warn!(error = %e, retry_in = ?delay, "reporting to the orchestrator failed");
            }
        }
    }
}
