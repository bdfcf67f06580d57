//! A side-by-side of `kudos-device-plugin` and the upstream sample device plugin
//! (`k8s.io/kubernetes/test/images/sample-device-plugin`, built by `e2e/build`), each registered
//! with its own `kubelet-dm` (the kubelet's real device manager): Allocate latency, time to
//! re-register after a kubelet restart, and resident memory. Used by the
//! `kudos-e2e-plugin-side-by-side` figures and by the `plugin_side_by_side` test, which runs a
//! short form and fails when Kudos is over twice as slow or as large as the sample plugin
//! measured in the same run.
//!
//! Both plugins run at the same time, each under its own kubelet-dm, and are measured in
//! alternation (Allocate in blocks, restarts one after the other), so a change in the machine's
//! load during the run shows in both columns rather than in the ratio.
//!
//! What is measured:
//! - **Allocate**: sequential calls over one connection to the plugin's Unix socket, one device
//!   per call, after a warm-up. The kubelet's device manager is the normal caller; dialing the
//!   same socket measures the plugin (and the gRPC round trip), not the kubelet's admission path.
//! - **re-registration**: from the `POST /restart` to kubelet-dm (stop the device manager, delete
//!   the sockets, start a new registration server, as a restarting kubelet does) until the new
//!   device manager reports the plugin's full capacity again (registration and the first
//!   ListAndWatch answer). The restart call itself is the same kubelet code for both plugins and
//!   is also reported alone.
//! - **RSS**: `VmRSS` of the plugin process once registered and idle (after a settling pause),
//!   after the Allocate loop and after the restarts; `VmHWM` (peak) at the end.

use crate::RunDir;
use crate::kubelet::{Capacity, KubeletDm};
use crate::paths::{kudos_bin, repo_root, upstream_bin};
use crate::proc::{free_port, status_kib, tail};
use anyhow::{Context, Result, bail};
use kudos_nvml::fake::FakeNvml;
use kudos_proto::deviceplugin::v1beta1 as api;
use serde_json::{Value, json};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod report;
pub use report::{Comparison, Figures, Ratio, Summary};

/// The resource the sample plugin registers (fixed in its source).
pub const SAMPLE_RESOURCE: &str = "example.com/resource";
/// The devices the sample plugin lists (fixed in its source: `Dev-1`, `Dev-2`).
pub const SAMPLE_DEVICES: usize = 2;
/// The resource Kudos registers without an orchestrator (its default).
pub const KUDOS_RESOURCE: &str = "kudos.dev/gpu";

/// The regression gate: Kudos may be at most this many times the sample plugin on each gated
/// figure ([`Comparison::ratios`]) measured in the same run.
pub const GATE_FACTOR: f64 = 2.0;

/// How long a first registration or a re-registration may take. The sample plugin waits 10 s
/// (the poll interval of its `Watch`) before it restarts its server after a kubelet restart.
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(5);
/// Allocate calls per plugin before switching to the other one.
const BLOCK: usize = 50;

/// One of the two plugins compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// `kudos-device-plugin` with fake NVML GPUs, as the chart runs it without an orchestrator.
    Kudos,
    /// The upstream sample device plugin, unmodified, with its defaults.
    Sample,
}

impl Subject {
    /// Both, in the order they are started and reported.
    pub const ALL: [Subject; 2] = [Subject::Kudos, Subject::Sample];

    /// The binary's name.
    pub fn label(self) -> &'static str {
        match self {
            Subject::Kudos => "kudos-device-plugin",
            Subject::Sample => "sample-device-plugin",
        }
    }

    /// Where the binary is. Kudos: `$KUDOS_BIN_DIR/kudos-device-plugin`, else the **release**
    /// build (`$CARGO_TARGET_DIR` or `target`, then `release/`): what ships is compared, and a
    /// debug build's Allocate runs near twice the sample plugin's on its own. The sample:
    /// `e2e/_out/bin` (`$KUDOS_E2E_BIN_DIR`).
    pub fn binary(self) -> PathBuf {
        match self {
            Subject::Kudos if std::env::var_os("KUDOS_BIN_DIR").is_some() => {
                kudos_bin("kudos-device-plugin")
            }
            Subject::Kudos => std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| repo_root().join("target"))
                .join("release/kudos-device-plugin"),
            Subject::Sample => upstream_bin("sample-device-plugin"),
        }
    }

    /// How the binary is described in output: its path and how long ago it was built (a stale
    /// release build measures old code).
    pub fn describe(self) -> String {
        let b = self.binary();
        let age = std::fs::metadata(&b)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .map(|d| format!(" (built {} min ago)", d.as_secs() / 60))
            .unwrap_or_default();
        format!("{}{age}", b.display())
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Measured Allocate calls per plugin.
    pub allocations: usize,
    /// Unmeasured Allocate calls per plugin before those.
    pub warmup: usize,
    /// Kubelet restarts per plugin.
    pub restarts: usize,
    /// Fake GPUs given to Kudos.
    pub gpus: u32,
    /// Idle time after both plugins registered, before the steady RSS is read.
    pub settle: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            allocations: 2000,
            warmup: 100,
            restarts: 5,
            gpus: 8,
            settle: Duration::from_secs(2),
        }
    }
}

