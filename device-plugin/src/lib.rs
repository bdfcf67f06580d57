//! Kudos device plugin: discovers accelerators on a node and serves them to the kubelet under
//! one unified resource name, so a pod asks for `kudos.dev/gpu: 1` whichever vendor built the
//! GPU (design §2.1).
//!
//! Layout (discovery and health apart from serving, as in NVIDIA's k8s-device-plugin):
//! - [`backend`]: the [`backend::DeviceBackend`] trait and its NVIDIA (kudos-nvml), AMD (sysfs)
//!   and static-file implementations; [`backend::Backends`] dispatches by device-ID prefix.
//! - [`health`]: XID ignore list, a pure per-device state machine, the probe/event loop.
//! - [`server`]: the `v1beta1.DevicePlugin` service; knows only backends and a health view.
//! - [`preferred`]: topology-aware `GetPreferredAllocation`.
//! - [`registry`]: the unified name from the orchestrator, cached on disk, with back-off.
//! - [`runtime`]: socket serving, registration, kubelet-restart handling.
//! - [`dra`]: DRA mode instead of the device-plugin API: the node's ResourceSlice, the DRA
//!   kubelet plugin (prepare/unprepare, CDI specs, checkpoint), and which API a node uses.
//! - [`metrics`]: Prometheus metrics and `/metrics`, `/healthz`, `/ready`.
//! - [`cli`]: flags and validated settings.
#![forbid(unsafe_code)]

pub mod backend;
pub mod cli;
pub mod dra;
pub mod health;
pub mod metrics;
pub mod preferred;
pub mod registry;
pub mod runtime;
pub mod server;

use anyhow::Context as _;
use backend::{BackendError, Backends, DeviceBackend};
use cli::{Args, BackendKind, Settings};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tracing::Instrument as _;

/// Parses arguments, runs, and maps the outcome to an exit code.
pub fn main_with_args() -> ExitCode {
    let settings = match kudos_common::parse_settings(|a: &Args| &a.log, Settings::try_from) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.worker_threads(2);
    kudos_common::run_daemon(runtime, run(settings, kudos_common::shutdown_signal()))
}

/// Discovers devices with the configured backends. Backends that were not asked for by name
/// are skipped when they fail or find nothing.
pub fn discover(s: &Settings) -> Result<Backends, BackendError> {
    let mut found: Vec<Arc<dyn DeviceBackend>> = Vec::new();
    for kind in &s.backends {
        let result: Result<Option<Arc<dyn DeviceBackend>>, BackendError> = match kind {
            BackendKind::Nvidia => backend::nvidia::NvidiaBackend::discover(s.nvidia.clone())
                .map(|b| Some(Arc::new(b) as _)),
            BackendKind::Amd => {
                backend::amd::AmdBackend::discover(&s.sysfs_root, &s.nvidia.dev_root)
                    .map(|b| Some(Arc::new(b) as _))
            }
            BackendKind::Static => match &s.static_devices {
                Some(p) => {
                    backend::static_file::StaticBackend::load(p).map(|b| Some(Arc::new(b) as _))
                }
                None if s.backends_explicit => Err(BackendError::Invalid {
                    what: "--static-devices".into(),
                    reason: "the static backend needs a device file".into(),
                }),
                None => Ok(None),
            },
        };
        match result {
            Ok(Some(b)) if b.devices().is_empty() && !s.backends_explicit => {
                tracing::info!(vendor = %b.vendor().key, "no devices; backend not used");
            }
            Ok(Some(b)) => {
                tracing::info!(vendor = %b.vendor().key, devices = b.devices().len(), "discovered");
                found.push(b);
            }
            Ok(None) => {}
            Err(e) if s.backends_explicit => return Err(e),
            Err(e) => tracing::info!(backend = ?kind, error = %e, "backend not available"),
        }
    }
    Backends::new(found)
}

