//! End to end, with the real binary: a plugin report through the gRPC RegistryService leads
//! to a derived image in a local `docker-registry` (read back with `skopeo`) and a DaemonSet
//! server-side applied on a real kube-apiserver (etcd + kube-apiserver from `e2e/_out/bin`),
//! pinned to the reporting node and running the image by digest. Skips with a message when a
//! tool is missing; `KUDOS_E2E_REQUIRE=1` turns the skip into a failure.
//!
//! Also without external tools: `--standalone --dry-run-rollout` prints the plan to stdout.

use crate::common::*;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kudos_proto::kudos::v1::registry_service_client::RegistryServiceClient;
use kudos_rollout::render::affinity_nodes;
use kudos_testkit::orchestrator::{Orchestrator, OrchestratorOptions, node_token};
use kudos_testkit::proc::{free_port, tail, wait_for};
use kudos_testkit::registry::{self, Registry};
use kudos_testkit::{ControlPlane, ControlPlaneOptions, RunDir, http};
use std::time::Duration;

/// The binary under test with `kubeconfig` (or standalone), a static token for `node`.
fn options(
    kubeconfig: Option<&std::path::Path>,
    node: &str,
    extra: &[String],
) -> OrchestratorOptions {
    OrchestratorOptions {
        bin: env!("CARGO_BIN_EXE_kudos-orchestrator").into(),
        kubeconfig: kubeconfig.map(Into::into),
        static_token_nodes: Some(vec![node.into()]),
        extra: extra.to_vec(),
        ..OrchestratorOptions::default()
    }
}

/// Waits up to two minutes, polling every 250 ms (a bounded wait, not a timing assertion).
async fn eventually<T>(what: &str, orch: &Orchestrator, f: impl AsyncFnMut() -> Option<T>) -> T {
    let waited = wait_for(
        what,
        Duration::from_secs(120),
        Duration::from_millis(250),
        f,
    )
    .await;
    waited.unwrap_or_else(|e| panic!("{e}; orchestrator log:\n{}", tail(orch.log(), 40)))
}

fn get_text(addr: &str, path: &str) -> Option<String> {
    let r = http::request("GET", addr, path, None).ok()?;
    Some(String::from_utf8_lossy(&r.body).into_owned())
}

