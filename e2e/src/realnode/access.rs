//! Calling the orchestrator the way an operator does once the chart turned TLS on: HTTPS to
//! its Service name (resolved to loopback: this cluster has no DNS), its certificate checked
//! against the chart's CA (Secret `kudos-orchestrator-tls`), reads with the bearer token of a
//! ServiceAccount bound to the chart's ClusterRole `kudos-reader`. `curl` makes the calls, as
//! a person at a terminal would.

use super::kudos::ORCHESTRATOR_HTTP;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The Service name in the orchestrator's serving certificate.
pub const HOST: &str = "kudos-orchestrator.kudos-system.svc";

/// What a call presents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum As {
    /// Nothing.
    Anonymous,
    /// The reader's bearer token.
    Reader,
    /// A token of a ServiceAccount with no Kudos role.
    Stranger,
    /// Kudos' kube-scheduler's client certificate (Secret `kudos-scheduler-client-tls`).
    Scheduler,
}

/// Credentials fetched from the cluster after `helm install`.
#[derive(Debug)]
pub struct Access {
    dir: PathBuf,
    ca: PathBuf,
    reader: PathBuf,
    stranger: PathBuf,
    scheduler: (PathBuf, PathBuf),
}

static ACCESS: OnceLock<Access> = OnceLock::new();

/// The credentials [`setup`] fetched.
pub fn get() -> Result<&'static Access> {
    ACCESS
        .get()
        .context("realnode::access::setup has not run (Kudos not installed)")
}

fn secret_file(s: &Secret, key: &str, path: &Path) -> Result<PathBuf> {
    let data = s
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .with_context(|| format!("Secret has no {key}"))?;
    std::fs::write(path, &data.0)?;
    Ok(path.to_owned())
}

async fn token(client: &kube::Client, sa: &str, path: &Path) -> Result<PathBuf> {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    if sas.get_opt(sa).await?.is_none() {
        sas.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": sa}}))?,
        )
        .await?;
    }
    let req = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let t = sas
        .create_token_request(sa, &PostParams::default(), &req)
        .await?
        .status
        .context("TokenRequest without status")?
        .token;
    std::fs::write(path, format!("Authorization: Bearer {t}"))?;
    Ok(path.to_owned())
}

/// Fetches the chart's CA and kube-scheduler's client certificate, and tokens for a reader
/// (ServiceAccount `kudos-e2e-reader`, bound to ClusterRole `kudos-reader`) and a stranger;
/// files under `dir`. Idempotent per process.
pub async fn setup(client: &kube::Client, dir: &Path) -> Result<&'static Access> {
    if let Some(a) = ACCESS.get() {
        return Ok(a);
    }
    let dir = dir.join("orchestrator-access");
    std::fs::create_dir_all(&dir)?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kudos-system");
    let server = secrets.get("kudos-orchestrator-tls").await?;
    let sched = secrets.get("kudos-scheduler-client-tls").await?;
    let ca = secret_file(&server, "ca.crt", &dir.join("ca.crt"))?;
    let scheduler = (
        secret_file(&sched, "tls.crt", &dir.join("scheduler.crt"))?,
        secret_file(&sched, "tls.key", &dir.join("scheduler.key"))?,
    );
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    if bindings.get_opt("kudos-e2e-reader").await?.is_none() {
        bindings
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": "kudos-e2e-reader"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kudos-reader"},
                    "subjects": [{"kind": "ServiceAccount", "name": "kudos-e2e-reader", "namespace": "default"}],
                }))?,
            )
            .await?;
    }
    let reader = token(client, "kudos-e2e-reader", &dir.join("reader.header")).await?;
    let stranger = token(client, "kudos-e2e-stranger", &dir.join("stranger.header")).await?;
    Ok(ACCESS.get_or_init(|| Access {
        dir,
        ca,
        reader,
        stranger,
        scheduler,
    }))
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Answer {
    /// Status code.
    pub status: u16,
    /// Body.
    pub body: Vec<u8>,
}

impl Access {
    /// `https://<HOST>:<port>` resolved to the orchestrator's loopback address.
    pub fn base(&self) -> String {
        format!("https://{HOST}:{}", port())
    }

    /// The curl command line (without the URL) for a call as `who`.
    pub fn curl_args(&self, who: As) -> Vec<String> {
        let mut a = vec![
            "--silent".into(),
            "--show-error".into(),
            "--max-time".into(),
            "20".into(),
            "--cacert".into(),
            self.ca.display().to_string(),
            "--resolve".into(),
            format!("{HOST}:{}:127.0.0.1", port()),
        ];
        match who {
            As::Anonymous => {}
            As::Reader => a.extend(["--header".into(), format!("@{}", self.reader.display())]),
            As::Stranger => a.extend(["--header".into(), format!("@{}", self.stranger.display())]),
            As::Scheduler => a.extend([
                "--cert".into(),
                self.scheduler.0.display().to_string(),
                "--key".into(),
                self.scheduler.1.display().to_string(),
            ]),
        }
        a
    }

    /// `method path` as `who`, with a JSON `body` if given. Fails only when no HTTP answer
    /// came (TLS refused, connection refused).
    pub fn call(&self, who: As, method: &str, path: &str, body: Option<&[u8]>) -> Result<Answer> {
        let out_file = self.dir.join(format!("answer-{}", std::process::id()));
        let mut cmd = Command::new("curl");
        cmd.args(self.curl_args(who))
            .args(["--request", method, "--output"])
            .arg(&out_file)
            .args(["--write-out", "%{http_code}"]);
        if let Some(b) = body {
            let f = self.dir.join(format!("body-{}", std::process::id()));
            std::fs::write(&f, b)?;
            cmd.args([
                "--header",
                "content-type: application/json",
                "--data-binary",
            ])
            .arg(format!("@{}", f.display()));
        }
        cmd.arg(format!("{}{path}", self.base()));
        let out = cmd.output().context("run curl (Debian package curl)")?;
        if !out.status.success() {
            bail!(
                "curl {method} {path} as {who:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let status = String::from_utf8_lossy(&out.stdout).trim().parse()?;
        let body = std::fs::read(&out_file).unwrap_or_default();
        Ok(Answer { status, body })
    }

    /// `GET path` as the reader, as JSON; an error unless 200.
    pub fn get_json(&self, path: &str) -> Result<serde_json::Value> {
        let a = self.call(As::Reader, "GET", path, None)?;
        if a.status != 200 {
            bail!(
                "GET {path}: {} {}",
                a.status,
                String::from_utf8_lossy(&a.body)
            );
        }
        Ok(serde_json::from_slice(&a.body)?)
    }
}

fn port() -> &'static str {
    ORCHESTRATOR_HTTP.rsplit(':').next().unwrap_or("8888")
}
