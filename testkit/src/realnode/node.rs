//! One real node: a private mount namespace (held by a `sleep`), its own containerd + runc, a
//! real kubelet, a cgroup root `/realnode-<name>` and a CNI bridge `rn-<name>`, fenced so that
//! nothing it does reaches the host (see `../shared/notes/real-node.md`).

use super::host::{self, KUBELET_SYSCTLS, MARKER_ENV, PRIVATE_DIRS};
use crate::paths::upstream_bin;
use crate::proc::{Proc, tail};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The kubelet's PATH: without `/usr/sbin` it finds no iptables binary and leaves the host's
/// firewall alone ("No iptables support on this system").
const FENCED_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// The fake NVIDIA runtime wrapper, written per node.
const FAKE_NVIDIA_RUNTIME: &str = include_str!("fake-nvidia-runtime.py");

/// What a node is.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// Short name (`a`, `b`): cgroup root `/realnode-<name>`, bridge `rn-<name>`.
    pub name: String,
    /// Loopback address; also the Node's name and InternalIP.
    pub ip: String,
    /// Pod subnet `10.244.<index>.0/24`.
    pub index: u8,
    /// `--node-labels`.
    pub labels: Vec<(String, String)>,
}

/// Settings shared by every node of a cluster.
#[derive(Debug, Clone)]
pub struct NodeEnv {
    /// The run directory's marker value (see [`MARKER_ENV`]).
    pub marker: String,
    /// CA certificate that signed the apiserver's kubelet client certificate.
    pub ca_cert: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// Image archives (docker-archive) imported into each node's containerd.
    pub images: Vec<PathBuf>,
    /// Sandbox (pause) image name.
    pub pause_image: String,
    /// Directory holding this node's fake driver (`libnvidia-ml.so.1` + `fake-nvml.conf`); when
    /// set, containers that set `NVIDIA_VISIBLE_DEVICES` get it the way the NVIDIA toolkit does.
    pub driver_dir: Option<PathBuf>,
}

