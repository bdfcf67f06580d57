//! The store as a follower replica sees it: the objects of a watch on the store's ConfigMaps,
//! decoded into the plugin configuration and the runs not taken yet. The model snapshot's
//! chunks are not watched (up to 18 objects of 768 KiB, rewritten with every snapshot): they
//! are read, by name, only when the follower has missed runs a snapshot now holds.

use super::*;

/// The label selector of the parts a follower watches: `<name>`, node records and run
/// segments (not snapshot chunks, not report IDs).
pub(super) fn watched_parts(name: &str) -> String {
    format!("{LABEL_STORE}={name},{LABEL_PART} in (state,node,runs)")
}

impl ConfigMapStore {
    /// The ConfigMaps of the store and the label selector a follower watches them with.
    pub fn watched(&self) -> (kube::Api<ConfigMap>, String) {
        (self.api.clone(), watched_parts(&self.name))
    }

    /// The snapshot that includes runs up to `seq`, from its `chunks` objects; `None` when
    /// one is gone (a newer snapshot replaced it: the caller tries again with that one).
    pub async fn read_snapshot(
        &self,
        seq: u64,
        chunks: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let mut text = String::new();
        for i in 0..u64::from(chunks) {
            let name = format!("{}-model-{seq}-{i}", self.name);
            let Some(cm) = self.api.get_opt(&name).await.map_err(kube_err)? else {
                return Ok(None);
            };
            match (
                annotation(&cm, ANN_SEQ),
                annotation(&cm, ANN_CHUNK),
                data(&cm, KEY_CHUNK),
            ) {
                (Some(s), Some(c), Some(t)) if s == seq && c == i => text.push_str(t),
                _ => return Ok(None),
            }
        }
        Ok(Some(text.into_bytes()))
    }
}

/// What a follower knows of the store from its watch. See [`crate::follow`].
pub struct StoreMirror {
    name: String,
    meta: Meta,
    /// Node records by object name.
    nodes: BTreeMap<String, NodeRecord>,
    /// Node records of a relist in progress, replacing `nodes` when it is done.
    relisting: Option<BTreeMap<String, NodeRecord>>,
    /// Runs seen and not taken yet, by `seq`.
    runs: BTreeMap<u64, StoredRun>,
    /// The plugin configuration may have changed since it was last taken.
    plugin_changed: bool,
}

