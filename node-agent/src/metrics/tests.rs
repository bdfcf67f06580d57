use super::*;
use crate::sample::{DeviceInfo, DeviceSample, SampleError};

fn reading(i: u32, util: f64) -> DeviceReading {
    DeviceReading {
        info: DeviceInfo {
            index: i,
            uuid: format!("GPU-{i}"),
            model: "NVIDIA H100".into(),
            memory_total_bytes: 80 << 30,
        },
        result: Ok(DeviceSample {
            gpu_util_percent: util,
            memory_used_bytes: 2 << 30,
            power_watts: Some(250.5),
            sm_clock_hz: Some(1.98e9),
            temperature_celsius: Some(61.0),
            xid_errors_total: 2,
            last_xid: Some(79),
            ..Default::default()
        }),
    }
}

fn holder(pod: &str) -> Holder {
    Holder {
        pod: pod.into(),
        namespace: "ml".into(),
        container: "main".into(),
    }
}

#[test]
fn dcgm_names_and_labels_follow_the_pod() {
    let m = Metrics::new("node-a");
    let holders: HashMap<String, Holder> = [("GPU-0".to_string(), holder("train-1"))].into();
    m.record(&[reading(0, 75.0), reading(1, 0.0)], &holders, 1);
    let text = m.render();
    assert!(
        text.contains(r#"DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",modelName="NVIDIA H100",Hostname="node-a",pod="train-1",namespace="ml",container="main"} 75.0"#),
        "{text}"
    );
    assert!(text.contains(r#"DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-0""#));
    assert!(
        text.contains(r#"pod="",namespace="",container="""#),
        "unassigned devices have empty pod labels"
    );
    assert!(text.contains(r#"DCGM_FI_DEV_SM_CLOCK{gpu="0""#) && text.contains("} 1980.0"));
    assert!(text.contains(r#"kudos_gpu_sm_clock_hertz{gpu="0",UUID="GPU-0"} 1980000000.0"#));
    assert!(text.contains(r#"kudos_gpu_xid_errors_total{gpu="0",UUID="GPU-0"} 2"#));
    // The device moves to another pod: the old series goes away.
    let holders: HashMap<String, Holder> = [("GPU-0".to_string(), holder("train-2"))].into();
    m.record(&[reading(0, 75.0), reading(1, 0.0)], &holders, 2);
    let text = m.render();
    assert!(!text.contains("train-1"), "{text}");
    assert!(text.contains("train-2"));
    // A failing device loses its gauges and counts an error.
    m.record(
        &[DeviceReading {
            result: Err(SampleError::Timeout),
            ..reading(0, 0.0)
        }],
        &holders,
        3,
    );
    let text = m.render();
    assert!(!text.contains("train-2"));
    assert!(text.contains(r#"kudos_gpu_sample_errors_total{UUID="GPU-0",reason="timeout"} 1"#));
}

#[test]
fn promtool_accepts_the_exposition() {
    let m = Metrics::new("node-a");
    let holders: HashMap<String, Holder> = [("GPU-0".to_string(), holder("train-1"))].into();
    m.record(&[reading(0, 75.0), reading(1, 0.0)], &holders, 1);
    m.sample_duration.observe(0.002);
    m.outbox_dropped
        .get_or_create(&lbl(&[("state", "completed"), ("reason", "full")]))
        .inc();
    m.reports_acked
        .get_or_create(&lbl(&[("status", "accepted")]))
        .inc();
    let text = m.render_prometheus();
    // The DCGM families must keep dcgm-exporter's label names (`UUID`, `modelName`,
    // `Hostname`) for dashboard compatibility; promtool's style lint flags exactly those, as it
    // does on dcgm-exporter itself. Anything else it says is a failure.
    let Some((ok, msg)) = promtool(&text) else {
        return;
    };
    let unexpected: Vec<&str> = msg
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| {
            !(l.starts_with("DCGM_FI_DEV_")
                && l.ends_with("label names should be written in 'snake_case' not 'camelCase'"))
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "promtool (ok={ok}) complained:\n{msg}\n---\n{text}"
    );
    // Everything of our own passes with no remark at all.
    let own: String = text
        .lines()
        .filter(|l| !l.contains("DCGM_FI_DEV_"))
        .map(|l| format!("{l}\n"))
        .collect();
    let Some((ok, msg)) = promtool(&own) else {
        return;
    };
    assert!(
        ok && msg.trim().is_empty(),
        "promtool failed on kudos_* metrics:\n{msg}\n---\n{own}"
    );
}

fn promtool(text: &str) -> Option<(bool, String)> {
    kudos_testkit::promtool_check_metrics(text)
        .expect("running promtool")
        .map(|r| (r.success, r.output))
}

#[tokio::test]
async fn http_endpoints() {
    use tower::ServiceExt;
    let m = Metrics::new("node-a");
    let app = router(HttpState {
        metrics: m.clone(),
        stale_after_ms: 10_000,
    });
    let get = |p: &str| {
        axum::http::Request::get(p)
            .body(axum::body::Body::empty())
            .expect("request")
    };
    let resp = app.clone().oneshot(get("/healthz")).await.expect("healthz");
    assert_eq!(
        resp.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "no sampling round yet"
    );
    m.record(&[reading(0, 1.0)], &HashMap::new(), crate::now_ms());
    let resp = app.clone().oneshot(get("/healthz")).await.expect("healthz");
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = app.clone().oneshot(get("/metrics")).await.expect("metrics");
    assert_eq!(resp.status(), StatusCode::OK);
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("body");
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("DCGM_FI_DEV_GPU_UTIL"));
    assert!(text.contains("# TYPE kudos_reports_sent_total counter") && !text.contains("# EOF"));
    // Prometheus asks for OpenMetrics and gets it.
    let mut req = get("/metrics");
    let om = "application/openmetrics-text;version=1.0.0,text/plain;q=0.5";
    req.headers_mut()
        .insert(header::ACCEPT, om.parse().expect("header"));
    let resp = app.oneshot(req).await.expect("metrics");
    let ct = resp.headers().get(header::CONTENT_TYPE).cloned();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("body");
    assert!(ct.is_some_and(|c| {
        c.to_str()
            .unwrap_or("")
            .starts_with("application/openmetrics-text")
    }));
    assert!(String::from_utf8_lossy(&body).ends_with("# EOF\n"));
}
