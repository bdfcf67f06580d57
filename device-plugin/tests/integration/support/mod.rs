//! Test doubles: a kubelet stand-in (registration server + device-plugin client, behaving like
//! the kubelet's device manager), an orchestrator `RegistryService` stub, and plugin start-up.

use clap::Parser;
use kudos_device_plugin::cli::{Args, Settings};
use kudos_proto::deviceplugin::v1beta1 as api;
use kudos_proto::kudos::v1 as kapi;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

pub const WAIT: Duration = Duration::from_secs(10);

// === kubelet stand-in ===

/// What the stand-in saw.
#[derive(Debug)]
pub enum Seen {
    Registered(api::RegisterRequest, Instant),
    List(Vec<api::Device>),
}

#[derive(Clone)]
struct Registration {
    dir: PathBuf,
    tx: mpsc::UnboundedSender<Seen>,
    streams: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

#[tonic::async_trait]
impl api::registration_server::Registration for Registration {
    async fn register(
        &self,
        req: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let req = req.into_inner();
        if req.version != api::VERSION {
            return Err(Status::invalid_argument("bad version"));
        }
        let _ = self.tx.send(Seen::Registered(req.clone(), Instant::now()));
        // Like the kubelet: drop the old endpoint, then dial the new one and watch it.
        let mut streams = self.streams.lock().expect("lock");
        for s in streams.drain(..) {
            s.abort();
        }
        let socket = self.dir.join(&req.endpoint);
        let tx = self.tx.clone();
        streams.push(tokio::spawn(async move {
            let channel = match kudos_proto::unix::connect(&socket).await {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("kubelet stand-in: dialing the plugin failed: {e}");
                    return;
                }
            };
            let mut client = api::device_plugin_client::DevicePluginClient::new(channel);
            if let Err(e) = client.get_device_plugin_options(api::Empty {}).await {
                eprintln!("kubelet stand-in: GetDevicePluginOptions failed: {e}");
                return;
            }
            let stream = match client.list_and_watch(api::Empty {}).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("kubelet stand-in: ListAndWatch failed: {e}");
                    return;
                }
            };
            let mut stream = stream.into_inner();
            while let Some(Ok(list)) = stream.next().await {
                let _ = tx.send(Seen::List(list.devices));
            }
        }));
        Ok(Response::new(api::Empty {}))
    }
}

/// The kubelet's side of the device-plugin protocol.
pub struct Kubelet {
    pub dir: PathBuf,
    pub seen: mpsc::UnboundedReceiver<Seen>,
    tx: mpsc::UnboundedSender<Seen>,
    streams: Arc<Mutex<Vec<JoinHandle<()>>>>,
    stop: Option<oneshot::Sender<()>>,
}

impl Kubelet {
    /// A stand-in for `dir`, not yet listening.
    pub fn new(dir: &Path) -> Self {
        let (tx, seen) = mpsc::unbounded_channel();
        Kubelet {
            dir: dir.to_owned(),
            seen,
            tx,
            streams: Arc::default(),
            stop: None,
        }
    }

    /// Creates `kubelet.sock` and serves `Registration`.
    pub fn start(&mut self) {
        let path = self.dir.join(api::KUBELET_SOCKET);
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).expect("bind kubelet.sock");
        let svc = Registration {
            dir: self.dir.clone(),
            tx: self.tx.clone(),
            streams: self.streams.clone(),
        };
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(api::registration_server::RegistrationServer::new(svc))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                }),
        );
        self.stop = Some(stop);
    }

    /// Closes every ListAndWatch stream, as the kubelet does when it drops an endpoint.
    pub fn close_streams(&self) {
        for s in self.streams.lock().expect("lock").drain(..) {
            s.abort();
        }
    }

    /// Like a kubelet restart: stop, delete every socket in the directory, start again.
    /// Returns the instant `kubelet.sock` was re-created.
    pub async fn restart(&mut self) -> Instant {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.close_streams();
        for e in std::fs::read_dir(&self.dir).expect("read dir").flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.start();
        Instant::now()
    }

    /// Waits for the next registration, skipping lists.
    pub async fn registration(&mut self) -> (api::RegisterRequest, Instant) {
        loop {
            match tokio::time::timeout(WAIT, self.seen.recv())
                .await
                .expect("registration in time")
                .expect("open")
            {
                Seen::Registered(r, at) => return (r, at),
                Seen::List(_) => continue,
            }
        }
    }

    /// Waits for a device list satisfying `pred`.
    pub async fn list_where(&mut self, pred: impl Fn(&[api::Device]) -> bool) -> Vec<api::Device> {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.seen.recv())
                .await
                .expect("list in time")
                .expect("open")
            {
                Seen::List(l) if pred(&l) => return l,
                _ => continue,
            }
        }
    }

    /// Asserts nothing is registered for `d`.
    pub async fn no_registration_for(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        while let Ok(Some(ev)) = tokio::time::timeout(
            deadline.saturating_duration_since(Instant::now()),
            self.seen.recv(),
        )
        .await
        {
            if let Seen::Registered(r, _) = ev {
                panic!("unexpected registration {r:?}");
            }
        }
    }
}

