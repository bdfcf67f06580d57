//! Node, Pod and ResourceSlice watches: the cluster half of the index's writers.
//!
//! Each uses kube-runtime's `watcher` with the default backoff and applies events to the index
//! directly (the index is the store; no second cache). A watch restart (`Init` … `InitDone`)
//! buffers the full list and swaps it in at once, and the first `InitDone` of both watches
//! marks the index ready (`/readyz`). Pods are watched only when assigned
//! (`spec.nodeName!=`), which is all the free-device accounting needs.

use crate::index::SharedIndex;
use crate::kobj;
use crate::metrics::Metrics;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use std::sync::Arc;
use tracing::Instrument;

/// Spawns both watches; they run until the process ends. Names of deleted nodes that still
/// have a plugin configuration go to `deleted_nodes`, for the one writer of that configuration
/// to prune (the watch only translates).
pub fn spawn(
    client: kube::Client,
    index: SharedIndex,
    metrics: Arc<Metrics>,
    unified: String,
    deleted_nodes: tokio::sync::mpsc::UnboundedSender<String>,
) {
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let idx = index.clone();
    let uni = unified.clone();
    tokio::spawn(
        async move {
            let mut buf = Vec::new();
            let mut stream = watcher::watcher(nodes, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = stream.next().await {
                let mut index = idx.write();
                match ev {
                    Ok(Event::Apply(n)) => index.apply_node(kobj::node_info(&n, &uni)),
                    Ok(Event::Delete(n)) => {
                        let name = n.metadata.name.unwrap_or_default();
                        index.delete_node(&name);
                        let _ = deleted_nodes.send(name);
                    }
                    Ok(Event::Init) => buf.clear(),
                    Ok(Event::InitApply(n)) => buf.push(kobj::node_info(&n, &uni)),
                    Ok(Event::InitDone) => {
                        let n = buf.len();
                        index.reset_nodes(std::mem::take(&mut buf));
                        for gone in index.configured_nodes_not_listed() {
                            let _ = deleted_nodes.send(gone);
                        }
                        tracing::info!(nodes = n, "node list synced");
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "node watch failed; retrying with backoff")
                    }
                }
                metrics.nodes.set(index.node_count() as i64);
            }
        }
        .instrument(tracing::info_span!("node_watch")),
    );
    // Only what the index reads of each pod is deserialized (see [`crate::pod_view`]).
    let pods: kube::Api<crate::pod_view::WatchedPod> = kube::Api::all(client);
    tokio::spawn(
        async move {
            let mut buf = Vec::new();
            let cfg = watcher::Config::default().fields("spec.nodeName!=");
            let mut stream = watcher::watcher(pods, cfg).default_backoff().boxed();
            while let Some(ev) = stream.next().await {
                let facts = |p: &crate::pod_view::WatchedPod| {
                    kobj::pod_facts(&p.0, &unified).unwrap_or_else(|_| lenient(&p.0, &unified))
                };
                let mut index = index.write();
                match ev {
                    Ok(Event::Apply(p)) => index.apply_pod(&facts(&p)),
                    Ok(Event::Delete(p)) => index.delete_pod(&facts(&p)),
                    Ok(Event::Init) => buf.clear(),
                    Ok(Event::InitApply(p)) => buf.push(facts(&p)),
                    Ok(Event::InitDone) => {
                        index.reset_pods(&buf);
                        tracing::info!(pods = buf.len(), "pod list synced");
                        buf.clear();
                    }
                    Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying with backoff"),
                }
            }
        }
        .instrument(tracing::info_span!("pod_watch")),
    );
}

/// Spawns the watch of the Kudos driver's ResourceSlices (DRA nodes' devices, see
/// [`crate::index::slices`]); only where DRA is on (`nodes.allocationApi` dra or auto), since
/// the chart grants the read only then and older API servers do not serve
/// `resource.k8s.io/v1`.
pub fn spawn_slices(client: kube::Client, index: SharedIndex) {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    let slices: kube::Api<ResourceSlice> = kube::Api::all(client);
    let summary = |s: &ResourceSlice| {
        let name = s.metadata.name.clone().unwrap_or_default();
        (name, crate::index::slices::summarise(s))
    };
    tokio::spawn(
        async move {
            let mut buf = Vec::new();
            let cfg = watcher::Config::default().fields(&format!("spec.driver={}", kudos_api::dra::DRIVER));
            let mut stream = watcher::watcher(slices, cfg).default_backoff().boxed();
            while let Some(ev) = stream.next().await {
                let mut index = index.write();
                match ev {
                    Ok(Event::Apply(s)) => {
                        let (name, d) = summary(&s);
                        index.apply_slice(&name, d);
                    }
                    Ok(Event::Delete(s)) => index.apply_slice(&summary(&s).0, None),
                    Ok(Event::Init) => buf.clear(),
                    Ok(Event::InitApply(s)) => {
                        if let (name, Some(d)) = summary(&s) {
                            buf.push((name, d));
                        }
                    }
                    Ok(Event::InitDone) => {
                        tracing::info!(slices = buf.len(), "ResourceSlice list synced");
                        index.reset_slices(std::mem::take(&mut buf));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "ResourceSlice watch failed; retrying with backoff")
                    }
                }
            }
        }
        .instrument(tracing::info_span!("slice_watch")),
    );
}

/// Resource use of a pod whose Kudos annotations are malformed: still counts on its node.
fn lenient(p: &Pod, unified: &str) -> kobj::PodFacts {
    kobj::PodFacts {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        uid: p.metadata.uid.clone().unwrap_or_default(),
        node_name: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        requests: kobj::pod_requests(p, unified),
        terminated: matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        ),
        ..Default::default()
    }
}
