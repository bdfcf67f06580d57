//! DRA objects the tests share: the DeviceClass the chart ships and what the scheduler
//! allocated to a claim.

use k8s_openapi::api::resource::v1::{DeviceClass, DeviceRequestAllocationResult, ResourceClaim};
use kudos_api::dra::{DEVICE_CLASS, DRIVER};

/// The `kudos-gpu` DeviceClass as `charts/kudos/templates/dra.yaml` renders it for
/// `unified` (`charts/test.sh` checks the rendered one against the API server): every device of
/// the Kudos driver, backing the unified extended resource.
pub fn device_class(unified: &str) -> anyhow::Result<DeviceClass> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {
            "extendedResourceName": unified,
            "selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}],
        }
    }))?)
}

/// The device results of a claim's allocation (empty while it is not allocated).
pub fn allocated(claim: &ResourceClaim) -> Vec<DeviceRequestAllocationResult> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.clone())
        .unwrap_or_default()
}
