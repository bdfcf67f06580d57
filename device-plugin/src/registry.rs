//! The unified resource name: ask the orchestrator (`RegistryService.ReportPlugin`), cache the
//! answer on disk, and fall back to the cache or the configured default when the control
//! plane cannot be reached, so a node never loses its GPUs because the orchestrator is down.
//! A background task keeps reporting with exponential back-off and publishes name changes.
//!
//! The same answer says which kubelet API this node uses (`allocation_api`, see
//! [`crate::dra::mode`]); it is cached beside the name and published the same way.

use crate::backend::Backends;
use crate::dra::mode::ApiCache;
use crate::health::HealthMap;
use crate::metrics::Metrics;
use kudos_api::dra::AllocationApi;
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
    /// Vendors were given different allocation APIs (a node uses one).
    #[error("orchestrator answered different allocation APIs {0:?} and {1:?}")]
    ConflictingApi(&'static str, &'static str),
}

/// What the orchestrator answered for this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The unified resource name.
    pub name: String,
    /// The kubelet API this node uses; `None` when no vendor was reported or the orchestrator
    /// answered a value this plugin does not know (logged).
    pub allocation_api: Option<AllocationApi>,
}

/// The allocation API of one answer; an unknown value is logged and ignored.
fn answered_api(answer: &kapi::ReportPluginResponse) -> Option<AllocationApi> {
    let api = AllocationApi::parse(&answer.allocation_api);
    match api {
        None => tracing::warn!(
            allocation_api = %answer.allocation_api,
            "orchestrator answered an unknown allocation API; keeping the current one"
        ),
        Some(AllocationApi::Dra)
            if !answer.dra_driver.is_empty() && answer.dra_driver != kudos_api::dra::DRIVER =>
        {
            tracing::warn!(
                driver = %answer.dra_driver,
                serving = kudos_api::dra::DRIVER,
                "orchestrator names another DRA driver; this plugin serves its own"
            )
        }
        Some(_) => {}
    }
    api
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

    /// One report per vendor; returns the unified name and the allocation API.
    pub async fn report(
        &self,
        backends: &Backends,
        health: &HealthMap,
    ) -> Result<Answer, ReportError> {
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
        let mut allocation_api: Option<AllocationApi> = None;
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
            tracing::info!(vendor = %v.key, name = %answer.unified_resource_name, generation = answer.generation, allocation_api = %answer.allocation_api, "orchestrator answered");
            match (allocation_api, answered_api(&answer)) {
                (Some(a), Some(b)) if a != b => {
                    return Err(ReportError::ConflictingApi(a.as_str(), b.as_str()));
                }
                (None, b) => allocation_api = b,
                _ => {}
            }
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
        Ok(Answer {
            name: name.unwrap_or_else(|| kudos_api::DEFAULT_UNIFIED_RESOURCE_NAME.into()),
            allocation_api,
        })
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

/// What the plugin starts with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Initial {
    /// The unified name: the orchestrator's answer, else the cached one, else the default.
    pub name: String,
    /// The orchestrator's allocation API answer, if it answered one.
    pub allocation_api: Option<AllocationApi>,
    /// Whether the orchestrator answered.
    pub reported: bool,
}

/// Decides the name to start with: one quick report, else the cache, else `default`. An
/// answered allocation API is cached in `api_cache`.
pub async fn initial(
    reporter: Option<&Reporter>,
    cache: &NameCache,
    api_cache: &ApiCache,
    default: &str,
    backends: &Backends,
    health: &HealthMap,
    metrics: &Metrics,
) -> Initial {
    if let Some(r) = reporter {
        match r.report(backends, health).await {
            Ok(answer) => {
                metrics.report(true);
                cache.store(&answer.name);
                if let Some(api) = answer.allocation_api {
                    api_cache.store(api);
                }
                return Initial {
                    name: answer.name,
                    allocation_api: answer.allocation_api,
                    reported: true,
                };
            }
            Err(e) => {
                metrics.report(false);
                tracing::warn!(error = %e, "orchestrator unreachable; using the cached or default name");
            }
        }
    }
    Initial {
        name: cache.load().unwrap_or_else(|| default.to_owned()),
        allocation_api: None,
        reported: false,
    }
}

/// The background reporter's fixed parts.
#[derive(Clone)]
pub struct ReportTask {
    /// Client.
    pub reporter: Reporter,
    /// Name cache.
    pub cache: NameCache,
    /// Allocation-API cache.
    pub api_cache: ApiCache,
    /// Back-off and interval.
    pub policy: ReportPolicy,
    /// Devices to report.
    pub backends: Backends,
    /// Metrics.
    pub metrics: Metrics,
}

/// Reports forever: on failure retries with back-off, on success waits `interval`. Publishes
/// every answered name (the runtime re-registers when it changes) and allocation API (the
/// plugin switches mode when it changes under `--allocation-api=auto`), and caches both.
/// `reported`: whether the initial report succeeded.
pub async fn run(
    task: ReportTask,
    health: watch::Receiver<Arc<HealthMap>>,
    reported: bool,
    name_tx: watch::Sender<String>,
    api_tx: watch::Sender<Option<AllocationApi>>,
) {
    let ReportTask {
        reporter,
        cache,
        api_cache,
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
            Ok(Answer {
                name,
                allocation_api,
            }) => {
                metrics.report(true);
                cache.store(&name);
                if let Some(api) = allocation_api {
                    api_cache.store(api);
                    api_tx.send_if_modified(|current| {
                        let changed = *current != Some(api);
                        *current = Some(api);
                        changed
                    });
                }
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
