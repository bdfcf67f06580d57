//! etcd + kube-apiserver + kube-scheduler on 127.0.0.1 with generated certificates and a
//! static token, plus a [`kube::Client`] for the test.

use crate::paths::{RunDir, system_bin, upstream_bin};
use crate::proc::{Proc, free_port, wait_for};
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The admin bearer token written into the static token file.
pub const ADMIN_TOKEN: &str = "kudos-e2e-admin-token";

/// How kube-scheduler calls the Kudos extender.
#[derive(Debug, Clone)]
pub struct ExtenderOptions {
    /// `http://127.0.0.1:<port><prefix>` (e.g. `/kudos/v1`).
    pub url_prefix: String,
    /// Verb for filter, `None` to skip.
    pub filter_verb: Option<String>,
    /// Verb for prioritize, `None` to skip.
    pub prioritize_verb: Option<String>,
    /// Verb for bind, `None` when kube-scheduler binds.
    pub bind_verb: Option<String>,
    /// Weight of the extender's score.
    pub weight: i64,
    /// Whether kube-scheduler ignores the extender when it fails.
    pub ignorable: bool,
    /// Managed resource name (`kudos.dev/gpu`).
    pub managed_resource: String,
    /// `ignoredByScheduler` of the managed resource: true when the extender's filter does the
    /// device accounting, false when kube-scheduler's NodeResourcesFit counts it.
    pub ignored_by_scheduler: bool,
    /// HTTP timeout.
    pub timeout: Duration,
    /// HTTPS (`enableHTTPS: true` and this `tlsConfig`), as the chart configures Kudos'
    /// scheduler; `None` for plain HTTP.
    pub tls: Option<ExtenderTls>,
}

/// The extender's `tlsConfig`: the files kube-scheduler presents and trusts.
#[derive(Debug, Clone)]
pub struct ExtenderTls {
    /// CA that signed the extender's serving certificate (`caFile`).
    pub ca: PathBuf,
    /// kube-scheduler's client certificate (`certFile`).
    pub cert: PathBuf,
    /// Its key (`keyFile`).
    pub key: PathBuf,
}

impl ExtenderOptions {
    /// The extender as the project ships it: the first `extenders` entry of
    /// `deploy/scheduler/kube-scheduler-config.yaml` (verbs, weight, ignorable, timeout,
    /// managed resource and its `ignoredByScheduler`), with `url_prefix` instead of the
    /// in-cluster URL. Falls back to filter + prioritize + bind, weight 5, `kudos.dev/gpu`
    /// counted by kube-scheduler, when the file is absent or unreadable.
    pub fn kudos(url_prefix: impl Into<String>) -> Self {
        let mut o = Self {
            url_prefix: url_prefix.into(),
            filter_verb: Some("filter".into()),
            prioritize_verb: Some("prioritize".into()),
            bind_verb: Some("bind".into()),
            weight: 5,
            ignorable: false,
            managed_resource: "kudos.dev/gpu".into(),
            ignored_by_scheduler: false,
            timeout: Duration::from_secs(5),
            tls: None,
        };
        let path = crate::paths::repo_root().join("deploy/scheduler/kube-scheduler-config.yaml");
        let Some(e) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_yaml::from_str::<serde_yaml::Value>(&t).ok())
            .and_then(|v| v.get("extenders").and_then(|x| x.get(0)).cloned())
        else {
            eprintln!(
                "e2e: {} unreadable; using built-in extender defaults",
                path.display()
            );
            return o;
        };
        let verb = |k: &str| e.get(k).and_then(|v| v.as_str()).map(str::to_string);
        o.filter_verb = verb("filterVerb");
        o.prioritize_verb = verb("prioritizeVerb");
        o.bind_verb = verb("bindVerb");
        if let Some(w) = e.get("weight").and_then(|v| v.as_i64()) {
            o.weight = w;
        }
        o.ignorable = e
            .get("ignorable")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        if let Some(t) = verb("httpTimeout")
            .and_then(|t| t.strip_suffix('s').and_then(|x| x.parse::<f64>().ok()))
        {
            o.timeout = Duration::from_secs_f64(t);
        }
        if let Some(m) = e.get("managedResources").and_then(|m| m.get(0)) {
            if let Some(n) = m.get("name").and_then(|v| v.as_str()) {
                o.managed_resource = n.to_string();
            }
            o.ignored_by_scheduler = m
                .get("ignoredByScheduler")
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
        }
        o
    }
}

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct ControlPlaneOptions {
    /// Start kube-scheduler (with the extender when given).
    pub scheduler: bool,
    /// Wire this extender into the scheduler configuration.
    pub extender: Option<ExtenderOptions>,
    /// Client QPS for kube-scheduler (default 50 as upstream; raise for benchmarks).
    pub scheduler_qps: Option<u32>,
    /// Extra kube-apiserver flags.
    pub apiserver_args: Vec<String>,
    /// Extra lines of the static token file (`token,user,uid,"group1,group2"`).
    pub extra_tokens: Vec<String>,
    /// Environment set on every control-plane process (the real-node harness marks its
    /// processes this way so a later run can find them).
    pub env: Vec<(String, String)>,
}

