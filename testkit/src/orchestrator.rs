//! `kudos-orchestrator` against the real API server: extender HTTP and gRPC on free loopback
//! ports, a file store in the run directory, static gRPC tokens (one per node).

use crate::http;
use crate::paths::kudos_bin;
use crate::proc::{Proc, free_port};
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A running orchestrator.
#[derive(Debug)]
pub struct Orchestrator {
    proc: Proc,
    /// `127.0.0.1:<port>` of the HTTP server (extender, /explain, /readyz).
    pub http_addr: String,
    /// `127.0.0.1:<port>` of the gRPC server.
    pub grpc_addr: String,
    /// How the HTTP port is called when it serves HTTPS ([`OrchestratorOptions::https`]).
    pub https: Option<http::TlsClient>,
}

/// The static token of a node for the gRPC API (see [`Orchestrator::start`]).
pub fn node_token(node: &str) -> String {
    format!("e2e-token-{node}")
}

/// HTTPS as the chart sets it up: one CA (under `dir/kudos-ca`) signs the orchestrator's
/// serving certificate (localhost, 127.0.0.1) and kube-scheduler's client certificate
/// (naming `kudos-scheduler`), which the extender verbs then require.
#[derive(Debug, Clone)]
pub struct ChartTls {
    /// The orchestrator's `--config` file, with its `tls` and `access` sections.
    pub config: PathBuf,
    /// How the kit calls the orchestrator ([`OrchestratorOptions::https`]).
    pub client: http::TlsClient,
    /// kube-scheduler's `tlsConfig` for the extender.
    pub scheduler: crate::cluster::ExtenderTls,
    /// The serving certificate and key (PEM), for another server to present the same.
    pub server: (PathBuf, PathBuf),
}

impl ChartTls {
    /// Makes the certificates and the config file under `dir`.
    pub fn new(dir: &Path) -> Result<Self> {
        let pki = crate::pki::Pki::new(dir, "kudos-ca", 2)?;
        let (crt, key) = pki.server("kudos-orchestrator")?;
        let (client_crt, client_key) = pki.client("kudos-scheduler")?;
        let config = dir.join("orchestrator-tls-config.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\n\
                 tls:\n  certFile: {}\n  keyFile: {}\n  clientCAFile: {}\n\
                 access:\n  extender: clientCertificate\n  extenderClientNames: [kudos-scheduler]\n",
                crt.display(),
                key.display(),
                pki.ca().display()
            ),
        )?;
        Ok(Self {
            config,
            client: http::TlsClient::new(&pki.ca(), "localhost", None)?,
            scheduler: crate::cluster::ExtenderTls {
                ca: pki.ca(),
                cert: client_crt,
                key: client_key,
            },
            server: (crt, key),
        })
    }

    /// Options that start the orchestrator with these certificates (`opts.extra` gets the
    /// `--config` flag; it must not carry another).
    pub fn apply(&self, mut opts: OrchestratorOptions) -> OrchestratorOptions {
        opts.extra
            .push(format!("--config={}", self.config.display()));
        opts.https = Some(self.client.clone());
        opts
    }
}

/// How to start the orchestrator (see [`Orchestrator::start_with`]).
#[derive(Debug, Clone)]
pub struct OrchestratorOptions {
    /// The binary: `kudos_bin("kudos-orchestrator")` by default; the orchestrator's own tests
    /// pass `env!("CARGO_BIN_EXE_kudos-orchestrator")`.
    pub bin: PathBuf,
    /// Kubeconfig, or `None` for `--standalone`.
    pub kubeconfig: Option<PathBuf>,
    /// Nodes given static gRPC tokens ([`node_token`], `--auth=static`); `None` keeps the
    /// default authentication, TokenReview against the cluster.
    pub static_token_nodes: Option<Vec<String>>,
    /// Flags appended last (`--config=...`, `--store=config-map`, `--log-level=...`).
    pub extra: Vec<String>,
    /// Environment variables set for the process (`POD_NAME`, ...).
    pub env: Vec<(String, String)>,
    /// The HTTP port serves HTTPS (its `tls` settings in a `--config` file among `extra`):
    /// how the kit calls `/readyz`, `/explain` and the rest.
    pub https: Option<http::TlsClient>,
}

impl Default for OrchestratorOptions {
    fn default() -> Self {
        Self {
            bin: kudos_bin("kudos-orchestrator"),
            kubeconfig: None,
            static_token_nodes: Some(Vec::new()),
            extra: Vec::new(),
            env: Vec::new(),
            https: None,
        }
    }
}

impl Orchestrator {
    /// Starts the orchestrator with `kubeconfig` (or `--standalone` when `None`), storing its
    /// state and log under `dir`; `nodes` get static gRPC tokens ([`node_token`]). `extra`
    /// flags are appended. Waits for `/readyz`.
    pub async fn start(
        dir: &Path,
        kubeconfig: Option<&Path>,
        nodes: &[String],
        extra: &[String],
    ) -> Result<Self> {
        let opts = OrchestratorOptions {
            kubeconfig: kubeconfig.map(Path::to_path_buf),
            static_token_nodes: Some(nodes.to_vec()),
            extra: extra.to_vec(),
            ..OrchestratorOptions::default()
        };
        Self::start_with(dir, &opts).await
    }

    /// Starts the orchestrator as `opts` says, on free loopback ports, with its file store and
    /// log (`kudos-orchestrator.log`, appended across restarts) under `dir`. Waits for
    /// `/readyz`.
    pub async fn start_with(dir: &Path, opts: &OrchestratorOptions) -> Result<Self> {
        let mut orch = Self::spawn(dir, opts)?;
        orch.wait_ready(Duration::from_secs(60)).await?;
        Ok(orch)
    }

