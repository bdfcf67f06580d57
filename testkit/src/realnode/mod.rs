//! Real nodes: etcd + kube-apiserver + kube-controller-manager (+ kube-scheduler) and real
//! kubelets, each with its own containerd and runc, running real containers on this machine.
//!
//! The recipe, measured on this machine kind, is `../shared/notes/real-node.md`. Each node has
//! its own mount namespace ([`node`]), containerd, cgroup root, loopback IP (127.0.0.1,
//! 127.0.0.2, ...) and CNI bridge. The kubelet is fenced: host sysctls it would rewrite are
//! shadowed inside its namespace and its PATH has no iptables. There is no kube-proxy and no
//! cluster DNS: pods that talk to the API server or to each other use `hostNetwork`.
//!
//! The host is left as it was found: [`RealCluster`] stops everything on drop, [`host::cleanup`]
//! removes what an earlier killed run left (it runs at start), and [`RealCluster::shutdown`]
//! returns every difference between the host before and after.

pub mod gpus;
pub mod host;
pub mod node;

use crate::cluster::{ControlPlane, ControlPlaneOptions, ExtenderOptions};
use crate::paths::{RunDir, upstream_bin};
use crate::proc::{Proc, wait_for};
use anyhow::{Context, Result};
use host::{HostSnapshot, MARKER_ENV};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use node::{NodeEnv, NodeSpec, RealNode};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Image name of the sandbox (pause) image that `images/build` builds.
pub const PAUSE_IMAGE: &str = "localhost/kudos/pause:0.1.0";
/// The label every real node carries with its short name.
pub const NODE_LABEL: &str = "kudos.dev/realnode";

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct RealClusterOptions {
    /// Nodes, in order (node `i` gets IP 127.0.0.`i+1`).
    pub nodes: Vec<(String, Vec<(String, String)>)>,
    /// docker-archive image tarballs imported into every node.
    pub images: Vec<PathBuf>,
    /// Per node name: the fake driver directory (see [`NodeEnv::driver_dir`]).
    pub drivers: BTreeMap<String, PathBuf>,
}

/// A running real-node cluster.
pub struct RealCluster {
    /// Nodes (stopped first on drop).
    pub nodes: Vec<RealNode>,
    kcm: Option<Proc>,
    /// The control plane (apiserver, etcd; the scheduler once started).
    pub cp: ControlPlane,
    before: HostSnapshot,
}

impl std::fmt::Debug for RealCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealCluster")
            .field("server", &self.cp.server)
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

/// Token of node `ip` in the apiserver's static token file.
fn node_token(name: &str) -> String {
    format!("kudos-e2e-node-{name}-token")
}

