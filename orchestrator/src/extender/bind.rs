//! Binding a pod to a node: the one extender call that reaches the API server.
//!
//! [`KubeBinder`] creates the `pods/binding` subresource, carrying the placement's explanation
//! as an annotation the API server copies onto the pod. It is idempotent: when the API
//! server answers Conflict (the pod is already bound), it reads the pod and succeeds if the
//! pod is bound to the requested node, so a retried bind after a lost response succeeds.
//! [`LocalBinder`] (standalone mode, no API server) only records the decision.

use super::BIND_AFTER_RANKING_SECONDS;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Why `bind` refused a pod Kudos did not place.
#[derive(Debug, thiserror::Error)]
pub enum BindRefusal {
    /// No ranking of this pod (with this UID) is known.
    #[error("Kudos has not ranked pod {pod}; it binds only pods it filtered or prioritized")]
    NotRanked {
        /// `namespace/name`.
        pod: String,
    },
    /// The ranking is too old.
    #[error(
        "Kudos ranked pod {pod} {age:.0} s ago; a bind must follow its ranking within {BIND_AFTER_RANKING_SECONDS} s"
    )]
    Stale {
        /// `namespace/name`.
        pod: String,
        /// Seconds since the ranking.
        age: f64,
    },
    /// The node was not among those that passed.
    #[error("node {node} did not pass Kudos' filter for pod {pod}")]
    NodeDidNotPass {
        /// `namespace/name`.
        pod: String,
        /// Node asked for.
        node: String,
    },
}

impl BindRefusal {
    /// Label value of `kudos_extender_bind_refused_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotRanked { .. } => "notRanked",
            Self::Stale { .. } => "stale",
            Self::NodeDidNotPass { .. } => "nodeDidNotPass",
        }
    }
}

/// Bind failures.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The pod is bound elsewhere already.
    #[error("pod {pod} is already bound to node {bound}, not {requested}")]
    BoundElsewhere {
        /// `namespace/name`.
        pod: String,
        /// Node it is bound to.
        bound: String,
        /// Node asked for.
        requested: String,
    },
    /// The API server refused or failed.
    #[error("binding pod {pod} to node {node}: {source}")]
    Api {
        /// `namespace/name`.
        pod: String,
        /// Node asked for.
        node: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
}

/// One pod to bind: five strings, named so that none can take another's place.
#[derive(Clone, Copy, Debug)]
pub struct PodBinding<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The pod's name.
    pub name: &'a str,
    /// The pod's UID, empty when unknown (the API server then does not check it).
    pub uid: &'a str,
    /// The node to bind to.
    pub node: &'a str,
    /// The placement's explanation, the pod's [`kudos_api::labels::PLACEMENT`] annotation.
    pub explanation: &'a str,
}

/// Creates bindings.
pub trait Binder: Send + Sync + 'static {
    /// Binds the pod to its node.
    fn bind<'a>(&'a self, pod: PodBinding<'a>) -> BoxFuture<'a, Result<(), BindError>>;
}

/// Binds through the API server.
pub struct KubeBinder {
    client: kube::Client,
}

impl KubeBinder {
    /// Uses `client`.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl Binder for KubeBinder {
    fn bind<'a>(&'a self, pod: PodBinding<'a>) -> BoxFuture<'a, Result<(), BindError>> {
        let PodBinding {
            namespace,
            name,
            uid,
            node,
            explanation,
        } = pod;
        Box::pin(async move {
            let api: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), namespace);
            let placement = kudos_api::labels::PLACEMENT.to_owned();
            let binding = Binding {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some(namespace.to_owned()),
                    uid: (!uid.is_empty()).then(|| uid.to_owned()),
                    annotations: Some([(placement, explanation.to_owned())].into()),
                    ..Default::default()
                },
                target: ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(node.to_owned()),
                    ..Default::default()
                },
            };
            let pod_id = format!("{namespace}/{name}");
            let api_err = |e: kube::Error| BindError::Api {
                pod: pod_id.clone(),
                node: node.to_owned(),
                source: Box::new(e),
            };
            let r: Result<serde_json::Value, kube::Error> = api
                .create_subresource("binding", name, &kube::api::PostParams::default(), &binding)
                .await;
            match r {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let pod = api.get(name).await.map_err(api_err)?;
                    match pod.spec.and_then(|s| s.node_name) {
                        Some(n) if n == node => Ok(()),
                        Some(n) => Err(BindError::BoundElsewhere {
                            pod: pod_id.clone(),
                            bound: n,
                            requested: node.to_owned(),
                        }),
                        None => Err(api_err(kube::Error::Api(s))),
                    }
                }
                Err(e) => Err(api_err(e)),
            }
        })
    }
}

/// Standalone mode: nothing to bind against; the ledger records the decision.
pub struct LocalBinder;

impl Binder for LocalBinder {
    fn bind<'a>(&'a self, pod: PodBinding<'a>) -> BoxFuture<'a, Result<(), BindError>> {
        let (namespace, name, node) = (pod.namespace, pod.name, pod.node);
        tracing::info!(pod = %format!("{namespace}/{name}"), node, "standalone mode: bind recorded locally, no API server to bind with");
        Box::pin(std::future::ready(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn api(bound_to: Option<&'static str>) -> kube::Client {
        crate::fake_api::client(Arc::new(move |method, path, body| match (method.as_str(), path) {
            ("POST", "/api/v1/namespaces/ns/pods/p/binding") => match bound_to {
                None => {
                    assert_eq!(body["target"]["name"], "n1");
                    assert_eq!(body["target"]["kind"], "Node");
                    assert_eq!(body["metadata"]["annotations"]["kudos.dev/placement"], "why");
                    (201, serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}))
                }
                Some(_) => (409, crate::fake_api::status(409, "Conflict")),
            },
            ("GET", "/api/v1/namespaces/ns/pods/p") => (
                200,
                serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
                    "spec": {"nodeName": bound_to, "containers": []}}),
            ),
            other => panic!("unexpected request {other:?}"),
        }))
        .0
    }

    fn pod_p(node: &str) -> PodBinding<'_> {
        PodBinding {
            namespace: "ns",
            name: "p",
            uid: "u",
            node,
            explanation: "why",
        }
    }

    #[tokio::test]
    async fn bind_creates_binding() {
        KubeBinder::new(api(None)).bind(pod_p("n1")).await.unwrap();
    }

    #[tokio::test]
    async fn bind_is_idempotent() {
        KubeBinder::new(api(Some("n1")))
            .bind(pod_p("n1"))
            .await
            .unwrap();
        let e = KubeBinder::new(api(Some("n2")))
            .bind(pod_p("n1"))
            .await
            .unwrap_err();
        assert!(
            matches!(e, BindError::BoundElsewhere { ref bound, .. } if bound == "n2"),
            "{e}"
        );
    }
}
