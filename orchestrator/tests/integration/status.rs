//! `GET /status`, the operator's page, through the router: what the model learned appears as a
//! heatmap cell per (class, GPU model), the latest placements are listed, and names from users
//! (a GPU model here) cannot inject markup.

use crate::common;

use axum::http::StatusCode;
use common::*;
use kudos_orchestrator::state::{RunOutcome, StoredRun};
use std::sync::Arc;

const HOSTILE_MODEL: &str = "<img src=x onerror=alert(1)>";

#[tokio::test]
async fn status_page_shows_the_learned_heatmap_placements_and_escapes_names() {
    let index = mk_index(&[
        ("gpu-a", "nvidia", "NVIDIA H100 80GB HBM3", 4),
        ("gpu-b", "nvidia", HOSTILE_MODEL, 2),
    ]);
    // Three runs of class resnet on gpu-a, 100 units of work in 20 s each.
    let mut model = kudos_scheduler_core::Scheduler::new(Default::default());
    let profile = index.read().profile("gpu-a");
    for i in 0..3u64 {
        let run = StoredRun {
            seq: i + 1,
            report_id: format!("r{i}"),
            run_id: format!("run{i}"),
            node: "gpu-a".into(),
            pod_namespace: "default".into(),
            pod_name: format!("train-{i}"),
            class: "resnet".into(),
            device_ids: vec!["nv-0".into()],
            outcome: RunOutcome::Completed,
            start: 1000.0 * i as f64,
            end: 1000.0 * i as f64 + 20.0,
            gpu_busy_seconds: 20.0,
            progress: Some(1.0),
            work_done: Some(100.0),
            profile: profile.clone(),
            received_at: 1000.0 * i as f64 + 21.0,
        };
        kudos_orchestrator::index::apply_run(&mut model, &run).expect("learned");
    }
    let _replaced = index.write().publish_model(Arc::new(model), 3);
    let app = mk_app(index);
    let pod = serde_json::json!({"Pod": pod_json("train-9", Some("resnet"), 1), "NodeNames": ["gpu-a", "gpu-b"]});
    let (s, _) = post(&app, "/kudos/v1/filter", serde_json::to_vec(&pod).unwrap()).await;
    assert_eq!(s, StatusCode::OK);

    let (s, body) = get(&app, "/status").await;
    assert_eq!(s, StatusCode::OK);
    let html = body.as_str().expect("an HTML page");
    // The learned cell: 20 s per 100 units on the H100.
    let cell = html
        .split("<td data-class=\"resnet\" data-model=\"NVIDIA H100 80GB HBM3\" data-seconds=\"")
        .nth(1)
        .expect("a heatmap cell for resnet on the H100");
    let seconds: f64 = cell.split('"').next().unwrap().parse().unwrap();
    assert!(
        (seconds - 0.2).abs() < 0.02,
        "learned 0.2 s per unit, page says {seconds}"
    );
    assert!(
        html.contains("data-model=\"&lt;img src=x onerror=alert(1)&gt;\""),
        "{html}"
    );
    assert!(
        !html.contains(HOSTILE_MODEL),
        "unescaped model name in the page"
    );
    assert!(
        html.contains("<a href=\"/explain/default/train-9\">default/train-9</a>"),
        "{html}"
    );
}
