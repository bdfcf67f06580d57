//! Extender contract tests through the router (`oneshot`): golden request/response pairs in
//! `tests/golden/` (PascalCase keys, nulls, `NodeNames` and `Nodes` forms), and property
//! tests (filter answers a subset of its input; scores are 0..=10).
//!
//! Golden responses use two wildcards where values depend on time or on scheduler-core's
//! wording: `"~"` matches any value, `"~text"` any string containing `text` (case-insensitive).
//! Regenerate with `KUDOS_UPDATE_GOLDEN=1 cargo test -p kudos-orchestrator --test integration extender::`
//! and review the diff (wildcards must then be restored by hand).

use crate::common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use proptest::prelude::*;
use serde_json::Value;
use std::path::PathBuf;
use tower::ServiceExt;

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

fn matches(expected: &Value, actual: &Value, path: &str) -> Result<(), String> {
    match (expected, actual) {
        (Value::String(e), _) if e == "~" => Ok(()),
        (Value::String(e), Value::String(a)) if e.starts_with('~') => {
            if a.to_lowercase().contains(&e[1..].to_lowercase()) {
                Ok(())
            } else {
                Err(format!("{path}: {a:?} does not contain {:?}", &e[1..]))
            }
        }
        (Value::Object(e), Value::Object(a)) => {
            let (mut ek, mut ak): (Vec<_>, Vec<_>) = (e.keys().collect(), a.keys().collect());
            ek.sort();
            ak.sort();
            if ek != ak {
                return Err(format!("{path}: keys {ak:?}, expected {ek:?}"));
            }
            e.iter()
                .try_for_each(|(k, v)| matches(v, &a[k], &format!("{path}.{k}")))
        }
        (Value::Array(e), Value::Array(a)) => {
            if e.len() != a.len() {
                return Err(format!("{path}: {} items, expected {}", a.len(), e.len()));
            }
            e.iter()
                .zip(a)
                .enumerate()
                .try_for_each(|(i, (e, a))| matches(e, a, &format!("{path}[{i}]")))
        }
        _ if expected == actual => Ok(()),
        _ => Err(format!("{path}: got {actual}, expected {expected}")),
    }
}

async fn check_golden(verb: &str, case: &str) -> Value {
    check_golden_on(&mk_app(standard_index()), verb, case).await
}

async fn check_golden_on(app: &axum::Router, verb: &str, case: &str) -> Value {
    let req = std::fs::read(golden(&format!("{case}.request.json"))).unwrap();
    let (status, actual) = post(app, &format!("/kudos/v1/{verb}"), req).await;
    assert_eq!(status, StatusCode::OK, "{case}: {actual}");
    let path = golden(&format!("{case}.response.json"));
    if std::env::var_os("KUDOS_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&actual).unwrap() + "\n").unwrap();
    }
    let expected: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    if let Err(e) = matches(&expected, &actual, case) {
        panic!(
            "golden mismatch: {e}\nactual: {}",
            serde_json::to_string_pretty(&actual).unwrap()
        );
    }
    actual
}

#[tokio::test]
async fn golden_filter_node_names() {
    let v = check_golden("filter", "filter_nodenames").await;
    assert!(v["Nodes"].is_null());
    assert!(
        v["FailedAndUnresolvableNodes"]["cpu-only"]
            .as_str()
            .unwrap()
            .contains("device plugin")
    );
}

#[tokio::test]
async fn golden_filter_nodes_form() {
    let v = check_golden("filter", "filter_nodes").await;
    assert!(v["NodeNames"].is_null());
}

