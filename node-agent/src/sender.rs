//! Delivery to the orchestrator: the `ReportRuns` stream and `Heartbeat`.
//!
//! One long-lived bidirectional stream carries reports out of the [`Outbox`] in arrival order,
//! with at most `max_in_flight` unacknowledged; each acknowledgement removes its report (REJECTED
//! ones too, with an error log and a counter: the orchestrator will never take them). When the
//! stream breaks, everything unacknowledged is sent again on the next one — delivery is
//! at-least-once and the `report_id` lets the orchestrator de-duplicate.
//!
//! Reconnects wait an exponential backoff with jitter (half fixed, half random) so a fleet of
//! agents does not stampede a restarted orchestrator. Each stream and each heartbeat carries
//! `authorization: Bearer <token>` read from the projected service-account token file at that
//! moment, so kubelet token rotation is picked up without a restart.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kudos_proto::kudos::v1::telemetry_service_client::TelemetryServiceClient;
use kudos_proto::kudos::v1::{AckStatus, HeartbeatRequest, RunAck, RunReport};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;

use crate::metrics::Metrics;
use crate::outbox::{Outbox, OutboxError};

/// Settings of delivery.
#[derive(Clone, Debug)]
pub struct SenderConfig {
    /// Orchestrator gRPC URL, e.g. `http://kudos-orchestrator.kudos-system:50051`.
    pub url: String,
    /// CA of the orchestrator's certificate, for an `https://` URL.
    pub ca_file: Option<PathBuf>,
    /// This node's name.
    pub node: String,
    /// Projected service-account token; no `authorization` header when `None`.
    pub token_file: Option<PathBuf>,
    /// Time between heartbeats (the orchestrator may suggest another).
    pub heartbeat_period: Duration,
    /// First reconnect delay.
    pub backoff_min: Duration,
    /// Largest reconnect delay.
    pub backoff_max: Duration,
    /// Reports sent but not yet acknowledged, at most.
    pub max_in_flight: usize,
    /// Connect and per-call timeout.
    pub timeout: Duration,
    /// A stream with reports in flight and no acknowledgement for this long is restarted.
    pub ack_timeout: Duration,
}

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The orchestrator URL is invalid.
    #[error("invalid orchestrator URL: {0}")]
    Url(#[source] kudos_common::grpc_tls::ChannelError),
    /// The token file could not be read or is not a valid header value.
    #[error("token file {path}: {reason}")]
    Token {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The RPC failed or the stream broke.
    #[error("orchestrator: {0}")]
    Rpc(#[source] Box<tonic::Status>),
    /// The orchestrator closed the stream.
    #[error("orchestrator closed the report stream")]
    Closed,
    /// Reports were in flight and no acknowledgement came in time.
    #[error("no acknowledgement for {0:?}")]
    Stalled(Duration),
    /// The outbox failed.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
}

/// Devices sampled successfully / in total, for heartbeats.
#[derive(Debug, Default)]
pub struct DeviceHealth {
    /// Devices whose last read succeeded.
    pub healthy: AtomicU32,
    /// Devices in total.
    pub total: AtomicU32,
}

/// A lazily connected channel to the orchestrator (reconnects by itself).
pub fn channel(cfg: &SenderConfig) -> Result<Channel, SendError> {
    kudos_common::grpc_tls::channel(&cfg.url, cfg.ca_file.as_deref(), |e| {
        e.connect_timeout(cfg.timeout)
            .tcp_keepalive(Some(Duration::from_secs(30)))
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(true)
    })
    .map_err(SendError::Url)
}

/// Wraps `msg` with the bearer token, read now.
fn authorized<T>(cfg: &SenderConfig, msg: T) -> Result<tonic::Request<T>, SendError> {
    let mut req = tonic::Request::new(msg);
    if let Some(path) = &cfg.token_file {
        let err = |reason: String| SendError::Token {
            path: path.clone(),
            reason,
        };
        let token = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let value = format!("Bearer {}", token.trim())
            .parse()
            .map_err(|_| err("not a valid header value".into()))?;
        req.metadata_mut().insert("authorization", value);
    }
    Ok(req)
}

/// Reconnect delays: exponential, capped, half of each delay random.
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
    rng: SmallRng,
}

impl Backoff {
    /// A backoff between `min` and `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        let seed =
            u64::try_from(crate::now_ms()).unwrap_or(0) ^ u64::from(std::process::id()) << 32;
        Self {
            min,
            max: max.max(min),
            attempt: 0,
            rng: SmallRng::seed_from_u64(seed),
        }
    }
    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let exp = self
            .min
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let half = exp / 2;
        half + half.mul_f64(self.rng.random_range(0.0..=1.0))
    }
    /// Back to the shortest delay, after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// Sends the outbox until `shutdown` turns true.
