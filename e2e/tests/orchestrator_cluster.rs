//! Scenario 3: `kudos-orchestrator` against the real API server: node inventory follows the
//! Node watch (create, status change, pod placement, delete); plugin reports are authorised
//! per node and rewritten to the unified name; the state store lives in ConfigMaps and
//! survives an orchestrator restart. (Server-side apply of the rendered DaemonSets against
//! the same kube-apiserver is tested by `rollout/tests/apiserver.rs`.)

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kudos_e2e::nodes::{create_nodes, uniform_shapes};
use kudos_e2e::orchestrator::Orchestrator;
use kudos_e2e::paths::kudos_bin;
use kudos_e2e::proc::wait_for;
use kudos_e2e::telemetry::report_plugin;
use kudos_e2e::{ControlPlane, ControlPlaneOptions, http};
use serde_json::{Value, json};
use std::time::Duration;

fn state(o: &Orchestrator) -> Option<Value> {
    http::get_json(&o.http_addr, "/state").ok()
}

fn node_entry<'a>(st: &'a Value, name: &str) -> Option<&'a Value> {
    st["nodes"].as_array()?.iter().find(|n| n["name"] == name)
}

async fn wait_state(
    o: &Orchestrator,
    what: &str,
    f: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    wait_for(
        what,
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || state(o).filter(|s| f(s)),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orchestrator_inventory_registry_and_configmap_store() -> anyhow::Result<()> {
    let opts = ControlPlaneOptions::default();
    let orchestrator = [kudos_bin("kudos-orchestrator")];
    let Some((run, cp)) =
        ControlPlane::for_test("orchestrator_cluster", opts, &orchestrator).await?
    else {
        return Ok(());
    };
    let ns: Api<Namespace> = Api::all(cp.client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "kudos-system"}}))?,
    )
    .await?;
    let shapes = uniform_shapes(&["T4", "A10"], 2, 8);
    create_nodes(&cp.client, &shapes, "kudos.dev/gpu").await?;
    let names: Vec<String> = shapes.iter().map(|s| s.name.clone()).collect();
    let extra = ["--store=config-map".to_string()];
    let mut orch = Orchestrator::start(run.path(), Some(&cp.kubeconfig), &names, &extra).await?;

    // Inventory from the watch: every node, its model from labels, 8 free devices.
    let st = wait_state(&orch, "all nodes in /state", |s| {
        names.iter().all(|n| node_entry(s, n).is_some())
    })
    .await?;
    let t4 = node_entry(&st, "node-t4-0").unwrap();
    assert_eq!(
        t4["free_devices"].as_u64().or(t4["freeDevices"].as_u64()),
        Some(8),
        "{t4}"
    );
    assert!(t4.to_string().contains("T4"), "profile from labels: {t4}");

    // Allocatable drops (e.g. a GPU went unhealthy): the index follows.
    let nodes: Api<Node> = Api::all(cp.client.clone());
    nodes
        .patch_status(
            "node-t4-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocatable": {"kudos.dev/gpu": "6"}}})),
        )
        .await?;
    let free = |s: &Value, n: &str| {
        node_entry(s, n).and_then(|e| e["free_devices"].as_u64().or(e["freeDevices"].as_u64()))
    };
    wait_state(&orch, "node-t4-0 allocatable 6", |s| {
        free(s, "node-t4-0") == Some(6)
    })
    .await?;
    // A pod bound there with 2 GPUs: 4 free.
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let res = json!({"cpu": "1", "memory": "1Gi", "kudos.dev/gpu": "2"});
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "placed", "labels": {"kudos.dev/class": "resnet50"}},
        "spec": {"nodeName": "node-t4-0", "containers": [{"name": "main", "image": "registry.invalid/none:0",
                 "resources": {"requests": res, "limits": res}}]}
    }))?;
    pods.create(&PostParams::default(), &p).await?;
    wait_state(&orch, "node-t4-0 4 free after a 2-GPU pod", |s| {
        free(s, "node-t4-0") == Some(4)
    })
    .await?;
    // A deleted Node leaves the inventory.
    nodes.delete("node-a10-1", &DeleteParams::default()).await?;
    wait_state(&orch, "node-a10-1 gone", |s| {
        node_entry(s, "node-a10-1").is_none()
    })
    .await?;

    // Registry: a plugin reports its vendor name; the answer is the unified name.
    let (unified, generation) = report_plugin(
        &orch.grpc_addr,
        "node-t4-0",
        "nvidia",
        "nvidia.com/gpu",
        "Tesla T4",
        8,
    )
    .await?;
    assert_eq!(unified, "kudos.dev/gpu");
    assert!(generation >= 1);
    // A node may only report about itself: node-t4-1's token cannot report node-t4-0... (the
    // helper always uses the named node's token, so report as an unknown node instead).
    let denied = report_plugin(
        &orch.grpc_addr,
        "intruder",
        "nvidia",
        "nvidia.com/gpu",
        "Tesla T4",
        1,
    )
    .await;
    assert!(denied.is_err(), "a caller without a valid token is refused");

    // The state store is ConfigMaps in the cluster: `<name>` and one object per node's plugin
    // report, labelled with the store's name ...
    let cms: Api<ConfigMap> = Api::namespaced(cp.client.clone(), "kudos-system");
    let parts = ListParams::default().labels("kudos.dev/store=kudos-orchestrator-state");
    wait_for(
        "a state ConfigMap holds node-t4-0's plugin report",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || {
            let list = cms.list(&parts).await.ok()?;
            list.items
                .iter()
                .any(|cm| {
                    serde_json::to_string(&cm.data)
                        .is_ok_and(|d| d.contains("node-t4-0") && d.contains("nvidia.com/gpu"))
                })
                .then_some(())
        },
    )
    .await?;
    let meta = cms.get("kudos-orchestrator-state").await?;
    assert!(meta.metadata.resource_version.is_some());

    // ... so a fresh orchestrator (no local file) recovers the plugin configuration.
    orch.stop();
    let _ = std::fs::remove_file(run.join("orchestrator.redb"));
    let orch2 = Orchestrator::start(run.path(), Some(&cp.kubeconfig), &names, &extra).await?;
    let st = wait_state(&orch2, "plugin configuration restored", |s| {
        s.to_string().contains("nvidia.com/gpu")
    })
    .await?;
    let pc = &st["pluginConfig"];
    assert!(pc.to_string().contains("node-t4-0"), "{pc}");
    assert_eq!(pc["generation"].as_u64(), Some(generation), "{pc}");
    run.pass();
    Ok(())
}