pub fn healthy(l: &[api::Device]) -> usize {
    l.iter().filter(|d| d.health == api::HEALTHY).count()
}

/// A client of the plugin's socket, as the kubelet uses for Allocate.
pub async fn plugin_client(
    dir: &Path,
    socket: &str,
) -> api::device_plugin_client::DevicePluginClient<tonic::transport::Channel> {
    let channel = kudos_proto::unix::connect(&dir.join(socket))
        .await
        .expect("connect plugin");
    api::device_plugin_client::DevicePluginClient::new(channel)
}

// === plugin ===

pub struct Plugin {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Plugin {
    /// Starts the plugin in-process with these flags (plus a metrics-off default).
    pub fn start(flags: &[String]) -> Plugin {
        if let Ok(filter) = std::env::var("KUDOS_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_test_writer()
                .try_init();
        }
        let mut argv = vec![
            "kudos-device-plugin".to_string(),
            "--metrics-addr=off".into(),
            "--node-name=node-a".into(),
        ];
        argv.extend(flags.iter().cloned());
        let settings =
            Settings::try_from(Args::try_parse_from(argv).expect("flags")).expect("settings");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(kudos_device_plugin::run(settings, async {
            let _ = stopped.await;
        }));
        Plugin {
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            tokio::time::timeout(WAIT, t)
                .await
                .expect("stops in time")
                .expect("no panic")
                .expect("clean exit");
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Common flags for a plugin in `dir` with NVML from `lib`.
pub fn flags(dir: &Path, lib: &Path, cache: &Path) -> Vec<String> {
    vec![
        format!("--device-plugin-dir={}", dir.display()),
        format!("--nvml-library={}", lib.display()),
        format!("--name-cache={}", cache.display()),
        "--backends=nvidia".into(),
        "--probe-interval-seconds=0.1".into(),
        "--recovery-quiet-seconds=0.5".into(),
    ]
}

// === orchestrator stub ===

/// One `ReportPlugin` call and its `authorization` header.
pub type Call = (kapi::ReportPluginRequest, Option<String>);

#[derive(Clone, Default)]
pub struct Registry {
    pub name: Arc<Mutex<String>>,
    /// `ReportPluginResponse.allocation_api` ("" by default, as an orchestrator before DRA).
    pub allocation_api: Arc<Mutex<String>>,
    pub calls: Arc<Mutex<Vec<Call>>>,
}

impl Registry {
    /// A registry that hands out `name` as the unified resource name.
    pub fn named(name: &str) -> Self {
        let r = Registry::default();
        *r.name.lock().expect("lock") = name.into();
        r
    }
}

#[tonic::async_trait]
impl kapi::registry_service_server::RegistryService for Registry {
    async fn report_plugin(
        &self,
        req: Request<kapi::ReportPluginRequest>,
    ) -> Result<Response<kapi::ReportPluginResponse>, Status> {
        let auth = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.calls
            .lock()
            .expect("lock")
            .push((req.into_inner(), auth));
        let name = self.name.lock().expect("lock").clone();
        let allocation_api = self.allocation_api.lock().expect("lock").clone();
        let dra_driver = if allocation_api == "dra" {
            kudos_api::dra::DRIVER.to_string()
        } else {
            String::new()
        };
        Ok(Response::new(kapi::ReportPluginResponse {
            unified_resource_name: name,
            generation: 7,
            allocation_api,
            dra_driver,
        }))
    }
}

/// Serves the stub on `addr` (127.0.0.1:port).
/// Serves `reg` on a fresh loopback port; returns its `http://` address and the server task.
pub async fn serve_registry_on_loopback(reg: Registry) -> (String, JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = format!("http://{}", listener.local_addr().expect("addr"));
    (addr, serve_registry(reg, listener).await)
}

pub async fn serve_registry(reg: Registry, listener: tokio::net::TcpListener) -> JoinHandle<()> {
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(kapi::registry_service_server::RegistryServiceServer::new(
                reg,
            ))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
    })
}
