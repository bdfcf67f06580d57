//! A fake orchestrator for node-agent tests: an in-process `TelemetryService` receiver that
//! records what it is sent. It acknowledges like the real service:
//! ACCEPTED the first time a `report_id` is seen, DUPLICATE afterwards, REJECTED for IDs the
//! test asks it to reject.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kudos_proto::kudos::v1::telemetry_service_server::{TelemetryService, TelemetryServiceServer};
use kudos_proto::kudos::v1::{AckStatus, HeartbeatRequest, HeartbeatResponse, RunAck, RunReport};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

/// What the receiver has seen.
#[derive(Debug, Default)]
pub struct Received {
    /// Every report, in arrival order, duplicates included.
    pub reports: Vec<RunReport>,
    /// Distinct report IDs.
    pub ids: HashSet<String>,
    /// `authorization` values of streams and heartbeats, in order.
    pub tokens: Vec<String>,
    /// Heartbeats, in order.
    pub heartbeats: Vec<HeartbeatRequest>,
    /// Report IDs to answer with REJECTED.
    pub reject: HashSet<String>,
    /// Delay before each acknowledgement (to keep reports in flight).
    pub ack_delay: Duration,
    /// Streams opened.
    pub streams: usize,
}

/// The receiver; clones share state.
#[derive(Clone, Default)]
pub struct TestReceiver(Arc<Mutex<Received>>);

impl TestReceiver {
    /// Locks the recorded state.
    pub fn state(&self) -> MutexGuard<'_, Received> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves on `listener` until the returned task is aborted.
    pub fn serve(&self, listener: tokio::net::TcpListener) -> tokio::task::JoinHandle<()> {
        let svc = TelemetryServiceServer::new(self.clone());
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            if let Err(e) = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(incoming)
                .await
            {
                eprintln!("testkit: telemetry receiver stopped: {e}");
            }
        })
    }

    /// Binds `addr` (port 0 for any) and serves; returns the bound address.
    pub async fn bind(
        &self,
        addr: SocketAddr,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let l = tokio::net::TcpListener::bind(addr).await?;
        let a = l.local_addr()?;
        Ok((a, self.serve(l)))
    }

    fn token<T>(&self, req: &Request<T>) {
        let t = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        self.state().tokens.push(t);
    }
}

#[tonic::async_trait]
impl TelemetryService for TestReceiver {
    type ReportRunsStream = tokio_stream::wrappers::ReceiverStream<Result<RunAck, Status>>;

    async fn report_runs(
        &self,
        req: Request<Streaming<RunReport>>,
    ) -> Result<Response<Self::ReportRunsStream>, Status> {
        self.token(&req);
        self.state().streams += 1;
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(1024);
        let me = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(r)) = inbound.message().await {
                let (status, delay) = {
                    let mut s = me.state();
                    let status = if s.reject.contains(&r.report_id) {
                        AckStatus::Rejected
                    } else if s.ids.insert(r.report_id.clone()) {
                        AckStatus::Accepted
                    } else {
                        AckStatus::Duplicate
                    };
                    let id = r.report_id.clone();
                    s.reports.push(r);
                    (
                        RunAck {
                            report_id: id,
                            status: status as i32,
                            message: String::new(),
                        },
                        s.ack_delay,
                    )
                };
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                if tx.send(Ok(status)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        self.token(&req);
        self.state().heartbeats.push(req.into_inner());
        Ok(Response::new(HeartbeatResponse {
            server_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
            interval_seconds: 0,
        }))
    }
}
