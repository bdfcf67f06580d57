//! The real binary: killed with SIGKILL between receiving reports and acknowledging them, and
//! restarted, nothing acknowledged is lost and nothing is counted twice; `GET /state` is the
//! same before and after a SIGKILL restart; SIGTERM drains and exits cleanly.

use crate::common::*;
use kudos_proto::kudos::v1 as pb;
use kudos_testkit::orchestrator::{Orchestrator, OrchestratorOptions, node_token};
use kudos_testkit::{RunDir, http};
use pb::registry_service_client::RegistryServiceClient;
use pb::telemetry_service_client::TelemetryServiceClient;
use serde_json::Value;
use std::time::Duration;

/// Starts the binary under test, standalone, with static tokens for `n1` and `n2`; `extra`
/// flags last. Restarts in the same run directory reuse its store and append to its log.
async fn start(run: &RunDir, extra: &[&str]) -> Orchestrator {
    let opts = OrchestratorOptions {
        bin: env!("CARGO_BIN_EXE_kudos-orchestrator").into(),
        static_token_nodes: Some(vec!["n1".into(), "n2".into()]),
        extra: extra.iter().map(|a| a.to_string()).collect(),
        ..OrchestratorOptions::default()
    };
    Orchestrator::start_with(run.path(), &opts).await.unwrap()
}

fn grpc(p: &Orchestrator) -> String {
    format!("http://{}", p.grpc_addr)
}

fn state(p: &Orchestrator) -> Value {
    http::get_json(&p.http_addr, "/state").unwrap()
}

/// `/state` once the learner has applied every run up to `seq`: an ack promises that a run is
/// stored, and the learner publishes it a moment later. Gives up after 10 s with the last state.
async fn state_applied(p: &Orchestrator, seq: usize) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let st = state(p);
        if st["model"]["appliedSeq"].as_u64() >= Some(seq as u64)
            || std::time::Instant::now() > deadline
        {
            return st;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn register(p: &Orchestrator) {
    let mut reg = RegistryServiceClient::connect(grpc(p)).await.unwrap();
    reg.report_plugin(with_token(plugin("n1", 4, true), Some(&node_token("n1"))))
        .await
        .unwrap();
}

/// Puts `reports` on the wire on one ReportRuns stream, as node `n1`'s agent; the stream of
/// acknowledgements.
async fn open(p: &Orchestrator, reports: &[pb::RunReport]) -> tonic::Streaming<pb::RunAck> {
    let mut tel = TelemetryServiceClient::connect(grpc(p)).await.unwrap();
    let stream = tokio_stream::iter(reports.to_vec());
    tel.report_runs(with_token(stream, Some(&node_token("n1"))))
        .await
        .unwrap()
        .into_inner()
}

/// Sends `reports` on one stream; returns the acks received, at most `stop_after`.
async fn send(p: &Orchestrator, reports: &[pb::RunReport], stop_after: usize) -> Vec<pb::RunAck> {
    let mut acks = open(p, reports).await;
    let mut got = Vec::new();
    while got.len() < stop_after {
        match acks.message().await {
            Ok(Some(a)) => got.push(a),
            _ => break,
        }
    }
    got
}

fn reports(n: usize) -> Vec<pb::RunReport> {
    (0..n)
        .map(|i| {
            let mut r = report(
                &format!("rep-{i}"),
                "n1",
                pb::RunState::Completed,
                "resnet50",
            );
            r.end_unix_ms += (i as i64) * 7_000;
            r
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_between_receive_and_ack_loses_nothing_and_counts_once() {
    let run = RunDir::new("orchestrator-sigkill").unwrap();
    let mut p = start(&run, &[]).await;
    register(&p).await;
    let all = reports(40);
    // All 40 go on the wire; SIGKILL after the third ack, with the stream open and the rest
    // being received and stored.
    let mut acks = open(&p, &all).await;
    let mut before = Vec::new();
    while before.len() < 3 {
        before.push(acks.message().await.unwrap().unwrap());
    }
    p.kill();
    drop(acks);
    assert_eq!(before.len(), 3);
    assert!(
        before
            .iter()
            .all(|a| a.status == pb::AckStatus::Accepted as i32)
    );

    let p2 = start(&run, &[]).await;
    // The agent re-sends everything it has no ack for; here: everything.
    let after = send(&p2, &all, all.len()).await;
    assert_eq!(after.len(), all.len());
    for a in &after {
        let acked_before = before.iter().any(|b| b.report_id == a.report_id);
        let ok = a.status == pb::AckStatus::Duplicate as i32
            || (!acked_before && a.status == pb::AckStatus::Accepted as i32);
        assert!(ok, "{a:?} (acked before the kill: {acked_before})");
    }
    let st = state_applied(&p2, all.len()).await;
    assert_eq!(
        st["model"]["appliedSeq"],
        all.len(),
        "each report stored exactly once"
    );
    assert_eq!(
        st["model"]["state"]["runs"],
        all.len(),
        "each run observed exactly once"
    );
    run.pass();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_is_identical_after_sigkill_restart() {
    let run = RunDir::new("orchestrator-restart").unwrap();
    // Snapshots every 200 ms, so the restart loads a snapshot and replays what follows it.
    let cfg = run.join("config.yaml");
    std::fs::write(
        &cfg,
        "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\nstore:\n  snapshotIntervalSeconds: 0.2\n",
    )
    .unwrap();
    let cfg_arg = format!("--config={}", cfg.display());
    let mut p = start(&run, &[&cfg_arg]).await;
    register(&p).await;
    let all = reports(12);
    assert_eq!(send(&p, &all[..6], 6).await.len(), 6);
    tokio::time::sleep(Duration::from_millis(600)).await; // a snapshot covers the first 6
    assert_eq!(send(&p, &all[6..], 6).await.len(), 6);
    let before = state_applied(&p, all.len()).await;
    p.kill();
    let p2 = start(&run, &[&cfg_arg]).await;
    // Ready before the runs after the snapshot are learned: the learner replays them.
    let after = state_applied(&p2, all.len()).await;
    assert_eq!(before["model"]["appliedSeq"], 12);
    if let Some(d) = state_difference(&before, &after) {
        panic!("the state differs after the restart: {d}");
    }
    let log = std::fs::read_to_string(p2.log()).unwrap();
    let restored = log
        .lines()
        .filter(|l| l.contains("state restored"))
        .nth(1)
        .unwrap()
        .to_owned();
    assert!(
        !restored.contains("snapshot_seq=0"),
        "the restart should load a snapshot: {restored}"
    );
    assert!(
        !restored.contains("to_replay=0"),
        "the restart should replay runs after it: {restored}"
    );
    assert!(
        log.contains("runs stored after the snapshot learned and published"),
        "the learner should say when the replay is done: {log}"
    );
    drop(p2);
    run.pass();
}

#[tokio::test]
async fn sigterm_drains_and_exits_zero() {
    let run = RunDir::new("orchestrator-sigterm").unwrap();
    let mut p = start(&run, &[]).await;
    let status = p.stop().expect("exits by itself on SIGTERM");
    assert!(status.success(), "exit status {status}");
    let log = std::fs::read_to_string(p.log()).unwrap();
    assert!(log.contains("stopped"), "{log}");
    // A log that is not a terminal is plain text: `field=value` greps work (the restart test
    // above relies on them) and `kubectl logs` shows no escape codes.
    assert!(!log.contains('\u{1b}'), "escape codes in a log file: {log}");
    run.pass();
}
