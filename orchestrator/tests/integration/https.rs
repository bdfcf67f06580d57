//! The HTTP listener over HTTPS, with rustls on both ends and certificates made by `openssl`
//! the way Helm and cert-manager make them: kube-scheduler's client certificate opens the
//! extender verbs; no certificate, another client's, or one from another CA does not; the
//! probes stay open; a renewed serving certificate is served without a restart. Plus the two
//! gates that need no TLS: `bind` refuses pods Kudos did not rank, and the read endpoints
//! want a token their authorizer allows.

use crate::common;

use axum::http::StatusCode;
use common::*;
use futures::future::BoxFuture;
use kudos_orchestrator::access::{
    AccessPolicy, ExtenderAccess, ReadAccess, ReadAuthorizer, Refusal,
};
use kudos_orchestrator::http::{ConnLimits, HttpState, router, serve};
use kudos_orchestrator::tls::{TlsFiles, TlsServer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A CA made by `openssl` (Debian package `openssl`, installed by scripts/install-deps).
struct Pki(kudos_testkit::pki::Pki);

impl Pki {
    fn new(dir: &Path, ca: &str) -> Self {
        Self(kudos_testkit::pki::Pki::new(dir, ca, 2).expect("openssl makes a CA"))
    }
    fn server(&self, name: &str) -> (PathBuf, PathBuf) {
        self.0.server(name).expect("openssl signs")
    }
    fn client(&self, name: &str) -> (PathBuf, PathBuf) {
        self.0.client(name).expect("openssl signs")
    }
    fn ca(&self) -> PathBuf {
        self.0.ca()
    }
}

/// A rustls client trusting `ca`, presenting `cert` if given.
fn connector(ca: &Path, cert: Option<&(PathBuf, PathBuf)>) -> tokio_rustls::TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match cert {
        Some((crt, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(crt)
                    .unwrap()
                    .map(|c| c.unwrap())
                    .collect(),
                PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// One HTTP/1.1 request over TLS; the status and body, or the TLS error.
async fn https(
    addr: std::net::SocketAddr,
    tls: &tokio_rustls::TlsConnector,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(u16, String), String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut s = tls
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(body).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    // TLS 1.3 reports a refused client certificate on the first read, not in the handshake.
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_owned();
    Ok((status, body))
}

fn state_with(access: AccessPolicy) -> Arc<HttpState> {
    let plain = mk_state(standard_index());
    let state = HttpState::new(
        mk_extender(plain.index.clone(), plain.metrics.clone()),
        plain.index.clone(),
        plain.metrics.clone(),
    );
    Arc::new(HttpState { access, ..state })
}

async fn start(tls: Arc<TlsServer>, access: AccessPolicy) -> std::net::SocketAddr {
    let conn = ConnLimits {
        max_connections: 64,
        header_read_timeout: Duration::from_secs(5),
        max_streams_per_connection: 64,
    };
    start_with(tls, access, conn).await.0
}

async fn start_with(
    tls: Arc<TlsServer>,
    access: AccessPolicy,
    conn: ConnLimits,
) -> (
    std::net::SocketAddr,
    Arc<kudos_orchestrator::metrics::Metrics>,
) {
    let state = state_with(access);
    let metrics = state.metrics.clone();
    let app = router(state, &limits());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        listener,
        app,
        conn,
        Some(tls),
        metrics.clone(),
        std::future::pending(),
    ));
    (addr, metrics)
}

/// The chart's settings: a CA under `dir`, its serving certificate, and the extender verbs
/// open only to a client certificate from it naming `kudos-scheduler` (reads open).
fn scheduler_only(dir: &Path) -> (Pki, Arc<TlsServer>, AccessPolicy) {
    let pki = Pki::new(dir, "kudos-ca");
    let (crt, key) = pki.server("kudos-orchestrator");
    let tls = Arc::new(
        TlsServer::load(TlsFiles {
            cert: crt,
            key,
            client_ca: Some(pki.ca()),
        })
        .unwrap(),
    );
    let access = AccessPolicy {
        extender: ExtenderAccess::ClientCertificate {
            names: vec!["kudos-scheduler".into()],
        },
        read: ReadAccess::Open,
    };
    (pki, tls, access)
}

fn filter_body() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "Pod": pod_json("p", Some("resnet50"), 1),
        "NodeNames": ["gpu-a", "gpu-b"],
    }))
    .unwrap()
}