/// Permanent mismatches go to `FailedAndUnresolvableNodes` (preemption cannot help), transient
/// ones (no room now) to `FailedNodes`.
#[tokio::test]
async fn permanent_rejections_are_unresolvable() {
    use kudos_orchestrator::index::Index;
    use kudos_orchestrator::state::PluginConfig;
    use kudos_scheduler_core::{ClassConfig, Scheduler, SchedulerConfig};
    let mut config = SchedulerConfig::default();
    config.classes.insert(
        "llm".into(),
        ClassConfig {
            allowed_vendors: vec!["amd".into()],
            min_device_memory_bytes: 40 << 30,
            ..Default::default()
        },
    );
    let mut idx = Index::new(UNIFIED, 120.0, Scheduler::new(config), false);
    let mut cfg = PluginConfig::default();
    let gpu = "AMD Instinct MI300X";
    cfg.upsert(
        "nv",
        "nvidia",
        entry("NVIDIA H100 80GB HBM3", 4, 80 << 30),
        UNIFIED,
    );
    cfg.upsert("amd-small", "amd", entry(gpu, 4, 16 << 30), UNIFIED);
    cfg.upsert("amd-one", "amd", entry(gpu, 1, 80 << 30), UNIFIED);
    cfg.upsert("amd-busy", "amd", entry(gpu, 2, 80 << 30), UNIFIED);
    cfg.upsert("amd-ok", "amd", entry(gpu, 4, 80 << 30), UNIFIED);
    idx.set_plugin_config(cfg);
    let app = mk_app(std::sync::Arc::new(parking_lot::RwLock::new(idx)));
    let nodes = ["nv", "amd-small", "amd-one", "amd-busy", "amd-ok"];
    let filter = |name: &str| {
        serde_json::to_vec(
            &serde_json::json!({"Pod": pod_json(name, Some("llm"), 2), "NodeNames": nodes}),
        )
        .unwrap()
    };
    // Fill amd-busy: it has enough devices in total, just none free now.
    let bind = serde_json::json!({"PodName": "first", "PodNamespace": "default",
        "PodUID": "uid-first", "Node": "amd-busy"});
    post(&app, "/kudos/v1/filter", filter("first")).await;
    let (_, v) = post(&app, "/kudos/v1/bind", serde_json::to_vec(&bind).unwrap()).await;
    assert_eq!(v["Error"], "", "{v}");
    let (_, v) = post(&app, "/kudos/v1/filter", filter("second")).await;
    assert_eq!(v["NodeNames"], serde_json::json!(["amd-ok"]), "{v}");
    let keys = |k: &str| {
        let mut ks: Vec<String> = v[k].as_object().unwrap().keys().cloned().collect();
        ks.sort();
        ks
    };
    assert_eq!(
        keys("FailedAndUnresolvableNodes"),
        ["amd-one", "amd-small", "nv"],
        "{v}"
    );
    assert_eq!(keys("FailedNodes"), ["amd-busy"], "{v}");
}

/// Every vendor registers the same resource name, so the pod's image decides: a pod without
/// `kudos.dev/vendors` is offered only the default vendors (NVIDIA), a pod that names AMD only
/// AMD nodes, and a malformed list is an error the user sees; `default_vendors: []` opens
/// every vendor to pods that name none.
#[tokio::test]
async fn a_pod_is_offered_only_vendors_its_image_can_use() {
    use kudos_orchestrator::index::Index;
    use kudos_scheduler_core::{Scheduler, SchedulerConfig};
    let nodes = ["gpu-a", "gpu-b", "gpu-c"];
    let filter = |app: axum::Router, vendors: Option<&'static str>| async move {
        let mut pod = pod_json("p", Some("resnet50"), 1);
        if let Some(v) = vendors {
            pod["metadata"]["annotations"] = serde_json::json!({"kudos.dev/vendors": v});
        }
        let body = serde_json::json!({"Pod": pod, "NodeNames": nodes});
        post(&app, "/kudos/v1/filter", serde_json::to_vec(&body).unwrap())
            .await
            .1
    };
    let app = mk_app(standard_index());
    let v = filter(app.clone(), None).await;
    assert_eq!(v["NodeNames"], serde_json::json!(["gpu-a", "gpu-c"]), "{v}");
    let why = v["FailedAndUnresolvableNodes"]["gpu-b"]
        .as_str()
        .unwrap_or("");
    assert!(
        why.contains("amd") && why.contains("without kudos.dev/vendors"),
        "{v}"
    );
    let v = filter(app.clone(), Some("AMD")).await;
    assert_eq!(v["NodeNames"], serde_json::json!(["gpu-b"]), "{v}");
    assert!(
        v["FailedAndUnresolvableNodes"]["gpu-a"]
            .as_str()
            .is_some_and(|r| r.contains("kudos.dev/vendors allows amd")),
        "{v}"
    );
    let v = filter(app.clone(), Some(" amd , nvidia ")).await;
    assert_eq!(
        v["NodeNames"],
        serde_json::json!(["gpu-a", "gpu-b", "gpu-c"]),
        "{v}"
    );
    for bad in ["nvidia;amd", "", "nvidia,,amd", "NVIDIA GPUs"] {
        let v = filter(app.clone(), Some(bad)).await;
        let e = v["Error"].as_str().unwrap_or("");
        assert!(e.contains("kudos.dev/vendors"), "{bad:?}: {v}");
        assert!(v["NodeNames"].is_null(), "{bad:?}: {v}");
    }

    // `default_vendors: []`: a pod that names none may use any vendor.
    let config = SchedulerConfig {
        default_vendors: Vec::new(),
        ..SchedulerConfig::default()
    };
    let idx = standard_index();
    let open = {
        let old = idx.read();
        let mut i = Index::new(UNIFIED, 120.0, Scheduler::new(config), false);
        i.set_plugin_config(old.plugin_config().clone());
        i
    };
    let v = filter(
        mk_app(std::sync::Arc::new(parking_lot::RwLock::new(open))),
        None,
    )
    .await;
    assert_eq!(
        v["NodeNames"],
        serde_json::json!(["gpu-a", "gpu-b", "gpu-c"]),
        "{v}"
    );
}

