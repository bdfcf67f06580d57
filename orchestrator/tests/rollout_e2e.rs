//! End to end, with the real binary: a plugin report through the gRPC RegistryService leads
//! to a derived image in a local `docker-registry` (read back with `skopeo`) and a DaemonSet
//! server-side applied on a real kube-apiserver (etcd + kube-apiserver from `e2e/_out/bin`),
//! pinned to the reporting node and running the image by digest. Skips with a message when a
//! tool is missing; `KUDOS_E2E_REQUIRE=1` turns the skip into a failure.
//!
//! Also without external tools: `--standalone --dry-run-rollout` prints the plan to stdout.

mod common;

use common::*;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kudos_proto::kudos::v1::registry_service_client::RegistryServiceClient;
use kudos_rollout::image::build_layer;
use kudos_rollout::render::affinity_nodes;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const TOKEN: &str = "kudos-rollout-e2e-token";

/// Children killed on drop, with their temporary directory.
struct Procs(Vec<Child>, #[allow(dead_code)] tempfile::TempDir);

impl Drop for Procs {
    fn drop(&mut self) {
        while let Some(mut c) = self.0.pop() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn upstream(name: &str) -> PathBuf {
    std::env::var_os("KUDOS_E2E_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/_out/bin"))
        .join(name)
}

fn runs(cmd: &str, arg: &str) -> bool {
    Command::new(cmd)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn tools_present() -> bool {
    let mut missing: Vec<String> = ["etcd", "kube-apiserver"]
        .iter()
        .map(|b| upstream(b))
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    for (tool, arg) in [
        ("docker-registry", "--version"),
        ("skopeo", "--version"),
        ("openssl", "version"),
    ] {
        if !runs(tool, arg) {
            missing.push(tool.into());
        }
    }
    if missing.is_empty() {
        return true;
    }
    let msg = format!("SKIP: missing {missing:?} (install them; run e2e/build for the binaries)");
    if std::env::var("KUDOS_E2E_REQUIRE").as_deref() == Ok("1") {
        panic!("{msg}");
    }
    eprintln!("{msg}");
    false
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn(cmd: &mut Command, log: &Path) -> Child {
    let f = std::fs::File::create(log).unwrap();
    cmd.stdout(Stdio::null()).stderr(f).spawn().unwrap()
}

fn tail(path: &Path) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// Polls `f` every 250 ms up to `tries` times (a bounded wait, not a timing assertion).
async fn eventually<T>(tries: usize, mut f: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    for _ in 0..tries {
        if let Some(v) = f().await {
            return Some(v);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

fn metric(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
}

async fn start_cluster(d: &Path, procs: &mut Vec<Child>) -> (kube::Client, PathBuf) {
    let out = Command::new("openssl")
        .args(["genrsa", "-out", "sa.key", "2048"])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(out.status.success());
    let (ec, ep, port) = (free_port(), free_port(), free_port());
    procs.push(spawn(
        Command::new(upstream("etcd")).args([
            "--name=t".to_string(),
            format!("--data-dir={}", d.join("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{ec}"),
            format!("--advertise-client-urls=http://127.0.0.1:{ec}"),
            format!("--listen-peer-urls=http://127.0.0.1:{ep}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{ep}"),
            format!("--initial-cluster=t=http://127.0.0.1:{ep}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ]),
        &d.join("etcd.log"),
    ));
    std::fs::write(
        d.join("tokens.csv"),
        format!("{TOKEN},admin,1,\"system:masters\"\n"),
    )
    .unwrap();
    let sa = d.join("sa.key").display().to_string();
    procs.push(spawn(
        Command::new(upstream("kube-apiserver")).args([
            format!("--etcd-servers=http://127.0.0.1:{ec}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", d.join("certs").display()),
            format!("--token-auth-file={}", d.join("tokens.csv").display()),
            "--authorization-mode=RBAC".into(),
            format!("--service-account-key-file={sa}"),
            format!("--service-account-signing-key-file={sa}"),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--profiling=false".into(),
        ]),
        &d.join("apiserver.log"),
    ));
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\n\
         users:\n- name: admin\n  user:\n    token: {TOKEN}\ncontexts:\n- name: t\n  context:\n    cluster: t\n    user: admin\ncurrent-context: t\n"
    );
    let path = d.join("kubeconfig");
    std::fs::write(&path, &kubeconfig).unwrap();
    let kc: Kubeconfig = serde_yaml::from_str(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let ns: Api<Namespace> = Api::all(client.clone());
    let ready = eventually(480, async || ns.get_opt("default").await.ok().flatten()).await;
    assert!(
        ready.is_some(),
        "kube-apiserver not ready:\n{}",
        tail(&d.join("apiserver.log"))
    );
    (client, path)
}

fn start_registry(d: &Path, procs: &mut Vec<Child>) -> String {
    let port = free_port();
    let config = d.join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            d.join("registry").display()
        ),
    )
    .unwrap();
    procs.push(spawn(
        Command::new("docker-registry").arg("serve").arg(&config),
        &d.join("registry.log"),
    ));
    let addr = format!("127.0.0.1:{port}");
    for _ in 0..400 {
        if std::net::TcpStream::connect(&addr).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    addr
}

/// Pushes a minimal base plugin image (one layer with a script).
async fn push_base(addr: &str) -> String {
    let reference = format!("{addr}/kudos/device-plugin:base");
    let files = BTreeMap::from([(
        "kudos-device-plugin".to_string(),
        b"#!/bin/sh\necho plugin\n".to_vec(),
    )]);
    let layer = build_layer(&files).unwrap();
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin"], "Entrypoint": ["/kudos-device-plugin"]},
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id]},
        "history": [{"created_by": "test base"}],
    });
    let client = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..ClientConfig::default()
    });
    client
        .push(
            &reference.parse().unwrap(),
            &[ImageLayer::oci_v1_gzip(layer.compressed.clone(), None)],
            Config::oci_v1(serde_json::to_vec(&config).unwrap(), None),
            &RegistryAuth::Anonymous,
            None,
        )
        .await
        .unwrap();
    reference
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_report_leads_to_derived_image_and_applied_daemonset() {
    if !tools_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let mut children = Vec::new();
    let registry = start_registry(&d, &mut children);
    let (client, kubeconfig) = start_cluster(&d, &mut children).await;
    let procs = Procs(children, dir);
    let base = push_base(&registry).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut ns = Namespace::default();
    ns.metadata.name = Some("kudos-system".into());
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();

    let (hp, gp) = (free_port(), free_port());
    std::fs::write(d.join("node-tokens.yaml"), "t-gpu-1: gpu-node-1\n").unwrap();
    std::fs::write(
        d.join("config.yaml"),
        format!(
            "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\n\
             listen: {{http: 127.0.0.1:{hp}, grpc: 127.0.0.1:{gp}}}\n\
             store: {{kind: file, path: {store}}}\n\
             auth: {{mode: static, staticTokensFile: {tokens}}}\n\
             rollout:\n  enabled: true\n  baseImage: {base}\n  repository: {registry}/kudos/device-plugin-derived\n  plainHttp: loopback\n  daemonSet: {{namespace: kudos-system}}\n",
            store = d.join("state.redb").display(),
            tokens = d.join("node-tokens.yaml").display(),
        ),
    )
    .unwrap();
    let log = d.join("orchestrator.log");
    let mut procs = procs;
    procs.0.push(spawn(
        Command::new(env!("CARGO_BIN_EXE_kudos-orchestrator"))
            .arg(format!("--config={}", d.join("config.yaml").display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .env("KUDOS_LOG", "info,kudos_rollout=debug"),
        &log,
    ));
    let http = format!("127.0.0.1:{hp}");
    let ready = eventually(240, async || {
        (http_get(&http, "/readyz")?.0 == 200).then_some(())
    })
    .await;
    assert!(ready.is_some(), "orchestrator not ready:\n{}", tail(&log));

    // The device plugin on gpu-node-1 reports through the real RegistryService.
    let mut grpc = RegistryServiceClient::connect(format!("http://127.0.0.1:{gp}"))
        .await
        .unwrap();
    let answer = grpc
        .report_plugin(with_token(plugin("gpu-node-1", 2, true), Some("t-gpu-1")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (answer.unified_resource_name.as_str(), answer.generation),
        (UNIFIED, 1)
    );

    // A DaemonSet appears on the API server, pinned to the node, running the image by digest.
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), "kudos-system");
    let ds = eventually(480, async || {
        dss.get_opt("kudos-device-plugin-nvidia")
            .await
            .ok()
            .flatten()
    })
    .await
    .unwrap_or_else(|| panic!("no DaemonSet applied:\n{}", tail(&log)));
    assert_eq!(affinity_nodes(&ds), ["gpu-node-1"]);
    let image = ds
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .image
        .clone()
        .unwrap();
    let prefix = format!("{registry}/kudos/device-plugin-derived@sha256:");
    assert!(image.starts_with(&prefix), "{image}");
    let digest = image.rsplit_once('@').unwrap().1.to_owned();

    // The registry holds that image: read back with skopeo under the tag of generation 1.
    let out = Command::new("skopeo")
        .args([
            "inspect",
            "--tls-verify=false",
            &format!("docker://{registry}/kudos/device-plugin-derived:nvidia-g1"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inspected: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(inspected["Digest"], digest.as_str());
    let env = inspected["Env"].to_string();
    assert!(env.contains("KUDOS_RESOURCE_NAME=kudos.dev/gpu"), "{env}");

    // The image is recorded (persisted) in the plugin configuration, one generation later.
    let state: Value = serde_json::from_str(&http_get(&http, "/state").unwrap().1).unwrap();
    let cfg = &state["pluginConfig"];
    assert_eq!(cfg["images"]["nvidia"]["digest"], digest.as_str());
    assert_eq!(cfg["images"]["nvidia"]["generation"], 1);
    assert_eq!(cfg["generation"], 2);
    // Node monitoring saw the configured node (no Node object in this cluster).
    let state = eventually(480, async || {
        let s: Value = serde_json::from_str(&http_get(&http, "/state")?.1).ok()?;
        s["nodeMonitor"]["nodes"][0].is_object().then_some(s)
    })
    .await
    .expect("a monitoring pass");
    let mon = &state["nodeMonitor"]["nodes"][0];
    assert_eq!(mon["node"], "gpu-node-1");
    assert_eq!(mon["excludeFromRanking"], true);

    // The pass triggered by the recording applies again and derives nothing new.
    let applies =
        "kudos_orchestrator_rollout_daemonset_applies_total{group=\"nvidia\",outcome=\"Success\"}";
    let pushes =
        "kudos_orchestrator_rollout_image_pushes_total{group=\"nvidia\",outcome=\"Success\"}";
    let text = eventually(480, async || {
        let text = http_get(&http, "/metrics")?.1;
        (metric(&text, applies)? >= 2.0).then_some(text)
    })
    .await
    .unwrap_or_else(|| panic!("no second apply:\n{}", tail(&log)));
    assert_eq!(metric(&text, pushes), Some(1.0), "{text}");
    promtool_check(&text);
    let again = dss.get("kudos-device-plugin-nvidia").await.unwrap();
    assert_eq!(
        again.metadata.resource_version, ds.metadata.resource_version,
        "the second apply wrote nothing"
    );
    drop(procs);
}

#[tokio::test]
async fn standalone_dry_run_prints_the_plan_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("tokens.yaml"), "t-n1: n1\n").unwrap();
    let (hp, gp) = (free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_kudos-orchestrator"))
        .args([
            "--standalone",
            "--dry-run-rollout",
            &format!("--http-listen=127.0.0.1:{hp}"),
            &format!("--grpc-listen=127.0.0.1:{gp}"),
            &format!("--store-path={}", d.join("state.redb").display()),
            "--auth=static",
            &format!("--static-tokens-file={}", d.join("tokens.yaml").display()),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut grpc = None;
    for _ in 0..200 {
        if let Ok(c) = RegistryServiceClient::connect(format!("http://127.0.0.1:{gp}")).await {
            grpc = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut grpc = grpc.expect("gRPC up");
    grpc.report_plugin(with_token(plugin("n1", 1, true), Some("t-n1")))
        .await
        .unwrap();
    // Bounded wait for the line (not a timing assertion).
    let found = tokio::task::spawn_blocking(move || {
        while let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) {
            if line.contains("# group nvidia: no derived image yet") {
                return true;
            }
        }
        false
    })
    .await
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(found, "no dry-run plan on stdout");
}

/// `promtool check metrics` over populated rollout and node-monitoring metrics.
fn promtool_check(text: &str) {
    if let Some(report) = kudos_common::promtool_check_metrics(text).expect("promtool") {
        assert!(report.success, "promtool: {}", report.output);
    }
}
