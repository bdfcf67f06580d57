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
//!
//! Socket handover: during a rollout a node's old plugin pod and its replacement overlap for a
//! few seconds, both serving the same socket path for the same resource name. A socket file
//! another live process accepts connections on is never unlinked: the newcomer waits until it
//! is gone or refuses connections (a stale file, its process dead, is replaced at once), and a
//! plugin removes the socket file on shutdown only if it is still the one it created. The old
//! plugin, on shutdown, ends its `ListAndWatch` stream and lets the kubelet hang up before its
//! socket stops accepting, so the newcomer registers only after the kubelet has dropped the
//! old client (`start_server` says why that order matters).

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
use tonic::transport::Server;
use tonic::transport::server::Connected;

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

impl RegisterError {
    /// The kind of failure, for logging once per change of state.
    fn kind(&self) -> String {
        match self {
            RegisterError::Connect(_) => "connect".into(),
            RegisterError::Refused(s) => format!("refused:{:?}", s.code()),
            RegisterError::Timeout => "timeout".into(),
        }
    }
}

/// When to retry a failed registration, and whether a failure is worth a warning.
///
/// Delays double from `initial` up to `cap`, so a stale `kubelet.sock` (the kubelet gone,
/// its socket left behind) costs a connection attempt every `cap` rather than five a second.
/// A new `kubelet.sock` (the kubelet restarted) starts the schedule over, so a restarted
/// kubelet is registered with within `initial` of listening. Only a change of state is
/// logged as a warning: the first failure, or a different kind of failure.
#[derive(Debug)]
pub struct RegisterBackoff {
    initial: Duration,
    cap: Duration,
    next_delay: Duration,
    kubelet_inode: Option<u64>,
    failing: Option<String>,
    failures: u32,
}

/// What to do after a failed registration.
#[derive(Debug, PartialEq, Eq)]
pub struct Retry {
    /// Wait this long before the next attempt.
    pub after: Duration,
    /// Whether this failure changes the state (log it as a warning; else at debug).
    pub warn: bool,
}

impl RegisterBackoff {
    /// A schedule from `initial` doubling up to `cap`.
    pub fn new(initial: Duration, cap: Duration) -> Self {
        RegisterBackoff {
            initial,
            cap,
            next_delay: initial,
            kubelet_inode: None,
            failing: None,
            failures: 0,
        }
    }

    /// Notes the current `kubelet.sock` inode; a different one restarts the schedule.
    /// Returns whether it did.
    pub fn observe_kubelet(&mut self, inode: Option<u64>) -> bool {
        if inode == self.kubelet_inode {
            return false;
        }
        self.kubelet_inode = inode;
        self.next_delay = self.initial;
        true
    }

    /// Records a failure of `kind`.
    pub fn failed(&mut self, kind: &str) -> Retry {
        let warn = self.failing.as_deref() != Some(kind);
        self.failing = Some(kind.to_owned());
        self.failures = self.failures.saturating_add(1);
        let after = self.next_delay;
        self.next_delay = self.next_delay.saturating_mul(2).min(self.cap);
        Retry { after, warn }
    }

    /// Records a success; returns how many attempts failed before it.
    pub fn succeeded(&mut self) -> u32 {
        self.failing = None;
        self.next_delay = self.initial;
        std::mem::take(&mut self.failures)
    }
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
    /// First retry delay after a failed registration; doubles up to `register_backoff_cap`.
    pub register_backoff: Duration,
    /// Longest delay between registration attempts while `kubelet.sock` stays the same.
    pub register_backoff_cap: Duration,
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

/// A file's identity: device, inode and (where the file system records it) birth time. A
/// file system may give a freed inode number to the next file created, so a socket deleted and
/// re-created by another process can have the old inode; its birth time tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
    born: Option<std::time::SystemTime>,
}

impl FileId {
    /// The identity of the file at `path` (a symbolic link itself, not its target), if any.
    pub fn of(path: &Path) -> Option<FileId> {
        std::fs::symlink_metadata(path).ok().map(|m| FileId {
            dev: m.dev(),
            ino: m.ino(),
            born: m.created().ok(),
        })
    }
}

