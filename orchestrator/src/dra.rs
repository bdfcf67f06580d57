//! Which allocation API each node's kubelet uses for the unified resource: the device-plugin
//! API or DRA (issue 17). The orchestrator decides per node and tells the node's device plugin
//! in its `ReportPlugin` answer; `/state` shows the decision under `monitor.nodes`.
//!
//! A node uses one or the other, never both (KEP-5004): with DRA the plugin publishes a
//! ResourceSlice and the scheduler allocates `kudos.dev/gpu` through the `kudos-gpu`
//! DeviceClass; without it the plugin registers the name with the kubelet.

use kudos_api::dra::AllocationApi;
use serde::{Deserialize, Serialize};

use crate::kobj::NodeInfo;

/// The first Kubernetes minor release whose kubelet and scheduler serve DRA-backed extended
/// resources and device taints as GA (KEP-5004, KEP-5055): what `auto` requires.
pub const AUTO_MIN_KUBELET_MINOR: u32 = 37;

/// The cluster-wide policy (`nodes.allocationApi`, `--allocation-api`); a node's
/// `kudos.dev/allocation-api` label overrides it for that node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "camelCase")]
pub enum AllocationPolicy {
    /// Every node on the device-plugin API (the default: it works on every kubelet, and DRA
    /// also needs the chart's DeviceClasses).
    #[default]
    DevicePlugin,
    /// Every node on DRA.
    Dra,
    /// DRA where the kubelet is v1.37 or newer, the device plugin elsewhere.
    Auto,
}

/// The allocation API of a node, and why (for logs and `/state`).
pub fn decide(policy: AllocationPolicy, node: Option<&NodeInfo>) -> (AllocationApi, &'static str) {
    if let Some(api) = node.and_then(|n| n.allocation_api_label) {
        return (api, "the node's kudos.dev/allocation-api label");
    }
    match policy {
        AllocationPolicy::DevicePlugin => (AllocationApi::DevicePlugin, "policy devicePlugin"),
        AllocationPolicy::Dra => (AllocationApi::Dra, "policy dra"),
        AllocationPolicy::Auto => match node.and_then(|n| n.kubelet_version) {
            Some((1, minor)) if minor >= AUTO_MIN_KUBELET_MINOR => (
                AllocationApi::Dra,
                "policy auto: the kubelet serves DRA extended resources",
            ),
            Some(_) => (
                AllocationApi::DevicePlugin,
                "policy auto: the kubelet is older than v1.37",
            ),
            None => (
                AllocationApi::DevicePlugin,
                "policy auto: the node's kubelet version is not known yet",
            ),
        },
    }
}

/// `(major, minor)` of a kubelet version such as `v1.37.2` or `v1.37.0-rc.1+abc`.
pub fn parse_kubelet_version(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.trim().strip_prefix('v').unwrap_or(v.trim()).split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(version: Option<(u32, u32)>, label: Option<AllocationApi>) -> NodeInfo {
        NodeInfo {
            name: "n".into(),
            label_profile: None,
            gpu_allocatable: None,
            gpu_capacity: None,
            cpu_allocatable_milli: 0,
            memory_allocatable_bytes: 0,
            ready: Ok(()),
            kubelet_version: version,
            allocation_api_label: label,
        }
    }

    #[test]
    fn versions_parse() {
        assert_eq!(parse_kubelet_version("v1.37.2"), Some((1, 37)));
        assert_eq!(parse_kubelet_version("v1.38.0-rc.1+abc"), Some((1, 38)));
        assert_eq!(parse_kubelet_version("1.36"), Some((1, 36)));
        assert_eq!(parse_kubelet_version(""), None);
        assert_eq!(parse_kubelet_version("vX.Y"), None);
    }

    #[test]
    fn policy_label_and_version_decide() {
        use AllocationApi::{DevicePlugin as Dp, Dra};
        let new = node(Some((1, 37)), None);
        let old = node(Some((1, 36)), None);
        let unknown = node(None, None);
        assert_eq!(decide(AllocationPolicy::DevicePlugin, Some(&new)).0, Dp);
        assert_eq!(decide(AllocationPolicy::Dra, Some(&old)).0, Dra);
        assert_eq!(decide(AllocationPolicy::Auto, Some(&new)).0, Dra);
        assert_eq!(decide(AllocationPolicy::Auto, Some(&old)).0, Dp);
        assert_eq!(decide(AllocationPolicy::Auto, Some(&unknown)).0, Dp);
        assert_eq!(decide(AllocationPolicy::Auto, None).0, Dp);
        // The node's label wins over the policy, both ways.
        assert_eq!(
            decide(AllocationPolicy::Dra, Some(&node(Some((1, 37)), Some(Dp)))).0,
            Dp
        );
        assert_eq!(
            decide(AllocationPolicy::DevicePlugin, Some(&node(None, Some(Dra)))).0,
            Dra
        );
    }
}
