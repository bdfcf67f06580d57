//! A follower replica: answers `filter`, `prioritize` and `bind` from the shared state while
//! another replica leads.
//!
//! With leader election every replica serves the extender; the leader alone writes the state
//! (it takes run reports and plugin reports over gRPC, stores them, snapshots the model, rolls
//! out and prunes). A follower loads the ConfigMap store without writing, then follows it
//! through a kube-runtime watch of `<name>`, the node records and the run segments: each new
//! run goes to its own [`Learner`] in `seq` order, and a changed plugin configuration replaces
//! its own. Its model is therefore the leader's as of the runs the leader stored: the same runs,
//! learned in the same order. Stored means acknowledged, so a follower never learns a run the
//! leader could lose.
//!
//! A run can only be missed when the watch fell behind (a relist) and a snapshot made the run's
//! segment obsolete meanwhile: then the snapshot that holds it replaces the model, and the runs
//! after it are learned. The same catch-up makes a follower the leader ([`Follower::take_over`]),
//! from the writer's own load of the store, with no second start: the extender keeps answering
//! throughout.
//!
//! What a follower does not see: agent heartbeats and device-health reports, which reach the
//! leader alone and are not stored. It ranks with the Node objects' readiness and allocatable
//! devices (which the kubelet keeps from the same plugins) instead.

use crate::http::Role;
use crate::index::{SharedIndex, scheduler_from};
use crate::learn::{Learner, free_replaced};
use crate::metrics::Metrics;
use crate::state::StoredRun;
use crate::store::Loaded;
use crate::store_k8s::{ConfigMapStore, StoreMirror};
use anyhow::Context;
use futures::StreamExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kudos_scheduler_core::SchedulerConfig;
use std::sync::Arc;
use tracing::Instrument;

/// Watch events handled before the follower learns what they brought.
const EVENTS_PER_SYNC: usize = 256;
/// How long the watch of the store may keep failing before the follower reports itself not
/// ready (its answers would be stale; the Service then sends kube-scheduler elsewhere).
pub const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// See the module docs.
pub struct Follower {
    store: Arc<ConfigMapStore>,
    index: SharedIndex,
    metrics: Arc<Metrics>,
    config: SchedulerConfig,
    /// The learner and its task; `None` only while a snapshot replaces the model.
    learning: Option<(Learner, tokio::task::JoinHandle<()>)>,
    /// The highest `seq` handed to the learner (or held by a snapshot it started from).
    fed_seq: u64,
}

impl Follower {
    /// Starts learning `backlog` (the runs a read-only load found after the snapshot) into the
    /// index's model.
    pub fn new(
        store: Arc<ConfigMapStore>,
        index: SharedIndex,
        metrics: Arc<Metrics>,
        config: SchedulerConfig,
        backlog: Vec<StoredRun>,
    ) -> Self {
        let fed_seq = backlog.last().map_or(index.read().applied_seq(), |r| r.seq);
        let learning = Learner::spawn_joinable(index.clone(), metrics.clone(), backlog);
        Self {
            store,
            index,
            metrics,
            config,
            learning: Some(learning),
            fed_seq,
        }
    }

    /// Follows the store until `stop` resolves, then returns the follower for
    /// [`Follower::take_over`]. Watch errors are logged and retried with kube-runtime's
    /// backoff; the extender answers from what was learned meanwhile.
    pub async fn follow(
        mut self,
        store_name: &str,
        role: &parking_lot::RwLock<Role>,
        stop: impl Future<Output = ()>,
    ) -> Self {
        let (api, selector) = self.store.watched();
        let mut mirror = StoreMirror::new(store_name);
        let events = watcher::watcher(api, watcher::Config::default().labels(&selector))
            .default_backoff()
            .ready_chunks(EVENTS_PER_SYNC);
        tokio::pin!(events);
        tokio::pin!(stop);
        let mut listing = false;
        let mut health = WatchHealth::default();
        loop {
            let batch = tokio::select! {
                () = &mut stop => break,
                batch = events.next() => match batch {
                    Some(b) => b,
                    None => break,
                },
            };
            for event in batch {
                health.observe(&event, role);
                match event {
                    Ok(Event::Init) => {
                        listing = true;
                        mirror.relist();
                    }
                    Ok(Event::InitApply(cm) | Event::Apply(cm)) => mirror.apply(&cm),
                    Ok(Event::InitDone) => {
                        listing = false;
                        mirror.relisted();
                    }
                    Ok(Event::Delete(cm)) => mirror.delete(&cm),
                    Err(e) => {
                        tracing::warn!(error = %e, "watching the state store failed; retrying (this replica ranks with what it learned so far)")
                    }
                }
            }
            if !listing {
                self.sync(&mut mirror).await;
            }
        }
        self
    }

