//! `kubectl get kudosnodes` and `kubectl get kudosclasses` against a real kube-apiserver: the
//! chart's CRDs (rendered by Helm), the real binary publishing what its plugin reports and
//! run reports taught it, read back as the Table kubectl prints (the printer columns), and a
//! deleted node's object pruned. Skips with a message when etcd, kube-apiserver or Helm are
//! missing; `KUDOS_E2E_REQUIRE=1` turns the skip into a failure.

use crate::common::*;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, PostParams};
use kudos_proto::kudos::v1 as pb;
use kudos_testkit::nodes::{NodeShape, create_nodes};
use kudos_testkit::orchestrator::{Orchestrator, OrchestratorOptions, node_token};
use kudos_testkit::proc::{tail, wait_for};
use kudos_testkit::{ControlPlane, ControlPlaneOptions};
use std::path::PathBuf;
use std::time::Duration;

fn helm() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/_out/bin/helm")
}

/// The chart's CRDs, as `helm template` renders them.
fn chart_crds() -> anyhow::Result<Vec<CustomResourceDefinition>> {
    let out = std::process::Command::new(helm())
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .args([
            "template",
            "kudos",
            "charts/kudos",
            "--show-only",
            "templates/crds.yaml",
        ])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut crds = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc)?;
        if !v.is_null() {
            crds.push(serde_json::from_value(v)?);
        }
    }
    Ok(crds)
}

/// `kubectl get <plural>` as kubectl asks for it: a meta.k8s.io Table. (column names, rows).
async fn table(
    client: &kube::Client,
    plural: &str,
) -> anyhow::Result<(Vec<String>, Vec<Vec<serde_json::Value>>)> {
    let req = http::Request::get(format!("/apis/kudos.dev/v1alpha1/{plural}"))
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())?;
    let t: serde_json::Value = serde_json::from_str(&client.request_text(req).await?)?;
    let cols = t["columnDefinitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect();
    let rows = t["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["cells"].as_array().cloned())
        .collect();
    Ok((cols, rows))
}

fn plugin_of(node: &str, model: &str) -> pb::ReportPluginRequest {
    let mut p = plugin(node, 4, true);
    for d in &mut p.devices {
        d.model = model.into();
        d.id = format!("{node}-{}", d.id);
    }
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_shows_nodes_and_what_each_class_learned() -> anyhow::Result<()> {
    let opts = ControlPlaneOptions::default();
    let Some((run, cp)) =
        ControlPlane::for_test("orchestrator-kubectl-state", opts, &[helm()]).await?
    else {
        return Ok(());
    };
    let crd_api: Api<CustomResourceDefinition> = Api::all(cp.client.clone());
    for crd in chart_crds()? {
        crd_api.create(&PostParams::default(), &crd).await?;
    }
    let shapes = ["t4-node", "v100-node"].map(|n| NodeShape {
        name: n.into(),
        cpu_milli: 8_000,
        memory_mib: 32_768,
        gpu: 4,
        model: "T4".into(),
    });
    create_nodes(&cp.client, &shapes, UNIFIED).await?;
    let config = run.path().join("orchestrator.yaml");
    std::fs::write(
        &config,
        "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\npublish:\n  enabled: true\n  intervalSeconds: 0.5\n",
    )?;
    let orch = Orchestrator::start_with(
        run.path(),
        &OrchestratorOptions {
            bin: env!("CARGO_BIN_EXE_kudos-orchestrator").into(),
            kubeconfig: Some(cp.kubeconfig.clone()),
            static_token_nodes: Some(vec!["t4-node".into(), "v100-node".into()]),
            extra: vec![format!("--config={}", config.display())],
            ..OrchestratorOptions::default()
        },
    )
    .await?;
    let addr = format!("http://{}", orch.grpc_addr);
    let mut reg = pb::registry_service_client::RegistryServiceClient::connect(addr.clone()).await?;
    for (node, model) in [
        ("t4-node", "Tesla T4"),
        ("v100-node", "Tesla V100-SXM2-16GB"),
    ] {
        reg.report_plugin(with_token(plugin_of(node, model), Some(&node_token(node))))
            .await?;
    }
    let mut tel = pb::telemetry_service_client::TelemetryServiceClient::connect(addr).await?;
    let reports: Vec<pb::RunReport> = (0..3)
        .map(|i| {
            let mut r = report(
                &format!("r{i}"),
                "t4-node",
                pb::RunState::Completed,
                "ResNet_50",
            );
            r.device_ids = vec!["t4-node-nv-GPU-0".into()];
            r
        })
        .collect();
    let mut acks = tel
        .report_runs(with_token(
            tokio_stream::iter(reports),
            Some(&node_token("t4-node")),
        ))
        .await?
        .into_inner();
    for _ in 0..3 {
        acks.message().await?;
    }

    let wait = |what: &'static str| {
        let client = cp.client.clone();
        let log = orch.log().to_path_buf();
        async move |plural: &'static str, want: &dyn Fn(&[Vec<serde_json::Value>]) -> bool| {
            let mut last = (Vec::new(), Vec::new());
            let r = wait_for(
                what,
                Duration::from_secs(60),
                Duration::from_millis(250),
                async || {
                    last = table(&client, plural).await.ok()?;
                    want(&last.1).then_some(())
                },
            )
            .await;
            assert!(r.is_ok(), "{what}: last table {last:?}\n{}", tail(&log, 30));
            last
        }
    };
    let (cols, rows) = wait("both nodes listed")("kudosnodes", &|rows| rows.len() == 2).await;
    eprintln!("RESULT kubectl get kudosnodes: {cols:?} {rows:?}");
    assert_eq!(
        cols,
        [
            "Name", "Vendor", "Model", "Devices", "Free", "Health", "Age"
        ]
    );
    let t4 = rows
        .iter()
        .find(|r| r[0] == "t4-node")
        .expect("t4-node row");
    assert_eq!(t4[2], "Tesla T4");
    assert_eq!(t4[3], 4);
    assert_eq!(t4[5], "Healthy");

    let (cols, rows) = wait("the class listed with its runs")("kudosclasses", &|rows| {
        rows.iter().any(|r| r[2] == 3)
    })
    .await;
    eprintln!("RESULT kubectl get kudosclasses: {cols:?} {rows:?}");
    assert_eq!(
        cols,
        [
            "Name",
            "Class",
            "Runs",
            "Fastest",
            "Seconds/Unit",
            "Next",
            "Age"
        ]
    );
    let row = &rows[0];
    assert!(
        row[0].as_str().is_some_and(|n| n.starts_with("resnet-50-")),
        "{row:?}"
    );
    assert_eq!(row[1], "ResNet_50", "the class as labelled");
    assert!(row[3].is_string() && row[4].is_number(), "{row:?}");

    // A deleted node's object goes.
    Api::<Node>::all(cp.client.clone())
        .delete("v100-node", &DeleteParams::default())
        .await?;
    wait("the deleted node pruned")("kudosnodes", &|rows| {
        rows.len() == 1 && rows[0][0] == "t4-node"
    })
    .await;
    run.pass();
    Ok(())
}