#[tokio::test]
async fn extender_verbs_need_the_schedulers_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (pki, tls, access) = scheduler_only(dir.path());
    let rogue = Pki::new(dir.path(), "rogue-ca");
    let addr = start(tls, access).await;
    let scheduler = connector(&pki.ca(), Some(&pki.client("kudos-scheduler")));
    let intruder = connector(&pki.ca(), Some(&pki.client("intruder")));
    let anonymous = connector(&pki.ca(), None);
    let forged = connector(&pki.ca(), Some(&rogue.client("kudos-scheduler")));
    let body = filter_body();

    let (status, out) = https(addr, &scheduler, "POST", "/kudos/v1/filter", &body)
        .await
        .unwrap();
    assert_eq!(status, 200, "{out}");
    assert!(out.contains("NodeNames"), "{out}");

    let (status, out) = https(addr, &anonymous, "POST", "/kudos/v1/filter", &body)
        .await
        .unwrap();
    assert_eq!(status, 401, "{out}");
    assert!(out.contains("client certificate"), "{out}");

    let (status, out) = https(addr, &intruder, "POST", "/kudos/v1/bind", b"{}")
        .await
        .unwrap();
    assert_eq!(status, 403, "{out}");
    assert!(out.contains("intruder"), "names the certificate: {out}");

    let refused = https(addr, &forged, "POST", "/kudos/v1/filter", &body).await;
    assert!(
        refused.is_err(),
        "a certificate from another CA must fail the handshake: {refused:?}"
    );

    // Probes and (here open) reads need no certificate.
    let (status, _) = https(addr, &anonymous, "GET", "/healthz", b"")
        .await
        .unwrap();
    assert_eq!(status, 200);
    let (status, _) = https(addr, &anonymous, "GET", "/state", b"").await.unwrap();
    assert_eq!(status, 200);

    // Plain HTTP to the HTTPS port gets no HTTP answer.
    let plain = kudos_testkit::http::request("GET", &addr.to_string(), "/healthz", None);
    assert!(plain.is_err() || plain.is_ok_and(|r| r.status != 200));
}

/// `connector` offering ALPN `h2` and `http/1.1`, as Go's HTTP client does.
fn h2_connector(ca: &Path, cert: Option<&(PathBuf, PathBuf)>) -> tokio_rustls::TlsConnector {
    let base = connector(ca, cert);
    let mut config = (**base.config()).clone();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// An HTTP/2 connection over TLS: its request sender and the ALPN protocol agreed.
async fn h2_connect(
    addr: std::net::SocketAddr,
    tls: &tokio_rustls::TlsConnector,
) -> (
    hyper::client::conn::http2::SendRequest<axum::body::Body>,
    Option<Vec<u8>>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let s = tls
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let alpn = s.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(s),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    (send, alpn)
}

/// One POST on an HTTP/2 connection: status and body.
async fn h2_post(
    mut send: hyper::client::conn::http2::SendRequest<axum::body::Body>,
    path: &str,
    body: Vec<u8>,
) -> (u16, String) {
    let req = axum::http::Request::post(format!("https://localhost{path}"))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))
        .unwrap();
    send.ready().await.unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.version(), axum::http::Version::HTTP_2);
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(axum::body::Body::new(resp.into_body()), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn served(text: &str, protocol: &str) -> u64 {
    let series =
        format!("kudos_orchestrator_http_connections_served_total{{protocol=\"{protocol}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {text}"))
}

