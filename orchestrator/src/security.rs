//! Who may call the orchestrator, from the settings: the gRPC callers' authenticator, the
//! listeners' TLS servers (reloaded from their files) and the HTTP access policy. Each says
//! loudly what it leaves open.

use crate::config::{self, AuthMode, Settings};
use crate::{access, auth, tls};
use anyhow::Context;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// How gRPC callers are authenticated.
pub(crate) fn authenticator(
    s: &Settings,
    client: Option<&kube::Client>,
) -> anyhow::Result<Arc<dyn auth::Authenticator>> {
    Ok(match s.auth_mode {
        AuthMode::Static => {
            let path = s
                .static_tokens_file
                .as_ref()
                .context("--static-tokens-file is required with --auth static")?;
            Arc::new(auth::StaticAuthenticator::from_file(path)?)
        }
        AuthMode::TokenReview => {
            let Some(client) = client else {
                let why = "standalone mode has no TokenReview; start with --auth static --static-tokens-file to accept gRPC callers";
                tracing::warn!("{why}; every gRPC call is refused");
                return Ok(Arc::new(auth::DenyAll(why.into())));
            };
            Arc::new(auth::TokenReviewAuthenticator::new(
                client.clone(),
                s.audiences.clone(),
                s.allowed_users.clone(),
                s.auth_cache,
            ))
        }
    })
}

/// A TLS server for `files` offering the `alpn` protocols (preferred first), re-reading them
/// every `every`.
pub(crate) fn start_tls(
    files: &tls::TlsFiles,
    alpn: &[&[u8]],
    every: Duration,
) -> anyhow::Result<Arc<tls::TlsServer>> {
    let server = Arc::new(
        tls::TlsServer::load_with_alpn(files.clone(), alpn.iter().map(|p| p.to_vec()).collect())
            .with_context(|| format!("loading the TLS certificate {}", files.cert.display()))?,
    );
    let protocol = alpn
        .iter()
        .map(|p| String::from_utf8_lossy(p))
        .collect::<Vec<_>>()
        .join(",");
    tokio::spawn(
        server
            .clone()
            .watch(every)
            .instrument(tracing::info_span!("tls_reload", protocol)),
    );
    Ok(server)
}

/// The HTTP listener's TLS server (its reload task started) and access policy, from the
/// settings; says loudly what is left open.
pub(crate) fn http_security(
    s: &Settings,
    client: Option<&kube::Client>,
) -> anyhow::Result<(Option<Arc<tls::TlsServer>>, access::AccessPolicy)> {
    let tls = s
        .tls
        .as_ref()
        .map(|files| start_tls(files, &crate::http::ALPN, s.tls_reload_interval))
        .transpose()?;
    let extender = match s.extender_access {
        config::ExtenderAccessMode::ClientCertificate => {
            access::ExtenderAccess::ClientCertificate {
                names: s.extender_client_names.clone(),
            }
        }
        config::ExtenderAccessMode::Open => {
            tracing::warn!(
                "extender verbs (bind included) are open to anyone who reaches the HTTP port; set tls.clientCAFile to require kube-scheduler's client certificate"
            );
            access::ExtenderAccess::Open
        }
    };
    let read = match (s.read_access, client) {
        (config::ReadAccessMode::Kubernetes, Some(c)) => access::ReadAccess::Kubernetes(Arc::new(
            access::KubeReadAuthorizer::new(c.clone(), s.access_cache),
        )),
        (config::ReadAccessMode::Kubernetes, None) => anyhow::bail!(
            "access.read: kubernetes needs an API server for TokenReview and SubjectAccessReview, and this orchestrator runs standalone"
        ),
        (config::ReadAccessMode::Open, _) => {
            tracing::warn!(
                "/state, /explain, /status and /metrics are open to anyone who reaches the HTTP port; set access.read: kubernetes"
            );
            access::ReadAccess::Open
        }
    };
    Ok((tls, access::AccessPolicy { extender, read }))
}
