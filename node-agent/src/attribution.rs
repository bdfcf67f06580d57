//! Which pod and container holds which device, from the kubelet's PodResources API.
//!
//! The kubelet is the only authority on device assignment: it asked the device plugin to
//! allocate them. Its PodResources `List` reports, per container, the device IDs of each
//! extended resource. We keep the unified name (`kudos.dev/gpu`) and the vendor names
//! (`nvidia.com/gpu`, `amd.com/gpu`), and translate the IDs to the UUIDs the sampler knows:
//! the Kudos plugin serves vendor-prefixed IDs (`nv-GPU-<uuid>`), vendor plugins bare UUIDs.
//!
//! On a DRA node (issue 17) the same devices come as the container's `dynamic_resources`:
//! claim results of driver `gpu.kudos.dev`, named by their DRA device name, which is a one-way
//! function of the device ID ([`kudos_api::dra::device_name`]). Those are listed as
//! `dra:<device name>` and [`resolve_dra_names`] turns them back into device IDs from the
//! devices the sampler sees.
//!
//! PodResources carries no labels or UIDs; those come from [`crate::podmeta`].

use std::path::Path;
use std::time::Duration;

use kudos_proto::podresources::v1::{
    ListPodResourcesRequest, pod_resources_lister_client::PodResourcesListerClient,
};
use tonic::transport::Channel;

/// Devices held by one container.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Assignment {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Device IDs exactly as the kubelet reports them, sorted.
    pub device_ids: Vec<String>,
}

/// Errors reading assignments.
#[derive(Debug, thiserror::Error)]
pub enum AttributionError {
    /// The kubelet answered with an error or was unreachable.
    #[error("PodResources List failed: {0}")]
    List(#[source] Box<tonic::Status>),
    /// The kubelet did not answer in time.
    #[error("PodResources List timed out")]
    Timeout,
}

/// A source of device assignments; the kubelet in production, a vector in tests.
pub trait AssignmentSource: Send + Sync + 'static {
    /// The current assignments for the resource names this source watches.
    fn list(&self) -> impl Future<Output = Result<Vec<Assignment>, AttributionError>> + Send;
}

/// Maps a device ID as served to the kubelet to the vendor UUID the sampler knows.
///
/// `nv-GPU-<uuid>` (Kudos plugin) and `GPU-<uuid>` (NVIDIA plugin) both give `GPU-<uuid>`;
/// `amd-<bdf>` gives `<bdf>`. Anything else is returned unchanged.
pub fn device_id_to_uuid(id: &str) -> &str {
    for prefix in ["nv-", "amd-"] {
        if let Some(rest) = id.strip_prefix(prefix) {
            return rest;
        }
    }
    id
}

/// The prefix of a device the kubelet reports only by its DRA device name, until
/// [`resolve_dra_names`] finds its ID.
pub const DRA_NAME_PREFIX: &str = "dra:";

/// Replaces each `dra:<device name>` in `assignments` by the device ID of the sampled device
/// (`uuids`) whose Kudos device ID (`nv-<uuid>`) has that DRA name. Names of devices the
/// sampler does not see stay as they are (they have no readings either way).
pub fn resolve_dra_names<'a>(assignments: &mut [Assignment], uuids: impl Iterator<Item = &'a str>) {
    if !assignments
        .iter()
        .any(|a| a.device_ids.iter().any(|i| i.starts_with(DRA_NAME_PREFIX)))
    {
        return;
    }
    let by_name: std::collections::HashMap<String, String> = uuids
        .map(|u| {
            let id = format!("nv-{u}");
            (kudos_api::dra::device_name(&id), id)
        })
        .collect();
    for a in assignments {
        for id in &mut a.device_ids {
            if let Some(name) = id.strip_prefix(DRA_NAME_PREFIX)
                && let Some(real) = by_name.get(name)
            {
                *id = real.clone();
            }
        }
        a.device_ids.sort();
        a.device_ids.dedup();
    }
}

// === impl PodResources ===

/// The kubelet PodResources `v1` API on a Unix socket.
pub struct PodResources {
    client: PodResourcesListerClient<Channel>,
    resources: Vec<String>,
    timeout: Duration,
}

impl PodResources {
    /// Prepares a client; the connection is made lazily and re-made after kubelet restarts.
    pub fn new(socket: &Path, resources: Vec<String>, timeout: Duration) -> Self {
        Self {
            client: PodResourcesListerClient::new(kudos_proto::unix::connect_lazy(socket, timeout)),
            resources,
            timeout,
        }
    }
}

impl AssignmentSource for PodResources {
    async fn list(&self) -> Result<Vec<Assignment>, AttributionError> {
        let mut client = self.client.clone();
        let resp = tokio::time::timeout(self.timeout, client.list(ListPodResourcesRequest {}))
            .await
            .map_err(|_| AttributionError::Timeout)?
            .map_err(|s| AttributionError::List(Box::new(s)))?
            .into_inner();
        let mut out = Vec::new();
        for pod in resp.pod_resources {
            for c in pod.containers {
                let mut ids: Vec<String> = c
                    .devices
                    .into_iter()
                    .filter(|d| self.resources.iter().any(|r| r == &d.resource_name))
                    .flat_map(|d| d.device_ids)
                    .collect();
                // Devices allocated through DRA by the Kudos driver (a DRA-mode node).
                ids.extend(
                    c.dynamic_resources
                        .into_iter()
                        .flat_map(|r| r.claim_resources)
                        .filter(|r| r.driver_name == kudos_api::dra::DRIVER)
                        .map(|r| format!("{DRA_NAME_PREFIX}{}", r.device_name)),
                );
                if ids.is_empty() {
                    continue;
                }
                ids.sort();
                ids.dedup();
                out.push(Assignment {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: c.name,
                    device_ids: ids,
                });
            }
        }
        out.sort();
        Ok(out)
    }
}

// === impl StaticAssignments ===

/// Assignments set by hand: tests, and nodes without a kubelet socket (always empty).
#[derive(Default)]
pub struct StaticAssignments(pub std::sync::Mutex<Vec<Assignment>>);

impl StaticAssignments {
    /// Replaces the assignments.
    pub fn set(&self, a: Vec<Assignment>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = a;
    }
}

impl AssignmentSource for StaticAssignments {
    async fn list(&self) -> Result<Vec<Assignment>, AttributionError> {
        Ok(self.0.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

#[cfg(test)]
pub(crate) mod tests;
