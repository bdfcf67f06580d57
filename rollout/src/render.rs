//! Rendering the deployment configuration: one DaemonSet per plugin group.
//!
//! Rendering is a pure function of the configuration view and [`RolloutSettings`], with every
//! map sorted, so the same input renders byte-identical objects and server-side apply of an
//! unchanged configuration is a no-op.
//!
//! Each DaemonSet:
//! - runs the group's derived image **by digest**, pinned to exactly the group's nodes by a
//!   required node affinity on `metadata.name` (the field the DaemonSet controller honours;
//!   one selector term per node, since a field requirement may carry only one value), each
//!   node once it carries the group's `kudos.dev/plugin-group` label ([`group_affinity`]);
//! - with `podTemplateFrom`, copies the bootstrap DaemonSet's pod ([`crate::template`]);
//!   otherwise runs the built-in pod, which
//! - mounts only what the plugin needs: the kubelet's device-plugin directory (read-write,
//!   for its socket), `/dev` read-only, a state directory for the cached unified name
//!   (design §2.1 step 4), `/sys` read-only for AMD, the NVML library directory read-only
//!   for NVIDIA;
//! - runs unprivileged: all capabilities dropped, no privilege escalation, read-only root
//!   filesystem, `RuntimeDefault` seccomp. It stays root (uid 0) only because the kubelet's
//!   device-plugin directory is root-owned;
//! - carries `kudos.dev/config-generation`: the configuration generation its image was
//!   derived at (it does not move when only other groups change, so their applies stay
//!   no-ops) and the `app.kubernetes.io/managed-by: kudos-orchestrator` label that pruning
//!   selects on.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, EnvVar, EnvVarSource, HostPathVolumeSource,
    LocalObjectReference, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, ResourceRequirements,
    SeccompProfile, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

use kudos_api::{PluginConfig, PluginConfigError, PluginGroup, env, labels};

/// `app.kubernetes.io/managed-by` label key.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`] on everything the orchestrator applies; also the field
/// manager of server-side apply.
pub const MANAGED_BY: &str = "kudos-orchestrator";
/// `app.kubernetes.io/component` label key.
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// Value of [`LABEL_COMPONENT`] on plugin DaemonSets; pruning selects on it too, so other
/// orchestrator-managed DaemonSets are never deleted by this crate.
pub const COMPONENT: &str = "device-plugin";
/// `app.kubernetes.io/name` label key.
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// Mount path of the NVML library directory inside NVIDIA plugin containers.
pub const NVML_MOUNT_PATH: &str = "/run/kudos/nvml-lib";
/// Label selector of the DaemonSets this crate owns.
pub const OWNED_SELECTOR: &str =
    "app.kubernetes.io/managed-by=kudos-orchestrator,app.kubernetes.io/component=device-plugin";

const STATE_MOUNT_PATH: &str = "/var/lib/kudos";

/// Errors rendering DaemonSets.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The configuration view is invalid.
    #[error(transparent)]
    Config(#[from] PluginConfigError),
    /// YAML serialization failed (dry run).
    #[error("serializing DaemonSet {name} to YAML")]
    Yaml {
        /// DaemonSet name.
        name: String,
        /// Cause.
        #[source]
        source: serde_yaml::Error,
    },
}

/// Deployment settings of the plugin DaemonSets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RolloutSettings {
    /// Namespace of the DaemonSets.
    pub namespace: String,
    /// DaemonSet name prefix; the name is `<prefix>-<group>`.
    pub name_prefix: String,
    /// Service account of the plugin pods (its token authenticates reports).
    pub service_account: Option<String>,
    /// Priority class; device plugins are node-critical.
    pub priority_class: Option<String>,
    /// Tolerations of the plugin pods.
    pub tolerations: Vec<Toleration>,
    /// Container requests (`cpu`, `memory`).
    pub requests: BTreeMap<String, String>,
    /// Container limits (`cpu`, `memory`).
    pub limits: BTreeMap<String, String>,
    /// Host directory holding `libnvidia-ml.so.1` (mounted read-only for NVIDIA groups).
    pub nvml_library_dir: String,
    /// Host directory for the plugin's state (last unified name).
    pub state_dir: String,
    /// Host path of the kubelet's device-plugin directory.
    pub device_plugin_dir: String,
    /// Extra env for every plugin container (e.g. `KUDOS_ORCHESTRATOR_ADDR`).
    pub env: BTreeMap<String, String>,
    /// Image pull secrets for the derived images' registry.
    pub image_pull_secrets: Vec<String>,
    /// A DaemonSet in [`Self::namespace`] (the Helm chart's bootstrap plugin) whose pod
    /// template the group DaemonSets copy, changing only image, labels and node affinity (see
    /// [`crate::template`]); the pod settings above then apply only as `env` and
    /// `imagePullSecrets`. Unset: the built-in pod of [`render_group`].
    pub pod_template_from: Option<String>,
}

