//! Cluster tier (ignored by default): gRPC ingestion against an orchestrator that checks
//! tokens with a real kube-apiserver's TokenReview. `orchestrator/scripts/cluster-smoke.sh`
//! starts etcd, kube-apiserver and the orchestrator, mints a pod-bound service-account token
//! for a pod on node `n1`, and runs this with:
//! `KUDOS_SMOKE_GRPC=http://127.0.0.1:28889 KUDOS_SMOKE_TOKEN=<token>
//!  cargo test -p kudos-orchestrator --test cluster_smoke -- --ignored`

mod common;

use common::*;
use kudos_proto::kudos::v1 as pb;
use pb::registry_service_client::RegistryServiceClient;
use pb::telemetry_service_client::TelemetryServiceClient;
use tonic::Code;

#[tokio::test]
#[ignore = "needs a running kube-apiserver and orchestrator (scripts/cluster-smoke.sh)"]
async fn token_review_binds_callers_to_their_node() {
    let (Ok(addr), Ok(token)) = (
        std::env::var("KUDOS_SMOKE_GRPC"),
        std::env::var("KUDOS_SMOKE_TOKEN"),
    ) else {
        panic!("set KUDOS_SMOKE_GRPC and KUDOS_SMOKE_TOKEN");
    };
    let token = token.trim().to_owned();
    let mut reg = RegistryServiceClient::connect(addr.clone()).await.unwrap();
    let r = reg
        .report_plugin(with_token(plugin("n1", 4, true), Some(&token)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.unified_resource_name, UNIFIED);
    let e = reg
        .report_plugin(with_token(plugin("n2", 4, true), Some(&token)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");
    let e = reg
        .report_plugin(with_token(plugin("n1", 4, true), Some("forged")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    let e = reg
        .report_plugin(with_token(plugin("n1", 4, true), None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");

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
}
