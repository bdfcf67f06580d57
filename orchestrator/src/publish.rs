//! What Kudos knows, as objects `kubectl get` shows.
//!
//! - `KudosNode` (`kubectl get kudosnodes`, short `kn`): one per node with accelerators: its
//!   vendor, model, devices, free devices and health as Kudos ranks it.
//! - `KudosClass` (`kubectl get kudosclasses`, short `kc`): one per learned class: runs, the
//!   fastest GPU model and its predicted seconds per unit of work, and the whole ranking in
//!   `status.ranking` (`-o yaml`).
//!
//! Both are `kudos.dev/v1alpha1`, cluster-scoped, defined by the chart's CRDs and written by
//! the orchestrator alone (server-side apply, field manager `kudos-orchestrator`, label
//! `app.kubernetes.io/managed-by=kudos-orchestrator`). A periodic pass applies what changed
//! and deletes objects whose node or class is gone; the first pass also prunes what an earlier
//! run left. They are a read-only window: the orchestrator never reads them back, so editing
//! one changes nothing (the next pass that sees a change puts it back).
//!
//! Nothing that changes by itself is published (no heartbeat age): an object is written only
//! when what Kudos knows changed (free devices, health, learned speeds), coalesced per pass.
//! Bounded: at most [`MAX_CLASSES`] classes (most runs first) and [`MAX_MODELS`] models in a
//! ranking; nodes are bounded by the cluster.

use crate::index::SharedIndex;
use crate::status::learned_speeds;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// Classes published at most.
pub const MAX_CLASSES: usize = 500;
/// GPU models in one class's ranking at most.
pub const MAX_MODELS: usize = 40;
/// The API group and version of both kinds.
pub const API_VERSION: &str = "kudos.dev/v1alpha1";
const MANAGER: &str = "kudos-orchestrator";
const MANAGED_BY: &str = "app.kubernetes.io/managed-by=kudos-orchestrator";

/// The two kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `KudosNode`.
    Node,
    /// `KudosClass`.
    Class,
}

impl Kind {
    fn resource(self) -> ApiResource {
        let (kind, plural) = match self {
            Kind::Node => ("KudosNode", "kudosnodes"),
            Kind::Class => ("KudosClass", "kudosclasses"),
        };
        ApiResource {
            group: "kudos.dev".into(),
            version: "v1alpha1".into(),
            api_version: API_VERSION.into(),
            kind: kind.into(),
            plural: plural.into(),
        }
    }
}

/// An object name for class `class`: class names are label values (upper case and `_`
/// allowed), object names are lowercase DNS subdomains. A name that had to change gets a hash
/// of the original, so two classes never share one.
pub fn class_object_name(class: &str) -> String {
    let mut name: String = class
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '.' | '-') => c,
            _ => '-',
        })
        .collect();
    name = name
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned();
    if name != class || name.is_empty() {
        let hash = crate::kobj::seed_of(class);
        if !name.is_empty() {
            name.push('-');
        }
        name.push_str(&format!("{:08x}", hash as u32));
    }
    name
}

fn object(kind: Kind, name: &str, status: Value) -> Value {
    let r = kind.resource();
    json!({
        "apiVersion": API_VERSION,
        "kind": r.kind,
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": MANAGER}},
        "status": status,
    })
}

/// The objects the index describes now, by kind and name.
pub fn desired(index: &SharedIndex, now: f64) -> BTreeMap<(Kind, String), Value> {
    let (view, model) = {
        let i = index.read();
        (i.view(now), i.model())
    };
    let mut out = BTreeMap::new();
    for n in &view.nodes {
        let status = json!({
            "vendor": n.profile.vendor,
            "model": n.profile.model,
            "devices": n.profile.count,
            "free": n.free_devices,
            "memoryBytes": n.profile.memory_bytes,
            "health": match &n.health {
                kudos_scheduler_core::NodeHealth::Healthy => "Healthy".to_string(),
                other => format!("{other:?}"),
            },
        });
        out.insert(
            (Kind::Node, n.name.to_string()),
            object(Kind::Node, &n.name, status),
        );
    }
    let mut classes = learned_speeds(&view, &model, usize::MAX, MAX_MODELS);
    classes.sort_by(|a, b| b.runs.cmp(&a.runs).then_with(|| a.class.cmp(&b.class)));
    for c in classes.into_iter().take(MAX_CLASSES) {
        let mut cells = c.cells;
        cells.sort_by(|a, b| a.1.seconds.total_cmp(&b.1.seconds));
        let ranking: Vec<Value> = cells
            .iter()
            .map(|(m, p)| {
                json!({
                    "model": m,
                    "secondsPerUnit": round4(p.seconds),
                    "uncertaintyFactor": round4(p.uncertainty_log_sd.exp()),
                    "source": crate::status::describe_source(&p.source),
                })
            })
            .collect();
        let status = json!({
            "class": c.class,
            "runs": c.runs,
            "fastestModel": cells.first().map(|(m, _)| m.clone()),
            "fastestSecondsPerUnit": cells.first().map(|(_, p)| round4(p.seconds)),
            "nextModel": cells.get(1).map(|(m, _)| m.clone()),
            "ranking": ranking,
        });
        let name = class_object_name(&c.class);
        out.insert(
            (Kind::Class, name.clone()),
            object(Kind::Class, &name, status),
        );
    }
    out
}