/// kube-scheduler's Go client offers `h2`: its concurrent filter, prioritize and bind calls
/// then share one connection (one TLS handshake), and the client certificate still decides
/// each call.
#[tokio::test]
async fn http2_multiplexes_the_schedulers_calls_on_one_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (pki, tls, access) = scheduler_only(dir.path());
    let limits = ConnLimits {
        max_connections: 64,
        header_read_timeout: Duration::from_secs(5),
        max_streams_per_connection: 8,
    };
    let (addr, metrics) = start_with(tls, access, limits).await;

    let scheduler = h2_connector(&pki.ca(), Some(&pki.client("kudos-scheduler")));
    let (send, alpn) = h2_connect(addr, &scheduler).await;
    assert_eq!(alpn.as_deref(), Some(b"h2".as_slice()));
    // The server's SETTINGS (its stream limit) are in by the first answer; streams opened
    // beyond the limit before that are refused (REFUSED_STREAM, which Go's client retries).
    let (status, out) = h2_post(send.clone(), "/kudos/v1/filter", filter_body()).await;
    assert_eq!(status, 200, "{out}");
    // Then more calls in flight at once than the stream limit: the client queues, none fails.
    let calls = (0..32).map(|_| h2_post(send.clone(), "/kudos/v1/filter", filter_body()));
    for (status, out) in futures::future::join_all(calls).await {
        assert_eq!(status, 200, "{out}");
        assert!(out.contains("gpu-a"), "{out}");
    }
    let text = metrics.encode().unwrap();
    assert_eq!(served(&text, "h2"), 1, "one connection for 32 calls");
    assert_eq!(served(&text, "http/1.1"), 0);
    assert!(
        text.contains("kudos_orchestrator_http_connections_accepted_total 1\n"),
        "{text}"
    );

    // Without the certificate, HTTP/2 is refused the same way HTTP/1.1 is.
    let (anonymous, _) = h2_connect(addr, &h2_connector(&pki.ca(), None)).await;
    let (status, out) = h2_post(anonymous, "/kudos/v1/filter", filter_body()).await;
    assert_eq!(status, 401, "{out}");

    // A client that offers only HTTP/1.1 gets HTTP/1.1.
    let (status, out) = https(
        addr,
        &connector(&pki.ca(), Some(&pki.client("kudos-scheduler"))),
        "POST",
        "/kudos/v1/filter",
        &filter_body(),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{out}");
    let text = metrics.encode().unwrap();
    assert_eq!(served(&text, "http/1.1"), 1);
    assert_eq!(served(&text, "h2"), 2);
}

/// A refusal waits for the rest of the request's body: answered while the client is still
/// uploading, the HTTP/2 stream would end in RST_STREAM, which curl 7.88 reports as a framing
/// error instead of the 401. (Waited for 250 ms at most; the second half comes after 50.)
#[tokio::test]
async fn a_refused_http2_upload_is_read_to_its_end_before_the_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let (pki, tls, access) = scheduler_only(dir.path());
    let addr = start(tls, access).await;
    let (mut send, _) = h2_connect(addr, &h2_connector(&pki.ca(), None)).await;
    let (mut tx, rx) =
        futures::channel::mpsc::channel::<Result<axum::body::Bytes, std::io::Error>>(1);
    let req = axum::http::Request::post("https://localhost/kudos/v1/filter")
        .header("content-type", "application/json")
        .body(axum::body::Body::from_stream(rx))
        .unwrap();
    send.ready().await.unwrap();
    let response = tokio::spawn(send.send_request(req));
    use futures::SinkExt;
    tx.send(Ok(axum::body::Bytes::from_static(b"{\"Pod\":")))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !response.is_finished(),
        "refused before the request's body ended"
    );
    tx.send(Ok(axum::body::Bytes::from_static(b"{}}")))
        .await
        .unwrap();
    drop(tx);
    let resp = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), 401);
}

