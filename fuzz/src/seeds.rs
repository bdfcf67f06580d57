//! Valid inputs for every target, written as code so they track the types they encode: the
//! smoke test mutates them, and `cargo run -p kudos-fuzz --example write-seeds` writes them
//! into libFuzzer's corpus directories.

use kudos_proto::kudos::v1 as pb;
use prost::Message;
use serde_json::json;

/// The seeds of target `name` (empty for an unknown name).
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    match name {
        "extender" => extender(),
        "config" => config(),
        "grpc" => grpc(),
        "store" => store(),
        _ => Vec::new(),
    }
}

fn pod(name: &str, annotations: serde_json::Value, gpus: u32) -> serde_json::Value {
    json!({
        "metadata": {
            "name": name, "namespace": "ml", "uid": format!("uid-{name}"),
            "labels": {"kudos.dev/class": "resnet50"},
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "main", "image": "train", "resources": {
            "requests": {"cpu": "1", "kudos.dev/gpu": gpus.to_string()},
            "limits": {"kudos.dev/gpu": gpus.to_string()}}}]},
    })
}

fn with_route(route: u8, body: &serde_json::Value) -> Vec<u8> {
    let mut out = vec![route];
    out.extend_from_slice(body.to_string().as_bytes());
    out
}

fn extender() -> Vec<Vec<u8>> {
    let names = json!(["gpu-a", "gpu-b", "gpu-c", "cpu-only"]);
    let plain = pod("train-1", json!({"kudos.dev/work": "1000"}), 1);
    let vendors = pod("train-2", json!({"kudos.dev/vendors": "nvidia,amd"}), 2);
    let gang = pod(
        "gang-0",
        json!({"kudos.dev/gang-name": "g", "kudos.dev/gang-size": "2"}),
        4,
    );
    let filter = |p: &serde_json::Value| with_route(0, &json!({"Pod": p, "NodeNames": names}));
    let bind = |p: &str, node: &str| {
        with_route(
            2,
            &json!({"PodName": p, "PodNamespace": "ml", "PodUID": format!("uid-{p}"), "Node": node}),
        )
    };
    let joined = |parts: &[Vec<u8>]| parts.join(&crate::extender::SEPARATOR);
    vec![
        filter(&plain),
        with_route(1, &json!({"Pod": plain, "NodeNames": names})),
        joined(&[filter(&plain), bind("train-1", "gpu-a")]),
        joined(&[
            filter(&vendors),
            with_route(1, &json!({"Pod": vendors, "NodeNames": names})),
        ]),
        joined(&[filter(&gang), bind("gang-0", "gpu-b"), filter(&gang)]),
        with_route(
            0,
            &json!({"Pod": plain, "Nodes": {"items": [
                {"metadata": {"name": "gpu-a"}}, {"metadata": {"name": "gpu-c", "labels": {"x": "y"}}}
            ]}}),
        ),
        joined(&[filter(&plain), b"\x03ml/train-1".to_vec(), b"\x04".to_vec()]),
    ]
}

fn config() -> Vec<Vec<u8>> {
    let with_kind = |kind: u8, text: &str| {
        let mut out = vec![kind];
        out.extend_from_slice(text.as_bytes());
        out
    };
    vec![
        with_kind(0, include_str!("../../orchestrator/examples/config.yaml")),
        with_kind(
            0,
            "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\nextender:\n  pathPrefix: /kudos/v1\n  maxConcurrentRequests: 8\nscheduler:\n  defaultVendors: []\n",
        ),
        with_kind(
            1,
            r#"{"version":"v1","vendor":"nvidia","vendorResourceName":"nvidia.com/gpu","unifiedResourceName":"kudos.dev/gpu","nodes":{"gpu-a":[{"id":"nv-GPU-0","model":"NVIDIA H100 80GB HBM3","memoryBytes":85899345920,"uuid":"GPU-0"}]}}"#,
        ),
        with_kind(
            2,
            r#"{"version":"v1","vendor":"acme","resourceName":"acme.com/npu","visibleDevicesEnv":"ACME_VISIBLE_DEVICES","devices":[{"id":"npu0","model":"Acme N1","numaNode":0,"deviceNodes":["/dev/null"]}]}"#,
        ),
    ]
}

fn device(i: u32) -> pb::Device {
    pb::Device {
        id: format!("nv-GPU-{i}"),
        model: "NVIDIA H100 80GB HBM3".into(),
        memory_bytes: 80 << 30,
        uuid: format!("GPU-{i}"),
        numa_node: Some(0),
        healthy: i != 3,
    }
}

fn report(i: i64, state: pb::RunState) -> pb::RunReport {
    pb::RunReport {
        report_id: format!("r-{i}"),
        run_id: format!("run-{i}"),
        node: crate::grpc::NODE.into(),
        pod_namespace: "ml".into(),
        pod_name: format!("train-{i}"),
        class: "resnet50".into(),
        device_ids: vec!["nv-GPU-0".into()],
        state: state as i32,
        start_unix_ms: 1_700_000_000_000 + i * 1000,
        end_unix_ms: 1_700_000_060_000 + i * 1000,
        gpu_busy_seconds: 55.0,
        work_done: Some(1000.0),
        progress: (state == pb::RunState::InProgress).then_some(0.5),
        ..Default::default()
    }
}

fn grpc() -> Vec<Vec<u8>> {
    use crate::grpc::encode_input;
    let plugin = pb::ReportPluginRequest {
        node: crate::grpc::NODE.into(),
        vendor: "nvidia".into(),
        vendor_resource_name: "nvidia.com/gpu".into(),
        devices: (0..4).map(device).collect(),
        plugin_version: "0.1.0".into(),
    };
    let runs = [
        report(1, pb::RunState::InProgress),
        report(1, pb::RunState::Completed),
        report(1, pb::RunState::Completed),
        report(2, pb::RunState::Failed),
    ];
    let heartbeat = pb::HeartbeatRequest {
        node: crate::grpc::NODE.into(),
        agent_version: "0.1.0".into(),
        outbox_depth: 3,
        healthy_devices: 4,
        total_devices: 4,
        sent_unix_ms: 1_700_000_000_000,
    };
    let mut raw = vec![0x81];
    raw.extend(crate::grpc::frames(&[runs[1].encode_to_vec()]));
    raw.extend_from_slice(&[0, 0, 0, 0, 9, 1]);
    vec![
        encode_input(0, &[plugin]),
        encode_input(1, &runs),
        encode_input(2, &[heartbeat]),
        raw,
    ]
}

fn store() -> Vec<Vec<u8>> {
    let patch = |at: u32, bytes: &[u8]| {
        let mut p = at.to_le_bytes().to_vec();
        p.push(bytes.len() as u8);
        p.extend_from_slice(bytes);
        p
    };
    vec![
        vec![0],
        vec![1],
        [vec![0], patch(4096, &[0xff; 64])].concat(),
        [vec![1], patch(8192 + 17, b"\0\0\0\0")].concat(),
        [vec![2], 6000u32.to_le_bytes().to_vec()].concat(),
        [vec![3], 5000u32.to_le_bytes().to_vec()].concat(),
    ]
}