impl Default for RolloutSettings {
    fn default() -> Self {
        let toleration = |key: &str, effect: Option<&str>| Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: effect.map(Into::into),
            ..Toleration::default()
        };
        Self {
            namespace: "kudos-system".into(),
            name_prefix: "kudos-device-plugin".into(),
            service_account: Some("kudos-device-plugin".into()),
            priority_class: Some("system-node-critical".into()),
            tolerations: vec![
                toleration("CriticalAddonsOnly", None),
                toleration("amd.com/gpu", Some("NoSchedule")),
                toleration("kudos.dev/gpu", Some("NoSchedule")),
                toleration("nvidia.com/gpu", Some("NoSchedule")),
            ],
            requests: [
                ("cpu".into(), "20m".into()),
                ("memory".into(), "32Mi".into()),
            ]
            .into(),
            limits: [
                ("cpu".into(), "200m".into()),
                ("memory".into(), "128Mi".into()),
            ]
            .into(),
            nvml_library_dir: "/usr/lib/x86_64-linux-gnu".into(),
            state_dir: "/var/lib/kudos/device-plugin".into(),
            device_plugin_dir: "/var/lib/kubelet/device-plugins".into(),
            env: BTreeMap::new(),
            image_pull_secrets: Vec::new(),
            pod_template_from: None,
        }
    }
}

/// The DaemonSet name of a group.
pub fn daemonset_name(settings: &RolloutSettings, group: &str) -> String {
    format!("{}-{group}", settings.name_prefix)
}

/// Renders the DaemonSets of every group that has a derived image, sorted by name. Groups
/// still waiting for their first image are left out (see [`pending_groups`]).
pub fn render_daemonsets(
    view: &PluginConfig,
    settings: &RolloutSettings,
) -> Result<Vec<DaemonSet>, RenderError> {
    render_daemonsets_from(view, settings, None)
}

/// [`render_daemonsets`] with the group pods copied from `template` when given (see
/// [`crate::template`]).
pub fn render_daemonsets_from(
    view: &PluginConfig,
    settings: &RolloutSettings,
    template: Option<&PodTemplateSpec>,
) -> Result<Vec<DaemonSet>, RenderError> {
    let mut out = Vec::new();
    for group in view.groups()? {
        if let Some(image) = view.images.get(&group.name) {
            out.push(render_group_from(
                &group,
                &image.reference,
                image.generation,
                settings,
                template,
            ));
        }
    }
    Ok(out)
}

/// Groups of the configuration that have no derived image yet.
pub fn pending_groups(view: &PluginConfig) -> Result<Vec<String>, PluginConfigError> {
    Ok(view
        .groups()?
        .into_iter()
        .filter(|g| !view.images.contains_key(&g.name))
        .map(|g| g.name)
        .collect())
}

/// Dry run: the manifests [`render_daemonsets`] produces, as a multi-document YAML stream,
/// with a comment naming groups that wait for an image.
pub fn render_yaml(view: &PluginConfig, settings: &RolloutSettings) -> Result<String, RenderError> {
    render_yaml_from(view, settings, None)
}

/// [`render_yaml`] with the group pods copied from `template` when given.
pub fn render_yaml_from(
    view: &PluginConfig,
    settings: &RolloutSettings,
    template: Option<&PodTemplateSpec>,
) -> Result<String, RenderError> {
    let mut out = String::new();
    for g in pending_groups(view)? {
        out.push_str(&format!(
            "# group {g}: no derived image yet; not rendered\n"
        ));
    }
    for ds in render_daemonsets_from(view, settings, template)? {
        let name = ds.metadata.name.clone().unwrap_or_default();
        out.push_str("---\n");
        out.push_str(
            &serde_yaml::to_string(&ds).map_err(|source| RenderError::Yaml { name, source })?,
        );
    }
    Ok(out)
}

fn labels(group: &str, with_managed: bool) -> BTreeMap<String, String> {
    let mut l = BTreeMap::from([
        (LABEL_NAME.to_string(), "kudos-device-plugin".to_string()),
        (labels::PLUGIN_GROUP.to_string(), group.to_string()),
    ]);
    if with_managed {
        l.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
        l.insert(LABEL_COMPONENT.into(), COMPONENT.into());
    }
    l
}

fn host_volume(name: &str, path: &str, type_: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: Some(type_.into()),
        }),
        ..Volume::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(read_only),
        ..VolumeMount::default()
    }
}

pub(crate) fn env_var(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

fn quantities(m: &BTreeMap<String, String>) -> Option<BTreeMap<String, Quantity>> {
    (!m.is_empty()).then(|| {
        m.iter()
            .map(|(k, v)| (k.clone(), Quantity(v.clone())))
            .collect()
    })
}

/// Renders one group's DaemonSet running `image` (a reference by digest) in the built-in pod.
pub fn render_group(
    group: &PluginGroup,
    image: &str,
    image_generation: u64,
    settings: &RolloutSettings,
) -> DaemonSet {
    render_group_from(group, image, image_generation, settings, None)
}

/// The required node affinity of a group's pods: one term per configured node (the API
/// server allows one value per `metadata.name` field requirement; terms are ORed), each also
/// requiring the node's [`labels::PLUGIN_GROUP`] label to name the group. The label is the
/// handover: the rollout sets it once the group's DaemonSet exists, and the bootstrap
/// DaemonSet requires it absent, so one node switches from the bootstrap plugin to the
/// group's in one step and never runs both (see [`crate::handover`]).
pub fn group_affinity(group: &PluginGroup) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: group
                    .nodes
                    .iter()
                    .map(|node| NodeSelectorTerm {
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: Some(vec![node.clone()]),
                        }]),
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: labels::PLUGIN_GROUP.into(),
                            operator: "In".into(),
                            values: Some(vec![group.name.clone()]),
                        }]),
                    })
                    .collect(),
            }),
            ..NodeAffinity::default()
        }),
        ..Affinity::default()
    }
}

