//! The Kudos contract: everything two Kudos processes must agree on, defined once.
//!
//! Kudos runs as several processes (orchestrator, device plugin, node agent, the rollout that
//! derives plugin images) that meet only through Kubernetes objects, files and gRPC. Wherever
//! one writes what another reads, the name or shape lives here, so a mismatch cannot compile
//! (the pattern of linkerd2's `policy-controller/k8s/api` and NVIDIA's `api/config/v1`):
//!
//! - [`labels`]: `kudos.dev/*` labels and annotations on pods, nodes and DaemonSets.
//! - [`env`]: the environment a derived plugin image sets and the plugin reads.
//! - [`bounds`]: input limits both ends of every protocol enforce, with validators that
//!   return a typed [`bounds::BoundsError`].
//! - [`resource_name`]: the default unified resource name and the kubelet's rules for one.
//! - [`dra`]: the DRA driver, DeviceClass and attribute names, device names, and which
//!   allocation API a node uses.
//! - [`plugin_config`]: the persisted plugin configuration (`node → vendor → devices`, the
//!   generation and the derived images), written by the orchestrator and read by the rollout.
//! - [`config::v1`]: the versioned per-vendor file the rollout bakes into a derived image and
//!   the device plugin reads at start.
//!
//! The crate has no I/O beyond reading one file in [`config::v1`], no async and depends only
//! on serde and thiserror, so every crate can depend on it.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod bounds;
pub mod config;
pub mod dra;
pub mod env;
pub mod labels;
pub mod plugin_config;
pub mod resource_name;

pub use bounds::BoundsError;
pub use config::v1::{VendorPluginConfig, VendorPluginConfigError};
pub use plugin_config::{
    DerivedImage, DeviceRecord, PluginConfig, PluginConfigError, PluginGroup, ProfileRecord,
    VendorEntry,
};
pub use resource_name::{DEFAULT_UNIFIED_RESOURCE_NAME, ResourceNameError};
