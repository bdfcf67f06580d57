//! The kubelet-facing `v1beta1.DevicePlugin` service. It knows only the backends (through the
//! [`DeviceBackend`](crate::backend::DeviceBackend) trait) and a read-only health view; socket
//! handling and registration live in `runtime`.

use crate::backend::{Allocation, Backends, Device, DeviceBackend, Health};
use crate::health::HealthMap;
use crate::metrics::Metrics;
use crate::preferred::preferred;
use kudos_proto::deviceplugin::v1beta1 as api;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use tokio::sync::{Notify, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The options this plugin registers with; `GetDevicePluginOptions` answers the same.
pub fn options() -> api::DevicePluginOptions {
    api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// Open `ListAndWatch` streams, and a signal when the kubelet closes one.
#[derive(Debug, Default)]
pub struct Streams {
    active: AtomicUsize,
    /// Notified whenever the kubelet (not our own shutdown) closes a stream.
    pub closed: Notify,
}

impl Streams {
    /// Streams open now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }
}

/// One running instance of the service.
#[derive(Clone)]
pub struct PluginServer {
    backends: Backends,
    health: watch::Receiver<Arc<HealthMap>>,
    metrics: Metrics,
    streams: Arc<Streams>,
    stop: watch::Receiver<bool>,
}

impl PluginServer {
    /// `stop` ends every open `ListAndWatch` stream when it changes, so a graceful server
    /// shutdown is not held open by the kubelet's long-lived stream.
    pub fn new(
        backends: Backends,
        health: watch::Receiver<Arc<HealthMap>>,
        metrics: Metrics,
        streams: Arc<Streams>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        PluginServer {
            backends,
            health,
            metrics,
            streams,
            stop,
        }
    }

    /// The device list as the kubelet sees it.
    pub fn list(backends: &Backends, health: &HealthMap) -> api::ListAndWatchResponse {
        let devices = backends
            .devices()
            .map(|d| api::Device {
                id: d.id.clone(),
                health: health
                    .get(&d.id)
                    .copied()
                    .unwrap_or(Health::Healthy)
                    .as_str()
                    .to_owned(),
                topology: d.numa_node.map(|n| api::TopologyInfo {
                    nodes: vec![api::NumaNode { id: n }],
                }),
            })
            .collect();
        api::ListAndWatchResponse { devices }
    }

    /// Checks a list of device IDs from the kubelet before any work depends on its size: at
    /// most [`kudos_api::bounds::MAX_DEVICES_PER_NODE`] IDs, each one this plugin serves. One map lookup per ID,
    /// so a request of made-up IDs is refused in time linear in its length.
    fn check_ids(&self, what: &'static str, ids: &[String]) -> Result<(), Status> {
        kudos_api::bounds::validate_device_count(what, ids.len())
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        match ids.iter().find(|id| self.backends.lookup(id).is_none()) {
            Some(id) => Err(Status::invalid_argument(format!(
                "{what}: unknown device {id}"
            ))),
            None => Ok(()),
        }
    }

    /// Validates and answers one container request.
    fn allocate_container(
        &self,
        health: &HealthMap,
        ids: &[String],
    ) -> Result<api::ContainerAllocateResponse, Status> {
        if ids.is_empty() {
            return Err(Status::invalid_argument(
                "a container request names no devices",
            ));
        }
        kudos_api::bounds::validate_device_count("devices of one container", ids.len())
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let mut seen = HashSet::new();
        // Devices grouped by backend, in request order.
        let mut groups: Vec<(&Arc<dyn DeviceBackend>, Vec<&Device>)> = Vec::new();
        for id in ids {
            if !seen.insert(id.as_str()) {
                return Err(Status::invalid_argument(format!(
                    "device {id} is requested twice"
                )));
            }
            let Some((backend, device)) = self.backends.lookup(id) else {
                return Err(Status::invalid_argument(format!("unknown device {id}")));
            };
            if health.get(id).copied() == Some(Health::Unhealthy) {
                return Err(Status::failed_precondition(format!(
                    "device {id} is unhealthy"
                )));
            }
            match groups.iter_mut().find(|(b, _)| Arc::ptr_eq(b, backend)) {
                Some((_, devices)) => devices.push(device),
                None => groups.push((backend, vec![device])),
            }
        }
        let mut alloc = Allocation::default();
        for (backend, devices) in groups {
            alloc.merge(backend.allocate(&devices));
        }
        Ok(api::ContainerAllocateResponse {
            envs: alloc.envs.into_iter().collect(),
            mounts: Vec::new(),
            devices: alloc
                .device_specs
                .into_iter()
                .map(|(host_path, container_path, permissions)| api::DeviceSpec {
                    container_path,
                    host_path,
                    permissions,
                })
                .collect(),
            annotations: alloc.annotations.into_iter().collect(),
            cdi_devices: alloc
                .cdi_devices
                .into_iter()
                .map(|name| api::CdiDevice { name })
                .collect(),
        })
    }
}

#[tonic::async_trait]
impl api::device_plugin_server::DevicePlugin for PluginServer {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ReceiverStream<Result<api::ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let backends = self.backends.clone();
        let mut health = self.health.clone();
        let mut stop = self.stop.clone();
        let streams = self.streams.clone();
        streams.active.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            let mut kubelet_closed = false;
            loop {
                let list = Self::list(&backends, &health.borrow_and_update());
                if tx.send(Ok(list)).await.is_err() {
                    kubelet_closed = true;
                    break;
                }
                tokio::select! {
                    changed = health.changed() => if changed.is_err() { break },
                    _ = tx.closed() => { kubelet_closed = true; break },
                    _ = stop.changed() => break,
                }
            }
            streams.active.fetch_sub(1, Ordering::SeqCst);
            if kubelet_closed {
                tracing::info!("the kubelet closed the ListAndWatch stream");
                streams.closed.notify_one();
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let request = request.into_inner();
        kudos_api::bounds::validate_device_count(
            "containers in one request",
            request.container_requests.len(),
        )
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
        for r in &request.container_requests {
            self.check_ids("available devices", &r.available_device_i_ds)?;
            self.check_ids("must-include devices", &r.must_include_device_i_ds)?;
        }
        let container_responses = request
            .container_requests
            .iter()
            .map(|r| {
                preferred(
                    &r.available_device_i_ds,
                    &r.must_include_device_i_ds,
                    i64::from(r.allocation_size),
                    |a, b| self.backends.link_cost(a, b),
                )
                .map(|device_i_ds| api::ContainerPreferredAllocationResponse { device_i_ds })
                .map_err(|e| Status::invalid_argument(e.to_string()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let started = Instant::now();
        let health = self.health.borrow().clone();
        let request = request.into_inner();
        let result = kudos_api::bounds::validate_device_count(
            "containers in one request",
            request.container_requests.len(),
        )
        .map_err(|e| Status::invalid_argument(e.to_string()))
        .and_then(|()| {
            request
                .container_requests
                .iter()
                .map(|c| self.allocate_container(&health, &c.devices_ids))
                .collect::<Result<Vec<_>, _>>()
        });
        self.metrics
            .allocation(result.is_ok(), started.elapsed().as_secs_f64());
        match result {
            Ok(container_responses) => Ok(Response::new(api::AllocateResponse {
                container_responses,
            })),
            Err(status) => {
                tracing::warn!(error = %status.message(), "rejecting Allocate");
                Err(status)
            }
        }
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

#[cfg(test)]
mod tests;
