//! gRPC ingestion: `RegistryService` (plugin reports) and `TelemetryService` (run reports,
//! heartbeats). These are the index's writers besides the watchers.
//!
//! Every call authenticates first ([`crate::auth`]) and may only speak about the caller's own
//! node. Writes always persist before they change the index or answer: a plugin-configuration
//! change is saved (under the ingest lock) before the new generation is returned, and a run
//! report is committed (by [`crate::learn::RunWriter`], in batches) before its ACCEPTED ack;
//! learning from it happens afterwards, off the extender's path. Every name and count is
//! checked against [`crate::limits`] first, and run times against a plausible maximum.
//! [`to_status`] is the one place errors become gRPC statuses.

use crate::auth::{AuthError, Authenticator, Identity, bearer};
use crate::index::{HeartbeatInfo, SharedIndex};
use crate::learn::{RunWriter, WriteError};
use crate::limits::{self, check_len, check_name};
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
    /// Appending a run failed; nothing was acknowledged.
    #[error("cannot store the run: {0}")]
    Write(#[from] WriteError),
}

/// The one mapping from ingestion errors to gRPC statuses.
pub fn to_status(e: IngestError) -> Status {
    match &e {
        IngestError::Auth(AuthError::Unavailable(_))
        | IngestError::Store(_)
        | IngestError::Write(_) => {
            tracing::warn!(error = %e, "ingestion failed");
            Status::unavailable(e.to_string())
        }
        IngestError::Auth(AuthError::NotAllowed(_))
        | IngestError::NoNode(_)
        | IngestError::WrongNode { .. } => Status::permission_denied(e.to_string()),
        IngestError::Auth(_) => Status::unauthenticated(e.to_string()),
        IngestError::Invalid(_) => Status::invalid_argument(e.to_string()),
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
    /// Serialises plugin-configuration persistence + index updates so replay order equals
    /// live order (runs are ordered by `runs`).
    pub lock: Mutex<()>,
    /// Appends accepted runs in batches and hands them to the learner.
    pub runs: RunWriter,
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
        check_plugin_report(&r).map_err(IngestError::Invalid)?;
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
        // The same bounds the device plugin checks before it reports (kudos-api): the vendor
        // (it names the plugin group, its DaemonSet and image tag), the plugin version, the
        // device count, and every device's ID, model and UUID.
        entry
            .validate(&r.vendor)
            .map_err(|e| IngestError::Invalid(e.to_string()))?;
        let _g = self.lock.lock().await;
        let mut cfg = self.index.read().plugin_config().clone();
        let changed = cfg.upsert(&r.node, &r.vendor, entry, &self.unified);
        if changed {
            self.store.save_plugin_config(cfg.clone()).await?;
        }
        let generation = cfg.generation;
        let (api, why) = self.index.read().allocation_api(&r.node);
        {
            let mut idx = self.index.write();
            idx.set_device_health(&r.node, &r.vendor, (healthy, total));
            if changed {
                idx.set_plugin_config(cfg.clone());
            }
        }
        if changed {
            self.plugin_updates.send_replace(cfg);
        }
        self.metrics.plugin_generation.set(generation as i64);
        tracing::info!(node = %r.node, vendor = %r.vendor, from = %r.vendor_resource_name, to = %self.unified, generation, changed, allocation_api = api.as_str(), why, "plugin reported");
        let dra = api == kudos_api::dra::AllocationApi::Dra;
        Ok(pb::ReportPluginResponse {
            unified_resource_name: self.unified.clone(),
            generation,
            allocation_api: api.as_str().into(),
            dra_driver: if dra {
                kudos_api::dra::DRIVER.into()
            } else {
                String::new()
            },
        })
    }

    /// Prunes a node deleted from the cluster from the persisted plugin configuration (the
    /// one writer of it, like [`Self::report_plugin`]). Returns whether it was configured.
    pub async fn forget_node(&self, node: &str) -> Result<bool, IngestError> {
        let _g = self.lock.lock().await;
        let mut cfg = self.index.read().plugin_config().clone();
        if !cfg.remove_node(node) {
            return Ok(false);
        }
        self.store.save_plugin_config(cfg.clone()).await?;
        self.index.write().set_plugin_config(cfg.clone());
        self.metrics.plugin_generation.set(cfg.generation as i64);
        tracing::info!(node = %node, generation = cfg.generation, "deleted node pruned from the plugin configuration");
        self.plugin_updates.send_replace(cfg);
        Ok(true)
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<pb::HeartbeatResponse, IngestError> {
        let (_, caller) = self.identify(&req).await?;
        let r = req.into_inner();
        Self::check_node(&caller, &r.node)?;
        check_len(
            "agent_version",
            &r.agent_version,
            limits::MAX_PLUGIN_VERSION_LEN,
        )
        .map_err(IngestError::Invalid)?;
        let now = crate::extender::unix_now();
        self.index.write().heartbeat(
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
        let now = crate::extender::unix_now();
        if let Err((reason, message)) = check_run_report(&r, now) {
            self.metrics
                .report_rejections
                .get_or_create(&crate::metrics::ReasonLabels { reason })
                .inc();
            self.metrics.grpc_event("report_runs", "rejected");
            tracing::warn!(report_id = %report_id.chars().take(64).collect::<String>(), reason = %message, "run report rejected");
            return Ok(ack(pb::AckStatus::Rejected, message));
        }
        let profile = self.index.read().profile(&r.node);
        let run = match to_stored(caller, r, profile, now) {
            Ok(run) => run,
            Err(reason) => {
                self.metrics.grpc_event("report_runs", "rejected");
                tracing::warn!(report_id = %report_id, reason = %reason, "run report rejected");
                return Ok(ack(pb::AckStatus::Rejected, reason));
            }
        };
        let start = std::time::Instant::now();
        let (appended, run) = self.runs.append(run).await?;
        self.metrics
            .store_append_duration
            .observe(start.elapsed().as_secs_f64());
        match appended {
            Appended::Duplicate => {
                self.metrics.grpc_event("report_runs", "duplicate");
                Ok(ack(pb::AckStatus::Duplicate, String::new()))
            }
            Appended::Stored(seq) => {
                tracing::debug!(node = %run.node, class = %run.class, seq, "run stored; the learner takes it from here");
                self.metrics.grpc_event("report_runs", "accepted");
                Ok(ack(pb::AckStatus::Accepted, String::new()))
            }
        }
    }
}

/// The one bound of a plugin report that [`VendorEntry::validate`] (kudos-api, which the
/// device plugin checks too) does not cover: the vendor resource name's length.
fn check_plugin_report(r: &pb::ReportPluginRequest) -> Result<(), String> {
    check_len(
        "vendor_resource_name",
        &r.vendor_resource_name,
        limits::MAX_OBJECT_NAME_LEN,
    )
}

/// Bounds on a run report before anything is stored: every string that is persisted and
/// keys the model (class, pod, devices), and times a run can plausibly take. `Err` carries a
/// metric reason and the REJECTED message.
fn check_run_report(r: &pb::RunReport, now: f64) -> Result<(), (&'static str, String)> {
    let name = |e: String| ("name_too_long", e);
    check_len("run_id", &r.run_id, limits::MAX_REPORT_ID_LEN).map_err(name)?;
    check_len("class", &r.class, limits::MAX_CLASS_NAME_LEN).map_err(name)?;
    check_len(
        "pod_namespace",
        &r.pod_namespace,
        limits::MAX_LABEL_VALUE_LEN,
    )
    .map_err(name)?;
    check_len("pod_name", &r.pod_name, limits::MAX_OBJECT_NAME_LEN).map_err(name)?;
    check_len("pod_uid", &r.pod_uid, limits::MAX_REPORT_ID_LEN).map_err(name)?;
    if r.device_ids.len() > limits::MAX_DEVICES_PER_NODE {
        return Err((
            "too_many_devices",
            format!(
                "{} device IDs; at most {} are accepted",
                r.device_ids.len(),
                limits::MAX_DEVICES_PER_NODE
            ),
        ));
    }
    for d in &r.device_ids {
        check_name("device ID", d, limits::MAX_DEVICE_ID_LEN).map_err(name)?;
    }
    let (start, end) = (
        r.start_unix_ms as f64 / 1000.0,
        r.end_unix_ms as f64 / 1000.0,
    );
    let implausible = |e: String| ("implausible_time", e);
    if end - start > limits::MAX_RUN_SECONDS {
        return Err(implausible(format!(
            "the run claims {:.0} s (start {} ms, end {} ms); at most {} s are plausible",
            end - start,
            r.start_unix_ms,
            r.end_unix_ms,
            limits::MAX_RUN_SECONDS
        )));
    }
    if end > now + limits::MAX_CLOCK_SKEW_SECONDS {
        return Err(implausible(format!(
            "the run ends {:.0} s in the future (end {} ms); check the node's clock",
            end - now,
            r.end_unix_ms
        )));
    }
    // Busy time is summed over the run's devices, so it is bounded by wall time per device.
    let devices = r.device_ids.len().max(1) as f64;
    let wall = (end - start).max(0.0);
    if r.gpu_busy_seconds.is_finite() && r.gpu_busy_seconds > wall * devices + 1.0 {
        return Err(implausible(format!(
            "gpu_busy_seconds {} exceeds the run's {wall:.0} s on {devices} devices",
            r.gpu_busy_seconds
        )));
    }
    Ok(())
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

/// The status that ends a report stream whose next message could not be read.
fn inbound_error(status: Status) -> Status {
    match status.code() {
        tonic::Code::OutOfRange | tonic::Code::ResourceExhausted => {
            Status::resource_exhausted(format!(
                "run report refused: {}; a message may be at most {} bytes (later reports on this stream were not read; reconnect and resend them)",
                status.message(),
                limits::MAX_GRPC_MESSAGE_BYTES
            ))
        }
        tonic::Code::Internal | tonic::Code::InvalidArgument | tonic::Code::DataLoss => {
            Status::invalid_argument(format!(
                "run report refused: {}; later reports on this stream were not read",
                status.message()
            ))
        }
        _ => status,
    }
}

/// The registry service with its message-size bounds ([`limits::MAX_GRPC_MESSAGE_BYTES`] both
/// ways; the plugin uses the same bound).
pub fn registry_server(
    services: Services,
) -> pb::registry_service_server::RegistryServiceServer<Services> {
    pb::registry_service_server::RegistryServiceServer::new(services)
        .max_decoding_message_size(limits::MAX_GRPC_MESSAGE_BYTES)
        .max_encoding_message_size(limits::MAX_GRPC_MESSAGE_BYTES)
}

/// The telemetry service with its message-size bounds (as [`registry_server`]).
pub fn telemetry_server(
    services: Services,
) -> pb::telemetry_service_server::TelemetryServiceServer<Services> {
    pb::telemetry_service_server::TelemetryServiceServer::new(services)
        .max_decoding_message_size(limits::MAX_GRPC_MESSAGE_BYTES)
        .max_encoding_message_size(limits::MAX_GRPC_MESSAGE_BYTES)
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
                            // A message over the size limit or one that does not decode ends
                            // the inbound stream; say so instead of ending with OK, so the
                            // agent keeps the report and knows why.
                            let reply = inbound_error(status);
                            tracing::warn!(status = %reply, "run report stream ended by a bad message");
                            let _ = tx.send(Err(reply)).await;
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