impl ControlPlaneOptions {
    /// What [`ControlPlane::start`] runs with these options (etcd, kube-apiserver, openssl, and
    /// kube-scheduler when asked), for [`crate::require_bins`].
    pub fn bins(&self) -> Vec<PathBuf> {
        let mut bins = vec![
            upstream_bin("etcd"),
            upstream_bin("kube-apiserver"),
            system_bin("openssl"),
        ];
        if self.scheduler {
            bins.push(upstream_bin("kube-scheduler"));
        }
        bins
    }
}

/// A running control plane. Dropping it stops scheduler, apiserver, etcd in that order.
pub struct ControlPlane {
    /// Processes in stop order (scheduler first, etcd last).
    procs: Vec<Proc>,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// kubeconfig with the admin token (for kube-scheduler and Kudos binaries).
    pub kubeconfig: PathBuf,
    /// Client for the test.
    pub client: Client,
    /// The run directory (logs, certificates, data).
    pub dir: PathBuf,
    /// etcd's client address, `127.0.0.1:<port>` (its `/metrics` too: a test can read the
    /// database size).
    pub etcd_addr: String,
    env: Vec<(String, String)>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("server", &self.server)
            .field("dir", &self.dir)
            .finish()
    }
}

/// Runs `openssl` with `args` in `dir` (certificates for loopback clusters).
pub fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .context("run openssl")?;
    if !out.status.success() {
        bail!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// CA, a serving certificate for 127.0.0.1/localhost (`server.crt`, `server.key`), and a
/// service-account key pair.
fn make_certs(dir: &Path) -> Result<()> {
    let pki = crate::pki::Pki::new_in(dir, "kudos-e2e-ca", 2)?;
    pki.issue(
        "server",
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,IP:10.0.0.1\n\
         extendedKeyUsage=serverAuth,clientAuth\n",
    )?;
    openssl(dir, &["genrsa", "-out", "sa.key", "2048"])?;
    openssl(dir, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;
    Ok(())
}

/// Writes a kubeconfig for `server` (CA file `ca`) that authenticates with the bearer `token`.
pub fn write_kubeconfig(path: &Path, server: &str, ca: &Path, token: &str) -> Result<()> {
    let kc = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {server}\n    certificate-authority: {}\n\
         users:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: admin\n    namespace: default\n\
         current-context: e2e\n",
        ca.display()
    );
    std::fs::write(path, kc)?;
    Ok(())
}

/// The `KubeSchedulerConfiguration` (v1) for kube-scheduler. `scheduler_name`: the one profile's
/// `schedulerName` (`None`: `default-scheduler`, upstream's default).
pub fn scheduler_config(
    kubeconfig: &Path,
    qps: u32,
    extender: Option<&ExtenderOptions>,
    scheduler_name: Option<&str>,
) -> String {
    let mut s = format!(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n\
         clientConnection:\n  kubeconfig: {}\n  qps: {qps}\n  burst: {}\n\
         leaderElection:\n  leaderElect: false\n\
         percentageOfNodesToScore: 100\n",
        kubeconfig.display(),
        qps * 2
    );
    if let Some(name) = scheduler_name {
        s.push_str(&format!("profiles:\n- schedulerName: {name}\n"));
    }
    if let Some(e) = extender {
        s.push_str("extenders:\n");
        s.push_str(&format!("- urlPrefix: {}\n", e.url_prefix));
        if let Some(v) = &e.filter_verb {
            s.push_str(&format!("  filterVerb: {v}\n"));
        }
        if let Some(v) = &e.prioritize_verb {
            s.push_str(&format!("  prioritizeVerb: {v}\n"));
        }
        if let Some(v) = &e.bind_verb {
            s.push_str(&format!("  bindVerb: {v}\n"));
        }
        match &e.tls {
            None => s.push_str("  enableHTTPS: false\n"),
            Some(t) => s.push_str(&format!(
                "  enableHTTPS: true\n  tlsConfig:\n    caFile: {}\n    certFile: {}\n    keyFile: {}\n",
                t.ca.display(),
                t.cert.display(),
                t.key.display()
            )),
        }
        s.push_str(&format!(
            "  weight: {}\n  nodeCacheCapable: true\n  ignorable: {}\n  httpTimeout: {}ms\n\
             \x20 managedResources:\n  - name: {}\n    ignoredByScheduler: {}\n",
            e.weight,
            e.ignorable,
            e.timeout.as_millis(),
            e.managed_resource,
            e.ignored_by_scheduler
        ));
    }
    s
}

/// Where [`ControlPlane::start`] writes the CA, the API server's certificate and key and the
/// service-account keys (`ca.crt`, `server.crt`, `server.key`, `sa.key`, `sa.pub`) for a control
/// plane run in `run_dir`.
pub fn pki_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("pki")
}

