//! What a real-node run may touch on the host, how to put it back, and how to check that it was.
//!
//! Every process the harness starts carries [`MARKER_ENV`] in its environment (containerd's shims
//! inherit it), so [`cleanup`] finds the leftovers of a run that was killed without pid files.
//! Container processes do not inherit it; they live in the `realnode-*` cgroups, which cleanup
//! empties and removes. The per-node mounts are private to each node's mount namespace and go
//! away with its last process; the host keeps only the empty mount-point directories, which
//! cleanup removes.

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Environment variable set on every process the harness starts.
pub const MARKER_ENV: &str = "KUDOS_REALNODE_RUN";
/// Prefix of the per-node cgroup roots (`/realnode-a` in every v1 hierarchy) and bridge names.
pub const CGROUP_PREFIX: &str = "realnode-";
/// Prefix of the per-node CNI bridges.
pub const BRIDGE_PREFIX: &str = "rn-";
/// Host directories each node's namespace bind-mounts its own directory over (the kubelet,
/// containerd, CNI and the shipped manifests' hostPaths hard-code them).
pub const PRIVATE_DIRS: &[&str] = &[
    "/var/lib/kubelet",
    "/var/log/containers",
    "/run/containerd",
    "/var/lib/cni",
    "/var/lib/kudos",
    // CDI specs (`/var/run/cdi`, through the /var/run symlink): a DRA plugin writes one per
    // prepared claim, and its node's containerd applies them.
    "/run/cdi",
];
/// The `/proc/sys` files the kubelet checks at start (and writes when they differ), with the
/// values it wants; each node's namespace shadows them with files holding these values.
pub const KUBELET_SYSCTLS: &[(&str, &str)] = &[
    ("vm/overcommit_memory", "1"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];
/// Host paths a container runtime, CNI or the kubelet would create by default; none may appear.
const WATCHED_PATHS: &[&str] = &[
    "/opt/containerd",
    "/run/nri",
    "/var/run/cdi",
    "/etc/cni",
    "/var/lib/containerd",
    "/run/netns",
    "/var/log/pods",
    "/etc/kubernetes",
    "/var/run/kubernetes",
];
/// Further host sysctls a container runtime or CNI plugin might change.
const WATCHED_SYSCTLS: &[&str] = &["net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"];

/// The parts of host state a real-node run must leave as it found them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSnapshot {
    /// `/proc/sys` path → value (absent files omitted).
    pub sysctls: BTreeMap<String, String>,
    /// `nft list ruleset` (empty when nft is missing).
    pub nft_ruleset: String,
    /// `realnode-*` cgroup directories.
    pub cgroups: Vec<PathBuf>,
    /// `rn-*` network links.
    pub bridges: Vec<String>,
    /// Which [`PRIVATE_DIRS`] and default runtime paths exist.
    pub private_dirs: Vec<String>,
    /// Host mounts under the private directories.
    pub mounts: Vec<String>,
    /// Processes carrying [`MARKER_ENV`].
    pub processes: Vec<u32>,
}

impl HostSnapshot {
    /// Reads the current host state.
    pub fn capture() -> Self {
        let mut sysctls = BTreeMap::new();
        for k in KUBELET_SYSCTLS
            .iter()
            .map(|(k, _)| *k)
            .chain(WATCHED_SYSCTLS.iter().copied())
        {
            if let Ok(v) = std::fs::read_to_string(Path::new("/proc/sys").join(k)) {
                sysctls.insert(k.to_string(), v.trim().to_string());
            }
        }
        let nft_ruleset = Command::new("nft")
            .args(["list", "ruleset"])
            .stderr(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
            .filter(|m| PRIVATE_DIRS.iter().any(|d| m.starts_with(d)))
            .collect();
        Self {
            sysctls,
            nft_ruleset,
            cgroups: realnode_cgroups(),
            bridges: realnode_links(),
            private_dirs: PRIVATE_DIRS
                .iter()
                .chain(WATCHED_PATHS)
                .filter(|d| Path::new(d).exists())
                .map(|d| d.to_string())
                .collect(),
            mounts,
            processes: marked_processes(),
        }
    }

    /// Differences from `before`, one line each (empty when the host is as it was).
    pub fn diff(&self, before: &HostSnapshot) -> Vec<String> {
        let mut d = Vec::new();
        for (k, v) in &before.sysctls {
            let now = self.sysctls.get(k);
            if now != Some(v) {
                d.push(format!("sysctl {k}: was {v}, now {now:?}"));
            }
        }
        if self.nft_ruleset != before.nft_ruleset {
            d.push(format!(
                "nft ruleset changed:\n--- before\n{}\n--- after\n{}",
                before.nft_ruleset, self.nft_ruleset
            ));
        }
        let extra = |what: &str, now: &[String], was: &[String], d: &mut Vec<String>| {
            for x in now.iter().filter(|x| !was.contains(x)) {
                d.push(format!("{what} left behind: {x}"));
            }
        };
        let cg =
            |v: &[PathBuf]| -> Vec<String> { v.iter().map(|p| p.display().to_string()).collect() };
        extra("cgroup", &cg(&self.cgroups), &cg(&before.cgroups), &mut d);
        extra("link", &self.bridges, &before.bridges, &mut d);
        extra(
            "directory",
            &self.private_dirs,
            &before.private_dirs,
            &mut d,
        );
        extra("mount", &self.mounts, &before.mounts, &mut d);
        for p in self
            .processes
            .iter()
            .filter(|p| !before.processes.contains(p))
        {
            d.push(format!("process left running: {p}"));
        }
        d
    }
}

/// Every `realnode-*` directory directly under a v1 cgroup hierarchy.
pub fn realnode_cgroups() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(hier) = std::fs::read_dir("/sys/fs/cgroup") else {
        return out;
    };
    for h in hier.flatten() {
        if let Ok(rd) = std::fs::read_dir(h.path()) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(CGROUP_PREFIX) && e.path().is_dir() {
                    out.push(e.path());
                }
            }
        }
    }
    out.sort();
    out
}