/// An HTTP/2 client that completes the TLS handshake but sends no request is let go after
/// the header timeout, as a silent HTTP/1.1 client is: idle connections cannot pin the cap.
#[tokio::test]
async fn a_silent_http2_client_is_disconnected() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "kudos-ca");
    let (crt, key) = pki.server("kudos-orchestrator");
    let tls = Arc::new(
        TlsServer::load(TlsFiles {
            cert: crt,
            key,
            client_ca: None,
        })
        .unwrap(),
    );
    let limits = ConnLimits {
        max_connections: 1,
        header_read_timeout: Duration::from_millis(300),
        max_streams_per_connection: 8,
    };
    let (addr, _) = start_with(tls, AccessPolicy::default(), limits).await;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut silent = h2_connector(&pki.ca(), None)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(silent.get_ref().1.alpn_protocol(), Some(b"h2".as_slice()));
    // The server's SETTINGS may arrive first; then the connection ends.
    let mut sink = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), silent.read_to_end(&mut sink)).await;
    assert!(
        ended.is_ok(),
        "the server kept a silent HTTP/2 connection open"
    );
    // Its permit is back: the one connection allowed serves the next client (retried: the
    // permit is returned just after the socket closes).
    let mut status = None;
    for _ in 0..50 {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let Ok(s) = h2_connector(&pki.ca(), None)
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
        else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(s),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let req = axum::http::Request::get("https://localhost/healthz")
            .body(axum::body::Body::empty())
            .unwrap();
        send.ready().await.unwrap();
        status = Some(send.send_request(req).await.unwrap().status());
        break;
    }
    assert_eq!(status, Some(axum::http::StatusCode::OK));
}

#[tokio::test]
async fn a_renewed_certificate_is_served_without_restart_and_a_broken_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "kudos-ca");
    let (crt, key) = pki.server("first");
    let live_crt = dir.path().join("tls.crt");
    let live_key = dir.path().join("tls.key");
    std::fs::copy(&crt, &live_crt).unwrap();
    std::fs::copy(&key, &live_key).unwrap();
    let tls = Arc::new(
        TlsServer::load(TlsFiles {
            cert: live_crt.clone(),
            key: live_key.clone(),
            client_ca: None,
        })
        .unwrap(),
    );
    let addr = start(tls.clone(), AccessPolicy::default()).await;
    let served = || async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let s = connector(&pki.ca(), None)
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        s.get_ref().1.peer_certificates().unwrap()[0]
            .clone()
            .into_owned()
    };
    let first = served().await;
    assert!(!tls.reload().unwrap(), "unchanged files are not reloaded");

    let (crt2, key2) = pki.server("second");
    std::fs::copy(&crt2, &live_crt).unwrap();
    std::fs::copy(&key2, &live_key).unwrap();
    assert!(tls.reload().unwrap());
    let second = served().await;
    assert_ne!(first, second, "the new certificate is served");

    // A certificate whose key is another one's: refused, the working one stays.
    std::fs::copy(&crt, &live_crt).unwrap();
    let e = tls.reload().unwrap_err();
    assert!(e.to_string().contains("tls.crt"), "{e}");
    assert_eq!(served().await, second);
    std::fs::write(&live_crt, b"not pem").unwrap();
    assert!(tls.reload().is_err());
    assert_eq!(served().await, second);
}

#[test]
fn a_key_that_is_not_pem_stops_the_start_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "kudos-ca");
    let (crt, _) = pki.server("s");
    let bad = dir.path().join("bad.key");
    std::fs::write(&bad, "-----BEGIN NOTHING-----\n").unwrap();
    let Err(e) = TlsServer::load(TlsFiles {
        cert: crt,
        key: bad,
        client_ca: None,
    }) else {
        panic!("loaded a bad key");
    };
    assert!(e.to_string().contains("bad.key"), "{e}");
}

