//! Who may call which HTTP route.
//!
//! Two kinds of caller reach the HTTP listener, and each is checked the way its peers in
//! Kubernetes are:
//!
//! - **The extender verbs** (`filter`, `prioritize`, `bind`) are called by kube-scheduler,
//!   which authenticates to an extender with a client certificate (`tlsConfig.certData` in
//!   its `KubeSchedulerConfiguration`). With [`ExtenderAccess::ClientCertificate`] a request
//!   needs a certificate the configured CA verified (see [`crate::tls`]) that names one of
//!   the allowed clients; `bind` acts with the orchestrator's `pods/binding` grant, so this
//!   is what keeps other pods from binding through it.
//! - **The read endpoints** (`/state`, `/explain/...`, `/status`, `/metrics`) expose the whole
//!   model, the plugin configuration and device IDs. With [`ReadAccess::Kubernetes`] a request
//!   needs a bearer token that TokenReview accepts and a SubjectAccessReview that allows `get`
//!   on the request's path as a non-resource URL, as kube-rbac-proxy does: Prometheus' usual
//!   `nonResourceURLs: ["/metrics"]` grant works unchanged, and operators get `/state`,
//!   `/status` and `/explain/*` from a ClusterRole.
//!
//! `/healthz` and `/readyz` stay open: the kubelet's probes carry no credentials.
//! Answers are cached briefly (allowed for the configured time, refused for 10 s), keyed by
//! token and path, so a scraping Prometheus costs the API server one review per interval.

use crate::http::HttpState;
use crate::metrics::ReasonLabels;
use crate::tls::PeerCertificate;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use std::sync::Arc;
use std::time::Duration;

/// How the extender verbs are authenticated.
#[derive(Clone, Debug, Default)]
pub enum ExtenderAccess {
    /// Anyone who can reach the port (development, standalone use).
    #[default]
    Open,
    /// A client certificate verified by the TLS client CA, naming one of `names` (a DNS
    /// subject alternative name); an empty list accepts any certificate the CA signed.
    ClientCertificate {
        /// Allowed client names.
        names: Vec<String>,
    },
}

/// How the read endpoints are authenticated.
#[derive(Clone, Default)]
pub enum ReadAccess {
    /// Anyone who can reach the port.
    #[default]
    Open,
    /// Bearer token, TokenReview and SubjectAccessReview.
    Kubernetes(Arc<dyn ReadAuthorizer>),
}

/// The access policy of the HTTP listener.
#[derive(Clone, Default)]
pub struct AccessPolicy {
    /// Extender verbs.
    pub extender: ExtenderAccess,
    /// Read endpoints.
    pub read: ReadAccess,
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An extender verb without a verified client certificate.
    #[error("this endpoint needs a client certificate signed by the orchestrator's client CA")]
    NoClientCertificate,
    /// A verified certificate that names no allowed client.
    #[error("client certificate {0:?} names none of the allowed extender clients")]
    ClientNotAllowed(Vec<String>),
    /// No bearer token.
    #[error(
        "this endpoint needs `Authorization: Bearer <token>` (a Kubernetes token allowed to get {0})"
    )]
    NoToken(String),
    /// TokenReview refused the token.
    #[error("token refused: {0}")]
    TokenRefused(String),
    /// SubjectAccessReview said no.
    #[error(
        "user {user:?} may not get {path} (grant it with a ClusterRole rule nonResourceURLs: [{path:?}], verbs: [get])"
    )]
    Forbidden {
        /// Authenticated user.
        user: String,
        /// Path asked for.
        path: String,
    },
    /// The API server could not answer.
    #[error("cannot check access now: {0}")]
    Unavailable(String),
}

