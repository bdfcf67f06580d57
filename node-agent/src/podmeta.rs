//! Pod metadata the kubelet does not give us: UID, class, declared work, phase, and when each
//! container ran (its status' `startedAt`/`finishedAt`), which times a run from container start
//! rather than from device allocation (see [`crate::runs`]).
//!
//! Trust boundary: the class comes from the pod's `kudos.dev/class` label and the work from its
//! `kudos.dev/work` annotation, as stored by the API server — both written by whoever created
//! the pod, and the orchestrator decides how far to trust them. Nothing here is read from inside
//! a container. Without an API server (`--pod-metadata none`) every field is empty and runs are
//! still reported, unclassified.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kudos_api::labels;
use tracing::Instrument;

/// What we know about one pod besides its devices.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodMeta {
    /// `metadata.uid`.
    pub uid: String,
    /// `kudos.dev/class` label; empty when absent.
    pub class: String,
    /// `kudos.dev/work`, when present and a finite non-negative number.
    pub work: Option<f64>,
    /// `kudos.dev/progress`, when present and within 0..=1.
    pub progress: Option<f64>,
    /// The pod ended in failure (`status.phase == Failed`).
    pub failed: bool,
    /// The pod has ended (`Succeeded` or `Failed`).
    pub ended: bool,
    /// When each container ran, by container name (regular and init containers).
    pub containers: HashMap<String, ContainerTimes>,
}

/// When one container ran, from its status. The API's times are whole seconds (RFC 3339
/// without a fraction, truncated by the kubelet), so each lies up to 1 s before the event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContainerTimes {
    /// Start of the container's first attempt, where the status still shows it: the current
    /// state's `startedAt` (`running` or `terminated`) before any restart, the last
    /// termination's `startedAt` after exactly one; `None` before the start and after more.
    pub first_start_ms: Option<i64>,
    /// `state.terminated.finishedAt`: the current attempt has finished.
    pub finished_ms: Option<i64>,
    /// `restartCount`.
    pub restarts: i32,
}

/// A source of pod metadata keyed by namespace and name.
pub trait PodMetaSource: Send + Sync + 'static {
    /// Metadata of `namespace/name`, or `None` when unknown.
    fn get(&self, namespace: &str, name: &str) -> Option<PodMeta>;
}

/// No API server: nothing is known.
pub struct NoPodMeta;

impl PodMetaSource for NoPodMeta {
    fn get(&self, _: &str, _: &str) -> Option<PodMeta> {
        None
    }
}

/// An in-memory map, written by the watcher (or by tests), read by the sampling loop.
#[derive(Clone, Default)]
pub struct PodMetaStore(Arc<RwLock<HashMap<(String, String), PodMeta>>>);

impl PodMetaStore {
    /// Inserts or replaces one pod.
    pub fn apply(&self, namespace: &str, name: &str, meta: PodMeta) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert((namespace.to_owned(), name.to_owned()), meta);
    }
    /// Forgets one pod.
    pub fn delete(&self, namespace: &str, name: &str) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(namespace.to_owned(), name.to_owned()));
    }
    fn replace(&self, all: HashMap<(String, String), PodMeta>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = all;
    }
}

impl PodMetaSource for PodMetaStore {
    fn get(&self, namespace: &str, name: &str) -> Option<PodMeta> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }
}

fn parse_fraction(s: Option<&String>, max: f64) -> Option<f64> {
    s.and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0 && *v <= max)
}

/// A status time in Unix milliseconds; unset and pre-epoch (zero) times are `None`.
fn ms(t: Option<&Time>) -> Option<i64> {
    t.map(|t| t.0.as_millisecond()).filter(|ms| *ms > 0)
}

fn started(state: Option<&ContainerState>) -> Option<i64> {
    let s = state?;
    match (&s.running, &s.terminated) {
        (Some(r), _) => ms(r.started_at.as_ref()),
        (None, Some(t)) => ms(t.started_at.as_ref()),
        (None, None) => None,
    }
}