    /// Learns what the mirror holds that this replica has not.
    async fn sync(&mut self, mirror: &mut StoreMirror) {
        if let Some(cfg) = mirror.take_plugin_config() {
            self.set_plugin_config(cfg);
        }
        let runs = mirror.take_runs_after(self.fed_seq);
        let (snapshot_seq, chunks) = mirror.snapshot();
        if self.missed(snapshot_seq, &runs) {
            match self.store.read_snapshot(snapshot_seq, chunks).await {
                Ok(Some(bytes)) => self.restart_from(bytes, snapshot_seq).await,
                Ok(None) => tracing::warn!(
                    snapshot_seq,
                    "the snapshot holding runs this replica missed was replaced while being read; trying the next one"
                ),
                Err(e) => {
                    tracing::warn!(snapshot_seq, error = %e, "reading the snapshot holding runs this replica missed failed; retrying at the next change")
                }
            }
        }
        self.feed(runs).await;
    }

    /// Makes this replica the leader's equal from `loaded`, the writer's own load of the store
    /// after the Lease was taken; returns the learner for the leader's run writer.
    pub async fn take_over(mut self, loaded: Loaded) -> Learner {
        self.set_plugin_config(loaded.plugin_config);
        let runs = loaded.runs_to_replay;
        if let Some((bytes, seq)) = loaded.model
            && self.missed(seq, &runs)
        {
            self.restart_from(bytes, seq).await;
        }
        self.feed(runs).await;
        tracing::info!(
            fed_seq = self.fed_seq,
            "caught up with the store as the leader"
        );
        match self.learning {
            Some((learner, _)) => learner,
            None => Learner::spawn_with_backlog(self.index, self.metrics, Vec::new()),
        }
    }

    /// Whether runs up to `snapshot_seq` may be missing: the snapshot holds runs this replica
    /// did not learn, and `runs` (in order) do not continue where it stopped. A gap the
    /// leader left itself (a batch it could not store) looks the same, and costs one load.
    fn missed(&self, snapshot_seq: u64, runs: &[StoredRun]) -> bool {
        missed(self.fed_seq, snapshot_seq, runs.first().map(|r| r.seq))
    }

    fn set_plugin_config(&self, cfg: crate::state::PluginConfig) {
        if *self.index.read().plugin_config() != cfg {
            tracing::info!(
                generation = cfg.generation,
                nodes = cfg.nodes.len(),
                "the leader's plugin configuration changed"
            );
            self.metrics.plugin_generation.set(cfg.generation as i64);
            self.index.write().set_plugin_config(cfg);
        }
    }

    async fn feed(&mut self, runs: Vec<StoredRun>) {
        for run in runs {
            if run.seq > self.fed_seq {
                self.fed_seq = run.seq;
                if let Some((learner, _)) = &self.learning {
                    learner.learn(run).await;
                }
            }
        }
    }