#[tokio::test]
async fn golden_filter_unmanaged_pod_is_echoed() {
    let v = check_golden("filter", "filter_unmanaged").await;
    let req: Value =
        serde_json::from_slice(&std::fs::read(golden("filter_unmanaged.request.json")).unwrap())
            .unwrap();
    assert_eq!(v["NodeNames"], req["NodeNames"]);
}

#[tokio::test]
async fn golden_filter_errors() {
    let v = check_golden("filter", "filter_nulls").await;
    assert!(!v["Error"].as_str().unwrap().is_empty());
    let v = check_golden("filter", "filter_bad_annotation").await;
    assert!(v["Error"].as_str().unwrap().contains("kudos.dev/gang-size"));
}

#[tokio::test]
async fn golden_prioritize() {
    let v = check_golden("prioritize", "prioritize_nodenames").await;
    for hp in v.as_array().unwrap() {
        let s = hp["Score"].as_i64().unwrap();
        assert!((0..=10).contains(&s));
    }
    let v = check_golden("prioritize", "prioritize_unmanaged").await;
    assert!(v.as_array().unwrap().iter().all(|hp| hp["Score"] == 0));
}

#[tokio::test]
async fn golden_bind() {
    // Kudos binds only pods it ranked, onto a node that passed.
    let app = mk_app(standard_index());
    let filter = serde_json::json!({"Pod": pod_json("train-1", Some("resnet50"), 1), "NodeNames": ["gpu-a"]});
    post(
        &app,
        "/kudos/v1/filter",
        serde_json::to_vec(&filter).unwrap(),
    )
    .await;
    let v = check_golden_on(&app, "bind", "bind").await;
    assert_eq!(v["Error"], "");
    let v = check_golden("bind", "bind_missing").await;
    assert!(!v["Error"].as_str().unwrap().is_empty());
}

