//! The in-cluster store: the state of [`crate::store::FileStore`] spread over small ConfigMaps
//! in the orchestrator's namespace, so it survives the loss of the orchestrator's pod, another
//! replica can take over, and no write grows with the state.
//!
//! | object | holds | written |
//! |---|---|---|
//! | `<name>` | `state.json`: the next run `seq`, the snapshot's `seq` and chunk count, the plugin configuration's generation, unified name and derived images | each batch of runs (a `seq` reservation), snapshot and configuration change; compare-and-swap on `resourceVersion` |
//! | `<name>-node-<hash>` | one node's plugin report | when that node's report changes; deleted with the node |
//! | `<name>-runs-<seq>` | the runs of one batch, from `seq` on | created once; deleted when a snapshot includes them |
//! | `<name>-model-<seq>-<i>` | chunk `i` of the snapshot that includes runs up to `seq` | each snapshot, at most [`MODEL_BYTES_PER_SECOND`] on average |
//! | `<name>-report-ids` | the last [`MAX_REPORT_IDS`] report IDs, for de-duplication after their runs are folded into a snapshot | each snapshot |
//!
//! All carry `kudos.dev/store=<name>` and `kudos.dev/store-part=<part>`.
//!
//! Why not one object: the first version kept everything in one ConfigMap, rewritten whole on
//! every report. It hit the 1 MiB object limit after about 3,000 reports (from then on nothing was
//! stored), and every rewrite left a whole copy in etcd's history: about 4,000 rewrites filled
//! etcd's 2 GiB quota and stopped every write in the cluster. Here a report costs its own bytes
//! plus a small `seq` reservation per batch, every object stays under [`OBJECT_BYTES`], and what a
//! snapshot makes obsolete is deleted, so etcd's size stays flat once the API server compacts it.
//!
//! Crash safety comes from the order of writes: chunks before the `state.json` that names them;
//! a `seq` range reserved (compare-and-swap, so two replicas never share one) before its runs are
//! written; a snapshot's report IDs before the runs they came from are deleted. What a crash
//! leaves behind (chunks nobody names, runs a snapshot covers) is deleted at the next load.
//!
//! A ConfigMap in the first format (`plugin-config.json`, `model.json`, `runs.json`,
//! `report-ids.json` in `<name>`) is converted on first load, losing nothing.

use crate::state::{PluginConfig, StoredRun, VendorEntry};
use crate::store::{Appended, Loaded, Store, StoreError};
use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, PostParams};
use kudos_api::plugin_config::DerivedImage;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

mod follow;
mod legacy;
mod load;
mod pack;

pub use follow::StoreMirror;

pub use crate::store::MAX_REPORT_IDS;
use pack::{RecentIds, pack_runs, split_utf8};
/// Report IDs remembered in memory (those of runs not yet in a snapshot, then the most recent).
const MAX_IDS_IN_MEMORY: usize = 200_000;
/// Data bytes per object at most: under the API server's 1 MiB limit, with room for metadata.
pub const OBJECT_BYTES: usize = 768 * 1024;
/// Average bytes per second snapshots may write: a snapshot sooner than this allows is skipped
/// (its runs stay in the log, replayable). A 1 MiB model is then saved at most every 16 s,
/// a 20 MiB one every 5 min, so etcd's history between compactions stays bounded.
pub const MODEL_BYTES_PER_SECOND: u64 = 64 * 1024;
/// Longest store name: it is a label value, and object names add at most 31 characters.
pub const MAX_NAME_LEN: usize = 40;
const FORMAT: u32 = 2;
const RETRIES: usize = 8;
const PARALLEL_WRITES: usize = 8;
const LABEL_STORE: &str = "kudos.dev/store";
const LABEL_PART: &str = "kudos.dev/store-part";
const KEY_STATE: &str = "state.json";
const KEY_NODE: &str = "node.json";
const KEY_RUNS: &str = "runs.json";
const KEY_CHUNK: &str = "chunk";
const KEY_IDS: &str = "report-ids.json";
const ANN_SEQ: &str = "kudos.dev/seq";
const ANN_CHUNK: &str = "kudos.dev/chunk";

