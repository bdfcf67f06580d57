//! gRPC ingestion: `RegistryService` (plugin reports) and `TelemetryService` (run reports,
//! heartbeats). These are the index's writers besides the watchers.
//!
//! Every call authenticates first ([`crate::auth`]) and may only speak about the caller's own
//! node. Writes are serialised by one ingest lock and always persist before they change the
//! index or answer: a plugin-configuration change is saved before the new generation is
//! returned, and a run report is committed before its ACCEPTED ack. [`to_status`] is the one
//! place errors become gRPC statuses.

use crate::auth::{AuthError, Authenticator, Identity, bearer};
use crate::index::{HeartbeatInfo, SharedIndex};
use crate::metrics::{Metrics, VerbLabels};
use crate::state::{DeviceRecord, RunOutcome, StoredRun, VendorEntry};
use crate::store::{Appended, Store, StoreError};
use kudos_proto::kudos::v1 as pb;
use pb::registry_service_server::RegistryService;
use pb::telemetry_service_server::TelemetryService;
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

/// Why an ingestion call failed.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// Authentication failed.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The token is valid but bound to no node.
    #[error(
        "user {0:?} has no node identity; use a projected service-account token of a pod running on the node (Kubernetes >= 1.30 binds it to the node)"
    )]
    NoNode(String),
    /// The caller spoke about another node.
    #[error(
        "caller is node {caller:?} but the request is about node {about:?}; a node may only report about itself"
    )]
    WrongNode {
        /// Caller's node.
        caller: String,
        /// Node in the request.
        about: String,
    },
    /// The request is malformed.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// Persisting failed; nothing was acknowledged.
    #[error("cannot store: {0}")]
    Store(#[from] StoreError),
    /// A bug: a lock was poisoned by a panic.
    #[error("internal error: {0}")]
    Internal(&'static str),
}

/// The one mapping from ingestion errors to gRPC statuses.
pub fn to_status(e: IngestError) -> Status {
    match &e {
        IngestError::Auth(AuthError::Unavailable(_)) | IngestError::Store(_) => {
            tracing::warn!(error = %e, "ingestion failed");
            Status::unavailable(e.to_string())
        }
        IngestError::Auth(AuthError::NotAllowed(_))
        | IngestError::NoNode(_)
        | IngestError::WrongNode { .. } => Status::permission_denied(e.to_string()),
        IngestError::Auth(_) => Status::unauthenticated(e.to_string()),
        IngestError::Invalid(_) => Status::invalid_argument(e.to_string()),
        IngestError::Internal(_) => {
            tracing::error!(error = %e, "ingestion failed");
            Status::internal(e.to_string())
        }
    }
}

/// Shared by both services.
pub struct Ingest {
    /// The index (written here).
    pub index: SharedIndex,
    /// Durable state.
    pub store: Arc<dyn Store>,
    /// Authenticates callers.
    pub auth: Arc<dyn Authenticator>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Unified resource name.
    pub unified: String,
    /// Heartbeat max age, seconds (the suggested interval is a quarter of it).
    pub heartbeat_max_age: f64,
    /// Serialises persistence + index updates so replay order equals live order.
    pub lock: Mutex<()>,
    /// Becomes true on shutdown: streams stop taking reports.
    pub draining: watch::Receiver<bool>,
    /// Publishes every persisted plugin-configuration change (for the rollout reconciler).
    pub plugin_updates: watch::Sender<crate::state::PluginConfig>,
}

impl Ingest {
    async fn identify<T>(&self, req: &Request<T>) -> Result<(Identity, String), IngestError> {
        let header = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let token = bearer(header)?;
        let id = self.auth.authenticate(token).await?;
        let node = id
            .node
            .clone()
            .ok_or_else(|| IngestError::NoNode(id.user.clone()))?;
        Ok((id, node))
    }

    fn check_node(caller: &str, about: &str) -> Result<(), IngestError> {
        if caller == about {
            Ok(())
        } else {
            Err(IngestError::WrongNode {
                caller: caller.to_owned(),
                about: about.to_owned(),
            })
        }
    }

    async fn report_plugin(
        &self,
        req: Request<pb::ReportPluginRequest>,
    ) -> Result<pb::ReportPluginResponse, IngestError> {
        let (_, caller) = self.identify(&req).await?;
        let r = req.into_inner();
        Self::check_node(&caller, &r.node)?;
        let healthy = r.devices.iter().filter(|d| d.healthy).count() as u32;
        let total = r.devices.len() as u32;
        let entry = VendorEntry {
            vendor_resource_name: r.vendor_resource_name.clone(),
            devices: r
                .devices
                .into_iter()
                .map(|d| DeviceRecord {
                    id: d.id,
                    model: d.model,
                    memory_bytes: d.memory_bytes,
                    uuid: d.uuid,
                    numa_node: d.numa_node,
                })
                .collect(),
            plugin_version: r.plugin_version,
        };
        // The same bounds the device plugin checks before it reports (kudos-api).
        entry
            .validate(&r.vendor)
            .map_err(|e| IngestError::Invalid(e.to_string()))?;
        let _g = self.lock.lock().await;
        let mut cfg = self
            .index
            .read()
            .map_err(|_| poisoned())?
            .plugin_config()
            .clone();
        let changed = cfg.upsert(&r.node, &r.vendor, entry, &self.unified);
        if changed {
            self.store.save_plugin_config(cfg.clone()).await?;
        }
        let generation = cfg.generation;
        {
            let mut idx = self.index.write().map_err(|_| poisoned())?;
            idx.set_device_health(&r.node, &r.vendor, (healthy, total));
            if changed {
                idx.set_plugin_config(cfg.clone());
            }
        }
        if changed {
            self.plugin_updates.send_replace(cfg);
        }
        self.metrics.plugin_generation.set(generation as i64);
        tracing::info!(node = %r.node, vendor = %r.vendor, from = %r.vendor_resource_name, to = %self.unified, generation, changed, "plugin reported");
        Ok(pb::ReportPluginResponse {
            unified_resource_name: self.unified.clone(),
            generation,
        })
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<pb::HeartbeatResponse, IngestError> {
        let (_, caller) = self.identify(&req).await?;
        let r = req.into_inner();
        Self::check_node(&caller, &r.node)?;
        let now = crate::extender::unix_now();
        self.index.write().map_err(|_| poisoned())?.heartbeat(
            &r.node,
            HeartbeatInfo {
                at: now,
                agent_version: r.agent_version,
                outbox_depth: r.outbox_depth,
                healthy_devices: r.healthy_devices,
                total_devices: r.total_devices,
            },
        );
        Ok(pb::HeartbeatResponse {
            server_unix_ms: (now * 1000.0) as i64,
            interval_seconds: (self.heartbeat_max_age / 4.0).clamp(1.0, 3600.0) as u32,
        })
    }

    /// Stores one report and feeds it to the model. `Ok` carries the ack to send; `Err` means
    /// the store failed and the stream must end without acknowledging.
    async fn ingest_one(&self, caller: &str, r: pb::RunReport) -> Result<pb::RunAck, IngestError> {
        let report_id = r.report_id.clone();
        let ack = |status: pb::AckStatus, message: String| pb::RunAck {
            report_id: report_id.clone(),
            status: status as i32,
            message,
        };
        let profile = self.index.read().map_err(|_| poisoned())?.profile(&r.node);
        let run = match to_stored(caller, r, profile, crate::extender::unix_now()) {
            Ok(run) => run,
            Err(reason) => {
                self.metrics.grpc_event("report_runs", "rejected");
                tracing::warn!(report_id = %report_id, reason = %reason, "run report rejected");
                return Ok(ack(pb::AckStatus::Rejected, reason));
            }
        };
        let _g = self.lock.lock().await;
        let start = std::time::Instant::now();
        let appended = self.store.append_run(run.clone()).await?;
        self.metrics
            .store_append_duration
            .observe(start.elapsed().as_secs_f64());
        match appended {
            Appended::Duplicate => {
                self.metrics.grpc_event("report_runs", "duplicate");
                Ok(ack(pb::AckStatus::Duplicate, String::new()))
            }
            Appended::Stored(seq) => {
                let run = StoredRun { seq, ..run };
                let fb = self.index.write().map_err(|_| poisoned())?.apply_run(&run);
                match fb {
                    Ok(Some(fb)) => {
                        self.metrics
                            .feedback_rescored_nodes
                            .inc_by(fb.third_queue.len() as u64);
                        tracing::info!(node = %run.node, class = %run.class, pod = %format!("{}/{}", run.pod_namespace, run.pod_name), actual_seconds = fb.actual_seconds, review = ?fb.review, "run observed")
                    }
                    Ok(None) => {
                        tracing::info!(node = %run.node, class = %run.class, outcome = ?run.outcome, "run stored, not observed (failed, unclassified or no device profile)")
                    }
                    Err(e) => {
                        tracing::warn!(node = %run.node, class = %run.class, error = %e, "run stored, model refused it")
                    }
                }
                self.metrics.grpc_event("report_runs", "accepted");
                Ok(ack(pb::AckStatus::Accepted, String::new()))
            }
        }
    }
}

fn poisoned() -> IngestError {
    IngestError::Internal("index lock poisoned")
}

/// Converts and validates a report; `Err` is the REJECTED reason.
fn to_stored(
    caller: &str,
    r: pb::RunReport,
    profile: Option<crate::state::ProfileRecord>,
    now: f64,
) -> Result<StoredRun, String> {
    kudos_api::bounds::validate_report_id(&r.report_id).map_err(|e| e.to_string())?;
    if r.node != caller {
        return Err(format!(
            "report is about node {:?} but the caller is node {caller:?}; a node may only report about itself",
            r.node
        ));
    }
    let outcome = match pb::RunState::try_from(r.state) {
        Ok(pb::RunState::InProgress) => RunOutcome::InProgress,
        Ok(pb::RunState::Completed) => RunOutcome::Completed,
        Ok(pb::RunState::Failed) => RunOutcome::Failed,
        _ => {
            return Err(format!(
                "state {} is not IN_PROGRESS, COMPLETED or FAILED",
                r.state
            ));
        }
    };
    let (start, end) = (
        r.start_unix_ms as f64 / 1000.0,
        r.end_unix_ms as f64 / 1000.0,
    );
    if r.start_unix_ms <= 0 || end < start {
        return Err(format!(
            "times are invalid: start {} ms, end {} ms",
            r.start_unix_ms, r.end_unix_ms
        ));
    }
    if !(r.gpu_busy_seconds.is_finite() && r.gpu_busy_seconds >= 0.0) {
        return Err("gpu_busy_seconds must be a finite number >= 0".into());
    }
    if let Some(p) = r.progress
        && !(p.is_finite() && (0.0..=1.0).contains(&p))
    {
        return Err(format!("progress {p} is outside 0..=1"));
    }
    if let Some(w) = r.work_done
        && !(w.is_finite() && w >= 0.0)
    {
        return Err(format!("work_done {w} must be a finite number >= 0"));
    }
    Ok(StoredRun {
        seq: 0,
        report_id: r.report_id,
        run_id: r.run_id,
        node: r.node,
        pod_namespace: r.pod_namespace,
        pod_name: r.pod_name,
        class: r.class,
        device_ids: r.device_ids,
        outcome,
        start,
        end,
        gpu_busy_seconds: r.gpu_busy_seconds,
        progress: r.progress,
        work_done: r.work_done,
        profile,
        received_at: now,
    })
}

// === impl RegistryService, TelemetryService ===

/// The gRPC services over one [`Ingest`].
#[derive(Clone)]
pub struct Services(pub Arc<Ingest>);

#[tonic::async_trait]
impl RegistryService for Services {
    async fn report_plugin(
        &self,
        req: Request<pb::ReportPluginRequest>,
    ) -> Result<Response<pb::ReportPluginResponse>, Status> {
        let span = tracing::info_span!("report_plugin", node = %req.get_ref().node, vendor = %req.get_ref().vendor);
        let start = std::time::Instant::now();
        let r = self.0.report_plugin(req).instrument(span).await;
        self.0
            .metrics
            .grpc_duration
            .get_or_create(&VerbLabels {
                verb: "report_plugin",
            })
            .observe(start.elapsed().as_secs_f64());
        self.0
            .metrics
            .grpc_event("report_plugin", if r.is_ok() { "ok" } else { "error" });
        r.map(Response::new).map_err(to_status)
    }
}

#[tonic::async_trait]
impl TelemetryService for Services {
    type ReportRunsStream = ReceiverStream<Result<pb::RunAck, Status>>;

    async fn report_runs(
        &self,
        req: Request<Streaming<pb::RunReport>>,
    ) -> Result<Response<Self::ReportRunsStream>, Status> {
        let (_, caller) = self.0.identify(&req).await.map_err(|e| {
            self.0.metrics.grpc_event("report_runs", "refused");
            to_status(e)
        })?;
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let ingest = self.0.clone();
        let mut draining = ingest.draining.clone();
        let span = tracing::info_span!("report_runs", node = %caller);
        tokio::spawn(
            async move {
                loop {
                    let next = tokio::select! {
                        biased;
                        _ = async {
                            // A dropped sender means no drain will ever be signalled.
                            if draining.wait_for(|d| *d).await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        } => break,
                        n = inbound.next() => n,
                    };
                    let report = match next {
                        None => break,
                        Some(Ok(r)) => r,
                        Some(Err(status)) => {
                            tracing::debug!(%status, "stream ended by the client");
                            break;
                        }
                    };
                    let reply = ingest.ingest_one(&caller, report).await.map_err(to_status);
                    let stop = reply.is_err();
                    if tx.send(reply).await.is_err() || stop {
                        break;
                    }
                }
            }
            .instrument(span),
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let span = tracing::debug_span!("heartbeat", node = %req.get_ref().node);
        let start = std::time::Instant::now();
        let r = self.0.heartbeat(req).instrument(span).await;
        self.0
            .metrics
            .grpc_duration
            .get_or_create(&VerbLabels { verb: "heartbeat" })
            .observe(start.elapsed().as_secs_f64());
        self.0
            .metrics
            .grpc_event("heartbeat", if r.is_ok() { "ok" } else { "error" });
        r.map(Response::new).map_err(to_status)
    }
}
