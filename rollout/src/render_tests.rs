use super::*;
use crate::fixtures::mk_view;
use kudos_api::DerivedImage;

fn mk_image(group: &str, generation: u64) -> DerivedImage {
    DerivedImage {
        reference: format!("127.0.0.1:5000/kudos/plugin@sha256:{group:0>64}"),
        digest: format!("sha256:{group:0>64}"),
        tag: format!("{group}-g{generation}"),
        generation,
        base_image: "127.0.0.1:5000/kudos/base:1".into(),
        config_layer_diff_id: "sha256:00".into(),
    }
}

fn mk_imaged_view() -> PluginConfig {
    let mut v = mk_view();
    for g in ["amd", "amd-nvidia", "nvidia"] {
        v.images.insert(g.into(), mk_image(g, 5));
    }
    v
}

fn container(ds: &DaemonSet) -> &Container {
    &ds.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
}

fn volume_paths(ds: &DaemonSet) -> Vec<(String, String, bool)> {
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let c = &pod.containers[0];
    let vols = pod.volumes.as_ref().unwrap();
    c.volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| {
            let v = vols.iter().find(|v| v.name == m.name).unwrap();
            (
                v.host_path.as_ref().unwrap().path.clone(),
                m.mount_path.clone(),
                m.read_only.unwrap_or(false),
            )
        })
        .collect()
}

#[test]
fn rendering_is_deterministic() {
    let s = RolloutSettings::default();
    let a = render_yaml(&mk_imaged_view(), &s).unwrap();
    // Same content built in another insertion order.
    let mut shuffled = mk_imaged_view();
    let nodes: Vec<_> = shuffled.nodes.keys().rev().cloned().collect();
    let entries: Vec<_> = nodes
        .iter()
        .map(|n| (n.clone(), shuffled.nodes[n].clone()))
        .collect();
    shuffled.nodes.clear();
    shuffled.nodes.extend(entries);
    assert_eq!(a, render_yaml(&shuffled, &s).unwrap());
    assert_eq!(
        render_daemonsets(&mk_imaged_view(), &s).unwrap(),
        render_daemonsets(&mk_imaged_view(), &s).unwrap()
    );
}

#[test]
fn affinity_lists_exactly_the_groups_nodes() {
    let dss = render_daemonsets(&mk_imaged_view(), &RolloutSettings::default()).unwrap();
    let got: Vec<(String, Vec<String>)> = dss
        .iter()
        .map(|d| (d.metadata.name.clone().unwrap(), affinity_nodes(d)))
        .collect();
    assert_eq!(
        got,
        [
            (
                "kudos-device-plugin-amd".to_string(),
                vec!["n3".to_string()]
            ),
            (
                "kudos-device-plugin-amd-nvidia".to_string(),
                vec!["n4".to_string()]
            ),
            (
                "kudos-device-plugin-nvidia".to_string(),
                vec!["n1".to_string(), "n2".to_string()]
            ),
        ]
    );
}

#[test]
fn every_affinity_term_also_requires_the_group_label() {
    for ds in render_daemonsets(&mk_imaged_view(), &RolloutSettings::default()).unwrap() {
        let group = ds.metadata.labels.as_ref().unwrap()[labels::PLUGIN_GROUP].clone();
        let pod = ds.spec.unwrap().template.spec.unwrap();
        let terms = pod
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        for t in terms {
            let e = &t.match_expressions.unwrap()[0];
            assert_eq!(
                (e.key.as_str(), e.operator.as_str(), e.values.clone()),
                (labels::PLUGIN_GROUP, "In", Some(vec![group.clone()]))
            );
        }
    }
}

