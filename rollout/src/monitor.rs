//! Monitoring the nodes named in the plugin configuration (design §2.1 step 7).
//!
//! [`monitor`] is a pure function: the orchestrator's index supplies what its watches and
//! ingestion saw, together with `now`, and gets one [`NodeMonitor`] per configured node —
//! for `/state`, for the extender's filter (drop nodes with
//! [`NodeMonitor::exclude_from_ranking`]) and for [`crate::MonitorMetrics::observe`].
//!
//! Inputs ([`MonitorInputs`]):
//! - `nodes`: node name → [`NodeObservation`] (capacity/allocatable of the unified resource
//!   and the Ready condition), from a Node watch via [`NodeObservation::from_node`];
//! - `plugin_health`: node name → [`PluginHealth`], the healthy/total device counts of the
//!   plugin's latest report;
//! - `heartbeats`: node name → time of the node agent's latest heartbeat;
//! - `daemonsets`: the plugin DaemonSets as the API server last reported them (a watch on
//!   [`crate::render::OWNED_SELECTOR`]).
//!
//! A node is excluded from ranking when it is gone, not Ready, has no (or a stale) agent
//! heartbeat, or advertises none of the unified resource while the configuration lists
//! devices for it. Partial health (some devices unhealthy) is reported, not excluded: the
//! kubelet already stops allocating unhealthy devices.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use serde::{Deserialize, Serialize};

use crate::render::{RolloutSettings, daemonset_name};
use kudos_api::dra::AllocationApi;
use kudos_api::{PluginConfig, PluginConfigError};

/// What the API server says about a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeObservation {
    /// `status.capacity[<unified name>]`, when advertised.
    pub capacity: Option<u64>,
    /// `status.allocatable[<unified name>]`, when advertised.
    pub allocatable: Option<u64>,
    /// The `Ready` condition (`None` when absent).
    pub ready: Option<bool>,
    /// How the node's kubelet allocates the unified resource. A DRA node advertises no
    /// allocatable for it (its devices are in a ResourceSlice), so that is not a fault there.
    #[serde(default)]
    pub allocation_api: AllocationApi,
}

impl NodeObservation {
    /// Extracts the unified resource and readiness from a Node object.
    pub fn from_node(node: &Node, unified_resource_name: &str) -> Self {
        let status = node.status.as_ref();
        let count = |m: Option<
            &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        >| {
            m.and_then(|m| m.get(unified_resource_name))
                .and_then(|q| q.0.trim().parse::<u64>().ok())
        };
        Self {
            capacity: count(status.and_then(|s| s.capacity.as_ref())),
            allocatable: count(status.and_then(|s| s.allocatable.as_ref())),
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status == "True"),
            allocation_api: AllocationApi::DevicePlugin,
        }
    }
}

/// The device counts of a plugin's latest report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginHealth {
    /// Devices reported healthy.
    pub healthy: u64,
    /// Devices reported.
    pub total: u64,
}

/// Thresholds of monitoring.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MonitorPolicy {
    /// A heartbeat older than this marks the node stale (a few heartbeat periods).
    pub stale_after: Duration,
    /// Before this instant a node without any heartbeat is not excluded: a freshly started
    /// orchestrator (install, upgrade, restart) has seen no heartbeat from anyone yet, and a
    /// pod the extender rejects then waits in kube-scheduler's unschedulable queue for up to
    /// five minutes (measured on real nodes: no job placed for 120 s after install). Set it to
    /// the process start plus `stale_after`; `None`: no grace.
    pub no_heartbeat_grace_until: Option<SystemTime>,
}

impl Default for MonitorPolicy {
    fn default() -> Self {
        Self {
            stale_after: Duration::from_secs(90),
            no_heartbeat_grace_until: None,
        }
    }
}

/// Everything [`monitor`] reads besides the configuration.
#[derive(Clone, Copy, Debug)]
pub struct MonitorInputs<'a> {
    /// The current time.
    pub now: SystemTime,
    /// Node name → what the API server says.
    pub nodes: &'a BTreeMap<String, NodeObservation>,
    /// Node name → the plugin's latest device health.
    pub plugin_health: &'a BTreeMap<String, PluginHealth>,
    /// Node name → the node agent's latest heartbeat.
    pub heartbeats: &'a BTreeMap<String, SystemTime>,
    /// The plugin DaemonSets as last seen.
    pub daemonsets: &'a [DaemonSet],
}

/// Why a node is excluded from ranking.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ExclusionReason {
    /// The Node object does not exist.
    NodeNotFound,
    /// The Node is not Ready.
    NodeNotReady,
    /// No heartbeat from the node agent yet.
    NoHeartbeat,
    /// The latest heartbeat is older than the policy allows.
    HeartbeatStale,
    /// The node advertises none of the unified resource though devices are configured.
    NoAllocatable,
}

/// Rollout state of the DaemonSet serving a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum RolloutState {
    /// The group has no derived image yet.
    NoImage,
    /// The DaemonSet does not exist (not yet applied).
    NotApplied,
    /// The DaemonSet runs another image than the configuration records (apply pending).
    ImageOutdated,
    /// The DaemonSet controller is rolling out.
    Progressing {
        /// Nodes that should run the plugin.
        desired: i32,
        /// Nodes running the current template.
        updated: i32,
        /// Nodes with an available plugin pod.
        available: i32,
    },
    /// Every desired node runs an available, up-to-date plugin pod.
    Complete {
        /// Nodes that run the plugin.
        desired: i32,
    },
}

