//! Kudos orchestrator: the control-plane side of Kudos.
//!
//! - **Scheduler extender** (HTTP, [`http`], [`extender`]): `filter`, `prioritize`, `bind` for
//!   kube-scheduler, answered from memory by scheduler-core; `/explain`, `/state`, `/metrics`,
//!   `/healthz`, `/readyz`.
//! - **Ingestion** (gRPC, [`grpc`]): device plugins report devices and get the unified
//!   resource name; node agents stream run reports (acknowledged once durable) and heartbeats.
//! - **Index** ([`index`]): the one in-memory picture of nodes, pods, plugin configuration and
//!   the model; written only by the watches ([`watch`]) and ingestion, read by every server.
//! - **State** ([`store`]): plugin configuration, accepted runs and model snapshots in an
//!   embedded redb file (default) or a ConfigMap ([`store_k8s`]).
//! - **Rollout** ([`rollout`], off by default): derived plugin images recorded in the plugin
//!   configuration, one plugin DaemonSet per plugin group, node monitoring for `/state`,
//!   `/metrics` and the filter.
//!
//! Without a kubeconfig and outside a cluster (or with `--standalone`) it runs alone: extender,
//! gRPC and store work; nodes are learned from extender requests (`Nodes` form) and plugin
//! reports; bind only records. Start reading at [`run`].
#![forbid(unsafe_code)]

pub mod access;
pub mod admission;
pub mod auth;
pub mod config;
pub mod dra;
pub mod events;
pub mod extender;
#[cfg(test)]
mod fake_api;
pub mod fasthash;
mod fifo;
pub mod follow;
pub mod grpc;
pub mod health;
pub mod http;
pub mod index;
pub mod kobj;
pub mod leader;
pub mod learn;
pub mod limits;
pub mod metrics;
pub mod pod_view;
pub mod publish;
pub mod quantity;
mod review_cache;
pub mod rollout;
mod security;
pub mod state;
pub mod status;
pub mod store;
pub mod store_k8s;
pub mod tls;
pub mod uninstall;
pub mod watch;

use anyhow::Context;
use clap::Parser;
use config::{AuthMode, Settings, StoreKind};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch as tokio_watch;
use tracing::Instrument;