impl StoreMirror {
    /// An empty mirror of the store named `name`.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            meta: Meta::default(),
            nodes: BTreeMap::new(),
            relisting: None,
            runs: BTreeMap::new(),
            plugin_changed: false,
        }
    }

    /// A relist starts: node records seen until [`StoreMirror::relisted`] replace the current
    /// ones (a record deleted while the watch was down disappears).
    pub fn relist(&mut self) {
        self.relisting = Some(BTreeMap::new());
    }

    /// The relist is complete.
    pub fn relisted(&mut self) {
        if let Some(nodes) = self.relisting.take() {
            self.nodes = nodes;
            self.plugin_changed = true;
        }
    }

    /// An object was created or changed (or listed). An unreadable one is logged and skipped,
    /// as a load skips it.
    pub fn apply(&mut self, cm: &ConfigMap) {
        let object = cm.metadata.name.clone().unwrap_or_default();
        match part(cm) {
            Some("state") if object == self.name => {
                match data(cm, KEY_STATE).map(serde_json::from_str::<Meta>) {
                    Some(Ok(meta)) => {
                        self.plugin_changed |= meta.generation != self.meta.generation
                            || meta.images != self.meta.images
                            || meta.unified_resource_name != self.meta.unified_resource_name;
                        self.meta = meta;
                    }
                    _ => {
                        tracing::error!(object = %object, "the store's state.json is unreadable; following the rest")
                    }
                }
            }
            Some("node") => match data(cm, KEY_NODE).map(serde_json::from_str::<NodeRecord>) {
                Some(Ok(r)) => {
                    let nodes = self.relisting.as_mut().unwrap_or(&mut self.nodes);
                    nodes.insert(object, r);
                    self.plugin_changed = true;
                }
                _ => {
                    tracing::error!(object = %object, "a node's stored plugin report is unreadable; ignored")
                }
            },
            Some("runs") => match data(cm, KEY_RUNS).map(serde_json::from_str::<Vec<StoredRun>>) {
                Some(Ok(batch)) => self.runs.extend(batch.into_iter().map(|r| (r.seq, r))),
                _ => {
                    tracing::error!(object = %object, "a stored run segment is unreadable; its runs are lost to this replica's model")
                }
            },
            _ => {}
        }
    }

    /// An object was deleted. A run segment's runs stay until taken: the leader deletes a
    /// segment once a snapshot holds it, which may be before this replica learned it.
    pub fn delete(&mut self, cm: &ConfigMap) {
        if part(cm) == Some("node") {
            let object = cm.metadata.name.clone().unwrap_or_default();
            if self.nodes.remove(&object).is_some() {
                self.plugin_changed = true;
            }
        }
    }

    /// The runs seen after `seq`, in `seq` order; every run seen is forgotten.
    pub fn take_runs_after(&mut self, seq: u64) -> Vec<StoredRun> {
        let runs = std::mem::take(&mut self.runs);
        runs.into_values().filter(|r| r.seq > seq).collect()
    }

    /// The snapshot `<name>` names: the `seq` it includes and its chunk count.
    pub fn snapshot(&self) -> (u64, u32) {
        (self.meta.model_seq, self.meta.model_chunks)
    }

    /// The plugin configuration as stored, if it may have changed since last taken (a load
    /// builds it the same way: the highest generation of `<name>` and the node records).
    pub fn take_plugin_config(&mut self) -> Option<PluginConfig> {
        if !std::mem::take(&mut self.plugin_changed) || self.relisting.is_some() {
            self.plugin_changed |= self.relisting.is_some();
            return None;
        }
        let generation = self
            .nodes
            .values()
            .map(|r| r.generation)
            .fold(self.meta.generation, u64::max);
        Some(PluginConfig {
            generation,
            unified_resource_name: self.meta.unified_resource_name.clone(),
            nodes: self
                .nodes
                .values()
                .map(|r| (r.node.clone(), r.vendors.clone()))
                .collect(),
            images: self.meta.images.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> ConfigMapStore {
        // Building objects only: nothing is sent.
        let (client, _) = crate::fake_api::client(std::sync::Arc::new(|_, _, _| {
            (404, crate::fake_api::status(404, "NotFound"))
        }));
        ConfigMapStore::new(client, "ns", "kudos")
    }

    fn run(seq: u64) -> StoredRun {
        StoredRun {
            seq,
            ..crate::store::tests::run(&format!("r{seq}"))
        }
    }

    /// A snapshot written between a follower's read of `<name>` and its list of the parts:
    /// the load is refused (the caller reads again), not taken with runs and chunks missing.
    #[tokio::test]
    async fn a_read_only_load_across_a_snapshot_reads_again() {
        let gets = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = gets.clone();
        let (client, _) = crate::fake_api::client(std::sync::Arc::new(move |method, path, _| {
            match (method.as_str(), path) {
                ("GET", "/api/v1/namespaces/ns/configmaps/kudos") => {
                    // The second read sees the snapshot the leader wrote meanwhile.
                    let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let meta = Meta {
                        format: FORMAT,
                        next_seq: 11,
                        model_seq: if n == 0 { 0 } else { 10 },
                        model_chunks: if n == 0 { 0 } else { 1 },
                        ..Meta::default()
                    };
                    let cm = store().state_object(&meta).unwrap();
                    (200, serde_json::to_value(cm).unwrap())
                }
                ("GET", "/api/v1/namespaces/ns/configmaps") => (
                    200,
                    serde_json::json!({"kind": "ConfigMapList", "apiVersion": "v1", "metadata": {}, "items": []}),
                ),
                _ => (404, crate::fake_api::status(404, "NotFound")),
            }
        }));
        let s = ConfigMapStore::new(client, "ns", "kudos");
        let e = s.load_read_only().await.expect_err("refused");
        assert!(e.to_string().contains("reading again"), "{e}");
        // Once <name> holds still, the load is taken (the chunks it names are read as usual).
        gets.store(5, std::sync::atomic::Ordering::SeqCst);
        let e = s.load_read_only().await;
        assert!(
            e.is_ok_and(|l| l.model.is_none()),
            "the named snapshot's chunks are missing here: logged, as for the leader"
        );
    }

    #[tokio::test]
    async fn a_mirror_decodes_what_the_leader_writes() {
        let s = store();
        let mut m = StoreMirror::new("kudos");
        let json = serde_json::to_string(&[run(1), run(2)]).unwrap();
        m.apply(&s.segment_object(1, 2, json));
        m.delete(&s.segment_object(1, 2, String::new()));
        let json = serde_json::to_string(&[run(3)]).unwrap();
        m.apply(&s.segment_object(3, 3, json));
        // Deleted before it was taken: still taken, once, in order, after what was learned.
        let seqs: Vec<u64> = m.take_runs_after(1).iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [2, 3]);
        assert!(m.take_runs_after(0).is_empty());

        let entry = VendorEntry {
            vendor_resource_name: "nvidia.com/gpu".into(),
            devices: Vec::new(),
            plugin_version: "test".into(),
        };
        let vendors = BTreeMap::from([("nvidia".to_owned(), entry)]);
        m.apply(&s.node_object("n1", 4, &vendors).unwrap());
        let meta = Meta {
            generation: 3,
            model_seq: 7,
            model_chunks: 2,
            unified_resource_name: "kudos.dev/gpu".into(),
            ..Meta::default()
        };
        m.apply(&s.state_object(&meta).unwrap());
        let cfg = m.take_plugin_config().expect("changed");
        assert_eq!(cfg.generation, 4, "the highest of <name> and the records");
        assert_eq!(cfg.nodes.keys().collect::<Vec<_>>(), ["n1"]);
        assert!(m.take_plugin_config().is_none(), "nothing changed since");
        assert_eq!(m.snapshot(), (7, 2));

        // A relist without n1's record: n1 is gone once the relist is complete, not before.
        m.relist();
        m.apply(&s.state_object(&meta).unwrap());
        assert!(m.take_plugin_config().is_none());
        m.relisted();
        assert!(m.take_plugin_config().expect("relisted").nodes.is_empty());
        m.apply(&s.node_object("n2", 5, &vendors).unwrap());
        m.delete(&s.node_object("n2", 5, &vendors).unwrap());
        assert!(
            m.take_plugin_config()
                .expect("n2 came and went")
                .nodes
                .is_empty()
        );
    }
}
