use super::*;
use kudos_proto::podresources::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesResponse,
    PodResources as PodRes,
    pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};

/// A kubelet stand-in serving whatever the test puts in `pods`.
#[derive(Clone, Default)]
pub(crate) struct FakeKubelet {
    pub pods: Arc<Mutex<Vec<PodRes>>>,
}

#[tonic::async_trait]
impl PodResourcesLister for FakeKubelet {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let pods = self
            .pods
            .lock()
            .map_err(|_| Status::internal("poisoned"))?
            .clone();
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: pods,
        }))
    }
    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

/// Serves `kubelet` on `socket` until the test ends.
pub(crate) fn serve(kubelet: FakeKubelet, socket: &Path) {
    let listener = tokio::net::UnixListener::bind(socket).expect("bind");
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(kubelet))
            .serve_with_incoming(incoming)
            .await;
    });
}

/// A kubelet serving `kubelet` on `socket` that can be stopped the way a kubelet restart stops
/// it: connections close and the socket file goes away until [`serve_stoppable`] binds it again.
pub(crate) struct Serving {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    socket: PathBuf,
}

impl Serving {
    /// Stops serving and removes the socket.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the kubelet stand-in stops")
            .expect("server task");
        std::fs::remove_file(&self.socket).expect("remove the socket");
    }
}

/// Serves `kubelet` on `socket` until [`Serving::stop`].
pub(crate) fn serve_stoppable(kubelet: FakeKubelet, socket: &Path) -> Serving {
    let listener = tokio::net::UnixListener::bind(socket).expect("bind");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(kubelet))
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            })
            .await;
    });
    Serving {
        stop,
        task,
        socket: socket.to_owned(),
    }
}

pub(crate) fn pod(ns: &str, name: &str, containers: &[(&str, &str, &[&str])]) -> PodRes {
    PodRes {
        name: name.into(),
        namespace: ns.into(),
        containers: containers
            .iter()
            .map(|(c, res, ids)| ContainerResources {
                name: (*c).into(),
                devices: vec![ContainerDevices {
                    resource_name: (*res).into(),
                    device_ids: ids.iter().map(|s| (*s).into()).collect(),
                    topology: None,
                }],
                ..Default::default()
            })
            .collect(),
    }
}

#[test]
fn vendor_prefixes_map_to_uuids() {
    assert_eq!(device_id_to_uuid("nv-GPU-1234"), "GPU-1234");
    assert_eq!(device_id_to_uuid("GPU-1234"), "GPU-1234");
    assert_eq!(device_id_to_uuid("amd-0000:c1:00.0"), "0000:c1:00.0");
    assert_eq!(device_id_to_uuid("other"), "other");
}

#[tokio::test]
async fn lists_gpu_containers_over_a_unix_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::default();
    *kubelet.pods.lock().expect("lock") = vec![
        pod(
            "ml",
            "train",
            &[
                ("main", "kudos.dev/gpu", &["nv-GPU-b", "nv-GPU-a"]),
                ("sidecar", "cpu", &["x"]),
            ],
        ),
        pod("ml", "legacy", &[("main", "nvidia.com/gpu", &["GPU-c"])]),
        pod("other", "fpga", &[("main", "xilinx.com/fpga", &["f0"])]),
    ];
    serve(kubelet.clone(), &sock);
    let names = vec![
        "kudos.dev/gpu".to_string(),
        "nvidia.com/gpu".into(),
        "amd.com/gpu".into(),
    ];
    let pr = PodResources::new(&sock, names, Duration::from_secs(2));
    let got = pr.list().await.expect("list");
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].pod, "legacy");
    assert_eq!(got[0].device_ids, vec!["GPU-c"]);
    assert_eq!(got[1].pod, "train");
    assert_eq!(got[1].container, "main");
    assert_eq!(got[1].device_ids, vec!["nv-GPU-a", "nv-GPU-b"]);
    // Released devices disappear from the next list.
    kubelet.pods.lock().expect("lock").clear();
    assert!(pr.list().await.expect("list").is_empty());
}

#[tokio::test]
async fn missing_kubelet_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pr = PodResources::new(
        &dir.path().join("nope.sock"),
        vec!["kudos.dev/gpu".into()],
        Duration::from_millis(500),
    );
    assert!(pr.list().await.is_err());
}

/// A container whose devices the kubelet allocated through DRA claims: `(driver, device name)`.
fn dra_pod(ns: &str, name: &str, results: &[(&str, &str)]) -> PodRes {
    use kudos_proto::podresources::v1::{ClaimResource, DynamicResource};
    PodRes {
        name: name.into(),
        namespace: ns.into(),
        containers: vec![ContainerResources {
            name: "main".into(),
            dynamic_resources: vec![DynamicResource {
                claim_name: format!("{name}-gpu"),
                claim_namespace: ns.into(),
                claim_resources: results
                    .iter()
                    .map(|(driver, device)| ClaimResource {
                        driver_name: (*driver).into(),
                        pool_name: "node-a".into(),
                        device_name: (*device).into(),
                        cdi_devices: vec![],
                    })
                    .collect(),
            }],
            ..Default::default()
        }],
    }
}

#[tokio::test]
async fn dra_claims_of_the_kudos_driver_are_attributed_by_device_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::default();
    let name_a = kudos_api::dra::device_name("nv-GPU-a");
    let name_b = kudos_api::dra::device_name("nv-GPU-b");
    *kubelet.pods.lock().expect("lock") = vec![
        dra_pod(
            "ml",
            "train",
            &[
                (kudos_api::dra::DRIVER, name_b.as_str()),
                (kudos_api::dra::DRIVER, name_a.as_str()),
            ],
        ),
        // Another driver's devices are not ours to sample.
        dra_pod("ml", "nic", &[("net.example.com", "eth1")]),
    ];
    serve(kubelet.clone(), &sock);
    let pr = PodResources::new(&sock, vec!["kudos.dev/gpu".into()], Duration::from_secs(2));
    let mut got = pr.list().await.expect("list");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].pod, "train");
    assert!(
        got[0]
            .device_ids
            .iter()
            .all(|i| i.starts_with(DRA_NAME_PREFIX)),
        "{got:?}"
    );
    // The sampler sees GPU-a and GPU-b: the DRA names become the plugin's device IDs, which
    // the rest of the agent maps to UUIDs as on a device-plugin node.
    resolve_dra_names(&mut got, ["GPU-b", "GPU-a", "GPU-c"].into_iter());
    assert_eq!(got[0].device_ids, vec!["nv-GPU-a", "nv-GPU-b"]);
    assert_eq!(device_id_to_uuid(&got[0].device_ids[0]), "GPU-a");
    // A name no sampled device has stays as it is.
    let mut unknown = vec![Assignment {
        namespace: "ml".into(),
        pod: "p".into(),
        container: "c".into(),
        device_ids: vec![format!("{DRA_NAME_PREFIX}gone-0")],
    }];
    resolve_dra_names(&mut unknown, ["GPU-a"].into_iter());
    assert_eq!(unknown[0].device_ids, vec!["dra:gone-0"]);
}