/// Names of the network links the harness creates (`rn-*`).
pub fn realnode_links() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(BRIDGE_PREFIX))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// PIDs of live processes whose environment carries [`MARKER_ENV`].
pub fn marked_processes() -> Vec<u32> {
    let me = std::process::id();
    let needle = format!("{MARKER_ENV}=");
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if env
            .split(|b| *b == 0)
            .any(|kv| kv.starts_with(needle.as_bytes()))
        {
            out.push(pid);
        }
    }
    out
}

fn kill(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn alive(pid: u32) -> bool {
    // A zombie still has /proc/<pid>; its state letter is Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .map(|zombie| !zombie)
        .unwrap_or(false)
}

/// SIGKILLs `pids` and waits (bounded) until they are gone.
pub fn kill_and_wait(pids: &[u32]) {
    for p in pids {
        kill(*p, "KILL");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Empties and removes a cgroup tree, deepest first.
fn remove_cgroup_tree(root: &Path) {
    let mut dirs = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            stack.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
        dirs.push(d);
    }
    for _ in 0..50 {
        let pids: Vec<u32> = dirs
            .iter()
            .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|s| {
                s.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect();
        if pids.is_empty() {
            break;
        }
        kill_and_wait(&pids);
    }
    // Deepest first: a parent is removable only once its children are gone.
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in &dirs {
        let _ = std::fs::remove_dir(d);
    }
}

/// Removes every leftover of a real-node run, whether it ended cleanly or was killed: marked
/// processes, container processes and `realnode-*` cgroups, `rn-*` links, the empty mount-point
/// directories, and CNI results cached under the host's `/var/lib/cni`. Idempotent; safe to run
/// when nothing is left.
pub fn cleanup() -> Result<()> {
    let procs = marked_processes();
    if !procs.is_empty() {
        eprintln!("realnode cleanup: killing leftover processes {procs:?}");
        kill_and_wait(&procs);
    }
    for cg in realnode_cgroups() {
        remove_cgroup_tree(&cg);
    }
    for link in realnode_links() {
        let _ = Command::new("ip")
            .args(["link", "del", &link])
            .stderr(Stdio::null())
            .status();
    }
    let in_use = mount_points_in_other_namespaces();
    for d in PRIVATE_DIRS.iter().rev() {
        // Only empty mount points go (rmdir refuses anything with content), and none that a
        // live namespace still mounts over (e.g. a kubelet-dm test running beside us): removing
        // those would detach the other namespace's mount.
        if !in_use.iter().any(|m| m == d) {
            let _ = std::fs::remove_dir(d);
        }
    }
    let left = realnode_cgroups();
    if !left.is_empty() {
        anyhow::bail!("realnode cleanup: cgroups still present: {left:?}");
    }
    let left = marked_processes();
    if !left.is_empty() {
        anyhow::bail!("realnode cleanup: processes still running: {left:?}");
    }
    Ok(())
}

/// Mount points of every mount namespace other than ours (one process read per namespace).
fn mount_points_in_other_namespaces() -> Vec<String> {
    let mine = std::fs::read_link("/proc/self/ns/mnt").ok();
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        if !e
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(ns) = std::fs::read_link(e.path().join("ns/mnt")) else {
            continue;
        };
        if Some(&ns) == mine.as_ref() || !seen.insert(ns) {
            continue;
        }
        if let Ok(mi) = std::fs::read_to_string(e.path().join("mountinfo")) {
            out.extend(
                mi.lines()
                    .filter_map(|l| l.split(' ').nth(4).map(str::to_string)),
            );
        }
    }
    out
}

/// Creates the cgroup root `/<name>` in every v1 hierarchy (the kubelet requires its
/// `cgroupRoot` to exist), with the parent's cpus and mems for cpuset.
pub fn create_cgroup_root(name: &str) -> Result<()> {
    let rd = std::fs::read_dir("/sys/fs/cgroup").context("read /sys/fs/cgroup")?;
    for h in rd.flatten() {
        let p = h.path();
        if h.file_name() == "unified" || !p.join("cgroup.procs").exists() {
            continue;
        }
        let d = p.join(name);
        std::fs::create_dir_all(&d).with_context(|| format!("mkdir {}", d.display()))?;
        if h.file_name() == "cpuset" {
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let v = std::fs::read_to_string(p.join(f))?;
                std::fs::write(d.join(f), v.trim())
                    .with_context(|| format!("write {}", d.join(f).display()))?;
            }
        }
    }
    Ok(())
}

/// Empties and removes the cgroup root `/<name>` in every hierarchy.
pub fn remove_cgroup_root(name: &str) {
    for cg in realnode_cgroups()
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == name))
    {
        remove_cgroup_tree(&cg);
    }
}
