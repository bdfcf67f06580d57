//! Waiting on what the scheduler did with a pod, as every scenario does.

use crate::proc::wait_for;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use std::time::Duration;

/// Waits up to a minute for pod `name` to be bound; returns its node.
pub async fn bound_node(pods: &Api<Pod>, name: &str) -> anyhow::Result<String> {
    wait_for(
        &format!("pod {name} bound"),
        Duration::from_secs(60),
        Duration::from_millis(200),
        async || pods.get(name).await.ok()?.spec?.node_name,
    )
    .await
}

/// Waits up to `timeout` for the scheduler to mark pod `name` unschedulable; returns the reason
/// and the message of its `PodScheduled` condition.
pub async fn unschedulable(
    pods: &Api<Pod>,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<(String, String)> {
    wait_for(
        &format!("pod {name} unschedulable"),
        timeout,
        Duration::from_millis(200),
        async || {
            let p = pods.get(name).await.ok()?;
            let c = p
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "PodScheduled")?;
            (c.status == "False")
                .then(|| (c.reason.unwrap_or_default(), c.message.unwrap_or_default()))
        },
    )
    .await
}

/// Pods of `namespace` whose placement Kudos explained, as `kubectl describe pod` shows it:
/// the `kudos.dev/placement` annotation on pods bound through the extender, a `KudosRanked`
/// Event on pods Kudos ranked but did not bind (it stops sending Events once it binds).
pub async fn explained(
    client: &kube::Client,
    namespace: &str,
) -> anyhow::Result<std::collections::BTreeSet<String>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), namespace);
    let annotated = pods
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|p| {
            p.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(kudos_api::labels::PLACEMENT))
        })
        .filter_map(|p| p.metadata.name);
    let evented = events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("KudosRanked"))
        .filter_map(|e| e.regarding?.name);
    Ok(annotated.chain(evented).collect())
}
