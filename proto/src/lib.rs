//! Generated protocol types and gRPC stubs for every wire contract Kudos speaks.
//!
//! - [`deviceplugin::v1beta1`]: the kubelet device-plugin API (the plugin serves
//!   `DevicePlugin`, the kubelet serves `Registration`).
//! - [`podresources::v1`]: the kubelet PodResources API (read by the node agent).
//! - [`kudos::v1`]: the orchestrator API (`RegistryService`, `TelemetryService`).
//!
//! Sources live in `proto/proto/`; `build.rs` compiles them with protox, so no `protoc` is
//! needed. Package names are kept exactly as the kubelet expects on the wire.
#![forbid(unsafe_code)]

/// Kubelet device-plugin API.
pub mod deviceplugin {
    /// Version `v1beta1`, the only one the kubelet serves.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1beta1 {
        tonic::include_proto!("v1beta1");

        /// API version string sent in `RegisterRequest.version`.
        pub const VERSION: &str = "v1beta1";
        /// Health value of a usable device.
        pub const HEALTHY: &str = "Healthy";
        /// Health value of a device that must not be allocated.
        pub const UNHEALTHY: &str = "Unhealthy";
        /// The kubelet's registration socket name inside the device-plugin directory.
        pub const KUBELET_SOCKET: &str = "kubelet.sock";
        /// Default device-plugin directory on a node.
        pub const DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins";
    }
}

/// Kubelet PodResources API.
pub mod podresources {
    /// Version `v1`.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("v1");

        /// Default PodResources socket on a node.
        pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
    }
}

/// The Kudos orchestrator API.
pub mod kudos {
    /// Version `kudos.v1`.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("kudos.v1");
    }
}

#[cfg(test)]
mod tests;
