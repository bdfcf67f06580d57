//! The first format: everything in `<name>`, read only to convert it.

use super::*;

pub(super) struct Data {
    pub plugin: Option<PluginConfig>,
    pub model: Option<String>,
    pub model_seq: u64,
    pub runs: Vec<StoredRun>,
    pub ids: Vec<String>,
    pub next_seq: u64,
}

pub(super) fn is_legacy(cm: &ConfigMap) -> bool {
    cm.data.as_ref().is_some_and(|d| {
        !d.contains_key(KEY_STATE)
            && ["plugin-config.json", "model.json", "runs.json", "next-seq"]
                .iter()
                .any(|k| d.contains_key(*k))
    })
}

pub(super) fn decode(cm: &ConfigMap) -> Result<Data, StoreError> {
    let get = |k: &str| data(cm, k);
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
