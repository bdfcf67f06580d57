//! Wiring of `kudos-rollout` (design §2.1 steps 5–7): derived plugin images, one plugin
//! DaemonSet per plugin group, and node monitoring for `/state` and the extender's filter.
//!
//! ```text
//!  ReportPlugin ─▶ store + index ─▶ plugin_updates (watch<PluginConfig>)
//!                                        │ bridge: fills in the unified name when unset
//!                                        ▼
//!                       watch<Arc<PluginConfig>> ──▶ kudos_rollout::run ──▶ registry, DaemonSets
//!                                        │                      │ ImageRecorder::record
//!                                        ▼                      ▼
//!      monitor pass (period / change) ◀─ DaemonSet watch    ConfigRecorder: store + index + publish
//!        └─▶ Index::set_monitor (filter exclusions, /state) + MonitorMetrics
//! ```
//!
//! **Generation semantics of recorded images.** Images are part of the persisted plugin
//! configuration, so recording them goes through the same path as a plugin report: under the
//! ingest lock, saved to the store first, then the index, then published. A recording that
//! changes `images` bumps the generation once; recording images equal to those already stored
//! writes nothing and keeps the generation. The pass that the bump triggers finds, for every
//! group, the recorded configuration-layer `diff_id` equal to the one it would build (images do
//! not enter the layer), so it derives nothing and its server-side apply writes nothing: one
//! extra no-op pass, never a loop. Images of groups that left the configuration are dropped at
//! the next recording. A failed push records nothing (rollout retries, then requeues with
//! backoff), so the configuration is unchanged.
//!
//! Monitoring runs only with rollout enabled and a cluster (without Node objects every node
//! would be "not found"); with rollout off nothing is excluded and `/state` shows
//! `nodeMonitor: null`. The DaemonSet rollout state comes from a watch on the plugin
//! DaemonSets (`app.kubernetes.io/managed-by=kudos-orchestrator,
//! app.kubernetes.io/component=device-plugin`) in the configured namespace. There is no
//! leader election: run one orchestrator replica with rollout enabled.

pub mod config;

use crate::grpc::Ingest;
use crate::index::{MonitorView, SharedIndex};
use crate::metrics::Metrics;
use crate::state::PluginConfig;
use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kudos_rollout::reconcile::RecordError;
use kudos_rollout::{
    Ctx, DerivedImage, ImageDeriver, ImageRecorder, Mode, MonitorInputs, MonitorMetrics,
    MonitorPolicy, RolloutSettings,
};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tokio::sync::{Notify, watch};
use tracing::Instrument;

/// Records derived images in the orchestrator's plugin configuration (see the module docs).
pub struct ConfigRecorder {
    ingest: Arc<Ingest>,
}

impl ConfigRecorder {
    /// A recorder writing through `ingest`'s store, index and publisher.
    pub fn new(ingest: Arc<Ingest>) -> Self {
        Self { ingest }
    }
}

impl ImageRecorder for ConfigRecorder {
    fn record(
        &self,
        generation: u64,
        images: &BTreeMap<String, DerivedImage>,
    ) -> Result<(), RecordError> {
        // The trait is synchronous; the store is not. Block this worker only (multi-thread
        // runtime), which the reconciler awaits anyway.
        let handle = tokio::runtime::Handle::try_current()?;
        if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return Err("recording images needs the multi-threaded tokio runtime".into());
        }
        tokio::task::block_in_place(|| {
            handle.block_on(record_images(&self.ingest, generation, images))
        })?;
        Ok(())
    }
}

/// Stores `images` (derived from the view of `derived_at`) in the plugin configuration.
/// Returns the new generation, or `None` when nothing changed (nothing written).
pub async fn record_images(
    ingest: &Ingest,
    derived_at: u64,
    images: &BTreeMap<String, DerivedImage>,
) -> Result<Option<u64>, RecordError> {
    let _g = ingest.lock.lock().await;
    let mut cfg = ingest.index.read().plugin_config().clone();
    let groups: BTreeSet<String> = cfg.groups()?.into_iter().map(|g| g.name).collect();
    let before = cfg.images.clone();
    for (group, image) in images {
        if groups.contains(group) {
            cfg.images.insert(group.clone(), image.clone());
        } else {
            tracing::info!(%group, derived_at, "not recording the image of a group that left the configuration");
        }
    }
    cfg.images.retain(|g, _| groups.contains(g));
    if cfg.images == before {
        return Ok(None);
    }
    cfg.generation += 1;
    let generation = cfg.generation;
    ingest.store.save_plugin_config(cfg.clone()).await?;
    ingest.index.write().set_plugin_config(cfg.clone());
    ingest.plugin_updates.send_replace(cfg);
    ingest.metrics.plugin_generation.set(generation as i64);
    tracing::info!(
        derived_at,
        generation,
        groups = ?images.keys().collect::<Vec<_>>(),
        "derived plugin images recorded"
    );
    Ok(Some(generation))
}

