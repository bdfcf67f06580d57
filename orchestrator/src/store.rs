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

use crate::state::{PluginConfig, StoredRun};
use futures::future::BoxFuture;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::Path;
use std::sync::Arc;

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
    db: Arc<Database>,
}

impl FileStore {
    /// Opens or creates the file (its directory must exist).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Database::create(path).map_err(redb::Error::from)?;
        let txn = db.begin_write().map_err(redb::Error::from)?;
        {
            txn.open_table(META).map_err(redb::Error::from)?;
            txn.open_table(REPORT_IDS).map_err(redb::Error::from)?;
            txn.open_table(RUNS).map_err(redb::Error::from)?;
        }
        txn.commit().map_err(redb::Error::from)?;
        Ok(Self { db: Arc::new(db) })
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
        let mut runs_to_replay = Vec::new();
        for item in runs.range(applied_seq + 1..).map_err(redb::Error::from)? {
            let (_, v) = item.map_err(redb::Error::from)?;
            runs_to_replay.push(serde_json::from_slice(v.value())?);
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

    fn append_sync(&self, mut run: StoredRun) -> Result<Appended, StoreError> {
        let txn = self.db.begin_write().map_err(redb::Error::from)?;
        let outcome = {
            let mut ids = txn.open_table(REPORT_IDS).map_err(redb::Error::from)?;
            if ids
                .get(run.report_id.as_str())
                .map_err(redb::Error::from)?
                .is_some()
            {
                Appended::Duplicate
            } else {
                let mut runs = txn.open_table(RUNS).map_err(redb::Error::from)?;
                let last = runs
                    .last()
                    .map_err(redb::Error::from)?
                    .map(|(k, _)| k.value());
                run.seq = last.unwrap_or(0) + 1;
                let bytes = serde_json::to_vec(&run)?;
                runs.insert(run.seq, bytes.as_slice())
                    .map_err(redb::Error::from)?;
                ids.insert(run.report_id.as_str(), run.seq)
                    .map_err(redb::Error::from)?;
                Appended::Stored(run.seq)
            }
        };
        match outcome {
            Appended::Stored(_) => txn.commit().map_err(redb::Error::from)?,
            Appended::Duplicate => txn.abort().map_err(redb::Error::from)?,
        }
        Ok(outcome)
    }
}

impl Store for FileStore {
    fn load(&self) -> BoxFuture<'_, Result<Loaded, StoreError>> {
        let this = self.clone();
        Box::pin(async move { tokio::task::spawn_blocking(move || this.load_sync()).await? })
    }

    fn save_plugin_config(&self, cfg: PluginConfig) -> BoxFuture<'_, Result<(), StoreError>> {
        let this = self.clone();
        Box::pin(async move {
            let bytes = serde_json::to_vec(&cfg)?;
            tokio::task::spawn_blocking(move || this.put_meta(&[(KEY_PLUGIN, bytes)])).await?
        })
    }

    fn append_run(&self, run: StoredRun) -> BoxFuture<'_, Result<Appended, StoreError>> {
        let this = self.clone();
        Box::pin(async move { tokio::task::spawn_blocking(move || this.append_sync(run)).await? })
    }

    fn save_model(
        &self,
        model: Vec<u8>,
        applied_seq: u64,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let this = self.clone();
        Box::pin(async move {
            let seq = serde_json::to_vec(&applied_seq)?;
            tokio::task::spawn_blocking(move || {
                this.put_meta(&[(KEY_MODEL, model), (KEY_MODEL_SEQ, seq)])
            })
            .await?
        })
    }
}

#[cfg(test)]
mod tests {
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
}