/// The monitoring view of one configured node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeMonitor {
    /// Node name.
    pub node: String,
    /// Plugin group (vendor set) of the node.
    pub group: String,
    /// The DaemonSet serving it.
    pub daemonset: String,
    /// Devices the configuration lists for the node.
    pub configured_devices: u64,
    /// Capacity of the unified resource.
    pub capacity: Option<u64>,
    /// Allocatable of the unified resource.
    pub allocatable: Option<u64>,
    /// Healthy devices per the plugin's latest report.
    pub healthy_devices: Option<u64>,
    /// Seconds since the node agent's last heartbeat.
    pub heartbeat_age_seconds: Option<f64>,
    /// The node's Ready condition.
    pub ready: Option<bool>,
    /// How the node's kubelet allocates the unified resource (`device-plugin` or `dra`).
    pub allocation_api: AllocationApi,
    /// The serving DaemonSet's rollout.
    pub rollout: RolloutState,
    /// Why the node is excluded, if it is.
    pub reasons: Vec<ExclusionReason>,
    /// Whether ranking must skip the node.
    pub exclude_from_ranking: bool,
}

/// One [`NodeMonitor`] per configured node, sorted by node name.
pub fn monitor(
    view: &PluginConfig,
    settings: &RolloutSettings,
    policy: &MonitorPolicy,
    inputs: &MonitorInputs<'_>,
) -> Result<Vec<NodeMonitor>, PluginConfigError> {
    let by_name: BTreeMap<&str, &DaemonSet> = inputs
        .daemonsets
        .iter()
        .filter_map(|d| d.metadata.name.as_deref().map(|n| (n, d)))
        .collect();
    let mut out = Vec::new();
    for group in view.groups()? {
        let ds_name = daemonset_name(settings, &group.name);
        let rollout = rollout_state(
            view.images.get(&group.name).map(|i| i.reference.as_str()),
            by_name.get(ds_name.as_str()).copied(),
        );
        for node in &group.nodes {
            let obs = inputs.nodes.get(node);
            let configured_devices = view.device_count(node);
            let heartbeat_age = inputs
                .heartbeats
                .get(node)
                .map(|t| inputs.now.duration_since(*t).unwrap_or(Duration::ZERO));
            let mut reasons = Vec::new();
            match obs {
                None => reasons.push(ExclusionReason::NodeNotFound),
                Some(o) if o.ready != Some(true) => reasons.push(ExclusionReason::NodeNotReady),
                Some(_) => {}
            }
            let in_grace = policy
                .no_heartbeat_grace_until
                .is_some_and(|until| inputs.now < until);
            match heartbeat_age {
                None if in_grace => {}
                None => reasons.push(ExclusionReason::NoHeartbeat),
                Some(age) if age > policy.stale_after => {
                    reasons.push(ExclusionReason::HeartbeatStale);
                }
                Some(_) => {}
            }
            if let Some(o) = obs
                && configured_devices > 0
                && o.allocation_api == AllocationApi::DevicePlugin
                && o.allocatable.unwrap_or(0) == 0
            {
                reasons.push(ExclusionReason::NoAllocatable);
            }
            out.push(NodeMonitor {
                node: node.clone(),
                group: group.name.clone(),
                daemonset: ds_name.clone(),
                configured_devices,
                capacity: obs.and_then(|o| o.capacity),
                allocatable: obs.and_then(|o| o.allocatable),
                healthy_devices: inputs.plugin_health.get(node).map(|h| h.healthy),
                heartbeat_age_seconds: heartbeat_age.map(|a| a.as_secs_f64()),
                ready: obs.and_then(|o| o.ready),
                allocation_api: obs.map(|o| o.allocation_api).unwrap_or_default(),
                rollout: rollout.clone(),
                exclude_from_ranking: !reasons.is_empty(),
                reasons,
            });
        }
    }
    out.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(out)
}

/// The rollout state of a group's DaemonSet given the image the configuration records.
pub fn rollout_state(image: Option<&str>, ds: Option<&DaemonSet>) -> RolloutState {
    let Some(image) = image else {
        return RolloutState::NoImage;
    };
    let Some(ds) = ds else {
        return RolloutState::NotApplied;
    };
    let running = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.as_deref());
    if running != Some(image) {
        return RolloutState::ImageOutdated;
    }
    let Some(status) = ds.status.as_ref() else {
        return RolloutState::Progressing {
            desired: 0,
            updated: 0,
            available: 0,
        };
    };
    let desired = status.desired_number_scheduled;
    let updated = status.updated_number_scheduled.unwrap_or(0);
    let available = status.number_available.unwrap_or(0);
    let observed = status.observed_generation.unwrap_or(0) >= ds.metadata.generation.unwrap_or(0);
    if observed && updated == desired && available == desired {
        RolloutState::Complete { desired }
    } else {
        RolloutState::Progressing {
            desired,
            updated,
            available,
        }
    }
}

#[cfg(test)]
#[path = "monitor_tests.rs"]
mod tests;
