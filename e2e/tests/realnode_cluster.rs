//! Real nodes without Kudos: two real kubelets (own containerd, runc, mount namespace, cgroup
//! root, loopback IP) go Ready; a pod on each node runs a real container that sees its node's
//! fake GPUs through the driver library the node's "toolkit" mounts; the host is left exactly as
//! it was (sysctls, nft ruleset, cgroups, links, mount points, processes).

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{LogParams, PostParams};
use kudos_e2e::proc::wait_for;
use kudos_e2e::realnode::gpus::{self, MODEL_A, MODEL_B};
use kudos_e2e::realnode::{RealCluster, host};
use kudos_e2e::{RunDir, require_bins};
use serde_json::json;
use std::time::{Duration, Instant};

fn workload_pod(name: &str, node: &str, uuid: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [{
                "name": "job",
                "image": "localhost/kudos/kudos-workload:0.1.0",
                "args": ["--class", "X", "--work", "0.3"],
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": uuid}],
            }],
        },
    }))
    .expect("valid pod")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_real_nodes_run_containers_and_leave_the_host_clean() -> anyhow::Result<()> {
    if !require_bins("realnode_cluster", &gpus::required_files(gpus::BASE_IMAGES)) {
        return Ok(());
    }
    let run = RunDir::new("realnode-cluster")?;
    let t0 = Instant::now();
    let opts = gpus::two_gpu_nodes(run.path(), gpus::BASE_IMAGES)?;
    let cluster = RealCluster::start(&run, opts).await?;
    eprintln!(
        "RESULT realnode cluster (2 nodes) Ready in {:?}",
        t0.elapsed()
    );

    let pods: Api<Pod> = Api::namespaced(cluster.cp.client.clone(), "default");
    for (node, model, tag) in [("127.0.0.1", MODEL_A, "a"), ("127.0.0.2", MODEL_B, "b")] {
        let uuid = format!("GPU-{tag:0>8}-0000-4000-8000-{:012}", 1);
        pods.create(
            &PostParams::default(),
            &workload_pod(&format!("job-{tag}"), node, &uuid),
        )
        .await?;
        let name = format!("job-{tag}");
        let phase = wait_for(
            &format!("{name} finished"),
            Duration::from_secs(120),
            Duration::from_millis(250),
            async || {
                let p = pods.get_opt(&name).await.ok().flatten()?;
                let ph = p.status?.phase?;
                (ph == "Succeeded" || ph == "Failed").then_some(ph)
            },
        )
        .await?;
        let log = pods.logs(&name, &LogParams::default()).await?;
        assert_eq!(phase, "Succeeded", "{name} on {node}: {log}");
        assert!(
            log.contains(&format!("model={model}")),
            "{name} on {node} should see {model}: {log}"
        );
    }

    cluster.shutdown_clean()?;
    assert!(host::realnode_cgroups().is_empty());
    run.pass();
    Ok(())
}
