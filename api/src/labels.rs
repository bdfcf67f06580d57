//! `kudos.dev/*` labels and annotations: the keys users put on pods, the orchestrator puts on
//! nodes, and the rollout puts on the DaemonSets it renders.

/// The domain every Kudos label, annotation and resource name lives under.
pub const DOMAIN: &str = "kudos.dev";

// === pods (set by users, read by the orchestrator and the node agent) ===

/// Pod label naming the algorithm class of the work the pod does.
pub const CLASS: &str = "kudos.dev/class";
/// Pod annotation: work units of the class this pod does (a positive number).
pub const WORK: &str = "kudos.dev/work";
/// Pod annotation: progress reported by the workload, 0..=1.
pub const PROGRESS: &str = "kudos.dev/progress";
/// Pod annotation: deadline in seconds (the review threshold).
pub const DEADLINE_SECONDS: &str = "kudos.dev/deadline-seconds";
/// Pod annotation: name of the gang the pod belongs to.
pub const GANG_NAME: &str = "kudos.dev/gang-name";
/// Pod annotation: number of pods in the gang; set together with [`GANG_NAME`].
pub const GANG_SIZE: &str = "kudos.dev/gang-size";
/// Pod annotation: the device vendors the pod's image can use, comma-separated
/// (`nvidia`, `amd,nvidia`). Without it the scheduler's `default_vendors` apply.
pub const VENDORS: &str = "kudos.dev/vendors";
/// Most vendors one [`VENDORS`] annotation may name.
pub const MAX_POD_VENDORS: usize = 8;

// === pods (set by the orchestrator) ===

/// Pod annotation the orchestrator's `bind` sets: why Kudos placed the pod (the node it ranked
/// first, that node's prediction and what it rests on, the runner-up, where the full ranking
/// is; at most 1,000 characters). It rides on the Binding, which the API server copies onto
/// the pod, so it costs no API write of its own.
pub const PLACEMENT: &str = "kudos.dev/placement";

// === nodes (read by the orchestrator) ===

/// Node label: GPU vendor key (`nvidia`, `amd`, …).
pub const GPU_VENDOR: &str = "kudos.dev/gpu-vendor";
/// Node label: GPU model.
pub const GPU_MODEL: &str = "kudos.dev/gpu-model";
/// Node label: memory per GPU in bytes.
pub const GPU_MEMORY_BYTES: &str = "kudos.dev/gpu-memory-bytes";
/// Node label: how the node's kubelet allocates the unified resource, `dra` or
/// `device-plugin` ([`crate::dra::AllocationApi`]); overrides the orchestrator's policy for
/// that node.
pub const ALLOCATION_API: &str = "kudos.dev/allocation-api";

// === plugin DaemonSets (written by the rollout) ===

/// Label naming the plugin group (vendor set) of a DaemonSet and its pods.
pub const PLUGIN_GROUP: &str = "kudos.dev/plugin-group";
/// Annotation: the plugin-configuration generation the DaemonSet's image was derived at.
pub const CONFIG_GENERATION: &str = "kudos.dev/config-generation";

// === orchestrator replicas (written by the leader on its own pod) ===

/// Label on the orchestrator pod that holds the leader Lease; the chart's Service selects it,
/// so kube-scheduler, device plugins and node agents reach the leader alone.
pub const ORCHESTRATOR_ROLE: &str = "kudos.dev/role";
/// The value of [`ORCHESTRATOR_ROLE`] on the leader.
pub const ROLE_LEADER: &str = "leader";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_is_a_qualified_name_under_the_domain() {
        for key in [
            ALLOCATION_API,
            ORCHESTRATOR_ROLE,
            CLASS,
            WORK,
            PROGRESS,
            DEADLINE_SECONDS,
            GANG_NAME,
            GANG_SIZE,
            PLACEMENT,
            GPU_VENDOR,
            GPU_MODEL,
            GPU_MEMORY_BYTES,
            PLUGIN_GROUP,
            CONFIG_GENERATION,
        ] {
            let (domain, name) = key.split_once('/').expect("prefixed");
            assert_eq!(domain, DOMAIN, "{key}");
            assert!(!name.is_empty() && name.len() <= 63, "{key}");
        }
    }
}