pub async fn run_reports(
    cfg: SenderConfig,
    channel: Channel,
    outbox: Arc<Outbox>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(cfg.backoff_min, cfg.backoff_max);
    let mut failures = 0u32;
    loop {
        let result = tokio::select! {
            r = session(&cfg, channel.clone(), &outbox, &metrics, &mut backoff) => r,
            _ = crate::stopped(&mut shutdown) => return,
        };
        metrics.orchestrator_connected.set(0);
        if backoff.attempt == 0 {
            // The stream made progress (an acknowledgement reset the backoff).
            failures = 0;
        }
        let delay = backoff.next_delay();
        if let Err(e) = result {
            // Loud on the first failure and then every tenth, so an outage does not flood logs.
            failures += 1;
            let retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            if failures % 10 == 1 {
                tracing::warn!(error = %e, failures, retry_in_ms, pending = outbox.depth(), "report stream failed");
            } else {
                tracing::debug!(error = %e, failures, retry_in_ms, "report stream failed");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = crate::stopped(&mut shutdown) => return,
        }
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, OutboxError> + Send + 'static,
) -> Result<T, SendError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => Ok(r?),
        Err(e) => Err(SendError::Rpc(Box::new(tonic::Status::internal(format!(
            "outbox task failed: {e}"
        ))))),
    }
}

/// One stream: open, send and acknowledge until something breaks.
async fn session(
    cfg: &SenderConfig,
    channel: Channel,
    outbox: &Arc<Outbox>,
    metrics: &Metrics,
    backoff: &mut Backoff,
) -> Result<(), SendError> {
    let mut client = TelemetryServiceClient::new(channel);
    let (tx, rx) = mpsc::channel::<RunReport>(cfg.max_in_flight.max(1));
    let req = authorized(cfg, tokio_stream::wrappers::ReceiverStream::new(rx))?;
    let acks = tokio::time::timeout(cfg.timeout, client.report_runs(req))
        .await
        .map_err(|_| {
            SendError::Rpc(Box::new(tonic::Status::deadline_exceeded(
                "opening the report stream",
            )))
        })?
        .map_err(|s| SendError::Rpc(Box::new(s)))?
        .into_inner();
    let mut acks = acks.ready_chunks(512);
    metrics.orchestrator_connected.set(1);
    tracing::info!(url = %cfg.url, pending = outbox.depth(), "report stream open");

    let mut cursor: Option<u64> = None;
    let mut in_flight = std::collections::HashSet::<String>::new();
    let mut last_progress = tokio::time::Instant::now();
    let mut poll = tokio::time::interval(Duration::from_secs(1));
    loop {
        // Fill the window from the outbox.
        let room = cfg.max_in_flight.saturating_sub(in_flight.len());
        if room > 0 {
            let ob = outbox.clone();
            let batch = blocking(move || ob.pending(cursor, room)).await?;
            for (seq, r) in batch {
                cursor = Some(seq);
                let id = r.report_id.clone();
                if tx.send(r).await.is_err() {
                    return Err(SendError::Closed);
                }
                if in_flight.is_empty() {
                    last_progress = tokio::time::Instant::now();
                }
                in_flight.insert(id);
                metrics.reports_sent.inc();
            }
        }
        tokio::select! {
            chunk = acks.next() => {
                let Some(chunk) = chunk else { return Err(SendError::Closed) };
                let mut done = Vec::with_capacity(chunk.len());
                let mut failure = None;
                for ack in chunk {
                    match ack {
                        Ok(a) => handle_ack(a, &mut in_flight, &mut done, metrics),
                        Err(s) => failure = Some(s),
                    }
                }
                if !done.is_empty() {
                    let ob = outbox.clone();
                    blocking(move || ob.ack(&done)).await?;
                    metrics.outbox_depth.set(outbox.depth() as i64);
                    backoff.reset();
                    last_progress = tokio::time::Instant::now();
                }
                if let Some(s) = failure {
                    return Err(SendError::Rpc(Box::new(s)));
                }
            }
            _ = outbox.changed() => {}
            _ = poll.tick() => {
                if !in_flight.is_empty() && last_progress.elapsed() > cfg.ack_timeout {
                    return Err(SendError::Stalled(cfg.ack_timeout));
                }
            }
        }
    }
}

