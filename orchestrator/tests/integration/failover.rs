//! High availability against a real kube-apiserver: two replicas of the real binary with
//! leader election and the ConfigMap store, each with a Pod object of its own (as the
//! downward API names it). The leader serves and labels its pod `kudos.dev/role=leader` (what
//! the chart's Service selects); the standby answers only its probes and serves no gRPC. After `kill -9` of the leader the standby takes over with every report the old
//! leader acknowledged (sent again, each is a DUPLICATE); after a SIGTERM the next standby
//! takes over without waiting for the Lease to expire. Skips with a message when etcd or
//! kube-apiserver are missing; `KUDOS_E2E_REQUIRE=1` turns the skip into a failure.

use crate::common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kudos_proto::kudos::v1 as pb;
use kudos_testkit::orchestrator::{Orchestrator, OrchestratorOptions, node_token};
use kudos_testkit::proc::tail;
use kudos_testkit::{ControlPlane, ControlPlaneOptions, RunDir};
use std::path::Path;
use std::time::{Duration, Instant};

const NODE: &str = "gpu-node";
const REPORTS: usize = 20;

/// A replica named `name`: its own run directory and a Pod object for its label.
async fn replica(
    run: &RunDir,
    pods: &Api<Pod>,
    name: &str,
    kubeconfig: &Path,
    config: &Path,
) -> anyhow::Result<(std::path::PathBuf, OrchestratorOptions)> {
    let dir = run.path().join(name);
    std::fs::create_dir_all(&dir)?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "kudos-orchestrator"}},
        "spec": {"containers": [{"name": "orchestrator", "image": "kudos/kudos-orchestrator"}]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let opts = OrchestratorOptions {
        bin: env!("CARGO_BIN_EXE_kudos-orchestrator").into(),
        kubeconfig: Some(kubeconfig.to_path_buf()),
        static_token_nodes: Some(vec![NODE.into()]),
        extra: vec![
            format!("--config={}", config.display()),
            "--leader-elect".into(),
        ],
        env: vec![
            ("POD_NAME".into(), name.into()),
            ("POD_NAMESPACE".into(), "default".into()),
        ],
    };
    Ok((dir, opts))
}

