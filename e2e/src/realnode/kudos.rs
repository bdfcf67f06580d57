//! Installing Kudos on a real-node cluster with Helm ([`Helm`]), as an operator would, its
//! manifests changed only where a cluster without kube-proxy and cluster DNS forces it (see
//! [`adapt`], run as Helm's post-renderer).

use crate::paths::repo_root;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// Where the orchestrator listens once it runs with `hostNetwork` (the shipped config binds
/// `0.0.0.0`, so every node's pods reach it on loopback).
pub const ORCHESTRATOR_HTTP: &str = "127.0.0.1:8888";
/// The orchestrator's gRPC address on loopback.
pub const ORCHESTRATOR_GRPC: &str = "127.0.0.1:8889";
/// The in-cluster Service host name the shipped manifests use.
const SERVICE_HOST: &str = "kudos-orchestrator.kudos-system.svc";

/// The Service host as URLs name it (`scheme://host`).
fn service_url() -> String {
    format!("://{SERVICE_HOST}")
}

/// The changes this cluster needs, applied to one shipped object; everything else stays:
/// - ConfigMaps that name the orchestrator's Service (the Kudos scheduler's extender URL) name
///   loopback instead;
/// - pods of workloads (and of Helm's hook Jobs) run with `hostNetwork` (no kube-proxy: Service IPs do not route, and no
///   cluster DNS: Service names do not resolve), reach the API server through an explicit
///   `KUBERNETES_SERVICE_HOST`/`PORT`, and the orchestrator's Service name becomes loopback;
/// - DaemonSet pods bind their metrics port on the node's own IP (`--metrics-addr` or
///   `KUDOS_METRICS_ADDR`), since all nodes share the host's network namespace here.
pub fn adapt(mut obj: Value, api_port: u16) -> Value {
    let kind = obj["kind"].as_str().unwrap_or_default().to_string();
    if kind == "ConfigMap" {
        // The Kudos scheduler's extender URL names the orchestrator's Service; its TLS
        // serverName keeps naming it, as the certificate does.
        if let Some(data) = obj["data"].as_object_mut() {
            for v in data.values_mut() {
                if let Some(s) = v.as_str().filter(|s| s.contains(&service_url())) {
                    *v = json!(s.replace(&service_url(), "://127.0.0.1"));
                }
            }
        }
        return obj;
    }
    if kind == "MutatingWebhookConfiguration" {
        // The API server reaches the orchestrator on loopback (its certificate names
        // 127.0.0.1 through tls.ipAddresses), not through the Service.
        for w in obj["webhooks"].as_array_mut().into_iter().flatten() {
            let cc = &mut w["clientConfig"];
            let path = cc["service"]["path"].as_str().unwrap_or("/").to_string();
            let port = cc["service"]["port"].as_u64().unwrap_or(443);
            if let Some(m) = cc.as_object_mut() {
                m.remove("service");
                m.insert(
                    "url".into(),
                    json!(format!("https://127.0.0.1:{port}{path}")),
                );
            }
        }
        return obj;
    }
    if !matches!(kind.as_str(), "Deployment" | "DaemonSet" | "Job") {
        return obj;
    }
    let spec = &mut obj["spec"]["template"]["spec"];
    spec["hostNetwork"] = json!(true);
    spec["dnsPolicy"] = json!("ClusterFirstWithHostNet");
    let Some(containers) = spec["containers"].as_array_mut() else {
        return obj;
    };
    for c in containers {
        if let Some(args) = c["args"].as_array_mut() {
            for a in args.iter_mut() {
                if let Some(s) = a.as_str().filter(|s| s.contains(&service_url())) {
                    *a = json!(s.replace(&service_url(), "://127.0.0.1"));
                }
                // Every node shares the host's network here: each binds its own node IP.
                if kind == "DaemonSet"
                    && let Some(port) = a
                        .as_str()
                        .and_then(|s| s.strip_prefix("--metrics-addr=0.0.0.0:"))
                {
                    *a = json!(format!("--metrics-addr=$(HOST_IP):{port}"));
                }
            }
        }
        let metrics_port = c["ports"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == "metrics"))
            .and_then(|p| p["containerPort"].as_u64());
        let mut env = c["env"].as_array().cloned().unwrap_or_default();
        let mut first = vec![
            json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}),
            json!({"name": "KUBERNETES_SERVICE_PORT", "value": api_port.to_string()}),
        ];
        if kind == "DaemonSet"
            && let Some(port) = metrics_port
        {
            first.push(json!({"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}));
            first
                .push(json!({"name": "KUDOS_METRICS_ADDR", "value": format!("$(HOST_IP):{port}")}));
        }
        first.append(&mut env);
        c["env"] = Value::Array(first);
    }
    obj
}

/// `charts/_out/bin/helm`, built by `charts/build-helm`.
pub fn helm_bin() -> std::path::PathBuf {
    repo_root().join("charts/_out/bin/helm")
}

/// Helm against a test cluster, as an operator runs it: `helm install`, `upgrade`, `uninstall`
/// of `charts/kudos`, with every Helm directory (config, cache, data, plugins) inside the run
/// directory, so nothing of the host's is read or written. The chart's manifests pass through
/// the post-renderer plugin `kudos-e2e-adapt` (see [`adapt`]), the only change to them.
#[derive(Debug)]
pub struct Helm {
    home: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
}

/// The release name and namespace the scenarios install.
pub const RELEASE: &str = "kudos";

impl Helm {
    /// Sets Helm up under `run_dir/helm` for the cluster of `kubeconfig`; `adapt_bin` is the
    /// `kudos-e2e-adapt` binary (`env!("CARGO_BIN_EXE_kudos-e2e-adapt")` in a test).
    pub fn new(
        run_dir: &std::path::Path,
        kubeconfig: &std::path::Path,
        adapt_bin: &std::path::Path,
        api_port: u16,
    ) -> Result<Self> {
        let home = run_dir.join("helm");
        let plugin = home.join("plugins/kudos-e2e-adapt");
        std::fs::create_dir_all(&plugin)?;
        std::fs::write(
            plugin.join("plugin.yaml"),
            format!(
                "apiVersion: v1\ntype: postrenderer/v1\nname: kudos-e2e-adapt\nversion: 0.1.0\n\
                 runtime: subprocess\nruntimeConfig:\n  platformCommand:\n    \
                 - command: {}\n      args: [--api-port, \"{api_port}\"]\n",
                adapt_bin.display()
            ),
        )?;
        Ok(Self {
            home,
            kubeconfig: kubeconfig.to_path_buf(),
        })
    }

    /// Runs `helm args...`; its stdout, or an error with its stderr.
    pub fn run(&self, args: &[String]) -> Result<String> {
        let h = &self.home;
        let out = std::process::Command::new(helm_bin())
            .current_dir(repo_root())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_PLUGINS", h.join("plugins"))
            .env("HELM_CONFIG_HOME", h.join("config"))
            .env("HELM_CACHE_HOME", h.join("cache"))
            .env("HELM_DATA_HOME", h.join("data"))
            .args(args)
            .output()
            .with_context(|| format!("run {}", helm_bin().display()))?;
        if !out.status.success() {
            bail!(
                "helm {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `helm VERB kudos charts/kudos` in kudos-system through the post-renderer, with `--set`
    /// values `set` after `extra`.
    fn release(&self, verb: &str, extra: &[&str], set: &[String]) -> Result<String> {
        let mut args: Vec<String> = [
            verb,
            RELEASE,
            "charts/kudos",
            "--namespace",
            "kudos-system",
            "--post-renderer",
            "kudos-e2e-adapt",
        ]
        .iter()
        .chain(extra)
        .map(|a| a.to_string())
        .collect();
        for s in set {
            args.extend(["--set".into(), s.clone()]);
        }
        self.run(&args)
    }

    /// `helm install kudos charts/kudos --namespace kudos-system --create-namespace` with
    /// `--set` values `set`; TLS as the chart defaults it (a self-signed CA, the extender over
    /// HTTPS with kube-scheduler's client certificate, reads behind TokenReview and RBAC).
    /// The serving certificate also names 127.0.0.1, where the API server calls the webhook.
    pub fn install(&self, set: &[String]) -> Result<String> {
        self.release(
            "install",
            &["--create-namespace", "--set", "tls.ipAddresses={127.0.0.1}"],
            set,
        )
    }

    /// `helm upgrade kudos charts/kudos --reuse-values` with `--set` values `set`.
    pub fn upgrade(&self, set: &[String]) -> Result<String> {
        self.release("upgrade", &["--reuse-values"], set)
    }

    /// `helm uninstall kudos --namespace kudos-system --wait` (its post-delete hook included).
    pub fn uninstall(&self) -> Result<String> {
        self.run(
            &[
                "uninstall",
                RELEASE,
                "--namespace",
                "kudos-system",
                "--wait",
            ]
            .map(String::from),
        )
    }
}