#[tokio::test]
async fn bind_counts_against_free_devices() {
    // gpu-c has 2 devices: after binding two 1-GPU pods there, a third is filtered out.
    let index = standard_index();
    let state = mk_state(index);
    let app = kudos_orchestrator::http::router(state, &limits());
    for i in 0..2 {
        let name = format!("p{i}");
        let body = serde_json::json!({"Pod": pod_json(&name, Some("resnet50"), 1), "NodeNames": ["gpu-c"]});
        let (_, v) = post(&app, "/kudos/v1/filter", serde_json::to_vec(&body).unwrap()).await;
        assert_eq!(v["NodeNames"], serde_json::json!(["gpu-c"]), "{v}");
        let bind = serde_json::json!({"PodName": name, "PodNamespace": "default", "PodUID": format!("uid-{name}"), "Node": "gpu-c"});
        let (_, v) = post(&app, "/kudos/v1/bind", serde_json::to_vec(&bind).unwrap()).await;
        assert_eq!(v["Error"], "");
    }
    let body =
        serde_json::json!({"Pod": pod_json("p2", Some("resnet50"), 1), "NodeNames": ["gpu-c"]});
    let (_, v) = post(&app, "/kudos/v1/filter", serde_json::to_vec(&body).unwrap()).await;
    assert_eq!(v["NodeNames"], serde_json::json!([]), "{v}");
    assert!(v["FailedNodes"]["gpu-c"].is_string());
}

/// Every refusal is a JSON error, also when axum itself refuses the path (a percent-encoded
/// namespace that is not UTF-8; found by the extender fuzz target).
#[tokio::test]
async fn explain_refuses_a_bad_path_with_a_json_error() {
    let app = mk_app(standard_index());
    let (s, v) = get(&app, "/explain/%ff/pod").await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("invalid path")),
        "{v}"
    );
}

#[tokio::test]
async fn explain_returns_last_ranking() {
    let state = mk_state(standard_index());
    let metrics = state.metrics.clone();
    let app = kudos_orchestrator::http::router(state, &limits());
    let (s, _) = get(&app, "/explain/default/train-1").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let req = std::fs::read(golden("prioritize_nodenames.request.json")).unwrap();
    post(&app, "/kudos/v1/prioritize", req).await;
    let (s, v) = get(&app, "/explain/default/train-1").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["verb"], "prioritize");
    let entries = v["ranking"]["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 3);
    // What is kept is on /metrics: one ranking, its node lines and one for the rest.
    let rejected = v["ranking"]["rejected"].as_array().map_or(0, Vec::len);
    let unknown = v["unknownNodes"].as_array().map_or(0, Vec::len);
    let text = metrics.encode().unwrap();
    assert!(
        text.contains("kudos_orchestrator_explanations 1\n"),
        "{text}"
    );
    let lines = format!(
        "kudos_orchestrator_explanation_node_lines {}\n",
        3 + rejected + unknown + 1
    );
    assert!(text.contains(&lines), "{lines} in {text}");
    for e in entries {
        assert!(e["prediction"]["seconds"].as_f64().unwrap() > 0.0, "{e}");
        assert!(e["prediction"]["uncertainty_log_sd"].is_number(), "{e}");
        assert!(!e["prediction"]["source"].is_null(), "{e}");
        for k in ["review", "good_rate", "score", "default_score", "rank"] {
            assert!(!e[k].is_null(), "{k} missing in {e}");
        }
    }
}