/// Removes `path` if it still is the file `id`; a file someone re-created there in the
/// meantime is left alone. (Between the check and the unlink another process could still
/// replace the file; the window is a system call wide, where a plain unlink's is unbounded.)
pub fn remove_if_same(path: &Path, id: FileId) -> std::io::Result<bool> {
    if FileId::of(path) != Some(id) {
        return Ok(false);
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Who holds a socket path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Occupant {
    /// No file there.
    Free,
    /// A file nobody accepts connections on (its server is gone): safe to replace.
    Stale(FileId),
    /// A live process accepts connections on it: leave it alone.
    Live,
}

/// Finds out whether a live process serves `path`, by connecting to it. A connection that is
/// accepted, or cannot be queued because the server's backlog is full, or does not complete
/// within a second, means live; a refused one (or any other failure) means the file is stale.
pub async fn probe_socket(path: &Path) -> Occupant {
    let Some(id) = FileId::of(path) else {
        return Occupant::Free;
    };
    match tokio::time::timeout(Duration::from_secs(1), UnixStream::connect(path)).await {
        Ok(Ok(_)) | Err(_) => Occupant::Live,
        Ok(Err(e)) => match e.kind() {
            std::io::ErrorKind::NotFound => Occupant::Free,
            std::io::ErrorKind::WouldBlock => Occupant::Live,
            _ => Occupant::Stale(id),
        },
    }
}

// === server instance ===

struct Running {
    /// Ends the `ListAndWatch` streams.
    streams_stop: watch::Sender<bool>,
    /// Stops accepting connections and drains the server.
    stop: watch::Sender<bool>,
    /// Closed once no connection to this server is open.
    connections: watch::Sender<()>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
    /// The socket file this instance created.
    id: Option<FileId>,
}

/// A connection to our socket, counted while open so that a shutdown can wait for the kubelet
/// to hang up before the socket stops accepting.
struct Counted {
    io: UnixStream,
    _open: watch::Receiver<()>,
}

impl Connected for Counted {
    type ConnectInfo = <UnixStream as Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl tokio::io::AsyncRead for Counted {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

struct Shared {
    backends: Backends,
    health: watch::Receiver<Arc<HealthMap>>,
    metrics: Metrics,
    streams: Arc<Streams>,
}

/// What [`start_server`] found.
enum Start {
    /// Serving on a socket file of our own.
    Serving(Running),
    /// Another live process serves the path; try again later.
    Busy,
}

/// Serves the device-plugin API on `path`, unless another live process already does.
///
/// A file there that is `ours` (the socket this process created last) or stale is replaced.
/// One a live process accepts connections on is left alone: during a rollout that is the
/// previous plugin pod, still draining, and unlinking its socket would start a fight (it
/// re-creates its socket, we ours, each re-registering). Waiting for it to stop accepting
/// also orders the registrations the way the kubelet needs: both plugins use the same socket
/// path and resource name, and when a plugin's `ListAndWatch` stream ends, the kubelet's
/// `runClient` disconnects whichever client is registered under that name *at that moment*
/// (kubelets from 1.25 until kubernetes#135437, see kubernetes#121994), so a newcomer that
/// registered before the old stream ended loses its registration; later kubelets (1.37 here)
/// key clients by socket path and refuse a second registration of a path that is still
/// connected ("device plugin already connected"). The old plugin ends its stream and waits
/// for the kubelet to hang up before its socket stops accepting (see `run`'s shutdown), so
/// registering after the socket stops accepting registers after the kubelet dropped the old
/// client.
async fn start_server(
    shared: &Shared,
    path: &Path,
    ours: Option<FileId>,
) -> Result<Start, RuntimeError> {
    let serve_err = |source| RuntimeError::Serve {
        path: path.to_owned(),
        source,
    };
    // Another process may bind between our check and our bind (both starting at once after a
    // kubelet restart deleted every socket): then look again, it is probably live.
    for _ in 0..3 {
        let stale = match FileId::of(path) {
            Some(id) if Some(id) == ours => Some(id),
            _ => match probe_socket(path).await {
                Occupant::Free => None,
                Occupant::Live => return Ok(Start::Busy),
                Occupant::Stale(id) => {
                    tracing::info!(socket = %path.display(), "replacing a stale socket nobody accepts connections on");
                    Some(id)
                }
            },
        };
        if let Some(id) = stale {
            remove_if_same(path, id).map_err(serve_err)?;
        }
        let listener = match tokio::net::UnixListener::bind(path) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(serve_err(e)),
        };
        return Ok(Start::Serving(serve(shared, path, listener)));
    }
    Ok(Start::Busy)
}

fn serve(shared: &Shared, path: &Path, listener: tokio::net::UnixListener) -> Running {
    let id = FileId::of(path);
    let (stop, stop_rx) = watch::channel(false);
    let (streams_stop, streams_stop_rx) = watch::channel(false);
    let (connections, _) = watch::channel(());
    let svc = PluginServer::new(
        shared.backends.clone(),
        shared.health.clone(),
        shared.metrics.clone(),
        shared.streams.clone(),
        streams_stop_rx,
    );
    let counter = connections.clone();
    let incoming = UnixListenerStream::new(listener).map(move |conn| {
        conn.map(|io| Counted {
            io,
            _open: counter.subscribe(),
        })
    });
    let mut stop_wait = stop_rx;
    let task = tokio::spawn(
        Server::builder()
            .concurrency_limit_per_connection(64)
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .add_service(api::device_plugin_server::DevicePluginServer::new(svc))
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop_wait.changed().await;
            }),
    );
    tracing::info!(socket = %path.display(), "serving the device-plugin API");
    Running {
        streams_stop,
        stop,
        connections,
        task,
        id,
    }
}

/// Stops a server: ends its `ListAndWatch` streams, waits up to `hang_up` for every client
/// (the kubelet) to close its connection, then stops accepting and drains for at most 2 s.
async fn stop_server(r: Running, hang_up: Duration) {
    let _ = r.streams_stop.send(true);
    if !hang_up.is_zero()
        && tokio::time::timeout(hang_up, r.connections.closed())
            .await
            .is_err()
    {
        tracing::debug!(waited = ?hang_up, "a client kept its connection open; closing the socket anyway");
    }
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

/// Sends `Register` to the kubelet over its Unix socket.
pub async fn register(
    kubelet: &Path,
    endpoint: &str,
    resource_name: &str,
    timeout: Duration,
) -> Result<(), RegisterError> {
    let call = async {
        let mut client = api::registration_client::RegistrationClient::new(
            kudos_proto::unix::connect(kubelet).await?,
        );
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
    server: Option<FileId>,
}

/// Sleeps until `at`, or forever when `None`.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// How long a shutdown waits for the kubelet to hang up after our stream ended.
const HANG_UP_WAIT: Duration = Duration::from_secs(1);
/// Polling of a socket another live process serves: from this, doubling...
const HOLDER_POLL: Duration = Duration::from_millis(100);
/// ...up to this (its removal also wakes us through inotify).
const HOLDER_POLL_CAP: Duration = Duration::from_secs(1);
/// At most one reminder this often while waiting for it.
const HOLDER_REMINDER: Duration = Duration::from_secs(30);

/// Waiting for another live process to give up our socket path.
#[derive(Debug)]
struct HolderWait {
    since: tokio::time::Instant,
    reminded: tokio::time::Instant,
    poll: Duration,
}

impl HolderWait {
    fn new(now: tokio::time::Instant) -> Self {
        HolderWait {
            since: now,
            reminded: now,
            poll: HOLDER_POLL,
        }
    }

    /// The delay before the next look, and whether a reminder is due.
    fn next(&mut self, now: tokio::time::Instant) -> (Duration, bool) {
        let delay = self.poll;
        self.poll = (self.poll * 2).min(HOLDER_POLL_CAP);
        let remind = now.duration_since(self.reminded) >= HOLDER_REMINDER;
        if remind {
            self.reminded = now;
        }
        (delay, remind)
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
    let mut server: Option<Running> = None;
    // The socket file this process created last (a server may have stopped since).
    let mut own_file: Option<FileId> = None;
    let mut holder_wait: Option<HolderWait> = None;
    let mut registered: Option<Registered> = None;
    let mut stream_closed = false;
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut backoff = RegisterBackoff::new(l.register_backoff, l.register_backoff_cap);
    // No attempt before this, unless kubelet.sock is replaced (backoff after failures).
    let mut attempt_after: Option<tokio::time::Instant> = None;
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
            .is_some_and(|s| s.id.is_some() && FileId::of(&l.socket()) == s.id);
        let name_changed = registered.as_ref().is_some_and(|r| r.name != current_name);
        if !socket_ok || name_changed {
            let had_server = server.is_some();
            if let Some(s) = server.take() {
                // Drain the old instance in the background: its socket is gone or renamed,
                // and waiting for its connections would delay the new registration.
                tokio::spawn(stop_server(s, Duration::ZERO));
            }
            // A failure here (directory gone mid-restart) is retried, not fatal: the node's
            // GPUs must come back once the kubelet has settled.
            match start_server(&shared, &l.socket(), own_file).await {
                Ok(Start::Serving(s)) => {
                    if let Some(w) = holder_wait.take() {
                        tracing::info!(socket = %l.socket().display(), waited = ?w.since.elapsed(), "the socket's previous holder stopped serving it; serving it now");
                        reason = "socket_handed_over";
                    }
                    own_file = s.id;
                    server = Some(s);
                }
                Ok(Start::Busy) => {
                    let now = tokio::time::Instant::now();
                    let w = holder_wait.get_or_insert_with(|| {
                        tracing::info!(socket = %l.socket().display(), "another live process serves the plugin socket (the previous plugin pod during a rollout?); waiting for it to stop before serving and registering");
                        HolderWait::new(now)
                    });
                    let (delay, remind) = w.next(now);
                    if remind {
                        tracing::info!(socket = %l.socket().display(), waiting = ?now.duration_since(w.since), "still waiting for the plugin socket's holder to stop serving it");
                    }
                    retry_at = Some(now + delay);
                }
                Err(e) if !had_server && own_file.is_none() && holder_wait.is_none() => {
                    // Never served: a socket that cannot be created at all is a setup error.
                    watcher.abort();
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot serve the plugin socket; retrying in 1 s");
                    let _ = std::fs::create_dir_all(&l.dir);
                    retry_at = Some(tokio::time::Instant::now() + Duration::from_secs(1));
                }
            }
            registered = None;
            if had_server {
                reason = if socket_ok {
                    "name_changed"
                } else {
                    "own_socket_removed"
                };
            }
        }
        if stream_closed && streams.active() == 0 {
            registered = None;
            reason = "stream_closed";
        }
        stream_closed = false;
        let kubelet_inode = inode(&l.kubelet());
        let want = Registered {
            kubelet_inode,
            name: current_name.clone(),
            server: server.as_ref().and_then(|s| s.id),
        };
        if backoff.observe_kubelet(kubelet_inode) {
            attempt_after = None;
        }
        let due = attempt_after.is_none_or(|t| tokio::time::Instant::now() >= t);
        if server.is_some() && kubelet_inode.is_some() && registered.as_ref() != Some(&want) && due
        {
            // An unresponsive kubelet must not hold up a shutdown for the whole timeout.
            let kubelet = l.kubelet();
            let outcome = tokio::select! {
                r = register(&kubelet, &l.socket_name, &current_name, l.register_timeout) => r,
                _ = &mut shutdown => break,
            };
            match outcome {
                Ok(()) => {
                    let failed_before = backoff.succeeded();
                    tracing::info!(resource = %current_name, endpoint = %l.socket_name, trigger = reason, failed_before, "registered with the kubelet");
                    metrics.registration(true);
                    if ever_registered {
                        metrics.reregistration(reason);
                    }
                    ever_registered = true;
                    registered = Some(want);
                    retry_at = None;
                    attempt_after = None;
                }
                Err(e) => {
                    // The kubelet creates its socket a moment before it listens, so the first
                    // retry comes soon; a socket nobody listens on is retried ever less often.
                    let retry = backoff.failed(&e.kind());
                    if retry.warn {
                        tracing::warn!(error = %e, retry_in = ?retry.after, "registration failed; retrying with back-off (repeats of this failure are logged at debug)");
                    } else {
                        tracing::debug!(error = %e, retry_in = ?retry.after, "registration failed again");
                    }
                    metrics.registration(false);
                    let at = tokio::time::Instant::now() + retry.after;
                    retry_at = Some(at);
                    attempt_after = Some(at);
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
        // End the stream and let the kubelet hang up before the socket stops accepting: a
        // successor waiting for this socket (start_server) then registers after the kubelet
        // has dropped us. Remove the socket only if it is still ours: once it stopped
        // accepting, a successor may have replaced it already.
        stop_server(s, HANG_UP_WAIT).await;
    }
    if let Some(id) = own_file
        && let Err(e) = remove_if_same(&l.socket(), id)
    {
        tracing::warn!(socket = %l.socket().display(), error = %e, "cannot remove the plugin socket");
    }
    tracing::info!("device plugin stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_registrations_back_off_to_the_cap_and_warn_once_per_state() {
        let mut b = RegisterBackoff::new(Duration::from_millis(200), Duration::from_secs(10));
        assert!(b.observe_kubelet(Some(7)));
        let delays: Vec<_> = (0..8).map(|_| b.failed("connect")).collect();
        let ms: Vec<u128> = delays.iter().map(|r| r.after.as_millis()).collect();
        assert_eq!(ms, [200, 400, 800, 1600, 3200, 6400, 10_000, 10_000]);
        assert_eq!(
            delays.iter().filter(|r| r.warn).count(),
            1,
            "a stale socket warns once"
        );
        assert!(
            b.failed("timeout").warn,
            "a different failure is a new state"
        );
        assert!(!b.observe_kubelet(Some(7)));
        assert!(
            b.observe_kubelet(Some(8)),
            "a restarted kubelet starts over"
        );
        assert_eq!(b.failed("timeout").after, Duration::from_millis(200));
        assert_eq!(b.succeeded(), 10);
        assert!(
            b.failed("timeout").warn,
            "failing again after a success warns"
        );
    }

    /// The real loop against a `kubelet.sock` nobody listens on, for one virtual minute.
    #[tokio::test(start_paused = true)]
    async fn a_stale_kubelet_socket_is_retried_with_back_off() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_owned();
        drop(std::os::unix::net::UnixListener::bind(dir.join(api::KUBELET_SOCKET)).expect("bind"));
        let metrics = Metrics::new();
        let backends = Backends::new(Vec::new()).expect("no backends");
        let (_health_tx, health) = watch::channel(Arc::new(HealthMap::default()));
        let (_name_tx, name) = watch::channel("kudos.dev/gpu".to_string());
        let l = Lifecycle {
            dir,
            socket_name: "kudos.sock".into(),
            register_timeout: Duration::from_secs(5),
            resync: Duration::from_secs(5),
            register_backoff: Duration::from_millis(200),
            register_backoff_cap: Duration::from_secs(10),
        };
        let minute = tokio::time::sleep(Duration::from_secs(60));
        run(l, backends, health, name, metrics.clone(), minute)
            .await
            .expect("runs");
        let text = metrics.encode();
        let failures: u64 = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("kudos_device_plugin_registrations_total{result=\"error\"} ")
            })
            .and_then(|n| n.parse().ok())
            .expect("failures counted");
        // Every 200 ms would be 300; doubling to a 10 s cap is 11 or 12.
        assert!(
            (5..20).contains(&failures),
            "{failures} attempts in a minute\n{text}"
        );
    }
}