/// The pods the chart's Service would select: those labelled leader.
async fn labelled_leaders(pods: &Api<Pod>) -> Vec<String> {
    let lp = ListParams::default().labels("kudos.dev/role=leader");
    let mut names: Vec<String> = pods
        .list(&lp)
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Sends the reports on one stream; the acknowledgement status of each.
async fn send(orch: &Orchestrator, reports: &[pb::RunReport]) -> anyhow::Result<Vec<i32>> {
    let addr = format!("http://{}", orch.grpc_addr);
    let mut tel = pb::telemetry_service_client::TelemetryServiceClient::connect(addr).await?;
    let mut acks = tel
        .report_runs(with_token(
            tokio_stream::iter(reports.to_vec()),
            Some(&node_token(NODE)),
        ))
        .await?
        .into_inner();
    let mut out = Vec::new();
    for _ in reports {
        let Some(ack) = acks.message().await? else {
            break;
        };
        out.push(ack.status);
    }
    Ok(out)
}

async fn holder(leases: &Api<Lease>) -> String {
    leases
        .get("kudos-orchestrator")
        .await
        .ok()
        .and_then(|l| l.spec?.holder_identity)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_with_every_acknowledged_report() -> anyhow::Result<()> {
    let opts = ControlPlaneOptions::default();
    let bins = opts.bins();
    let Some(run) = RunDir::for_test("orchestrator-failover", &bins)? else {
        return Ok(());
    };
    let cp = ControlPlane::start(&run, opts).await?;
    let config = run.path().join("orchestrator.yaml");
    // Short timings so the test is quick (the defaults, 10 / 7 / 2 s, with
    // KUDOS_FAILOVER_DEFAULT_TIMINGS=1); the renew deadline still leaves a loaded CI machine
    // room, since a leader that misses it steps down and this test would fail.
    let timings = match std::env::var_os("KUDOS_FAILOVER_DEFAULT_TIMINGS") {
        Some(_) => "leaderElection: {}\n",
        None => {
            "leaderElection:\n  leaseDurationSeconds: 6\n  renewDeadlineSeconds: 4\n  retryPeriodSeconds: 0.5\n"
        }
    };
    std::fs::write(
        &config,
        format!(
            "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\n\
             store:\n  kind: configMap\n  namespace: default\n  name: kudos-state\n  snapshotIntervalSeconds: 1\n{timings}"
        ),
    )?;
    let leases: Api<Lease> = Api::namespaced(cp.client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");

    let (dir, opts) = replica(&run, &pods, "a", &cp.kubeconfig, &config).await?;
    let mut a = Orchestrator::start_with(&dir, &opts).await?;
    let (dir, opts) = replica(&run, &pods, "b", &cp.kubeconfig, &config).await?;
    let mut b = Orchestrator::start_standby(&dir, &opts).await?;
    let (status, body) = b.readyz()?;
    assert_eq!(status, 200, "a standby is healthy spare capacity: {body}");
    assert!(body.contains("standby") && body.contains("leads"), "{body}");
    assert!(
        std::net::TcpStream::connect(&b.grpc_addr).is_err(),
        "the standby serves no gRPC"
    );
    let leader = holder(&leases).await;
    assert!(
        leader.contains(&format!("_{}_", a.pid())),
        "Lease holder {leader:?}"
    );
    assert_eq!(labelled_leaders(&pods).await, ["a"]);

    let reports: Vec<pb::RunReport> = (0..REPORTS)
        .map(|i| report(&format!("r{i}"), NODE, pb::RunState::Completed, "resnet50"))
        .collect();
    let acked = send(&a, &reports).await?;
    assert_eq!(
        acked,
        vec![pb::AckStatus::Accepted as i32; REPORTS],
        "the leader acknowledges every report"
    );

    // A crash: the Lease is not released; b takes over once it has seen it unchanged for
    // leaseDurationSeconds.
    a.kill();
    let killed = Instant::now();
    let r = b.wait_ready(Duration::from_secs(60)).await;
    assert!(r.is_ok(), "{r:?}\n{}", tail(b.log(), 30));
    let crash_failover = killed.elapsed();
    assert!(holder(&leases).await.contains(&format!("_{}_", b.pid())));
    // a was killed and could not clear its label; in a cluster its restarted container does
    // (and a dead container is not ready, so the Service skips it meanwhile).
    assert_eq!(labelled_leaders(&pods).await, ["a", "b"]);
    let again = send(&b, &reports).await?;
    assert_eq!(
        again,
        vec![pb::AckStatus::Duplicate as i32; REPORTS],
        "every report the old leader acknowledged is in the new leader's store"
    );
    let fresh = report("r-after", NODE, pb::RunState::Completed, "resnet50");
    assert_eq!(send(&b, &[fresh]).await?, [pb::AckStatus::Accepted as i32]);

    // An orderly stop (an upgrade): b releases the Lease and c takes over at its next try.
    let (dir, opts) = replica(&run, &pods, "c", &cp.kubeconfig, &config).await?;
    let mut c = Orchestrator::start_standby(&dir, &opts).await?;
    assert!(c.readyz()?.1.contains("standby"));
    let stopped = Instant::now();
    let exit = b.stop();
    assert!(
        exit.is_some_and(|e| e.success()),
        "b exits cleanly on SIGTERM: {exit:?}\n{}",
        tail(b.log(), 30)
    );
    let r = c.wait_ready(Duration::from_secs(60)).await;
    assert!(r.is_ok(), "{r:?}\n{}", tail(c.log(), 30));
    let handover = stopped.elapsed();
    let leaders = labelled_leaders(&pods).await;
    assert!(
        leaders.contains(&"c".to_owned()) && !leaders.contains(&"b".to_owned()),
        "b removed its label on the way out, c labelled itself: {leaders:?}"
    );
    let again = send(&c, &reports).await?;
    assert!(
        again.iter().all(|s| *s == pb::AckStatus::Duplicate as i32),
        "{again:?}"
    );
    eprintln!(
        "RESULT failover after kill -9: {:.1} s ({timings:?}); after SIGTERM: {:.1} s (including b's drain); {REPORTS} acknowledged reports, 0 lost",
        crash_failover.as_secs_f64(),
        handover.as_secs_f64()
    );
    c.stop();
    run.pass();
    Ok(())
}