    /// Starts a replica that is expected to start as a leader-election follower (`opts.extra`
    /// has `--leader-elect`): returns once `/healthz` answers, whether or not it leads.
    pub async fn start_follower(dir: &Path, opts: &OrchestratorOptions) -> Result<Self> {
        let mut orch = Self::spawn(dir, opts)?;
        let (addr, tls) = (orch.http_addr.clone(), orch.https.clone());
        orch.proc
            .wait_ready("/healthz", Duration::from_secs(60), async || {
                let r =
                    http::request_maybe_tls(tls.as_ref(), "GET", &addr, "/healthz", None).ok()?;
                (r.status == 200).then_some(())
            })
            .await?;
        Ok(orch)
    }

    /// Waits until `/readyz` answers 200: the extender answers (a follower's too).
    pub async fn wait_ready_http(&mut self, timeout: Duration) -> Result<()> {
        let (http_addr, tls) = (self.http_addr.clone(), self.https.clone());
        self.proc
            .wait_ready("/readyz", timeout, async || {
                let r = http::request_maybe_tls(tls.as_ref(), "GET", &http_addr, "/readyz", None)
                    .ok()?;
                (r.status == 200).then_some(())
            })
            .await
    }

    /// Waits until `/readyz` answers 200 and the gRPC port takes connections (a follower:
    /// until it leads).
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let (http_addr, grpc_addr) = (self.http_addr.clone(), self.grpc_addr.clone());
        let tls = self.https.clone();
        // `/readyz` can answer before the gRPC server listens: wait for both.
        self.proc
            .wait_ready("/readyz and gRPC", timeout, async || {
                let r = http::request_maybe_tls(tls.as_ref(), "GET", &http_addr, "/readyz", None)
                    .ok()?;
                std::net::TcpStream::connect(&grpc_addr).ok()?;
                (r.status == 200).then_some(())
            })
            .await
    }

    /// `GET /readyz`: status and body.
    pub fn readyz(&self) -> Result<(u16, String)> {
        let r = self.get("/readyz")?;
        Ok((r.status, String::from_utf8_lossy(&r.body).into_owned()))
    }

    fn spawn(dir: &Path, opts: &OrchestratorOptions) -> Result<Self> {
        let (hp, gp) = (free_port(), free_port());
        let mut cmd = Command::new(&opts.bin);
        cmd.args([
            format!("--http-listen=127.0.0.1:{hp}"),
            format!("--grpc-listen=127.0.0.1:{gp}"),
            format!("--store-path={}", dir.join("orchestrator.redb").display()),
        ]);
        if let Some(nodes) = &opts.static_token_nodes {
            let tokens = dir.join("orchestrator-tokens.yaml");
            let mut t = String::new();
            for n in nodes {
                t.push_str(&format!("{}: {n}\n", node_token(n)));
            }
            if t.is_empty() {
                t.push_str("{}\n");
            }
            std::fs::write(&tokens, t)?;
            cmd.args([
                "--auth=static".into(),
                format!("--static-tokens-file={}", tokens.display()),
            ]);
        }
        match &opts.kubeconfig {
            Some(k) => {
                cmd.arg(format!("--kubeconfig={}", k.display()));
            }
            None => {
                cmd.arg("--standalone");
            }
        }
        cmd.args(&opts.extra);
        cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));
        cmd.env(
            "KUDOS_LOG",
            std::env::var("KUDOS_E2E_RUST_LOG").unwrap_or_else(|_| "info".into()),
        );
        let log = dir.join("kudos-orchestrator.log");
        let proc = Proc::spawn("kudos-orchestrator", cmd, &log)?;
        Ok(Self {
            proc,
            http_addr: format!("127.0.0.1:{hp}"),
            grpc_addr: format!("127.0.0.1:{gp}"),
            https: opts.https.clone(),
        })
    }

    /// `http(s)://127.0.0.1:<port>/kudos/v1`, the extender URL prefix for kube-scheduler.
    pub fn extender_url(&self) -> String {
        let scheme = if self.https.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}/kudos/v1", self.http_addr)
    }

    /// `GET path` on the HTTP port (over HTTPS when it serves HTTPS).
    pub fn get(&self, path: &str) -> Result<http::Response> {
        http::request_maybe_tls(self.https.as_ref(), "GET", &self.http_addr, path, None)
    }

    /// `GET /explain/{namespace}/{pod}` as JSON.
    pub fn explain(&self, namespace: &str, pod: &str) -> Result<serde_json::Value> {
        self.get(&format!("/explain/{namespace}/{pod}"))?.json()
    }

    /// Runs the published model has learned from (`/state`'s `model.runs`), `None` while it
    /// does not answer.
    pub fn learned_runs(&self) -> Option<u64> {
        self.get("/state").ok()?.json().ok()?["model"]["runs"].as_u64()
    }

    /// Waits until the published model has learned from at least `runs` runs. A report's
    /// acknowledgement promises the run is stored, not learned: rankings read right after
    /// an acknowledgement may still come from the model before it.
    pub async fn wait_learned(&self, runs: u64, timeout: Duration) -> Result<u64> {
        crate::proc::wait_for(
            &format!("the model to learn from {runs} runs"),
            timeout,
            Duration::from_millis(20),
            async || self.learned_runs().filter(|&r| r >= runs),
        )
        .await
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Fails when the process exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.proc.check_running()
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        self.proc.log()
    }

    /// SIGKILL (a crash, as far as it can tell).
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Stops it (SIGTERM, then SIGKILL); how it exited when it did so by itself.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        self.proc.stop()
    }
}