fn handle_ack(
    a: RunAck,
    in_flight: &mut std::collections::HashSet<String>,
    done: &mut Vec<String>,
    metrics: &Metrics,
) {
    in_flight.remove(&a.report_id);
    let status = AckStatus::try_from(a.status).unwrap_or(AckStatus::Unspecified);
    let label = match status {
        AckStatus::Accepted => "accepted",
        AckStatus::Duplicate => "duplicate",
        AckStatus::Rejected => "rejected",
        AckStatus::Unspecified => "unspecified",
    };
    metrics
        .reports_acked
        .get_or_create(&vec![("status".to_owned(), label.to_owned())])
        .inc();
    match status {
        AckStatus::Accepted | AckStatus::Duplicate => done.push(a.report_id),
        AckStatus::Rejected => {
            tracing::error!(report_id = %a.report_id, reason = %a.message, "orchestrator rejected a run report; dropped");
            metrics
                .outbox_dropped
                .get_or_create(&vec![
                    ("state".to_owned(), "any".to_owned()),
                    ("reason".to_owned(), "rejected".to_owned()),
                ])
                .inc();
            done.push(a.report_id);
        }
        // Not a valid answer: keep the report; it is sent again on the next stream.
        AckStatus::Unspecified => {
            tracing::warn!(report_id = %a.report_id, "acknowledgement without a status; report kept")
        }
    }
}

/// Sends heartbeats until `shutdown` turns true.
pub async fn run_heartbeats(
    cfg: SenderConfig,
    channel: Channel,
    outbox: Arc<Outbox>,
    health: Arc<DeviceHealth>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut client = TelemetryServiceClient::new(channel);
    let mut period = cfg.heartbeat_period;
    // Failures in a row: the first is a warning (the orchestrator marks this node stale after
    // a few), repeats are debug, and recovery is said once.
    let mut failing = 0u64;
    loop {
        let req = HeartbeatRequest {
            node: cfg.node.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            sent_unix_ms: crate::now_ms(),
            outbox_depth: outbox.depth(),
            healthy_devices: health.healthy.load(Ordering::Relaxed),
            total_devices: health.total.load(Ordering::Relaxed),
        };
        let result = match authorized(&cfg, req) {
            Ok(req) => match tokio::time::timeout(cfg.timeout, client.heartbeat(req)).await {
                Ok(Ok(resp)) => Ok(resp.into_inner()),
                Ok(Err(s)) => Err(SendError::Rpc(Box::new(s))),
                Err(_) => Err(SendError::Rpc(Box::new(tonic::Status::deadline_exceeded(
                    "heartbeat",
                )))),
            },
            Err(e) => Err(e),
        };
        let label = match result {
            Ok(resp) => {
                if resp.interval_seconds > 0 {
                    period = Duration::from_secs(u64::from(resp.interval_seconds).clamp(1, 600));
                }
                if failing > 0 {
                    tracing::info!(failed = failing, "heartbeats reach the orchestrator again");
                }
                failing = 0;
                "ok"
            }
            Err(e) => {
                failing += 1;
                if failing == 1 {
                    tracing::warn!(error = %e, "heartbeat failed: the orchestrator will mark this node stale (no new GPU pods) if this goes on; retrying every period");
                } else {
                    tracing::debug!(error = %e, failed = failing, "heartbeat failed again");
                }
                "error"
            }
        };
        metrics
            .heartbeats
            .get_or_create(&vec![("result".to_owned(), label.to_owned())])
            .inc();
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = crate::stopped(&mut shutdown) => return,
        }
    }
}

#[cfg(test)]
mod tests;