/// A running node. Dropping it stops kubelet, containerd (and every container) and the
/// namespace.
#[derive(Debug)]
pub struct RealNode {
    /// Its spec.
    pub spec: NodeSpec,
    /// `<run>/node-<name>`.
    pub dir: PathBuf,
    env: NodeEnv,
    token: String,
    holder: Option<Proc>,
    containerd: Option<Proc>,
    kubelet: Option<Proc>,
    /// How many times the kubelet was started.
    kubelet_starts: u32,
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl RealNode {
    /// Brings the node up to "kubelet started" (the caller waits for the Node to be Ready).
    pub fn start(run_dir: &Path, spec: NodeSpec, env: NodeEnv, token: String) -> Result<Self> {
        let dir = run_dir.join(format!("node-{}", spec.name));
        std::fs::create_dir_all(&dir)?;
        let mut node = Self {
            spec,
            dir,
            env,
            token,
            holder: None,
            containerd: None,
            kubelet: None,
            kubelet_starts: 0,
        };
        node.start_namespace()?;
        host::create_cgroup_root(&node.cgroup_root())?;
        node.write_configs()?;
        node.start_containerd()?;
        node.import_images()?;
        node.start_kubelet()?;
        Ok(node)
    }

    fn cgroup_root(&self) -> String {
        format!("{}{}", host::CGROUP_PREFIX, self.spec.name)
    }

    fn holder_pid(&self) -> Result<u32> {
        self.holder
            .as_ref()
            .map(Proc::pid)
            .context("node namespace not started")
    }

    /// A command run inside the node's mount namespace, marked as the harness's.
    pub fn in_namespace(&self, program: impl AsRef<std::ffi::OsStr>) -> Result<Command> {
        let mut c = Command::new("nsenter");
        c.arg("-t")
            .arg(self.holder_pid()?.to_string())
            .args(["-m", "--"])
            .arg(program)
            .env(MARKER_ENV, &self.env.marker);
        Ok(c)
    }

    fn start_namespace(&mut self) -> Result<()> {
        for d in PRIVATE_DIRS {
            std::fs::create_dir_all(d).with_context(|| format!("mkdir {d}"))?;
        }
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "sleep", "infinity"])
            .env(MARKER_ENV, &self.env.marker);
        let holder = Proc::spawn(
            &format!("ns-{}", self.spec.name),
            c,
            &self.dir.join("ns.log"),
        )?;
        let pid = holder.pid();
        self.holder = Some(holder);
        // unshare has entered the new namespace once its mount namespace differs from ours.
        let mine = std::fs::read_link("/proc/self/ns/mnt")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
            .ok()
            .as_ref()
            == Some(&mine)
        {
            if Instant::now() > deadline {
                bail!(
                    "node {}: mount namespace holder never unshared",
                    self.spec.name
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Inside: each hard-coded host directory is this node's own, and the sysctl files the
        // kubelet would "fix" are shadowed by files already holding its values.
        let mut script = String::from("set -e\n");
        for d in PRIVATE_DIRS {
            let own = self.dir.join(format!("host{}", d.replace('/', "_")));
            std::fs::create_dir_all(&own)?;
            script.push_str(&format!("mount --bind '{}' '{d}'\n", own.display()));
        }
        let sysctl_dir = self.dir.join("sysctl");
        std::fs::create_dir_all(&sysctl_dir)?;
        for (k, v) in KUBELET_SYSCTLS {
            let f = sysctl_dir.join(k.replace('/', "."));
            std::fs::write(&f, format!("{v}\n"))?;
            script.push_str(&format!("mount --bind '{}' /proc/sys/{k}\n", f.display()));
        }
        run(self.in_namespace("sh")?.args(["-c", &script]))
            .with_context(|| format!("node {}: namespace mounts", self.spec.name))?;
        Ok(())
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    fn write_configs(&self) -> Result<()> {
        let n = &self.dir;
        let name = &self.spec.name;
        std::fs::create_dir_all(n.join("cni/net.d"))?;
        std::fs::create_dir_all(n.join("pod-logs"))?;
        let runc = which("runc").context("runc not found (apt-get install runc)")?;
        let binary = match &self.env.driver_dir {
            Some(driver) => {
                let w = n.join("nvidia-container-runtime");
                let text = FAKE_NVIDIA_RUNTIME
                    .replace("@RUNC@", &runc.display().to_string())
                    .replace("@DRIVER_DIR@", &driver.display().to_string());
                std::fs::write(&w, text)?;
                run(Command::new("chmod").arg("755").arg(&w))?;
                w
            }
            None => runc,
        };
        let containerd = format!(
            r#"# containerd 2.x, node {name}: everything under {n}.
version = 3
# NRI would open /run/nri on the host, and the opt plugin creates /opt/containerd.
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt"]
root = "{n}/containerd/root"
state = "{n}/containerd/state"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"
[plugins.'io.containerd.cri.v1.runtime']
  disable_apparmor = true
  # This VM drops CAP_SYS_RESOURCE from every bounding set: nothing can lower oom_score_adj,
  # and runc fails the pause container (-998). Clamp to containerd's own score.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  # DRA: the kubelet passes the CDI device IDs the plugin prepared; containerd applies the
  # specs the plugin wrote (/var/run/cdi is this node's own, see host::PRIVATE_DIRS).
  enable_cdi = true
  cdi_spec_dirs = ["/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{binary}"
        # Per-node runc state: the default /run/containerd/runc would be shared.
        Root = "{n}/runc"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{n}/cni/net.d"
    max_conf_num = 1
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
            n = n.display(),
            sock = self.socket().display(),
            pause = self.env.pause_image,
            binary = binary.display(),
        );
        std::fs::write(n.join("containerd.toml"), containerd)?;
        let br = format!("{}{name}", host::BRIDGE_PREFIX);
        let cni = format!(
            r#"{{"cniVersion": "1.0.0", "name": "realnode-{name}", "plugins": [{{
  "type": "bridge", "bridge": "{br}", "isGateway": false, "ipMasq": false,
  "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "10.244.{idx}.0/24"}}]],
            "dataDir": "{n}/cni/ipam"}}}}]}}
"#,
            idx = self.spec.index,
            n = n.display(),
        );
        std::fs::write(n.join("cni/net.d/10-realnode.conflist"), cni)?;
        let ip = &self.spec.ip;
        let kubelet = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {ip}
