//! Lifecycle: serve the plugin socket, register with the kubelet, and keep registered.
//!
//! The kubelet deletes every socket in the device-plugin directory when it restarts and never
//! re-opens a dead `ListAndWatch` stream, so registration is a reconcile loop rather than a
//! one-off call. Triggers (inotify on the directory, a closed stream, a new unified name, a
//! 5 s safety tick, a retry timer) only wake the loop; each pass compares the world with what
//! we last did:
//!
//! ```text
//!   own socket missing or not ours ─┐
//!   unified name changed ───────────┼─> restart server ─┐
//!   kubelet.sock has a new inode ───┐                   ├─> Register(name) when kubelet.sock exists
//!   stream closed, none open ───────┴───────────────────┘
//! ```
//!
//! Deciding from state instead of from events makes duplicate and self-inflicted events
//! (our own socket re-creation) harmless, which is the de-bouncing.

use crate::backend::Backends;
use crate::health::HealthMap;
use crate::metrics::Metrics;
use crate::server::{PluginServer, Streams};
use kudos_proto::deviceplugin::v1beta1 as api;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Endpoint, Server, Uri};

/// Errors that stop the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The plugin socket could not be created.
    #[error("serving {path}: {source}")]
    Serve {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The device-plugin directory cannot be watched.
    #[error("watching {path}: {source}")]
    Watch {
        /// Directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Why one registration failed.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// Connecting to `kubelet.sock` failed.
    #[error("connecting to the kubelet: {0}")]
    Connect(#[from] tonic::transport::Error),
    /// The kubelet refused.
    #[error("the kubelet refused registration: {0}")]
    Refused(#[from] tonic::Status),
    /// No answer in time.
    #[error("the kubelet did not answer in time")]
    Timeout,
}

/// Where and how to serve.
#[derive(Clone, Debug)]
pub struct Lifecycle {
    /// The kubelet's device-plugin directory.
    pub dir: PathBuf,
    /// Our socket's file name inside `dir`.
    pub socket_name: String,
    /// Bound on each registration call.
    pub register_timeout: Duration,
    /// Safety-net reconcile period (covers missed inotify events).
    pub resync: Duration,
}

impl Lifecycle {
    fn socket(&self) -> PathBuf {
        self.dir.join(&self.socket_name)
    }

    fn kubelet(&self) -> PathBuf {
        self.dir.join(api::KUBELET_SOCKET)
    }
}

fn inode(p: &Path) -> Option<u64> {
    std::fs::metadata(p).ok().map(|m| m.ino())
}

// === server instance ===

struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
    inode: Option<u64>,
}

struct Shared {
    backends: Backends,
    health: watch::Receiver<Arc<HealthMap>>,
    metrics: Metrics,
    streams: Arc<Streams>,
}

fn start_server(shared: &Shared, path: &Path) -> Result<Running, RuntimeError> {
    let serve_err = |source| RuntimeError::Serve {
        path: path.to_owned(),
        source,
    };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(serve_err(e)),
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(serve_err)?;
    let inode = inode(path);
    let (stop, stop_rx) = watch::channel(false);
    let svc = PluginServer::new(
        shared.backends.clone(),
        shared.health.clone(),
        shared.metrics.clone(),
        shared.streams.clone(),
        stop_rx.clone(),
    );
    let mut stop_wait = stop_rx;
    let task = tokio::spawn(
        Server::builder()
            .concurrency_limit_per_connection(64)
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .add_service(api::device_plugin_server::DevicePluginServer::new(svc))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = stop_wait.changed().await;
            }),
    );
    tracing::info!(socket = %path.display(), "serving the device-plugin API");
    Ok(Running { stop, task, inode })
}

async fn stop_server(r: Running) {
    let _ = r.stop.send(true);
    let mut task = r.task;
    if tokio::time::timeout(Duration::from_secs(2), &mut task)
        .await
        .is_err()
    {
        tracing::warn!("plugin server did not drain within 2 s; aborting it");
        task.abort();
    }
}

/// Opens a gRPC channel over a Unix socket (the kubelet's, or a plugin's in tests).
pub async fn connect_unix(
    path: &Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_owned();
    // The URI is required by tonic but unused: the connector dials the socket.
    Endpoint::from_static("http://[::1]:0")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
}

/// Sends `Register` to the kubelet over its Unix socket.
pub async fn register(
    kubelet: &Path,
    endpoint: &str,
    resource_name: &str,
    timeout: Duration,
) -> Result<(), RegisterError> {
    let call = async {
        let mut client =
            api::registration_client::RegistrationClient::new(connect_unix(kubelet).await?);
        client
            .register(api::RegisterRequest {
                version: api::VERSION.into(),
                endpoint: endpoint.into(),
                resource_name: resource_name.into(),
                options: Some(crate::server::options()),
            })
            .await?;
        Ok(())
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| RegisterError::Timeout)?
}

// === watch ===

/// Forwards inotify events about `kubelet.sock` and our socket as wake-ups.
fn watch_dir(
    l: &Lifecycle,
    wake: mpsc::Sender<&'static str>,
) -> Result<JoinHandle<()>, RuntimeError> {
    use inotify::{Inotify, WatchMask};
    let werr = |source| RuntimeError::Watch {
        path: l.dir.clone(),
        source,
    };
    let inotify = Inotify::init().map_err(werr)?;
    inotify
        .watches()
        .add(
            &l.dir,
            WatchMask::CREATE | WatchMask::DELETE | WatchMask::MOVED_TO | WatchMask::MOVED_FROM,
        )
        .map_err(werr)?;
    let mut events = inotify.into_event_stream([0u8; 4096]).map_err(werr)?;
    let own = l.socket_name.clone();
    Ok(tokio::spawn(async move {
        while let Some(ev) = events.next().await {
            let ev = match ev {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::warn!(error = %e, "inotify failed; relying on the periodic resync");
                    return;
                }
            };
            let Some(name) = ev.name.as_ref().and_then(|n| n.to_str()) else {
                continue;
            };
            let what = if name == api::KUBELET_SOCKET {
                "kubelet_socket"
            } else if name == own {
                "own_socket"
            } else {
                continue;
            };
            tracing::debug!(file = name, mask = ?ev.mask, "device-plugin directory changed");
            // A full queue means a wake-up is already pending.
            let _ = wake.try_send(what);
        }
    }))
}

