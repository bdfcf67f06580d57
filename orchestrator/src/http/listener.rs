//! The HTTP listener's connections: accepted under a cap, TLS-handshaken, then served as
//! HTTP/2 or HTTP/1.1 by what the client negotiated, each request carrying the client
//! certificate; drained on shutdown.

use crate::metrics::Metrics;
use axum::Router;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Connection limits of [`serve`].
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Open connections at most; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// Time a client has to send a request's headers (HTTP/1.1), or its first request on a
    /// new HTTP/2 connection.
    pub header_read_timeout: Duration,
    /// Requests in flight on one HTTP/2 connection at most (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub max_streams_per_connection: u32,
}

/// The protocol an accepted connection speaks: HTTP/2 only where the TLS handshake
/// negotiated `h2` (ALPN), HTTP/1.1 otherwise (plain HTTP included: kube-scheduler does not
/// speak cleartext HTTP/2, so sniffing for it would only give idle clients a way around
/// the header timeout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1, keep-alive.
    Http1,
    /// HTTP/2: every call of one client multiplexed on one connection and one TLS session.
    Http2,
}

impl Protocol {
    /// The ALPN name, also the `protocol` label of `http_connections_served_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http1 => "http/1.1",
            Protocol::Http2 => "h2",
        }
    }

    fn of_tls(alpn: Option<&[u8]>) -> Self {
        if alpn == Some(b"h2".as_slice()) {
            Protocol::Http2
        } else {
            Protocol::Http1
        }
    }
}

/// The ALPN protocols the HTTP listener offers over TLS, preferred first. Go's HTTP client
/// (kube-scheduler's extender client) takes `h2` when offered, so all of its filter,
/// prioritize and bind calls share one connection instead of opening one (a TLS handshake
/// each) whenever more than two are in flight.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Serves `app` on `listener` (HTTPS when `tls` is given, HTTP/2 where the client negotiates
/// it, HTTP/1.1 with keep-alive otherwise) until `shutdown` resolves, then lets open
/// connections finish their current requests. Connections beyond the cap are closed at once
/// and counted; a client that does not finish the TLS handshake, send its headers (HTTP/1.1)
/// or its first request (HTTP/2) in time is disconnected. Each request carries the
/// connection's verified client certificate ([`crate::tls::PeerCertificate`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ConnLimits,
    tls: Option<Arc<crate::tls::TlsServer>>,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let conns = Arc::new(Semaphore::new(limits.max_connections));
    let (drain_tx, drain_rx) = tokio::sync::watch::channel(false);
    let builders = Arc::new(Builders::new(&limits));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = conns.clone().try_acquire_owned() else {
            metrics.http_connections_refused.inc();
            tracing::warn!(%peer, max = limits.max_connections, "connection refused: too many open connections");
            drop(stream);
            continue;
        };
        metrics.http_connections_accepted.inc();
        let _ = stream.set_nodelay(true);
        let conn = Connection {
            app: app.clone(),
            builders: builders.clone(),
            drain: drain_rx.clone(),
            peer,
            first_request_timeout: limits.header_read_timeout,
            metrics: metrics.clone(),
        };
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        let handshake_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            match acceptor {
                None => {
                    conn.run(
                        stream,
                        Protocol::Http1,
                        crate::tls::PeerCertificate::default(),
                    )
                    .await
                }
                Some(acceptor) => {
                    let tls =
                        crate::tls::handshake(acceptor, stream, handshake_timeout, peer).await;
                    if let Some(tls) = tls {
                        let session = &tls.get_ref().1;
                        let protocol = Protocol::of_tls(session.alpn_protocol());
                        let cert = session
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .map(|c| Arc::new(c.clone().into_owned()));
                        conn.run(tls, protocol, crate::tls::PeerCertificate(cert))
                            .await;
                    }
                }
            }
            drop(permit);
        });
    }
    let _ = drain_tx.send(true);
    // Every connection holds a permit until it ends: having them all back means drained.
    let _ = conns.acquire_many(limits.max_connections as u32).await;
    Ok(())
}

type Builder = hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>;

/// hyper's connection builders, one per protocol, configured once.
struct Builders {
    http1: Builder,
    http2: Builder,
}

impl Builders {
    fn new(limits: &ConnLimits) -> Self {
        use hyper_util::rt::{TokioExecutor, TokioTimer};
        let mut http1 = Builder::new(TokioExecutor::new());
        http1
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .keep_alive(true);
        let mut http2 = Builder::new(TokioExecutor::new());
        http2
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_streams_per_connection)
            // Pings find a peer that went away without closing (a node lost, a NAT entry
            // dropped) so its connection and permit are freed.
            .keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10));
        Self {
            http1: http1.http1_only(),
            http2: http2.http2_only(),
        }
    }

    fn get(&self, protocol: Protocol) -> &Builder {
        match protocol {
            Protocol::Http1 => &self.http1,
            Protocol::Http2 => &self.http2,
        }
    }
}

/// One accepted connection, served until it ends or the server drains.
struct Connection {
    app: Router,
    builders: Arc<Builders>,
    drain: tokio::sync::watch::Receiver<bool>,
    peer: std::net::SocketAddr,
    first_request_timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Connection {
    async fn run<I>(mut self, io: I, protocol: Protocol, cert: crate::tls::PeerCertificate)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        use hyper_util::rt::TokioIo;
        use hyper_util::service::TowerToHyperService;
        self.metrics
            .http_connections_served
            .get_or_create(&crate::metrics::ProtocolLabels {
                protocol: protocol.as_str(),
            })
            .inc();
        // hyper's header timeout covers HTTP/1.1 only; an HTTP/2 client gets the same time
        // for its first request, or the connection (and its permit) is let go.
        let first_request = Arc::new(tokio::sync::Notify::new());
        let seen = first_request.clone();
        let service = tower::ServiceBuilder::new()
            .map_request(move |mut req: axum::http::Request<hyper::body::Incoming>| {
                seen.notify_one();
                req.extensions_mut().insert(cert.clone());
                req
            })
            .service(self.app);
        let service = TowerToHyperService::new(service);
        let conn = self
            .builders
            .get(protocol)
            .serve_connection(TokioIo::new(io), service);
        tokio::pin!(conn);
        let deadline = tokio::time::sleep(self.first_request_timeout);
        tokio::pin!(deadline);
        let peer = self.peer;
        let mut awaiting_first = protocol == Protocol::Http2;
        let mut draining = false;
        loop {
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    break;
                }
                _ = first_request.notified(), if awaiting_first => awaiting_first = false,
                _ = &mut deadline, if awaiting_first => {
                    tracing::debug!(%peer, protocol = protocol.as_str(), "no request in time; connection closed");
                    break;
                }
                _ = self.drain.wait_for(|d| *d), if !draining => {
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}