port: 20250
readOnlyPort: 0
healthzBindAddress: {ip}
healthzPort: 20248
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization:
  mode: AlwaysAllow
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cg}
cgroupsPerQOS: true
failSwapOn: false
containerRuntimeEndpoint: unix://{sock}
podLogsDir: {n}/pod-logs
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: 100Mi, nodefs.available: {floor}, imagefs.available: {floor}}}
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
nodeStatusReportFrequency: 10s
nodeStatusUpdateFrequency: 2s
"#,
            ca = self.env.ca_cert.display(),
            cg = self.cgroup_root(),
            sock = self.socket().display(),
            n = n.display(),
            floor = super::DISK_FLOOR,
        );
        std::fs::write(n.join("kubelet.yaml"), kubelet)?;
        crate::cluster::write_kubeconfig(
            &n.join("kubeconfig"),
            &self.env.server,
            &self.env.ca_cert,
            &self.token,
        )?;
        Ok(())
    }

    fn start_containerd(&mut self) -> Result<()> {
        let _ = std::fs::remove_file(self.socket());
        let mut c = self.in_namespace(upstream_bin("containerd"))?;
        c.arg("--config").arg(self.dir.join("containerd.toml"));
        // containerd finds its shim (containerd-shim-runc-v2) on the PATH.
        let bin = crate::paths::upstream_bin_dir();
        c.env("PATH", format!("{}:{FENCED_PATH}", bin.display()));
        let p = Proc::spawn(
            &format!("containerd-{}", self.spec.name),
            c,
            &self.dir.join("containerd.log"),
        )?;
        self.containerd = Some(p);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.socket().exists() {
            if let Some(p) = self.containerd.as_mut() {
                p.check_running()?;
            }
            if Instant::now() > deadline {
                bail!(
                    "node {}: containerd socket never appeared:\n{}",
                    self.spec.name,
                    tail(&self.dir.join("containerd.log"), 20)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// `ctr` against this node's containerd, in its namespace.
    pub fn ctr(&self) -> Result<Command> {
        let mut c = self.in_namespace(upstream_bin("ctr"))?;
        c.arg("--address").arg(self.socket()).args(["-n", "k8s.io"]);
        Ok(c)
    }

    fn import_images(&self) -> Result<()> {
        for img in &self.env.images {
            run(self.ctr()?.args(["images", "import"]).arg(img))
                .with_context(|| format!("node {}: import {}", self.spec.name, img.display()))?;
        }
        Ok(())
    }

    /// The kubelet's current log file.
    pub fn kubelet_log(&self) -> PathBuf {
        self.dir.join("kubelet.log")
    }

    /// Every kubelet log of this node, oldest first (restarts keep the earlier ones).
    pub fn kubelet_logs(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = (1..self.kubelet_starts)
            .map(|i| self.dir.join(format!("kubelet.{i}.log")))
            .collect();
        v.push(self.kubelet_log());
        v
    }

    fn start_kubelet(&mut self) -> Result<()> {
        let labels = self
            .spec
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = self.in_namespace("env")?;
        c.arg(format!("PATH={FENCED_PATH}"))
            .arg(upstream_bin("kubelet"))
            .arg(format!(
                "--config={}",
                self.dir.join("kubelet.yaml").display()
            ))
            .arg(format!(
                "--kubeconfig={}",
                self.dir.join("kubeconfig").display()
            ))
            .arg(format!("--hostname-override={}", self.spec.ip))
            .args([
                "--root-dir=/var/lib/kubelet",
                "--cert-dir=/var/lib/kubelet/pki",
            ])
            .arg(format!("--node-labels={labels}"))
            .arg("--v=2");
        let p = Proc::spawn(
            &format!("kubelet-{}", self.spec.name),
            c,
            &self.kubelet_log(),
        )?
        .with_stop_timeout(Duration::from_secs(15));
        self.kubelet = Some(p);
        self.kubelet_starts += 1;
        Ok(())
    }

    /// Stops the kubelet (containers keep running, as with `systemctl restart kubelet`) and
    /// starts it again; the previous log is kept as `kubelet.<n>.log`.
    pub fn restart_kubelet(&mut self) -> Result<()> {
        if let Some(mut k) = self.kubelet.take() {
            k.stop();
        }
        std::fs::rename(
            self.kubelet_log(),
            self.dir
                .join(format!("kubelet.{}.log", self.kubelet_starts)),
        )?;
        self.start_kubelet()
    }

    /// Fails with a log tail when the kubelet or containerd has exited.
    pub fn check_running(&mut self) -> Result<()> {
        for p in [self.kubelet.as_mut(), self.containerd.as_mut()]
            .into_iter()
            .flatten()
        {
            p.check_running()?;
        }
        Ok(())
    }

    /// Stops kubelet, containerd, every container of the node and the namespace; removes the
    /// cgroup root and the bridge. Idempotent.
    pub fn stop(&mut self) {
        if let Some(mut k) = self.kubelet.take() {
            k.stop();
        }
        if let Some(mut c) = self.containerd.take() {
            c.stop();
        }
        // Shims and containers outlive containerd; they are in the node's cgroup root (containers)
        // or carry the marker and this node's socket path (shims).
        let sock = self.socket().display().to_string();
        let shims: Vec<u32> = host::marked_processes()
            .into_iter()
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).contains(&sock))
                    .unwrap_or(false)
            })
            .collect();
        host::kill_and_wait(&shims);
        if let Some(mut h) = self.holder.take() {
            h.stop();
        }
        host::remove_cgroup_root(&self.cgroup_root());
        let _ = Command::new("ip")
            .args([
                "link",
                "del",
                &format!("{}{}", host::BRIDGE_PREFIX, self.spec.name),
            ])
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The first `name` on the PATH (including the sbin directories).
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}
