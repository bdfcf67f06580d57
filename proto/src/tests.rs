//! Wire-compatibility tests: the kubelet only talks to us if field numbers, packages and
//! method paths match upstream byte for byte.

use crate::deviceplugin::v1beta1 as dp;
use crate::dra::v1 as dra;
use crate::kudos::v1 as kudos;
use crate::pluginregistration::v1 as reg;
use crate::podresources::v1 as pr;
use prost::Message;
use std::sync::{Arc, Mutex};

/// Length-delimited field: tag byte (field << 3 | 2), one-byte length, payload.
fn ld(field: u8, payload: &[u8]) -> Vec<u8> {
    assert!(
        payload.len() < 128,
        "test helper only handles one-byte lengths"
    );
    let mut out = vec![(field << 3) | 2, payload.len() as u8];
    out.extend_from_slice(payload);
    out
}

fn roundtrip<M: Message + Default + PartialEq + std::fmt::Debug>(msg: &M) {
    let bytes = msg.encode_to_vec();
    let back = M::decode(bytes.as_slice()).expect("decoding what we encoded");
    assert_eq!(&back, msg);
}

#[test]
fn register_request_bytes_match_upstream_field_numbers() {
    let req = dp::RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "kudos.sock".into(),
        resource_name: "kudos.dev/gpu".into(),
        options: Some(dp::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }),
    };
    // Hand-computed: 1=version, 2=endpoint, 3=resource_name, 4=options{2: true as varint}.
    let mut expected = Vec::new();
    expected.extend(ld(1, b"v1beta1"));
    expected.extend(ld(2, b"kudos.sock"));
    expected.extend(ld(3, b"kudos.dev/gpu"));
    expected.extend([0x22, 0x02, 0x10, 0x01]);
    assert_eq!(req.encode_to_vec(), expected);
    roundtrip(&req);
}

#[test]
fn allocate_response_bytes_match_upstream_field_numbers() {
    let resp = dp::AllocateResponse {
        container_responses: vec![dp::ContainerAllocateResponse {
            envs: [("NVIDIA_VISIBLE_DEVICES".to_string(), "GPU-a".to_string())].into(),
            mounts: vec![],
            devices: vec![dp::DeviceSpec {
                container_path: "/dev/nvidia0".into(),
                host_path: "/dev/nvidia0".into(),
                permissions: "rw".into(),
            }],
            annotations: Default::default(),
            cdi_devices: vec![dp::CdiDevice {
                name: "nvidia.com/gpu=0".into(),
            }],
        }],
    };
    // envs (1) is a map: an entry message {1: key, 2: value}; devices (3); cdi_devices (5).
    let mut env_entry = ld(1, b"NVIDIA_VISIBLE_DEVICES");
    env_entry.extend(ld(2, b"GPU-a"));
    let mut spec = ld(1, b"/dev/nvidia0");
    spec.extend(ld(2, b"/dev/nvidia0"));
    spec.extend(ld(3, b"rw"));
    let cdi = ld(1, b"nvidia.com/gpu=0");
    let mut container = ld(1, &env_entry);
    container.extend(ld(3, &spec));
    container.extend(ld(5, &cdi));
    assert_eq!(container.len(), 87, "hand count of the container response");
    let expected = ld(1, &container);
    assert_eq!(resp.encode_to_vec(), expected);
    roundtrip(&resp);
}

#[test]
fn device_plugin_messages_roundtrip() {
    roundtrip(&dp::ListAndWatchResponse {
        devices: vec![dp::Device {
            id: "nv-GPU-1".into(),
            health: dp::HEALTHY.into(),
            topology: Some(dp::TopologyInfo {
                nodes: vec![dp::NumaNode { id: 1 }],
            }),
        }],
    });
    roundtrip(&dp::PreferredAllocationRequest {
        container_requests: vec![dp::ContainerPreferredAllocationRequest {
            available_device_i_ds: vec!["a".into(), "b".into()],
            must_include_device_i_ds: vec!["a".into()],
            allocation_size: 2,
        }],
    });
    roundtrip(&dp::PreferredAllocationResponse {
        container_responses: vec![dp::ContainerPreferredAllocationResponse {
            device_i_ds: vec!["a".into()],
        }],
    });
    roundtrip(&dp::PreStartContainerRequest {
        devices_ids: vec!["x".into()],
    });
    // NUMANode.ID is field 1, a varint: {08 01}. TopologyInfo.nodes is field 1.
    let topo = dp::TopologyInfo {
        nodes: vec![dp::NumaNode { id: 1 }],
    };
    assert_eq!(topo.encode_to_vec(), vec![0x0a, 0x02, 0x08, 0x01]);
}

