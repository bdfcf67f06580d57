//! A minimal blocking HTTP/1.1 client for loopback control endpoints (the kubelet-dm harness,
//! the orchestrator's `/explain` and `/ready`), so the tests need no HTTP client crate; over
//! TLS (rustls) for an orchestrator that serves HTTPS.

use anyhow::{Context, Result, bail};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A response: status and body.
#[derive(Debug, Clone)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// Body (de-chunked).
    pub body: Vec<u8>,
}

impl Response {
    /// Body as JSON; fails on a non-2xx status.
    pub fn json(&self) -> Result<serde_json::Value> {
        if !(200..300).contains(&self.status) {
            bail!(
                "HTTP {}: {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            );
        }
        serde_json::from_slice(&self.body).context("response is not JSON")
    }
}

/// Sends one request to `addr` (`host:port`) with `Connection: close`.
pub fn request(
    method: &str,
    addr: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<Response> {
    let s = connect(addr)?;
    exchange(s, method, addr, path, body)
}

/// How to reach an HTTPS server: the CA that signed its certificate, the name to check it
/// against, and the client certificate to present, if any.
#[derive(Clone, Debug)]
pub struct TlsClient {
    config: std::sync::Arc<rustls::ClientConfig>,
    server_name: rustls::pki_types::ServerName<'static>,
}

impl TlsClient {
    /// Trusts the PEM `ca`, checks the server's certificate names `server_name` (a DNS name
    /// or an IP address), presents `client` (PEM certificate, PEM key) when given.
    pub fn new(
        ca: &std::path::Path,
        server_name: &str,
        client: Option<(&std::path::Path, &std::path::Path)>,
    ) -> Result<Self> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(ca).with_context(|| format!("{}", ca.display()))? {
            roots.add(c?)?;
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let config = match client {
            Some((crt, key)) => builder.with_client_auth_cert(
                CertificateDer::pem_file_iter(crt)?.collect::<Result<Vec<_>, _>>()?,
                PrivateKeyDer::from_pem_file(key)?,
            )?,
            None => builder.with_no_client_auth(),
        };
        Ok(Self {
            config: std::sync::Arc::new(config),
            server_name: ServerName::try_from(server_name.to_string())?,
        })
    }
}

/// [`request`] over TLS as `tls` says.
pub fn request_tls(
    tls: &TlsClient,
    method: &str,
    addr: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<Response> {
    let conn = rustls::ClientConnection::new(tls.config.clone(), tls.server_name.clone())?;
    let s = rustls::StreamOwned::new(conn, connect(addr)?);
    exchange(s, method, addr, path, body)
}

/// [`request`] over TLS when `tls` is given, plain HTTP otherwise.
pub fn request_maybe_tls(
    tls: Option<&TlsClient>,
    method: &str,
    addr: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<Response> {
    match tls {
        Some(t) => request_tls(t, method, addr, path, body),
        None => request(method, addr, path, body),
    }
}

fn connect(addr: &str) -> Result<TcpStream> {
    let s = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(s)
}

fn exchange(
    mut s: impl Read + Write,
    method: &str,
    addr: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<Response> {
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
        payload.len()
    );
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    // A TLS server may close without close_notify once the response is out: what was read
    // is the response.
    match s.read_to_end(&mut raw) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e.into()),
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no HTTP header end")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut body = raw[split + 4..].to_vec();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("bad status line")?;
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body)?;
    }
    Ok(Response { status, body })
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let nl = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("bad chunk")?;
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&b[..nl])
                .split(';')
                .next()
                .unwrap_or("")
                .trim(),
            16,
        )?;
        b = &b[nl + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

/// GET, returning the body as JSON (non-2xx is an error).
pub fn get_json(addr: &str, path: &str) -> Result<serde_json::Value> {
    request("GET", addr, path, None)?.json()
}

/// POST a JSON body, returning the body as JSON (non-2xx is an error).
pub fn post_json(addr: &str, path: &str, body: &serde_json::Value) -> Result<serde_json::Value> {
    request("POST", addr, path, Some(body))?.json()
}