impl RealCluster {
    /// Cleans up after earlier runs, records the host state, and starts the control plane,
    /// kube-controller-manager and every node; returns once each Node is Ready.
    pub async fn start(run: &RunDir, opts: RealClusterOptions) -> Result<Self> {
        check_disk(run.path())?;
        host::cleanup().context("cleaning up an earlier real-node run")?;
        let before = HostSnapshot::capture();
        let marker = run.path().display().to_string();
        let env = vec![(MARKER_ENV.to_string(), marker.clone())];
        let specs: Vec<NodeSpec> = opts
            .nodes
            .iter()
            .enumerate()
            .map(|(i, (name, labels))| {
                let mut labels = labels.clone();
                labels.push((NODE_LABEL.into(), name.clone()));
                NodeSpec {
                    name: name.clone(),
                    ip: format!("127.0.0.{}", i + 1),
                    index: i as u8,
                    labels,
                }
            })
            .collect();
        let pki = crate::cluster::pki_dir(run.path());
        let c = |f: &str| pki.join(f).display().to_string();
        let cp = ControlPlane::start(
            run,
            ControlPlaneOptions {
                apiserver_args: vec![
                    "--authorization-mode=Node,RBAC".into(),
                    format!("--kubelet-client-certificate={}", c("server.crt")),
                    format!("--kubelet-client-key={}", c("server.key")),
                    "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
                ],
                extra_tokens: specs
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        format!(
                            "{},system:node:{},{},\"system:nodes\"",
                            node_token(&s.name),
                            s.ip,
                            100 + i
                        )
                    })
                    .collect(),
                env: env.clone(),
                ..Default::default()
            },
        )
        .await?;
        let mut kcm = Command::new(upstream_bin("kube-controller-manager"));
        let kc = cp.kubeconfig.display().to_string();
        kcm.envs(env.iter().map(|(k, v)| (k, v))).args([
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", crate::proc::free_port()),
            format!("--cert-dir={}", run.join("kcm-certs").display()),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=false".into(),
            format!("--service-account-private-key-file={}", c("sa.key")),
            format!("--root-ca-file={}", c("ca.crt")),
            "--controllers=*,-bootstrapsigner,-tokencleaner".into(),
            // Node deletion and pod eviction are what the scenarios observe; keep them quick.
            "--node-monitor-grace-period=20s".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ]);
        let kcm = Proc::spawn(
            "kube-controller-manager",
            kcm,
            &run.join("kube-controller-manager.log"),
        )?;
        let mut cluster = Self {
            nodes: Vec::new(),
            kcm: Some(kcm),
            cp,
            before,
        };
        for spec in specs {
            let node_env = NodeEnv {
                marker: marker.clone(),
                ca_cert: cluster.cp.ca_file(),
                server: cluster.cp.server.clone(),
                images: opts.images.clone(),
                pause_image: PAUSE_IMAGE.into(),
                driver_dir: opts.drivers.get(&spec.name).cloned(),
            };
            let token = node_token(&spec.name);
            let node = RealNode::start(run.path(), spec, node_env, token)?;
            cluster.nodes.push(node);
        }
        for i in 0..cluster.nodes.len() {
            cluster.wait_ready(i).await?;
        }
        Ok(cluster)
    }

    /// Starts kube-scheduler with `extender` (e.g. the shipped Kudos configuration).
    pub fn start_scheduler(&mut self, extender: Option<&ExtenderOptions>) -> Result<()> {
        self.cp.start_scheduler(50, extender)
    }

    /// Waits until node `i`'s Node object reports Ready.
    pub async fn wait_ready(&mut self, i: usize) -> Result<()> {
        let ip = self.nodes[i].spec.ip.clone();
        let nodes: Api<Node> = Api::all(self.cp.client.clone());
        let r = wait_for(
            &format!("node {ip} Ready"),
            Duration::from_secs(90),
            Duration::from_millis(200),
            async || {
                let n = nodes.get_opt(&ip).await.ok().flatten()?;
                let ready = n
                    .status?
                    .conditions?
                    .into_iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                ready.then_some(())
            },
        )
        .await;
        if let Err(e) = r {
            self.nodes[i].check_running()?;
            return Err(e).with_context(|| {
                format!(
                    "kubelet log tail:\n{}",
                    crate::proc::tail(&self.nodes[i].kubelet_log(), 30)
                )
            });
        }
        Ok(())
    }

    /// Stops everything (nodes, controller manager, control plane), runs [`host::cleanup`]
    /// and returns how the host differs from before the run (empty: left as found).
    pub fn shutdown(mut self) -> Result<Vec<String>> {
        self.stop();
        host::cleanup()?;
        Ok(HostSnapshot::capture().diff(&self.before))
    }

    /// [`RealCluster::shutdown`], failing with every difference when the host is not left as
    /// it was found: how each scenario ends.
    pub fn shutdown_clean(self) -> Result<()> {
        let diff = self.shutdown()?;
        anyhow::ensure!(
            diff.is_empty(),
            "host not left as found:\n{}",
            diff.join("\n")
        );
        Ok(())
    }

    fn stop(&mut self) {
        while let Some(mut n) = self.nodes.pop() {
            n.stop();
        }
        if let Some(mut k) = self.kcm.take() {
            k.stop();
        }
        self.cp.stop();
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        self.stop();
        if let Err(e) = host::cleanup() {
            eprintln!("realnode: {e:#}");
        }
    }
}

/// The kubelets' hard eviction floor for the node and image file systems. An absolute size, not
/// a percentage: the harness shares one large host disk (252 GiB on CI's machine), where even 2%
/// is 5 GiB that a run does not need, and CI once failed with 5.7 GiB free.
pub(crate) const DISK_FLOOR: &str = "512Mi";
const DISK_FLOOR_BYTES: u64 = 512 << 20;

/// Fails early, saying why, when the run directory's file system is nearly full: below the
/// kubelets' `evictionHard` floor ([`DISK_FLOOR`]) every node gets the DiskPressure taint and no
/// pod is ever scheduled, which otherwise surfaces minutes later as "no free device". A margin of
/// 2 GiB is asked for above it (images, logs and containers of one scenario).
fn check_disk(dir: &std::path::Path) -> Result<()> {
    let out = Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(dir)
        .output()
        .context("run df")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let avail: Option<u64> = text.lines().nth(1).and_then(|l| l.trim().parse().ok());
    if let Some(avail) = avail {
        let need = DISK_FLOOR_BYTES + (2 << 30);
        let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
        anyhow::ensure!(
            avail >= need,
            "only {:.1} GiB free on the file system of {}: the real nodes' kubelets would taint \
             themselves DiskPressure below {DISK_FLOOR} and schedule nothing; free at least \
             {:.1} GiB (old target directories, e2e/_work)",
            gib(avail),
            dir.display(),
            gib(need - avail)
        );
    }
    Ok(())
}