#[tokio::test]
async fn prioritize_reuses_the_filter_ranking_until_something_changes() {
    let index = standard_index();
    let app = mk_app(index.clone());
    let mut pod = pod_json("r", Some("resnet50"), 1);
    pod["metadata"]["annotations"] = serde_json::json!({"kudos.dev/vendors": "nvidia,amd"});
    let args = |nodes: &[&str]| {
        serde_json::to_vec(&serde_json::json!({"Pod": pod, "NodeNames": nodes})).unwrap()
    };
    let verb = |v: &Value| v["verb"].as_str().unwrap().to_owned();
    let (_, f) = post(
        &app,
        "/kudos/v1/filter",
        args(&["gpu-a", "gpu-b", "gpu-stale"]),
    )
    .await;
    assert_eq!(f["NodeNames"], serde_json::json!(["gpu-a", "gpu-b"]));
    let (_, p1) = post(&app, "/kudos/v1/prioritize", args(&["gpu-a", "gpu-b"])).await;
    let (_, e) = get(&app, "/explain/default/r").await;
    assert_eq!(
        verb(&e),
        "filter",
        "same pod, same passed nodes, nothing changed: reused"
    );
    // Another node set: ranked afresh, same scores for the same nodes.
    let (_, p2) = post(&app, "/kudos/v1/prioritize", args(&["gpu-b", "gpu-a"])).await;
    let (_, e) = get(&app, "/explain/default/r").await;
    assert_eq!(verb(&e), "filter", "order does not matter");
    assert_eq!(p1[0]["Score"], p2[1]["Score"]);
    let (_, _) = post(&app, "/kudos/v1/prioritize", args(&["gpu-a"])).await;
    let (_, e) = get(&app, "/explain/default/r").await;
    assert_eq!(
        verb(&e),
        "prioritize",
        "a different node set is ranked again"
    );
    // An earlier pod's bind in between (kube-scheduler binds each pod beside the next pod's
    // cycle): it changes what fits, which that cycle's filter settled, not a score.
    post(&app, "/kudos/v1/filter", args(&["gpu-a", "gpu-b"])).await;
    let other =
        serde_json::json!({"Pod": pod_json("other", Some("resnet50"), 1), "NodeNames": ["gpu-a"]});
    post(
        &app,
        "/kudos/v1/filter",
        serde_json::to_vec(&other).unwrap(),
    )
    .await;
    let (_, f) = post(&app, "/kudos/v1/filter", args(&["gpu-a", "gpu-b"])).await;
    let bind = serde_json::json!({"PodName": "other", "PodNamespace": "default", "PodUID": "uid-other", "Node": "gpu-a"});
    let (_, b) = post(&app, "/kudos/v1/bind", serde_json::to_vec(&bind).unwrap()).await;
    assert_eq!(b["Error"], "", "{b}");
    let (_, p3) = post(&app, "/kudos/v1/prioritize", args(&["gpu-a", "gpu-b"])).await;
    let (_, e) = get(&app, "/explain/default/r").await;
    assert_eq!(verb(&e), "filter", "reused across another pod's bind");
    assert_eq!(f["NodeNames"], serde_json::json!(["gpu-a", "gpu-b"]));
    assert_eq!(p3, p1, "the same scores");
    // A new model in between (what the learner publishes): ranked again.
    post(&app, "/kudos/v1/filter", args(&["gpu-a", "gpu-b"])).await;
    let model = std::sync::Arc::new(kudos_scheduler_core::Scheduler::clone(
        &index.read().model(),
    ));
    drop(index.write().publish_model(model, 1));
    post(&app, "/kudos/v1/prioritize", args(&["gpu-a", "gpu-b"])).await;
    let (_, e) = get(&app, "/explain/default/r").await;
    assert_eq!(verb(&e), "prioritize", "ranked again with the new model");
}

/// The nodes of an `/explain` answer's ranking, in recommended order.
fn ranked_nodes(explain: &Value) -> Vec<&str> {
    explain["ranking"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["node"].as_str().unwrap())
        .collect()
}

