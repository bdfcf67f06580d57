//! Generated protocol types and gRPC stubs for every wire contract Kudos speaks.
//!
//! - [`deviceplugin::v1beta1`]: the kubelet device-plugin API (the plugin serves
//!   `DevicePlugin`, the kubelet serves `Registration`).
//! - [`podresources::v1`]: the kubelet PodResources API (read by the node agent).
//! - [`dra::v1`]: the kubelet's DRA plugin API (the device plugin's DRA mode serves
//!   `DRAPlugin`: `NodePrepareResources`, `NodeUnprepareResources`).
//! - [`pluginregistration::v1`]: the kubelet plugin watcher's registration API (a DRA plugin
//!   serves `Registration` on a socket in the kubelet's `plugins_registry` directory).
//! - [`kudos::v1`]: the orchestrator API (`RegistryService`, `TelemetryService`).
//!
//! - [`unix`]: gRPC channels over the Unix sockets all the kubelet's APIs are served on.
//!
//! Kudos' own sources live in `proto/proto/`, the kubelet's APIs in `proto/third_party/kubelet/`
//! (upstream's definitions, not ours to reshape); `build.rs` compiles them with protox, so no
//! `protoc` is needed. Package names are kept exactly as the kubelet expects on the wire.
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

/// Kubelet Dynamic Resource Allocation (DRA) plugin API.
pub mod dra {
    /// Version `v1` (package `k8s.io.kubelet.pkg.apis.dra.v1`), served by kubelets since 1.34.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");

        /// The name a plugin advertises in `PluginInfo.supported_versions` for this service
        /// (the kubelet's `drapbv1.DRAPluginService`).
        pub const SERVICE: &str = "v1.DRAPlugin";
        /// Default directory of DRA plugins' data and sockets (`<dir>/<driver>/dra.sock`).
        pub const PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
        /// File name of the DRA service socket inside `<plugins dir>/<driver>/`.
        pub const SOCKET: &str = "dra.sock";
    }
}

/// Kubelet plugin-watcher registration API (CSI and DRA plugins).
pub mod pluginregistration {
    /// Version `v1` (package `pluginregistration`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("pluginregistration");

        /// `PluginInfo.type` of a DRA plugin.
        pub const DRA_PLUGIN: &str = "DRAPlugin";
        /// Default directory the kubelet's plugin watcher watches for registration sockets.
        pub const REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
        /// The registration socket's file name for a driver: `<driver>-reg.sock`.
        pub fn socket_name(driver: &str) -> String {
            format!("{driver}-reg.sock")
        }
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

pub mod unix;

#[cfg(test)]
mod tests;