/// Four significant decimals: an unchanged model does not rewrite objects over float noise.
fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// Keeps the objects in step with the index.
pub struct Publisher {
    client: kube::Client,
    index: SharedIndex,
    applied: HashMap<(Kind, String), Value>,
    pruned_leftovers: bool,
}

impl Publisher {
    /// Publishes `index` through `client`.
    pub fn new(client: kube::Client, index: SharedIndex) -> Self {
        Self {
            client,
            index,
            applied: HashMap::new(),
            pruned_leftovers: false,
        }
    }

    fn api(&self, kind: Kind) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &kind.resource())
    }

    /// One pass: applies what changed, deletes what is gone. Counts of (applied, deleted).
    pub async fn pass(&mut self, now: f64) -> Result<(usize, usize), kube::Error> {
        let want = desired(&self.index, now);
        let mut applied = 0;
        for ((kind, name), obj) in &want {
            if self.applied.get(&(*kind, name.clone())) == Some(obj) {
                continue;
            }
            let patch: DynamicObject =
                serde_json::from_value(obj.clone()).map_err(kube::Error::SerdeError)?;
            self.api(*kind)
                .patch(
                    name,
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(&patch),
                )
                .await?;
            self.applied.insert((*kind, name.clone()), obj.clone());
            applied += 1;
        }
        let mut gone: Vec<(Kind, String)> = self
            .applied
            .keys()
            .filter(|k| !want.contains_key(k))
            .cloned()
            .collect();
        if !self.pruned_leftovers {
            for kind in [Kind::Node, Kind::Class] {
                let listed = self
                    .api(kind)
                    .list_metadata(&ListParams::default().labels(MANAGED_BY))
                    .await?;
                gone.extend(
                    listed
                        .items
                        .into_iter()
                        .filter_map(|o| o.metadata.name)
                        .map(|n| (kind, n))
                        .filter(|k| !want.contains_key(k) && !self.applied.contains_key(k)),
                );
            }
            self.pruned_leftovers = true;
        }
        for (kind, name) in &gone {
            match self.api(*kind).delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
            self.applied.remove(&(*kind, name.clone()));
        }
        Ok((applied, gone.len()))
    }

    /// Runs a pass every `every` until the process ends; a failing pass is logged (once per
    /// streak) and retried at the next.
    pub async fn run(mut self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            match self.pass(crate::extender::unix_now()).await {
                Ok((applied, deleted)) => {
                    if failing || applied + deleted > 0 {
                        tracing::debug!(applied, deleted, "KudosNode/KudosClass objects updated");
                    }
                    failing = false;
                }
                Err(e) if !failing => {
                    failing = true;
                    let hint = match &e {
                        kube::Error::Api(a) if a.code == 404 => {
                            " (are the chart's CRDs kudosnodes.kudos.dev and kudosclasses.kudos.dev installed?)"
                        }
                        _ => "",
                    };
                    tracing::warn!(error = %e, "publishing KudosNode/KudosClass objects failed{hint}; retrying every pass");
                }
                Err(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names_become_object_names_without_collisions() {
        assert_eq!(class_object_name("resnet50"), "resnet50");
        assert_eq!(class_object_name("llm.7b-v2"), "llm.7b-v2");
        let a = class_object_name("ResNet_50");
        let b = class_object_name("resnet-50");
        assert!(a.starts_with("resnet-50-"), "{a}");
        assert_eq!(b, "resnet-50");
        assert_ne!(a, b);
        let odd = class_object_name("__");
        assert_eq!(odd.len(), 8, "{odd}");
        assert!(odd.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
