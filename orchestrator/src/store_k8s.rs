//! The in-cluster store: the same state as [`crate::store::FileStore`] in one ConfigMap, so it
//! survives the loss of the orchestrator's pod and a standby replica can take over.
//!
//! Every write is a read-modify-replace guarded by `resourceVersion` (retried on Conflict), so
//! a write that returned is in etcd. Keys: `plugin-config.json`, `model.json` + `model-seq`,
//! `runs.json` (runs not yet in the snapshot, pruned by `save_model`), `report-ids.json`
//! and `next-seq`. A ConfigMap holds at most 1 MiB, so only the last [`MAX_REPORT_IDS`]
//! report IDs are kept for de-duplication (agents re-send only unacknowledged, recent reports)
//! and the snapshot interval should be short enough to keep `runs.json` small.

use crate::state::{PluginConfig, StoredRun};
use crate::store::{Appended, Loaded, Store, StoreError};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::{BTreeMap, VecDeque};

/// Report IDs remembered for de-duplication.
pub const MAX_REPORT_IDS: usize = 5_000;
const RETRIES: usize = 8;

/// See the module docs.
pub struct ConfigMapStore {
    api: kube::Api<ConfigMap>,
    name: String,
}

#[derive(Default)]
struct Data {
    plugin: Option<PluginConfig>,
    model: Option<String>,
    model_seq: u64,
    runs: Vec<StoredRun>,
    ids: VecDeque<String>,
    next_seq: u64,
}

fn decode(cm: &ConfigMap) -> Result<Data, StoreError> {
    let empty = BTreeMap::new();
    let d = cm.data.as_ref().unwrap_or(&empty);
    let get = |k: &str| d.get(k).map(String::as_str);
    Ok(Data {
        plugin: get("plugin-config.json")
            .map(serde_json::from_str)
            .transpose()?,
        model: get("model.json").map(str::to_owned),
        model_seq: get("model-seq")
            .map(serde_json::from_str)
            .transpose()?
            .unwrap_or(0),
        runs: get("runs.json")
            .map(serde_json::from_str)
            .transpose()?
            .unwrap_or_default(),
        ids: get("report-ids.json")
            .map(serde_json::from_str)
            .transpose()?
            .unwrap_or_default(),
        next_seq: get("next-seq")
            .map(serde_json::from_str)
            .transpose()?
            .unwrap_or(1),
    })
}

fn encode(d: &Data) -> Result<BTreeMap<String, String>, StoreError> {
    let mut m = BTreeMap::new();
    if let Some(p) = &d.plugin {
        m.insert("plugin-config.json".into(), serde_json::to_string(p)?);
    }
    if let Some(model) = &d.model {
        m.insert("model.json".into(), model.clone());
    }
    m.insert("model-seq".into(), d.model_seq.to_string());
    m.insert("runs.json".into(), serde_json::to_string(&d.runs)?);
    m.insert("report-ids.json".into(), serde_json::to_string(&d.ids)?);
    m.insert("next-seq".into(), d.next_seq.to_string());
    Ok(m)
}

impl ConfigMapStore {
    /// Uses ConfigMap `namespace/name`, creating it on first write.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: kube::Api::namespaced(client, namespace),
            name: name.to_owned(),
        }
    }

    async fn read(&self) -> Result<Option<ConfigMap>, StoreError> {
        self.api
            .get_opt(&self.name)
            .await
            .map_err(|e| StoreError::Kube(Box::new(e)))
    }

    /// Applies `f` to the current data and writes it back; retries on Conflict.
    async fn update<T>(&self, mut f: impl FnMut(&mut Data) -> T) -> Result<T, StoreError> {
        for _ in 0..RETRIES {
            let current = self.read().await?;
            let mut data = match &current {
                Some(cm) => decode(cm)?,
                None => Data {
                    next_seq: 1,
                    ..Default::default()
                },
            };
            let out = f(&mut data);
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    resource_version: current
                        .as_ref()
                        .and_then(|c| c.metadata.resource_version.clone()),
                    ..Default::default()
                },
                data: Some(encode(&data)?),
                ..Default::default()
            };
            let pp = kube::api::PostParams::default();
            let r = match current {
                Some(_) => self.api.replace(&self.name, &pp, &cm).await,
                None => self.api.create(&pp, &cm).await,
            };
            match r {
                Ok(_) => return Ok(out),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(StoreError::Kube(Box::new(e))),
            }
        }
        Err(StoreError::Conflict(format!(
            "ConfigMap {} kept changing; gave up after {RETRIES} attempts",
            self.name
        )))
    }
}

