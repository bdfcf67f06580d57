//! Reading Kubernetes objects: what Kudos needs from a `Node` and a `Pod`.
//!
//! Pure functions over k8s-openapi types, shared by the watchers (which write the index) and
//! the extender (which reads pods from kube-scheduler's requests), so both agree on labels,
//! annotations and resource arithmetic.

use crate::quantity;
use crate::state::ProfileRecord;
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kudos_api::labels;
use std::collections::BTreeMap;

/// A pod annotation Kudos could not use.
#[derive(Debug, thiserror::Error)]
#[error("annotation {key}={value:?} on pod {pod}: {expected}")]
pub struct PodError {
    /// Pod `namespace/name`.
    pub pod: String,
    /// Annotation key.
    pub key: &'static str,
    /// Value found.
    pub value: String,
    /// What was expected.
    pub expected: &'static str,
}

/// What Kudos knows about a node from its `Node` object.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeInfo {
    /// Node name.
    pub name: String,
    /// Profile from `kudos.dev/gpu-*` labels, when the vendor and model labels are set.
    pub label_profile: Option<ProfileRecord>,
    /// Allocatable devices of the unified resource; `None` when not advertised.
    pub gpu_allocatable: Option<u32>,
    /// Capacity of the unified resource; `None` when not advertised.
    pub gpu_capacity: Option<u32>,
    /// Allocatable CPU, millicores.
    pub cpu_allocatable_milli: u64,
    /// Allocatable memory, bytes.
    pub memory_allocatable_bytes: u64,
    /// `Ok` when the Ready condition is True, else the reason.
    pub ready: Result<(), String>,
    /// `(major, minor)` of `status.nodeInfo.kubeletVersion`, when reported.
    pub kubelet_version: Option<(u32, u32)>,
    /// The node's `kudos.dev/allocation-api` label, when it names an API.
    pub allocation_api_label: Option<kudos_api::dra::AllocationApi>,
}

/// Resources a pod holds on its node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Requests {
    /// Devices of the unified resource.
    pub gpus: u64,
    /// CPU, millicores.
    pub cpu_milli: u64,
    /// Memory, bytes.
    pub memory_bytes: u64,
}

impl Requests {
    /// Adds `other`.
    pub fn add(&mut self, other: Requests) {
        self.gpus += other.gpus;
        self.cpu_milli += other.cpu_milli;
        self.memory_bytes += other.memory_bytes;
    }
    /// Subtracts `other`, saturating.
    pub fn sub(&mut self, other: Requests) {
        self.gpus = self.gpus.saturating_sub(other.gpus);
        self.cpu_milli = self.cpu_milli.saturating_sub(other.cpu_milli);
        self.memory_bytes = self.memory_bytes.saturating_sub(other.memory_bytes);
    }
}

/// The scheduling-relevant facts of a pod, parsed once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodFacts {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (empty when absent).
    pub uid: String,
    /// Node it is bound to, if any.
    pub node_name: Option<String>,
    /// Class label.
    pub class: Option<String>,
    /// Resource requests.
    pub requests: Requests,
    /// Declared work units.
    pub work_units: Option<f64>,
    /// Deadline, seconds.
    pub deadline_seconds: Option<f64>,
    /// Gang name and size.
    pub gang: Option<(String, u32)>,
    /// Vendors the pod's image can use (`kudos.dev/vendors`), lower case; empty when unset.
    pub vendors: Vec<String>,
    /// Whether it ended (Succeeded/Failed): holds no resources.
    pub terminated: bool,
}

