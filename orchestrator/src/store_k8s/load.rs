//! Reading the store back: every part listed, what a crash left behind set aside, the runs
//! after the snapshot returned for replay; and the one-time conversion of the first format.

use super::*;

impl ConfigMapStore {
    /// Reads the state without writing anything: what a follower replica does, since the
    /// leader alone converts the first format and deletes what a snapshot made obsolete.
    pub async fn load_read_only(&self) -> Result<Loaded, StoreError> {
        Ok(self.load_inner(Access::Read).await?.1)
    }

    pub(super) async fn load_inner(&self, access: Access) -> Result<(Inner, Loaded), StoreError> {
        let meta_cm = self.read_meta().await?;
        if let Some(cm) = &meta_cm
            && legacy::is_legacy(cm)
        {
            if access == Access::Read {
                return Err(StoreError::Conflict(
                    "the state is in the first (single-ConfigMap) format; the leader converts it when it starts".into(),
                ));
            }
            self.migrate(cm).await?;
            return Box::pin(self.load_inner(access)).await;
        }
        let rv = meta_cm
            .as_ref()
            .and_then(|c| c.metadata.resource_version.clone());
        let mut meta: Meta = match meta_cm.as_ref().and_then(|c| data(c, KEY_STATE)) {
            Some(s) => serde_json::from_str(s)?,
            None => Meta::default(),
        };
        // Listed even without `<name>`: if only it was deleted, the runs still stored are
        // replayed and their seqs are not reused.
        let parts = self.list_parts().await?;

        let mut nodes = BTreeMap::new();
        let mut generation = meta.generation;
        let mut chunks: BTreeMap<u64, &str> = BTreeMap::new();
        let mut obsolete = Vec::new();
        let mut segments = HashSet::new();
        let mut runs: Vec<StoredRun> = Vec::new();
        let mut ids = RecentIds::default();
        let mut max_seq = 0;
        let mut segment_ids: Vec<(u64, String)> = Vec::new();
        for cm in &parts {
            let name = cm.metadata.name.clone().unwrap_or_default();
            match part(cm) {
                Some("node") => match data(cm, KEY_NODE).map(serde_json::from_str::<NodeRecord>) {
                    Some(Ok(r)) => {
                        generation = generation.max(r.generation);
                        nodes.insert(r.node, r.vendors);
                    }
                    _ => {
                        tracing::error!(object = %name, "a node's stored plugin report is unreadable; ignored until its plugin reports again")
                    }
                },
                Some("model") => {
                    let seq = annotation(cm, ANN_SEQ).unwrap_or(0);
                    if seq == meta.model_seq && seq > 0 {
                        if let (Some(i), Some(text)) =
                            (annotation(cm, ANN_CHUNK), data(cm, KEY_CHUNK))
                        {
                            chunks.insert(i, text);
                        }
                    } else if seq < meta.model_seq {
                        obsolete.push(name);
                    }
                    // A newer seq: a snapshot being written now, or one a crash cut short;
                    // the next snapshot's clean-up removes it.
                }
                Some("runs") => {
                    let parsed = data(cm, KEY_RUNS).map(serde_json::from_str::<Vec<StoredRun>>);
                    let Some(Ok(batch)) = parsed else {
                        tracing::error!(object = %name, "a stored run segment is unreadable; its runs are lost to the model");
                        continue;
                    };
                    let last = batch.last().map_or(0, |r| r.seq);
                    max_seq = max_seq.max(last);
                    for r in &batch {
                        segment_ids.push((r.seq, r.report_id.clone()));
                    }
                    segments.insert(name.clone());
                    if last <= meta.model_seq {
                        obsolete.push(name);
                    } else {
                        runs.extend(batch.into_iter().filter(|r| r.seq > meta.model_seq));
                    }
                }
                Some("ids") => match data(cm, KEY_IDS).map(serde_json::from_str::<Vec<String>>) {
                    Some(Ok(list)) => list.into_iter().for_each(|id| ids.insert(id)),
                    _ => {
                        tracing::error!(object = %name, "stored report IDs are unreadable; a re-sent old report may be learned twice")
                    }
                },
                _ => {}
            }
        }
        segment_ids.sort();
        for (_, id) in segment_ids {
            ids.insert(id);
        }
        runs.sort_by_key(|r| r.seq);

        if access == Access::Read {
            // `<name>` and the parts are two reads. The leader writes a snapshot's chunks, then
            // `<name>`, then deletes what the snapshot made obsolete: a snapshot written between
            // the two reads could leave `<name>` naming chunks and runs that are gone. The
            // leader's own load cannot meet this (it is the one writer); a follower reads again.
            // With `<name>` unchanged, the chunks it names are there unless damaged (the leader
            // deletes them only after naming newer ones).
            let again = self.read_meta().await?;
            let now: Option<Meta> = again
                .as_ref()
                .and_then(|c| data(c, KEY_STATE))
                .and_then(|s| serde_json::from_str(s).ok());
            if now.is_some_and(|m| m.model_seq != meta.model_seq) {
                return Err(StoreError::Conflict(
                    "a snapshot was written while the state was read; reading again".into(),
                ));
            }
        }
        let model = if meta.model_seq == 0 {
            None
        } else if chunks.len() == meta.model_chunks as usize
            && chunks.keys().copied().eq(0..u64::from(meta.model_chunks))
        {
            Some((
                chunks.values().copied().collect::<String>().into_bytes(),
                meta.model_seq,
            ))
        } else {
            tracing::error!(
                snapshot_seq = meta.model_seq,
                chunks_expected = meta.model_chunks,
                chunks_found = chunks.len(),
                "the model snapshot is incomplete (its ConfigMaps were deleted?); starting from the runs still stored"
            );
            None
        };
        // Saturating: a tampered object's seq at u64::MAX must not wrap the counter to 0.
        meta.next_seq = meta
            .next_seq
            .max(max_seq.saturating_add(1))
            .max(meta.model_seq.saturating_add(1))
            .max(1);
        if !obsolete.is_empty() && access == Access::Write {
            tracing::info!(
                objects = obsolete.len(),
                "deleting state objects a snapshot made obsolete"
            );
            // Their report IDs first, or a re-sent report would be learned twice.
            self.put(&self.ids_object(&ids)?).await?;
            self.delete_all(obsolete).await;
        }
        let plugin_config = PluginConfig {
            generation,
            unified_resource_name: meta.unified_resource_name.clone(),
            nodes: nodes.clone(),
            images: meta.images.clone(),
        };
        let loaded = Loaded {
            plugin_config,
            model,
            runs_to_replay: runs,
            known_reports: ids.len() as u64,
        };
        let inner = Inner {
            meta,
            rv,
            nodes,
            ids,
            segments,
            next_model_write: None,
        };
        Ok((inner, loaded))
    }

