//! Channels to the orchestrator's gRPC API over TLS.
//!
//! The device plugin and the node agent send a bearer token with every call, so an
//! `https://` orchestrator address gets a TLS connection (rustls, ring, HTTP/2 by ALPN) that
//! trusts only the CA in a given PEM file (the chart mounts the orchestrator's CA): the token
//! never crosses the network in the clear, and only the orchestrator's certificate is
//! accepted. An `http://` address stays plain (development, tests on loopback).

use std::path::Path;
use std::sync::Arc;
use tonic::transport::{Channel, Endpoint, Uri};

/// Why a channel could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The address is not a URI tonic accepts.
    #[error("orchestrator address {0:?}: {1}")]
    Address(String, String),
    /// `https://` without a CA file.
    #[error(
        "orchestrator address {0:?} is https:// but no CA file was given (--orchestrator-ca-file)"
    )]
    NoCa(String),
    /// The CA file cannot be used.
    #[error("orchestrator CA file {0}: {1}")]
    Ca(String, String),
}

/// The CA certificates of a PEM bundle as a trust store: every block must be a usable CA
/// certificate, and there must be at least one. The error says which, for the file's owner.
pub fn root_store(pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate list: {e}"))?;
    if certs.is_empty() {
        return Err("holds no CERTIFICATE block".into());
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in certs {
        roots
            .add(c)
            .map_err(|e| format!("not a usable CA certificate: {e}"))?;
    }
    Ok(roots)
}

fn client_config(ca: &Path) -> Result<rustls::ClientConfig, ChannelError> {
    let bad = |e: String| ChannelError::Ca(ca.display().to_string(), e);
    let pem = std::fs::read(ca).map_err(|e| bad(e.to_string()))?;
    let roots = root_store(&pem).map_err(bad)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// A lazily connected channel to `addr`, configured by `configure` (timeouts, keep-alive):
/// TLS trusting `ca` for `https://`, plain for `http://`.
pub fn channel(
    addr: &str,
    ca: Option<&Path>,
    configure: impl FnOnce(Endpoint) -> Endpoint,
) -> Result<Channel, ChannelError> {
    let endpoint = Endpoint::from_shared(addr.to_owned())
        .map_err(|e| ChannelError::Address(addr.into(), e.to_string()))?;
    let endpoint = configure(endpoint);
    let uri: Uri = addr
        .parse()
        .map_err(|e: http::uri::InvalidUri| ChannelError::Address(addr.into(), e.to_string()))?;
    if uri.scheme_str() != Some("https") {
        return Ok(endpoint.connect_lazy());
    }
    let ca = ca.ok_or_else(|| ChannelError::NoCa(addr.into()))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client_config(ca)?));
    let connector = tower::service_fn(move |uri: Uri| {
        let tls = tls.clone();
        async move {
            let host = uri
                .host()
                .unwrap_or_default()
                .trim_matches(['[', ']'])
                .to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            let _ = tcp.set_nodelay(true);
            let name = rustls::pki_types::ServerName::try_from(host)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let stream = tls.connect(name, tcp).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    });
    Ok(endpoint.connect_with_connector_lazy(connector))
}
