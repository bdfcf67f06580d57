//! Durable state behind one trait: the plugin configuration, accepted run reports (the
//! write-ahead log the model is rebuilt from) and periodic model snapshots.
//!
//! Why a log plus snapshots: an acknowledgement promises the report is durable, and writing
//! the whole model on every report would be slow. So `append_run` commits the report (and its
//! ID, for de-duplication) before the ack; the model is snapshotted now and then with the
//! sequence number it includes; on start the snapshot is loaded and every later run is replayed
//! through `observe` with its stored `received_at`, which reproduces the model exactly.
//!
//! [`FileStore`] (redb, fsync on commit) is the default, so one binary runs with no cluster;
//! [`crate::store_k8s::ConfigMapStore`] keeps the same data in a ConfigMap in a cluster.

use crate::metrics::{Metrics, ReasonLabels};
use crate::state::{PluginConfig, StoredRun};
use futures::future::BoxFuture;
use kudos_common::damaged_file::ClosingDatabase;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::Path;
use std::sync::Arc;

/// Report IDs kept once their runs are in a snapshot, in either store (agents re-send only
/// unacknowledged, recent reports): a report re-sent after 5,000 newer ones is learned again.
pub const MAX_REPORT_IDS: usize = 5_000;

/// Store errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The embedded database failed.
    #[error("embedded store: {0}")]
    Redb(#[from] redb::Error),
    /// Stored data could not be (de)serialised.
    #[error("stored data is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The Kubernetes API failed.
    #[error("ConfigMap store: {0}")]
    Kube(#[from] Box<kube::Error>),
    /// Optimistic concurrency kept failing.
    #[error("ConfigMap store: {0}")]
    Conflict(String),
    /// A blocking task panicked or was cancelled.
    #[error("store task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// The file is damaged: the embedded database panicked reading or writing it.
    #[error("the store file is damaged: {0}")]
    Damaged(String),
    /// The file's contents disagree with themselves (a run's key is not its seq, a seq at the
    /// end of the range): damage that redb's checksums let through.
    #[error("the store file is inconsistent: {0}")]
    Inconsistent(String),
    /// Moving a damaged file aside failed.
    #[error("moving the damaged store {path} aside: {source}")]
    MoveAside {
        /// The damaged file.
        path: std::path::PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// What `load` returns.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The plugin configuration (default when none was stored).
    pub plugin_config: PluginConfig,
    /// The last model snapshot (JSON) and the highest run `seq` it includes.
    pub model: Option<(Vec<u8>, u64)>,
    /// Runs with `seq` above the snapshot's, in order, to replay.
    pub runs_to_replay: Vec<StoredRun>,
    /// Number of report IDs known (for logs and metrics).
    pub known_reports: u64,
}

impl Loaded {
    /// Logs what a load read and how long it took since `started`.
    pub fn log_read(&self, started: std::time::Instant, what: &str) {
        tracing::info!(
            seconds = started.elapsed().as_secs_f64(),
            snapshot_bytes = self.model.as_ref().map_or(0, |(m, _)| m.len()),
            runs = self.runs_to_replay.len(),
            "{what}"
        );
    }
}

/// Outcome of `append_run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Appended {
    /// Durably stored for the first time under this sequence number.
    Stored(u64),
    /// The report ID was stored before: nothing written.
    Duplicate,
}

/// Durable state. Every write has returned only once it is durable.
pub trait Store: Send + Sync + 'static {
    /// Loads everything needed to rebuild the in-memory state.
    fn load(&self) -> BoxFuture<'_, Result<Loaded, StoreError>>;
    /// Replaces the plugin configuration.
    fn save_plugin_config(&self, cfg: PluginConfig) -> BoxFuture<'_, Result<(), StoreError>>;
    /// Stores a run unless its report ID is known; assigns `seq`.
    fn append_run(&self, run: StoredRun) -> BoxFuture<'_, Result<Appended, StoreError>>;
    /// Stores runs in order, one outcome per run. The default appends one at a time; a store
    /// that can commit many at once (one fsync) overrides it.
    fn append_runs(
        &self,
        runs: Vec<StoredRun>,
    ) -> BoxFuture<'_, Result<Vec<Appended>, StoreError>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(runs.len());
            for run in runs {
                out.push(self.append_run(run).await?);
            }
            Ok(out)
        })
    }
    /// Replaces the model snapshot, which includes every run up to `applied_seq`.
    fn save_model(&self, model: Vec<u8>, applied_seq: u64)
    -> BoxFuture<'_, Result<(), StoreError>>;
}