/// Reads a node. `unified` is the unified resource name.
pub fn node_info(node: &Node, unified: &str) -> NodeInfo {
    let name = node.metadata.name.clone().unwrap_or_default();
    let labels = node.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).filter(|v| !v.is_empty());
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let get = |k: &str| allocatable.and_then(|a| a.get(k)).map(|q| q.0.as_str());
    let gpu_allocatable = get(unified)
        .and_then(quantity::units)
        .map(|v| v.min(u64::from(u32::MAX)) as u32);
    let gpu_capacity = node
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get(unified))
        .and_then(|q| quantity::units(&q.0))
        .map(|v| v.min(u64::from(u32::MAX)) as u32);
    let label_profile = match (label(labels::GPU_VENDOR), label(labels::GPU_MODEL)) {
        (Some(vendor), Some(model)) => Some(ProfileRecord {
            vendor: vendor.clone(),
            model: model.clone(),
            count: gpu_allocatable.unwrap_or(0),
            memory_bytes: label(labels::GPU_MEMORY_BYTES)
                .and_then(|v| quantity::units(v))
                .unwrap_or(0),
        }),
        _ => None,
    };
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map_or(Err("node has no Ready condition yet".to_owned()), |c| {
            if c.status == "True" {
                Ok(())
            } else {
                Err(format!(
                    "node is not Ready ({}: {})",
                    c.reason.as_deref().unwrap_or("no reason"),
                    c.message.as_deref().unwrap_or("")
                ))
            }
        });
    NodeInfo {
        name,
        label_profile,
        gpu_allocatable,
        gpu_capacity,
        cpu_allocatable_milli: get("cpu").and_then(quantity::milli).unwrap_or(0),
        memory_allocatable_bytes: get("memory").and_then(quantity::units).unwrap_or(0),
        ready,
        kubelet_version: node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .and_then(|i| crate::dra::parse_kubelet_version(&i.kubelet_version)),
        allocation_api_label: label(labels::ALLOCATION_API)
            .and_then(|v| kudos_api::dra::AllocationApi::parse(v)),
    }
}

fn container_requests(c: &Container, unified: &str) -> Requests {
    let res = c.resources.as_ref();
    let pick = |k: &str| -> Option<&Quantity> {
        res.and_then(|r| r.requests.as_ref().and_then(|m| m.get(k)))
            .or_else(|| res.and_then(|r| r.limits.as_ref().and_then(|m| m.get(k))))
    };
    Requests {
        gpus: pick(unified)
            .and_then(|q| quantity::units(&q.0))
            .unwrap_or(0),
        cpu_milli: pick("cpu").and_then(|q| quantity::milli(&q.0)).unwrap_or(0),
        memory_bytes: pick("memory")
            .and_then(|q| quantity::units(&q.0))
            .unwrap_or(0),
    }
}

/// Effective requests as kube-scheduler computes them: the sum over containers plus sidecars
/// (restartable init containers), at least what any init container needs while the sidecars
/// started before it run, plus pod overhead.
pub fn pod_requests(pod: &Pod, unified: &str) -> Requests {
    let Some(spec) = pod.spec.as_ref() else {
        return Requests::default();
    };
    let max = |a: Requests, b: Requests| Requests {
        gpus: a.gpus.max(b.gpus),
        cpu_milli: a.cpu_milli.max(b.cpu_milli),
        memory_bytes: a.memory_bytes.max(b.memory_bytes),
    };
    let mut sidecars = Requests::default();
    let mut init_peak = Requests::default();
    for c in spec.init_containers.iter().flatten() {
        let r = container_requests(c, unified);
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars.add(r);
            init_peak = max(init_peak, sidecars);
        } else {
            let mut during = sidecars;
            during.add(r);
            init_peak = max(init_peak, during);
        }
    }
    let mut sum = sidecars;
    for c in &spec.containers {
        sum.add(container_requests(c, unified));
    }
    let mut sum = max(sum, init_peak);
    if let Some(o) = spec.overhead.as_ref() {
        sum.cpu_milli += o
            .get("cpu")
            .and_then(|q| quantity::milli(&q.0))
            .unwrap_or(0);
        sum.memory_bytes += o
            .get("memory")
            .and_then(|q| quantity::units(&q.0))
            .unwrap_or(0);
    }
    sum
}

