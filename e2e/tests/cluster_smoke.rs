//! Smoke: real etcd + kube-apiserver + kube-scheduler on loopback; Nodes are API objects with
//! patched status; pods with and without `kudos.dev/gpu` are bound by the real scheduler.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kudos_e2e::nodes::{create_nodes, uniform_shapes};
use kudos_e2e::pods::{bound_node, unschedulable};
use kudos_e2e::{ControlPlane, ControlPlaneOptions};
use serde_json::json;
use std::time::{Duration, Instant};

fn pod(name: &str, gpus: Option<u32>) -> Pod {
    let mut res = json!({"cpu": "100m", "memory": "64Mi"});
    if let Some(g) = gpus {
        res["kudos.dev/gpu"] = json!(g.to_string());
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/none:0",
                 "resources": {"requests": res, "limits": res}}]}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_smoke_pods_are_bound_by_real_scheduler() -> anyhow::Result<()> {
    let t0 = Instant::now();
    let opts = ControlPlaneOptions {
        scheduler: true,
        ..Default::default()
    };
    let Some((run, mut cp)) = ControlPlane::for_test("cluster_smoke", opts, &[]).await? else {
        return Ok(());
    };
    eprintln!("control plane ready in {:?}", t0.elapsed());

    // Two CPU-only-ish nodes (0 GPUs) and one with 4 GPUs.
    let mut shapes = uniform_shapes(&["T4"], 1, 4);
    shapes.extend(uniform_shapes(&["CPU"], 2, 0));
    create_nodes(&cp.client, &shapes, "kudos.dev/gpu").await?;
    let nodes: Api<Node> = Api::all(cp.client.clone());
    assert_eq!(nodes.list(&ListParams::default()).await?.items.len(), 3);

    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    pods.create(&PostParams::default(), &pod("plain", None))
        .await?;
    pods.create(&PostParams::default(), &pod("gpu", Some(2)))
        .await?;
    pods.create(&PostParams::default(), &pod("too-big", Some(8)))
        .await?;

    for (name, want) in [("plain", None), ("gpu", Some("node-t4-0"))] {
        let node = bound_node(&pods, name).await?;
        if let Some(w) = want {
            assert_eq!(node, w, "pod {name} must land on the only GPU node");
        }
    }
    // 8 GPUs fit nowhere: the scheduler reports it unschedulable, naming the resource.
    let (_, msg) = unschedulable(&pods, "too-big", Duration::from_secs(30)).await?;
    assert!(
        msg.contains("kudos.dev/gpu"),
        "unschedulable message names the resource: {msg}"
    );
    cp.check_running()?;
    run.pass();
    Ok(())
}