/// A plugin running under its own kubelet-dm.
struct Running {
    subject: Subject,
    binary: PathBuf,
    dm: KubeletDm,
    pid: u32,
    log: PathBuf,
    resource: String,
    want: usize,
    ids: Vec<String>,
    client: api::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
    first_registration: Duration,
    _link: ShortLink,
    // Keeps the fake NVML instance (its library copy and configuration) for the run.
    _fake: Option<FakeNvml>,
}

impl Running {
    /// Starts kubelet-dm and the plugin inside its namespace (the plugin sees the default
    /// `/var/lib/kubelet/device-plugins`, as a DaemonSet pod with that hostPath), waits for the
    /// kubelet to report the plugin's capacity and connects to the plugin's socket.
    async fn start(subject: Subject, opts: &Options, run: &RunDir) -> Result<Self> {
        let label = subject.label();
        let binary = subject.binary();
        let root = run.join(label);
        std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
        let dm = KubeletDm::start(
            &root.join("kubelet"),
            &run.join(format!("{label}-kubelet-dm.log")),
        )
        .await
        .with_context(|| format!("start kubelet-dm for {label}"))?;
        let mut argv = vec![binary.display().to_string()];
        let mut env: Vec<(&str, String)> = Vec::new();
        let (resource, want, fake) = match subject {
            Subject::Kudos => {
                let nvml = root.join("nvml");
                std::fs::create_dir_all(&nvml)?;
                let fake = FakeNvml::new(&nvml, opts.gpus).context("fake NVML")?;
                argv.extend([
                    "--node-name=bench-node".to_string(),
                    "--backends=nvidia".into(),
                    format!("--nvml-library={}", fake.library().display()),
                    format!("--name-cache={}", root.join("name-cache").display()),
                    format!("--metrics-addr=127.0.0.1:{}", free_port()),
                ]);
                // Its default log level (info), as shipped.
                env.push(("KUDOS_LOG", "info".into()));
                (KUDOS_RESOURCE, opts.gpus as usize, Some(fake))
            }
            // No configuration: PLUGIN_SOCK_DIR, CDI_ENABLED and REGISTER_CONTROL_FILE unset
            // (the default directory, no CDI file, registers on its own); klog at its default.
            Subject::Sample => (SAMPLE_RESOURCE, SAMPLE_DEVICES, None),
        };
        let log = run.join(format!("{label}.log"));
        let started = Instant::now();
        let pid = dm
            .spawn(&argv, &env, &log)
            .with_context(|| format!("start {label}"))?;
        let c = PartialRun {
            label,
            pid,
            log: &log,
        }
        .wait_capacity(&dm, resource, want, None, "its first registration")
        .await?;
        let first_registration = started.elapsed();
        let mut ids: Vec<String> = c
            .devices
            .get(resource)
            .map(|d| d.keys().cloned().collect())
            .unwrap_or_default();
        ids.sort();
        if ids.is_empty() {
            bail!("{label}: the kubelet lists no allocatable {resource} device");
        }
        let socket = plugin_socket(&dm.device_plugin_dir())?;
        let link = ShortLink::new(&dm.device_plugin_dir(), label)?;
        let client = connect(&link.path.join(socket.file_name().unwrap_or_default()))
            .await
            .with_context(|| format!("connect {}", socket.display()))?;
        Ok(Self {
            subject,
            binary,
            dm,
            pid,
            log,
            resource: resource.to_string(),
            want,
            ids,
            client,
            first_registration,
            _link: link,
            _fake: fake,
        })
    }

