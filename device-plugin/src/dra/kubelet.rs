//! The DRA kubelet plugin service (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`, advertised as
//! `v1.DRAPlugin`) on `<plugins>/gpu.kudos.dev/dra.sock`.
//!
//! `NodePrepareResources`, per claim: a claim in the checkpoint is answered from it (its CDI
//! file re-written if it went missing), so preparing again is idempotent and needs no API
//! server; otherwise the ResourceClaim is read, its UID checked, its allocation planned
//! ([`super::prepare::plan`]), the CDI spec written and the checkpoint updated, in that order.
//! `NodeUnprepareResources` removes the CDI file, then the checkpoint entry; an unknown claim
//! is fine. Per-claim failures go into the claim's `error`, never a gRPC failure, so the
//! kubelet retries just that claim. Calls are serialized by the checkpoint's lock; the API
//! server is read outside it.

use super::checkpoint::{Checkpoint, PreparedDevice};
use super::{cdi, prepare};
use crate::backend::{Backends, Health};
use crate::health::HealthMap;
use crate::metrics::Metrics;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kudos_proto::dra::v1 as api;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{Mutex, watch};
use tonic::{Request, Response, Status};

/// Bound on reading one ResourceClaim.
const CLAIM_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Where ResourceClaims are read from (the API server; a map in tests).
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim `namespace/name`, or why it cannot be read.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<ResourceClaim, String>> + Send;
}

/// Claims from the API server.
#[derive(Clone)]
pub struct ApiClaims {
    client: kube::Client,
}

impl ApiClaims {
    /// Reads through `client`.
    pub fn new(client: kube::Client) -> Self {
        ApiClaims { client }
    }
}

impl ClaimSource for ApiClaims {
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<ResourceClaim, String>> + Send {
        let api: kube::Api<ResourceClaim> = kube::Api::namespaced(self.client.clone(), namespace);
        let what = format!("ResourceClaim {namespace}/{name}");
        let name = name.to_owned();
        async move {
            api.get(&name).await.map_err(|e| match e {
                kube::Error::Api(s) if s.code == 404 => format!("{what} not found"),
                kube::Error::Api(s) if s.code == 403 => format!(
                    "reading {what} is forbidden (RBAC: the plugin needs get on resourceclaims.resource.k8s.io): {}",
                    s.message
                ),
                e => format!("reading {what}: {e}"),
            })
        }
    }
}

/// Prepares and unprepares claims for this node.
pub struct Preparer<S> {
    source: S,
    node: String,
    backends: Backends,
    names: BTreeMap<String, String>,
    cdi: cdi::CdiDir,
    checkpoint: Mutex<Checkpoint>,
    health: watch::Receiver<Arc<HealthMap>>,
    metrics: Metrics,
}

fn to_wire(devices: &[PreparedDevice]) -> Vec<api::Device> {
    devices
        .iter()
        .map(|d| api::Device {
            request_names: d.request_names.clone(),
            pool_name: d.pool_name.clone(),
            device_name: d.device_name.clone(),
            cdi_device_ids: d.cdi_device_ids.clone(),
            share_id: None,
        })
        .collect()
}

impl<S: ClaimSource> Preparer<S> {
    /// A preparer of `node`'s devices.
    pub fn new(
        source: S,
        node: String,
        backends: Backends,
        cdi: cdi::CdiDir,
        checkpoint: Checkpoint,
        health: watch::Receiver<Arc<HealthMap>>,
        metrics: Metrics,
    ) -> Self {
        Preparer {
            source,
            node,
            names: prepare::device_names(&backends),
            backends,
            cdi,
            checkpoint: Mutex::new(checkpoint),
            health,
            metrics,
        }
    }

