//! Issue 17, the control-plane side of DRA mode on the real kube-apiserver and kube-scheduler
//! (v1.37, where DRA-backed extended resources and device taints are GA), with the Kudos
//! extender ranking every GPU pod:
//!
//! - node `dra-node` carries `kudos.dev/allocation-api=dra`, advertises no `kudos.dev/gpu`
//!   allocatable, and has its two devices in a ResourceSlice of driver `gpu.kudos.dev`, the
//!   second tainted unhealthy; node `dp-node` advertises two devices through the device plugin;
//! - the orchestrator answers each node's `ReportPlugin` with the API that node must use, and
//!   `/state` says which, and counts the DRA node's devices from its ResourceSlice;
//! - the chart's `kudos-gpu` DeviceClass (`extendedResourceName: kudos.dev/gpu`) lets the same
//!   pod spec (`kudos.dev/gpu: 1`) be allocated a device through DRA on `dra-node` and through
//!   the device plugin on `dp-node`, each placed after the extender ranked it;
//! - the tainted device is never allocated: a fourth pod stays pending.
//!
//! The kubelet side (preparing the claim, CDI) is the device plugin's DRA mode and is tested in
//! `device-plugin/tests`.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, PostParams};
use kudos_api::dra::{self, AllocationApi};
use kudos_e2e::nodes::{NodeShape, create_nodes};
use kudos_e2e::orchestrator::Orchestrator;
use kudos_e2e::paths::{kudos_bin, upstream_bin};
use kudos_e2e::pods::{bound_node, unschedulable};
use kudos_e2e::proc::wait_for;
use kudos_e2e::telemetry::{plugin_devices, report_plugin_devices};
use kudos_e2e::{ControlPlane, ControlPlaneOptions, ExtenderOptions};
use serde_json::json;
use std::time::Duration;

const DRA_NODE: &str = "dra-node";
const DP_NODE: &str = "dp-node";

fn shape(name: &str) -> NodeShape {
    NodeShape {
        name: name.into(),
        cpu_milli: 16_000,
        memory_mib: 65_536,
        gpu: 2,
        model: "T4".into(),
    }
}

fn gpu_pod(name: &str) -> anyhow::Result<Pod> {
    let res = json!({"cpu": "100m", "memory": "64Mi", "kudos.dev/gpu": "1"});
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"kudos.dev/class": "resnet50"}},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/none:0",
                 "resources": {"requests": res, "limits": res}}]}
    }))?)
}

