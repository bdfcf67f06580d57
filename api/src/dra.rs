//! Dynamic Resource Allocation (`resource.k8s.io/v1`): the names the orchestrator (which decides
//! per node whether the kubelet allocates `kudos.dev/gpu` through the device plugin or through
//! DRA, and ships the DeviceClasses) and the device plugin's DRA mode (which publishes the
//! node's ResourceSlice and prepares the claims the scheduler allocated) must agree on.
//!
//! One driver serves every vendor, so one DeviceClass (`kudos-gpu`, with
//! `extendedResourceName: kudos.dev/gpu`, KEP-5004) spans NVIDIA, AMD and configured devices,
//! and pods written for the device plugin (`kudos.dev/gpu: 1`) run unchanged. Per-vendor
//! classes (`kudos-gpu-nvidia`, ...) select one vendor's devices for pods that need its runtime.

/// The DRA driver name: ResourceSlices' `spec.driver`, the kubelet plugin's registration name,
/// and the domain of the device attributes below.
pub const DRIVER: &str = "gpu.kudos.dev";

/// The DeviceClass that spans every vendor's devices and backs the unified extended resource.
pub const DEVICE_CLASS: &str = "kudos-gpu";

/// The DeviceClass selecting one vendor's devices (`kudos-gpu-nvidia`).
pub fn vendor_device_class(vendor: &str) -> String {
    format!("{DEVICE_CLASS}-{vendor}")
}

/// Device attributes in a ResourceSlice, unqualified (so in the driver's domain: in CEL,
/// `device.attributes["gpu.kudos.dev"].vendor`).
pub mod attribute {
    /// Vendor key (`nvidia`, `amd`, or a configured name), a string.
    pub const VENDOR: &str = "vendor";
    /// Model as the vendor names it, a string.
    pub const MODEL: &str = "model";
    /// The Kudos device profile (`vendor|model|count|memory`) the ranking learns per, a string.
    pub const PROFILE: &str = "profile";
    /// The device ID the device plugin would serve the kubelet (`nvidia-0`), a string.
    pub const DEVICE_ID: &str = "deviceID";
    /// Vendor UUID or PCI bus ID, a string.
    pub const UUID: &str = "uuid";
    /// NUMA node, an int; absent when unknown.
    pub const NUMA_NODE: &str = "numaNode";
    /// NVIDIA CUDA compute capability, a version (`9.0.0` for 9.0), as NVIDIA's own DRA
    /// driver names it: `device.attributes["gpu.kudos.dev"].cudaComputeCapability >=
    /// semver("8.0.0")` selects Ampere and newer. Absent on other vendors.
    pub const CUDA_COMPUTE_CAPABILITY: &str = "cudaComputeCapability";
    /// AMD gfx target (`gfx942`), a string. Absent on other vendors.
    pub const GFX_VERSION: &str = "gfxVersion";
}

/// Device capacity in a ResourceSlice: total device memory, a quantity in bytes.
pub const CAPACITY_MEMORY: &str = "memory";

/// The device taint an unhealthy device carries in its ResourceSlice (KEP-5055), effect
/// `NoSchedule`: the scheduler allocates it to no new claim while it is unhealthy.
pub const UNHEALTHY_TAINT_KEY: &str = "gpu.kudos.dev/unhealthy";

/// How a node's kubelet allocates the unified resource: decided per node by the orchestrator
/// and sent to the device plugin in `ReportPluginResponse.allocation_api`. A node uses one or
/// the other, never both (KEP-5004).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllocationApi {
    /// The device plugin registers `kudos.dev/gpu` with the kubelet (device-plugin v1beta1).
    #[default]
    DevicePlugin,
    /// The device plugin publishes a ResourceSlice and serves the DRA kubelet plugin.
    Dra,
}

impl AllocationApi {
    /// The wire and `/state` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DevicePlugin => "device-plugin",
            Self::Dra => "dra",
        }
    }

    /// Parses the wire spelling; an empty string (an orchestrator that predates DRA) is the
    /// device plugin. Anything else is `None`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "" | "device-plugin" => Some(Self::DevicePlugin),
            "dra" => Some(Self::Dra),
            _ => None,
        }
    }
}

/// The DRA device name of a device ID. Device names must be DNS labels (lower case,
/// `[a-z0-9-]`, at most 63 characters, alphanumeric at both ends); device IDs are up to 63
/// characters of `[A-Za-z0-9-_.:]`. An ID that is already a DNS label is its own name;
/// any other gets a readable base plus 8 hex digits of a hash of the whole ID, so IDs that
/// differ only in case or punctuation stay apart (`GPU_0` and `gpu-0`). The hash is 32 bits:
/// a collision among one node's devices (at most 256) has odds below 1 in 100,000.
pub fn device_name(id: &str) -> String {
    if id.len() <= 63 && crate::bounds::is_dns_label(id) {
        return id.to_string();
    }
    let mut base: String = id
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() { c } else { '-' }
        })
        .collect();
    base.truncate(63 - 9);
    let base = base.trim_matches('-');
    let base = if base.is_empty() { "device" } else { base };
    format!("{base}-{:08x}", fnv1a(id.as_bytes()) as u32)
}

/// 64-bit FNV-1a: stable across releases and platforms, unlike `std`'s hasher.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_are_dns_labels_and_distinct() {
        let ids = [
            "nvidia-0",
            "GPU-0",
            "gpu-0",
            "amd_0000:c1:00.0",
            "amd-0000-c1-00-0",
            "-x-",
            "___",
            &"N".repeat(63),
            &"n".repeat(63),
        ];
        let names: Vec<String> = ids.iter().map(|i| device_name(i)).collect();
        for (id, n) in ids.iter().zip(&names) {
            assert!(
                n.len() <= 63 && crate::bounds::is_dns_label(n),
                "{id:?} -> {n:?}"
            );
        }
        let distinct: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
        assert_eq!(device_name("nvidia-0"), "nvidia-0", "a DNS label is kept");
        assert_eq!(device_name("GPU-0"), device_name("GPU-0"), "stable");
    }

    #[test]
    fn allocation_api_round_trips_and_empty_means_device_plugin() {
        for a in [AllocationApi::DevicePlugin, AllocationApi::Dra] {
            assert_eq!(AllocationApi::parse(a.as_str()), Some(a));
        }
        assert_eq!(AllocationApi::parse(""), Some(AllocationApi::DevicePlugin));
        assert_eq!(AllocationApi::parse("DRA"), None);
    }
}