/// How long servers get to finish in-flight requests after SIGTERM.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Command-line arguments. Precedence: flag > environment variable > config file > default.
#[derive(Debug, Parser)]
#[command(
    name = "kudos-orchestrator",
    version,
    about = "Kudos orchestrator: scheduler extender, plugin registry, telemetry ingestion and state.",
    long_about = "Kudos orchestrator: scheduler extender (HTTP), plugin registry and telemetry ingestion (gRPC), \
                  model and plugin-configuration state.\n\nPrecedence of settings: command-line flag > environment \
                  variable > config file (--config) > built-in default."
)]
pub struct Args {
    /// Versioned YAML config file (`apiVersion: kudos.dev/v1alpha1`, `kind: OrchestratorConfig`).
    #[arg(long, env = "KUDOS_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// HTTP listen address (extender, /explain, /state, /metrics, health) [file: listen.http; default 0.0.0.0:8888].
    #[arg(long, env = "KUDOS_HTTP_LISTEN", value_name = "ADDR")]
    pub http_listen: Option<SocketAddr>,
    /// gRPC listen address (RegistryService, TelemetryService) [file: listen.grpc; default 0.0.0.0:8889].
    #[arg(long, env = "KUDOS_GRPC_LISTEN", value_name = "ADDR")]
    pub grpc_listen: Option<SocketAddr>,
    /// Kubeconfig file; without it the in-cluster config or ~/.kube/config is tried, and if none
    /// works the orchestrator runs standalone.
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Run without a cluster even if one is reachable (no watches, bind only records).
    #[arg(long, env = "KUDOS_STANDALONE")]
    pub standalone: bool,
    /// Store kind [file: store.kind; default file].
    #[arg(long, env = "KUDOS_STORE", value_enum)]
    pub store: Option<StoreKind>,
    /// File store path [file: store.path; default ./kudos-orchestrator.redb].
    #[arg(long, env = "KUDOS_STORE_PATH", value_name = "PATH")]
    pub store_path: Option<PathBuf>,
    /// Unified resource name [file: unifiedResourceName; default kudos.dev/gpu].
    #[arg(long, env = "KUDOS_UNIFIED_RESOURCE_NAME", value_name = "NAME")]
    pub unified_resource_name: Option<String>,
    /// Path prefix of the extender verbs [file: extender.pathPrefix; default /kudos/v1].
    #[arg(long, env = "KUDOS_EXTENDER_PREFIX", value_name = "PATH")]
    pub extender_prefix: Option<String>,
    /// How gRPC callers are authenticated [file: auth.mode; default token-review].
    #[arg(long = "auth", env = "KUDOS_AUTH", value_enum)]
    pub auth_mode: Option<AuthMode>,
    /// For --auth static: YAML map `token: node-name` [file: auth.staticTokensFile].
    #[arg(long, env = "KUDOS_STATIC_TOKENS_FILE", value_name = "PATH")]
    pub static_tokens_file: Option<PathBuf>,
    /// Seconds without an agent heartbeat before a node is stale [file: nodes.heartbeatMaxAgeSeconds; default 120].
    #[arg(long, env = "KUDOS_HEARTBEAT_MAX_AGE_SECONDS", value_name = "SECONDS")]
    pub heartbeat_max_age_seconds: Option<f64>,
    /// How nodes' kubelets allocate the unified resource: device-plugin (register it with the
    /// kubelet), dra (a ResourceSlice and the kudos-gpu DeviceClass; needs the chart's
    /// dra.enabled) or auto (DRA where the kubelet is v1.37+). A node's
    /// kudos.dev/allocation-api label overrides it [file: nodes.allocationApi; default device-plugin].
    #[arg(long, env = "KUDOS_ALLOCATION_API", value_enum, value_name = "API")]
    pub allocation_api: Option<dra::AllocationPolicy>,
    /// Write a Kubernetes Event explaining its ranking for each GPU pod Kudos does not bind
    /// itself (one API-server write per pod; pods bound through the extender carry the same
    /// line as their kudos.dev/placement annotation, and /explain answers without either)
    /// [file: extender.podEvents; default true].
    #[arg(long, env = "KUDOS_POD_EVENTS", value_name = "BOOL")]
    pub pod_events: Option<bool>,
    /// Pass only this many nodes from filter, the best Kudos ranks for the pod: kube-scheduler
    /// then runs its score plugins on those alone (most of its cost per pod in a large
    /// cluster), its own preferences choosing among them. 0: every node that fits
    /// [file: extender.filterTopNodes; default 100, kube-scheduler's own least number of nodes
    /// to score].
    #[arg(long, env = "KUDOS_FILTER_TOP_NODES", value_name = "N")]
    pub filter_top_nodes: Option<usize>,
    /// Derive plugin images and apply one plugin DaemonSet per plugin group; needs a cluster
    /// and rollout.baseImage/repository [file: rollout.enabled; default false].
    #[arg(long, env = "KUDOS_ROLLOUT", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub rollout: Option<bool>,
    /// Rollout dry run: print the plugin DaemonSet manifests to stdout on every change instead
    /// of pushing images and applying; implies --rollout [file: rollout.dryRun; default false].
    #[arg(long, env = "KUDOS_DRY_RUN_ROLLOUT", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub dry_run_rollout: Option<bool>,
    /// Run as one of several replicas: all answer the extender; the holder of a Lease also takes
    /// reports over gRPC and writes the state, the others follow that state and take over when
    /// it stops; needs the ConfigMap store [file: leaderElection.enabled; default false].
    #[arg(long, env = "KUDOS_LEADER_ELECT", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub leader_elect: Option<bool>,
    /// Logging.
    #[command(flatten)]
    pub log: kudos_common::LogArgs,
    /// A one-off task instead of serving.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// One-off tasks.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Command {
    /// Remove what the orchestrator created in the cluster (plugin DaemonSets of the rollout,
    /// kudos.dev/plugin-group node labels, optionally the state ConfigMap); the Helm chart's
    /// post-delete hook runs it.
    Uninstall(uninstall::UninstallArgs),
}

/// Parses arguments, runs, and maps the outcome to an exit code (2: bad configuration).
pub fn main_with_args() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = args.log.init() {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    if let Some(Command::Uninstall(u)) = args.command {
        let runtime = tokio::runtime::Builder::new_current_thread();
        return kudos_common::run_daemon(runtime, uninstall::main(u));
    }
    let settings = match Settings::resolve(&args) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "invalid configuration");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread();
    kudos_common::run_daemon(runtime, run(settings))
}