    /// Writes the first format's content in this one, then replaces `<name>` (dropping the old
    /// keys) only once everything else is written: a crash part-way converts again.
    async fn migrate(&self, cm: &ConfigMap) -> Result<(), StoreError> {
        let old = legacy::decode(cm)?;
        tracing::info!(
            runs = old.runs.len(),
            report_ids = old.ids.len(),
            "converting the single-ConfigMap state to the sharded format"
        );
        let plugin = old.plugin.unwrap_or_default();
        let mut objects: Vec<ConfigMap> = Vec::new();
        for (node, vendors) in &plugin.nodes {
            objects.push(self.node_object(node, plugin.generation, vendors)?);
        }
        let runs: Vec<StoredRun> = old
            .runs
            .into_iter()
            .filter(|r| r.seq > old.model_seq)
            .collect();
        for (first, last, json) in pack_runs(&runs)? {
            objects.push(self.segment_object(first, last, json));
        }
        let chunk_count = match &old.model {
            Some(text) => {
                let chunks = split_utf8(text, OBJECT_BYTES);
                let n = chunks.len() as u32;
                for (i, c) in chunks.into_iter().enumerate() {
                    objects.push(self.chunk_object(old.model_seq, i as u64, c.to_owned()));
                }
                n
            }
            None => 0,
        };
        objects.push(self.object(
            format!("{}-report-ids", self.name),
            "ids",
            KEY_IDS,
            serde_json::to_string(&old.ids)?,
            &[],
        ));
        self.put_all(objects).await?;
        let meta = Meta {
            format: FORMAT,
            next_seq: old.next_seq.max(1),
            model_seq: if old.model.is_some() {
                old.model_seq
            } else {
                0
            },
            model_chunks: chunk_count,
            generation: plugin.generation,
            unified_resource_name: plugin.unified_resource_name,
            images: plugin.images,
        };
        let mut new = self.state_object(&meta)?;
        new.metadata.resource_version = cm.metadata.resource_version.clone();
        self.api
            .replace(&self.name, &PostParams::default(), &new)
            .await
            .map_err(kube_err)?;
        Ok(())
    }
}