/// [`render_group`], the pod copied from `template` when given (see [`crate::template`]).
pub fn render_group_from(
    group: &PluginGroup,
    image: &str,
    image_generation: u64,
    settings: &RolloutSettings,
    template: Option<&PodTemplateSpec>,
) -> DaemonSet {
    let pod = match template {
        Some(t) => crate::template::group_pod(
            t,
            image,
            settings,
            labels(&group.name, true),
            group_affinity(group),
        ),
        None => builtin_pod(group, image, settings),
    };
    DaemonSet {
        metadata: ObjectMeta {
            name: Some(daemonset_name(settings, &group.name)),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels(&group.name, true)),
            annotations: Some(BTreeMap::from([(
                labels::CONFIG_GENERATION.to_string(),
                image_generation.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels(&group.name, false)),
                ..LabelSelector::default()
            },
            template: pod,
            ..DaemonSetSpec::default()
        }),
        status: None,
    }
}

fn builtin_pod(group: &PluginGroup, image: &str, settings: &RolloutSettings) -> PodTemplateSpec {
    let has = |v: &str| group.vendors.iter().any(|g| g == v);
    let mut volumes = vec![
        host_volume("device-plugins", &settings.device_plugin_dir, "Directory"),
        host_volume("dev", "/dev", "Directory"),
        host_volume("state", &settings.state_dir, "DirectoryOrCreate"),
    ];
    let mut mounts = vec![
        mount("device-plugins", "/var/lib/kubelet/device-plugins", false),
        mount("dev", "/dev", true),
        mount("state", STATE_MOUNT_PATH, false),
    ];
    let mut envs = vec![
        EnvVar {
            name: env::NODE_NAME.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "spec.nodeName".into(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        },
        env_var(env::STATE_DIR, STATE_MOUNT_PATH),
    ];
    if has("amd") {
        volumes.push(host_volume("sys", "/sys", "Directory"));
        mounts.push(mount("sys", "/sys", true));
    }
    if has("nvidia") {
        volumes.push(host_volume(
            "nvml-lib",
            &settings.nvml_library_dir,
            "Directory",
        ));
        mounts.push(mount("nvml-lib", NVML_MOUNT_PATH, true));
        envs.push(env_var(env::NVML_LIBRARY_DIR, NVML_MOUNT_PATH));
        // With the NVIDIA container toolkit, this gives the plugin the device nodes NVML
        // needs without running privileged.
        envs.push(env_var("NVIDIA_VISIBLE_DEVICES", "all"));
        envs.push(env_var("NVIDIA_DRIVER_CAPABILITIES", "utility"));
    }
    for (k, v) in &settings.env {
        envs.push(env_var(k, v));
    }
    envs.sort_by(|a, b| a.name.cmp(&b.name));
    envs.dedup_by(|a, b| a.name == b.name);

    let container = Container {
        name: "device-plugin".into(),
        image: Some(image.into()),
        image_pull_policy: Some("IfNotPresent".into()),
        env: Some(envs),
        volume_mounts: Some(mounts),
        resources: Some(ResourceRequirements {
            requests: quantities(&settings.requests),
            limits: quantities(&settings.limits),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            privileged: Some(false),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_user: Some(0),
            run_as_non_root: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };

    let pod_spec = PodSpec {
        affinity: Some(group_affinity(group)),
        containers: vec![container],
        tolerations: (!settings.tolerations.is_empty()).then(|| settings.tolerations.clone()),
        priority_class_name: settings.priority_class.clone(),
        service_account_name: settings.service_account.clone(),
        image_pull_secrets: (!settings.image_pull_secrets.is_empty()).then(|| {
            settings
                .image_pull_secrets
                .iter()
                .map(|n| LocalObjectReference { name: n.clone() })
                .collect()
        }),
        security_context: Some(PodSecurityContext {
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        volumes: Some(volumes),
        ..PodSpec::default()
    };

    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(&group.name, true)),
            ..ObjectMeta::default()
        }),
        spec: Some(pod_spec),
    }
}

/// The node names a rendered DaemonSet's required affinity admits (for tests and `/state`).
pub fn affinity_nodes(ds: &DaemonSet) -> Vec<String> {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|sel| {
            sel.node_selector_terms
                .iter()
                .flat_map(|t| t.match_fields.iter().flatten())
                .filter(|r| r.key == "metadata.name" && r.operator == "In")
                .flat_map(|r| r.values.iter().flatten().cloned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