// === reconcile loop ===

/// What the last successful registration was for.
#[derive(Debug, Default, PartialEq, Eq)]
struct Registered {
    kubelet_inode: Option<u64>,
    name: String,
    server_inode: Option<u64>,
}

/// Sleeps until `at`, or forever when `None`.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Serves and keeps the plugin registered until `shutdown` resolves.
pub async fn run(
    l: Lifecycle,
    backends: Backends,
    health: watch::Receiver<Arc<HealthMap>>,
    mut name: watch::Receiver<String>,
    metrics: Metrics,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(&l.dir).map_err(|source| RuntimeError::Watch {
        path: l.dir.clone(),
        source,
    })?;
    let streams = Arc::new(Streams::default());
    let shared = Shared {
        backends,
        health,
        metrics: metrics.clone(),
        streams: streams.clone(),
    };
    let (wake_tx, mut wake) = mpsc::channel::<&'static str>(16);
    let watcher = watch_dir(&l, wake_tx)?;
    let mut server = Some(start_server(&shared, &l.socket())?);
    let mut registered: Option<Registered> = None;
    let mut stream_closed = false;
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut resync = tokio::time::interval(l.resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    let mut ever_registered = false;
    let mut stream_check_at: Option<tokio::time::Instant> = None;
    let mut name_open = true;

    loop {
        // === one reconcile pass ===
        let mut reason = if ever_registered {
            "kubelet_socket_changed"
        } else {
            "start"
        };
        let current_name = name.borrow_and_update().clone();
        let socket_ok = server
            .as_ref()
            .is_some_and(|s| s.inode.is_some() && inode(&l.socket()) == s.inode);
        let name_changed = registered.as_ref().is_some_and(|r| r.name != current_name);
        if !socket_ok || name_changed {
            if let Some(s) = server.take() {
                // Drain the old instance in the background: its socket is gone or renamed,
                // and waiting for its connections would delay the new registration.
                tokio::spawn(stop_server(s));
            }
            // A failure here (directory gone mid-restart) is retried, not fatal: the node's
            // GPUs must come back once the kubelet has settled.
            server = match start_server(&shared, &l.socket()) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot serve the plugin socket; retrying in 1 s");
                    let _ = std::fs::create_dir_all(&l.dir);
                    retry_at = Some(tokio::time::Instant::now() + Duration::from_secs(1));
                    None
                }
            };
            registered = None;
            if !socket_ok {
                reason = "own_socket_removed";
            } else {
                reason = "name_changed";
            }
        }
        if stream_closed && streams.active() == 0 {
            registered = None;
            reason = "stream_closed";
        }
        stream_closed = false;
        let kubelet_inode = inode(&l.kubelet());
        let server_inode = server.as_ref().and_then(|s| s.inode);
        let want = Registered {
            kubelet_inode,
            name: current_name.clone(),
            server_inode,
        };
        if server.is_some() && kubelet_inode.is_some() && registered.as_ref() != Some(&want) {
            match register(
                &l.kubelet(),
                &l.socket_name,
                &current_name,
                l.register_timeout,
            )
            .await
            {
                Ok(()) => {
                    tracing::info!(resource = %current_name, endpoint = %l.socket_name, trigger = reason, "registered with the kubelet");
                    metrics.registration(true);
                    if ever_registered {
                        metrics.reregistration(reason);
                    }
                    ever_registered = true;
                    registered = Some(want);
                    retry_at = None;
                }
                Err(e) => {
                    // The kubelet creates its socket a moment before it listens: retry soon.
                    tracing::warn!(error = %e, "registration failed; retrying in 200 ms");
                    metrics.registration(false);
                    retry_at = Some(tokio::time::Instant::now() + Duration::from_millis(200));
                }
            }
        } else if kubelet_inode.is_none() && registered.is_none() {
            tracing::debug!("waiting for {}", l.kubelet().display());
        }

        // === wait for a reason to look again ===
        let retry = sleep_until(retry_at);
        let stream_check = sleep_until(stream_check_at);
        tokio::select! {
            _ = &mut shutdown => break,
            Some(what) = wake.recv() => {
                // Let a burst (kubelet deleting every socket, then creating its own) settle.
                tokio::time::sleep(Duration::from_millis(20)).await;
                while wake.try_recv().is_ok() {}
                tracing::debug!(trigger = what, "reconciling");
            }
            _ = streams.closed.notified() => {
                // The kubelet closes the old stream when it accepts a new registration; give
                // a replacement stream time to open before deciding the stream is gone. A
                // timer, not a sleep here, so socket events are not held up meanwhile.
                stream_check_at = Some(tokio::time::Instant::now() + Duration::from_millis(300));
            }
            _ = stream_check => {
                stream_check_at = None;
                stream_closed = true;
            }
            // Without an orchestrator nobody publishes names: the sender is gone for good.
            changed = name.changed(), if name_open => if changed.is_err() { name_open = false },
            _ = retry => {}
            _ = resync.tick() => {}
        }
    }

    watcher.abort();
    if let Some(s) = server.take() {
        stop_server(s).await;
    }
    let _ = std::fs::remove_file(l.socket());
    tracing::info!("device plugin stopped");
    Ok(())
}