/// Extracts when a container ran from its status (see [`ContainerTimes`]).
pub fn times_of(cs: &ContainerStatus) -> ContainerTimes {
    let first_start_ms = match cs.restart_count {
        0 => started(cs.state.as_ref()),
        1 => started(cs.last_state.as_ref()),
        _ => None,
    };
    let finished_ms = cs
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| ms(t.finished_at.as_ref()));
    ContainerTimes {
        first_start_ms,
        finished_ms,
        restarts: cs.restart_count,
    }
}

/// Extracts what the agent needs from a pod object.
pub fn meta_of(pod: &Pod) -> PodMeta {
    let md = &pod.metadata;
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    PodMeta {
        uid: md.uid.clone().unwrap_or_default(),
        class: md
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::CLASS))
            .cloned()
            .unwrap_or_default(),
        work: parse_fraction(
            md.annotations.as_ref().and_then(|a| a.get(labels::WORK)),
            f64::MAX,
        ),
        progress: parse_fraction(
            md.annotations
                .as_ref()
                .and_then(|a| a.get(labels::PROGRESS)),
            1.0,
        ),
        failed: phase == "Failed",
        ended: phase == "Failed" || phase == "Succeeded",
        containers: pod
            .status
            .iter()
            .flat_map(|s| {
                let init = s.init_container_statuses.iter().flatten();
                init.chain(s.container_statuses.iter().flatten())
            })
            .map(|cs| (cs.name.clone(), times_of(cs)))
            .collect(),
    }
}