/// See the module docs.
pub struct ConfigMapStore {
    api: kube::Api<ConfigMap>,
    name: String,
    model_bytes_per_second: u64,
    inner: tokio::sync::Mutex<Option<Inner>>,
}

/// `state.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    format: u32,
    next_seq: u64,
    model_seq: u64,
    #[serde(default)]
    model_chunks: u32,
    #[serde(default)]
    generation: u64,
    #[serde(default)]
    unified_resource_name: String,
    #[serde(default)]
    images: BTreeMap<String, DerivedImage>,
}

/// `node.json`: one node's entry of the plugin configuration.
#[derive(Serialize, Deserialize)]
struct NodeRecord {
    node: String,
    /// The configuration's generation when this was written (a crash before `state.json` was
    /// updated must not hide the change).
    generation: u64,
    vendors: BTreeMap<String, VendorEntry>,
}

/// Whether a load may write: the leader's may (it converts the first format and deletes what a
/// snapshot made obsolete), a follower's may not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Access {
    Read,
    Write,
}

/// What this process knows the store holds; it is the one writer while it leads.
struct Inner {
    meta: Meta,
    /// `resourceVersion` of `<name>`; `None` until it exists.
    rv: Option<String>,
    nodes: BTreeMap<String, BTreeMap<String, VendorEntry>>,
    ids: RecentIds,
    /// Run segments whose report IDs are in `ids` (written or loaded here): another replica's
    /// must be read before a snapshot deletes them, or their IDs would be forgotten.
    segments: HashSet<String>,
    /// Earliest time the next snapshot may be written.
    next_model_write: Option<Instant>,
}

fn kube_err(e: kube::Error) -> StoreError {
    StoreError::Kube(Box::new(e))
}

fn is_code(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

fn node_object_suffix(node: &str) -> String {
    format!("{:016x}", crate::kobj::seed_of(node))
}

fn annotation(cm: &ConfigMap, key: &str) -> Option<u64> {
    cm.metadata.annotations.as_ref()?.get(key)?.parse().ok()
}

fn part(cm: &ConfigMap) -> Option<&str> {
    cm.metadata
        .labels
        .as_ref()?
        .get(LABEL_PART)
        .map(String::as_str)
}

fn data<'a>(cm: &'a ConfigMap, key: &str) -> Option<&'a str> {
    cm.data.as_ref()?.get(key).map(String::as_str)
}

