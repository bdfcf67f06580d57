//! Process-level durability: the real `kudos-node-agent` binary is killed with SIGKILL while
//! sending, restarted, and every report still reaches the orchestrator (a `TestReceiver`) at
//! least once, duplicates sharing their ID. Uses the test-only `--synthetic-reports` flag to
//! put 1,000 completed-run reports in the outbox.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kudos_node_agent::outbox::Outbox;
use kudos_testkit::telemetry_receiver::TestReceiver;

const N: usize = 1000;

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

fn start_agent(dir: &Path, orchestrator: SocketAddr, metrics: SocketAddr) -> Child {
    Command::new(env!("CARGO_BIN_EXE_kudos-node-agent"))
        .args([
            "--node-name",
            "node-a",
            "--gpu-backend",
            "none",
            "--synthetic-reports",
            &N.to_string(),
        ])
        .arg("--pod-resources-socket")
        .arg(dir.join("no-kubelet.sock"))
        .arg("--outbox-dir")
        .arg(dir.join("outbox"))
        .args(["--orchestrator-url", &format!("http://{orchestrator}")])
        .args(["--metrics-addr", &metrics.to_string()])
        .args([
            "--backoff-min",
            "50ms",
            "--backoff-max",
            "300ms",
            "--heartbeat-period",
            "1s",
        ])
        .args(["--max-in-flight", "64", "--log-level", "error"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start kudos-node-agent")
}

async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn expected_ids() -> HashSet<String> {
    (0..N).map(|i| format!("synthetic-node-a-{i}")).collect()
}

/// `GET /metrics` with a bare HTTP/1.0 request.
fn scrape(addr: SocketAddr) -> Option<String> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn assert_all_delivered(rx: &TestReceiver) {
    let s = rx.state();
    let expected = expected_ids();
    assert_eq!(s.ids, expected, "every report reached the receiver");
    assert!(
        s.reports.iter().all(|r| expected.contains(&r.report_id)),
        "duplicates share their ID"
    );
    assert!(
        s.tokens.iter().all(String::is_empty),
        "no token file configured: no authorization header"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_send_then_restart_delivers_every_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = TestReceiver::default();
    rx.state().ack_delay = Duration::from_millis(3);
    let (addr, server) = rx
        .bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let metrics = free_addr();

    let mut agent = start_agent(dir.path(), addr, metrics);
    wait_until("the agent to be mid-send", Duration::from_secs(60), || {
        rx.state().ids.len() >= 150
    })
    .await;
    agent.kill().expect("SIGKILL");
    agent.wait().expect("reap");
    let at_kill = rx.state().ids.len();
    assert!(
        at_kill < N,
        "killed after everything was sent ({at_kill}); the test proves nothing"
    );

    let agent = start_agent(dir.path(), addr, metrics);
    wait_until("every report", Duration::from_secs(60), || {
        rx.state().ids.len() == N
    })
    .await;
    // The restarted agent drains its outbox: acknowledged reports leave it.
    wait_until("outbox empty", Duration::from_secs(30), || {
        scrape(metrics).is_some_and(|m| m.lines().any(|l| l == "kudos_outbox_reports 0"))
    })
    .await;
    stop(agent);
    assert_all_delivered(&rx);
    let resent = rx.state().reports.len() - N;
    eprintln!("killed at {at_kill}/{N} distinct; {resent} re-sent duplicates after the restart");
    // The synthetic batch is generated once per outbox, even across restarts.
    let ob = Outbox::open(&dir.path().join("outbox"), 10).expect("reopen");
    assert_eq!(ob.depth(), 0);
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orchestrator_down_for_the_whole_run_then_up_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = free_addr(); // nobody listens here yet
    let metrics = free_addr();
    let mut agent = start_agent(dir.path(), addr, metrics);
    wait_until("reports queued", Duration::from_secs(30), || {
        scrape(metrics).is_some_and(|m| m.lines().any(|l| l == format!("kudos_outbox_reports {N}")))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    agent.kill().expect("SIGKILL");
    agent.wait().expect("reap");

    // Restarted while the orchestrator is still down, then the orchestrator comes up.
    let agent = start_agent(dir.path(), addr, metrics);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rx = TestReceiver::default();
    let (_, server) = rx.bind(addr).await.expect("bind the orchestrator port");
    wait_until("every report", Duration::from_secs(60), || {
        rx.state().ids.len() == N
    })
    .await;
    stop(agent);
    assert_all_delivered(&rx);
    server.abort();
}