impl Refusal {
    /// Label value of `kudos_orchestrator_http_requests_refused_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoClientCertificate => "noClientCertificate",
            Self::ClientNotAllowed(_) => "clientNotAllowed",
            Self::NoToken(_) => "noToken",
            Self::TokenRefused(_) => "tokenRefused",
            Self::Forbidden { .. } => "forbidden",
            Self::Unavailable(_) => "unavailable",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            Self::NoClientCertificate | Self::NoToken(_) | Self::TokenRefused(_) => {
                StatusCode::UNAUTHORIZED
            }
            Self::ClientNotAllowed(_) | Self::Forbidden { .. } => StatusCode::FORBIDDEN,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// Decides whether a bearer token may `get` a path.
pub trait ReadAuthorizer: Send + Sync + 'static {
    /// The user the token belongs to, if allowed.
    fn allow<'a>(&'a self, token: &'a str, path: &'a str)
    -> BoxFuture<'a, Result<String, Refusal>>;
}

/// At most this much of a refused request's body is read before the refusal is sent.
const DRAIN_MAX_BYTES: usize = 1 << 20;
/// For at most this long: enough for a body sent right behind its headers, short enough that
/// refused callers cannot hold the listener's request permits.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_millis(250);

/// Reads and discards what is left of a refused HTTP/2 request's body (bounded by
/// [`DRAIN_MAX_BYTES`] and [`DRAIN_TIME`], never buffered), so that the refusal ends the
/// request cleanly: an answer sent while the client is still uploading ends the stream with
/// RST_STREAM, which curl 7.88 reports as "Stream error in the HTTP/2 framing layer" instead
/// of the 401 or 403 (found by the real-node test). HTTP/1.1 needs none of this.
async fn drain(body: axum::body::Body) {
    use futures::StreamExt;
    let mut data = body.into_data_stream();
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut read = 0usize;
        while let Some(Ok(chunk)) = data.next().await {
            read += chunk.len();
            if read > DRAIN_MAX_BYTES {
                break;
            }
        }
    })
    .await;
}

/// [`refuse`] after [`drain`]ing the request's body.
async fn refuse_request(s: &HttpState, r: Refusal, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    if req.version() == axum::http::Version::HTTP_2 {
        drain(req.into_body()).await;
    }
    refuse(s, r, &path)
}

fn refuse(s: &HttpState, r: Refusal, what: &str) -> Response {
    s.metrics
        .access_refused
        .get_or_create(&ReasonLabels { reason: r.reason() })
        .inc();
    tracing::warn!(route = what, reason = r.reason(), error = %r, "request refused");
    let mut resp = (r.status(), format!("{r}\n")).into_response();
    if r.status() == StatusCode::UNAUTHORIZED
        && matches!(r, Refusal::NoToken(_) | Refusal::TokenRefused(_))
    {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    resp
}

/// Middleware of the extender verbs.
pub async fn extender_gate(State(s): State<Arc<HttpState>>, req: Request, next: Next) -> Response {
    if let ExtenderAccess::ClientCertificate { names } = &s.access.extender {
        let peer = req
            .extensions()
            .get::<PeerCertificate>()
            .cloned()
            .unwrap_or_default();
        if peer.0.is_none() {
            return refuse_request(&s, Refusal::NoClientCertificate, req).await;
        }
        if !names.is_empty() && !names.iter().any(|n| peer.names(n)) {
            let r = Refusal::ClientNotAllowed(peer.dns_names());
            return refuse_request(&s, r, req).await;
        }
    }
    next.run(req).await
}

/// Middleware of the read endpoints.
pub async fn read_gate(State(s): State<Arc<HttpState>>, req: Request, next: Next) -> Response {
    if let ReadAccess::Kubernetes(authz) = &s.access.read {
        let path = req.uri().path().to_owned();
        let token = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(|v| crate::auth::bearer(Some(v)));
        let token = match token {
            Some(Ok(t)) => t.to_owned(),
            _ => return refuse_request(&s, Refusal::NoToken(path), req).await,
        };
        match authz.allow(&token, &path).await {
            Ok(user) => tracing::debug!(user, path, "read allowed"),
            Err(r) => return refuse_request(&s, r, req).await,
        }
    }
    next.run(req).await
}

// === impl KubeReadAuthorizer ===

/// TokenReview + SubjectAccessReview against the API server, cached.
pub struct KubeReadAuthorizer {
    client: kube::Client,
    cache: crate::review_cache::ReviewCache<(String, String), String, Refusal>,
}

impl KubeReadAuthorizer {
    /// Decisions that allow are kept for `ttl`.
    pub fn new(client: kube::Client, ttl: Duration) -> Self {
        Self {
            client,
            cache: crate::review_cache::ReviewCache::new(ttl),
        }
    }

    async fn review(&self, token: &str, path: &str) -> Result<String, Refusal> {
        let user = crate::auth::token_review(&self.client, token, &[])
            .await
            .map_err(|e| match e {
                crate::auth::AuthError::Unavailable(m) => Refusal::Unavailable(m),
                crate::auth::AuthError::Invalid(m) => Refusal::TokenRefused(m),
                other => Refusal::TokenRefused(other.to_string()),
            })?;
        let name = user.username.clone().unwrap_or_default();
        let sar: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some("get".into()),
                }),
                resource_attributes: None,
            },
            ..Default::default()
        };
        let allowed = sar
            .create(&kube::api::PostParams::default(), &review)
            .await
            .map_err(|e| Refusal::Unavailable(format!("SubjectAccessReview failed: {e}")))?
            .status
            .is_some_and(|s| s.allowed);
        if allowed {
            Ok(name)
        } else {
            Err(Refusal::Forbidden {
                user: name,
                path: path.to_owned(),
            })
        }
    }
}

