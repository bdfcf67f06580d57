//! The mutating admission webhook that opts GPU pods in to Kudos' own scheduler.
//!
//! On a managed control plane Kudos cannot reconfigure the cluster's scheduler, so it runs a
//! second one (`schedulerName: kudos`). Pods written for the default scheduler would have to
//! name it; this webhook does that for them: a pod that requests the unified resource in any
//! container and leaves `schedulerName` at `default-scheduler` gets `schedulerName` set to
//! Kudos'. Nothing else is touched, and a pod that names any other scheduler is left alone.
//!
//! The API server calls `POST /mutate/pods` with an `admission.k8s.io/v1` AdmissionReview
//! (`failurePolicy: Ignore` in the chart: if Kudos is down, pods are admitted unchanged).
//! The route answers anyone who reaches it (the API server presents no client certificate by
//! default): its answer is a patch for the object sent, with no side effect.

use crate::quantity;
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

/// The scheduler the API server defaults `schedulerName` to.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// The part of an AdmissionReview request the webhook reads.
#[derive(Debug, Deserialize)]
pub struct AdmissionReview {
    /// `admission.k8s.io/v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// The request.
    pub request: Option<AdmissionRequest>,
}

/// The request of an AdmissionReview.
#[derive(Debug, Deserialize)]
pub struct AdmissionRequest {
    /// Echoed in the response.
    pub uid: String,
    /// The pod being created.
    #[serde(default)]
    pub object: Value,
}

/// What the webhook decided, for the metric and the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// `schedulerName` set to Kudos'.
    Mutated,
    /// Left as it was (no unified resource, or another scheduler named).
    Unchanged,
}

impl Decision {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mutated => "mutated",
            Self::Unchanged => "unchanged",
        }
    }
}

/// Whether any container (init containers included) requests or limits `resource` above 0.
fn requests(pod: &Value, resource: &str) -> bool {
    let spec = &pod["spec"];
    ["containers", "initContainers"]
        .iter()
        .filter_map(|k| spec[*k].as_array())
        .flatten()
        .any(|c| {
            ["requests", "limits"].iter().any(|kind| {
                c["resources"][*kind][resource]
                    .as_str()
                    .and_then(quantity::units)
                    .is_some_and(|n| n > 0)
            })
        })
}

/// The AdmissionReview response for `review`: pods that request `resource` and are left to
/// the default scheduler get `schedulerName: scheduler`. An error for a review without a
/// request (the API server always sends one).
pub fn review(
    review: &AdmissionReview,
    resource: &str,
    scheduler: &str,
) -> Result<(Value, Decision), String> {
    let req = review
        .request
        .as_ref()
        .ok_or("AdmissionReview without request")?;
    let pod = &req.object;
    let current = pod["spec"]["schedulerName"].as_str();
    let mutate = requests(pod, resource) && current.is_none_or(|s| s == DEFAULT_SCHEDULER);
    let mut response = json!({"uid": req.uid, "allowed": true});
    if mutate {
        let op = if current.is_some() { "replace" } else { "add" };
        let patch = json!([{"op": op, "path": "/spec/schedulerName", "value": scheduler}]);
        response["patchType"] = json!("JSONPatch");
        response["patch"] =
            json!(base64::engine::general_purpose::STANDARD.encode(patch.to_string()));
    }
    let decision = if mutate {
        Decision::Mutated
    } else {
        Decision::Unchanged
    };
    Ok((
        json!({
            "apiVersion": review.api_version,
            "kind": "AdmissionReview",
            "response": response,
        }),
        decision,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(limits: Value, scheduler: Option<&str>) -> AdmissionReview {
        let mut spec = json!({"containers": [{"name": "c", "resources": {"limits": limits}}]});
        if let Some(s) = scheduler {
            spec["schedulerName"] = json!(s);
        }
        serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "object": {"metadata": {"name": "p"}, "spec": spec}},
        }))
        .unwrap()
    }

    fn patch(v: &Value) -> Option<Value> {
        let p = v["response"]["patch"].as_str()?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(p).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    #[test]
    fn gpu_pods_of_the_default_scheduler_get_kudos() {
        let (v, d) = review(
            &pod(json!({"kudos.dev/gpu": "1"}), Some(DEFAULT_SCHEDULER)),
            "kudos.dev/gpu",
            "kudos",
        )
        .unwrap();
        assert_eq!(d, Decision::Mutated);
        assert_eq!(v["response"]["uid"], "u-1");
        assert_eq!(v["response"]["allowed"], true);
        assert_eq!(
            patch(&v),
            Some(json!([{"op": "replace", "path": "/spec/schedulerName", "value": "kudos"}]))
        );
        let (v, _) = review(
            &pod(json!({"kudos.dev/gpu": "2"}), None),
            "kudos.dev/gpu",
            "kudos",
        )
        .unwrap();
        assert_eq!(patch(&v).unwrap()[0]["op"], "add");
    }

    #[test]
    fn other_pods_are_left_alone() {
        for (limits, scheduler) in [
            (json!({"cpu": "1"}), Some(DEFAULT_SCHEDULER)),
            (json!({"kudos.dev/gpu": "0"}), None),
            (json!({"kudos.dev/gpu": "1"}), Some("volcano")),
            (json!({"nvidia.com/gpu": "1"}), None),
        ] {
            let (v, d) = review(&pod(limits.clone(), scheduler), "kudos.dev/gpu", "kudos").unwrap();
            assert_eq!(d, Decision::Unchanged, "{limits} {scheduler:?}");
            assert_eq!(v["response"]["allowed"], true);
            assert!(v["response"].get("patch").is_none(), "{v}");
        }
        let empty: AdmissionReview =
            serde_json::from_value(json!({"apiVersion": "admission.k8s.io/v1"})).unwrap();
        assert!(review(&empty, "kudos.dev/gpu", "kudos").is_err());
    }
}
