//! Who is calling the gRPC API, and for which node it may speak.
//!
//! Callers send `authorization: Bearer <token>`. An [`Authenticator`] turns the token into an
//! [`Identity`] whose `node` is the only node the caller may report about:
//!
//! - [`TokenReviewAuthenticator`] asks the API server (`authentication.k8s.io/v1`
//!   TokenReview). Since Kubernetes 1.30 (`ServiceAccountTokenPodNodeInfo`, GA in 1.32) a
//!   projected service-account token of a pod carries the node it runs on, returned as
//!   `status.user.extra["authentication.kubernetes.io/node-name"]`; that is the identity's node.
//!   Answers are cached briefly (successes for the configured time, refusals for 10 s) so a
//!   reconnecting fleet does not flood the API server.
//! - [`StaticAuthenticator`] reads a `token: node` YAML map, for development and tests.

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

/// The `user.extra` key carrying the node of a node-bound service-account token.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// User name (e.g. `system:serviceaccount:kudos-system:kudos-node-agent`).
    pub user: String,
    /// The node the token is bound to, if any.
    pub node: Option<String>,
}

/// Authentication failures.
#[derive(Clone, Debug, thiserror::Error)]
pub enum AuthError {
    /// No bearer token in the request.
    #[error("missing `authorization: Bearer <token>` metadata")]
    Missing,
    /// The token was refused.
    #[error("token refused: {0}")]
    Invalid(String),
    /// The user is authenticated but not on the allowed list.
    #[error("user {0:?} is not allowed to call the Kudos API (auth.allowedUsers)")]
    NotAllowed(String),
    /// The authenticator could not decide (API server unreachable).
    #[error("cannot check the token now: {0}")]
    Unavailable(String),
}

/// Checks a bearer token.
pub trait Authenticator: Send + Sync + 'static {
    /// Authenticates `token` (without the `Bearer ` prefix).
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Identity, AuthError>>;
}

/// Extracts the bearer token from an `authorization` header value.
pub fn bearer(value: Option<&str>) -> Result<&str, AuthError> {
    let v = value.ok_or(AuthError::Missing)?.trim();
    let token = v
        .strip_prefix("Bearer ")
        .or_else(|| v.strip_prefix("bearer "))
        .ok_or(AuthError::Missing)?
        .trim();
    if token.is_empty() {
        Err(AuthError::Missing)
    } else {
        Ok(token)
    }
}

// === impl StaticAuthenticator ===

/// Fixed tokens, each bound to one node.
#[derive(Debug, Default)]
pub struct StaticAuthenticator {
    tokens: HashMap<String, String>,
}

impl StaticAuthenticator {
    /// From a map token → node.
    pub fn new(tokens: HashMap<String, String>) -> Self {
        Self { tokens }
    }

    /// Reads a YAML map `token: node`.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading static tokens {}: {e}", path.display()))?;
        let tokens: BTreeMap<String, String> = serde_yaml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("parsing static tokens {}: {e}", path.display()))?;
        Ok(Self::new(tokens.into_iter().collect()))
    }
}

impl Authenticator for StaticAuthenticator {
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Identity, AuthError>> {
        let r = match self.tokens.get(token) {
            Some(node) => Ok(Identity {
                user: format!("static:{node}"),
                node: Some(node.clone()),
            }),
            None => Err(AuthError::Invalid("unknown static token".into())),
        };
        Box::pin(std::future::ready(r))
    }
}

// === impl DenyAll ===

/// Refuses every token, with a reason: standalone mode without static tokens, so the rest of
/// the orchestrator (extender, store) still runs.
#[derive(Debug)]
pub struct DenyAll(pub String);

impl Authenticator for DenyAll {
    fn authenticate<'a>(&'a self, _token: &'a str) -> BoxFuture<'a, Result<Identity, AuthError>> {
        Box::pin(std::future::ready(Err(AuthError::Invalid(self.0.clone()))))
    }
}

// === impl TokenReviewAuthenticator ===

/// Who `token` belongs to, by a TokenReview (`audiences` empty: the API server's default):
/// [`AuthError::Invalid`] when refused, [`AuthError::Unavailable`] when the API server could
/// not answer. Shared by the gRPC authenticator and the HTTP read gate.
pub async fn token_review(
    client: &kube::Client,
    token: &str,
    audiences: &[String],
) -> Result<k8s_openapi::api::authentication::v1::UserInfo, AuthError> {
    let api: kube::Api<TokenReview> = kube::Api::all(client.clone());
    let req = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_owned()),
            audiences: (!audiences.is_empty()).then(|| audiences.to_vec()),
        },
        ..Default::default()
    };
    let resp = api
        .create(&kube::api::PostParams::default(), &req)
        .await
        .map_err(|e| AuthError::Unavailable(format!("TokenReview failed: {e}")))?;
    let status = resp.status.unwrap_or_default();
    if status.authenticated != Some(true) {
        return Err(AuthError::Invalid(
            status.error.unwrap_or_else(|| "not authenticated".into()),
        ));
    }
    Ok(status.user.unwrap_or_default())
}