fn bootstrap_template() -> PodTemplateSpec {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "labels": {"app.kubernetes.io/name": "kudos-device-plugin",
                       "app.kubernetes.io/component": "device-plugin-bootstrap"},
            "annotations": {"checksum/config": "abc"},
        },
        "spec": {
            "runtimeClassName": "nvidia",
            "hostNetwork": true,
            "imagePullSecrets": [{"name": "pull"}],
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kudos.dev/plugin-group", "operator": "DoesNotExist"}]}]}},
                "podAntiAffinity": {},
            },
            "containers": [
                {"name": "plugin", "image": "kudos/kudos-device-plugin:0.1.0",
                 "imagePullPolicy": "Always", "args": ["--token-file=/t"],
                 "env": [{"name": "KUDOS_VENDOR", "value": "x"},
                         {"name": "KUDOS_PLUGIN_CONFIG_DIR", "value": "/x"},
                         {"name": "NODE_NAME", "value": "n"}]},
                {"name": "sidecar", "image": "other:1"},
            ],
        },
    }))
    .unwrap()
}

#[test]
fn template_pods_change_only_image_labels_affinity_env_and_pull_secrets() {
    let t = bootstrap_template();
    let settings = RolloutSettings {
        image_pull_secrets: vec!["pull".into(), "derived".into()],
        env: [("EXTRA".to_string(), "1".to_string())].into(),
        ..RolloutSettings::default()
    };
    let view = mk_imaged_view();
    let dss = render_daemonsets_from(&view, &settings, Some(&t)).unwrap();
    let nv = &dss[2];
    let pod = &nv.spec.as_ref().unwrap().template;
    let meta = pod.metadata.as_ref().unwrap();
    let labels_ = meta.labels.as_ref().unwrap();
    assert_eq!(
        labels_[LABEL_COMPONENT], COMPONENT,
        "never the bootstrap's selector"
    );
    assert_eq!(labels_[labels::PLUGIN_GROUP], "nvidia");
    assert_eq!(meta.annotations.as_ref().unwrap()["checksum/config"], "abc");
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.runtime_class_name.as_deref(), Some("nvidia"));
    assert_eq!(spec.host_network, Some(true));
    let secrets: Vec<&str> = spec
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(secrets, ["pull", "derived"]);
    let aff = spec.affinity.as_ref().unwrap();
    assert!(aff.pod_anti_affinity.is_some(), "other affinity kept");
    assert_eq!(affinity_nodes(nv), ["n1", "n2"]);
    let c = &spec.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some(view.images["nvidia"].reference.as_str())
    );
    assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(
        c.args.as_deref(),
        Some(&["--token-file=/t".to_string()][..])
    );
    let env: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(env, ["NODE_NAME", "EXTRA"], "image env not shadowed");
    assert_eq!(spec.containers[1].image.as_deref(), Some("other:1"));
    // The selector still matches the template's labels.
    for (k, v) in nv
        .spec
        .as_ref()
        .unwrap()
        .selector
        .match_labels
        .as_ref()
        .unwrap()
    {
        assert_eq!(labels_.get(k), Some(v));
    }
    // Same input, same output (server-side apply stays a no-op).
    assert_eq!(
        dss,
        render_daemonsets_from(&view, &settings, Some(&t)).unwrap()
    );
}

#[test]
fn image_by_digest_labels_and_generation_annotation() {
    let dss = render_daemonsets(&mk_imaged_view(), &RolloutSettings::default()).unwrap();
    let nv = &dss[2];
    assert!(container(nv).image.as_ref().unwrap().contains("@sha256:"));
    let labels = nv.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[LABEL_MANAGED_BY], MANAGED_BY);
    assert_eq!(labels[LABEL_COMPONENT], COMPONENT);
    assert_eq!(
        nv.metadata.annotations.as_ref().unwrap()[labels::CONFIG_GENERATION],
        "5"
    );
    assert_eq!(nv.metadata.namespace.as_deref(), Some("kudos-system"));
    // The selector matches the template's labels.
    let spec = nv.spec.as_ref().unwrap();
    let tl = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .as_ref()
        .unwrap();
    for (k, v) in spec.selector.match_labels.as_ref().unwrap() {
        assert_eq!(tl.get(k), Some(v));
    }
}