fn metric(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_report_leads_to_derived_image_and_applied_daemonset() -> anyhow::Result<()> {
    let opts = ControlPlaneOptions::default();
    let Some((run, cp)) =
        ControlPlane::for_test("orchestrator-rollout", opts, &registry::bins()).await?
    else {
        return Ok(());
    };
    let reg = Registry::start(run.path(), free_port()).await?;
    let registry = reg.addr.clone();
    let client = cp.client.clone();
    let base = reg.push_plugin_base().await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut ns = Namespace::default();
    ns.metadata.name = Some("kudos-system".into());
    namespaces.create(&PostParams::default(), &ns).await?;

    let config = run.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\n\
             rollout:\n  enabled: true\n  baseImage: {base}\n  repository: {registry}/kudos/device-plugin-derived\n  plainHttp: loopback\n  daemonSet: {{namespace: kudos-system}}\n",
        ),
    )?;
    let extra = [
        format!("--config={}", config.display()),
        "--log-level=info,kudos_rollout=debug".into(),
    ];
    let opts = options(Some(&cp.kubeconfig), "gpu-node-1", &extra);
    let orch = Orchestrator::start_with(run.path(), &opts).await?;
    let http = orch.http_addr.clone();

    // The device plugin on gpu-node-1 reports through the real RegistryService.
    let mut grpc = RegistryServiceClient::connect(format!("http://{}", orch.grpc_addr)).await?;
    let token = node_token("gpu-node-1");
    let answer = grpc
        .report_plugin(with_token(plugin("gpu-node-1", 2, true), Some(&token)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (answer.unified_resource_name.as_str(), answer.generation),
        (UNIFIED, 1)
    );

    // A DaemonSet appears on the API server, pinned to the node, running the image by digest.
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), "kudos-system");
    let ds = eventually("an applied DaemonSet", &orch, async || {
        dss.get_opt("kudos-device-plugin-nvidia").await.ok()?
    })
    .await;
    assert_eq!(affinity_nodes(&ds), ["gpu-node-1"]);
    let template = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref());
    let image = template.expect("a pod template").containers[0]
        .image
        .clone()
        .unwrap_or_default();
    let prefix = format!("{registry}/kudos/device-plugin-derived@sha256:");
    assert!(image.starts_with(&prefix), "{image}");
    let digest = image.rsplit_once('@').unwrap().1.to_owned();

    // The registry holds that image: read back with skopeo under the tag of generation 1.
    let inspected = registry::inspect(
        &format!("{registry}/kudos/device-plugin-derived:nvidia-g1"),
        &[],
    )?;
    assert_eq!(inspected["Digest"], digest.as_str());
    let env = inspected["Env"].to_string();
    assert!(env.contains("KUDOS_RESOURCE_NAME=kudos.dev/gpu"), "{env}");

    // The image is recorded (persisted) in the plugin configuration, one generation later.
    let state = http::get_json(&http, "/state")?;
    let cfg = &state["pluginConfig"];
    assert_eq!(cfg["images"]["nvidia"]["digest"], digest.as_str());
    assert_eq!(cfg["images"]["nvidia"]["generation"], 1);
    assert_eq!(cfg["generation"], 2);
    // Node monitoring saw the configured node (no Node object in this cluster).
    let state = eventually("a monitoring pass", &orch, async || {
        let s = http::get_json(&http, "/state").ok()?;
        s["nodeMonitor"]["nodes"][0].is_object().then_some(s)
    })
    .await;
    let mon = &state["nodeMonitor"]["nodes"][0];
    assert_eq!(mon["node"], "gpu-node-1");
    assert_eq!(mon["excludeFromRanking"], true);

    // The pass triggered by the recording applies again and derives nothing new.
    let applies =
        "kudos_orchestrator_rollout_daemonset_applies_total{group=\"nvidia\",outcome=\"Success\"}";
    let pushes =
        "kudos_orchestrator_rollout_image_pushes_total{group=\"nvidia\",outcome=\"Success\"}";
    let text = eventually("a second apply", &orch, async || {
        let text = get_text(&http, "/metrics")?;
        (metric(&text, applies)? >= 2.0).then_some(text)
    })
    .await;
    assert_eq!(metric(&text, pushes), Some(1.0), "{text}");
    if let Some(report) = kudos_testkit::promtool_check_metrics(&text)? {
        assert!(report.success, "promtool: {}", report.output);
    }
    let again = dss.get("kudos-device-plugin-nvidia").await.unwrap();
    assert_eq!(
        again.metadata.resource_version, ds.metadata.resource_version,
        "the second apply wrote nothing"
    );

    // `kudos-orchestrator uninstall` (the chart's post-delete hook) removes what the
    // orchestrator created: the plugin DaemonSet, node labels, on request the state ConfigMap.
    drop(orch);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let node = serde_json::from_value(serde_json::json!({"metadata": {
        "name": "gpu-node-1", "labels": {"kudos.dev/plugin-group": "nvidia", "keep": "me"}}}))?;
    nodes.create(&PostParams::default(), &node).await?;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "kudos-system");
    let state_cm = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "kudos-orchestrator-state"}}),
    )?;
    cms.create(&PostParams::default(), &state_cm).await?;
    // The state's other objects carry its name as a label; an unrelated ConfigMap stays.
    for (name, labels) in [
        (
            "kudos-orchestrator-state-runs-1",
            serde_json::json!({"kudos.dev/store": "kudos-orchestrator-state"}),
        ),
        ("someone-elses", serde_json::json!({"app": "other"})),
    ] {
        let cm = serde_json::from_value(
            serde_json::json!({"metadata": {"name": name, "labels": labels}}),
        )?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    for _ in 0..2 {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kudos-orchestrator"))
            .arg("uninstall")
            .arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
            .args([
                "--namespace=kudos-system",
                "--delete-state-configmap=kudos-orchestrator-state",
                "--timeout=30s",
            ])
            .output()?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(dss.get_opt("kudos-device-plugin-nvidia").await?.is_none());
    let labels = nodes
        .get("gpu-node-1")
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(labels.get("kudos.dev/plugin-group"), None);
    assert_eq!(labels.get("keep").map(String::as_str), Some("me"));
    assert!(cms.get_opt("kudos-orchestrator-state").await?.is_none());
    assert!(
        cms.get_opt("kudos-orchestrator-state-runs-1")
            .await?
            .is_none()
    );
    assert!(cms.get_opt("someone-elses").await?.is_some());
    run.pass();
    Ok(())
}

#[tokio::test]
async fn standalone_dry_run_prints_the_plan_to_stdout() -> anyhow::Result<()> {
    let run = RunDir::new("orchestrator-dry-run")?;
    let orch = Orchestrator::start_with(
        run.path(),
        &options(None, "n1", &["--dry-run-rollout".into()]),
    )
    .await?;
    let mut grpc = RegistryServiceClient::connect(format!("http://{}", orch.grpc_addr)).await?;
    grpc.report_plugin(with_token(plugin("n1", 1, true), Some(&node_token("n1"))))
        .await?;
    // Stdout and stderr share the log; a line that starts with the plan (log lines start with
    // a time stamp) is what went to stdout.
    eventually("the dry-run plan on stdout", &orch, async || {
        let log = std::fs::read_to_string(orch.log()).ok()?;
        let plan = "# group nvidia: no derived image yet";
        log.lines().any(|l| l.starts_with(plan)).then_some(())
    })
    .await;
    run.pass();
    Ok(())
}