// === impl FileStore ===

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const REPORT_IDS: TableDefinition<&str, u64> = TableDefinition::new("report_ids");
const RUNS: TableDefinition<u64, &[u8]> = TableDefinition::new("runs");
const KEY_PLUGIN: &str = "plugin_config";
const KEY_MODEL: &str = "model";
const KEY_MODEL_SEQ: &str = "model_seq";

/// The embedded store: one redb file, every commit fsynced (`Durability::Immediate`).
#[derive(Clone)]
pub struct FileStore {
    db: Arc<ClosingDatabase>,
}

impl FileStore {
    /// Opens or creates the file (its directory must exist), verifying the checksum of every
    /// page first.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        // The check on open walks the trees from the header's checksummed roots and verifies
        // each page before following its pointers. A plain open follows them unverified, and a
        // damaged pointer made redb allocate its page's buffer (2.1 GB for one fuzzed file,
        // up to 4 GiB possible) before finding the file too short: the process was killed at
        // its memory limit at every restart (found by fuzzing; the outbox had the check).
        // Wrapped at once: if redb panics below, the database is dropped while unwinding, and
        // a second panic there (its closing commit) would abort the process.
        let db = ClosingDatabase::new(
            Database::builder()
                .set_check_integrity_on_open(true)
                .create(path)
                .map_err(redb::Error::from)?,
        );
        let txn = db.begin_write().map_err(redb::Error::from)?;
        {
            txn.open_table(META).map_err(redb::Error::from)?;
            txn.open_table(REPORT_IDS).map_err(redb::Error::from)?;
            txn.open_table(RUNS).map_err(redb::Error::from)?;
        }
        txn.commit().map_err(redb::Error::from)?;
        Ok(Self { db: Arc::new(db) })
    }

    /// Opens the file and loads it, recovering from a damaged one: an empty file (a store
    /// always holds its tables, so zero bytes means a truncation), a corrupt page, undecodable
    /// contents, or a panic inside redb. The damaged file is moved aside as
    /// `<path>.damaged-<unix seconds>` (kept for inspection), an error is logged and counted in
    /// `kudos_orchestrator_store_recoveries_total`, and an empty store starts in its place.
    /// Other errors (permissions, another process holding the file) are returned untouched.
    pub fn open_checked(path: &Path, metrics: &Metrics) -> Result<(Self, Loaded), StoreError> {
        let damage = match std::fs::metadata(path) {
            Ok(m) if m.len() == 0 => Some(("empty", "the file has zero bytes".to_owned())),
            _ => None,
        };
        let damage = match damage {
            Some(d) => d,
            None => match guarded(|| {
                let store = Self::open(path)?;
                let loaded = store.load_sync()?;
                Ok((store, loaded))
            }) {
                Ok(opened) => return Ok(opened),
                Err(e) => match damage_kind(&e) {
                    Some(kind) => (kind, e.to_string()),
                    None => return Err(e),
                },
            },
        };
        let (kind, why) = damage;
        let aside = kudos_common::damaged_file::move_aside(path).map_err(|source| {
            StoreError::MoveAside {
                path: path.to_owned(),
                source,
            }
        })?;
        metrics
            .store_recoveries
            .get_or_create(&ReasonLabels { reason: kind })
            .inc();
        tracing::error!(
            path = %path.display(),
            moved_to = %aside.display(),
            reason = %why,
            "THE STORE FILE IS DAMAGED: it was moved aside and the orchestrator starts with an EMPTY store \
             (plugin configuration and learned history are lost until plugins report again and runs arrive)"
        );
        let store = Self::open(path)?;
        let loaded = store.load_sync()?;
        Ok((store, loaded))
    }

    fn load_sync(&self) -> Result<Loaded, StoreError> {
        let txn = self.db.begin_read().map_err(redb::Error::from)?;
        let meta = txn.open_table(META).map_err(redb::Error::from)?;
        let plugin_config = match meta.get(KEY_PLUGIN).map_err(redb::Error::from)? {
            Some(v) => serde_json::from_slice(v.value())?,
            None => PluginConfig::default(),
        };
        let applied_seq = match meta.get(KEY_MODEL_SEQ).map_err(redb::Error::from)? {
            Some(v) => serde_json::from_slice::<u64>(v.value())?,
            None => 0,
        };
        let model = meta
            .get(KEY_MODEL)
            .map_err(redb::Error::from)?
            .map(|v| (v.value().to_vec(), applied_seq));
        let runs = txn.open_table(RUNS).map_err(redb::Error::from)?;
        // Seqs count up from 1 and every append adds one: a seq at the end of the range, or a
        // run stored under a key other than its seq, is damage (found by fuzzing: a patched key
        // made the next append overflow).
        let inconsistent = |why: String| StoreError::Inconsistent(why);
        let first = applied_seq
            .checked_add(1)
            .ok_or_else(|| inconsistent(format!("the snapshot's seq is {applied_seq}")))?;
        if let Some((last, _)) = runs.last().map_err(redb::Error::from)?
            && last.value() == u64::MAX
        {
            return Err(inconsistent(format!("a run is stored at seq {}", u64::MAX)));
        }
        let mut runs_to_replay = Vec::new();
        for item in runs.range(first..).map_err(redb::Error::from)? {
            let (k, v) = item.map_err(redb::Error::from)?;
            let run: StoredRun = serde_json::from_slice(v.value())?;
            if run.seq != k.value() {
                return Err(inconsistent(format!(
                    "the run stored at seq {} says its seq is {}",
                    k.value(),
                    run.seq
                )));
            }
            runs_to_replay.push(run);
        }
        let ids = txn.open_table(REPORT_IDS).map_err(redb::Error::from)?;
        let known_reports = redb::ReadableTableMetadata::len(&ids).map_err(redb::Error::from)?;
        Ok(Loaded {
            plugin_config,
            model,
            runs_to_replay,
            known_reports,
        })
    }

    fn put_meta(&self, items: &[(&str, Vec<u8>)]) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(redb::Error::from)?;
        {
            let mut meta = txn.open_table(META).map_err(redb::Error::from)?;
            for (k, v) in items {
                meta.insert(*k, v.as_slice()).map_err(redb::Error::from)?;
            }
        }
        txn.commit().map_err(redb::Error::from)?;
        Ok(())
    }

    /// Saves the snapshot and, in the same commit, forgets the runs it includes except the
    /// last [`MAX_REPORT_IDS`], with their report IDs (kept for de-duplication): the file then
    /// holds at most that many runs besides those since the snapshot, however long it runs.
    fn snapshot_sync(&self, model: Vec<u8>, applied_seq: u64) -> Result<(), StoreError> {
        #[derive(serde::Deserialize)]
        struct ReportId {
            #[serde(rename = "reportId")]
            report_id: String,
        }
        let txn = self.db.begin_write().map_err(redb::Error::from)?;
        {
            let mut meta = txn.open_table(META).map_err(redb::Error::from)?;
            meta.insert(KEY_MODEL, model.as_slice())
                .map_err(redb::Error::from)?;
            meta.insert(KEY_MODEL_SEQ, serde_json::to_vec(&applied_seq)?.as_slice())
                .map_err(redb::Error::from)?;
            let cutoff = applied_seq.saturating_sub(MAX_REPORT_IDS as u64);
            let mut runs = txn.open_table(RUNS).map_err(redb::Error::from)?;
            let mut ids = txn.open_table(REPORT_IDS).map_err(redb::Error::from)?;
            loop {
                let id = match runs.first().map_err(redb::Error::from)? {
                    Some((k, v)) if k.value() <= cutoff => {
                        match serde_json::from_slice::<ReportId>(v.value()) {
                            Ok(r) => Some(r.report_id),
                            Err(e) => {
                                tracing::warn!(seq = k.value(), error = %e, "a stored run has no readable report ID; its ID stays known");
                                None
                            }
                        }
                    }
                    _ => break,
                };
                runs.pop_first().map_err(redb::Error::from)?;
                if let Some(id) = id {
                    ids.remove(id.as_str()).map_err(redb::Error::from)?;
                }
            }
        }
        txn.commit().map_err(redb::Error::from)?;
        Ok(())
    }

    /// Appends `runs` in one transaction (one fsync); a report ID seen before, or earlier in
    /// the same batch, is a duplicate.
    fn append_sync(&self, runs: Vec<StoredRun>) -> Result<Vec<Appended>, StoreError> {
        let txn = self.db.begin_write().map_err(redb::Error::from)?;
        let mut outcomes = Vec::with_capacity(runs.len());
        {
            let mut ids = txn.open_table(REPORT_IDS).map_err(redb::Error::from)?;
            let mut table = txn.open_table(RUNS).map_err(redb::Error::from)?;
            let mut last = table
                .last()
                .map_err(redb::Error::from)?
                .map_or(0, |(k, _)| k.value());
            for mut run in runs {
                if ids
                    .get(run.report_id.as_str())
                    .map_err(redb::Error::from)?
                    .is_some()
                {
                    outcomes.push(Appended::Duplicate);
                    continue;
                }
                // `load` refuses a file whose last seq is u64::MAX; a run log cannot get there.
                last = last.checked_add(1).ok_or_else(|| {
                    StoreError::Inconsistent(format!("no seq after {last} is left"))
                })?;
                run.seq = last;
                let bytes = serde_json::to_vec(&run)?;
                table
                    .insert(run.seq, bytes.as_slice())
                    .map_err(redb::Error::from)?;
                ids.insert(run.report_id.as_str(), run.seq)
                    .map_err(redb::Error::from)?;
                outcomes.push(Appended::Stored(run.seq));
            }
        }
        if outcomes.iter().any(|o| matches!(o, Appended::Stored(_))) {
            txn.commit().map_err(redb::Error::from)?;
        } else {
            txn.abort().map_err(redb::Error::from)?;
        }
        Ok(outcomes)
    }

    /// Runs `f` on a blocking thread; a panic inside redb (a damaged page) becomes
    /// [`StoreError::Damaged`] instead of taking the process down.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Self) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || guarded(|| f(&this))).await?
    }
}