    /// Replaces the model with the snapshot `bytes` (which holds runs up to `seq`), after the
    /// learner has published what it had and stopped, then learns on from there.
    async fn restart_from(&mut self, bytes: Vec<u8>, seq: u64) {
        // Dropping the only sender ends the learner once it has published.
        if let Some((learner, task)) = self.learning.take() {
            drop(learner);
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "the learner ended with an error");
            }
        }
        let config = self.config.clone();
        let parsed =
            tokio::task::spawn_blocking(move || scheduler_from(config, Some(&bytes))).await;
        match parsed {
            Ok(Ok(model)) => {
                let replaced = self.index.write().publish_model(Arc::new(model), seq);
                free_replaced(replaced);
                tracing::warn!(
                    snapshot_seq = seq,
                    after_seq = self.fed_seq,
                    "runs this replica missed are in the leader's snapshot: learning on from the snapshot"
                );
                self.fed_seq = seq;
            }
            Ok(Err(e)) => {
                tracing::error!(snapshot_seq = seq, error = %e, "the stored snapshot is unreadable; learning on without the runs it holds")
            }
            Err(e) => {
                tracing::error!(snapshot_seq = seq, error = %e, "reading the snapshot failed; learning on without the runs it holds")
            }
        }
        // A fresh learner copies the model just published.
        self.learning = Some(Learner::spawn_joinable(
            self.index.clone(),
            self.metrics.clone(),
            Vec::new(),
        ));
    }
}

/// Whether the watch of the store keeps failing, as readiness tells it.
#[derive(Default)]
struct WatchHealth {
    /// Since when every attempt failed (Tokio's clock, which a test can pause).
    failing_since: Option<tokio::time::Instant>,
}

impl WatchHealth {
    /// Marks the follower behind once the watch has failed for [`STALE_AFTER`], and ready
    /// again at its first read.
    fn observe<K>(
        &mut self,
        event: &Result<Event<K>, watcher::Error>,
        role: &parking_lot::RwLock<Role>,
    ) {
        match event {
            // A relist starts (also before each retried list): nothing read yet.
            Ok(Event::Init) => {}
            Ok(_) => {
                if self.failing_since.take().is_some() && role.write().behind.take().is_some() {
                    tracing::info!("following the state store again; ready");
                }
            }
            Err(e) => {
                let since = *self
                    .failing_since
                    .get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= STALE_AFTER {
                    let why = format!(
                        "follower: cannot follow the state store for {:.0} s ({e}); its answers would be stale",
                        since.elapsed().as_secs_f64()
                    );
                    tracing::error!("{why}");
                    role.write().behind = Some(why);
                }
            }
        }
    }
}

/// Reads the store without writing, trying again every `retry` until it can (an API outage,
/// or a state in the first format that the leader has not converted yet).
pub async fn load_read_only(store: &ConfigMapStore, retry: std::time::Duration) -> Loaded {
    loop {
        let t = std::time::Instant::now();
        match store.load_read_only().await {
            Ok(loaded) => {
                loaded.log_read(t, "ConfigMap store read (a follower: reading only)");
                return loaded;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the state store yet; retrying");
                tokio::time::sleep(retry).await;
            }
        }
    }
}

/// The writer's load after this replica took the Lease: three tries `retry` apart.
pub async fn load_as_leader(
    store: &dyn crate::store::Store,
    retry: std::time::Duration,
) -> anyhow::Result<Loaded> {
    let mut last = None;
    for attempt in 0..3 {
        if attempt > 0 {
            tokio::time::sleep(retry).await;
        }
        match store.load().await {
            Ok(loaded) => return Ok(loaded),
            Err(e) => {
                tracing::warn!(error = %e, attempt, "loading the state as the new leader failed");
                last = Some(e);
            }
        }
    }
    Err(anyhow::anyhow!(
        "{}",
        last.map_or_else(String::new, |e| e.to_string())
    ))
}

