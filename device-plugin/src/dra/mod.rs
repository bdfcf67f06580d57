//! DRA mode (`resource.k8s.io/v1`, structured parameters): instead of registering
//! `kudos.dev/gpu` with the kubelet's device-plugin API, the plugin publishes the node's
//! devices as a ResourceSlice and serves the DRA kubelet plugin that prepares the claims the
//! scheduler allocated. With a DeviceClass carrying `extendedResourceName: kudos.dev/gpu`
//! (KEP-5004, shipped by the chart), pods keep asking for `kudos.dev/gpu: 1`.
//!
//! ```text
//!   backends + health ──> slice::Publisher ──> ResourceSlice <node>-gpu.kudos.dev (API server)
//!                                                     │ scheduler allocates
//!   kubelet ── GetInfo ──> registration.rs            v
//!           ── NodePrepareResources ──> kubelet.rs ── ResourceClaim (API server)
//!                                          │ prepare::plan (backend Allocation)
//!                                          ├──> cdi.rs: /var/run/cdi/gpu.kudos.dev-<uid>.json
//!                                          └──> checkpoint.rs: <plugins>/gpu.kudos.dev/checkpoint.json
//! ```
//!
//! Which API a node uses ([`mode`]) is the orchestrator's decision, or `--allocation-api`.
//! Discovery, health and reporting are shared with the device-plugin mode.

pub mod authority;
pub mod cdi;
pub mod checkpoint;
pub mod kubelet;
pub mod mode;
pub mod prepare;
pub mod registration;
pub mod slice;

use crate::backend::Backends;
use crate::health::HealthMap;
use crate::metrics::Metrics;
use anyhow::Context as _;
use kudos_api::dra::DRIVER;
use kudos_proto::dra::v1 as dra_api;
use kudos_proto::pluginregistration::v1 as reg_api;
use mode::AllocationApiFlag;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tracing::Instrument as _;

/// How often the published slice is compared with the stored one (one GET), besides every
/// health change and every kubelet registration.
pub const RESYNC: Duration = Duration::from_secs(30);

/// DRA-mode flags (flattened into [`crate::cli::Args`]).
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Allocation API (device plugin or DRA)")]
pub struct DraArgs {
    /// Which kubelet API hands the devices to pods: "auto" follows the orchestrator's per-node
    /// answer (else its last answer cached beside the name cache, else device-plugin);
    /// "device-plugin" registers the unified resource with the kubelet's device-plugin API;
    /// "dra" publishes this node's ResourceSlice (driver gpu.kudos.dev) and serves the DRA
    /// kubelet plugin instead (needs the API server: in-cluster credentials or --kubeconfig).
    #[arg(long, env = "KUDOS_ALLOCATION_API", value_enum, default_value_t = AllocationApiFlag::Auto)]
    pub allocation_api: AllocationApiFlag,

    /// kubeconfig for the API server in DRA mode (default: in-cluster credentials).
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// The kubelet's plugin registration directory (DRA mode: <dir>/gpu.kudos.dev-reg.sock).
    #[arg(long, env = "KUDOS_KUBELET_REGISTRY_DIR", default_value = reg_api::REGISTRY_DIR)]
    pub kubelet_registry_dir: PathBuf,

    /// The kubelet's plugins directory (DRA mode: the socket <dir>/gpu.kudos.dev/dra.sock and
    /// the prepared-claims checkpoint <dir>/gpu.kudos.dev/checkpoint.json).
    #[arg(long, env = "KUDOS_KUBELET_PLUGINS_DIR", default_value = dra_api::PLUGINS_DIR)]
    pub kubelet_plugins_dir: PathBuf,

    /// Directory of CDI spec files the container runtime reads (DRA mode: one file per
    /// prepared claim).
    #[arg(long, env = "KUDOS_CDI_ROOT", default_value = "/var/run/cdi")]
    pub cdi_root: PathBuf,
}

/// Validated DRA-mode settings.
#[derive(Clone, Debug)]
pub struct DraSettings {
    /// `--allocation-api`.
    pub allocation_api: AllocationApiFlag,
    /// kubeconfig, else in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// The kubelet's plugin registration directory.
    pub registry_dir: PathBuf,
    /// The kubelet's plugins directory.
    pub plugins_dir: PathBuf,
    /// CDI spec directory.
    pub cdi_root: PathBuf,
}

impl From<DraArgs> for DraSettings {
    fn from(a: DraArgs) -> Self {
        DraSettings {
            allocation_api: a.allocation_api,
            kubeconfig: a.kubeconfig.filter(|p| !p.as_os_str().is_empty()),
            registry_dir: a.kubelet_registry_dir,
            plugins_dir: a.kubelet_plugins_dir,
            cdi_root: a.cdi_root,
        }
    }
}

impl DraSettings {
    /// This driver's data directory: `<plugins>/gpu.kudos.dev`.
    pub fn plugin_dir(&self) -> PathBuf {
        self.plugins_dir.join(DRIVER)
    }

    /// The DRA service socket.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir().join(dra_api::SOCKET)
    }

    /// The registration socket.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(reg_api::socket_name(DRIVER))
    }

    /// The prepared-claims checkpoint.
    pub fn checkpoint(&self) -> PathBuf {
        self.plugin_dir().join("checkpoint.json")
    }
}