/// `extender.filterTopNodes`: filter passes only the best-ranked nodes, in the order asked,
/// leaves the rest out without calling them failed (kube-scheduler drops them), still reports
/// real rejections, and prioritize over what passed reuses the ranking; bind accepts the node.
#[tokio::test]
async fn filter_passes_only_the_best_ranked_nodes_when_told() {
    let index = standard_index();
    let metrics = std::sync::Arc::new(kudos_orchestrator::metrics::Metrics::new());
    let extender = kudos_orchestrator::extender::Extender {
        filter_top_nodes: Some(2),
        ..mk_extender(index.clone(), metrics.clone())
    };
    let state = std::sync::Arc::new(kudos_orchestrator::http::HttpState::new(
        extender,
        index.clone(),
        metrics,
    ));
    let app = kudos_orchestrator::http::router(state, &limits());
    let mut pod = pod_json("t", Some("resnet50"), 1);
    pod["metadata"]["annotations"] = serde_json::json!({"kudos.dev/vendors": "nvidia,amd"});
    let args = |nodes: &[&str]| {
        serde_json::to_vec(&serde_json::json!({"Pod": pod, "NodeNames": nodes})).unwrap()
    };
    let asked = ["gpu-c", "gpu-stale", "gpu-b", "gpu-a"];
    let (s, f) = post(&app, "/kudos/v1/filter", args(&asked)).await;
    assert_eq!(s, StatusCode::OK);
    let (_, e) = get(&app, "/explain/default/t").await;
    let ranked = ranked_nodes(&e);
    assert_eq!(ranked.len(), 3, "three nodes fit: {e}");
    let passed: Vec<&str> = f["NodeNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let best: Vec<&str> = asked
        .iter()
        .copied()
        .filter(|n| ranked[..2].contains(n))
        .collect();
    assert_eq!(passed, best, "the two best, in the order asked: {f}");
    let failed = f["FailedNodes"].as_object().unwrap();
    assert!(
        failed.contains_key("gpu-stale"),
        "a real rejection stays: {f}"
    );
    assert!(
        !failed.contains_key(ranked[2]),
        "the third best is left out, not failed: {f}"
    );
    let (_, p) = post(&app, "/kudos/v1/prioritize", args(&passed)).await;
    assert_eq!(p.as_array().unwrap().len(), 2, "{p}");
    let (_, e) = get(&app, "/explain/default/t").await;
    assert_eq!(
        e["verb"], "filter",
        "prioritize reused the filter's ranking"
    );
    let bind = serde_json::json!({"PodName": "t", "PodNamespace": "default", "PodUID": "uid-t", "Node": passed[0]});
    let (_, b) = post(&app, "/kudos/v1/bind", serde_json::to_vec(&bind).unwrap()).await;
    assert_eq!(b["Error"], "", "{b}");
    // Fewer fit than the limit: every one passes.
    let (_, f) = post(&app, "/kudos/v1/filter", args(&["gpu-b", "gpu-stale"])).await;
    assert_eq!(f["NodeNames"], serde_json::json!(["gpu-b"]), "{f}");
}

/// kube-scheduler never sends a node twice, but a client may: each occurrence gets the answer
/// the node gets, the ranking lists it once, and unknown names are reported once.
#[tokio::test]
async fn a_repeated_node_name_gets_the_same_answer_at_each_place() {
    let app = mk_app(standard_index());
    // gpu-b's devices are AMD: the pod says it can use them.
    let args = |pod: &str, nodes: &[&str]| {
        let mut pod = pod_json(pod, Some("resnet50"), 1);
        pod["metadata"]["annotations"] = serde_json::json!({"kudos.dev/vendors": "nvidia,amd"});
        serde_json::to_vec(&serde_json::json!({"Pod": pod, "NodeNames": nodes})).unwrap()
    };
    let (status, f) = post(
        &app,
        "/kudos/v1/filter",
        args(
            "f",
            &["gpu-a", "gpu-stale", "gpu-b", "gpu-a", "ghost", "ghost"],
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{f}");
    assert_eq!(
        f["NodeNames"],
        serde_json::json!(["gpu-a", "gpu-b", "gpu-a"])
    );
    assert!(f["FailedNodes"]["gpu-stale"].is_string(), "{f}");
    assert!(f["FailedAndUnresolvableNodes"]["ghost"].is_string(), "{f}");
    let (_, e) = get(&app, "/explain/default/f").await;
    let ranked = ranked_nodes(&e);
    assert_eq!(ranked.len(), 2, "each node ranked once: {ranked:?}");
    assert_eq!(e["unknownNodesTotal"], 1, "{e}");

    let (_, once) = post(
        &app,
        "/kudos/v1/prioritize",
        args("p1", &["gpu-b", "gpu-a"]),
    )
    .await;
    let (_, twice) = post(
        &app,
        "/kudos/v1/prioritize",
        args("p2", &["gpu-b", "gpu-a", "gpu-b", "ghost"]),
    )
    .await;
    let hosts: Vec<&str> = twice
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["Host"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, ["gpu-b", "gpu-a", "gpu-b", "ghost"]);
    assert_eq!(twice[0]["Score"], once[0]["Score"]);
    assert_eq!(twice[1]["Score"], once[1]["Score"]);
    assert_eq!(twice[2]["Score"], once[0]["Score"]);
    assert_eq!(twice[3]["Score"], 0, "an unknown node gets no opinion");
    assert_ne!(
        once[0]["Score"], once[1]["Score"],
        "the two nodes must score apart for the test to tell them apart: {once}"
    );
}

/// Pods bound in between (by the cluster's own scheduler beside Kudos', or earlier pods of
/// Kudos' scheduler) change what is in use, which kube-scheduler checks from its own snapshot:
/// the filter ranking is still reused. A change to what a score is made of (device health here)
/// is not.
#[tokio::test]
async fn prioritize_reuse_survives_pods_binding_in_between() {
    let index = standard_index();
    let app = mk_app(index.clone());
    let mut pod = pod_json("r", Some("resnet50"), 1);
    pod["metadata"]["annotations"] = serde_json::json!({"kudos.dev/vendors": "nvidia,amd"});
    let args = |nodes: &[&str]| {
        serde_json::to_vec(&serde_json::json!({"Pod": pod, "NodeNames": nodes})).unwrap()
    };
    let verb = |v: &Value| v["verb"].as_str().unwrap().to_owned();
    let bound = |name: &str, gpus: u32| {
        let mut p = pod_json(name, None, gpus);
        p["spec"]["nodeName"] = serde_json::json!("gpu-a");
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(p).unwrap();
        kudos_orchestrator::kobj::pod_facts(&p, UNIFIED).unwrap()
    };
    post(&app, "/kudos/v1/filter", args(&["gpu-a", "gpu-b"])).await;
    index.write().apply_pod(&bound("web", 0));
    post(&app, "/kudos/v1/prioritize", args(&["gpu-a", "gpu-b"])).await;
    let (_, e) = get(&app, "/explain/default/r").await;
    assert_eq!(verb(&e), "filter", "reused across a pod without devices");
    post(&app, "/kudos/v1/filter", args(&["gpu-a", "gpu-b"])).await;
    index.write().apply_pod(&bound("train", 1));
    post(&app, "/kudos/v1/prioritize", args(&["gpu-a", "gpu-b"])).await;
    let (_, e) = get(&app, "/explain/default/r").await;
    assert_eq!(verb(&e), "filter", "reused across a GPU pod bound");
    post(&app, "/kudos/v1/filter", args(&["gpu-a", "gpu-b"])).await;
    index.write().set_device_health("gpu-a", "nvidia", (1, 4));
    post(&app, "/kudos/v1/prioritize", args(&["gpu-a", "gpu-b"])).await;
    let (_, e) = get(&app, "/explain/default/r").await;
    assert_eq!(verb(&e), "prioritize", "ranked again after a device failed");
    index.write().set_device_health("gpu-b", "amd", (8, 8));
    post(&app, "/kudos/v1/filter", args(&["gpu-b"])).await;
    index.write().set_device_health("gpu-b", "amd", (8, 8));
    post(&app, "/kudos/v1/prioritize", args(&["gpu-b"])).await;
    let (_, e) = get(&app, "/explain/default/r").await;
    assert_eq!(
        verb(&e),
        "filter",
        "reused across a plugin's periodic report with the same health"
    );
}

#[tokio::test]
async fn body_limit_and_bad_json() {
    let app = mk_app(standard_index());
    let (s, _) = post(&app, "/kudos/v1/filter", b"{not json".to_vec()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = post(&app, "/kudos/v1/filter", vec![b' '; 2 << 20]).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn readiness_waits_for_the_index() {
    use kudos_orchestrator::index::Index;
    use kudos_scheduler_core::{Scheduler, SchedulerConfig};
    let idx = Index::new(
        UNIFIED,
        120.0,
        Scheduler::new(SchedulerConfig::default()),
        true,
    );
    let index = std::sync::Arc::new(parking_lot::RwLock::new(idx));
    let app = mk_app(index.clone());
    assert_eq!(get(&app, "/healthz").await.0, StatusCode::OK);
    assert_eq!(
        get(&app, "/readyz").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let req = std::fs::read(golden("filter_nodenames.request.json")).unwrap();
    assert_eq!(
        post(&app, "/kudos/v1/filter", req).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    index.write().reset_nodes(vec![]);
    index.write().reset_pods(&[]);
    assert_eq!(get(&app, "/readyz").await.0, StatusCode::OK);
}

#[tokio::test]
async fn metrics_pass_promtool() {
    let app = mk_app(standard_index());
    let req = std::fs::read(golden("filter_nodenames.request.json")).unwrap();
    post(&app, "/kudos/v1/filter", req).await;
    let resp = app
        .oneshot(
            Request::builder()
                .uri("/metrics")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let text = String::from_utf8(
        axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap()
            .to_vec(),
    )
    .unwrap();
    assert!(
        text.contains("kudos_orchestrator_extender_request_duration_seconds_bucket"),
        "{text}"
    );
    // The golden filter leaves out the AMD node (the pod names no vendor), the stale node and
    // the node without accelerators; every reason is exposed from the start.
    for (reason, n) in [
        ("vendorNotAllowed", 1),
        ("stale", 1),
        ("unknown", 1),
        ("noRoom", 0),
    ] {
        let line =
            format!("kudos_orchestrator_extender_nodes_rejected_total{{reason=\"{reason}\"}} {n}");
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
    if let Some(report) = kudos_testkit::promtool_check_metrics(&text).expect("promtool") {
        assert!(report.success, "promtool: {}", report.output);
    }
}

fn node_pool() -> Vec<(&'static str, &'static str, &'static str, usize)> {
    vec![
        ("n0", "nvidia", "NVIDIA H100 80GB HBM3", 8),
        ("n1", "nvidia", "NVIDIA A100-SXM4-80GB", 4),
        ("n2", "amd", "AMD Instinct MI300X", 8),
        ("n3", "nvidia", "Tesla V100-SXM2-16GB", 1),
        ("n4", "nvidia", "NVIDIA L4", 2),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn filter_is_subset_and_scores_in_range(
        picks in proptest::collection::vec(0usize..8, 0..12),
        gpus in 0u32..10,
        class in proptest::option::of(prop_oneof![Just("a"), Just("b")]),
        nodes_form in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let pool = node_pool();
            let app = mk_app(mk_index(&pool));
            // Names 5..8 are unknown to Kudos.
            let names: Vec<String> = picks.iter().map(|i| format!("n{i}")).collect();
            let mut body = serde_json::json!({"Pod": pod_json("p", class, gpus)});
            if nodes_form {
                let items: Vec<Value> = names.iter().map(|n| serde_json::json!({"metadata": {"name": n}})).collect();
                body["Nodes"] = serde_json::json!({"items": items});
            } else {
                body["NodeNames"] = serde_json::json!(names);
            }
            let bytes = serde_json::to_vec(&body).unwrap();
            let (s, v) = post(&app, "/kudos/v1/filter", bytes.clone()).await;
            prop_assert_eq!(s, StatusCode::OK);
            let passed: Vec<String> = if nodes_form {
                v["Nodes"]["items"].as_array().unwrap().iter().map(|n| n["metadata"]["name"].as_str().unwrap().to_owned()).collect()
            } else {
                serde_json::from_value(v["NodeNames"].clone()).unwrap()
            };
            for p in &passed {
                prop_assert!(names.contains(p), "{} not in input", p);
                prop_assert!(v["FailedNodes"].get(p).is_none(), "{} both passed and failed", p);
                prop_assert!(v["FailedAndUnresolvableNodes"].get(p).is_none(), "{} both passed and failed", p);
            }
            for n in &names {
                let failed = v["FailedNodes"].get(n).is_some() || v["FailedAndUnresolvableNodes"].get(n).is_some();
                prop_assert!(passed.contains(n) || failed, "{} neither passed nor failed", n);
            }
            let (s, v) = post(&app, "/kudos/v1/prioritize", bytes).await;
            prop_assert_eq!(s, StatusCode::OK);
            let list = v.as_array().unwrap();
            prop_assert_eq!(list.len(), names.len());
            for (hp, n) in list.iter().zip(&names) {
                prop_assert_eq!(hp["Host"].as_str().unwrap(), n.as_str());
                let score = hp["Score"].as_i64().unwrap();
                prop_assert!((0..=10).contains(&score));
            }
            Ok(())
        })?;
    }
}