#[test]
fn host_paths_per_vendor() {
    let dss = render_daemonsets(&mk_imaged_view(), &RolloutSettings::default()).unwrap();
    let amd = volume_paths(&dss[0]);
    let nvidia = volume_paths(&dss[2]);
    let mixed = volume_paths(&dss[1]);
    let common = [
        (
            "/var/lib/kubelet/device-plugins",
            "/var/lib/kubelet/device-plugins",
            false,
        ),
        ("/dev", "/dev", true),
    ];
    for vols in [&amd, &nvidia, &mixed] {
        for (h, m, ro) in common {
            assert!(vols.contains(&(h.into(), m.into(), ro)), "{vols:?}");
        }
    }
    let sys = ("/sys".to_string(), "/sys".to_string(), true);
    let nvml = (
        "/usr/lib/x86_64-linux-gnu".to_string(),
        NVML_MOUNT_PATH.to_string(),
        true,
    );
    assert!(amd.contains(&sys) && !amd.contains(&nvml));
    assert!(nvidia.contains(&nvml) && !nvidia.contains(&sys));
    assert!(mixed.contains(&nvml) && mixed.contains(&sys));
}

#[test]
fn least_privilege_and_limits() {
    let dss = render_daemonsets(&mk_imaged_view(), &RolloutSettings::default()).unwrap();
    for ds in &dss {
        let c = container(ds);
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.privileged, Some(false));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert!(limits.contains_key("cpu") && limits.contains_key("memory"));
        let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        assert!(!pod.tolerations.as_ref().unwrap().is_empty());
        assert_eq!(pod.host_network, None);
    }
}

#[test]
fn groups_without_image_are_pending_not_rendered() {
    let mut v = mk_imaged_view();
    v.images.remove("amd");
    let dss = render_daemonsets(&v, &RolloutSettings::default()).unwrap();
    assert_eq!(dss.len(), 2);
    assert_eq!(pending_groups(&v).unwrap(), ["amd"]);
    let yaml = render_yaml(&v, &RolloutSettings::default()).unwrap();
    assert!(yaml.starts_with("# group amd: no derived image yet"));
    assert_eq!(yaml.matches("kind: DaemonSet").count(), 2);
    // Every document parses back to the DaemonSet rendered.
    let docs: Vec<DaemonSet> = yaml
        .split("---\n")
        .skip(1)
        .map(|d| serde_yaml::from_str(d).unwrap())
        .collect();
    assert_eq!(docs, dss);
}

proptest::proptest! {
    /// Every configured node is in exactly one DaemonSet's affinity, the one of its vendor
    /// set, and rendering twice gives the same objects.
    #[test]
    fn every_node_in_exactly_its_groups_daemonset(
        nodes in proptest::collection::btree_map("[a-z][a-z0-9]{0,6}", 1u8..8, 1..12)
    ) {
        use kudos_api::VendorEntry;
        let vendors = ["amd", "intel", "nvidia"];
        let mut view = PluginConfig {
            generation: 1,
            unified_resource_name: "kudos.dev/gpu".into(),
            ..PluginConfig::default()
        };
        for (node, mask) in &nodes {
            let entry: BTreeMap<String, VendorEntry> = vendors
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, v)| (v.to_string(), VendorEntry::default()))
                .collect();
            view.nodes.insert(node.clone(), entry);
        }
        for g in view.groups().unwrap() {
            view.images.insert(g.name.clone(), mk_image(&g.name, 1));
        }
        let s = RolloutSettings::default();
        let dss = render_daemonsets(&view, &s).unwrap();
        proptest::prop_assert_eq!(&dss, &render_daemonsets(&view, &s).unwrap());
        for (node, entry) in &view.nodes {
            let group = entry.keys().cloned().collect::<Vec<_>>().join("-");
            let holders: Vec<String> = dss
                .iter()
                .filter(|d| affinity_nodes(d).contains(node))
                .map(|d| d.metadata.labels.as_ref().unwrap()[labels::PLUGIN_GROUP].clone())
                .collect();
            proptest::prop_assert_eq!(holders, vec![group]);
        }
    }
}