/// The client configuration of the kubeconfig file at `path`, errors naming the file.
pub async fn kubeconfig(path: &std::path::Path) -> anyhow::Result<kube::Config> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading kubeconfig {}", path.display()))
}

async fn kube_client(s: &Settings) -> anyhow::Result<Option<kube::Client>> {
    if s.standalone {
        tracing::info!(
            "standalone mode (--standalone): no cluster; nodes are learned from extender requests and plugin reports, bind only records"
        );
        return Ok(None);
    }
    let config = match &s.kubeconfig {
        Some(path) => kubeconfig(path).await?,
        None => match kube::Config::infer().await {
            Ok(c) => c,
            Err(e) => {
                tracing::info!(reason = %e, "no kubeconfig and not in a cluster: standalone mode; nodes are learned from extender requests and plugin reports, bind only records");
                return Ok(None);
            }
        },
    };
    tracing::info!(cluster = %config.cluster_url, "using the Kubernetes API");
    Ok(Some(
        kube::Client::try_from(config).context("building the Kubernetes client")?,
    ))
}

/// Opens the configured store and loads it. A damaged file store is moved aside and replaced
/// by an empty one, loudly (see [`store::FileStore::open_checked`]).
async fn open_store(
    s: &Settings,
    client: Option<&kube::Client>,
    metrics: &metrics::Metrics,
) -> anyhow::Result<(Arc<dyn store::Store>, store::Loaded)> {
    Ok(match s.store_kind {
        StoreKind::File => {
            if let Some(dir) = s.store_path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            tracing::info!(path = %s.store_path.display(), "file store");
            let (store, loaded) = store::FileStore::open_checked(&s.store_path, metrics)
                .with_context(|| format!("opening store {}", s.store_path.display()))?;
            (Arc::new(store), loaded)
        }
        StoreKind::ConfigMap => {
            let client = client.context(
                "store.kind configMap needs a cluster; use the file store in standalone mode",
            )?;
            tracing::info!(namespace = %s.store_namespace, name = %s.store_name, "ConfigMap store");
            let store: Arc<dyn store::Store> = Arc::new(store_k8s::ConfigMapStore::new(
                client.clone(),
                &s.store_namespace,
                &s.store_name,
            ));
            let t = std::time::Instant::now();
            let loaded = store.load().await.context("loading state")?;
            loaded.log_read(t, "ConfigMap store read");
            (store, loaded)
        }
    })
}

/// Rebuilds the index from loaded state: the plugin configuration and the model snapshot.
/// Returns it with the runs accepted after the snapshot, in order, for the learner to learn
/// once the process serves ([`learn::Learner::spawn_with_backlog`]): readiness does not wait
/// for them, since a snapshot may be minutes of runs behind and each run costs a refit. Until
/// they are learned, the extender ranks with the snapshot's model. [`replay`] learns them here
/// instead, for a caller with no learner.
pub fn restore(
    s: &Settings,
    loaded: store::Loaded,
    cluster: bool,
) -> anyhow::Result<(index::Index, Vec<state::StoredRun>)> {
    let parse = std::time::Instant::now();
    let scheduler = index::scheduler_from(
        s.scheduler.clone(),
        loaded.model.as_ref().map(|(m, _)| m.as_slice()),
    )
    .context("the stored model snapshot is unreadable")?;
    let mut idx = index::Index::new(
        &s.unified_resource_name,
        s.heartbeat_max_age_seconds,
        scheduler,
        cluster,
    );
    idx.set_allocation_policy(s.allocation_policy);
    idx.set_plugin_config(loaded.plugin_config);
    let snapshot_seq = loaded.model.as_ref().map_or(0, |(_, seq)| *seq);
    // The snapshot's model holds every run up to its seq.
    let model = idx.model();
    // The same model again (only the seq is new): nothing is freed.
    drop(idx.publish_model(model, snapshot_seq));
    tracing::info!(
        known_reports = loaded.known_reports,
        snapshot_seq,
        parse_seconds = parse.elapsed().as_secs_f64(),
        to_replay = loaded.runs_to_replay.len(),
        generation = idx.plugin_config().generation,
        "state restored"
    );
    Ok((idx, loaded.runs_to_replay))
}

