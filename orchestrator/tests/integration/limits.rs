//! The HTTP side of the probe list of issue 14: each input that used to abort the process, blow
//! up its memory or stall kube-scheduler's calls, answered with a clear error instead.

use crate::common;

use axum::http::StatusCode;
use common::*;
use kudos_orchestrator::http::{ConnLimits, HttpLimits, router, serve};
use kudos_orchestrator::index::UNKNOWN_NODE_REASON;
use kudos_orchestrator::limits;
use kudos_orchestrator::metrics::Metrics;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn args(pod: Value, names: Vec<String>) -> Vec<u8> {
    serde_json::to_vec(&json!({"Pod": pod, "Nodes": null, "NodeNames": names})).unwrap()
}

fn default_limits() -> HttpLimits {
    HttpLimits {
        max_body_bytes: limits::DEFAULT_MAX_BODY_BYTES,
        ..limits()
    }
}

/// Gang size 4294967295 made a placement allocate 137 GB and abort the process.
#[tokio::test]
async fn huge_gang_size_is_a_clear_error_not_an_allocation() {
    let app = mk_app(standard_index());
    let mut pod = pod_json("g", Some("resnet50"), 1);
    pod["metadata"]["annotations"] =
        json!({"kudos.dev/gang-name": "g", "kudos.dev/gang-size": "4294967295"});
    let body = args(pod, vec!["gpu-a".into(), "gpu-b".into()]);
    let (s, v) = post(&app, "/kudos/v1/filter", body.clone()).await;
    assert_eq!(s, StatusCode::OK);
    let err = v["Error"].as_str().unwrap();
    assert!(
        err.contains("kudos.dev/gang-size") && err.contains("4096"),
        "{err}"
    );
    let (s, v) = post(&app, "/kudos/v1/prioritize", body).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
}

/// 13.6 MB of unknown node names produced a 132 MB response: the body is refused whole, and
/// the bounds on count and name length answer without echoing the input.
#[tokio::test]
async fn floods_of_node_names_are_refused_compactly() {
    let app = router(mk_state(standard_index()), &default_limits());
    let pod = pod_json("p", Some("resnet50"), 1);

    let huge: Vec<String> = (0..340_000)
        .map(|i| format!("unknown-node-{i:027}"))
        .collect();
    let (s, v) = post(&app, "/kudos/v1/filter", args(pod.clone(), huge)).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(v.to_string().len() < 1024, "{v}");

    let many: Vec<String> = (0..=limits::MAX_NODE_NAMES)
        .map(|i| format!("n{i}"))
        .collect();
    let (s, v) = post(&app, "/kudos/v1/filter", args(pod.clone(), many)).await;
    assert_eq!(s, StatusCode::OK);
    let err = v["Error"].as_str().unwrap();
    assert!(err.contains("at most 20000"), "{err}");
    assert!(v["FailedNodes"].as_object().unwrap().is_empty());

    let long = vec!["gpu-a".to_owned(), "x".repeat(100_000)];
    let (s, v) = post(&app, "/kudos/v1/filter", args(pod.clone(), long)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        v.to_string().len() < 1024,
        "the long name is not echoed: {v}"
    );
    assert!(v["Error"].as_str().unwrap().contains("NodeNames[1]"), "{v}");

    // Unknown names that pass the bounds get one short shared reason each.
    let unknown: Vec<String> = (0..1000).map(|i| format!("ghost-{i}")).collect();
    let (_, v) = post(&app, "/kudos/v1/filter", args(pod, unknown)).await;
    let failed = v["FailedAndUnresolvableNodes"].as_object().unwrap();
    assert_eq!(failed.len(), 1000);
    assert!(failed.values().all(|r| r == UNKNOWN_NODE_REASON));
    assert!(UNKNOWN_NODE_REASON.len() <= 100);
}

/// Three concurrent `/state` calls stalled `/filter` for 32 s: the heavy reads have their own
/// small limit and are refused at once beyond it, while the extender keeps answering.
#[tokio::test]
async fn heavy_reads_are_limited_apart_from_the_extender() {
    let state = mk_state(standard_index());
    let app = router(state.clone(), &limits());
    let held = state
        .heavy
        .acquire_many(limits::DEFAULT_MAX_HEAVY_REQUESTS as u32)
        .await
        .unwrap();
    for path in ["/state", "/metrics", "/explain/default/p"] {
        let (s, v) = get(&app, path).await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{path}: {v}");
        assert!(v["error"].as_str().unwrap().contains("busy"), "{v}");
    }
    let body = args(
        pod_json("p", Some("resnet50"), 1),
        vec!["gpu-a".into(), "gpu-c".into()],
    );
    let (s, v) = post(&app, "/kudos/v1/filter", body).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["NodeNames"].as_array().unwrap().len(), 2, "{v}");
    drop(held);
    let (s, v) = get(&app, "/state").await;
    assert_eq!(s, StatusCode::OK);
    assert!(v["model"]["state"].is_object(), "{v}");
}

async fn start_server(limits: ConnLimits) -> (std::net::SocketAddr, Arc<Metrics>) {
    let state = mk_state(standard_index());
    let metrics = state.metrics.clone();
    let app = router(state, &common::limits());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let m = metrics.clone();
    tokio::spawn(serve(
        listener,
        app,
        limits,
        None,
        m,
        std::future::pending(),
    ));
    (addr, metrics)
}

/// Reads until the server closes the connection; returns what it sent.
async fn read_to_close(conn: &mut tokio::net::TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    // The guard turns a connection the server never closes into a failure, not a hang.
    let r = tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut out)).await;
    assert!(r.is_ok(), "the server did not close the connection");
    out
}

/// A client that never finishes its headers is disconnected.
#[tokio::test]
async fn slow_headers_are_cut_off() {
    let (addr, _) = start_server(ConnLimits {
        max_connections: 8,
        header_read_timeout: Duration::from_millis(200),
        max_streams_per_connection: 8,
    })
    .await;
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let got = read_to_close(&mut conn).await;
    assert!(!String::from_utf8_lossy(&got).contains("200 OK"));
}

/// Connections beyond the cap are closed at accept and counted.
#[tokio::test]
async fn connections_beyond_the_cap_are_refused() {
    let (addr, metrics) = start_server(ConnLimits {
        max_connections: 1,
        header_read_timeout: Duration::from_secs(30),
        max_streams_per_connection: 8,
    })
    .await;
    let mut first = tokio::net::TcpStream::connect(addr).await.unwrap();
    first
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let n = first.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    // `first` stays open (keep-alive) and holds the only slot.
    let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = second
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let got = read_to_close(&mut second).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    let text = metrics.encode().unwrap();
    assert!(text.contains("kudos_orchestrator_http_connections_refused_total 1"));
    // Only the connection let in counts as accepted.
    assert!(
        text.contains("kudos_orchestrator_http_connections_accepted_total 1"),
        "{text}"
    );
    // The first connection still works.
    first
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let n = first.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
}
