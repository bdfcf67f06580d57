//! Child processes with their logs in the run directory, stopped by PID.

use anyhow::{Context, Result};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A running child process. Dropping it stops it (SIGTERM, SIGKILL after the stop timeout).
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    stop_timeout: Duration,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Self> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("open {}", log.display()))?;
        let f2 = f.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(f).stderr(f2);
        let child = cmd
            .spawn()
            .with_context(|| format!("start {name}: {cmd:?}"))?;
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
            stop_timeout: Duration::from_secs(10),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sets how long [`Proc::stop`] waits after SIGTERM before SIGKILL.
    pub fn with_stop_timeout(mut self, d: Duration) -> Self {
        self.stop_timeout = d;
        self
    }

    /// Fails with the log's tail when the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(c) = self.child.as_mut()
            && let Some(st) = c.try_wait()?
        {
            anyhow::bail!(
                "{} exited ({st}); log {}:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 30)
            );
        }
        Ok(())
    }

    /// Polls `ready` every 50 ms until it returns `Some` (the process is up). Fails as soon as
    /// the process exits, or after `timeout`, with the log's tail.
    pub async fn wait_ready<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut ready: impl AsyncFnMut() -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = ready().await {
                return Ok(v);
            }
            self.check_running()?;
            if Instant::now() > deadline {
                anyhow::bail!(
                    "{}: timed out after {timeout:?} waiting for {what}; log {}:\n{}",
                    self.name,
                    self.log.display(),
                    tail(&self.log, 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends a signal by PID (via `kill(1)`).
    pub fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([format!("-{sig}"), c.id().to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }

    /// SIGKILL now (to the process, a crash) and reap it. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, wait up to the stop timeout, then SIGKILL. Idempotent. Returns how the process
    /// ended when it exited by itself or on SIGTERM; `None` when it had to be killed or was
    /// stopped before.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        if let Ok(Some(st)) = c.try_wait() {
            return Some(st);
        }
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + self.stop_timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `n` lines of a file, for error messages.
pub fn tail(path: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A free TCP port on 127.0.0.1 (bound and released; a small race is possible).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// Polls `f` every `every` until it returns `Some`, or fails after `timeout` with `what`.
/// `f` is an async closure (`async || ...`, which may borrow), or a closure returning a future.
pub async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

/// A `kB` field of `/proc/<pid>/status` (`"VmRSS:"`, `"VmHWM:"`), in KiB; `None` when the
/// process or the field is gone.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// CPU seconds (user + system) a live process has used so far, from `/proc/<pid>/stat`
/// (assumes the usual 100 clock ticks per second).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let (ut, st): (f64, f64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    Some((ut + st) / 100.0)
}
