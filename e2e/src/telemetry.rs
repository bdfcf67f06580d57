//! Feeding the orchestrator run reports over its real gRPC API, as node agents do.

use crate::orchestrator::node_token;
use anyhow::{Context, Result, bail};
use kudos_proto::kudos::v1::{
    AckStatus, RunReport, RunState, telemetry_service_client::TelemetryServiceClient,
};
use tonic::metadata::MetadataValue;
use tonic::service::{Interceptor, interceptor::InterceptedService};
use tonic::transport::{Channel, Endpoint};

/// One completed run of `class` on `node` (one GPU of `model`) lasting `seconds`, ending
/// `ago_s` seconds ago. `seq` makes ids unique.
pub fn completed_run(
    node: &str,
    model: &str,
    class: &str,
    seconds: f64,
    ago_s: f64,
    seq: usize,
) -> RunReport {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as i64;
    let end = now_ms - (ago_s * 1000.0) as i64;
    let start = end - (seconds * 1000.0) as i64;
    RunReport {
        report_id: format!("e2e-{node}-{class}-{seq}"),
        run_id: format!("run-{node}-{class}-{seq}"),
        node: node.to_string(),
        pod_namespace: "default".into(),
        pod_name: format!("hist-{class}-{node}-{seq}"),
        pod_uid: format!("00000000-0000-4000-8000-{seq:012}"),
        container: "main".into(),
        class: class.to_string(),
        device_ids: vec![format!("nv-GPU-{node}-0")],
        device_models: vec![model.to_string()],
        state: RunState::Completed as i32,
        start_unix_ms: start,
        end_unix_ms: end,
        gpu_busy_seconds: seconds * 0.95,
        mean_utilization_percent: 95.0,
        peak_utilization_percent: 100.0,
        peak_memory_bytes: 8 << 30,
        energy_joules: seconds * 200.0,
        progress: Some(1.0),
        work_done: None,
        sample_count: seconds as u32,
    }
}

/// A gRPC connection to the orchestrator that presents `node`'s token on every call, as that
/// node's daemons do.
async fn connect_as(
    grpc_addr: &str,
    node: &str,
) -> Result<InterceptedService<Channel, impl Interceptor + use<>>> {
    let channel = Endpoint::from_shared(format!("http://{grpc_addr}"))?
        .connect()
        .await
        .context("connect gRPC")?;
    let token: MetadataValue<_> = format!("Bearer {}", node_token(node)).parse()?;
    let authorize = move |mut req: tonic::Request<()>| {
        req.metadata_mut().insert("authorization", token.clone());
        Ok(req)
    };
    Ok(InterceptedService::new(channel, authorize))
}

/// Sends `reports` (all about `node`) on one ReportRuns stream with that node's token and
/// checks every acknowledgement is Accepted (or Duplicate).
pub async fn report_runs(grpc_addr: &str, node: &str, reports: Vec<RunReport>) -> Result<()> {
    let n = reports.len();
    let mut client = TelemetryServiceClient::new(connect_as(grpc_addr, node).await?);
    let mut acks = client
        .report_runs(tokio_stream::iter(reports))
        .await
        .context("ReportRuns")?
        .into_inner();
    let mut got = 0;
    while let Some(ack) = acks.message().await? {
        let st = AckStatus::try_from(ack.status).unwrap_or(AckStatus::Unspecified);
        if !matches!(st, AckStatus::Accepted | AckStatus::Duplicate) {
            bail!(
                "report {} rejected ({st:?}): {}",
                ack.report_id,
                ack.message
            );
        }
        got += 1;
        if got == n {
            break;
        }
    }
    if got != n {
        bail!("{got} acknowledgements for {n} reports");
    }
    Ok(())
}

/// Sends `ReportPlugin` for `node` (with that node's token) as a device plugin does: `n`
/// devices of `model`. Returns (unified resource name, configuration generation).
pub async fn report_plugin(
    grpc_addr: &str,
    node: &str,
    vendor: &str,
    vendor_resource: &str,
    model: &str,
    n: u32,
) -> Result<(String, u64)> {
    let r = report_plugin_devices(
        grpc_addr,
        node,
        vendor,
        vendor_resource,
        plugin_devices(node, model, n, n),
    )
    .await?;
    Ok((r.unified_resource_name, r.generation))
}

/// `n` devices of `model` as a plugin on `node` reports them, the first `healthy` healthy.
pub fn plugin_devices(
    node: &str,
    model: &str,
    n: u32,
    healthy: u32,
) -> Vec<kudos_proto::kudos::v1::Device> {
    (0..n)
        .map(|i| kudos_proto::kudos::v1::Device {
            id: format!("nv-GPU-{node}-{i}"),
            model: model.to_string(),
            memory_bytes: 16 << 30,
            uuid: format!("GPU-{node}-{i}"),
            numa_node: Some(0),
            healthy: i < healthy,
        })
        .collect()
}

/// Sends `ReportPlugin` for `node` with these devices; returns the whole answer.
pub async fn report_plugin_devices(
    grpc_addr: &str,
    node: &str,
    vendor: &str,
    vendor_resource: &str,
    devices: Vec<kudos_proto::kudos::v1::Device>,
) -> Result<kudos_proto::kudos::v1::ReportPluginResponse> {
    use kudos_proto::kudos::v1::{
        ReportPluginRequest, registry_service_client::RegistryServiceClient,
    };
    let mut client = RegistryServiceClient::new(connect_as(grpc_addr, node).await?);
    Ok(client
        .report_plugin(ReportPluginRequest {
            node: node.to_string(),
            vendor: vendor.to_string(),
            vendor_resource_name: vendor_resource.to_string(),
            devices,
            plugin_version: "e2e".into(),
        })
        .await
        .context("ReportPlugin")?
        .into_inner())
}
