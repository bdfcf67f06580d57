//! HTTPS for the HTTP listener.
//!
//! The serving certificate, its key and the CA that signs clients' certificates are files (a
//! mounted Secret, `tls.crt`, `tls.key`, `ca.crt`). [`TlsServer`] re-reads them periodically
//! and serves new connections with the new ones once they parse, so a certificate renewed by
//! cert-manager or a rotated Secret takes effect without a restart; a half-written or broken
//! update is logged and the previous certificate kept.
//!
//! Client certificates are verified against the CA but not required by the handshake: the
//! kubelet's HTTPS probes and bearer-token readers present none. Which routes need one is the
//! access policy's decision ([`crate::access`]), made on the [`PeerCertificate`] each request
//! carries.

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Where the TLS material is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain served to clients.
    pub cert: PathBuf,
    /// PEM private key of `cert` (PKCS#1, PKCS#8 or SEC1).
    pub key: PathBuf,
    /// PEM CA bundle that signs client certificates; without it no client certificate is
    /// asked for.
    pub client_ca: Option<PathBuf>,
}

/// TLS material that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A file held no usable PEM object of the expected kind.
    #[error("{path}: {what}")]
    Pem {
        /// File.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// rustls refused the combination (key does not match the certificate, ...).
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            what: format!("not a PEM certificate list: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            what: "holds no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

/// The contents of the three files, compared to notice a change.
#[derive(PartialEq, Eq)]
struct Material {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl Material {
    fn read(files: &TlsFiles) -> Result<Self, TlsError> {
        Ok(Self {
            cert: read(&files.cert)?,
            key: read(&files.key)?,
            client_ca: files.client_ca.as_deref().map(read).transpose()?,
        })
    }

    fn server_config(&self, files: &TlsFiles, alpn: &[Vec<u8>]) -> Result<ServerConfig, TlsError> {
        let certs = certificates(&files.cert, &self.cert)?;
        let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| TlsError::Pem {
            path: files.key.clone(),
            what: format!("no usable private key: {e}"),
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match (&files.client_ca, &self.client_ca) {
            (Some(path), Some(pem)) => {
                let roots =
                    kudos_common::grpc_tls::root_store(pem).map_err(|what| TlsError::Pem {
                        path: path.clone(),
                        what,
                    })?;
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .allow_unauthenticated()
                        .build()
                        .map_err(|e| TlsError::Config(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| {
            TlsError::Config(format!(
                "{} with {}: {e}",
                files.cert.display(),
                files.key.display()
            ))
        })?;
        config.alpn_protocols = alpn.to_vec();
        Ok(config)
    }
}

/// The current server configuration, replaced when the files change.
pub struct TlsServer {
    files: TlsFiles,
    alpn: Vec<Vec<u8>>,
    current: RwLock<(Arc<ServerConfig>, Material)>,
}

impl TlsServer {
    /// Reads and checks the files, for the HTTP listener (ALPN `h2`, then `http/1.1`); an
    /// error here stops the start.
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        Self::load_with_alpn(files, crate::http::ALPN.map(<[u8]>::to_vec).to_vec())
    }

    /// Reads and checks the files, offering the `alpn` protocols (`h2` for gRPC).
    pub fn load_with_alpn(files: TlsFiles, alpn: Vec<Vec<u8>>) -> Result<Self, TlsError> {
        let material = Material::read(&files)?;
        let config = Arc::new(material.server_config(&files, &alpn)?);
        Ok(Self {
            files,
            alpn,
            current: RwLock::new((config, material)),
        })
    }

    /// The acceptor for the next connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let g = self.current.read().unwrap_or_else(|e| e.into_inner());
        tokio_rustls::TlsAcceptor::from(g.0.clone())
    }

    /// Re-reads the files: `Ok(true)` when they changed and are now served, `Ok(false)` when
    /// unchanged, an error (the old configuration kept) when the new contents do not work.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let material = Material::read(&self.files)?;
        {
            let g = self.current.read().unwrap_or_else(|e| e.into_inner());
            if g.1 == material {
                return Ok(false);
            }
        }
        let config = Arc::new(material.server_config(&self.files, &self.alpn)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (config, material);
        Ok(true)
    }

    /// Reloads every `every` for as long as the process runs.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut failing = false;
        loop {
            tick.tick().await;
            match self.reload() {
                Ok(true) => {
                    failing = false;
                    tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                }
                Ok(false) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::error!(error = %e, "TLS files changed but cannot be used; still serving the previous certificate");
                }
                Err(_) => {}
            }
        }
    }
}

/// The TLS handshake of an accepted connection, within `timeout`; a failure or timeout is
/// logged at debug and gives `None`. Shared by the HTTP and gRPC listeners.
pub async fn handshake(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: tokio::net::TcpStream,
    timeout: Duration,
    peer: std::net::SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

/// The client certificate a connection presented and the CA verified (none: no certificate,
/// or plain HTTP). Every request carries it as an extension.
#[derive(Clone, Debug, Default)]
pub struct PeerCertificate(pub Option<Arc<CertificateDer<'static>>>);

impl PeerCertificate {
    /// Whether the certificate names `name` (a DNS subject alternative name).
    pub fn names(&self, name: &str) -> bool {
        let Some(der) = &self.0 else { return false };
        let Ok(cert) = webpki::EndEntityCert::try_from(der.as_ref()) else {
            return false;
        };
        let Ok(server_name) = ServerName::try_from(name) else {
            return false;
        };
        cert.verify_is_valid_for_subject_name(&server_name).is_ok()
    }

    /// The DNS names the certificate carries, for log lines.
    pub fn dns_names(&self) -> Vec<String> {
        let Some(der) = &self.0 else {
            return Vec::new();
        };
        webpki::EndEntityCert::try_from(der.as_ref())
            .map(|c| c.valid_dns_names().map(str::to_owned).collect())
            .unwrap_or_default()
    }
}

/// A gRPC connection: plain TCP or TLS. tonic serves either through the `incoming` stream of
/// [`grpc_incoming`].
pub enum GrpcConn {
    /// Plain TCP (no TLS configured).
    Plain(tokio::net::TcpStream),
    /// TLS over TCP.
    Tls(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
}

impl tonic::transport::server::Connected for GrpcConn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            GrpcConn::Plain(s) => s.connect_info(),
            GrpcConn::Tls(s) => s.get_ref().0.connect_info(),
        }
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            GrpcConn::Plain($s) => {
                let $s = std::pin::Pin::new($s);
                $e
            }
            GrpcConn::Tls($s) => {
                let $s = std::pin::Pin::new($s.as_mut());
                $e
            }
        }
    };
}

impl tokio::io::AsyncRead for GrpcConn {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        delegate!(self, s => s.poll_read(cx, buf))
    }
}

impl tokio::io::AsyncWrite for GrpcConn {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        delegate!(self, s => s.poll_write(cx, buf))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        delegate!(self, s => s.poll_flush(cx))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        delegate!(self, s => s.poll_shutdown(cx))
    }
}

/// The gRPC listener's connections: accepted on `listener`, TLS-handshaken (within
/// `handshake_timeout`, each on its own task so a slow client holds up nobody) when `tls` is
/// given. Failed handshakes are logged at debug and dropped.
pub fn grpc_incoming(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<TlsServer>>,
    handshake_timeout: Duration,
) -> impl futures::Stream<Item = Result<GrpcConn, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<GrpcConn, std::io::Error>>(64);
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "gRPC accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            if tx.is_closed() {
                break;
            }
            match &tls {
                None => {
                    if tx.send(Ok(GrpcConn::Plain(stream))).await.is_err() {
                        break;
                    }
                }
                Some(tls) => {
                    let acceptor = tls.acceptor();
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        if let Some(s) = handshake(acceptor, stream, handshake_timeout, peer).await
                        {
                            let _ = tx.send(Ok(GrpcConn::Tls(Box::new(s)))).await;
                        }
                    });
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
