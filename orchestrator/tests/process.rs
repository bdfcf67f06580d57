//! The real binary: killed with SIGKILL between receiving reports and acknowledging them, and
//! restarted, nothing acknowledged is lost and nothing is counted twice; `GET /state` is the
//! same before and after a SIGKILL restart; SIGTERM drains and exits cleanly.

mod common;

use common::*;
use kudos_proto::kudos::v1 as pb;
use pb::registry_service_client::RegistryServiceClient;
use pb::telemetry_service_client::TelemetryServiceClient;
use serde_json::Value;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Proc {
    child: Child,
    http: String,
    grpc: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http_get(addr: &str, path: &str) -> Option<(u16, Vec<u8>)> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..split]).to_string();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, buf[split + 4..].to_vec()))
}

fn start(dir: &Path, extra: &[&str]) -> Proc {
    std::fs::write(dir.join("tokens.yaml"), "t-n1: n1\nt-n2: n2\n").unwrap();
    let (hp, gp) = (free_port(), free_port());
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("log"))
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_kudos-orchestrator"))
        .args([
            "--standalone",
            &format!("--http-listen=127.0.0.1:{hp}"),
            &format!("--grpc-listen=127.0.0.1:{gp}"),
            &format!("--store-path={}", dir.join("state.redb").display()),
            "--auth=static",
            &format!("--static-tokens-file={}", dir.join("tokens.yaml").display()),
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let p = Proc {
        child,
        http: format!("127.0.0.1:{hp}"),
        grpc: format!("http://127.0.0.1:{gp}"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while http_get(&p.http, "/readyz").map(|r| r.0) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "not ready; log:\n{}",
            std::fs::read_to_string(dir.join("log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    p
}

fn state(p: &Proc) -> Value {
    let (s, body) = http_get(&p.http, "/state").unwrap();
    assert_eq!(s, 200);
    serde_json::from_slice(&body).unwrap()
}

fn sigkill(p: &mut Proc) {
    p.child.kill().unwrap(); // SIGKILL on Unix
    p.child.wait().unwrap();
}

async fn register(p: &Proc) {
    let mut reg = RegistryServiceClient::connect(p.grpc.clone())
        .await
        .unwrap();
    reg.report_plugin(with_token(plugin("n1", 4, true), Some("t-n1")))
        .await
        .unwrap();
}

/// Sends `reports` on one stream; returns the acks received before `stop_after` of them (then
/// leaves the stream open for the caller to kill the server).
async fn send(p: &Proc, reports: &[pb::RunReport], stop_after: usize) -> Vec<pb::RunAck> {
    let mut tel = TelemetryServiceClient::connect(p.grpc.clone())
        .await
        .unwrap();
    let stream = tokio_stream::iter(reports.to_vec());
    let mut acks = tel
        .report_runs(with_token(stream, Some("t-n1")))
        .await
        .unwrap()
        .into_inner();
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
    let dir = tempfile::tempdir().unwrap();
    let mut p = start(dir.path(), &[]);
    register(&p).await;
    let all = reports(40);
    // All 40 go on the wire; SIGKILL after the third ack, with the stream open and the rest
    // being received and stored.
    let mut tel = TelemetryServiceClient::connect(p.grpc.clone())
        .await
        .unwrap();
    let stream = tokio_stream::iter(all.clone());
    let mut acks = tel
        .report_runs(with_token(stream, Some("t-n1")))
        .await
        .unwrap()
        .into_inner();
    let mut before = Vec::new();
    while before.len() < 3 {
        before.push(acks.message().await.unwrap().unwrap());
    }
    sigkill(&mut p);
    drop(acks);
    assert_eq!(before.len(), 3);
    assert!(
        before
            .iter()
            .all(|a| a.status == pb::AckStatus::Accepted as i32)
    );

    let p2 = start(dir.path(), &[]);
    // The agent re-sends everything it has no ack for; here: everything.
    let after = send(&p2, &all, all.len()).await;
    assert_eq!(after.len(), all.len());
    for a in &after {
        let acked_before = before.iter().any(|b| b.report_id == a.report_id);
        let ok = a.status == pb::AckStatus::Duplicate as i32
            || (!acked_before && a.status == pb::AckStatus::Accepted as i32);
        assert!(ok, "{a:?} (acked before the kill: {acked_before})");
    }
    let st = state(&p2);
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_is_identical_after_sigkill_restart() {
    let dir = tempfile::tempdir().unwrap();
    // Snapshots every 200 ms, so the restart loads a snapshot and replays what follows it.
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\nstore:\n  snapshotIntervalSeconds: 0.2\n",
    )
    .unwrap();
    let cfg_arg = format!("--config={}", cfg.display());
    let mut p = start(dir.path(), &[&cfg_arg]);
    register(&p).await;
    let all = reports(12);
    assert_eq!(send(&p, &all[..6], 6).await.len(), 6);
    tokio::time::sleep(Duration::from_millis(600)).await; // a snapshot covers the first 6
    assert_eq!(send(&p, &all[6..], 6).await.len(), 6);
    let before = state(&p);
    sigkill(&mut p);
    let p2 = start(dir.path(), &[&cfg_arg]);
    let after = state(&p2);
    assert_eq!(before["model"]["appliedSeq"], 12);
    assert_eq!(before, after);
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
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
        !restored.contains("replayed=0"),
        "the restart should replay runs after it: {restored}"
    );
    drop(p2);
}

#[test]
fn sigterm_drains_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = start(dir.path(), &[]);
    let pid = p.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(Instant::now() < deadline, "did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert!(log.contains("stopped"), "{log}");
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
