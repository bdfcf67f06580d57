//! High availability against a real kube-apiserver: replicas of the real binary with leader
//! election and the ConfigMap store, each with a Pod object of its own (as the downward API
//! names it). The leader serves gRPC, writes the store and labels its pod
//! `kudos.dev/role=leader` (what the chart's gRPC Service selects); the follower serves no
//! gRPC but answers the extender from the shared state: the leader's plugin configuration and
//! model reach it through the store, and it ranks as the leader does. After `kill -9` of the
//! leader the follower takes over with every report the old leader acknowledged (sent again,
//! each is a DUPLICATE); after a SIGTERM the next follower takes over without waiting for the
//! Lease to expire. Skips with a message when etcd or kube-apiserver are missing;
//! `KUDOS_E2E_REQUIRE=1` turns the skip into a failure.

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
        https: None,
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

/// The labelled leaders once `settled` holds for them, or as they are after 30 s. A new leader
/// listens for gRPC before its label patch lands (the label moves traffic to a port that is
/// already open), so readiness alone does not mean the label is there yet.
async fn leaders_when(pods: &Api<Pod>, settled: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let leaders = labelled_leaders(pods).await;
        if settled(&leaders) || Instant::now() > deadline {
            return leaders;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

/// `GET /state` of a replica: its plugin configuration and model.
fn state_of(orch: &Orchestrator) -> anyhow::Result<(serde_json::Value, serde_json::Value)> {
    let v = kudos_testkit::http::get_json(&orch.http_addr, "/state")?;
    Ok((v["pluginConfig"].clone(), v["model"].clone()))
}

/// `GET /metrics` of a replica, as text.
fn metrics_of(orch: &Orchestrator) -> anyhow::Result<String> {
    let r = kudos_testkit::http::request("GET", &orch.http_addr, "/metrics", None)?;
    Ok(String::from_utf8_lossy(&r.body).into_owned())
}

/// The replica's `/metrics` once it contains `line` (or after 30 s, whatever it says then): a new
/// leader listens for gRPC, which is what readiness waits for, before it sets its leader gauge.
async fn metrics_when(orch: &Orchestrator, line: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = metrics_of(orch)?;
        if text.contains(line) || Instant::now() > deadline {
            return Ok(text);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `POST /kudos/v1/prioritize` of a replica for a pod of `class` on `nodes`.
fn prioritize(
    orch: &Orchestrator,
    class: &str,
    nodes: &[&str],
) -> anyhow::Result<serde_json::Value> {
    let args = serde_json::json!({"Pod": pod_json("p", Some(class), 1), "NodeNames": nodes});
    kudos_testkit::http::post_json(&orch.http_addr, "/kudos/v1/prioritize", &args)
}

/// Waits until the follower's plugin configuration and model are the leader's; how long it
/// took.
async fn followed(leader: &Orchestrator, follower: &Orchestrator) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        let (l, f) = (state_of(leader)?, state_of(follower)?);
        if l.0 == f.0 && state_difference(&l.1, &f.1).is_none() {
            return Ok(start.elapsed());
        }
        if start.elapsed() > Duration::from_secs(60) {
            anyhow::bail!(
                "the follower did not reach the leader's state in 60 s:\nleader plugin config {}\nfollower plugin config {}\nleader model seq {} runs {}\nfollower model seq {} runs {}",
                l.0,
                f.0,
                l.1["appliedSeq"],
                l.1["runs"],
                f.1["appliedSeq"],
                f.1["runs"]
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
async fn the_follower_answers_from_the_shared_state_and_takes_over_with_every_acknowledged_report()
-> anyhow::Result<()> {
    let opts = ControlPlaneOptions::default();
    let Some((run, cp)) = ControlPlane::for_test("orchestrator-failover", opts, &[]).await? else {
        return Ok(());
    };
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
    let mut b = Orchestrator::start_follower(&dir, &opts).await?;
    b.wait_ready_http(Duration::from_secs(60)).await?;
    // Ready as soon as it has read the store; it names the leader from its first look at the
    // Lease.
    let named = Instant::now();
    let body = loop {
        let (status, body) = b.readyz()?;
        assert_eq!(status, 200, "a follower serves: {body}");
        assert!(body.contains("follower"), "{body}");
        if body.contains("leads") || named.elapsed() > Duration::from_secs(30) {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        body.contains(&format!("_{}_", a.pid())),
        "names the leader: {body}"
    );
    assert!(
        std::net::TcpStream::connect(&b.grpc_addr).is_err(),
        "the follower serves no gRPC: reports go to the leader alone"
    );
    assert!(metrics_of(&b)?.contains("\nkudos_orchestrator_leader 0\n"));
    assert!(metrics_of(&a)?.contains("\nkudos_orchestrator_leader 1\n"));
    let leader = holder(&leases).await;
    assert!(
        leader.contains(&format!("_{}_", a.pid())),
        "Lease holder {leader:?}"
    );
    assert_eq!(labelled_leaders(&pods).await, ["a"]);

    // The leader learns a node's devices and runs on it; the follower learns them from the
    // store and ranks as the leader does.
    let mut reg = pb::registry_service_client::RegistryServiceClient::connect(format!(
        "http://{}",
        a.grpc_addr
    ))
    .await?;
    reg.report_plugin(with_token(plugin(NODE, 2, true), Some(&node_token(NODE))))
        .await?;
    let reports: Vec<pb::RunReport> = (0..REPORTS)
        .map(|i| report(&format!("r{i}"), NODE, pb::RunState::Completed, "resnet50"))
        .collect();
    let acked = send(&a, &reports).await?;
    assert_eq!(
        acked,
        vec![pb::AckStatus::Accepted as i32; REPORTS],
        "the leader acknowledges every report"
    );

    let caught_up = followed(&a, &b).await?;
    let (_, model) = state_of(&b)?;
    assert_eq!(
        model["runs"],
        serde_json::json!(REPORTS),
        "every acknowledged run is in the follower's model: {model}"
    );
    let (from_a, from_b) = (
        prioritize(&a, "resnet50", &[NODE, "unknown-node"])?,
        prioritize(&b, "resnet50", &[NODE, "unknown-node"])?,
    );
    assert_eq!(from_a, from_b, "the follower ranks as the leader does");
    assert!(from_b.as_array().is_some_and(|a| a.len() == 2), "{from_b}");

    // The whole verb set on the follower: a real pod filtered there binds there.
    let mut spec = pod_json("gpu-pod", Some("resnet50"), 1);
    spec["metadata"]["uid"] = serde_json::Value::Null;
    // An extended resource needs its limit (the API server refuses the pod without one).
    spec["spec"]["containers"][0]["resources"]["limits"] =
        serde_json::json!({"kudos.dev/gpu": "1"});
    let pod: Pod = pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(spec.clone())?,
        )
        .await?;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    spec["metadata"]["uid"] = uid.clone().into();
    let passed = kudos_testkit::http::post_json(
        &b.http_addr,
        "/kudos/v1/filter",
        &serde_json::json!({"Pod": spec, "NodeNames": [NODE]}),
    )?;
    assert_eq!(passed["NodeNames"], serde_json::json!([NODE]), "{passed}");
    let bound = kudos_testkit::http::post_json(
        &b.http_addr,
        "/kudos/v1/bind",
        &serde_json::json!({"PodName": "gpu-pod", "PodNamespace": "default", "PodUID": uid, "Node": NODE}),
    )?;
    assert_eq!(bound["Error"], serde_json::json!(""), "{bound}");
    let bound_to = pods.get("gpu-pod").await?.spec.and_then(|s| s.node_name);
    assert_eq!(
        bound_to.as_deref(),
        Some(NODE),
        "the follower bound the pod"
    );

    // A crash: the Lease is not released; b takes over once it has seen it unchanged for
    // leaseDurationSeconds.
    a.kill();
    let killed = Instant::now();
    // Scheduling does not wait for the takeover: the follower answers meanwhile.
    let during = prioritize(&b, "resnet50", &[NODE, "unknown-node"])?;
    let answered_after = killed.elapsed();
    assert_eq!(
        during, from_b,
        "the follower answers while the Lease is still the dead leader's"
    );
    assert!(
        std::net::TcpStream::connect(&b.grpc_addr).is_err(),
        "b answered before it took over, as a follower"
    );
    let r = b.wait_ready(Duration::from_secs(60)).await;
    assert!(r.is_ok(), "{r:?}\n{}", tail(b.log(), 30));
    let crash_failover = killed.elapsed();
    assert!(holder(&leases).await.contains(&format!("_{}_", b.pid())));
    let gauge = "\nkudos_orchestrator_leader 1\n";
    assert!(metrics_when(&b, gauge).await?.contains(gauge));
    // a was killed and could not clear its label; in a cluster its restarted container does
    // (and a dead container is not ready, so the Service skips it meanwhile).
    let leaders = leaders_when(&pods, |l| l == ["a", "b"]).await;
    assert_eq!(leaders, ["a", "b"]);
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
    let mut c = Orchestrator::start_follower(&dir, &opts).await?;
    c.wait_ready_http(Duration::from_secs(60)).await?;
    assert!(c.readyz()?.1.contains("follower"));
    followed(&b, &c).await?;
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
    let c_alone = |l: &[String]| l.iter().any(|n| n == "c") && !l.iter().any(|n| n == "b");
    let leaders = leaders_when(&pods, c_alone).await;
    assert!(
        c_alone(&leaders),
        "b removed its label on the way out, c labelled itself: {leaders:?}"
    );
    let again = send(&c, &reports).await?;
    assert!(
        again.iter().all(|s| *s == pb::AckStatus::Duplicate as i32),
        "{again:?}"
    );
    eprintln!(
        "RESULT follower caught up with {REPORTS} reports {:.2} s after their last ack and answered prioritize {:.3} s after kill -9 of the leader; gRPC failover after kill -9: {:.1} s ({timings:?}); after SIGTERM: {:.1} s (including b's drain); {REPORTS} acknowledged reports, 0 lost",
        caught_up.as_secs_f64(),
        answered_after.as_secs_f64(),
        crash_failover.as_secs_f64(),
        handover.as_secs_f64()
    );
    c.stop();
    run.pass();
    Ok(())
}