impl ConfigMapStore {
    /// Uses ConfigMaps named after `name` in `namespace`, creating them as it writes.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: kube::Api::namespaced(client, namespace),
            name: name.to_owned(),
            model_bytes_per_second: MODEL_BYTES_PER_SECOND,
            inner: tokio::sync::Mutex::new(None),
        }
    }

    /// Sets the average bytes per second snapshots may write (default
    /// [`MODEL_BYTES_PER_SECOND`]); a test that replays hours of reports in seconds raises it.
    pub fn with_snapshot_budget(mut self, bytes_per_second: u64) -> Self {
        self.model_bytes_per_second = bytes_per_second.max(1);
        self
    }

    fn object(
        &self,
        name: String,
        part: &str,
        key: &str,
        value: String,
        annotations: &[(&str, u64)],
    ) -> ConfigMap {
        let labels = BTreeMap::from([
            (LABEL_STORE.to_owned(), self.name.clone()),
            (LABEL_PART.to_owned(), part.to_owned()),
            (
                "app.kubernetes.io/managed-by".to_owned(),
                "kudos-orchestrator".to_owned(),
            ),
        ]);
        let annotations: BTreeMap<String, String> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.to_string()))
            .collect();
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name),
                labels: Some(labels),
                annotations: (!annotations.is_empty()).then_some(annotations),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(key.to_owned(), value)])),
            ..Default::default()
        }
    }

    /// Writes `cm` whatever is there (an unconditional replace, or a create).
    async fn put(&self, cm: &ConfigMap) -> Result<(), StoreError> {
        let name = cm.metadata.name.clone().unwrap_or_default();
        let pp = PostParams::default();
        for _ in 0..RETRIES {
            match self.api.replace(&name, &pp, cm).await {
                Ok(_) => return Ok(()),
                Err(e) if is_code(&e, 404) => match self.api.create(&pp, cm).await {
                    Ok(_) => return Ok(()),
                    Err(e) if is_code(&e, 409) => continue,
                    Err(e) => return Err(kube_err(e)),
                },
                Err(e) if is_code(&e, 409) => continue,
                Err(e) => return Err(kube_err(e)),
            }
        }
        Err(StoreError::Conflict(format!(
            "ConfigMap {name} kept changing; gave up after {RETRIES} attempts"
        )))
    }

    /// Deletes `names`, ignoring those already gone; logs (does not fail on) other errors: what
    /// is left is deleted at the next load.
    async fn delete_all(&self, names: Vec<String>) {
        let dp = DeleteParams::default();
        let api = &self.api;
        futures::stream::iter(names)
            .for_each_concurrent(PARALLEL_WRITES, |n| {
                let dp = dp.clone();
                async move {
                    match api.delete(&n, &dp).await {
                        Ok(_) => {}
                        Err(e) if is_code(&e, 404) => {}
                        Err(e) => tracing::warn!(object = %n, error = %e, "deleting an obsolete state object failed; retried at the next start"),
                    }
                }
            })
            .await;
    }

    async fn put_all(&self, objects: Vec<ConfigMap>) -> Result<(), StoreError> {
        let results: Vec<Result<(), StoreError>> = futures::stream::iter(objects)
            .map(|cm| async move { self.put(&cm).await })
            .buffer_unordered(PARALLEL_WRITES)
            .collect()
            .await;
        results.into_iter().collect()
    }

    async fn read_meta(&self) -> Result<Option<ConfigMap>, StoreError> {
        self.api.get_opt(&self.name).await.map_err(kube_err)
    }

    async fn list_parts(&self) -> Result<Vec<ConfigMap>, StoreError> {
        let mut lp = ListParams::default()
            .labels(&format!("{LABEL_STORE}={}", self.name))
            .limit(500);
        let mut out = Vec::new();
        loop {
            let page = self.api.list(&lp).await.map_err(kube_err)?;
            out.extend(page.items);
            match page.metadata.continue_ {
                Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
                _ => return Ok(out),
            }
        }
    }

    /// Applies `change` to `state.json` and writes it (compare-and-swap). On a conflict the
    /// current object is read back (keeping the larger `next_seq` and the newer snapshot) and
    /// `change` applied again; its result is the one of the write that succeeded.
    async fn write_meta<T>(
        &self,
        inner: &mut Inner,
        mut change: impl FnMut(&mut Meta) -> T,
    ) -> Result<T, StoreError> {
        let pp = PostParams::default();
        for _ in 0..RETRIES {
            let mut meta = inner.meta.clone();
            meta.format = FORMAT;
            let out = change(&mut meta);
            let mut cm = self.state_object(&meta)?;
            cm.metadata.resource_version = inner.rv.clone();
            let r = match &inner.rv {
                Some(_) => self.api.replace(&self.name, &pp, &cm).await,
                None => self.api.create(&pp, &cm).await,
            };
            match r {
                Ok(written) => {
                    inner.rv = written.metadata.resource_version;
                    inner.meta = meta;
                    return Ok(out);
                }
                Err(e) if is_code(&e, 409) => {
                    tracing::info!(
                        object = %self.name,
                        "the store's state changed under this replica; reading it again"
                    );
                    let Some(current) = self.read_meta().await? else {
                        inner.rv = None;
                        continue;
                    };
                    let theirs: Meta = match data(&current, KEY_STATE) {
                        Some(s) => serde_json::from_str(s)?,
                        None => Meta::default(),
                    };
                    let next_seq = inner.meta.next_seq.max(theirs.next_seq);
                    let snapshot_ours = inner.meta.model_seq > theirs.model_seq;
                    let (model_seq, model_chunks) = if snapshot_ours {
                        (inner.meta.model_seq, inner.meta.model_chunks)
                    } else {
                        (theirs.model_seq, theirs.model_chunks)
                    };
                    inner.meta = Meta {
                        next_seq,
                        model_seq,
                        model_chunks,
                        ..theirs
                    };
                    inner.rv = current.metadata.resource_version;
                }
                Err(e) => return Err(kube_err(e)),
            }
        }
        Err(StoreError::Conflict(format!(
            "ConfigMap {} kept changing; gave up after {RETRIES} attempts",
            self.name
        )))
    }

    /// The in-memory view, loading it first if needed.
    async fn ready<'a>(&self, guard: &'a mut Option<Inner>) -> Result<&'a mut Inner, StoreError> {
        if guard.is_none() {
            let (inner, _) = self.load_inner(Access::Write).await?;
            *guard = Some(inner);
        }
        match guard.as_mut() {
            Some(i) => Ok(i),
            None => Err(StoreError::Conflict(
                "store state missing after load".into(),
            )),
        }
    }

    /// `<name>` holding `meta`.
    fn state_object(&self, meta: &Meta) -> Result<ConfigMap, StoreError> {
        Ok(self.object(
            self.name.clone(),
            "state",
            KEY_STATE,
            serde_json::to_string(meta)?,
            &[],
        ))
    }

    fn node_object(
        &self,
        node: &str,
        generation: u64,
        vendors: &BTreeMap<String, VendorEntry>,
    ) -> Result<ConfigMap, StoreError> {
        let record = NodeRecord {
            node: node.to_owned(),
            generation,
            vendors: vendors.clone(),
        };
        Ok(self.object(
            format!("{}-node-{}", self.name, node_object_suffix(node)),
            "node",
            KEY_NODE,
            serde_json::to_string(&record)?,
            &[],
        ))
    }

    fn segment_object(&self, first: u64, last: u64, json: String) -> ConfigMap {
        self.object(
            format!("{}-runs-{first}", self.name),
            "runs",
            KEY_RUNS,
            json,
            &[(ANN_SEQ, last)],
        )
    }

    fn chunk_object(&self, seq: u64, i: u64, text: String) -> ConfigMap {
        self.object(
            format!("{}-model-{seq}-{i}", self.name),
            "model",
            KEY_CHUNK,
            text,
            &[(ANN_SEQ, seq), (ANN_CHUNK, i)],
        )
    }

    fn ids_object(&self, ids: &RecentIds) -> Result<ConfigMap, StoreError> {
        Ok(self.object(
            format!("{}-report-ids", self.name),
            "ids",
            KEY_IDS,
            serde_json::to_string(&ids.last(MAX_REPORT_IDS))?,
            &[],
        ))
    }

    /// Deletes what the snapshot at `seq` made obsolete: run segments it includes and older
    /// snapshots' chunks, whichever replica wrote them (reading names and annotations only,
    /// and the data of another replica's segments, whose report IDs are kept first). On an
    /// error it leaves them: the next start deletes them.
    async fn delete_obsolete(&self, seq: u64) {
        let lp = ListParams::default().labels(&format!("{LABEL_STORE}={}", self.name));
        let listed = match self.api.list_metadata(&lp).await {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(error = %e, "listing the state's objects failed; what the snapshot made obsolete is deleted at the next start");
                return;
            }
        };
        let (mut runs, mut chunks) = (Vec::new(), Vec::new());
        for o in listed {
            let labels = o.metadata.labels.as_ref();
            let part = labels.and_then(|l| l.get(LABEL_PART)).map(String::as_str);
            let at = o
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANN_SEQ))
                .and_then(|v| v.parse::<u64>().ok());
            match (part, at, o.metadata.name) {
                (Some("runs"), Some(last), Some(name)) if last <= seq => runs.push(name),
                (Some("model"), Some(at), Some(name)) if at < seq => chunks.push(name),
                _ => {}
            }
        }
        let mut guard = self.inner.lock().await;
        let Some(inner) = guard.as_mut() else {
            return;
        };
        let unknown: Vec<&String> = runs
            .iter()
            .filter(|n| !inner.segments.contains(*n))
            .collect();
        if !unknown.is_empty() {
            for name in unknown {
                let cm = match self.api.get_opt(name).await {
                    Ok(Some(cm)) => cm,
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(object = %name, error = %e, "reading another replica's runs failed; deleted at the next start");
                        return;
                    }
                };
                if let Some(Ok(batch)) =
                    data(&cm, KEY_RUNS).map(serde_json::from_str::<Vec<StoredRun>>)
                {
                    batch
                        .into_iter()
                        .for_each(|r| inner.ids.insert(r.report_id));
                }
            }
            let written = match self.ids_object(&inner.ids) {
                Ok(o) => self.put(&o).await,
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                tracing::warn!(error = %e, "saving report IDs failed; obsolete runs are deleted at the next start");
                return;
            }
        }
        for name in &runs {
            inner.segments.remove(name);
        }
        drop(guard);
        runs.append(&mut chunks);
        self.delete_all(runs).await;
    }

    async fn append(&self, runs: Vec<StoredRun>) -> Result<Vec<Appended>, StoreError> {
        let mut guard = self.inner.lock().await;
        let inner = self.ready(&mut guard).await?;
        let mut out = vec![Appended::Duplicate; runs.len()];
        let mut seen = HashSet::new();
        let mut fresh = Vec::new();
        for (i, r) in runs.into_iter().enumerate() {
            if !inner.ids.contains(&r.report_id) && seen.insert(r.report_id.clone()) {
                fresh.push((i, r));
            }
        }
        if fresh.is_empty() {
            return Ok(out);
        }
        let n = fresh.len() as u64;
        let first = self
            .write_meta(inner, |m| {
                // Above any snapshot's seq, whatever the counter says: a run at or below it
                // would count as already learned.
                let first = m.next_seq.max(m.model_seq.saturating_add(1));
                m.next_seq = first.saturating_add(n);
                first
            })
            .await?;
        let stored: Vec<StoredRun> = fresh
            .into_iter()
            .zip(first..)
            .map(|((i, r), seq)| {
                out[i] = Appended::Stored(seq);
                StoredRun { seq, ..r }
            })
            .collect();
        let pp = PostParams::default();
        let mut at = 0;
        for (first, last, json) in pack_runs(&stored)? {
            let cm = self.segment_object(first, last, json);
            // Create, never replace: the reserved range is this writer's alone, so an existing
            // object means the state changed in a way this replica did not see.
            self.api.create(&pp, &cm).await.map_err(kube_err)?;
            let count = stored[at..].iter().take_while(|r| r.seq <= last).count();
            for r in &stored[at..at + count] {
                inner.ids.insert(r.report_id.clone());
            }
            at += count;
            inner.segments.insert(cm.metadata.name.unwrap_or_default());
        }
        Ok(out)
    }

    async fn save_plugin(&self, cfg: PluginConfig) -> Result<(), StoreError> {
        let mut guard = self.inner.lock().await;
        let inner = self.ready(&mut guard).await?;
        let mut changed = Vec::new();
        for (node, vendors) in &cfg.nodes {
            if inner.nodes.get(node) != Some(vendors) {
                changed.push(self.node_object(node, cfg.generation, vendors)?);
            }
        }
        let gone: Vec<String> = inner
            .nodes
            .keys()
            .filter(|n| !cfg.nodes.contains_key(*n))
            .map(|n| format!("{}-node-{}", self.name, node_object_suffix(n)))
            .collect();
        self.put_all(changed).await?;
        let (generation, unified, images) = (
            cfg.generation,
            cfg.unified_resource_name.clone(),
            cfg.images.clone(),
        );
        self.write_meta(inner, |m| {
            m.generation = generation;
            m.unified_resource_name.clone_from(&unified);
            m.images.clone_from(&images);
        })
        .await?;
        inner.nodes = cfg.nodes;
        // Under the lock: a later save that brings a node back must not have its object deleted.
        self.delete_all(gone).await;
        Ok(())
    }

    async fn snapshot(&self, model: Vec<u8>, seq: u64) -> Result<(), StoreError> {
        {
            let mut guard = self.inner.lock().await;
            let inner = self.ready(&mut guard).await?;
            if seq <= inner.meta.model_seq {
                return Ok(());
            }
            if let Some(t) = inner.next_model_write
                && Instant::now() < t
            {
                tracing::debug!(
                    seq,
                    bytes = model.len(),
                    "snapshot skipped to stay within the store's write budget; its runs stay replayable"
                );
                return Ok(());
            }
        }
        let text = String::from_utf8(model).map_err(|e| {
            StoreError::Json(serde_json::Error::io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                e,
            )))
        })?;
        let chunks: Vec<ConfigMap> = split_utf8(&text, OBJECT_BYTES)
            .into_iter()
            .enumerate()
            .map(|(i, c)| self.chunk_object(seq, i as u64, c.to_owned()))
            .collect();
        let n = chunks.len() as u32;
        let names: Vec<String> = chunks
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        self.put_all(chunks).await?;

        let mut guard = self.inner.lock().await;
        let inner = self.ready(&mut guard).await?;
        self.put(&self.ids_object(&inner.ids)?).await?;
        // Never go back: a replica that lost the leader Lease may still be saving an older
        // snapshot while the new leader saved a newer one and deleted the runs between them.
        let newest = self
            .write_meta(inner, |m| {
                if m.model_seq >= seq {
                    return false;
                }
                m.model_seq = seq;
                m.model_chunks = n;
                true
            })
            .await?;
        if !newest {
            drop(guard);
            self.delete_all(names).await;
            return Ok(());
        }
        let budget =
            Duration::from_secs_f64(text.len() as f64 / self.model_bytes_per_second as f64);
        inner.next_model_write = Some(Instant::now() + budget);
        drop(guard);
        self.delete_obsolete(seq).await;
        Ok(())
    }
}

impl Store for ConfigMapStore {
    fn load(&self) -> BoxFuture<'_, Result<Loaded, StoreError>> {
        Box::pin(async move {
            let mut guard = self.inner.lock().await;
            let (inner, loaded) = self.load_inner(Access::Write).await?;
            *guard = Some(inner);
            Ok(loaded)
        })
    }

    fn save_plugin_config(&self, cfg: PluginConfig) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.save_plugin(cfg))
    }

    fn append_run(&self, run: StoredRun) -> BoxFuture<'_, Result<Appended, StoreError>> {
        Box::pin(async move {
            let mut out = self.append(vec![run]).await?;
            Ok(out.pop().unwrap_or(Appended::Duplicate))
        })
    }

    fn append_runs(
        &self,
        runs: Vec<StoredRun>,
    ) -> BoxFuture<'_, Result<Vec<Appended>, StoreError>> {
        Box::pin(self.append(runs))
    }

    fn save_model(
        &self,
        model: Vec<u8>,
        applied_seq: u64,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.snapshot(model, applied_seq))
    }
}