    fn partial(&self) -> PartialRun<'_> {
        PartialRun {
            label: self.subject.label(),
            pid: self.pid,
            log: &self.log,
        }
    }

    /// One Allocate call of one device (the `k`-th, round robin); its round-trip time.
    async fn allocate(&mut self, k: usize) -> Result<Duration> {
        let id = self.ids[k % self.ids.len()].clone();
        let req = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![id.clone()],
            }],
        };
        let t = Instant::now();
        let r = self.client.allocate(req).await;
        let took = t.elapsed();
        let r = r.with_context(|| format!("{}: Allocate {id}", self.subject.label()))?;
        if r.get_ref().container_responses.len() != 1 {
            bail!(
                "{}: Allocate {id} answered {} container responses, not 1",
                self.subject.label(),
                r.get_ref().container_responses.len()
            );
        }
        Ok(took)
    }

    /// Restarts the kubelet side and waits for the full capacity under the new device manager.
    /// Returns (restart request → capacity, the restart call alone).
    async fn restart_kubelet(&mut self) -> Result<(Duration, Duration)> {
        let t = Instant::now();
        let generation = self
            .dm
            .restart()
            .with_context(|| format!("restart {}'s kubelet", self.subject.label()))?;
        let call = t.elapsed();
        self.partial()
            .wait_capacity(
                &self.dm,
                &self.resource,
                self.want,
                Some(generation),
                "its re-registration after a kubelet restart",
            )
            .await?;
        Ok((t.elapsed(), call))
    }

    fn rss(&self) -> Result<u64> {
        status_kib(self.pid, "VmRSS:")
            .map(|k| k * 1024)
            .with_context(|| format!("VmRSS of {} (pid {})", self.subject.label(), self.pid))
    }

    fn peak(&self) -> Result<u64> {
        status_kib(self.pid, "VmHWM:")
            .map(|k| k * 1024)
            .with_context(|| format!("VmHWM of {} (pid {})", self.subject.label(), self.pid))
    }

    /// Stops the plugin (SIGTERM) and then kubelet-dm. The sample plugin's Allocate creates an
    /// empty "fake device file" `/tmp/<device id>` (the host's `/tmp`: kubelet-dm's namespace
    /// only has its own `/var/lib/kubelet`); those are removed.
    async fn stop(mut self) -> Result<()> {
        self.dm.kill(self.pid, 15)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(self.pid) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if self.subject == Subject::Sample {
            for id in &self.ids {
                let f = Path::new("/tmp").join(id);
                if std::fs::metadata(&f).is_ok_and(|m| m.is_file() && m.len() == 0) {
                    let _ = std::fs::remove_file(&f);
                }
            }
        }
        self.dm.check_running()
    }
}

/// What error messages need about a plugin that may not be fully started.
struct PartialRun<'a> {
    label: &'static str,
    pid: u32,
    log: &'a Path,
}

impl PartialRun<'_> {
    /// Polls kubelet-dm until it reports `want` devices of `resource`, all allocatable (under
    /// manager `generation` when given). Fails at once when the plugin exits.
    async fn wait_capacity(
        &self,
        dm: &KubeletDm,
        resource: &str,
        want: usize,
        generation: Option<u64>,
        what: &str,
    ) -> Result<Capacity> {
        let deadline = Instant::now() + REGISTRATION_TIMEOUT;
        let want = want as i64;
        loop {
            if let Ok(c) = dm.capacity()
                && generation.is_none_or(|g| c.generation == g)
                && c.capacity.get(resource) == Some(&want)
                && c.allocatable.get(resource) == Some(&want)
            {
                return Ok(c);
            }
            if !alive(self.pid) {
                bail!(
                    "{} (pid {}) exited while waiting for {what}; log {}:\n{}",
                    self.label,
                    self.pid,
                    self.log.display(),
                    tail(self.log, 30)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{}: timed out after {REGISTRATION_TIMEOUT:?} waiting for {what} ({want} × {resource}); log {}:\n{}",
                    self.label,
                    self.log.display(),
                    tail(self.log, 30)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// True while `pid` runs (kubelet-dm reaps its children, so an exited plugin disappears).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            // State is the field after the parenthesized command name.
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|st| st != "Z" && st != "X")
        })
        .unwrap_or(false)
}

/// The one plugin socket in the device-plugin directory (every socket but `kubelet.sock`; the
/// sample plugin names its socket `dp.<unix time>`, Kudos `kudos.sock`).
pub fn plugin_socket(dir: &Path) -> Result<PathBuf> {
    let mut socks = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let e = e?;
        if e.file_type()?.is_socket() && e.file_name() != api::KUBELET_SOCKET {
            socks.push(e.path());
        }
    }
    match socks.len() {
        1 => Ok(socks.remove(0)),
        0 => bail!("no plugin socket in {}", dir.display()),
        _ => bail!("several plugin sockets in {}: {socks:?}", dir.display()),
    }
}

