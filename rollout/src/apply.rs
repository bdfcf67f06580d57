//! Applying rendered DaemonSets with server-side apply, and pruning the ones whose group left
//! the configuration.
//!
//! Server-side apply under the field manager `kudos-orchestrator` (forced: the orchestrator
//! owns these objects) makes the apply idempotent — an unchanged object is not written and
//! keeps its `resourceVersion` — and leaves fields other managers own (e.g. an operator's
//! extra annotation) alone. Pruning lists only DaemonSets carrying both
//! `app.kubernetes.io/managed-by: kudos-orchestrator` and `app.kubernetes.io/component:
//! device-plugin`, so nothing else in the namespace is ever deleted.
//!
//! Only the lease holder should call these (design: one writer, everyone indexes).

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use tracing::info;

use crate::handover::{HandoverError, LabelChanges, label_nodes};
use crate::metrics::{GroupLabels, Outcome, RolloutMetrics};
use crate::render::{
    MANAGED_BY, OWNED_SELECTOR, RolloutSettings, daemonset_name, render_daemonsets_from,
};
use crate::template::{self, TemplateError};
use kudos_api::{PluginConfig, PluginConfigError, labels};

/// Errors applying or pruning DaemonSets.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The configuration view is invalid.
    #[error(transparent)]
    Config(#[from] PluginConfigError),
    /// Rendering failed.
    #[error(transparent)]
    Render(#[from] crate::render::RenderError),
    /// The pod template DaemonSet could not be used.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// Handing nodes to their group's plugin failed.
    #[error(transparent)]
    Handover(#[from] HandoverError),
    /// A rendered DaemonSet has no name (a bug in rendering).
    #[error("rendered DaemonSet has no name")]
    Unnamed,
    /// Server-side apply of a DaemonSet failed.
    #[error("applying DaemonSet {name}")]
    Apply {
        /// DaemonSet name.
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// Listing owned DaemonSets failed.
    #[error("listing DaemonSets in {namespace}")]
    List {
        /// Namespace.
        namespace: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// Deleting a DaemonSet failed.
    #[error("deleting DaemonSet {name}")]
    Delete {
        /// DaemonSet name.
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
}

/// What one apply pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// `(name, resourceVersion)` of each applied DaemonSet, after the apply.
    pub applied: Vec<(String, String)>,
    /// Names of the DaemonSets deleted.
    pub deleted: Vec<String>,
    /// Node label changes of the handover (see [`crate::handover`]).
    pub labelled: LabelChanges,
}

/// The field manager of every apply.
pub fn patch_params() -> PatchParams {
    PatchParams::apply(MANAGED_BY).force()
}

/// Renders `view` (from the pod template DaemonSet when configured), applies every DaemonSet,
/// prunes the ones of groups no longer in the configuration (groups still waiting for an
/// image are kept), then hands the nodes of the applied groups over (see [`crate::handover`]).
#[tracing::instrument(skip_all, fields(generation = view.generation, namespace = %settings.namespace))]
pub async fn apply(
    client: &kube::Client,
    view: &PluginConfig,
    settings: &RolloutSettings,
    metrics: &RolloutMetrics,
) -> Result<ApplyReport, ApplyError> {
    let template = template::fetch(client, settings).await?;
    let daemonsets = render_daemonsets_from(view, settings, template.as_ref())?;
    let applied = apply_daemonsets(client, &settings.namespace, &daemonsets, metrics).await?;
    let groups = view.groups()?;
    let keep: BTreeSet<String> = groups
        .iter()
        .map(|g| daemonset_name(settings, &g.name))
        .collect();
    let deleted = prune_daemonsets(client, &settings.namespace, &keep, metrics).await?;
    let served: Vec<_> = groups
        .iter()
        .filter(|g| view.images.contains_key(&g.name))
        .collect();
    let labelled = label_nodes(client, &served).await?;
    Ok(ApplyReport {
        applied,
        deleted,
        labelled,
    })
}

/// Server-side applies each DaemonSet in `namespace`; returns `(name, resourceVersion)`.
pub async fn apply_daemonsets(
    client: &kube::Client,
    namespace: &str,
    daemonsets: &[DaemonSet],
    metrics: &RolloutMetrics,
) -> Result<Vec<(String, String)>, ApplyError> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let params = patch_params();
    let mut out = Vec::with_capacity(daemonsets.len());
    for ds in daemonsets {
        let name = ds.metadata.name.clone().ok_or(ApplyError::Unnamed)?;
        let group = ds
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::PLUGIN_GROUP))
            .cloned()
            .unwrap_or_default();
        let result = api.patch(&name, &params, &Patch::Apply(ds)).await;
        let outcome = if result.is_ok() {
            Outcome::Success
        } else {
            Outcome::Failure
        };
        metrics
            .daemonset_applies
            .get_or_create(&GroupLabels { group, outcome })
            .inc();
        let applied = result.map_err(|e| ApplyError::Apply {
            name: name.clone(),
            source: Box::new(e),
        })?;
        let rv = applied.metadata.resource_version.unwrap_or_default();
        tracing::debug!(%name, resource_version = %rv, "applied DaemonSet");
        out.push((name, rv));
    }
    Ok(out)
}

/// Deletes owned DaemonSets in `namespace` whose name is not in `keep`; returns their names.
pub async fn prune_daemonsets(
    client: &kube::Client,
    namespace: &str,
    keep: &BTreeSet<String>,
    metrics: &RolloutMetrics,
) -> Result<Vec<String>, ApplyError> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let list = api
        .list(&ListParams::default().labels(OWNED_SELECTOR))
        .await
        .map_err(|e| ApplyError::List {
            namespace: namespace.into(),
            source: Box::new(e),
        })?;
    let mut deleted = Vec::new();
    for ds in list.items {
        let Some(name) = ds.metadata.name else {
            continue;
        };
        if keep.contains(&name) {
            continue;
        }
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {}
            // Already gone: someone else pruned it; that is the goal.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(ApplyError::Delete {
                    name,
                    source: Box::new(e),
                });
            }
        }
        info!(%name, "deleted DaemonSet of a group that left the configuration");
        metrics.daemonset_deletes.inc();
        deleted.push(name);
    }
    Ok(deleted)
}
