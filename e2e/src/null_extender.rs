//! A do-nothing scheduler extender on loopback, HTTP/1.1 keep-alive (over TLS with a client
//! certificate required when started with [`Tls`]), one thread per connection:
//! `filter` echoes `NodeNames`, `prioritize` scores every node 0 and, when it is given an API
//! client, `bind` posts the Binding kube-scheduler asks for (what Kudos' `bind` does, minus every
//! check). The floor of what the extender protocol itself costs kube-scheduler with the same
//! verbs Kudos is configured with, to compare Kudos against. Given `filter_top`, `filter`
//! passes only the first that many names, as Kudos' filter passes only its best (it leaves
//! the others out, not failed).

use anyhow::Result;
use k8s_openapi::api::core::v1::{Binding, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;

/// Where `bind` posts Bindings: an API client and the runtime to run it on (the server's
/// threads are plain threads).
#[derive(Clone)]
pub struct Binder {
    pub client: kube::Client,
    pub runtime: tokio::runtime::Handle,
}

/// Connections every do-nothing extender of this process accepted, for the harness to count
/// how often kube-scheduler opens one (it keeps at most two idle per extender).
static CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Connections accepted so far by the do-nothing extenders of this process.
pub fn connections() -> u64 {
    CONNECTIONS.load(std::sync::atomic::Ordering::Relaxed)
}

/// HTTPS as the orchestrator serves it with the chart's settings: its serving certificate,
/// and a client certificate from `client_ca` required of every caller.
pub struct Tls {
    /// PEM serving certificate.
    pub cert: std::path::PathBuf,
    /// Its PEM key.
    pub key: std::path::PathBuf,
    /// PEM CA of the client certificates accepted.
    pub client_ca: std::path::PathBuf,
}

impl Tls {
    fn config(&self) -> Result<std::sync::Arc<rustls::ServerConfig>> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&self.client_ca)? {
            roots.add(c?)?;
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            provider.clone(),
        )
        .build()?;
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                CertificateDer::pem_file_iter(&self.cert)?.collect::<Result<Vec<_>, _>>()?,
                PrivateKeyDer::from_pem_file(&self.key)?,
            )?;
        Ok(std::sync::Arc::new(config))
    }
}

/// Starts the server; returns its `http(s)://127.0.0.1:<port>` URL prefix (verbs `filter`,
/// `prioritize`, and `bind` when `binder` is given). `filter` passes the first `filter_top`
/// names (all with `None`). It lives until the process exits.
pub fn start(
    binder: Option<Binder>,
    filter_top: Option<usize>,
    tls: Option<&Tls>,
) -> Result<String> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let tls = tls.map(Tls::config).transpose()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{}", l.local_addr()?);
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            CONNECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let binder = binder.clone();
            let tls = tls.clone();
            std::thread::spawn(move || {
                let _ = c.set_nodelay(true);
                let _ = match tls {
                    None => serve(c, binder.as_ref(), filter_top),
                    Some(config) => rustls::ServerConnection::new(config)
                        .map_err(anyhow::Error::from)
                        .and_then(|s| {
                            let stream = rustls::StreamOwned::new(s, c);
                            serve(stream, binder.as_ref(), filter_top)
                        }),
                };
            });
        }
    });
    Ok(url)
}

fn serve(c: impl Read + Write, binder: Option<&Binder>, filter_top: Option<usize>) -> Result<()> {
    let mut r = BufReader::new(c);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            r.read_line(&mut h)?;
            if h == "\r\n" || h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body)?;
        let args: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let out = if path.ends_with("/bind") {
            json!({"Error": bind(binder, &args).err().map(|e| format!("{e:#}")).unwrap_or_default()})
        } else {
            let mut names = args["NodeNames"].as_array().cloned().unwrap_or_default();
            if path.ends_with("/prioritize") {
                Value::Array(
                    names
                        .iter()
                        .map(|n| json!({"Host": n, "Score": 0}))
                        .collect(),
                )
            } else {
                names.truncate(filter_top.unwrap_or(usize::MAX));
                json!({"NodeNames": names, "FailedNodes": {}, "Error": ""})
            }
        };
        let b = out.to_string();
        let w = r.get_mut();
        write!(
            w,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )?;
        w.flush()?;
    }
}

/// Posts the Binding of `ExtenderBindingArgs` (`PodName`, `PodNamespace`, `PodUID`, `Node`).
fn bind(binder: Option<&Binder>, args: &Value) -> Result<()> {
    let Some(b) = binder else {
        anyhow::bail!("this null extender was started without an API client to bind with");
    };
    let field = |k: &str| args[k].as_str().unwrap_or_default().to_string();
    let (name, ns, uid, node) = (
        field("PodName"),
        field("PodNamespace"),
        field("PodUID"),
        field("Node"),
    );
    let binding: Binding = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }))?;
    let pods: Api<Pod> = Api::namespaced(b.client.clone(), &ns);
    b.runtime.block_on(async {
        pods.create_subresource::<_, Value>("binding", &name, &PostParams::default(), &binding)
            .await
    })?;
    Ok(())
}