async fn post_json(app: &axum::Router, path: &str, v: serde_json::Value) -> serde_json::Value {
    use tower::ServiceExt;
    let req = axum::http::Request::post(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(serde_json::to_vec(&v).unwrap()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn bind_refuses_what_kudos_did_not_rank() {
    let state = mk_state(standard_index());
    let metrics = state.metrics.clone();
    let app = router(state, &limits());
    let bind = |pod: &str, uid: &str, node: &str| serde_json::json!({"PodName": pod, "PodNamespace": "default", "PodUID": uid, "Node": node});
    // Never ranked.
    let v = post_json(&app, "/kudos/v1/bind", bind("p", "uid-p", "gpu-a")).await;
    assert!(
        v["Error"].as_str().unwrap().contains("has not ranked"),
        "{v}"
    );
    // Ranked: gpu-a and gpu-b pass, gpu-zzz is unknown.
    let filter = serde_json::json!({
        "Pod": pod_json("p", Some("resnet50"), 1),
        "NodeNames": ["gpu-a", "gpu-b", "gpu-zzz"],
    });
    post_json(&app, "/kudos/v1/filter", filter).await;
    let v = post_json(&app, "/kudos/v1/bind", bind("p", "uid-p", "gpu-zzz")).await;
    assert!(v["Error"].as_str().unwrap().contains("did not pass"), "{v}");
    // Same name, another pod (UID): not ranked.
    let v = post_json(&app, "/kudos/v1/bind", bind("p", "uid-other", "gpu-a")).await;
    assert!(
        v["Error"].as_str().unwrap().contains("has not ranked"),
        "{v}"
    );
    let v = post_json(&app, "/kudos/v1/bind", bind("p", "uid-p", "gpu-a")).await;
    assert!(v.get("Error").is_none_or(|e| e == ""), "{v}");
    let text = metrics.encode().unwrap();
    assert!(
        text.contains("kudos_orchestrator_extender_bind_refused_total{reason=\"notRanked\"} 2"),
        "{text}"
    );
    assert!(
        text.contains(
            "kudos_orchestrator_extender_bind_refused_total{reason=\"nodeDidNotPass\"} 1"
        ),
        "{text}"
    );
}

/// Allows token `ops` to get `/state` and nothing else (the real TokenReview +
/// SubjectAccessReview path is tested against kube-apiserver in `integration`).
struct OpsOnly;

impl ReadAuthorizer for OpsOnly {
    fn allow<'a>(
        &'a self,
        token: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<String, Refusal>> {
        let r = match (token, path) {
            ("ops", "/state") => Ok("ops".into()),
            ("ops", p) => Err(Refusal::Forbidden {
                user: "ops".into(),
                path: p.into(),
            }),
            _ => Err(Refusal::TokenRefused("unknown token".into())),
        };
        Box::pin(std::future::ready(r))
    }
}

#[tokio::test]
async fn read_endpoints_want_an_allowed_token_and_probes_do_not() {
    use tower::ServiceExt;
    let state = state_with(AccessPolicy {
        extender: ExtenderAccess::Open,
        read: ReadAccess::Kubernetes(Arc::new(OpsOnly)),
    });
    let metrics = state.metrics.clone();
    let app = router(state, &limits());
    let get = |path: &str, token: Option<&str>| {
        let mut b = axum::http::Request::get(path);
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        app.clone()
            .oneshot(b.body(axum::body::Body::empty()).unwrap())
    };
    let r = get("/state", None).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    assert_eq!(
        get("/state", Some("forged")).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get("/metrics", Some("ops")).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        get("/status", Some("ops")).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        get("/explain/default/p", Some("ops"))
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        get("/state", Some("ops")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        get("/healthz", None).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(get("/readyz", None).await.unwrap().status(), StatusCode::OK);
    let text = metrics.encode().unwrap();
    assert!(
        text.contains("kudos_orchestrator_http_requests_refused_total{reason=\"forbidden\"} 3"),
        "{text}"
    );
}

#[tokio::test]
async fn the_admission_webhook_gives_gpu_pods_kudos_scheduler_only_when_configured() {
    use tower::ServiceExt;
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "r-1", "object": pod_json("p", Some("resnet50"), 1)},
    });
    let call = |app: axum::Router| {
        let body = serde_json::to_vec(&review).unwrap();
        async move {
            let req = axum::http::Request::post("/mutate/pods")
                .header("content-type", "application/json")
                .body(axum::body::Body::from(body))
                .unwrap();
            app.oneshot(req).await.unwrap()
        }
    };
    let off = router(mk_state(standard_index()), &limits());
    assert_eq!(call(off).await.status(), StatusCode::NOT_FOUND);
    let plain = mk_state(standard_index());
    let metrics = plain.metrics.clone();
    let state = HttpState {
        pod_scheduler_name: Some("kudos".into()),
        ..HttpState::new(
            mk_extender(plain.index.clone(), metrics.clone()),
            plain.index.clone(),
            metrics.clone(),
        )
    };
    let resp = call(router(Arc::new(state), &limits())).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["response"]["uid"], "r-1");
    assert_eq!(v["response"]["patchType"], "JSONPatch", "{v}");
    let text = metrics.encode().unwrap();
    assert!(
        text.contains("kudos_orchestrator_admission_pods_total{decision=\"mutated\"} 1"),
        "{text}"
    );
}

/// The device plugin's and node agent's channel (`kudos_common::grpc_tls`) to the gRPC
/// listener over TLS: with the orchestrator's CA a report goes through (bearer token and
/// all); with another CA, or plain HTTP/2 to the TLS port, nothing does.
#[tokio::test]
async fn grpc_over_tls_carries_reports_only_to_the_orchestrators_certificate() {
    use kudos_orchestrator::grpc::{Services, registry_server};
    use kudos_proto::kudos::v1::registry_service_client::RegistryServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "kudos-ca");
    let rogue = Pki::new(dir.path(), "rogue-ca");
    let (crt, key) = pki.server("kudos-orchestrator");
    let tls = Arc::new(
        TlsServer::load_with_alpn(
            TlsFiles {
                cert: crt,
                key,
                client_ca: None,
            },
            vec![b"h2".to_vec()],
        )
        .unwrap(),
    );
    let index = standard_index();
    let metrics = Arc::new(kudos_orchestrator::metrics::Metrics::new());
    let store =
        Arc::new(kudos_orchestrator::store::FileStore::open(&dir.path().join("s.redb")).unwrap());
    let ingest = ingest(index, store, &["gpu-new"], metrics);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming =
        kudos_orchestrator::tls::grpc_incoming(listener, Some(tls), Duration::from_secs(5));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(registry_server(Services(ingest)))
            .serve_with_incoming(incoming),
    );
    let report = |ca: Option<PathBuf>, scheme: &'static str| async move {
        let url = format!("{scheme}://localhost:{}", addr.port());
        let ch = kudos_common::grpc_tls::channel(&url, ca.as_deref(), |e| {
            e.timeout(Duration::from_secs(5))
        })
        .unwrap();
        RegistryServiceClient::new(ch)
            .report_plugin(with_token(plugin("gpu-new", 2, true), Some("t-gpu-new")))
            .await
    };
    let ok = report(Some(pki.ca()), "https")
        .await
        .expect("report over TLS");
    assert_eq!(ok.into_inner().unified_resource_name, UNIFIED);
    let e = report(Some(rogue.ca()), "https").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "another CA: {e}");
    assert!(
        report(None, "http").await.is_err(),
        "plain HTTP/2 to the TLS port"
    );
    let e =
        kudos_common::grpc_tls::channel(&format!("https://localhost:{}", addr.port()), None, |e| e)
            .unwrap_err();
    assert!(e.to_string().contains("--orchestrator-ca-file"), "{e}");
}
