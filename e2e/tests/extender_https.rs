//! The real kube-scheduler calls the Kudos extender over HTTPS the way the chart installs it:
//! the orchestrator's serving certificate checked against its CA, kube-scheduler's client
//! certificate (naming `kudos-scheduler`) required for every verb. Go's HTTP client takes
//! the `h2` the orchestrator offers, so filter, prioritize and bind for every pod share one
//! connection and one TLS handshake instead of a new connection whenever more than two
//! calls are in flight.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kudos_e2e::nodes::{create_nodes, uniform_shapes};
use kudos_e2e::orchestrator::{ChartTls, Orchestrator, OrchestratorOptions};
use kudos_e2e::paths::{kudos_bin, upstream_bin};
use kudos_e2e::pods::bound_node;
use kudos_e2e::{ControlPlane, ControlPlaneOptions, ExtenderOptions};
use serde_json::json;

const PODS: usize = 24;

fn gpu_pod(name: &str) -> anyhow::Result<Pod> {
    let res = json!({"cpu": "100m", "memory": "64Mi", "kudos.dev/gpu": "1"});
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default",
                     "labels": {"kudos.dev/class": "resnet50"}},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/none:0",
                 "resources": {"requests": res, "limits": res}}]}
    }))?)
}

/// `name{labels} value` from Prometheus text, 0 when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_scheduler_calls_the_extender_over_mutual_tls_on_one_http2_connection()
-> anyhow::Result<()> {
    let bins = [
        upstream_bin("kube-scheduler"),
        kudos_bin("kudos-orchestrator"),
    ];
    let opts = ControlPlaneOptions::default();
    let Some((run, mut cp)) = ControlPlane::for_test("extender_https", opts, &bins).await? else {
        return Ok(());
    };
    let shapes = uniform_shapes(&["V100M32", "T4"], 3, 8);
    create_nodes(&cp.client, &shapes, "kudos.dev/gpu").await?;
    let names: Vec<String> = shapes.iter().map(|s| s.name.clone()).collect();

    // The chart's layout: one CA signs the orchestrator's serving certificate and
    // kube-scheduler's client certificate, which the extender verbs require.
    let tls = ChartTls::new(run.path())?;
    let opts = tls.apply(OrchestratorOptions {
        kubeconfig: Some(cp.kubeconfig.clone()),
        static_token_nodes: Some(names),
        ..OrchestratorOptions::default()
    });
    let orch = Orchestrator::start_with(run.path(), &opts).await?;
    assert!(orch.extender_url().starts_with("https://"));

    // Without kube-scheduler's certificate the verbs are refused.
    let anonymous = orch.get("/kudos/v1/filter")?;
    assert_ne!(
        anonymous.status, 200,
        "a verb answered without a client certificate"
    );

    let mut ext = ExtenderOptions::kudos(orch.extender_url());
    ext.tls = Some(tls.scheduler.clone());
    cp.start_scheduler(50, Some(&ext))?;

    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    for i in 0..PODS {
        pods.create(&PostParams::default(), &gpu_pod(&format!("gpu-{i}"))?)
            .await?;
    }
    for i in 0..PODS {
        let name = format!("gpu-{i}");
        bound_node(&pods, &name).await?;
        // Kudos ranked it (its explanation is there) and bound it (the extender has the bind
        // verb), all through the HTTPS port.
        let ex = orch.explain("default", &name)?;
        assert!(
            ex["ranking"]["entries"]
                .as_array()
                .is_some_and(|e| !e.is_empty()),
            "{name}: {ex}"
        );
    }

    let text = String::from_utf8(orch.get("/metrics")?.body)?;
    let ok = |verb: &str| {
        sample(
            &text,
            &format!(
                "kudos_orchestrator_extender_requests_total{{verb=\"{verb}\",outcome=\"ok\"}}"
            ),
        )
    };
    eprintln!(
        "{PODS} pods: filter {} prioritize {} bind {}",
        ok("filter"),
        ok("prioritize"),
        ok("bind")
    );
    assert!(ok("filter") >= PODS as f64, "{text}");
    assert!(ok("bind") >= PODS as f64, "{text}");
    let h2 = sample(
        &text,
        "kudos_orchestrator_http_connections_served_total{protocol=\"h2\"}",
    );
    let refused = sample(
        &text,
        "kudos_orchestrator_http_requests_refused_total{reason=\"noClientCertificate\"}",
    );
    let http1 = sample(
        &text,
        "kudos_orchestrator_http_connections_served_total{protocol=\"http/1.1\"}",
    );
    // The HTTP/1.1 ones are the test's own calls (readiness, /explain, /metrics), one each.
    eprintln!(
        "connections: HTTP/2 {h2} (kube-scheduler), HTTP/1.1 {http1} (this test); \
         refused without a certificate: {refused}"
    );
    // Go may dial twice when its first calls race the first handshake; never one per pod.
    assert!(
        (1.0..=2.0).contains(&h2),
        "kube-scheduler's calls for {PODS} pods took {h2} HTTP/2 connections: {text}"
    );
    assert_eq!(
        refused, 1.0,
        "only the test's own anonymous call was refused: {text}"
    );
    Ok(())
}
