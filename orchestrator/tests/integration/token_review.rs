//! gRPC callers authenticated by a real kube-apiserver's TokenReview: a pod-bound
//! service-account token of a pod on node `n1` may report for `n1` only; a forged token or
//! none is refused. etcd + kube-apiserver from `e2e/_out/bin`, run by `kudos-testkit`; skips
//! with a message when they are missing (`KUDOS_E2E_REQUIRE=1` makes that a failure).

use crate::common::*;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use kudos_proto::kudos::v1 as pb;
use kudos_testkit::nodes::{NodeShape, create_nodes};
use kudos_testkit::orchestrator::{Orchestrator, OrchestratorOptions};
use kudos_testkit::{ControlPlane, ControlPlaneOptions};
use pb::registry_service_client::RegistryServiceClient;
use pb::telemetry_service_client::TelemetryServiceClient;
use serde_json::json;
use tonic::Code;

/// A token of service account `agent` bound to pod `agent-n1` on node `n1`, as the kubelet
/// projects it into the node agent's pod.
async fn pod_bound_token(client: &kube::Client) -> anyhow::Result<String> {
    let shapes = ["n1", "n2"].map(|n| NodeShape {
        name: n.into(),
        cpu_milli: 8_000,
        memory_mib: 32_768,
        gpu: 4,
        model: "T4".into(),
    });
    create_nodes(client, &shapes, UNIFIED).await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let sa = serde_json::from_value(json!({"metadata": {"name": "agent"}}))?;
    sas.create(&PostParams::default(), &sa).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "agent-n1"},
        "spec": {"serviceAccountName": "agent", "nodeName": "n1",
                 "containers": [{"name": "agent", "image": "kudos-node-agent"}]},
    }))?;
    let pod: Pod = pods.create(&PostParams::default(), &pod).await?;
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some("agent-n1".into()),
                uid: pod.metadata.uid,
            }),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let answer = sas
        .create_token_request("agent", &PostParams::default(), &request)
        .await?;
    Ok(answer.status.map(|s| s.token).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_review_binds_callers_to_their_node() -> anyhow::Result<()> {
    let opts = ControlPlaneOptions::default();
    let Some((run, cp)) = ControlPlane::for_test("orchestrator-token-review", opts, &[]).await?
    else {
        return Ok(());
    };
    let token = pod_bound_token(&cp.client).await?;
    let orch = Orchestrator::start_with(
        run.path(),
        &OrchestratorOptions {
            bin: env!("CARGO_BIN_EXE_kudos-orchestrator").into(),
            kubeconfig: Some(cp.kubeconfig.clone()),
            static_token_nodes: None,
            extra: Vec::new(),
            ..OrchestratorOptions::default()
        },
    )
    .await?;
    let addr = format!("http://{}", orch.grpc_addr);
    let mut reg = RegistryServiceClient::connect(addr.clone()).await.unwrap();
    let r = reg
        .report_plugin(with_token(plugin("n1", 4, true), Some(&token)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.unified_resource_name, UNIFIED);
    // Another node's report, a forged token, no token.
    for (node, bearer, code) in [
        ("n2", Some(token.as_str()), Code::PermissionDenied),
        ("n1", Some("forged"), Code::Unauthenticated),
        ("n1", None, Code::Unauthenticated),
    ] {
        let refused = reg
            .report_plugin(with_token(plugin(node, 4, true), bearer))
            .await;
        let e = refused.expect_err("refused");
        assert_eq!(e.code(), code, "{node}, {bearer:?}: {e}");
    }

    let mut tel = TelemetryServiceClient::connect(addr).await.unwrap();
    let hb = pb::HeartbeatRequest {
        node: "n1".into(),
        ..Default::default()
    };
    tel.heartbeat(with_token(hb, Some(&token))).await.unwrap();
    let id = format!("smoke-{}", std::process::id());
    let stream = tokio_stream::iter(vec![report(&id, "n1", pb::RunState::Completed, "resnet50")]);
    let mut acks = tel
        .report_runs(with_token(stream, Some(&token)))
        .await
        .unwrap()
        .into_inner();
    let ack = acks.message().await.unwrap().unwrap();
    assert_eq!(ack.status, pb::AckStatus::Accepted as i32, "{ack:?}");
    run.pass();
    Ok(())
}