/// A symbolic link with a short path to a device-plugin directory, removed on drop: a Unix
/// socket path must be shorter than 108 bytes, and one in a run directory under the repository
/// easily is not.
struct ShortLink {
    path: PathBuf,
}

impl ShortLink {
    fn new(dir: &Path, label: &str) -> Result<Self> {
        let path = std::env::temp_dir().join(format!("kudos-sbs-{}-{label}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(dir, &path)
            .with_context(|| format!("link {} to {}", path.display(), dir.display()))?;
        Ok(Self { path })
    }
}

impl Drop for ShortLink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A device-plugin client over the Unix socket `path`, one HTTP/2 connection, as the kubelet
/// keeps.
async fn connect(
    path: &Path,
) -> Result<api::device_plugin_client::DevicePluginClient<tonic::transport::Channel>> {
    let channel = kudos_proto::unix::connect(path)
        .await
        .with_context(|| format!("connect {}", path.display()))?;
    Ok(api::device_plugin_client::DevicePluginClient::new(channel))
}

/// Runs both plugins and measures them (see the module documentation). Logs go to `run`.
/// `progress` gets one line per phase.
pub async fn compare(
    opts: &Options,
    run: &RunDir,
    mut progress: impl FnMut(&str),
) -> Result<Comparison> {
    if opts.allocations == 0 || opts.restarts == 0 || opts.gpus == 0 {
        bail!("allocations, restarts and GPUs must each be at least 1");
    }
    let mut plugins = Vec::new();
    for s in Subject::ALL {
        progress(&format!("starting {} under its own kubelet-dm", s.label()));
        plugins.push(Running::start(s, opts, run).await?);
    }
    tokio::time::sleep(opts.settle).await;
    let mut steady = Vec::new();
    for p in &plugins {
        steady.push(p.rss()?);
    }

    progress(&format!(
        "Allocate: {} warm-up + {} measured calls per plugin, one device each, alternating blocks of {BLOCK}",
        opts.warmup, opts.allocations
    ));
    let mut lat: Vec<Vec<Duration>> = vec![Vec::with_capacity(opts.allocations); plugins.len()];
    let total = opts.warmup + opts.allocations;
    let mut k = 0;
    while k < total {
        let end = (k + BLOCK).min(total);
        for (p, l) in plugins.iter_mut().zip(lat.iter_mut()) {
            for i in k..end {
                let took = p.allocate(i).await?;
                if i >= opts.warmup {
                    l.push(took);
                }
            }
        }
        k = end;
    }
    let mut after_alloc = Vec::new();
    for p in &plugins {
        after_alloc.push(p.rss()?);
    }

    progress(&format!(
        "kubelet restarts: {} per plugin, alternating (the sample plugin waits 10 s before it restarts its server)",
        opts.restarts
    ));
    let mut rereg: Vec<Vec<Duration>> = vec![Vec::new(); plugins.len()];
    let mut calls: Vec<Vec<Duration>> = vec![Vec::new(); plugins.len()];
    for _ in 0..opts.restarts {
        for (i, p) in plugins.iter_mut().enumerate() {
            let (total, call) = p.restart_kubelet().await?;
            rereg[i].push(total);
            calls[i].push(call);
        }
    }

    let mut figures = Vec::new();
    for (i, p) in plugins.into_iter().enumerate() {
        let f = Figures {
            subject: p.subject,
            binary: p.binary.clone(),
            resource: p.resource.clone(),
            devices: p.want,
            first_registration: p.first_registration.as_secs_f64(),
            allocate: Summary::of(std::mem::take(&mut lat[i])),
            reregistration: Summary::of(std::mem::take(&mut rereg[i])),
            restart_call: Summary::of(std::mem::take(&mut calls[i])),
            rss_steady: steady[i],
            rss_after_allocate: after_alloc[i],
            rss_after_restarts: p.rss()?,
            rss_peak: p.peak()?,
        };
        p.stop().await?;
        figures.push(f);
    }
    let sample = figures.pop().context("sample figures")?;
    let kudos = figures.pop().context("kudos figures")?;
    Ok(Comparison { kudos, sample })
}

/// The machine's conditions for the record: CPUs and load averages (1, 5, 15 min).
pub fn machine() -> Value {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let load: Vec<f64> = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|v| v.parse().ok())
        .collect();
    json!({"cpus": cpus, "loadavg": load})
}
