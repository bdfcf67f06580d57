use super::*;
use crate::fixtures::mk_view;
use crate::metrics::MonitorMetrics;
use crate::render::render_group;
use k8s_openapi::api::apps::v1::DaemonSetStatus;
use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use prometheus_client::registry::Registry;

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

fn obs(alloc: u64) -> NodeObservation {
    NodeObservation {
        capacity: Some(alloc),
        allocatable: Some(alloc),
        ready: Some(true),
        allocation_api: AllocationApi::DevicePlugin,
    }
}

fn with_image(mut v: PluginConfig, group: &str) -> PluginConfig {
    v.images.insert(
        group.into(),
        kudos_api::DerivedImage {
            reference: format!("r/p@sha256:{group}"),
            digest: format!("sha256:{group}"),
            tag: format!("{group}-g1"),
            generation: 1,
            base_image: "r/b:1".into(),
            config_layer_diff_id: "sha256:0".into(),
        },
    );
    v
}

#[test]
fn node_observation_from_node_object() {
    let node = Node {
        status: Some(NodeStatus {
            capacity: Some([("kudos.dev/gpu".to_string(), Quantity("4".into()))].into()),
            allocatable: Some([("kudos.dev/gpu".to_string(), Quantity("3".into()))].into()),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
        ..Node::default()
    };
    let o = NodeObservation::from_node(&node, "kudos.dev/gpu");
    assert_eq!(
        o,
        NodeObservation {
            capacity: Some(4),
            allocatable: Some(3),
            ready: Some(true),
            allocation_api: AllocationApi::DevicePlugin,
        }
    );
    let none = NodeObservation::from_node(&Node::default(), "kudos.dev/gpu");
    assert_eq!(none, NodeObservation::default());
}

#[test]
fn healthy_node_is_ranked_and_stale_ones_are_excluded_with_reasons() {
    let view = with_image(mk_view(), "nvidia");
    let settings = RolloutSettings::default();
    let nodes = BTreeMap::from([
        ("n1".to_string(), obs(1)),
        ("n2".to_string(), obs(2)),
        (
            "n3".to_string(),
            NodeObservation {
                ready: Some(false),
                ..obs(1)
            },
        ),
    ]);
    let health = BTreeMap::from([(
        "n1".to_string(),
        PluginHealth {
            healthy: 1,
            total: 1,
        },
    )]);
    let heartbeats = BTreeMap::from([
        ("n1".to_string(), t(1000)),
        ("n2".to_string(), t(800)),
        ("n3".to_string(), t(1100)),
    ]);
    let inputs = MonitorInputs {
        now: t(1000 + 30),
        nodes: &nodes,
        plugin_health: &health,
        heartbeats: &heartbeats,
        daemonsets: &[],
    };
    let m = monitor(&view, &settings, &MonitorPolicy::default(), &inputs).unwrap();
    assert_eq!(
        m.iter().map(|n| n.node.as_str()).collect::<Vec<_>>(),
        ["n1", "n2", "n3", "n4"]
    );
    let n1 = &m[0];
    assert!(!n1.exclude_from_ranking, "{n1:?}");
    assert_eq!(n1.heartbeat_age_seconds, Some(30.0));
    assert_eq!(n1.healthy_devices, Some(1));
    assert_eq!(n1.configured_devices, 1);
    assert_eq!(n1.rollout, RolloutState::NotApplied);
    assert_eq!(m[1].reasons, [ExclusionReason::HeartbeatStale]);
    assert_eq!(m[2].reasons, [ExclusionReason::NodeNotReady]);
    assert_eq!(
        m[2].heartbeat_age_seconds,
        Some(0.0),
        "future heartbeat counts as fresh"
    );
    assert_eq!(m[2].rollout, RolloutState::NoImage);
    assert_eq!(
        m[3].reasons,
        [ExclusionReason::NodeNotFound, ExclusionReason::NoHeartbeat]
    );
    // A freshly started orchestrator has heard no heartbeat yet: within the grace a node
    // without one is not excluded for it (a stale one still is); after it, it is.
    let grace = |until| MonitorPolicy {
        no_heartbeat_grace_until: Some(until),
        ..MonitorPolicy::default()
    };
    let early = monitor(
        &view,
        &settings,
        &grace(inputs.now + Duration::from_secs(1)),
        &inputs,
    )
    .unwrap();
    assert_eq!(early[3].reasons, [ExclusionReason::NodeNotFound]);
    assert_eq!(early[1].reasons, [ExclusionReason::HeartbeatStale]);
    let late = monitor(&view, &settings, &grace(inputs.now), &inputs).unwrap();
    assert_eq!(late[3].reasons, m[3].reasons);

    let metrics = MonitorMetrics::default();
    let mut registry = Registry::with_prefix("kudos_node");
    metrics.register(&mut registry);
    metrics.observe(&m);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("kudos_node_excluded{node=\"n2\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("kudos_node_heartbeat_age_seconds{node=\"n1\"} 30.0"),
        "{text}"
    );
    assert!(
        !text.contains("kudos_node_unified_capacity{node=\"n4\"}"),
        "{text}"
    );
}

/// The monitor entry of node n1 of [`mk_view`], observed as `n1` with a fresh heartbeat.
fn monitor_n1(n1: NodeObservation) -> NodeMonitor {
    let nodes = BTreeMap::from([("n1".to_string(), n1)]);
    let heartbeats = BTreeMap::from([("n1".to_string(), t(10))]);
    let inputs = MonitorInputs {
        now: t(10),
        nodes: &nodes,
        plugin_health: &BTreeMap::new(),
        heartbeats: &heartbeats,
        daemonsets: &[],
    };
    monitor(
        &mk_view(),
        &RolloutSettings::default(),
        &MonitorPolicy::default(),
        &inputs,
    )
    .unwrap()
    .into_iter()
    .find(|n| n.node == "n1")
    .expect("n1 monitored")
}

#[test]
fn zero_allocatable_with_configured_devices_excludes() {
    assert_eq!(monitor_n1(obs(0)).reasons, [ExclusionReason::NoAllocatable]);
}

#[test]
fn a_dra_node_without_allocatable_is_ranked() {
    // Its devices are in a ResourceSlice: the kubelet advertises no allocatable for the name.
    let n1 = monitor_n1(NodeObservation {
        capacity: None,
        allocatable: None,
        allocation_api: AllocationApi::Dra,
        ..obs(0)
    });
    assert!(n1.reasons.is_empty(), "{:?}", n1.reasons);
    assert!(!n1.exclude_from_ranking);
    assert_eq!(n1.allocation_api, AllocationApi::Dra);
}

#[test]
fn rollout_state_follows_daemonset_status() {
    let view = with_image(mk_view(), "nvidia");
    let group = &view.groups().unwrap()[2];
    let image = &view.images["nvidia"].reference;
    let mut ds = render_group(group, image, 1, &RolloutSettings::default());
    ds.metadata.generation = Some(2);
    assert_eq!(
        rollout_state(Some(image), Some(&ds)),
        RolloutState::Progressing {
            desired: 0,
            updated: 0,
            available: 0
        }
    );
    ds.status = Some(DaemonSetStatus {
        desired_number_scheduled: 2,
        updated_number_scheduled: Some(1),
        number_available: Some(2),
        observed_generation: Some(2),
        ..DaemonSetStatus::default()
    });
    assert_eq!(
        rollout_state(Some(image), Some(&ds)),
        RolloutState::Progressing {
            desired: 2,
            updated: 1,
            available: 2
        }
    );
    ds.status.as_mut().unwrap().updated_number_scheduled = Some(2);
    assert_eq!(
        rollout_state(Some(image), Some(&ds)),
        RolloutState::Complete { desired: 2 }
    );
    ds.status.as_mut().unwrap().observed_generation = Some(1);
    assert!(matches!(
        rollout_state(Some(image), Some(&ds)),
        RolloutState::Progressing { .. }
    ));
    assert_eq!(
        rollout_state(Some("other@sha256:x"), Some(&ds)),
        RolloutState::ImageOutdated
    );
    assert_eq!(rollout_state(None, Some(&ds)), RolloutState::NoImage);
}
