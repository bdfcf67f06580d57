//! Environment variables a derived plugin image (or its DaemonSet) sets and the device plugin
//! reads. The rollout writes them with these names; the plugin's flags read them with these
//! names; one definition means the two cannot drift apart.

/// The unified resource name to register under (`kudos.dev/gpu`).
pub const RESOURCE_NAME: &str = "KUDOS_RESOURCE_NAME";
/// The vendor(s) the plugin serves: sorted vendor keys joined by `,`.
pub const VENDOR: &str = "KUDOS_VENDOR";
/// Directory holding one [`crate::VendorPluginConfig`] file per vendor.
pub const PLUGIN_CONFIG_DIR: &str = "KUDOS_PLUGIN_CONFIG_DIR";
/// The plugin's state directory on the host (name cache and the like).
pub const STATE_DIR: &str = "KUDOS_STATE_DIR";
/// Directory holding the driver's `libnvidia-ml.so.1`, mounted from the host.
pub const NVML_LIBRARY_DIR: &str = "KUDOS_NVML_LIBRARY_DIR";
/// The orchestrator's gRPC address.
pub const ORCHESTRATOR_ADDR: &str = "KUDOS_ORCHESTRATOR_ADDR";
/// The node name (Kubernetes downward API `spec.nodeName`).
pub const NODE_NAME: &str = "NODE_NAME";

/// Where a derived image puts [`PLUGIN_CONFIG_DIR`].
pub const DEFAULT_PLUGIN_CONFIG_DIR: &str = "/etc/kudos/plugin";
/// File name of the NVML library inside [`NVML_LIBRARY_DIR`].
pub const NVML_LIBRARY_FILE: &str = "libnvidia-ml.so.1";
/// Separator of the vendor keys in [`VENDOR`].
pub const VENDOR_SEPARATOR: char = ',';