/// A client of the API server: `--kubeconfig`, else in-cluster (or `$KUBECONFIG`).
pub async fn client(s: &DraSettings) -> anyhow::Result<kube::Client> {
    let config = match &s.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading --kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading --kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "DRA mode needs the API server: no in-cluster credentials and no --kubeconfig",
        )?,
    };
    kube::Client::try_from(config).context("building the API server client")
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, flushed to
/// disk, renamed over `path`. Creates the directory.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A dot file ending in .tmp: CDI loaders read only *.json and *.yaml.
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// What DRA mode runs on: the node, its devices and their health.
pub struct Context {
    /// Node name (the pool name).
    pub node: String,
    /// Discovered devices.
    pub backends: Backends,
    /// Health snapshots.
    pub health: watch::Receiver<Arc<HealthMap>>,
    /// Metrics.
    pub metrics: Metrics,
    /// Settings.
    pub settings: DraSettings,
}

/// Runs DRA mode until `shutdown` resolves: publishes the ResourceSlice, serves the DRA
/// service, then the registration socket. Sockets are removed on the way out; the slice stays
/// (a restarting plugin keeps its node schedulable; the kubelet deletes it 30 s after the
/// plugin unregistered for good).
pub async fn run(
    ctx: Context,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let s = &ctx.settings;
    let client = client(s).await?;
    std::fs::create_dir_all(s.plugin_dir())
        .with_context(|| format!("creating {}", s.plugin_dir().display()))?;
    std::fs::create_dir_all(&s.cdi_root)
        .with_context(|| format!("creating --cdi-root {}", s.cdi_root.display()))?;
    let (checkpoint, loaded) = checkpoint::Checkpoint::load(&s.checkpoint())?;
    match &loaded {
        checkpoint::Loaded::Fresh => tracing::info!("no prepared claims recorded"),
        checkpoint::Loaded::Restored(n) => {
            tracing::info!(claims = n, "restored the prepared claims")
        }
        checkpoint::Loaded::MovedAside { to, reason } => tracing::error!(
            moved_to = %to.display(), %reason,
            "the prepared-claims checkpoint is damaged; moved it aside and starting empty (claims prepared before are prepared again from the API server)"
        ),
    }
    let total = ctx.backends.devices().count();
    if total > slice::MAX_DEVICES {
        tracing::error!(
            devices = total,
            "a ResourceSlice holds at most {} devices; only the first are published",
            slice::MAX_DEVICES
        );
    }
    for (id, attr) in slice::oversized_attributes(&ctx.backends) {
        tracing::warn!(device = %id, attribute = attr, "value longer than 64 characters; attribute left out of the ResourceSlice");
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let poke = Arc::new(Notify::new());
    let publisher = slice::Publisher::new(client.clone(), ctx.node.clone(), ctx.backends.clone());
    let publish = tokio::spawn(
        slice::run(publisher, ctx.health.clone(), poke.clone(), RESYNC, stop_rx)
            .instrument(tracing::info_span!("resourceslice", node = %ctx.node)),
    );

    let preparer = Arc::new(kubelet::Preparer::new(
        kubelet::ApiClaims::new(client),
        ctx.node.clone(),
        ctx.backends.clone(),
        cdi::CdiDir::new(s.cdi_root.clone()),
        checkpoint,
        ctx.health.clone(),
        ctx.metrics.clone(),
    ));
    let dra_routes = tonic::service::Routes::new(dra_api::dra_plugin_server::DraPluginServer::new(
        kubelet::DraService(preparer),
    ));
    let registration =
        registration::RegistrationService::new(&s.dra_socket(), poke, ctx.metrics.clone());
    let reg_routes = tonic::service::Routes::new(
        reg_api::registration_server::RegistrationServer::new(registration),
    );
    let serving = async {
        // The DRA service first: the kubelet dials it as soon as it sees the registration.
        let dra = registration::serve(&s.dra_socket(), dra_routes).await?;
        let reg = registration::serve(&s.registration_socket(), reg_routes).await?;
        Ok::<_, registration::SocketError>((dra, reg))
    };

    tokio::pin!(shutdown);
    // Dropping a half-started `serving` (shutdown while waiting for a socket) stops what it
    // started: `Served` cleans up on drop.
    let served = tokio::select! {
        r = serving => Some(r),
        _ = &mut shutdown => None,
    };
    let result = match served {
        Some(Ok((dra, reg))) => {
            tracing::info!(driver = DRIVER, dra = %dra.path().display(), registration = %reg.path().display(), "DRA kubelet plugin ready; waiting for the kubelet to register it");
            shutdown.await;
            // Unregister first, so the kubelet stops calling before the DRA service goes.
            reg.stop().await;
            dra.stop().await;
            Ok(())
        }
        Some(Err(e)) => Err(e.into()),
        None => Ok(()),
    };
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(2), publish).await;
    tracing::info!("DRA kubelet plugin stopped");
    result
}

/// Deletes the node's ResourceSlice: the node stopped using DRA (the orchestrator switched it
/// back to the device-plugin API), so the scheduler must not allocate its devices through DRA.
pub async fn withdraw(s: &DraSettings, node: &str, backends: &Backends) -> anyhow::Result<()> {
    let client = client(s).await?;
    let mut publisher = slice::Publisher::new(client, node.to_owned(), backends.clone());
    publisher.withdraw().await?;
    Ok(())
}
