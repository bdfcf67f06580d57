//! Where binaries, shared data and run directories are.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The repository root (the workspace root).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit has a parent")
        .to_path_buf()
}

/// `e2e/_out/bin`, where `e2e/build` puts the upstream binaries and `kubelet-dm`.
pub fn upstream_bin_dir() -> PathBuf {
    std::env::var_os("KUDOS_E2E_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("e2e/_out/bin"))
}

/// Where the Kudos binaries are: `$KUDOS_BIN_DIR`, else `$CARGO_TARGET_DIR/debug`, else
/// `target/debug`.
pub fn kudos_bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KUDOS_BIN_DIR") {
        return PathBuf::from(d);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    target.join("debug")
}

/// Path of an upstream binary (`etcd`, `kube-apiserver`, `kube-scheduler`, `kubelet-dm`).
pub fn upstream_bin(name: &str) -> PathBuf {
    upstream_bin_dir().join(name)
}

/// Path of a Kudos binary (`kudos-orchestrator`, ...).
pub fn kudos_bin(name: &str) -> PathBuf {
    kudos_bin_dir().join(name)
}

/// A system tool (`openssl`, `docker-registry`, `skopeo`, Debian packages) found on `$PATH`;
/// `/usr/bin/<name>` when it is nowhere, so [`require_bins`] names it as missing.
pub fn system_bin(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|b| b.is_file())
        })
        .unwrap_or_else(|| Path::new("/usr/bin").join(name))
}

/// The shared data directory (`../shared/data` beside the repository, or `$KUDOS_DATA_DIR`).
pub fn shared_data_dir() -> PathBuf {
    std::env::var_os("KUDOS_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared/data"))
}

/// True when every binary exists. Otherwise prints `SKIP: <test>: missing ...` and returns
/// false, or panics when `KUDOS_E2E_REQUIRE=1`.
pub fn require_bins(test: &str, bins: &[PathBuf]) -> bool {
    let missing: Vec<_> = bins.iter().filter(|b| !b.is_file()).collect();
    if missing.is_empty() {
        return true;
    }
    let msg = format!(
        "{test}: missing {} (run `e2e/build` for the upstream binaries, `cargo build -p <crate>` for Kudos ones, `apt-get install docker-registry skopeo openssl` for the system ones)",
        missing
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if std::env::var("KUDOS_E2E_REQUIRE").as_deref() == Ok("1") {
        panic!("{msg}");
    }
    eprintln!("SKIP: {msg}");
    false
}

/// A run directory `e2e/_work/<name>-<time>-<pid>` holding logs, certificates and data. It is
/// removed when dropped after [`RunDir::pass`] was called; kept (and its log paths printed)
/// otherwise (a failed assertion, an error returned, a panic) or when `KUDOS_E2E_KEEP=1`.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    passed: std::cell::Cell<bool>,
}

impl RunDir {
    /// Creates a fresh run directory.
    pub fn new(name: &str) -> std::io::Result<Self> {
        let base = std::env::var_os("KUDOS_E2E_WORK_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join("e2e/_work"));
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let path = base.join(format!("{name}-{}-{}", t.as_millis(), std::process::id()));
        std::fs::create_dir_all(&path)?;
        Ok(Self {
            path,
            passed: std::cell::Cell::new(false),
        })
    }

    /// For a test: [`require_bins`], then a fresh run directory named `test`; `None` when a
    /// binary is missing (the test returns, having printed `SKIP:`).
    pub fn for_test(test: &str, bins: &[PathBuf]) -> std::io::Result<Option<Self>> {
        if !require_bins(test, bins) {
            return Ok(None);
        }
        Self::new(test).map(Some)
    }

    /// Marks the run successful: the directory is removed on drop (unless `KUDOS_E2E_KEEP=1`).
    pub fn pass(&self) {
        self.passed.set(true);
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path inside the directory.
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.path.join(p)
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.passed.get()
            || std::thread::panicking()
            || std::env::var("KUDOS_E2E_KEEP").as_deref() == Ok("1")
        {
            eprintln!("e2e: logs and state kept in {}", self.path.display());
            if let Ok(rd) = std::fs::read_dir(&self.path) {
                for e in rd.flatten() {
                    if e.path().extension().is_some_and(|x| x == "log") {
                        eprintln!("e2e:   {}", e.path().display());
                    }
                }
            }
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