/// The latest plugin DaemonSets seen by the watch, by name.
pub type DaemonSets = Arc<RwLock<BTreeMap<String, DaemonSet>>>;

/// What a node-monitoring pass needs besides its inputs.
#[derive(Clone, Debug)]
pub struct NodeMonitoring {
    /// DaemonSet settings (names of the DaemonSets serving each group).
    pub settings: RolloutSettings,
    /// Thresholds.
    pub policy: MonitorPolicy,
    /// Gauges updated by every pass.
    pub metrics: MonitorMetrics,
    /// Where the DaemonSet rollout state comes from, shown in `/state`.
    pub rollout_source: &'static str,
}

impl NodeMonitoring {
    /// One pass: reads the index, computes [`kudos_rollout::monitor`], stores the result in
    /// the index (filter exclusions, `/state`) and in the gauges. Returns the number of nodes
    /// excluded from ranking.
    pub fn pass(
        &self,
        index: &SharedIndex,
        view: &PluginConfig,
        daemonsets: &[DaemonSet],
        now: SystemTime,
    ) -> Result<usize, kudos_rollout::PluginConfigError> {
        let obs = index.read().monitor_observations();
        let nodes = kudos_rollout::monitor(
            view,
            &self.settings,
            &self.policy,
            &MonitorInputs {
                now,
                nodes: &obs.nodes,
                plugin_health: &obs.plugin_health,
                heartbeats: &obs.heartbeats,
                daemonsets,
            },
        )?;
        self.metrics.observe(&nodes);
        let excluded = nodes.iter().filter(|m| m.exclude_from_ranking).count();
        let computed_at = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        index.write().set_monitor(MonitorView {
            computed_at,
            rollout_source: self.rollout_source,
            nodes,
        });
        Ok(excluded)
    }
}

/// The rollout view of a configuration. A configuration nothing was ever reported to has no
/// unified name yet; it gets the orchestrator's, so an empty configuration is valid (and
/// rollout prunes nothing but what it owns).
pub fn to_view(cfg: &PluginConfig, unified: &str) -> PluginConfig {
    let mut v = cfg.clone();
    if v.unified_resource_name.is_empty() {
        v.unified_resource_name = unified.to_owned();
    }
    v
}

/// Converts the published configuration into rollout views, for as long as both ends live.
async fn bridge(
    mut configs: watch::Receiver<PluginConfig>,
    views: watch::Sender<Arc<PluginConfig>>,
    unified: String,
) {
    loop {
        let cfg = configs.borrow_and_update().clone();
        views.send_replace(Arc::new(to_view(&cfg, &unified)));
        if configs.changed().await.is_err() {
            return;
        }
    }
}

fn spawn_daemonset_watch(
    client: kube::Client,
    namespace: &str,
    seen: DaemonSets,
    changed: Arc<Notify>,
) {
    let api: kube::Api<DaemonSet> = kube::Api::namespaced(client, namespace);
    let cfg = watcher::Config::default().labels(kudos_rollout::render::OWNED_SELECTOR);
    tokio::spawn(
        async move {
            let mut buf = BTreeMap::new();
            let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
            while let Some(ev) = stream.next().await {
                let name = |d: &DaemonSet| d.metadata.name.clone().unwrap_or_default();
                {
                    let Ok(mut s) = seen.write() else { break };
                    match ev {
                        Ok(Event::Apply(d)) => {
                            s.insert(name(&d), d);
                        }
                        Ok(Event::Delete(d)) => {
                            s.remove(&name(&d));
                        }
                        Ok(Event::Init) => buf.clear(),
                        Ok(Event::InitApply(d)) => {
                            buf.insert(name(&d), d);
                        }
                        Ok(Event::InitDone) => *s = std::mem::take(&mut buf),
                        Err(e) => {
                            tracing::warn!(error = %e, "DaemonSet watch failed; retrying with backoff");
                            continue;
                        }
                    }
                }
                changed.notify_one();
            }
        }
        .instrument(tracing::info_span!("daemonset_watch")),
    );
}