#[test]
fn pod_resources_messages_roundtrip() {
    let list = pr::ListPodResourcesResponse {
        pod_resources: vec![pr::PodResources {
            name: "train-0".into(),
            namespace: "ml".into(),
            containers: vec![pr::ContainerResources {
                name: "main".into(),
                devices: vec![pr::ContainerDevices {
                    resource_name: "kudos.dev/gpu".into(),
                    device_ids: vec!["nv-GPU-1".into()],
                    topology: None,
                }],
                cpu_ids: vec![1, 2],
                memory: vec![],
                dynamic_resources: vec![pr::DynamicResource {
                    claim_name: "c".into(),
                    claim_namespace: "ml".into(),
                    claim_resources: vec![pr::ClaimResource {
                        cdi_devices: vec![pr::CdiDevice { name: "x=y".into() }],
                        driver_name: "d".into(),
                        pool_name: "p".into(),
                        device_name: "n".into(),
                    }],
                }],
            }],
        }],
    };
    roundtrip(&list);
    roundtrip(&pr::GetPodResourcesRequest {
        pod_name: "train-0".into(),
        pod_namespace: "ml".into(),
    });
    roundtrip(&pr::AllocatableResourcesResponse {
        devices: vec![],
        cpu_ids: vec![0, 1],
        memory: vec![],
    });
}

#[test]
fn kudos_messages_roundtrip() {
    roundtrip(&kudos::ReportPluginRequest {
        node: "gpu-1".into(),
        vendor: "nvidia".into(),
        vendor_resource_name: "nvidia.com/gpu".into(),
        devices: vec![kudos::Device {
            id: "nv-GPU-1".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            memory_bytes: 80 << 30,
            uuid: "GPU-1".into(),
            numa_node: Some(0),
            healthy: true,
        }],
        plugin_version: "0.1.0".into(),
    });
    roundtrip(&kudos::RunReport {
        report_id: "r-1".into(),
        run_id: "run-1".into(),
        node: "gpu-1".into(),
        class: "resnet".into(),
        state: kudos::RunState::Completed as i32,
        progress: Some(1.0),
        ..Default::default()
    });
    roundtrip(&kudos::RunAck {
        report_id: "r-1".into(),
        status: kudos::AckStatus::Duplicate as i32,
        message: String::new(),
    });
    // An absent NUMA node stays absent (proto3 optional), distinct from NUMA node 0.
    let no_numa = kudos::Device::default();
    let back = kudos::Device::decode(no_numa.encode_to_vec().as_slice()).expect("decode");
    assert_eq!(back.numa_node, None);
}

/// Records the request path the generated client sends, then fails the call.
fn recording_channel(
    seen: Arc<Mutex<Vec<String>>>,
) -> impl tonic::client::GrpcService<
    tonic::body::Body,
    ResponseBody = tonic::body::Body,
    Error = std::io::Error,
    Future = std::future::Ready<Result<http::Response<tonic::body::Body>, std::io::Error>>,
> + Clone {
    tower::service_fn(move |req: http::Request<tonic::body::Body>| {
        seen.lock()
            .expect("lock")
            .push(req.uri().path().to_string());
        std::future::ready(Err(std::io::Error::other("recorded")))
    })
}

#[tokio::test]
async fn kubelet_method_paths_are_pinned() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let ch = recording_channel(seen.clone());
    let mut reg = dp::registration_client::RegistrationClient::new(ch.clone());
    let _ = reg.register(dp::RegisterRequest::default()).await;
    let mut plugin = dp::device_plugin_client::DevicePluginClient::new(ch.clone());
    let _ = plugin.get_device_plugin_options(dp::Empty {}).await;
    let _ = plugin.list_and_watch(dp::Empty {}).await;
    let _ = plugin
        .get_preferred_allocation(dp::PreferredAllocationRequest::default())
        .await;
    let _ = plugin.allocate(dp::AllocateRequest::default()).await;
    let _ = plugin
        .pre_start_container(dp::PreStartContainerRequest::default())
        .await;
    let mut lister = pr::pod_resources_lister_client::PodResourcesListerClient::new(ch.clone());
    let _ = lister.list(pr::ListPodResourcesRequest {}).await;
    let _ = lister
        .get_allocatable_resources(pr::AllocatableResourcesRequest {})
        .await;
    let _ = lister.get(pr::GetPodResourcesRequest::default()).await;
    let mut registry = kudos::registry_service_client::RegistryServiceClient::new(ch.clone());
    let _ = registry
        .report_plugin(kudos::ReportPluginRequest::default())
        .await;
    let mut telemetry = kudos::telemetry_service_client::TelemetryServiceClient::new(ch);
    let _ = telemetry
        .heartbeat(kudos::HeartbeatRequest::default())
        .await;
    let _ = telemetry
        .report_runs(tokio_stream::iter(Vec::<kudos::RunReport>::new()))
        .await;

    let seen = seen.lock().expect("lock").clone();
    assert_eq!(
        seen,
        vec![
            "/v1beta1.Registration/Register",
            "/v1beta1.DevicePlugin/GetDevicePluginOptions",
            "/v1beta1.DevicePlugin/ListAndWatch",
            "/v1beta1.DevicePlugin/GetPreferredAllocation",
            "/v1beta1.DevicePlugin/Allocate",
            "/v1beta1.DevicePlugin/PreStartContainer",
            "/v1.PodResourcesLister/List",
            "/v1.PodResourcesLister/GetAllocatableResources",
            "/v1.PodResourcesLister/Get",
            "/kudos.v1.RegistryService/ReportPlugin",
            "/kudos.v1.TelemetryService/Heartbeat",
            "/kudos.v1.TelemetryService/ReportRuns",
        ]
    );
}