    async fn prepare_one(&self, c: &api::Claim) -> Result<Vec<api::Device>, String> {
        prepare::check_claim_ref(&c.namespace, &c.name, &c.uid)?;
        {
            let cp = self.checkpoint.lock().await;
            if let Some(p) = cp.get(&c.uid) {
                if !self.cdi.exists(&c.uid) {
                    tracing::warn!(claim = %c.uid, "the prepared claim's CDI file is missing; writing it again");
                    self.cdi
                        .write(&c.uid, &p.cdi_spec)
                        .map_err(|e| format!("writing the CDI spec: {e}"))?;
                }
                return Ok(to_wire(&p.devices));
            }
        }
        // Within the kubelet's own deadline for the call (45 s by default), so a hung API
        // server fails this claim in time for the kubelet to retry.
        let claim =
            tokio::time::timeout(CLAIM_READ_TIMEOUT, self.source.get(&c.namespace, &c.name))
                .await
                .map_err(|_| {
                    format!(
                        "reading ResourceClaim {}/{} took over {CLAIM_READ_TIMEOUT:?}",
                        c.namespace, c.name
                    )
                })??;
        let prepared = prepare::plan(&claim, &c.uid, &self.node, &self.backends, &self.names)?;
        let health = self.health.borrow().clone();
        for d in &prepared.devices {
            let id = self.names.get(&d.device_name);
            if id.and_then(|id| health.get(id)) == Some(&Health::Unhealthy) {
                tracing::warn!(claim = %c.uid, device = %d.device_name, "preparing an unhealthy device (allocated before it turned unhealthy?)");
            }
        }
        let mut cp = self.checkpoint.lock().await;
        if let Some(p) = cp.get(&c.uid) {
            // Prepared by a concurrent call meanwhile.
            return Ok(to_wire(&p.devices));
        }
        self.cdi
            .write(&c.uid, &prepared.cdi_spec)
            .map_err(|e| format!("writing the CDI spec: {e}"))?;
        let devices = to_wire(&prepared.devices);
        cp.insert(&c.uid, prepared)
            .map_err(|e| format!("recording the prepared claim: {e}"))?;
        tracing::info!(claim = %c.uid, namespace = %c.namespace, name = %c.name, devices = devices.len(), "prepared");
        Ok(devices)
    }

    async fn unprepare_one(&self, c: &api::Claim) -> Result<(), String> {
        if !prepare::valid_uid(&c.uid) {
            return Err(format!("claim UID {:?} is not a UID", c.uid));
        }
        let mut cp = self.checkpoint.lock().await;
        let removed = self
            .cdi
            .remove(&c.uid)
            .map_err(|e| format!("removing the CDI spec: {e}"))?;
        let known = cp
            .remove(&c.uid)
            .map_err(|e| format!("updating the checkpoint: {e}"))?;
        if known || removed {
            tracing::info!(claim = %c.uid, namespace = %c.namespace, name = %c.name, "unprepared");
        } else {
            tracing::debug!(claim = %c.uid, "unprepare of a claim not prepared here");
        }
        Ok(())
    }

    /// Prepares every claim, each answered on its own.
    pub async fn prepare(&self, claims: &[api::Claim]) -> api::NodePrepareResourcesResponse {
        let mut out = BTreeMap::new();
        for c in claims {
            let start = Instant::now();
            let result = self.prepare_one(c).await;
            self.metrics
                .allocation(result.is_ok(), start.elapsed().as_secs_f64());
            let resp = match result {
                Ok(devices) => api::NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(error) => {
                    tracing::warn!(claim = %c.uid, namespace = %c.namespace, name = %c.name, %error, "cannot prepare the claim");
                    api::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    }
                }
            };
            out.insert(c.uid.clone(), resp);
        }
        api::NodePrepareResourcesResponse {
            claims: out.into_iter().collect(),
        }
    }

    /// Unprepares every claim, each answered on its own.
    pub async fn unprepare(&self, claims: &[api::Claim]) -> api::NodeUnprepareResourcesResponse {
        let mut out = BTreeMap::new();
        for c in claims {
            let error = match self.unprepare_one(c).await {
                Ok(()) => String::new(),
                Err(e) => {
                    tracing::warn!(claim = %c.uid, error = %e, "cannot unprepare the claim");
                    e
                }
            };
            out.insert(c.uid.clone(), api::NodeUnprepareResourceResponse { error });
        }
        api::NodeUnprepareResourcesResponse {
            claims: out.into_iter().collect(),
        }
    }
}

/// The gRPC service over a [`Preparer`].
pub struct DraService<S>(pub Arc<Preparer<S>>);

/// Checks the size of a request before any work depends on it.
fn check_count(claims: &[api::Claim]) -> Result<(), Status> {
    kudos_api::bounds::validate_device_count("claims", claims.len())
        .map_err(|e| Status::invalid_argument(e.to_string()))
}

#[tonic::async_trait]
impl<S: ClaimSource> api::dra_plugin_server::DraPlugin for DraService<S> {
    async fn node_prepare_resources(
        &self,
        req: Request<api::NodePrepareResourcesRequest>,
    ) -> Result<Response<api::NodePrepareResourcesResponse>, Status> {
        let claims = req.into_inner().claims;
        check_count(&claims)?;
        Ok(Response::new(self.0.prepare(&claims).await))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<api::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<api::NodeUnprepareResourcesResponse>, Status> {
        let claims = req.into_inner().claims;
        check_count(&claims)?;
        Ok(Response::new(self.0.unprepare(&claims).await))
    }
}

#[cfg(test)]
mod tests;