/// Logs how the devices found differ from those the per-vendor plugin configuration expects
/// on this node. A difference is not an error: the configuration is the orchestrator's view at
/// the time the image was derived, and this plugin's next report brings it up to date.
fn compare_with_configuration(
    expected: &[(String, Vec<kudos_api::config::v1::Device>)],
    backends: &Backends,
) {
    for (vendor, devices) in expected {
        let want: std::collections::BTreeSet<&str> =
            devices.iter().map(|d| d.id.as_str()).collect();
        let found: std::collections::BTreeSet<&str> = backends
            .devices()
            .filter(|d| &d.vendor == vendor)
            .map(|d| d.id.as_str())
            .collect();
        if want == found {
            tracing::info!(%vendor, devices = found.len(), "devices match the plugin configuration");
        } else {
            tracing::warn!(
                %vendor,
                missing = ?want.difference(&found).collect::<Vec<_>>(),
                new = ?found.difference(&want).collect::<Vec<_>>(),
                "devices differ from the plugin configuration; the next report updates it"
            );
        }
    }
}

/// Runs the plugin until `shutdown` resolves.
pub async fn run(
    s: Settings,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let metrics = metrics::Metrics::new();
    let settings = s.clone();
    let backends = tokio::task::spawn_blocking(move || discover(&settings))
        .await
        .context("discovery panicked")??;
    if backends.devices().next().is_none() {
        tracing::warn!("no accelerators found; registering anyway so the node reports zero");
    }
    compare_with_configuration(&s.expected_devices, &backends);
    let (stop_tx, stop_rx) = watch::channel(false);

    if let Some(addr) = s.metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding --metrics-addr {addr}"))?;
        let router = metrics.router();
        let mut stop = stop_rx.clone();
        tokio::spawn(
            async move {
                let serve = axum::serve(listener, router).with_graceful_shutdown(async move {
                    let _ = stop.changed().await;
                });
                if let Err(e) = serve.await {
                    tracing::error!(error = %e, "metrics server failed");
                }
            }
            .instrument(tracing::info_span!("metrics", %addr)),
        );
    }

    // Health: backend event sources plus periodic probes, published as a snapshot.
    let mut tracker = health::HealthTracker::new(
        backends
            .devices()
            .map(|d| (d.id.as_str(), d.vendor.as_str())),
        s.recovery_quiet,
    );
    let kept = tracker.with_log(
        health::CriticalLog::beside(&s.name_cache),
        std::time::SystemTime::now(),
        std::time::Instant::now(),
    );
    if kept > 0 {
        tracing::warn!(
            devices = kept,
            quiet = ?s.recovery_quiet,
            "devices start unhealthy: a critical event within the quiet period before this restart"
        );
    }
    let (health_tx, health_rx) = watch::channel(Arc::new(tracker.snapshot()));
    metrics.set_devices(&backends, &tracker.snapshot());
    let (signal_tx, signal_rx) = mpsc::unbounded_channel();
    let mut guards = Vec::new();
    for b in backends.iter() {
        match b.watch(signal_tx.clone()) {
            Ok(Some(g)) => guards.push(g),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(vendor = %b.vendor().key, error = %e, "no event source; relying on probes")
            }
        }
    }
    tokio::spawn(
        health::run(
            backends.clone(),
            tracker,
            signal_rx,
            s.probe_interval,
            health_tx,
            metrics.clone(),
            stop_rx.clone(),
        )
        .instrument(tracing::info_span!("health")),
    );

    // The unified name, and which kubelet API to serve it through.
    let cache = registry::NameCache::new(s.name_cache.clone());
    let api_cache = dra::mode::ApiCache::beside(&s.name_cache);
    let reporter = match &s.orchestrator_addr {
        Some(addr) => Some(registry::Reporter::new(
            addr,
            s.orchestrator_ca_file.as_deref(),
            s.node_name.clone(),
            Some(s.token_file.clone()),
            s.orchestrator_timeout,
        )?),
        None => None,
    };
    let snapshot = health_rx.borrow().clone();
    let initial = registry::initial(
        reporter.as_ref(),
        &cache,
        &api_cache,
        &s.default_name,
        &backends,
        &snapshot,
        &metrics,
    )
    .await;
    tracing::info!(resource = %initial.name, from_orchestrator = initial.reported, "unified resource name");
    let cached_api = api_cache.load();
    let (name_tx, name_rx) = watch::channel(initial.name);
    let (api_tx, mut api_rx) = watch::channel(initial.allocation_api);
    let reporter_task = reporter.map(|r| {
        tokio::spawn(
            registry::run(
                registry::ReportTask {
                    reporter: r,
                    cache,
                    api_cache,
                    policy: s.report.clone(),
                    backends: backends.clone(),
                    metrics: metrics.clone(),
                },
                health_rx.clone(),
                initial.reported,
                name_tx,
                api_tx,
            )
            .instrument(tracing::info_span!("report")),
        )
    });

    // Serve through one API until shutdown, or until the orchestrator switches this node to
    // the other one (`--allocation-api=auto` only).
    let flag = s.dra.allocation_api;
    tokio::pin!(shutdown);
    let mut previous: Option<kudos_api::dra::AllocationApi> = None;
    let result = loop {
        let decision = dra::mode::decide(flag, *api_rx.borrow_and_update(), cached_api);
        let api = decision.api;
        if previous == Some(kudos_api::dra::AllocationApi::Dra)
            && api != kudos_api::dra::AllocationApi::Dra
        {
            // Leaving DRA: the scheduler must stop allocating this node's devices through it.
            if let Err(e) = dra::withdraw(&s.dra, &s.node_name, &backends).await {
                tracing::error!(error = %e, "cannot delete this node's ResourceSlice after leaving DRA mode");
            }
        }
        match previous {
            None => tracing::info!(
                allocation_api = api.as_str(),
                why = decision.why,
                "allocation API"
            ),
            Some(p) => tracing::info!(
                from = p.as_str(),
                to = api.as_str(),
                why = decision.why,
                "allocation API changed; switching"
            ),
        }
        previous = Some(api);
        let mut shut_down = false;
        let until = async {
            tokio::select! {
                _ = &mut shutdown => shut_down = true,
                _ = switched(&mut api_rx, flag, cached_api, api) => {}
            }
        };
        let outcome = match api {
            kudos_api::dra::AllocationApi::DevicePlugin => {
                let lifecycle = runtime::Lifecycle {
                    dir: s.device_plugin_dir.clone(),
                    socket_name: s.socket_name.clone(),
                    register_timeout: s.register_timeout,
                    resync: Duration::from_secs(5),
                    register_backoff: Duration::from_millis(200),
                    register_backoff_cap: Duration::from_secs(10),
                };
                runtime::run(
                    lifecycle,
                    backends.clone(),
                    health_rx.clone(),
                    name_rx.clone(),
                    metrics.clone(),
                    until,
                )
                .instrument(tracing::info_span!("plugin"))
                .await
                .map_err(anyhow::Error::from)
            }
            kudos_api::dra::AllocationApi::Dra => {
                let ctx = dra::Context {
                    node: s.node_name.clone(),
                    backends: backends.clone(),
                    health: health_rx.clone(),
                    metrics: metrics.clone(),
                    settings: s.dra.clone(),
                };
                dra::run(ctx, until)
                    .instrument(tracing::info_span!("dra", driver = kudos_api::dra::DRIVER))
                    .await
            }
        };
        if outcome.is_err() || shut_down {
            break outcome;
        }
    };
    let _ = stop_tx.send(true);
    if let Some(t) = reporter_task {
        t.abort();
    }
    drop(guards);
    result
}

/// Resolves once the API [`dra::mode::decide`] picks differs from `current`; never under an
/// explicit `--allocation-api` or once the reporter is gone.
async fn switched(
    answers: &mut watch::Receiver<Option<kudos_api::dra::AllocationApi>>,
    flag: dra::mode::AllocationApiFlag,
    cached: Option<kudos_api::dra::AllocationApi>,
    current: kudos_api::dra::AllocationApi,
) {
    if flag != dra::mode::AllocationApiFlag::Auto {
        return std::future::pending().await;
    }
    loop {
        if answers.changed().await.is_err() {
            return std::future::pending().await;
        }
        if dra::mode::decide(flag, *answers.borrow_and_update(), cached).api != current {
            return;
        }
    }
}
