//! What the index shows outside the ranking path: `GET /state` and node monitoring's inputs.

use super::{Exclusions, HeartbeatInfo, Index, MonitorView, NodeStates};
use crate::fasthash::FastMap;
use crate::state::PluginConfig;
use kudos_scheduler_core::{NodeState, Scheduler};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What node monitoring reads from the index (see [`kudos_rollout::MonitorInputs`]).
#[derive(Clone, Debug, Default)]
pub struct MonitorObservations {
    /// Node → capacity/allocatable of the unified resource and readiness (Node watch).
    pub nodes: BTreeMap<String, kudos_rollout::NodeObservation>,
    /// Node → healthy/total devices of the plugins' latest reports, over vendors.
    pub plugin_health: BTreeMap<String, kudos_rollout::PluginHealth>,
    /// Node → the agent's latest heartbeat.
    pub heartbeats: BTreeMap<String, std::time::SystemTime>,
}

impl Index {
    /// What node monitoring needs from the index.
    pub fn monitor_observations(&self) -> MonitorObservations {
        let epoch = std::time::UNIX_EPOCH;
        MonitorObservations {
            nodes: self
                .all_facts()
                .filter_map(|(_, f)| f.info.as_ref())
                .map(|n| {
                    let obs = kudos_rollout::NodeObservation {
                        capacity: n.gpu_capacity.map(u64::from),
                        allocatable: n.gpu_allocatable.map(u64::from),
                        ready: Some(n.ready.is_ok()),
                        allocation_api: crate::dra::decide(self.allocation_policy, Some(n)).0,
                    };
                    (n.name.clone(), obs)
                })
                .collect(),
            plugin_health: self
                .all_facts()
                .filter_map(|(node, f)| {
                    let (healthy, total) = f.reported_devices()?;
                    let health = kudos_rollout::PluginHealth {
                        healthy: healthy.into(),
                        total: total.into(),
                    };
                    Some((node.to_string(), health))
                })
                .collect(),
            heartbeats: self
                .all_facts()
                .filter_map(|(node, f)| Some((node, f.heartbeat.as_ref()?)))
                .filter(|(_, hb)| hb.at.is_finite() && hb.at >= 0.0)
                .map(|(node, hb)| {
                    let at = epoch + std::time::Duration::from_secs_f64(hb.at.min(1e12));
                    (node.to_string(), at)
                })
                .collect(),
        }
    }

    /// A serialisable view for `GET /state`.
    pub fn view(&self, now: f64) -> StateView {
        let mut names: Vec<&str> = self
            .all_facts()
            .filter(|(_, f)| f.info.is_some())
            .map(|(n, _)| n.as_str())
            .chain(self.plugin_config.nodes.keys().map(String::as_str))
            .collect();
        names.sort_unstable();
        names.dedup();
        let NodeStates {
            states: nodes,
            unknown,
            ..
        } = self.node_states(
            names,
            Exclusions::Ignore,
            &FastMap::default(),
            &FastMap::default(),
            now,
        );
        let allocation_api = self
            .plugin_config
            .nodes
            .keys()
            .map(|n| {
                let (api, why) = self.allocation_api(n);
                let slice_devices = self
                    .slices
                    .node(n)
                    .map(|((healthy, total), _)| SliceCounts { healthy, total });
                (
                    n.clone(),
                    AllocationApiView {
                        api,
                        why,
                        slice_devices,
                    },
                )
            })
            .collect();
        StateView {
            allocation_api,
            plugin_config: self.plugin_config.clone(),
            // By name, as asked: the states come in slot order.
            nodes: {
                let mut nodes: Vec<_> = nodes.into_iter().map(super::NodeRef::into_owned).collect();
                nodes.sort_unstable_by(|a, b| a.name.cmp(&b.name));
                nodes
            },
            nodes_without_accelerators: unknown.into_iter().map(|(n, _)| n).collect(),
            heartbeats: self
                .all_facts()
                .filter_map(|(n, f)| Some((n.to_string(), f.heartbeat.clone()?)))
                .collect(),
            model: ModelSummary {
                applied_seq: self.applied_seq,
                runs: self.scheduler.state().runs(),
                classes: self
                    .scheduler
                    .state()
                    .classes()
                    .map(str::to_owned)
                    .collect(),
                state: PublishedModel(self.scheduler.clone()),
            },
            ready: self.ready(),
            node_monitor: self.monitor.clone(),
        }
    }
}

/// `GET /state`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StateView {
    /// Plugin configuration as persisted.
    pub plugin_config: PluginConfig,
    /// Every known node as the extender would rank it now (without in-flight binds).
    pub nodes: Vec<NodeState>,
    /// Nodes with a `Node` object but no known accelerators.
    pub nodes_without_accelerators: Vec<String>,
    /// Agent heartbeats.
    pub heartbeats: BTreeMap<String, HeartbeatInfo>,
    /// Model.
    pub model: ModelSummary,
    /// `/readyz` value.
    pub ready: bool,
    /// The latest node-monitoring pass per configured node (`null` while rollout is off).
    pub node_monitor: Option<MonitorView>,
    /// How each configured node's kubelet allocates the unified resource, and why.
    pub allocation_api: BTreeMap<String, AllocationApiView>,
}

/// One node's allocation API in `GET /state`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationApiView {
    /// `device-plugin` or `dra`.
    pub api: kudos_api::dra::AllocationApi,
    /// The policy or label that decided it.
    pub why: &'static str,
    /// The devices of its ResourceSlices of the Kudos driver, if it has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slice_devices: Option<SliceCounts>,
}

/// A node's ResourceSlice devices in `GET /state`.
#[derive(Serialize)]
pub struct SliceCounts {
    /// Without the unhealthy taint: what the scheduler may allocate.
    pub healthy: u32,
    /// All.
    pub total: u32,
}

/// The model part of `GET /state`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelSummary {
    /// Highest run `seq` included.
    pub applied_seq: u64,
    /// Runs the model learned from.
    pub runs: u64,
    /// Classes with history.
    pub classes: Vec<String>,
    /// The full model state.
    pub state: PublishedModel,
}

/// A published model, serialised as its state; shared, not copied, by `GET /state`.
pub struct PublishedModel(pub Arc<Scheduler>);

impl Serialize for PublishedModel {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.state().serialize(s)
    }
}
