//! Handing a node from the bootstrap plugin to its group's plugin, one node at a time.
//!
//! The kubelet keeps one endpoint per resource name, and every Kudos plugin registers the
//! unified one: two plugins on one node replace each other's registration (and, serving the
//! same socket path, unlink each other's socket) for as long as both run. So a node runs the
//! bootstrap plugin or its group's, never both, and the switch is one label:
//! - the bootstrap DaemonSet requires [`labels::PLUGIN_GROUP`] to be absent;
//! - a group's DaemonSet requires it to name the group ([`crate::render::group_affinity`]);
//! - the rollout sets the label on a group's nodes only after the group's DaemonSet was
//!   applied, and removes it from nodes whose group has no DaemonSet (a group that left the
//!   configuration or still waits for its image), which brings the bootstrap plugin back.
//!
//! The DaemonSet controller then deletes the old pod and creates the new one; the device
//! plugin waits for the old socket to stop serving before it serves its own.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tracing::info;

use kudos_api::{PluginGroup, labels};

/// Errors labelling nodes.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// Listing the labelled nodes failed.
    #[error("listing nodes labelled {}", labels::PLUGIN_GROUP)]
    List(#[source] Box<kube::Error>),
    /// Patching a node's label failed.
    #[error("setting {} on node {node}", labels::PLUGIN_GROUP)]
    Patch {
        /// Node name.
        node: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
}

/// Label changes of one pass: `(node, Some(group))` set, `(node, None)` removed.
pub type LabelChanges = Vec<(String, Option<String>)>;

/// Makes [`labels::PLUGIN_GROUP`] name each node's group for the nodes of `served` (groups
/// whose DaemonSet exists) and removes it everywhere else. Nodes that no longer exist are
/// skipped. Returns what changed.
pub async fn label_nodes(
    client: &kube::Client,
    served: &[&PluginGroup],
) -> Result<LabelChanges, HandoverError> {
    let desired: BTreeMap<&str, &str> = served
        .iter()
        .flat_map(|g| g.nodes.iter().map(|n| (n.as_str(), g.name.as_str())))
        .collect();
    let api: Api<Node> = Api::all(client.clone());
    let labelled = api
        .list_metadata(&ListParams::default().labels(labels::PLUGIN_GROUP))
        .await
        .map_err(|e| HandoverError::List(Box::new(e)))?;
    let mut current: BTreeMap<String, String> = BTreeMap::new();
    for n in labelled.items {
        if let (Some(name), Some(group)) = (
            n.metadata.name,
            n.metadata
                .labels
                .and_then(|mut l| l.remove(labels::PLUGIN_GROUP)),
        ) {
            current.insert(name, group);
        }
    }
    let mut changes = LabelChanges::new();
    for (node, group) in &desired {
        if current.get(*node).map(String::as_str) != Some(*group) {
            changes.push((node.to_string(), Some(group.to_string())));
        }
    }
    for node in current.keys() {
        if !desired.contains_key(node.as_str()) {
            changes.push((node.clone(), None));
        }
    }
    let mut done = LabelChanges::new();
    for (node, group) in changes {
        let patch = json!({"metadata": {"labels": {labels::PLUGIN_GROUP: group}}});
        match api
            .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            // Deleted meanwhile: the node watch prunes it from the configuration.
            Err(kube::Error::Api(s)) if s.code == 404 => continue,
            Err(e) => {
                return Err(HandoverError::Patch {
                    node,
                    source: Box::new(e),
                });
            }
        }
        match &group {
            Some(g) => {
                info!(%node, group = %g, "node handed to its group's plugin DaemonSet")
            }
            None => info!(%node, "node handed back to the bootstrap plugin"),
        }
        done.push((node, group));
    }
    Ok(done)
}
