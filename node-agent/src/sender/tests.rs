use super::*;
use kudos_proto::kudos::v1::RunState;
use kudos_testkit::telemetry_receiver::TestReceiver;

fn cfg(url: String, token_file: Option<PathBuf>) -> SenderConfig {
    SenderConfig {
        url,
        ca_file: None,
        node: "node-a".into(),
        token_file,
        heartbeat_period: Duration::from_millis(100),
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(200),
        max_in_flight: 16,
        timeout: Duration::from_secs(2),
        ack_timeout: Duration::from_secs(10),
    }
}

fn reports(prefix: &str, n: usize) -> Vec<RunReport> {
    (0..n)
        .map(|i| RunReport {
            report_id: format!("{prefix}-{i}"),
            run_id: format!("{prefix}-{i}"),
            state: RunState::Completed as i32,
            ..Default::default()
        })
        .collect()
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A local port nobody listens on (yet).
fn free_addr() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

#[test]
fn backoff_grows_with_jitter_and_resets() {
    let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
    let d: Vec<Duration> = (0..6).map(|_| b.next_delay()).collect();
    assert!(
        d[0] >= Duration::from_millis(50) && d[0] <= Duration::from_millis(100),
        "{d:?}"
    );
    assert!(
        d[3] >= Duration::from_millis(400) && d[3] <= Duration::from_millis(800),
        "{d:?}"
    );
    assert!(
        d[5] >= Duration::from_millis(500) && d[5] <= Duration::from_secs(1),
        "capped: {d:?}"
    );
    b.reset();
    assert!(b.next_delay() <= Duration::from_millis(100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orchestrator_down_then_up_loses_nothing_and_rejects_are_dropped_loudly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "first\n").expect("token");
    let outbox = Arc::new(Outbox::open(&dir.path().join("outbox"), 10_000).expect("outbox"));
    let metrics = Metrics::new("node-a");
    let addr = free_addr();
    let cfg = cfg(format!("http://{addr}"), Some(token.clone()));
    let (stop_tx, stop) = watch::channel(false);
    let ch = channel(&cfg).expect("channel");
    let sender = tokio::spawn(run_reports(
        cfg.clone(),
        ch.clone(),
        outbox.clone(),
        metrics.clone(),
        stop.clone(),
    ));
    let health = Arc::new(DeviceHealth::default());
    let hb = tokio::spawn(run_heartbeats(
        cfg,
        ch,
        outbox.clone(),
        health,
        metrics.clone(),
        stop,
    ));

    // Orchestrator down: reports pile up in the outbox.
    outbox.push(&reports("a", 300)).expect("push");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(outbox.depth(), 300);

    // Orchestrator up.
    let rx = TestReceiver::default();
    rx.state().reject.insert("a-7".into());
    let (_, server) = rx.bind(addr).await.expect("bind");
    outbox.push(&reports("b", 200)).expect("push");
    wait_until("all delivered and acknowledged", || outbox.depth() == 0).await;
    {
        let s = rx.state();
        assert_eq!(s.ids.len(), 499, "every report but the rejected one stored");
        assert!(s.reports.iter().any(|r| r.report_id == "a-7"));
        assert_eq!(s.tokens.first().map(String::as_str), Some("Bearer first"));
    }
    let text = metrics.render();
    assert!(
        text.contains(r#"kudos_outbox_dropped_reports_total{state="any",reason="rejected"} 1"#),
        "{text}"
    );

    // Token rotation: the next heartbeat carries the new token.
    std::fs::write(&token, "second").expect("token");
    wait_until("rotated token used", || {
        rx.state().tokens.iter().any(|t| t == "Bearer second")
    })
    .await;
    wait_until("heartbeat", || !rx.state().heartbeats.is_empty()).await;
    assert_eq!(rx.state().heartbeats[0].node, "node-a");

    stop_tx.send(true).expect("stop");
    sender.await.expect("sender");
    hb.await.expect("heartbeats");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_resends_unacknowledged_reports_under_the_same_ids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outbox = Arc::new(Outbox::open(dir.path(), 10_000).expect("outbox"));
    let metrics = Metrics::new("node-a");
    let rx = TestReceiver::default();
    rx.state().ack_delay = Duration::from_millis(30);
    let (addr, server) = rx
        .bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let cfg = cfg(format!("http://{addr}"), None);
    let (stop_tx, stop) = watch::channel(false);
    let sender = tokio::spawn(run_reports(
        cfg,
        channel(&cfg_url(addr)).expect("ch"),
        outbox.clone(),
        metrics,
        stop,
    ));
    outbox.push(&reports("c", 100)).expect("push");
    wait_until("some reports received", || rx.state().ids.len() >= 20).await;
    // The orchestrator goes away mid-stream and comes back on the same port.
    server.abort();
    let _ = server.await;
    let rx2 = TestReceiver::default();
    rx2.state().ids = rx.state().ids.clone(); // it kept what it had stored
    let (_, server2) = rx2.bind(addr).await.expect("rebind");
    wait_until("outbox drained", || outbox.depth() == 0).await;
    let mut all: HashSet<String> = rx.state().ids.clone();
    all.extend(rx2.state().ids.iter().cloned());
    assert_eq!(all.len(), 100);
    assert!(
        rx2.state()
            .reports
            .iter()
            .all(|r| r.report_id.starts_with("c-"))
    );
    stop_tx.send(true).expect("stop");
    sender.await.expect("sender");
    server2.abort();
}

fn cfg_url(addr: std::net::SocketAddr) -> SenderConfig {
    cfg(format!("http://{addr}"), None)
}

use std::collections::HashSet;