/// Follows the store and answers as a follower until this replica holds the Lease (then the
/// follower and the Lease) or `shutdown` resolves (then `None`). `/readyz` names the leader
/// meanwhile, through `role`.
pub async fn until_leader(
    follower: Follower,
    store_name: &str,
    election: &crate::leader::Election,
    role: Arc<parking_lot::RwLock<Role>>,
    shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> anyhow::Result<Option<(Follower, crate::leader::Leadership)>> {
    let cfg = &election.config;
    let lease = format!("{}/{}", cfg.namespace, cfg.lease_name);
    role.write().text = format!(
        "follower: answers the extender from the shared state; no leader seen yet (Lease {lease})"
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let name = store_name.to_owned();
    let watch_role = role.clone();
    let following = tokio::spawn(
        async move {
            follower
                .follow(&name, &watch_role, async {
                    let _ = stopped.await;
                })
                .await
        }
        .instrument(tracing::info_span!("follower")),
    );
    tracing::info!(lease = %lease, identity = %cfg.identity, "a follower until this replica holds the leader Lease");
    let waiting = |holder: &str| {
        role.write().text = format!(
            "follower: replica {holder} leads (Lease {lease}); this one answers the extender from the shared state and takes over when it stops"
        );
    };
    let acquired = tokio::select! {
        l = crate::leader::acquire(election.api.clone(), cfg.clone(), election.role.clone(), waiting) => Some(l),
        () = shutdown => None,
    };
    let _ = stop.send(());
    let follower = following.await.context("the follower task failed")?;
    Ok(acquired.map(|l| (follower, l)))
}

/// Whether a replica that learned runs up to `fed_seq` missed some that the snapshot at
/// `snapshot_seq` holds, when the next run it has is `next`.
fn missed(fed_seq: u64, snapshot_seq: u64, next: Option<u64>) -> bool {
    snapshot_seq > fed_seq && next != Some(fed_seq + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::Index;
    use kudos_scheduler_core::Scheduler;
    use std::time::Duration;

    /// A store object as the leader writes it.
    fn object(
        name: &str,
        part: &str,
        key: &str,
        value: String,
        annotations: &[(&str, u64)],
    ) -> k8s_openapi::api::core::v1::ConfigMap {
        let annotations: serde_json::Map<String, serde_json::Value> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.to_string().into()))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": {"kudos.dev/store": "kudos", "kudos.dev/store-part": part},
                "annotations": annotations,
            },
            "data": {key: value},
        }))
        .unwrap()
    }

    fn runs(seqs: std::ops::RangeInclusive<u64>) -> Vec<StoredRun> {
        // With the node's profile, as ingestion stores it: the run is observed (counted).
        let profile = crate::state::ProfileRecord {
            vendor: "nvidia".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            count: 1,
            memory_bytes: 80 << 30,
        };
        seqs.map(|seq| StoredRun {
            seq,
            profile: Some(profile.clone()),
            run_id: format!("run-{seq}"),
            ..crate::store::tests::run(&format!("r{seq}"))
        })
        .collect()
    }

    async fn wait_applied(index: &SharedIndex, seq: u64) {
        tokio::time::timeout(Duration::from_secs(30), async {
            while index.read().applied_seq() < seq {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the learner published");
    }

    /// A follower whose watch missed runs 1..=5 (their segments were deleted once the
    /// snapshot at 5 held them) starts again from that snapshot, read by name, and learns
    /// 6 and 7 after it; one that missed nothing reads no snapshot.
    #[tokio::test]
    async fn missed_runs_are_taken_from_the_snapshot_that_holds_them() {
        let config = SchedulerConfig::default();
        let snapshot = serde_json::to_string(Scheduler::new(config.clone()).state()).unwrap();
        let chunk = object(
            "kudos-model-5-0",
            "model",
            "chunk",
            snapshot,
            &[("kudos.dev/seq", 5), ("kudos.dev/chunk", 0)],
        );
        let chunk = serde_json::to_value(&chunk).unwrap();
        let (client, calls) = crate::fake_api::client(Arc::new(move |method, path, _| {
            match (method.as_str(), path) {
                ("GET", "/api/v1/namespaces/ns/configmaps/kudos-model-5-0") => (200, chunk.clone()),
                _ => (404, crate::fake_api::status(404, "NotFound")),
            }
        }));
        let store = Arc::new(ConfigMapStore::new(client, "ns", "kudos"));
        let index: SharedIndex = Arc::new(parking_lot::RwLock::new(Index::new(
            "kudos.dev/gpu",
            120.0,
            Scheduler::new(config.clone()),
            true,
        )));
        let learned = || index.read().model().state().runs();
        let metrics = Arc::new(Metrics::new());
        let mut follower = Follower::new(store, index.clone(), metrics, config, Vec::new());
        let mut mirror = StoreMirror::new("kudos");

        // Live: runs 1..=2 arrive and are learned; no snapshot is read.
        let json = serde_json::to_string(&runs(1..=2)).unwrap();
        mirror.apply(&object(
            "kudos-runs-1",
            "runs",
            "runs.json",
            json,
            &[("kudos.dev/seq", 2)],
        ));
        follower.sync(&mut mirror).await;
        wait_applied(&index, 2).await;
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(learned(), 2);

        // A relist: <name> names the snapshot at 5 (3..=5 were never seen), segments from 6.
        mirror.relist();
        let meta = serde_json::json!({"format": 2, "nextSeq": 8, "modelSeq": 5, "modelChunks": 1});
        mirror.apply(&object(
            "kudos",
            "state",
            "state.json",
            meta.to_string(),
            &[],
        ));
        let json = serde_json::to_string(&runs(6..=7)).unwrap();
        mirror.apply(&object(
            "kudos-runs-6",
            "runs",
            "runs.json",
            json,
            &[("kudos.dev/seq", 7)],
        ));
        mirror.relisted();
        follower.sync(&mut mirror).await;
        assert_eq!(
            calls.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the snapshot was read"
        );
        wait_applied(&index, 7).await;
        assert_eq!(follower.fed_seq, 7);
        // The (empty) snapshot replaced the model that had learned 1 and 2; 6 and 7 after it.
        assert_eq!(learned(), 2);
    }

    /// A watch of the store that keeps failing (here: forbidden, as without the chart's
    /// `watch` grant) turns the follower's readiness off after [`STALE_AFTER`].
    #[tokio::test(start_paused = true)]
    async fn a_follower_that_cannot_watch_the_store_is_not_ready() {
        let (client, calls) = crate::fake_api::client(Arc::new(|_, _, _| {
            (403, crate::fake_api::status(403, "Forbidden"))
        }));
        let store = Arc::new(ConfigMapStore::new(client, "ns", "kudos"));
        let config = SchedulerConfig::default();
        let index: SharedIndex = Arc::new(parking_lot::RwLock::new(Index::new(
            "kudos.dev/gpu",
            120.0,
            Scheduler::new(config.clone()),
            true,
        )));
        let follower = Follower::new(store, index, Arc::new(Metrics::new()), config, Vec::new());
        let role = Arc::new(parking_lot::RwLock::new(Role::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let r = role.clone();
        let task = tokio::spawn(async move {
            follower
                .follow("kudos", &r, async {
                    let _ = stopped.await;
                })
                .await
        });
        let start = tokio::time::Instant::now();
        while role.read().behind.is_none() {
            assert!(
                start.elapsed() < STALE_AFTER * 4,
                "still ready after {} calls",
                calls.load(std::sync::atomic::Ordering::SeqCst)
            );
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        assert!(start.elapsed() >= STALE_AFTER, "not before {STALE_AFTER:?}");
        let why = role.read().behind.clone().unwrap_or_default();
        assert!(why.contains("cannot follow the state store"), "{why}");
        assert!(
            calls.load(std::sync::atomic::Ordering::SeqCst) > 1,
            "the watch was retried"
        );
        let _ = stop.send(());
        let _ = task.await;
    }

    #[test]
    fn a_snapshot_is_loaded_only_when_runs_it_holds_are_missing() {
        // The snapshot holds nothing new.
        assert!(!missed(20, 20, None));
        assert!(!missed(20, 12, Some(25)));
        // It holds runs 21..=30 and the segments still hold them from 21 on: learn those.
        assert!(!missed(20, 30, Some(21)));
        // The segments from 21 on are gone (a snapshot made them obsolete): load it.
        assert!(missed(20, 30, Some(31)));
        assert!(missed(20, 30, None));
    }
}