/// kube-scheduler with `config`, serving on a free loopback port with its certificates in
/// `cert_dir`, authenticating and authorizing its own callers through `kubeconfig`.
pub fn kube_scheduler_command(config: &Path, kubeconfig: &Path, cert_dir: &Path) -> Command {
    let mut cmd = Command::new(upstream_bin("kube-scheduler"));
    cmd.args([
        format!("--config={}", config.display()),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={}", free_port()),
        format!("--cert-dir={}", cert_dir.display()),
        format!("--authentication-kubeconfig={}", kubeconfig.display()),
        format!("--authorization-kubeconfig={}", kubeconfig.display()),
        "--v=2".into(),
    ]);
    cmd
}

impl ControlPlane {
    /// For a test: a run directory named `test` and a control plane started in it; `None` when
    /// a binary it needs (`opts.bins()`, then `extra`) is missing, the test returning after the
    /// `SKIP:` line ([`crate::require_bins`] says when that fails instead).
    pub async fn for_test(
        test: &str,
        opts: ControlPlaneOptions,
        extra: &[PathBuf],
    ) -> Result<Option<(RunDir, Self)>> {
        let bins = [opts.bins(), extra.to_vec()].concat();
        let Some(run) = RunDir::for_test(test, &bins)? else {
            return Ok(None);
        };
        let cp = Self::start(&run, opts).await?;
        Ok(Some((run, cp)))
    }