/// Learns `runs` (the backlog [`restore`] returned) into `idx` now, in order.
pub fn replay(idx: &mut index::Index, runs: &[state::StoredRun]) {
    for run in runs {
        if let Err(e) = idx.apply_run(run) {
            tracing::warn!(seq = run.seq, error = %e, "replayed run refused by the model");
        }
    }
}

/// Saves the published model when it includes runs the last snapshot does not. The lock is
/// held only to copy a pointer; serialising runs on a blocking thread.
async fn snapshot(index: &index::SharedIndex, store: &dyn store::Store, saved: &mut u64) {
    let (model, seq) = {
        let i = index.read();
        if i.applied_seq() <= *saved {
            return;
        }
        (i.model(), i.applied_seq())
    };
    let bytes = tokio::task::spawn_blocking(move || serde_json::to_vec(model.state())).await;
    match bytes {
        Ok(Ok(bytes)) => match store.save_model(bytes, seq).await {
            Ok(()) => *saved = seq,
            Err(e) => tracing::warn!(error = %e, "model snapshot failed; runs stay replayable"),
        },
        Ok(Err(e)) => tracing::warn!(error = %e, "serialising the model failed"),
        Err(e) => tracing::warn!(error = %e, "serialising the model failed"),
    }
}

/// Runs until SIGTERM/SIGINT, then drains.
pub async fn run(s: Settings) -> anyhow::Result<()> {
    // kube's rustls needs a process-wide provider; ring is the one this workspace builds.
    let _ = rustls::crypto::ring::default_provider().install_default();
    s.scheduler
        .validate()
        .context("invalid `scheduler` section of the config")?;
    let client = kube_client(&s).await?;
    let cluster = client.is_some();
    let shutdown = kudos_common::shutdown_signal();
    tokio::pin!(shutdown);
    // With leader election every replica serves the extender; until it leads, a replica
    // reads the store and writes nothing (see `follow`).
    let election = match (&s.leader_election, &client) {
        (Some(cfg), Some(c)) => Some(leader::Election::new(c.clone(), cfg.clone())),
        (Some(_), None) => anyhow::bail!(
            "leader election is on but there is no cluster (standalone mode): run one replica without --leader-elect, or give it a kubeconfig"
        ),
        (None, _) => None,
    };
    let metrics = Arc::new(metrics::Metrics::new());
    let (store, loaded, followed) = match (&election, &client) {
        (Some(e), Some(c)) => {
            // A restarted container keeps its pod's labels: no Service may send a follower
            // what only the leader answers.
            e.role.clear().await;
            let cm = Arc::new(store_k8s::ConfigMapStore::new(
                c.clone(),
                &s.store_namespace,
                &s.store_name,
            ));
            let loaded = tokio::select! {
                l = follow::load_read_only(&cm, e.config.retry_period) => l,
                () = &mut shutdown => return Ok(()),
            };
            let store: Arc<dyn store::Store> = cm.clone();
            (store, loaded, Some(cm))
        }
        _ => {
            let (store, loaded) = open_store(&s, client.as_ref(), &metrics).await?;
            (store, loaded, None)
        }
    };
    let auth = security::authenticator(&s, client.as_ref())?;
    let (idx, backlog) = restore(&s, loaded, cluster)?;
    metrics
        .plugin_generation
        .set(idx.plugin_config().generation as i64);
    let index: index::SharedIndex = Arc::new(parking_lot::RwLock::new(idx));
    let watchdog = Arc::new(health::IndexWatchdog::new(health::DEFAULT_STALL_AFTER));
    watchdog
        .spawn(&index, health::DEFAULT_PROBE_PERIOD, metrics.clone())
        .context("starting the index watchdog thread")?;
    let (deleted_nodes, mut deleted_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    if let Some(c) = &client {
        watch::spawn(
            c.clone(),
            index.clone(),
            metrics.clone(),
            s.unified_resource_name.clone(),
            deleted_nodes,
        );
        if s.allocation_policy != dra::AllocationPolicy::DevicePlugin {
            watch::spawn_slices(c.clone(), index.clone());
        }
    }
    let (drain_tx, drain_rx) = tokio_watch::channel(false);

    let binder: Arc<dyn extender::bind::Binder> = match &client {
        Some(c) => Arc::new(extender::bind::KubeBinder::new(c.clone())),
        None => Arc::new(extender::bind::LocalBinder),
    };
    let extender = extender::Extender {
        index: index.clone(),
        ledger: extender::ledger::Ledger::new(cluster),
        explain: extender::ExplainCache::default(),
        binder,
        metrics: metrics.clone(),
        unified: s.unified_resource_name.clone(),
        last_filter: Default::default(),
        filter_top_nodes: s.filter_top_nodes,
        events: client
            .clone()
            .filter(|_| s.pod_events)
            .map(events::PodEvents::spawn),
    };
    let (tls, access) = security::http_security(&s, client.as_ref())?;
    // A replica in an election is a follower until it takes the Lease.
    let role_text = Arc::new(parking_lot::RwLock::new(http::Role {
        text: match &election {
            Some(_) => "follower: no leader seen yet".to_owned(),
            None => String::new(),
        },
        behind: None,
    }));
    let http_state = Arc::new(http::HttpState {
        watchdog,
        access,
        pod_scheduler_name: s.pod_scheduler_name.clone(),
        role: role_text.clone(),
        ..http::HttpState::new(extender, index.clone(), metrics.clone())
    });
    let limits = http::HttpLimits {
        prefix: s.extender_prefix.clone(),
        max_body_bytes: s.max_body_bytes,
        timeout: s.request_timeout,
        bind_timeout: s.bind_timeout,
        max_concurrent: s.max_concurrent_requests,
    };
    let app = http::router(http_state, &limits);
    let http_listener = tokio::net::TcpListener::bind(s.http_listen)
        .await
        .with_context(|| format!("binding HTTP {}", s.http_listen))?;
    tracing::info!(addr = %http_listener.local_addr()?, prefix = %s.extender_prefix, https = tls.is_some(), filter_top_nodes = s.filter_top_nodes.unwrap_or(0), "HTTP listening");
    let mut rx = drain_rx.clone();
    let conn_limits = http::ConnLimits {
        max_connections: s.max_connections,
        header_read_timeout: s.header_read_timeout,
        max_streams_per_connection: u32::try_from(s.max_concurrent_requests).unwrap_or(u32::MAX),
    };
    let http_task = tokio::spawn(
        http::serve(
            http_listener,
            app,
            conn_limits,
            tls,
            metrics.clone(),
            async move {
                let _ = rx.wait_for(|d| *d).await;
            },
        )
        .instrument(tracing::info_span!("http")),
    );

    // The learner, and the Lease when elected: a follower until then.
    let (learner, mut leadership) = match (election, followed) {
        (Some(election), Some(cm)) => {
            let follower = follow::Follower::new(
                cm,
                index.clone(),
                metrics.clone(),
                s.scheduler.clone(),
                backlog,
            );
            let led = follow::until_leader(
                follower,
                &s.store_name,
                &election,
                role_text.clone(),
                shutdown.as_mut(),
            )
            .await?;
            let Some((follower, leadership)) = led else {
                tracing::info!("draining (a follower: nothing to save)");
                let _ = drain_tx.send(true);
                let _ = tokio::time::timeout(DRAIN_TIMEOUT, http_task).await;
                return Ok(());
            };
            let loaded = match follow::load_as_leader(&*store, election.config.retry_period).await {
                Ok(l) => l,
                Err(e) => {
                    leadership.release().await;
                    return Err(e.context("loading the state as the new leader"));
                }
            };
            (
                follower.take_over(loaded).await,
                Some((leadership, election)),
            )
        }
        _ => (
            learn::Learner::spawn_with_backlog(index.clone(), metrics.clone(), backlog),
            None,
        ),
    };
    let mut saved_seq = index.read().applied_seq();
    if let (Some(c), Some(every)) = (&client, s.publish_interval) {
        tokio::spawn(
            publish::Publisher::new(c.clone(), index.clone())
                .run(every)
                .instrument(tracing::info_span!("publish")),
        );
    }

    let ingest = Arc::new(grpc::Ingest {
        index: index.clone(),
        store: store.clone(),
        auth,
        metrics: metrics.clone(),
        unified: s.unified_resource_name.clone(),
        heartbeat_max_age: s.heartbeat_max_age_seconds,
        lock: tokio::sync::Mutex::new(()),
        runs: learn::RunWriter::spawn(store.clone(), learner),
        draining: drain_rx.clone(),
        // Rollout subscribes here (rollout::start) when enabled.
        plugin_updates: tokio_watch::Sender::new(index.read().plugin_config().clone()),
    });
    // Deleted nodes leave the persisted plugin configuration (and with it /state and rollout).
    tokio::spawn({
        let ingest = ingest.clone();
        async move {
            while let Some(node) = deleted_rx.recv().await {
                if let Err(e) = ingest.forget_node(&node).await {
                    tracing::warn!(node = %node, error = %e, "pruning a deleted node failed; it is retried at the next node relist");
                }
            }
        }
        .instrument(tracing::info_span!("node_pruning"))
    });
    let mut rx = drain_rx.clone();
    rollout::start(
        &s.rollout,
        client.clone(),
        ingest.clone(),
        &metrics,
        s.heartbeat_max_age_seconds,
        async move {
            let _ = rx.wait_for(|d| *d).await;
        },
    )?;
    let grpc_listener = tokio::net::TcpListener::bind(s.grpc_listen)
        .await
        .with_context(|| format!("binding gRPC {}", s.grpc_listen))?;
    // The device plugins' and node agents' bearer tokens cross this listener: TLS whenever a
    // certificate is configured.
    let grpc_tls = match &s.tls {
        Some(files) => Some(security::start_tls(files, &[b"h2"], s.tls_reload_interval)?),
        None => {
            tracing::warn!(
                "gRPC is plain HTTP/2: device plugins' and node agents' bearer tokens cross the network in the clear; set tls.certFile and tls.keyFile"
            );
            None
        }
    };
    tracing::info!(addr = %grpc_listener.local_addr()?, tls = grpc_tls.is_some(), "gRPC listening");
    let grpc_incoming = tls::grpc_incoming(grpc_listener, grpc_tls, s.header_read_timeout);
    let services = grpc::Services(ingest);
    let mut rx = drain_rx.clone();
    let grpc_task = tokio::spawn(
        tonic::transport::Server::builder()
            .timeout(Duration::from_secs(30))
            .concurrency_limit_per_connection(256)
            .load_shed(true)
            .max_concurrent_streams(Some(1024))
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .tcp_keepalive(Some(Duration::from_secs(60)))
            .add_service(grpc::registry_server(services.clone()))
            .add_service(grpc::telemetry_server(services))
            .serve_with_incoming_shutdown(grpc_incoming, async move {
                let _ = rx.wait_for(|d| *d).await;
            })
            .instrument(tracing::info_span!("grpc")),
    );

    if let Some((l, election)) = leadership.take() {
        // The Service sends gRPC (and the admission webhook) to the labelled pod alone: label
        // it once the gRPC port listens; without the label nothing would reach this leader,
        // so it gives the Lease back instead.
        if let Err(e) = election.label_leader().await {
            l.release().await;
            return Err(e);
        }
        *role_text.write() = http::Role::default();
        leadership = Some((l, election));
    }
    metrics.leader.set(1);
    let mut tick = tokio::time::interval(s.snapshot_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    {
        let lost = async {
            match leadership.as_mut() {
                Some((l, _)) => l.lost().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(lost);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = &mut lost => break,
                _ = tick.tick() => snapshot(&index, &*store, &mut saved_seq).await,
            }
        }
    }
    tracing::info!("draining");
    let _ = drain_tx.send(true);
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        let h = http_task.await;
        let g = grpc_task.await;
        (h, g)
    })
    .await;
    match drained {
        Ok((h, g)) => {
            if let Ok(Err(e)) = h {
                tracing::warn!(error = %e, "HTTP server ended with an error");
            }
            if let Ok(Err(e)) = g {
                tracing::warn!(error = %e, "gRPC server ended with an error");
            }
        }
        Err(_) => tracing::warn!("servers did not drain within {DRAIN_TIMEOUT:?}; stopping anyway"),
    }
    if leadership.as_ref().is_some_and(|(l, _)| l.is_lost()) {
        // Another replica may lead already: no last snapshot from here.
        anyhow::bail!(
            "lost the leader Lease; exiting so that the restarted process rejoins as a follower"
        );
    }
    snapshot(&index, &*store, &mut saved_seq).await;
    if let Some((l, _)) = leadership {
        l.release().await;
    }
    tracing::info!("stopped");
    Ok(())
}