/// The slice a DRA-mode plugin on `node` publishes: the devices `plugin_devices` reports, the
/// unhealthy ones tainted.
fn slice(node: &str, devices: &[kudos_proto::kudos::v1::Device]) -> anyhow::Result<ResourceSlice> {
    let devices: Vec<_> = devices
        .iter()
        .map(|d| {
            let mut dev = json!({
                "name": dra::device_name(&d.id),
                "attributes": {
                    dra::attribute::VENDOR: {"string": "nvidia"},
                    dra::attribute::MODEL: {"string": d.model},
                    dra::attribute::DEVICE_ID: {"string": d.id},
                    dra::attribute::UUID: {"string": d.uuid},
                },
                "capacity": {dra::CAPACITY_MEMORY: {"value": d.memory_bytes.to_string()}},
            });
            if !d.healthy {
                dev["taints"] = json!([{"key": dra::UNHEALTHY_TAINT_KEY, "effect": "NoSchedule"}]);
            }
            dev
        })
        .collect();
    Ok(serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{}", dra::DRIVER)},
        "spec": {
            "driver": dra::DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        }
    }))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pod_spec_gets_dra_on_one_node_and_the_device_plugin_on_the_other() -> anyhow::Result<()>
{
    // The scheduler starts once the extender's address is known.
    let bins = [
        upstream_bin("kube-scheduler"),
        kudos_bin("kudos-orchestrator"),
    ];
    let opts = ControlPlaneOptions::default();
    let Some((run, mut cp)) = ControlPlane::for_test("dra_scheduling", opts, &bins).await? else {
        return Ok(());
    };

    // dp-node advertises kudos.dev/gpu through the device plugin; dra-node advertises nothing
    // under that name (its devices are in the slice) and is labelled for DRA.
    create_nodes(&cp.client, &[shape(DP_NODE)], "kudos.dev/gpu").await?;
    create_nodes(&cp.client, &[shape(DRA_NODE)], "example.com/unused").await?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(cp.client.clone());
    nodes
        .patch(
            DRA_NODE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"labels": {kudos_api::labels::ALLOCATION_API: "dra"}}}),
            ),
        )
        .await?;

    let names = vec![DRA_NODE.to_string(), DP_NODE.to_string()];
    let orch = Orchestrator::start(
        run.path(),
        Some(&cp.kubeconfig),
        &names,
        // auto: the nodes here have no kubelet, so only the label puts a node on DRA.
        &["--allocation-api".into(), "auto".into()],
    )
    .await?;

    // Each node's plugin reports; the orchestrator tells it which API to serve. The label
    // reaches the orchestrator through its Node watch, so the first answers may predate it.
    let dra_devices = plugin_devices(DRA_NODE, "Tesla T4", 2, 1);
    let answer = wait_for(
        "ReportPlugin answers dra for the labelled node",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || {
            let r = report_plugin_devices(
                &orch.grpc_addr,
                DRA_NODE,
                "nvidia",
                "nvidia.com/gpu",
                dra_devices.clone(),
            )
            .await
            .ok()?;
            (AllocationApi::parse(&r.allocation_api) == Some(AllocationApi::Dra)).then_some(r)
        },
    )
    .await?;
    assert_eq!(answer.dra_driver, dra::DRIVER);
    assert_eq!(answer.unified_resource_name, "kudos.dev/gpu");
    let dp = report_plugin_devices(
        &orch.grpc_addr,
        DP_NODE,
        "nvidia",
        "nvidia.com/gpu",
        plugin_devices(DP_NODE, "Tesla T4", 2, 2),
    )
    .await?;
    assert_eq!(
        dp.allocation_api, "device-plugin",
        "the policy for unlabelled nodes"
    );
    assert_eq!(dp.dra_driver, "");
    let state = kudos_e2e::http::get_json(&orch.http_addr, "/state")?;
    assert_eq!(state["allocationApi"][DRA_NODE]["api"], "dra", "{state}");
    assert_eq!(
        state["allocationApi"][DP_NODE]["api"], "device-plugin",
        "{state}"
    );

    // What the chart and the DRA-mode plugin put into the cluster.
    Api::<DeviceClass>::all(cp.client.clone())
        .create(
            &PostParams::default(),
            &kudos_e2e::dra::device_class("kudos.dev/gpu")?,
        )
        .await?;
    Api::<ResourceSlice>::all(cp.client.clone())
        .create(&PostParams::default(), &slice(DRA_NODE, &dra_devices)?)
        .await?;
    // The orchestrator counts the DRA node's devices from the slice (its ResourceSlice watch).
    let counted = wait_for(
        "/state counts the DRA node's slice devices",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || {
            let s = kudos_e2e::http::get_json(&orch.http_addr, "/state").ok()?;
            let c = s["allocationApi"][DRA_NODE]["sliceDevices"].clone();
            (!c.is_null()).then_some(c)
        },
    )
    .await?;
    assert_eq!(counted, json!({"healthy": 1, "total": 2}));

    let ext = ExtenderOptions::kudos(orch.extender_url());
    cp.start_scheduler(50, Some(&ext))?;
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let mut placed = Vec::new();
    for i in 0..3 {
        let name = format!("gpu-{i}");
        pods.create(&PostParams::default(), &gpu_pod(&name)?)
            .await?;
        placed.push((name.clone(), bound_node(&pods, &name).await?));
    }
    eprintln!("placed: {placed:?}");
    let on_dra: Vec<&String> = placed
        .iter()
        .filter(|(_, n)| n == DRA_NODE)
        .map(|(p, _)| p)
        .collect();
    assert_eq!(
        on_dra.len(),
        1,
        "one healthy device on the DRA node, two on the other: {placed:?}"
    );
    assert_eq!(
        placed.iter().filter(|(_, n)| n == DP_NODE).count(),
        2,
        "{placed:?}"
    );

    // The DRA node's pod holds a claim the scheduler created and allocated: the healthy device
    // of our driver and pool, never the tainted one.
    let dra_pod = pods.get(on_dra[0]).await?;
    let claim_name = dra_pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|c| c.resource_claim_name.clone())
        .ok_or_else(|| anyhow::anyhow!("pod on the DRA node has no extended-resource claim"))?;
    let claim = Api::<ResourceClaim>::namespaced(cp.client.clone(), "default")
        .get(&claim_name)
        .await?;
    let results = kudos_e2e::dra::allocated(&claim);
    let healthy = dra::device_name(&dra_devices[0].id);
    assert_eq!(results.len(), 1, "{claim:?}");
    assert_eq!(results[0].driver, dra::DRIVER);
    assert_eq!(results[0].pool, DRA_NODE);
    assert_eq!(results[0].device, healthy, "the untainted device");
    // The device-plugin pods hold no claim.
    for (p, n) in &placed {
        if n == DP_NODE {
            let pod = pods.get(p).await?;
            assert!(
                pod.status
                    .as_ref()
                    .and_then(|s| s.extended_resource_claim_status.as_ref())
                    .is_none(),
                "{p} on the device-plugin node got a DRA claim"
            );
        }
    }

    // Every pod was ranked by Kudos before it was placed.
    for (p, n) in &placed {
        let ex = orch.explain("default", p)?;
        let ranked: Vec<&str> = ex["ranking"]["entries"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["node"].as_str())
            .collect();
        assert!(
            ranked.contains(&n.as_str()),
            "{p} placed on {n}, which the Kudos ranking did not include: {ex}"
        );
    }

    // And each says why (`kubectl describe pod`), DRA node or not, also the pods for which one
    // node was left and kube-scheduler skipped prioritize: the Binding through the extender
    // carries the explanation onto the pod.
    let explained = wait_for(
        "an explanation per placed pod",
        Duration::from_secs(30),
        Duration::from_millis(250),
        async || {
            let about = kudos_e2e::pods::explained(&cp.client, "default")
                .await
                .ok()?;
            placed
                .iter()
                .all(|(p, _)| about.contains(p))
                .then_some(about)
        },
    )
    .await?;
    eprintln!("placements explained: {explained:?}");

    // No capacity left but the tainted device: the next pod waits.
    pods.create(&PostParams::default(), &gpu_pod("gpu-3")?)
        .await?;
    let (reason, message) = unschedulable(&pods, "gpu-3", Duration::from_secs(60)).await?;
    eprintln!("gpu-3 pending: {reason}: {message}");
    assert!(
        message.contains("cannot allocate all claims"),
        "the DRA node must refuse for want of an untainted device: {message}"
    );

    cp.check_running()?;
    run.pass();
    Ok(())
}