fn key_of(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Watches the pods bound to `node` (field selector `spec.nodeName=<node>`, so the agent's
/// RBAC and memory stay per-node) and keeps `store` current. Runs until the task is dropped;
/// watch errors are retried with the runtime's default backoff.
pub fn spawn_pod_watcher(
    client: kube::Client,
    node: String,
    store: PodMetaStore,
) -> tokio::task::JoinHandle<()> {
    let span = tracing::info_span!("pod_watcher", node = %node);
    tokio::spawn(
        async move {
            let api: kube::Api<Pod> = kube::Api::all(client);
            let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
            let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
            let mut init: HashMap<(String, String), PodMeta> = HashMap::new();
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(Event::Apply(p)) => {
                        let (ns, name) = key_of(&p);
                        store.apply(&ns, &name, meta_of(&p));
                    }
                    Ok(Event::Delete(p)) => {
                        let (ns, name) = key_of(&p);
                        store.delete(&ns, &name);
                    }
                    Ok(Event::Init) => init.clear(),
                    Ok(Event::InitApply(p)) => {
                        init.insert(key_of(&p), meta_of(&p));
                    }
                    Ok(Event::InitDone) => {
                        tracing::debug!(pods = init.len(), "pod list synced");
                        store.replace(std::mem::take(&mut init));
                    }
                    Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
                }
            }
        }
        .instrument(span),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use kube::api::ObjectMeta;
    use std::time::Duration;

    #[test]
    fn reads_class_work_and_phase_from_the_pod_object_only() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u-1".into()),
                labels: Some([(labels::CLASS.to_string(), "resnet50".to_string())].into()),
                annotations: Some(
                    [
                        (labels::WORK.to_string(), "90".to_string()),
                        (labels::PROGRESS.to_string(), "7".into()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            status: Some(PodStatus {
                phase: Some("Failed".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = meta_of(&pod);
        assert_eq!(m.uid, "u-1");
        assert_eq!(m.class, "resnet50");
        assert_eq!(m.work, Some(90.0));
        assert_eq!(m.progress, None, "progress outside 0..=1 is ignored");
        assert!(m.failed && m.ended);
        let bare = meta_of(&Pod::default());
        assert_eq!(bare.class, "");
        assert!(!bare.ended);
    }

    /// Container times from a pod as the API server serves it (RFC 3339, whole seconds).
    #[test]
    fn reads_when_each_container_ran_from_its_status() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "status": {
                "phase": "Running",
                "initContainerStatuses": [{
                    "name": "fetch", "image": "i", "imageID": "", "ready": false,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0,
                        "startedAt": "2024-01-01T00:00:01Z", "finishedAt": "2024-01-01T00:00:03Z"}}
                }],
                "containerStatuses": [
                    {"name": "pulling", "image": "i", "imageID": "", "ready": false,
                     "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}},
                    {"name": "main", "image": "i", "imageID": "", "ready": true,
                     "restartCount": 0,
                     "state": {"running": {"startedAt": "2024-01-01T00:00:05Z"}}},
                    {"name": "again", "image": "i", "imageID": "", "ready": true,
                     "restartCount": 1,
                     "state": {"running": {"startedAt": "2024-01-01T00:00:09Z"}},
                     "lastState": {"terminated": {"exitCode": 1,
                        "startedAt": "2024-01-01T00:00:04Z", "finishedAt": "2024-01-01T00:00:06Z"}}},
                    {"name": "often", "image": "i", "imageID": "", "ready": false,
                     "restartCount": 3,
                     "state": {"terminated": {"exitCode": 1,
                        "startedAt": "2024-01-01T00:00:20Z", "finishedAt": "2024-01-01T00:00:21Z"}}}
                ]
            }
        }))
        .expect("pod");
        let t0 = 1_704_067_200_000; // 2024-01-01T00:00:00Z
        let c = meta_of(&pod).containers;
        let at = |s: Option<i64>| s.map(|s| t0 + s * 1000);
        let want = |s, f, restarts| ContainerTimes {
            first_start_ms: at(s),
            finished_ms: at(f),
            restarts,
        };
        assert_eq!(c["fetch"], want(Some(1), Some(3), 0));
        assert_eq!(c["pulling"], want(None, None, 0));
        assert_eq!(c["main"], want(Some(5), None, 0));
        assert_eq!(
            c["again"],
            want(Some(4), None, 1),
            "the first attempt's start"
        );
        assert_eq!(
            c["often"],
            want(None, Some(21), 3),
            "the first start is not shown"
        );
        assert!(meta_of(&Pod::default()).containers.is_empty());
    }

    /// The watcher against an API-server stand-in: it lists only this node's pods (field
    /// selector) and fills the store from the list.
    #[tokio::test]
    async fn watcher_lists_only_this_nodes_pods_into_the_store() {
        use kube::client::Body;
        use std::sync::Mutex;
        let queries: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = queries.clone();
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "7"},
            "items": [{
                "metadata": {"name": "train", "namespace": "ml", "uid": "u-9",
                             "labels": {"kudos.dev/class": "bert"},
                             "annotations": {"kudos.dev/work": "12.5"}},
                "status": {"phase": "Running"}
            }]
        });
        let body = serde_json::to_vec(&pod).expect("json");
        let svc = tower::service_fn(move |req: http::Request<Body>| {
            let q = req.uri().query().unwrap_or("").to_owned();
            seen.lock().expect("lock").push(q.clone());
            let body = body.clone();
            async move {
                if q.contains("watch=true") {
                    // Hold the watch open: nothing changes during the test.
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                Ok::<_, std::convert::Infallible>(http::Response::new(Body::from(body)))
            }
        });
        let client = kube::Client::new(svc, "default");
        let store = PodMetaStore::default();
        let task = spawn_pod_watcher(client, "node-a".into(), store.clone());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while store.get("ml", "train").is_none() {
            assert!(std::time::Instant::now() < deadline, "pod never arrived");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        task.abort();
        let m = store.get("ml", "train").expect("pod");
        assert_eq!(
            (m.uid.as_str(), m.class.as_str(), m.work),
            ("u-9", "bert", Some(12.5))
        );
        let q = queries.lock().expect("lock").clone();
        assert!(!q.is_empty());
        assert!(
            q.iter()
                .all(|q| q.contains("fieldSelector=spec.nodeName%3Dnode-a")),
            "every request is limited to this node: {q:?}"
        );
    }
}
