//! One Kubernetes Event per GPU pod saying why Kudos ranked its nodes as it did, so
//! `kubectl describe pod` answers "why there?" with a line and a pointer to `/explain`, for
//! the pods Kudos does not bind itself. Where kube-scheduler calls the extender's `bind`, the
//! same line rides on the Binding as the pod's `kudos.dev/placement` annotation, which costs no
//! API write of its own (an Event cost the API server and etcd 1.6 ms of CPU per pod at 1,213
//! nodes): after the first such bind no more Events are sent.
//!
//! The extender only hands the event to a bounded channel (`try_send`, never awaited): a slow
//! or refusing API server costs scheduling nothing, and a full channel drops the event
//! (counted in the log at debug). Each pod gets one event, for its first ranking by
//! `prioritize` (the ranking kube-scheduler uses), or by `filter` when one node passes it
//! (kube-scheduler then skips scoring); pods already evented are remembered by UID, bounded
//! like the explain cache.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

use crate::extender::Explained;
use crate::fifo::FifoMap;
use crate::kobj::PodFacts;

/// Events waiting to be published at most; more are dropped.
const QUEUE: usize = 1024;
/// Pod UIDs remembered as evented.
const REMEMBERED: usize = 65_536;

/// Publishes pod events in the background (see the module docs).
pub struct PodEvents {
    tx: mpsc::Sender<(ObjectReference, Event)>,
    seen: Mutex<FifoMap<String, ()>>,
    /// Set at the first bind through the extender: pods are explained by their annotation.
    by_bind: AtomicBool,
}

/// The line explaining a placement, as an Event's note or the `kudos.dev/placement`
/// annotation `bind` sets: the node ranked first, its prediction and what it rests on, the
/// runner-up, and where the full ranking is. Kubernetes caps Event notes at 1 KiB.
pub fn note(namespace: &str, pod: &str, e: &Explained) -> String {
    let r = &e.ranking;
    let pred = |i: usize| {
        r.entry(i).map(|x| {
            let p = x.prediction.as_ref();
            (
                x.node.to_string(),
                p.map_or("no prediction (no class)".into(), |p| {
                    format!(
                        "predicted {:.1} s ({})",
                        p.seconds,
                        crate::status::describe_source(&p.source)
                    )
                }),
            )
        })
    };
    let mut s = match pred(0) {
        Some((node, p)) => format!(
            "Kudos ranked {node} first of {} for class {}: {p}",
            r.len(),
            r.class().unwrap_or("-")
        ),
        None => "Kudos could rank no node".to_string(),
    };
    if let Some((node, p)) = pred(1) {
        s.push_str(&format!("; next {node}: {p}"));
    }
    s.push_str(&format!("; details: /explain/{namespace}/{pod}"));
    s.chars().take(1000).collect()
}

impl PodEvents {
    /// Starts the publisher on the current runtime, reporting as `kudos-orchestrator`.
    pub fn spawn(client: kube::Client) -> Arc<Self> {
        let (tx, mut rx) = mpsc::channel::<(ObjectReference, Event)>(QUEUE);
        let recorder = Recorder::new(client, Reporter::from("kudos-orchestrator"));
        tokio::spawn(async move {
            while let Some((pod, ev)) = rx.recv().await {
                if let Err(e) = recorder.publish(&ev, &pod).await {
                    tracing::debug!(pod = ?pod.name, error = %e, "pod event not published");
                }
            }
        });
        Arc::new(Self {
            tx,
            seen: Mutex::new(FifoMap::new(REMEMBERED)),
            by_bind: AtomicBool::new(false),
        })
    }

    /// Kudos binds pods itself, and each Binding carries its explanation: Events stop.
    pub fn explained_by_bind(&self) {
        if !self.by_bind.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "pods are bound through the extender: each pod's placement is explained by its kudos.dev/placement annotation, no more KudosRanked events"
            );
        }
    }

    /// Queues the ranking event of `pod`, once per pod.
    pub fn ranked(&self, pod: &PodFacts, e: &Explained) {
        if pod.uid.is_empty() || self.by_bind.load(Ordering::Relaxed) {
            return;
        }
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if seen.get(&pod.uid).is_some() {
                return;
            }
            seen.insert(pod.uid.clone(), ());
        }
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.name.clone()),
            uid: Some(pod.uid.clone()),
            ..ObjectReference::default()
        };
        let ev = Event {
            type_: EventType::Normal,
            reason: "KudosRanked".into(),
            note: Some(note(&pod.namespace, &pod.name, e)),
            action: "Prioritize".into(),
            secondary: None,
        };
        if self.tx.try_send((reference, ev)).is_err() {
            tracing::debug!(pod = %pod.name, "pod event queue full; event dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kudos_scheduler_core::{Prediction, PredictionSource, RankEntry, Ranking, Review};

    fn entry(node: &str, seconds: f64, rank: usize) -> RankEntry {
        RankEntry {
            node: node.into(),
            prediction: Some(Prediction {
                seconds,
                uncertainty_log_sd: 0.1,
                source: PredictionSource::OwnHistory { runs: 4 },
            }),
            review: Some(Review::Good),
            good_rate: 0.9,
            score: 10,
            default_score: 100.0,
            merged_score: 300.0,
            rank,
            candidate: rank - 1,
        }
    }

    #[test]
    fn note_names_the_first_node_its_evidence_the_next_and_explain() {
        let e = Explained {
            verb: "prioritize",
            pod_uid: String::new(),
            computed_at: 0.0,
            seed: 1,
            ranking: Ranking {
                namespace: "ml".into(),
                pod: "train".into(),
                class: Some("resnet".into()),
                threshold_seconds: Some(10.0),
                entries: vec![entry("gpu-a", 2.0, 1), entry("gpu-b", 6.0, 2)],
                rejected: vec![],
            }
            .into(),
            gang_reservation: None,
            unknown_nodes: vec![],
            unknown_nodes_total: 0,
        };
        assert_eq!(
            note("ml", "train", &e),
            "Kudos ranked gpu-a first of 2 for class resnet: predicted 2.0 s (4 runs on the node); \
             next gpu-b: predicted 6.0 s (4 runs on the node); details: /explain/ml/train"
        );
    }
}
