//! `kudos-orchestrator uninstall`: removes what the orchestrator created in the cluster and a
//! package manager therefore cannot know about — the plugin DaemonSets of the rollout, the
//! `kudos.dev/plugin-group` node labels, and on request the state ConfigMap.
//!
//! The Helm chart runs it as its post-delete hook, in the orchestrator's own image: the same
//! selector and label key the rollout writes with (one definition, `kudos-rollout`), and no
//! kubectl image to mirror for air-gapped clusters or to keep within version skew.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams};
use kudos_rollout::handover::label_nodes;
use kudos_rollout::render::OWNED_SELECTOR;
use kudos_rollout::{RolloutMetrics, prune_daemonsets};

/// Flags of `kudos-orchestrator uninstall`.
#[derive(clap::Args, Debug, Clone)]
pub struct UninstallArgs {
    /// Namespace of the plugin DaemonSets and of the state ConfigMap.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kudos-system")]
    pub namespace: String,
    /// Also delete the state named NAME: its ConfigMap and those labelled kudos.dev/store=NAME
    /// (the learned model and plugin configuration are lost).
    #[arg(long, value_name = "NAME")]
    pub delete_state_configmap: Option<String>,
    /// How long to wait for the plugin DaemonSets to be gone (e.g. 90s, 2m).
    #[arg(long, default_value = "2m", value_parser = kudos_common::duration::parse_positive)]
    pub timeout: Duration,
    /// Kubeconfig file; without it the in-cluster config or ~/.kube/config.
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
}

/// What [`run`] removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// Plugin DaemonSets deleted.
    pub daemonsets: Vec<String>,
    /// Nodes whose `kudos.dev/plugin-group` label was removed.
    pub node_labels: Vec<String>,
    /// Whether the state ConfigMap was deleted.
    pub state: bool,
}

async fn client(args: &UninstallArgs) -> anyhow::Result<kube::Client> {
    let config = match &args.kubeconfig {
        Some(path) => crate::kubeconfig(path).await?,
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster")?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// Deletes the plugin DaemonSets (their pods go with them, by the garbage collector) and
/// waits until they are gone, removes every `kudos.dev/plugin-group` label, and deletes the
/// state ConfigMap when asked. Safe to run twice.
pub async fn run(client: &kube::Client, args: &UninstallArgs) -> anyhow::Result<Removed> {
    // The rollout's own pruning, keeping nothing: same selector, 404s tolerated.
    let daemonsets = prune_daemonsets(
        client,
        &args.namespace,
        &BTreeSet::new(),
        &RolloutMetrics::default(),
    )
    .await
    .context("deleting the plugin DaemonSets")?;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), &args.namespace);
    let owned = ListParams::default().labels(OWNED_SELECTOR);
    let deadline = Instant::now() + args.timeout;
    loop {
        let left = dss.list_metadata(&owned).await?.items.len();
        if left == 0 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{left} plugin DaemonSet(s) still present after {:?}",
            args.timeout
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut removed = Removed {
        daemonsets,
        node_labels: label_nodes(client, &[])
            .await?
            .into_iter()
            .map(|(node, _)| node)
            .collect(),
        state: false,
    };
    if let Some(name) = &args.delete_state_configmap {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
        match cms.delete(name, &DeleteParams::default()).await {
            Ok(_) => removed.state = true,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("deleting ConfigMap {name}")),
        }
        // The rest of the state: ConfigMaps labelled with the store's name.
        let parts = ListParams::default().labels(&format!("kudos.dev/store={name}"));
        let gone = cms
            .delete_collection(&DeleteParams::default(), &parts)
            .await
            .with_context(|| format!("deleting the ConfigMaps labelled kudos.dev/store={name}"))?;
        let parts = gone.left().map_or(0, |l| l.items.len());
        removed.state |= parts > 0;
        tracing::info!(configmap = %name, parts, deleted = removed.state, "state ConfigMaps");
    }
    Ok(removed)
}

/// The subcommand: connects, runs, logs a summary.
pub async fn main(args: UninstallArgs) -> anyhow::Result<()> {
    let client = client(&args).await?;
    let removed = run(&client, &args).await?;
    tracing::info!(
        daemonsets = ?removed.daemonsets,
        node_labels = ?removed.node_labels,
        state_deleted = removed.state,
        "uninstall cleanup done"
    );
    Ok(())
}
