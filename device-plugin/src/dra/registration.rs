//! Registration with the kubelet's plugin watcher, and the two Unix sockets of DRA mode.
//!
//! The kubelet watches `/var/lib/kubelet/plugins_registry` (inotify); for a new socket there it
//! calls `pluginregistration.Registration/GetInfo`, validates the answer (type `DRAPlugin`,
//! the driver name, a DRA service it speaks among `supported_versions`), dials `endpoint`, and
//! reports the outcome with `NotifyRegistrationStatus`. Removing the registration socket
//! unregisters the plugin; 30 s later the kubelet deletes the node's slices of the driver
//! unless the plugin came back. So the DRA socket listens before the registration socket
//! exists, and on shutdown the registration socket goes first.

use super::authority::AuthorityFix;
use crate::metrics::Metrics;
use crate::runtime::{FileId, Occupant, probe_socket, remove_if_same};
use kudos_proto::dra::v1 as dra_api;
use kudos_proto::pluginregistration::v1 as api;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

/// The `Registration` service.
pub struct RegistrationService {
    endpoint: String,
    registered: Arc<Notify>,
    metrics: Metrics,
}

impl RegistrationService {
    /// Advertises the DRA service at `endpoint` (an absolute socket path); `registered` is
    /// notified when the kubelet reports a successful registration.
    pub fn new(endpoint: &Path, registered: Arc<Notify>, metrics: Metrics) -> Self {
        RegistrationService {
            endpoint: endpoint.display().to_string(),
            registered,
            metrics,
        }
    }

    /// What `GetInfo` answers.
    pub fn info(&self) -> api::PluginInfo {
        api::PluginInfo {
            r#type: api::DRA_PLUGIN.into(),
            name: kudos_api::dra::DRIVER.into(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec![dra_api::SERVICE.into()],
        }
    }
}

#[tonic::async_trait]
impl api::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _req: Request<api::InfoRequest>,
    ) -> Result<Response<api::PluginInfo>, Status> {
        tracing::debug!("the kubelet asked for the plugin info");
        Ok(Response::new(self.info()))
    }

    async fn notify_registration_status(
        &self,
        req: Request<api::RegistrationStatus>,
    ) -> Result<Response<api::RegistrationStatusResponse>, Status> {
        let status = req.into_inner();
        self.metrics.registration(status.plugin_registered);
        if status.plugin_registered {
            tracing::info!(driver = kudos_api::dra::DRIVER, endpoint = %self.endpoint, "registered with the kubelet as a DRA plugin");
            self.registered.notify_one();
        } else {
            tracing::error!(driver = kudos_api::dra::DRIVER, error = %status.error, "the kubelet refused the DRA plugin registration");
        }
        Ok(Response::new(api::RegistrationStatusResponse {}))
    }
}

// === sockets ===

/// Errors serving a socket.
#[derive(Debug, thiserror::Error)]
#[error("serving {path}: {source}")]
pub struct SocketError {
    /// The socket.
    pub path: PathBuf,
    /// Cause.
    #[source]
    pub source: std::io::Error,
}

/// A gRPC server on a Unix socket. Dropping it stops the server and removes the socket file
/// (if still ours) without waiting; [`Served::stop`] waits.
pub struct Served {
    path: PathBuf,
    id: Option<FileId>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

/// How long a stopping server waits for open connections (the kubelet keeps one) to close.
const STOP_WAIT: Duration = Duration::from_secs(2);

impl Served {
    fn remove_socket(&mut self) {
        if let Some(id) = self.id.take()
            && let Err(e) = remove_if_same(&self.path, id)
        {
            tracing::warn!(socket = %self.path.display(), error = %e, "cannot remove the socket");
        }
    }

    /// Removes the socket file (if still ours), then stops the server, waiting a moment for
    /// open connections.
    pub async fn stop(mut self) {
        self.remove_socket();
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(STOP_WAIT, task).await.is_err() {
                abort.abort();
            }
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.remove_socket();
        let _ = self.stop.send(true);
    }
}

/// Binds `path`: a missing file or a stale one (nobody accepts connections) is fine; a socket
/// another live process serves (the previous plugin pod, still stopping) is waited for, as
/// long as the caller waits.
async fn bind(path: &Path) -> Result<tokio::net::UnixListener, SocketError> {
    let err = |source| SocketError {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let mut told = false;
    loop {
        match probe_socket(path).await {
            Occupant::Free => {}
            Occupant::Stale(id) => {
                remove_if_same(path, id).map_err(err)?;
            }
            Occupant::Live => {
                if !told {
                    tracing::info!(socket = %path.display(), "another live process serves this socket; waiting for it to stop");
                    told = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        }
        match tokio::net::UnixListener::bind(path) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(err(e)),
        }
    }
}

/// Serves `routes` on `path`: a missing or stale socket file is replaced, one another live
/// process serves is waited for.
pub async fn serve(path: &Path, routes: tonic::service::Routes) -> Result<Served, SocketError> {
    let listener = bind(path).await?;
    let id = FileId::of(path);
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let task = tokio::spawn(
        tonic::transport::Server::builder()
            .concurrency_limit_per_connection(64)
            .timeout(Duration::from_secs(120))
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .add_routes(routes)
            .serve_with_incoming_shutdown(
                // The kubelet's registration client sends the socket path as :authority.
                UnixListenerStream::new(listener).map(|c| c.map(AuthorityFix::new)),
                async move {
                    let _ = stop_rx.changed().await;
                },
            )
            .instrument(tracing::info_span!("socket", path = %path.display())),
    );
    tracing::info!(socket = %path.display(), "serving");
    Ok(Served {
        path: path.to_owned(),
        id,
        stop: stop_tx,
        task: Some(task),
    })
}