fn positive(
    pod: &str,
    ann: &BTreeMap<String, String>,
    key: &'static str,
) -> Result<Option<f64>, PodError> {
    match ann.get(key) {
        None => Ok(None),
        Some(v) => match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
            _ => Err(PodError {
                pod: pod.to_owned(),
                key,
                value: v.clone(),
                expected: "a positive number",
            }),
        },
    }
}

/// The `kudos.dev/vendors` annotation: comma-separated vendor names, at most
/// [`labels::MAX_POD_VENDORS`], each a valid vendor name; lower-cased.
fn vendors(pod: &str, ann: &BTreeMap<String, String>) -> Result<Vec<String>, PodError> {
    let Some(v) = ann.get(labels::VENDORS) else {
        return Ok(Vec::new());
    };
    let names: Vec<String> = v
        .split(',')
        .map(|s| s.trim().to_ascii_lowercase())
        .collect();
    let ok = names.len() <= labels::MAX_POD_VENDORS
        && names
            .iter()
            .all(|n| kudos_api::bounds::validate_vendor_name(n).is_ok());
    if ok {
        Ok(names)
    } else {
        Err(PodError {
            pod: pod.to_owned(),
            key: labels::VENDORS,
            value: v.chars().take(64).collect(),
            expected: "comma-separated vendor names (up to 8, each a DNS label of up to 20 characters), such as nvidia or amd,nvidia",
        })
    }
}

/// Reads a pod; fails only on malformed Kudos annotations, which the user must fix.
pub fn pod_facts(pod: &Pod, unified: &str) -> Result<PodFacts, PodError> {
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone().unwrap_or_default();
    let id = format!("{namespace}/{name}");
    let empty = BTreeMap::new();
    let ann = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let gang = match (ann.get(labels::GANG_NAME), ann.get(labels::GANG_SIZE)) {
        (None, None) => None,
        (Some(g), size) => {
            let size = match size {
                None => 1,
                Some(s) => match s.trim().parse::<u32>() {
                    // Bounded: a placement allocates per member.
                    Ok(n) if (1..=crate::limits::MAX_GANG_SIZE).contains(&n) => n,
                    _ => {
                        const _: () = assert!(crate::limits::MAX_GANG_SIZE == 4096);
                        return Err(PodError {
                            pod: id,
                            key: labels::GANG_SIZE,
                            value: s.chars().take(32).collect(),
                            expected: "an integer from 1 to 4096",
                        });
                    }
                },
            };
            Some((g.clone(), size))
        }
        (None, Some(s)) => {
            return Err(PodError {
                pod: id,
                key: labels::GANG_SIZE,
                value: s.clone(),
                expected: "set together with kudos.dev/gang-name",
            });
        }
    };
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    Ok(PodFacts {
        class: pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::CLASS))
            .filter(|c| !c.is_empty())
            .cloned(),
        work_units: positive(&id, ann, labels::WORK)?,
        deadline_seconds: positive(&id, ann, labels::DEADLINE_SECONDS)?,
        vendors: vendors(&id, ann)?,
        gang,
        requests: pod_requests(pod, unified),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        node_name: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        terminated: matches!(phase, Some("Succeeded" | "Failed")),
        namespace,
        name,
    })
}

/// A stable 64-bit FNV-1a hash: the exploration seed of a pod is the hash of its UID, so
/// kube-scheduler's retries of one pod see the same ranking.
pub fn seed_of(uid: &str) -> u64 {
    uid.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_count_sidecars_and_init_peaks() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [
                    {"name": "setup", "resources": {"requests": {"cpu": "4", "kudos.dev/gpu": "1"}}},
                    {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}}
                ],
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"kudos.dev/gpu": "2"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "1"}}}
                ],
                "overhead": {"cpu": "100m"}
            }
        }))
        .unwrap();
        let r = pod_requests(&pod, "kudos.dev/gpu");
        // cpu: max(1 + 1 + 0.5, 4) + 0.1; gpus from limits (no request given).
        assert_eq!((r.cpu_milli, r.memory_bytes, r.gpus), (4100, 1 << 30, 2));
    }
}