#[test]
fn server_names_match_the_paths() {
    use tonic::server::NamedService;
    assert_eq!(
        <dp::registration_server::RegistrationServer<()> as NamedService>::NAME,
        "v1beta1.Registration"
    );
}

#[test]
fn plugin_info_bytes_match_upstream_field_numbers() {
    let info = reg::PluginInfo {
        r#type: reg::DRA_PLUGIN.into(),
        name: "gpu.kudos.dev".into(),
        endpoint: "/p/dra.sock".into(),
        supported_versions: vec![dra::SERVICE.into()],
    };
    // 1=type, 2=name, 3=endpoint, 4=supported_versions (repeated string).
    let mut expected = ld(1, b"DRAPlugin");
    expected.extend(ld(2, b"gpu.kudos.dev"));
    expected.extend(ld(3, b"/p/dra.sock"));
    expected.extend(ld(4, b"v1.DRAPlugin"));
    assert_eq!(info.encode_to_vec(), expected);
    roundtrip(&info);
    // RegistrationStatus: 1=plugin_registered (varint), 2=error.
    let status = reg::RegistrationStatus {
        plugin_registered: true,
        error: "x".into(),
    };
    let mut expected = vec![0x08, 0x01];
    expected.extend(ld(2, b"x"));
    assert_eq!(status.encode_to_vec(), expected);
    assert_eq!(reg::socket_name("gpu.kudos.dev"), "gpu.kudos.dev-reg.sock");
}

#[test]
fn dra_messages_match_upstream_field_numbers() {
    let claim = dra::Claim {
        namespace: "ns".into(),
        uid: "u-1".into(),
        name: "c".into(),
    };
    // Claim: 1=namespace, 2=uid, 3=name.
    let mut claim_bytes = ld(1, b"ns");
    claim_bytes.extend(ld(2, b"u-1"));
    claim_bytes.extend(ld(3, b"c"));
    assert_eq!(claim.encode_to_vec(), claim_bytes);
    let req = dra::NodePrepareResourcesRequest {
        claims: vec![claim.clone()],
    };
    assert_eq!(req.encode_to_vec(), ld(1, &claim_bytes));
    roundtrip(&dra::NodeUnprepareResourcesRequest {
        claims: vec![claim],
    });

    // Device: 1=request_names, 2=pool_name, 3=device_name, 4=cdi_device_ids, 5=share_id.
    let device = dra::Device {
        request_names: vec!["r".into()],
        pool_name: "n1".into(),
        device_name: "d0".into(),
        cdi_device_ids: vec!["k/c=x".into()],
        share_id: None,
    };
    let mut device_bytes = ld(1, b"r");
    device_bytes.extend(ld(2, b"n1"));
    device_bytes.extend(ld(3, b"d0"));
    device_bytes.extend(ld(4, b"k/c=x"));
    assert_eq!(device.encode_to_vec(), device_bytes);
    // NodePrepareResourceResponse: 1=devices, 2=error; the response is a map (field 1) of
    // entries {1: claim uid, 2: value}.
    let one = dra::NodePrepareResourceResponse {
        devices: vec![device],
        error: String::new(),
    };
    let mut entry = ld(1, b"u-1");
    entry.extend(ld(2, &ld(1, &device_bytes)));
    let resp = dra::NodePrepareResourcesResponse {
        claims: [("u-1".to_string(), one)].into(),
    };
    assert_eq!(resp.encode_to_vec(), ld(1, &entry));
    roundtrip(&resp);
    // NodeUnprepareResourceResponse: 1=error.
    let un = dra::NodeUnprepareResourceResponse { error: "e".into() };
    assert_eq!(un.encode_to_vec(), ld(1, b"e"));
    // share_id is proto3 optional: present even when empty.
    let shared = dra::Device {
        share_id: Some(String::new()),
        ..Default::default()
    };
    assert_eq!(shared.encode_to_vec(), vec![0x2a, 0x00]);
}

#[tokio::test]
async fn dra_and_registration_method_paths_are_pinned() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let ch = recording_channel(seen.clone());
    let mut registration = reg::registration_client::RegistrationClient::new(ch.clone());
    let _ = registration.get_info(reg::InfoRequest {}).await;
    let _ = registration
        .notify_registration_status(reg::RegistrationStatus::default())
        .await;
    let mut plugin = dra::dra_plugin_client::DraPluginClient::new(ch);
    let _ = plugin
        .node_prepare_resources(dra::NodePrepareResourcesRequest::default())
        .await;
    let _ = plugin
        .node_unprepare_resources(dra::NodeUnprepareResourcesRequest::default())
        .await;
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(
        seen,
        vec![
            "/pluginregistration.Registration/GetInfo",
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
        ]
    );
    use tonic::server::NamedService;
    assert_eq!(
        <dra::dra_plugin_server::DraPluginServer<()> as NamedService>::NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    );
    assert_eq!(
        <reg::registration_server::RegistrationServer<()> as NamedService>::NAME,
        "pluginregistration.Registration"
    );
}