/// TokenReview against the API server, with a small cache.
pub struct TokenReviewAuthenticator {
    client: kube::Client,
    audiences: Vec<String>,
    allowed_users: Vec<String>,
    cache: crate::review_cache::ReviewCache<String, Identity, AuthError>,
}

impl TokenReviewAuthenticator {
    /// `allowed_users` empty allows every authenticated user with a node-bound token.
    pub fn new(
        client: kube::Client,
        audiences: Vec<String>,
        allowed_users: Vec<String>,
        ttl: Duration,
    ) -> Self {
        Self {
            client,
            audiences,
            allowed_users,
            cache: crate::review_cache::ReviewCache::new(ttl),
        }
    }

    async fn review(&self, token: &str) -> Result<Identity, AuthError> {
        let user = token_review(&self.client, token, &self.audiences).await?;
        let name = user.username.unwrap_or_default();
        if !self.allowed_users.is_empty() && !self.allowed_users.contains(&name) {
            return Err(AuthError::NotAllowed(name));
        }
        let node = user
            .extra
            .as_ref()
            .and_then(|e| e.get(NODE_NAME_EXTRA))
            .and_then(|v| v.first())
            .cloned();
        Ok(Identity { user: name, node })
    }
}

impl Authenticator for TokenReviewAuthenticator {
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Identity, AuthError>> {
        Box::pin(
            self.cache
                .get_or_review(token.to_owned(), self.review(token), |e| {
                    matches!(e, AuthError::Unavailable(_))
                }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer(Some("Bearer abc")).unwrap(), "abc");
        assert!(matches!(bearer(None), Err(AuthError::Missing)));
        assert!(matches!(bearer(Some("Basic x")), Err(AuthError::Missing)));
        assert!(matches!(bearer(Some("Bearer ")), Err(AuthError::Missing)));
    }

    fn review_api() -> (kube::Client, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        crate::fake_api::client(std::sync::Arc::new(|method, path, body| {
            assert_eq!(
                (method.as_str(), path),
                ("POST", "/apis/authentication.k8s.io/v1/tokenreviews")
            );
            let token = body["spec"]["token"].as_str().unwrap_or("");
            let status = match token {
                "agent-n1" => serde_json::json!({"authenticated": true, "user": {
                    "username": "system:serviceaccount:kudos-system:kudos-node-agent",
                    "extra": {NODE_NAME_EXTRA: ["n1"], "authentication.kubernetes.io/pod-name": ["agent-x"]}}}),
                "unbound" => {
                    serde_json::json!({"authenticated": true, "user": {"username": "alice"}})
                }
                _ => serde_json::json!({"authenticated": false, "error": "invalid bearer token"}),
            };
            (
                201,
                serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": body["spec"].clone(), "status": status}),
            )
        }))
    }

    #[tokio::test]
    async fn token_review_maps_node_bound_tokens_and_caches() {
        let (client, calls) = review_api();
        let a = TokenReviewAuthenticator::new(client, vec![], vec![], Duration::from_secs(60));
        let id = a.authenticate("agent-n1").await.unwrap();
        assert_eq!(id.node.as_deref(), Some("n1"));
        a.authenticate("agent-n1").await.unwrap();
        assert_eq!(
            calls.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "second answer comes from the cache"
        );
        assert_eq!(a.authenticate("unbound").await.unwrap().node, None);
        assert!(
            matches!(a.authenticate("forged").await, Err(AuthError::Invalid(m)) if m.contains("invalid"))
        );
    }

    #[tokio::test]
    async fn token_review_enforces_allowed_users() {
        let (client, _) = review_api();
        let a = TokenReviewAuthenticator::new(
            client,
            vec![],
            vec!["someone-else".into()],
            Duration::from_secs(60),
        );
        assert!(matches!(
            a.authenticate("agent-n1").await,
            Err(AuthError::NotAllowed(_))
        ));
    }

    #[tokio::test]
    async fn static_tokens_map_to_nodes() {
        let a = StaticAuthenticator::new([("t1".to_owned(), "n1".to_owned())].into());
        assert_eq!(
            a.authenticate("t1").await.unwrap().node.as_deref(),
            Some("n1")
        );
        assert!(matches!(
            a.authenticate("t2").await,
            Err(AuthError::Invalid(_))
        ));
    }
}