/// Starts rollout per `cfg`: the configuration bridge, the reconciler (until `shutdown`), and
/// with a cluster the DaemonSet watch and the monitoring loop. Does nothing when disabled.
pub fn start(
    cfg: &config::RolloutConfig,
    client: Option<kube::Client>,
    ingest: Arc<Ingest>,
    metrics: &Metrics,
    heartbeat_max_age_seconds: f64,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if !cfg.enabled {
        tracing::debug!("rollout disabled (rollout.enabled, --rollout)");
        return Ok(());
    }
    if client.is_none() && !cfg.dry_run {
        anyhow::bail!(
            "rollout is enabled but there is no cluster (standalone); use --dry-run-rollout to print manifests without one"
        );
    }
    let initial = to_view(&ingest.plugin_updates.borrow(), &ingest.unified);
    let (views_tx, views_rx) = watch::channel(Arc::new(initial));
    tokio::spawn(
        bridge(
            ingest.plugin_updates.subscribe(),
            views_tx,
            ingest.unified.clone(),
        )
        .instrument(tracing::info_span!("rollout_bridge")),
    );

    let recorder = Arc::new(ConfigRecorder::new(ingest.clone()));
    let mut ctx = Ctx::new(cfg.daemonsets.clone(), recorder, metrics.rollout.clone());
    if let Some(c) = &client {
        ctx = ctx.with_kube(c.clone());
    }
    if let Some(reg) = &cfg.registry {
        let deriver = ImageDeriver::new(reg.clone(), metrics.rollout.clone())
            .context("rollout registry settings")?;
        ctx = ctx.with_deriver(deriver);
    }
    if cfg.dry_run {
        ctx = ctx.with_mode(Mode::dry_run_stdout());
    }
    ctx.resync = cfg.resync;
    let mode = if cfg.dry_run { "dry-run" } else { "apply" };
    tracing::info!(
        mode,
        namespace = %cfg.daemonsets.namespace,
        base_image = cfg.registry.as_ref().map_or("", |r| r.base_image.as_str()),
        repository = cfg.registry.as_ref().map_or("", |r| r.repository.as_str()),
        "rollout started"
    );
    tokio::spawn(
        kudos_rollout::run(views_rx.clone(), Arc::new(ctx), shutdown)
            .instrument(tracing::info_span!("rollout", mode)),
    );

    let Some(client) = client else {
        tracing::info!("no cluster: node monitoring is off (it needs Node objects)");
        return Ok(());
    };
    let seen: DaemonSets = Arc::default();
    let changed = Arc::new(Notify::new());
    spawn_daemonset_watch(
        client,
        &cfg.daemonsets.namespace,
        seen.clone(),
        changed.clone(),
    );
    let index = ingest.index.clone();
    let monitoring = NodeMonitoring {
        settings: cfg.daemonsets.clone(),
        policy: MonitorPolicy {
            stale_after: Duration::from_secs_f64(heartbeat_max_age_seconds),
            no_heartbeat_grace_until: SystemTime::now()
                .checked_add(Duration::from_secs_f64(heartbeat_max_age_seconds)),
        },
        metrics: metrics.monitor.clone(),
        rollout_source: "daemonSetWatch",
    };
    let period = cfg.monitor_period;
    let mut views = views_rx;
    tokio::spawn(
        async move {
            loop {
                let view = views.borrow_and_update().clone();
                let daemonsets: Vec<DaemonSet> = match seen.read() {
                    Ok(s) => s.values().cloned().collect(),
                    Err(_) => return,
                };
                let pass = monitoring.pass(&index, &view, &daemonsets, SystemTime::now());
                match pass {
                    Ok(excluded) => tracing::debug!(excluded, "node monitoring pass"),
                    Err(e) => tracing::warn!(error = %e, "node monitoring skipped: invalid plugin configuration"),
                }
                tokio::select! {
                    () = tokio::time::sleep(period) => {}
                    () = changed.notified() => {}
                    r = views.changed() => if r.is_err() { return },
                }
            }
        }
        .instrument(tracing::info_span!("node_monitor")),
    );
    Ok(())
}
