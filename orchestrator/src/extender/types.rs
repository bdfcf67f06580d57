//! The kube-scheduler extender wire types (`k8s.io/kube-scheduler/extender/v1`).
//!
//! The Go structs have no JSON tags, so keys are the Go field names (PascalCase); nested
//! Kubernetes objects use their own camelCase JSON (k8s-openapi types). Every field may be
//! `null` or absent, so every input field is an `Option` with a default.

use k8s_openapi::List;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `ExtenderArgs`: the filter and prioritize request.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgs {
    /// The pod being scheduled.
    #[serde(default)]
    pub pod: Option<Pod>,
    /// Candidate nodes in full (`nodeCacheCapable: false`).
    #[serde(default)]
    pub nodes: Option<List<Node>>,
    /// Candidate node names (`nodeCacheCapable: true`).
    #[serde(default)]
    pub node_names: Option<Vec<String>>,
}

/// `ExtenderFilterResult`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderFilterResult {
    /// Nodes that passed (when the request used `Nodes`).
    pub nodes: Option<List<Node>>,
    /// Names that passed (when the request used `NodeNames`).
    pub node_names: Option<Vec<String>>,
    /// Rejected nodes and why; kube-scheduler may retry them (preemption can help).
    #[serde(default)]
    pub failed_nodes: BTreeMap<String, String>,
    /// Rejected nodes that preemption cannot fix.
    #[serde(default)]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// A non-empty error fails the whole call.
    #[serde(default)]
    pub error: String,
}

/// One `HostPriority`; the prioritize answer is a bare array of these.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority {
    /// Node name.
    pub host: String,
    /// 0..=10 (`MaxExtenderPriority`).
    pub score: i64,
}

/// `ExtenderBindingArgs`.
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct ExtenderBindingArgs {
    /// Pod name.
    #[serde(rename = "PodName", default)]
    pub pod_name: Option<String>,
    /// Pod namespace.
    #[serde(rename = "PodNamespace", default)]
    pub pod_namespace: Option<String>,
    /// Pod UID.
    #[serde(rename = "PodUID", default)]
    pub pod_uid: Option<String>,
    /// Target node.
    #[serde(rename = "Node", default)]
    pub node: Option<String>,
}

/// `ExtenderBindingResult`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingResult {
    /// Empty on success.
    #[serde(default)]
    pub error: String,
}
