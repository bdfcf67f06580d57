//! Every bound on a name, count or size that reaches the orchestrator from outside, in one place.
//!
//! Each value is checked on entry (extender request, gRPC message, plugin report, run report)
//! before it can reach the index, the store or an allocation sized by it. Bounds the sending
//! side (device plugin, node agent) checks too are `kudos-api`'s, re-exported here, so both
//! sides compile against one definition; the rest only the orchestrator sees.

/// Kubernetes object names (nodes, pods) are DNS subdomains: at most 253 characters.
pub const MAX_OBJECT_NAME_LEN: usize = 253;
/// Namespaces are DNS labels: at most 63 characters.
pub const MAX_LABEL_VALUE_LEN: usize = 63;
pub use kudos_api::bounds::{
    MAX_CLASS_NAME_LEN, MAX_DEVICE_ID_LEN, MAX_DEVICES_PER_NODE, MAX_PLUGIN_VERSION_LEN,
    MAX_REPORT_ID_LEN,
};

/// Largest gang (`kudos.dev/gang-size`): more members than any cluster Kudos targets has
/// devices, and small enough that a gang placement's buffers stay a few kilobytes.
pub const MAX_GANG_SIZE: u32 = 4096;
/// Candidate nodes in one extender call. Upstream supports 5,000 nodes per cluster.
pub const MAX_NODE_NAMES: usize = 20_000;

/// Default largest extender request body. A `NodeNames` request for 20,000 nodes is well
/// under 1 MiB; clusters that send full `Nodes` lists (`nodeCacheCapable: false`) must raise
/// `extender.maxBodyBytes` (a 5,000-node list is ~30 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;
/// Upper bound accepted for `extender.maxBodyBytes`.
pub const MAX_BODY_BYTES: usize = 256 << 20;
/// Upper bound accepted for `extender.maxConcurrentRequests`.
pub const MAX_CONCURRENT_REQUESTS: usize = 65_536;
/// Default open HTTP connections; more are refused at accept.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Upper bound accepted for `extender.maxConnections`.
pub const MAX_CONNECTIONS: usize = 65_536;
/// Default time a client has to send a request's headers.
pub const DEFAULT_HEADER_READ_TIMEOUT_SECONDS: f64 = 10.0;
/// Heavy read endpoints (`/state`, `/explain`, `/metrics`) served at once; more get 503 so
/// they never take the workers the extender needs.
pub const DEFAULT_MAX_HEAVY_REQUESTS: usize = 2;

/// Largest gRPC message either way. A plugin report of [`MAX_DEVICES_PER_NODE`] devices with
/// every field at its bound is about 150 KiB.
pub const MAX_GRPC_MESSAGE_BYTES: usize = 1 << 20;

/// Longest run a report may claim (30 days): a longer one is a clock or agent bug, and
/// learning it would poison the class's history.
pub const MAX_RUN_SECONDS: f64 = 30.0 * 24.0 * 3600.0;
/// How far in the future a report's end may lie (clock skew between node and orchestrator).
pub const MAX_CLOCK_SKEW_SECONDS: f64 = 300.0;

/// `Err` naming `field` when `value` is longer than `max` bytes.
pub fn check_len(field: &str, value: &str, max: usize) -> Result<(), String> {
    if value.len() > max {
        Err(format!(
            "{field} is {} bytes; at most {max} are accepted",
            value.len()
        ))
    } else {
        Ok(())
    }
}

/// [`check_len`], and the value must not be empty.
pub fn check_name(field: &str, value: &str, max: usize) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{field} must not be empty"));
    }
    check_len(field, value, max)
}