/// Whether `e` says the file's contents are damaged (as opposed to unreachable).
fn damage_kind(e: &StoreError) -> Option<&'static str> {
    match e {
        StoreError::Damaged(_) => Some("panic"),
        StoreError::Json(_) => Some("undecodable"),
        StoreError::Inconsistent(_) => Some("inconsistent"),
        StoreError::Redb(e) if kudos_common::damaged_file::is_damage(e) => Some("corrupted"),
        _ => None,
    }
}

/// Calls `f`, turning a panic into [`StoreError::Damaged`].
fn guarded<T>(f: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
    kudos_common::damaged_file::catch_panic(f, StoreError::Damaged)
}

impl Store for FileStore {
    fn load(&self) -> BoxFuture<'_, Result<Loaded, StoreError>> {
        Box::pin(self.blocking(Self::load_sync))
    }

    fn save_plugin_config(&self, cfg: PluginConfig) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let bytes = serde_json::to_vec(&cfg)?;
            self.blocking(move |s| s.put_meta(&[(KEY_PLUGIN, bytes)]))
                .await
        })
    }

    fn append_run(&self, run: StoredRun) -> BoxFuture<'_, Result<Appended, StoreError>> {
        Box::pin(async move {
            let mut out = self.blocking(move |s| s.append_sync(vec![run])).await?;
            out.pop()
                .ok_or_else(|| StoreError::Damaged("an append returned no outcome".into()))
        })
    }

    fn append_runs(
        &self,
        runs: Vec<StoredRun>,
    ) -> BoxFuture<'_, Result<Vec<Appended>, StoreError>> {
        Box::pin(self.blocking(move |s| s.append_sync(runs)))
    }

    fn save_model(
        &self,
        model: Vec<u8>,
        applied_seq: u64,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.blocking(move |s| s.snapshot_sync(model, applied_seq)))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::state::RunOutcome;

    pub(crate) fn run(id: &str) -> StoredRun {
        StoredRun {
            seq: 0,
            report_id: id.into(),
            run_id: "r".into(),
            node: "n1".into(),
            pod_namespace: "default".into(),
            pod_name: "p".into(),
            class: "resnet".into(),
            device_ids: vec!["nv-0".into()],
            outcome: RunOutcome::Completed,
            start: 100.0,
            end: 200.0,
            gpu_busy_seconds: 90.0,
            progress: None,
            work_done: None,
            profile: None,
            received_at: 201.0,
        }
    }

    #[tokio::test]
    async fn append_dedups_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        {
            let s = FileStore::open(&path).unwrap();
            assert_eq!(s.append_run(run("a")).await.unwrap(), Appended::Stored(1));
            assert_eq!(s.append_run(run("a")).await.unwrap(), Appended::Duplicate);
            assert_eq!(s.append_run(run("b")).await.unwrap(), Appended::Stored(2));
            s.save_model(b"{}".to_vec(), 1).await.unwrap();
            let cfg = PluginConfig {
                generation: 7,
                ..Default::default()
            };
            s.save_plugin_config(cfg).await.unwrap();
        }
        let s = FileStore::open(&path).unwrap();
        let l = s.load().await.unwrap();
        assert_eq!(l.plugin_config.generation, 7);
        assert_eq!(l.model, Some((b"{}".to_vec(), 1)));
        assert_eq!(l.runs_to_replay.len(), 1);
        assert_eq!(l.runs_to_replay[0].report_id, "b");
        assert_eq!(l.known_reports, 2);
        assert_eq!(s.append_run(run("b")).await.unwrap(), Appended::Duplicate);
    }

    /// A long run keeps the file bounded: a snapshot forgets the runs it includes but the last
    /// 5,000, whose IDs still de-duplicate, and nothing is lost across a reopen.
    #[tokio::test]
    async fn snapshots_bound_the_runs_and_report_ids_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let n = MAX_REPORT_IDS as u64 + 3_000;
        {
            let s = FileStore::open(&path).unwrap();
            let runs = (1..=n).map(|i| run(&format!("id-{i}"))).collect();
            s.append_runs(runs).await.unwrap();
            s.save_model(b"{}".to_vec(), n - 10).await.unwrap();
        }
        let s = FileStore::open(&path).unwrap();
        let l = s.load().await.unwrap();
        assert_eq!(l.known_reports, MAX_REPORT_IDS as u64 + 10);
        assert_eq!(l.runs_to_replay.len(), 10);
        assert_eq!(l.runs_to_replay[0].seq, n - 9);
        let recent = format!("id-{}", n - 10 - MAX_REPORT_IDS as u64 + 1);
        assert_eq!(
            s.append_run(run(&recent)).await.unwrap(),
            Appended::Duplicate
        );
        assert_eq!(
            s.append_run(run("id-1")).await.unwrap(),
            Appended::Stored(n + 1),
            "an ID older than the last 5,000 is forgotten, and seqs continue"
        );
    }

    fn recoveries(m: &Metrics, reason: &'static str) -> u64 {
        m.store_recoveries
            .get_or_create(&ReasonLabels { reason })
            .get()
    }

    fn damaged_files(dir: &Path) -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains(".damaged-"))
            .collect()
    }

    /// A zero-length store used to start silently empty: now it is moved aside, counted, and
    /// an empty store starts loudly in its place.
    #[tokio::test]
    async fn an_empty_file_is_moved_aside_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        std::fs::write(&path, b"").unwrap();
        let m = Metrics::new();
        let (s, loaded) = FileStore::open_checked(&path, &m).unwrap();
        assert_eq!(loaded.known_reports, 0);
        assert_eq!(recoveries(&m, "empty"), 1);
        assert_eq!(damaged_files(dir.path()).len(), 1);
        assert_eq!(s.append_run(run("a")).await.unwrap(), Appended::Stored(1));
        // A healthy file opens as it is.
        drop(s);
        let (_, loaded) = FileStore::open_checked(&path, &m).unwrap();
        assert_eq!(loaded.known_reports, 1);
        assert_eq!(damaged_files(dir.path()).len(), 1);
    }

    /// A file whose `runs` table has other types than ours (a damaged table header, found by
    /// the store fuzz target) is damaged, not a reason to refuse to start.
    #[tokio::test]
    async fn a_table_of_the_wrong_type_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(TableDefinition::<&str, &str>::new("runs"))
                .unwrap();
            txn.commit().unwrap();
        }
        let m = Metrics::new();
        let (s, loaded) = FileStore::open_checked(&path, &m).unwrap();
        assert_eq!(loaded.known_reports, 0);
        assert_eq!(recoveries(&m, "corrupted"), 1);
        assert_eq!(damaged_files(dir.path()).len(), 1);
        assert_eq!(s.append_run(run("a")).await.unwrap(), Appended::Stored(1));
    }

    /// Damage that redb's checksums let through: a run stored under a key other than its seq
    /// (a patched key at u64::MAX made the next append overflow), or a snapshot seq at the end
    /// of the range. Each file is moved aside and reported, and the store goes on.
    #[tokio::test]
    async fn runs_out_of_sequence_are_damage() {
        let rerun = |key: u64, model_seq: Option<u64>| async move {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("s.redb");
            {
                let s = FileStore::open(&path).unwrap();
                s.append_run(run("a")).await.unwrap();
                let txn = s.db.begin_write().unwrap();
                {
                    let mut runs = txn.open_table(RUNS).unwrap();
                    let bytes = serde_json::to_vec(&StoredRun { seq: 1, ..run("a") }).unwrap();
                    runs.remove(1).unwrap();
                    runs.insert(key, bytes.as_slice()).unwrap();
                    if let Some(seq) = model_seq {
                        let mut meta = txn.open_table(META).unwrap();
                        meta.insert(KEY_MODEL_SEQ, serde_json::to_vec(&seq).unwrap().as_slice())
                            .unwrap();
                    }
                }
                txn.commit().unwrap();
            }
            let m = Metrics::new();
            let (s, loaded) = FileStore::open_checked(&path, &m).unwrap();
            assert!(loaded.runs_to_replay.is_empty());
            assert_eq!(recoveries(&m, "inconsistent"), 1, "key {key}");
            assert_eq!(damaged_files(dir.path()).len(), 1);
            assert_eq!(s.append_run(run("b")).await.unwrap(), Appended::Stored(1));
        };
        rerun(u64::MAX, None).await;
        rerun(7, None).await;
        rerun(1, Some(u64::MAX)).await;
    }

    /// A damaged 4 KiB block made redb panic: every block of a store, damaged in turn, opens
    /// without a panic, either intact or moved aside and reported.
    #[tokio::test]
    async fn every_damaged_block_is_survived() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.redb");
        {
            let s = FileStore::open(&good).unwrap();
            for i in 0..50 {
                s.append_run(run(&format!("r{i}"))).await.unwrap();
            }
            s.save_model(vec![b'7'; 10_000], 20).await.unwrap();
        }
        let bytes = std::fs::read(&good).unwrap();
        let m = Metrics::new();
        let mut recovered = 0;
        for block in 0..bytes.len().div_ceil(4096) {
            let case = dir.path().join(format!("b{block}"));
            std::fs::create_dir(&case).unwrap();
            let path = case.join("s.redb");
            let mut damaged = bytes.clone();
            let end = ((block + 1) * 4096).min(damaged.len());
            damaged[block * 4096..end].fill(0xA5);
            std::fs::write(&path, &damaged).unwrap();
            let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                FileStore::open_checked(&path, &m)
            }));
            let opened = opened.unwrap_or_else(|_| panic!("block {block}: open panicked"));
            let (store, _) = opened.unwrap_or_else(|e| panic!("block {block}: {e}"));
            if !damaged_files(&case).is_empty() {
                recovered += 1;
            }
            // Whatever was found, the store takes writes afterwards.
            store.append_run(run("after")).await.unwrap();
        }
        assert!(recovered > 0, "no damaged block was detected");
        let total: u64 = ["panic", "undecodable", "corrupted"]
            .into_iter()
            .map(|r| recoveries(&m, r))
            .sum();
        assert_eq!(total, recovered);
    }
}