    /// Starts etcd and kube-apiserver (and kube-scheduler when asked) in `run`, waits until
    /// the API server is ready, and creates the `default` ServiceAccount.
    pub async fn start(run: &RunDir, opts: ControlPlaneOptions) -> Result<Self> {
        let dir = run.path().to_path_buf();
        let certs = pki_dir(&dir);
        make_certs(&certs)?;

        // etcd
        let (ec, ep) = (free_port(), free_port());
        let mut etcd_cmd = Command::new(upstream_bin("etcd"));
        etcd_cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));
        etcd_cmd.args([
            "--name=e2e".to_string(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{ec}"),
            format!("--advertise-client-urls=http://127.0.0.1:{ec}"),
            format!("--listen-peer-urls=http://127.0.0.1:{ep}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{ep}"),
            format!("--initial-cluster=e2e=http://127.0.0.1:{ep}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ]);
        let etcd = Proc::spawn("etcd", etcd_cmd, &dir.join("etcd.log"))?;
        let mut procs = vec![etcd];

        // kube-apiserver
        let port = free_port();
        let mut tokens = format!("{ADMIN_TOKEN},kudos-e2e-admin,1,\"system:masters\"\n");
        for t in &opts.extra_tokens {
            tokens.push_str(t);
            tokens.push('\n');
        }
        std::fs::write(dir.join("tokens.csv"), tokens)?;
        let mut api = Command::new(upstream_bin("kube-apiserver"));
        api.envs(opts.env.iter().map(|(k, v)| (k, v)));
        let c = |f: &str| certs.join(f).display().to_string();
        api.args([
            format!("--etcd-servers=http://127.0.0.1:{ec}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            // Kubernetes ≥ 1.37 refuses a loopback advertise address with an endpoint
            // reconciler; nothing here needs the `kubernetes` Service's endpoints.
            "--endpoint-reconciler-type=none".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", c("server.crt")),
            format!("--tls-private-key-file={}", c("server.key")),
            format!("--client-ca-file={}", c("ca.crt")),
            format!("--token-auth-file={}", dir.join("tokens.csv").display()),
            format!("--service-account-key-file={}", c("sa.pub")),
            format!("--service-account-signing-key-file={}", c("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            // No kube-controller-manager runs: keep new Nodes free of the not-ready taint.
            "--disable-admission-plugins=TaintNodesByCondition".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            "--max-requests-inflight=2000".into(),
            "--max-mutating-requests-inflight=1000".into(),
            "--v=1".into(),
        ]);
        // A list flag: repeating it would append, so the default applies only when not given.
        if !opts
            .apiserver_args
            .iter()
            .any(|a| a.starts_with("--authorization-mode="))
        {
            api.arg("--authorization-mode=RBAC");
        }
        api.args(&opts.apiserver_args);
        // An apiserver whose etcd died can hang on SIGTERM: bounded stop, then SIGKILL.
        let apiserver = Proc::spawn("kube-apiserver", api, &dir.join("kube-apiserver.log"))?
            .with_stop_timeout(Duration::from_secs(5));
        procs.push(apiserver);
        let server = format!("https://127.0.0.1:{port}");
        let kubeconfig = dir.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &server, &certs.join("ca.crt"), ADMIN_TOKEN)?;
        let kc = Kubeconfig::read_from(&kubeconfig)?;
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        let client = Client::try_from(config)?;

        let mut cp = Self {
            procs,
            server,
            kubeconfig,
            client,
            dir: dir.clone(),
            etcd_addr: format!("127.0.0.1:{ec}"),
            env: opts.env.clone(),
        };
        // Fails as soon as the apiserver exits (a bad flag, a busy port), not after the timeout.
        let client = cp.client.clone();
        let apiserver = &mut cp.procs[1]; // after etcd
        let ready = apiserver
            .wait_ready("/readyz", Duration::from_secs(90), async || {
                let text = client.request_text(http_get("/readyz")).await.ok()?;
                (text.trim() == "ok").then_some(())
            })
            .await;
        if let Err(e) = ready {
            for p in &mut cp.procs {
                if let Err(e) = p.check_running() {
                    eprintln!("{e:#}");
                }
            }
            return Err(e);
        }
        cp.ensure_default_service_account().await?;

        if opts.scheduler {
            cp.start_scheduler(opts.scheduler_qps.unwrap_or(50), opts.extender.as_ref())?;
        }
        Ok(cp)
    }

    async fn ensure_default_service_account(&self) -> Result<()> {
        // No kube-controller-manager: the ServiceAccount controller never creates `default`.
        let ns: Api<Namespace> = Api::all(self.client.clone());
        wait_for(
            "namespace default",
            Duration::from_secs(30),
            Duration::from_millis(200),
            async || ns.get_opt("default").await.ok().flatten().map(|_| ()),
        )
        .await?;
        let sa: Api<ServiceAccount> = Api::namespaced(self.client.clone(), "default");
        let mut obj = ServiceAccount::default();
        obj.metadata.name = Some("default".into());
        match sa.create(&PostParams::default(), &obj).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Starts kube-scheduler (stopped first on drop).
    pub fn start_scheduler(&mut self, qps: u32, extender: Option<&ExtenderOptions>) -> Result<()> {
        self.spawn_scheduler(qps, extender, None)
    }

    /// Starts a second kube-scheduler whose one profile is `scheduler_name` (pods that name it
    /// in `spec.schedulerName`), as the chart installs Kudos' own scheduler beside the
    /// cluster's. Its process is `kube-scheduler-<name>`, its log `kube-scheduler-<name>.log`.
    pub fn start_named_scheduler(
        &mut self,
        qps: u32,
        extender: Option<&ExtenderOptions>,
        scheduler_name: &str,
    ) -> Result<()> {
        self.spawn_scheduler(qps, extender, Some(scheduler_name))
    }

    fn spawn_scheduler(
        &mut self,
        qps: u32,
        extender: Option<&ExtenderOptions>,
        scheduler_name: Option<&str>,
    ) -> Result<()> {
        let proc_name = match scheduler_name {
            Some(n) => format!("kube-scheduler-{n}"),
            None => "kube-scheduler".to_string(),
        };
        let cfg = self.dir.join(format!("{proc_name}-config.yaml"));
        std::fs::write(
            &cfg,
            scheduler_config(&self.kubeconfig, qps, extender, scheduler_name),
        )?;
        let certs = self.dir.join(format!("{proc_name}-certs"));
        let mut cmd = kube_scheduler_command(&cfg, &self.kubeconfig, &certs);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let log = self.dir.join(format!("{proc_name}.log"));
        let p = Proc::spawn(&proc_name, cmd, &log)?;
        self.procs.push(p);
        Ok(())
    }

    /// Stops kube-scheduler, if running (e.g. to restart it with another configuration).
    pub fn stop_scheduler(&mut self) {
        if let Some(i) = self.procs.iter().position(|p| p.name() == "kube-scheduler") {
            let mut p = self.procs.remove(i);
            p.stop();
            let _ = std::fs::rename(
                self.dir.join("kube-scheduler.log"),
                self.dir.join(format!("kube-scheduler-{}.log", p.pid())),
            );
        }
    }

    /// The CA certificate the API server's serving certificate chains to.
    pub fn ca_file(&self) -> PathBuf {
        pki_dir(&self.dir).join("ca.crt")
    }

    /// `(name, pid)` of every running control-plane process.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.procs
            .iter()
            .map(|p| (p.name().to_string(), p.pid()))
            .collect()
    }

    /// Fails with a log tail when any control-plane process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        for p in &mut self.procs {
            p.check_running()?;
        }
        Ok(())
    }

    /// Stops everything: scheduler → apiserver → etcd.
    pub fn stop(&mut self) {
        while let Some(mut p) = self.procs.pop() {
            p.stop();
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

fn http_get(path: &str) -> ::http::Request<Vec<u8>> {
    ::http::Request::get(path)
        .body(Vec::new())
        .expect("valid request")
}
