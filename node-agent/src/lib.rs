//! Kudos node agent: samples GPUs while pods run, attributes them to pods and reports each run
//! to the orchestrator — the feedback half of Kudos (design §2.3).
//!
//! ```text
//!  GpuBackend (NVML | fake | none) ──► Sampler ─┐
//!  kubelet PodResources (who holds what) ───────┼─► agent loop ─► RunTracker ─► Outbox (redb)
//!  API server pod watch (class, work, uid) ─────┘        │                        │
//!                                                        ▼                        ▼
//!                                              /metrics (DCGM names)   sender ─► orchestrator
//!                                                                     (ReportRuns + Heartbeat)
//! ```
//!
//! Start with [`agent`] (the loop), [`runs`] (what a run is and how it is accounted) and
//! [`outbox`] (why nothing is lost). The binary's `main.rs` only calls [`main_with_args`].
#![forbid(unsafe_code)]

pub mod agent;
pub mod attribution;
pub mod config;
pub mod metrics;
pub mod nvml;
pub mod outbox;
pub mod podmeta;
pub mod runs;
pub mod sample;
pub mod sender;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kudos_proto::kudos::v1::{RunReport, RunState};
use tokio::sync::watch;
use tracing::Instrument;

pub use config::Args;
use config::{GpuBackendKind, PodMetadataKind};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Resolves once `rx` reads `true` (or its sender is gone). Releases the watch guard before
/// returning, so it can sit in a `select!` of a `Send` future.
pub(crate) async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Parses arguments, runs, and maps the outcome to an exit code.
pub fn main_with_args() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = args.log.init() {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    if let Err(e) = args.validate() {
        tracing::error!(error = %e, "refusing to start");
        return ExitCode::from(2);
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.worker_threads(2);
    runtime.max_blocking_threads(64);
    kudos_common::run_daemon(runtime, run(args))
}

fn backend(args: &Args) -> anyhow::Result<Arc<dyn sample::GpuBackend>> {
    Ok(match args.gpu_backend {
        GpuBackendKind::None => Arc::new(sample::NoGpus),
        GpuBackendKind::Fake => Arc::new(sample::FakeGpus::new(args.fake_gpus)),
        GpuBackendKind::Nvml => {
            Arc::new(nvml::NvmlBackend::new(args.nvml_library.as_deref()).context("loading NVML")?)
        }
        GpuBackendKind::Auto => match nvml::NvmlBackend::new(args.nvml_library.as_deref()) {
            Ok(b) => Arc::new(b),
            Err(e) => {
                tracing::info!(error = %e, "NVML not available; no GPUs will be sampled");
                Arc::new(sample::NoGpus)
            }
        },
    })
}

/// Test-only synthetic reports (see `--synthetic-reports`).
fn synthetic(node: &str, n: u32) -> Vec<RunReport> {
    let now = now_ms();
    (0..n)
        .map(|i| RunReport {
            report_id: format!("synthetic-{node}-{i}"),
            run_id: format!("synthetic-{node}-{i}"),
            node: node.to_owned(),
            pod_namespace: "synthetic".into(),
            pod_name: format!("synthetic-{i}"),
            state: RunState::Completed as i32,
            start_unix_ms: now - 60_000,
            end_unix_ms: now,
            gpu_busy_seconds: 60.0,
            ..Default::default()
        })
        .collect()
}

/// Runs until SIGTERM.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let node = args.node_name.clone();
    let span = tracing::info_span!("agent", node = %node);
    async move {
        let outbox = Arc::new(
            outbox::Outbox::open(&args.outbox_dir, args.outbox_max_reports)
                .context("opening the outbox")?,
        );
        if let Some(n) = args.synthetic_reports {
            let ob = outbox.clone();
            let node = node.clone();
            let out = tokio::task::spawn_blocking(move || {
                ob.push_once("synthetic", || synthetic(&node, n))
            })
            .await??;
            tracing::warn!(
                generated = out.map(|o| o.stored),
                "TEST ONLY: synthetic reports requested"
            );
        }
        tracing::info!(depth = outbox.depth(), dir = %args.outbox_dir.display(), "outbox open");
        let metrics = metrics::Metrics::new(&node);
        if outbox.recovered().is_some() {
            metrics.outbox_recoveries.inc();
        }
        let health = Arc::new(sender::DeviceHealth::default());
        let (stop_tx, stop) = watch::channel(false);
        let mut tasks = Vec::new();

        // Metrics and health.
        let listener = tokio::net::TcpListener::bind(args.metrics_addr)
            .await
            .with_context(|| format!("binding --metrics-addr {}", args.metrics_addr))?;
        let stale = i64::try_from(
            (args.sample_period * 10)
                .max(Duration::from_secs(30))
                .as_millis(),
        )
        .unwrap_or(i64::MAX);
        let app = metrics::router(metrics::HttpState {
            metrics: metrics.clone(),
            stale_after_ms: stale,
        });
        let mut s = stop.clone();
        tasks.push(tokio::spawn(
            async move {
                let r = axum::serve(listener, app)
                    .with_graceful_shutdown(async move { crate::stopped(&mut s).await });
                if let Err(e) = r.await {
                    tracing::error!(error = %e, "metrics server failed");
                }
            }
            .instrument(tracing::info_span!("http")),
        ));

        // Delivery.
        if let Some(url) = &args.orchestrator_url {
            let cfg = sender::SenderConfig {
                url: url.clone(),
                ca_file: args.orchestrator_ca_file.clone(),
                node: node.clone(),
                token_file: args.token_file.clone(),
                heartbeat_period: args.heartbeat_period,
                backoff_min: args.backoff_min,
                backoff_max: args.backoff_max,
                max_in_flight: args.max_in_flight,
                timeout: args.rpc_timeout,
                ack_timeout: (args.rpc_timeout * 12).max(Duration::from_secs(30)),
            };
            let ch = sender::channel(&cfg).context("orchestrator URL")?;
            let span = tracing::info_span!("sender", node = %node);
            tasks.push(tokio::spawn(
                sender::run_reports(
                    cfg.clone(),
                    ch.clone(),
                    outbox.clone(),
                    metrics.clone(),
                    stop.clone(),
                )
                .instrument(span.clone()),
            ));
            tasks.push(tokio::spawn(
                sender::run_heartbeats(
                    cfg,
                    ch,
                    outbox.clone(),
                    health.clone(),
                    metrics.clone(),
                    stop.clone(),
                )
                .instrument(span),
            ));
        } else {
            tracing::warn!("no --orchestrator-url: run reports stay in the outbox");
        }

        // Pod metadata.
        let meta: Arc<dyn podmeta::PodMetaSource> = match args.pod_metadata {
            PodMetadataKind::None => Arc::new(podmeta::NoPodMeta),
            PodMetadataKind::Kube => {
                let client = kube::Client::try_default()
                    .await
                    .context("connecting to the API server (--pod-metadata kube)")?;
                let store = podmeta::PodMetaStore::default();
                tasks.push(podmeta::spawn_pod_watcher(
                    client,
                    node.clone(),
                    store.clone(),
                ));
                Arc::new(store)
            }
        };

        // Sampling.
        let backend = backend(&args)?;
        let sampler = sample::Sampler::new(backend.clone(), args.sample_timeout)
            .await
            .context("discovering GPUs")?;
        tracing::info!(
            backend = backend.name(),
            devices = sampler.devices().len(),
            "GPUs discovered"
        );
        let pr = attribution::PodResources::new(
            &args.pod_resources_socket,
            args.resource_names.clone(),
            args.rpc_timeout,
        );
        let tracker = runs::RunTracker::new(runs::RunConfig {
            node: node.clone(),
            busy_threshold_percent: args.busy_threshold_percent,
            period: args.sample_period,
            progress_period: (!args.progress_period.is_zero()).then_some(args.progress_period),
            end_grace: args.run_end_grace,
        });
        let agent = agent::Agent::new(
            node.clone(),
            sampler,
            pr,
            meta,
            tracker,
            outbox.clone(),
            metrics,
            health,
        );
        let sampling = tokio::spawn(agent.run(args.sample_period, stop.clone()));

        tracing::info!(metrics = %args.metrics_addr, "started");
        kudos_common::shutdown_signal().await;
        let _ = stop_tx.send(true);
        if tokio::time::timeout(Duration::from_secs(10), sampling)
            .await
            .is_err()
        {
            tracing::warn!("sampling loop did not stop in time");
        }
        for t in tasks {
            t.abort();
        }
        tracing::info!(outbox_depth = outbox.depth(), "stopped");
        Ok(())
    }
    .instrument(span)
    .await
}