impl Store for ConfigMapStore {
    fn load(&self) -> BoxFuture<'_, Result<Loaded, StoreError>> {
        Box::pin(async move {
            let Some(cm) = self.read().await? else {
                return Ok(Loaded::default());
            };
            let d = decode(&cm)?;
            Ok(Loaded {
                plugin_config: d.plugin.unwrap_or_default(),
                model: d.model.map(|m| (m.into_bytes(), d.model_seq)),
                runs_to_replay: d.runs.into_iter().filter(|r| r.seq > d.model_seq).collect(),
                known_reports: d.ids.len() as u64,
            })
        })
    }

    fn save_plugin_config(&self, cfg: PluginConfig) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move { self.update(|d| d.plugin = Some(cfg.clone())).await })
    }

    fn append_run(&self, run: StoredRun) -> BoxFuture<'_, Result<Appended, StoreError>> {
        Box::pin(async move {
            self.update(|d| {
                if d.ids.contains(&run.report_id) {
                    return Appended::Duplicate;
                }
                let seq = d.next_seq.max(1);
                d.next_seq = seq + 1;
                d.ids.push_back(run.report_id.clone());
                while d.ids.len() > MAX_REPORT_IDS {
                    d.ids.pop_front();
                }
                d.runs.push(StoredRun { seq, ..run.clone() });
                Appended::Stored(seq)
            })
            .await
        })
    }

    fn save_model(
        &self,
        model: Vec<u8>,
        applied_seq: u64,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let text = String::from_utf8(model).map_err(|e| {
                StoreError::Json(serde_json::Error::io(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    e,
                )))
            })?;
            self.update(|d| {
                // Never go back: a replica that lost the leader Lease may still be saving an
                // older snapshot while the new leader saved a newer one and pruned the runs
                // between the two.
                if d.model_seq > applied_seq {
                    return;
                }
                d.model = Some(text.clone());
                d.model_seq = applied_seq;
                d.runs.retain(|r| r.seq > applied_seq);
            })
            .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::RunOutcome;
    use std::sync::{Arc, Mutex};

    /// A fake API server holding one ConfigMap with resourceVersion checks; the first replace
    /// conflicts, as when another replica wrote in between.
    fn api() -> (kube::Client, Arc<Mutex<Option<serde_json::Value>>>) {
        let cm: Arc<Mutex<Option<serde_json::Value>>> = Arc::default();
        let conflicts = Arc::new(Mutex::new(1u32));
        let state = cm.clone();
        let (client, _) = crate::fake_api::client(Arc::new(move |method, path, body| {
            let base = "/api/v1/namespaces/ns/configmaps";
            let mut cur = state.lock().unwrap();
            match (method.as_str(), path) {
                ("GET", p) if p == format!("{base}/st") => match cur.as_ref() {
                    Some(v) => (200, v.clone()),
                    None => (404, crate::fake_api::status(404, "NotFound")),
                },
                ("POST", p) if p == base => {
                    let mut v = body.clone();
                    v["metadata"]["resourceVersion"] = "1".into();
                    *cur = Some(v.clone());
                    (201, v)
                }
                ("PUT", p) if p == format!("{base}/st") => {
                    let mut left = conflicts.lock().unwrap();
                    let rv = cur
                        .as_ref()
                        .and_then(|c| c["metadata"]["resourceVersion"].as_str().map(str::to_owned));
                    if *left > 0 || body["metadata"]["resourceVersion"].as_str() != rv.as_deref() {
                        *left = (*left).saturating_sub(1);
                        return (409, crate::fake_api::status(409, "Conflict"));
                    }
                    let mut v = body.clone();
                    let next = rv.and_then(|r| r.parse::<u64>().ok()).unwrap_or(0) + 1;
                    v["metadata"]["resourceVersion"] = next.to_string().into();
                    *cur = Some(v.clone());
                    (200, v)
                }
                other => panic!("unexpected {other:?}"),
            }
        }));
        (client, cm)
    }

    fn run(id: &str) -> StoredRun {
        StoredRun {
            seq: 0,
            report_id: id.into(),
            run_id: id.into(),
            node: "n1".into(),
            pod_namespace: "d".into(),
            pod_name: "p".into(),
            class: "c".into(),
            device_ids: vec![],
            outcome: RunOutcome::Completed,
            start: 1.0,
            end: 2.0,
            gpu_busy_seconds: 1.0,
            progress: None,
            work_done: None,
            profile: None,
            received_at: 3.0,
        }
    }

    #[tokio::test]
    async fn appends_dedup_survive_conflicts_and_snapshots_prune() {
        let (client, cm) = api();
        let s = ConfigMapStore::new(client, "ns", "st");
        assert_eq!(s.load().await.unwrap().runs_to_replay.len(), 0);
        assert_eq!(s.append_run(run("a")).await.unwrap(), Appended::Stored(1));
        assert_eq!(
            s.append_run(run("b")).await.unwrap(),
            Appended::Stored(2),
            "retried after a conflict"
        );
        assert_eq!(s.append_run(run("a")).await.unwrap(), Appended::Duplicate);
        s.save_model(b"{\"m\":1}".to_vec(), 1).await.unwrap();
        let cfg = PluginConfig {
            generation: 3,
            ..Default::default()
        };
        s.save_plugin_config(cfg).await.unwrap();
        let l = s.load().await.unwrap();
        assert_eq!(l.plugin_config.generation, 3);
        assert_eq!(l.model, Some((b"{\"m\":1}".to_vec(), 1)));
        assert_eq!(
            l.runs_to_replay.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![2]
        );
        assert_eq!(l.known_reports, 2);
        assert!(
            cm.lock().unwrap().as_ref().unwrap()["data"]["runs.json"]
                .as_str()
                .unwrap()
                .contains("\"b\"")
        );
    }
}
