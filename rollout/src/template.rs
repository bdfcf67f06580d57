//! Group DaemonSets whose pods are the bootstrap plugin's pods running the derived image.
//!
//! With `podTemplateFrom` set (the Helm chart sets it to its bootstrap DaemonSet), a group's
//! pod template is the bootstrap DaemonSet's, changed only where the group differs: the
//! plugin container's image (the group's derived image, by digest), the pod labels (the
//! group's, never the bootstrap's selector), the required node affinity (the group's nodes,
//! once labelled, see [`crate::handover`]) and extra pull secrets. Everything else — how NVML
//! and the device nodes reach the plugin (the NVIDIA toolkit's runtime class or host paths),
//! the orchestrator address, the projected token with the orchestrator's audience, probes,
//! resources, tolerations, priority, and whatever the cluster's operator adapted — is what
//! the operator configured once. The built-in pod of [`crate::render::render_group`] is a
//! second description of the same pod, and it drifted: its pods had no orchestrator address
//! and no token.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Affinity, LocalObjectReference, PodTemplateSpec};
use kube::Api;

use crate::render::RolloutSettings;
use kudos_api::env;

/// Errors reading or using the template DaemonSet.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template DaemonSet could not be read.
    #[error(
        "reading the pod template DaemonSet {namespace}/{name} (rollout.daemonSet.podTemplateFrom)"
    )]
    Read {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// The template DaemonSet has no containers to run the derived image in.
    #[error("the pod template DaemonSet {0} has no container")]
    NoContainer(String),
}

/// Reads the pod template of the DaemonSet `settings.pod_template_from` names, if any.
pub async fn fetch(
    client: &kube::Client,
    settings: &RolloutSettings,
) -> Result<Option<PodTemplateSpec>, TemplateError> {
    let Some(name) = settings.pod_template_from.as_deref() else {
        return Ok(None);
    };
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), &settings.namespace);
    let ds = api.get(name).await.map_err(|e| TemplateError::Read {
        namespace: settings.namespace.clone(),
        name: name.into(),
        source: Box::new(e),
    })?;
    let template = ds.spec.map(|s| s.template).unwrap_or_default();
    if template
        .spec
        .as_ref()
        .is_none_or(|s| s.containers.is_empty())
    {
        return Err(TemplateError::NoContainer(name.into()));
    }
    Ok(Some(template))
}

/// Env names the derived image sets; a template value would shadow the image's, so they are
/// dropped from the copied container.
const IMAGE_ENV: [&str; 2] = [env::VENDOR, env::PLUGIN_CONFIG_DIR];

/// The group's pod template: `template` with the plugin container (the first) running `image`,
/// the group's `labels` and `affinity`, and `settings`' extra env and pull secrets.
pub fn group_pod(
    template: &PodTemplateSpec,
    image: &str,
    settings: &RolloutSettings,
    labels: std::collections::BTreeMap<String, String>,
    affinity: Affinity,
) -> PodTemplateSpec {
    let mut pod = template.clone();
    let meta = pod.metadata.get_or_insert_default();
    let mut all = meta.labels.take().unwrap_or_default();
    all.extend(labels);
    meta.labels = Some(all);
    let spec = pod.spec.get_or_insert_default();
    let mut aff = spec.affinity.take().unwrap_or_default();
    aff.node_affinity = affinity.node_affinity;
    spec.affinity = Some(aff);
    if !settings.image_pull_secrets.is_empty() {
        let secrets = spec.image_pull_secrets.get_or_insert_default();
        for name in &settings.image_pull_secrets {
            if !secrets.iter().any(|s| &s.name == name) {
                secrets.push(LocalObjectReference { name: name.clone() });
            }
        }
    }
    if let Some(c) = spec.containers.first_mut() {
        c.image = Some(image.into());
        c.image_pull_policy = Some("IfNotPresent".into());
        let envs = c.env.get_or_insert_default();
        envs.retain(|e| !IMAGE_ENV.contains(&e.name.as_str()));
        for (k, v) in &settings.env {
            envs.retain(|e| &e.name != k);
            envs.push(crate::render::env_var(k, v));
        }
    }
    pod
}
