//! Node objects: plain API objects with status patched (no kubelet, no container runtime), in
//! shapes taken from the Alibaba GPU cluster trace (2023) node list.
//!
//! Data: `alibaba_gpu_v2023/openb_node_list_gpu_node.csv` from Alibaba's `clusterdata`
//! (cluster-trace-gpu-v2023, "Beware of Fragmentation", USENIX ATC 2023), published for
//! research and study use. When the shared data directory is absent, [`alibaba_shapes`]
//! falls back to `e2e/data/openb_node_list_gpu_node_sample.csv`, an attributed extract.

use crate::paths::{repo_root, shared_data_dir};
use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kudos_api::labels;
use serde::Deserialize;
use serde_json::json;

/// Memory per GPU of the trace's models, GiB (G1..G3 are undisclosed: 16 assumed).
pub fn model_memory_gib(model: &str) -> u64 {
    match model {
        "MI300X" => 192,
        "V100M32" => 32,
        "A10" => 24,
        "T4" | "P100" | "V100M16" => 16,
        _ => 16,
    }
}

/// The vendor of a shape's model: AMD Instinct models (`MI…`) are `amd`, every other model
/// (the trace's are all NVIDIA) `nvidia`.
pub fn model_vendor(model: &str) -> &'static str {
    if model.starts_with("MI") {
        "amd"
    } else {
        "nvidia"
    }
}

/// One node's shape.
#[derive(Debug, Clone, Deserialize)]
pub struct NodeShape {
    /// Node name.
    #[serde(rename = "sn")]
    pub name: String,
    /// CPU in millicores.
    pub cpu_milli: u64,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// GPUs on the node.
    pub gpu: u32,
    /// GPU model (`P100`, `T4`, `V100M16`, `V100M32`, `A10`, `G1`..`G3`; `MI300X` for an AMD
    /// node, see [`model_vendor`]).
    pub model: String,
}

/// Reads the 1,213 GPU-node shapes of the Alibaba 2023 trace (or the shipped extract).
pub fn alibaba_shapes() -> Result<Vec<NodeShape>> {
    let full = shared_data_dir().join("alibaba_gpu_v2023/openb_node_list_gpu_node.csv");
    let path = if full.is_file() {
        full
    } else {
        eprintln!("e2e: {} absent, using the shipped extract", full.display());
        repo_root().join("e2e/data/openb_node_list_gpu_node_sample.csv")
    };
    let mut r =
        csv::Reader::from_path(&path).with_context(|| format!("read {}", path.display()))?;
    r.deserialize().map(|x| x.map_err(Into::into)).collect()
}

/// A small heterogeneous shape set: `n_per_model` nodes of each given model with `gpus` GPUs.
pub fn uniform_shapes(models: &[&str], n_per_model: usize, gpus: u32) -> Vec<NodeShape> {
    let mut v = Vec::new();
    for m in models {
        for i in 0..n_per_model {
            v.push(NodeShape {
                name: format!("node-{}-{i}", m.to_ascii_lowercase()),
                cpu_milli: 64_000,
                memory_mib: 262_144,
                gpu: gpus,
                model: (*m).to_string(),
            });
        }
    }
    v
}

/// The status patch that makes a Node schedulable: capacity/allocatable and a Ready condition.
pub fn status_patch(s: &NodeShape, resource: &str) -> serde_json::Value {
    let res = json!({
        "cpu": format!("{}m", s.cpu_milli),
        "memory": format!("{}Mi", s.memory_mib),
        "pods": "110",
        resource: s.gpu.to_string(),
    });
    json!({
        "status": {
            "capacity": res,
            "allocatable": res,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kudos e2e: status patched by the test",
                "lastHeartbeatTime": now_rfc3339(), "lastTransitionTime": now_rfc3339(),
            }],
        }
    })
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// Creates the nodes (labels with vendor/model) and patches their status, 32 at a time.
pub async fn create_nodes(client: &Client, shapes: &[NodeShape], resource: &str) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    futures::stream::iter(shapes.iter().cloned())
        .map(|s| {
            let api = api.clone();
            async move {
                let node: Node = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {
                        "name": s.name,
                        "labels": {
                            "kubernetes.io/hostname": s.name,
                            "kubernetes.io/os": "linux",
                            labels::GPU_VENDOR: model_vendor(&s.model),
                            labels::GPU_MODEL: s.model,
                            labels::GPU_MEMORY_BYTES: (model_memory_gib(&s.model) << 30).to_string(),
                        }
                    }
                }))?;
                api.create(&PostParams::default(), &node)
                    .await
                    .with_context(|| format!("create node {}", s.name))?;
                api.patch_status(
                    &s.name,
                    &PatchParams::default(),
                    &Patch::Merge(status_patch(&s, resource)),
                )
                .await
                .with_context(|| format!("patch status of node {}", s.name))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}