impl ReadAuthorizer for KubeReadAuthorizer {
    fn allow<'a>(
        &'a self,
        token: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<String, Refusal>> {
        let key = (token.to_owned(), path.to_owned());
        Box::pin(
            self.cache
                .get_or_review(key, self.review(token, path), |e| {
                    matches!(e, Refusal::Unavailable(_))
                }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An API server that knows token `reader` (user alice, group ops) and `nobody`, and lets
    /// group ops get `/state` only.
    fn api() -> (kube::Client, Arc<AtomicUsize>) {
        crate::fake_api::client(Arc::new(|_method, path, body| match path {
            "/apis/authentication.k8s.io/v1/tokenreviews" => {
                let status = match body["spec"]["token"].as_str().unwrap_or("") {
                    "reader" => {
                        serde_json::json!({"authenticated": true, "user": {"username": "alice", "groups": ["ops"]}})
                    }
                    "nobody" => {
                        serde_json::json!({"authenticated": true, "user": {"username": "bob", "groups": []}})
                    }
                    _ => {
                        serde_json::json!({"authenticated": false, "error": "invalid bearer token"})
                    }
                };
                (
                    201,
                    serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": body["spec"].clone(), "status": status}),
                )
            }
            "/apis/authorization.k8s.io/v1/subjectaccessreviews" => {
                let spec = &body["spec"];
                let in_ops = spec["groups"]
                    .as_array()
                    .is_some_and(|g| g.iter().any(|x| x == "ops"));
                let allowed = in_ops
                    && spec["nonResourceAttributes"]["path"] == "/state"
                    && spec["nonResourceAttributes"]["verb"] == "get";
                (
                    201,
                    serde_json::json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec.clone(), "status": {"allowed": allowed}}),
                )
            }
            other => panic!("unexpected call {other}"),
        }))
    }

    #[tokio::test]
    async fn token_and_path_decide_and_answers_are_cached() {
        let (client, calls) = api();
        let a = KubeReadAuthorizer::new(client, Duration::from_secs(60));
        assert_eq!(a.allow("reader", "/state").await, Ok("alice".into()));
        assert_eq!(calls.load(Ordering::SeqCst), 2, "one TokenReview, one SAR");
        assert_eq!(a.allow("reader", "/state").await, Ok("alice".into()));
        assert_eq!(calls.load(Ordering::SeqCst), 2, "cached");
        assert_eq!(
            a.allow("reader", "/metrics").await,
            Err(Refusal::Forbidden {
                user: "alice".into(),
                path: "/metrics".into()
            })
        );
        assert!(matches!(
            a.allow("nobody", "/state").await,
            Err(Refusal::Forbidden { .. })
        ));
        assert!(matches!(
            a.allow("forged", "/state").await,
            Err(Refusal::TokenRefused(e)) if e.contains("invalid")
        ));
    }
}
