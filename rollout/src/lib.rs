//! Kudos rollout: from the plugin configuration to running device plugins (design §2.1,
//! steps 5–7).
//!
//! When the orchestrator's plugin configuration gains or changes an entry, this crate
//! 1. **derives a plugin image** per plugin group — the configured base plugin image plus one
//!    deterministic layer carrying the group's plugin configuration files and Env naming the
//!    unified resource and vendor — pushes it, and returns it **by digest** for the
//!    orchestrator to record ([`ImageDeriver`], [`image`]);
//! 2. **renders one DaemonSet per plugin group** with node affinity to exactly that group's
//!    nodes (its pod copied from the bootstrap plugin's DaemonSet when configured,
//!    [`template`]) and applies it with server-side apply, deleting DaemonSets of groups that
//!    left ([`render_daemonsets`], [`apply()`], or [`render_yaml`] for a dry run), then hands
//!    each node from the bootstrap plugin to its group's by one node label ([`handover`]);
//! 3. **monitors** the configured nodes as a pure function of what the orchestrator's index
//!    saw ([`monitor()`], [`NodeMonitor`], [`MonitorMetrics`]).
//!
//! A *plugin group* is the set of nodes sharing one set of vendors. It is a vendor in the
//! common case; a node with two vendors' accelerators is in a group of its own (e.g.
//! `amd-nvidia`) because the kubelet keeps one endpoint per resource name and all vendors
//! register under the unified one, so such a node must run a single plugin serving both.
//!
//! # Wiring into the orchestrator
//! ```text
//!  kudos_api::PluginConfig ──watch::Sender──▶ rollout::run(rx, Ctx, shutdown)
//!         ▲                                          │ (lease holder only)
//!         └── ImageRecorder::record(generation, group → DerivedImage) ◀──┘
//! ```
//! - Publish the orchestrator's persisted [`PluginConfig`] (the one type in `kudos-api`,
//!   with `images: group → DerivedImage` as previously recorded); nothing is converted.
//! - Implement [`ImageRecorder`] to store returned [`DerivedImage`]s in the configuration
//!   (this bumps its generation; the next pass finds nothing to derive and re-applies as a
//!   no-op).
//! - Build `Ctx::new(RolloutSettings, recorder, metrics).with_kube(client)
//!   .with_deriver(ImageDeriver::new(RegistrySettings, metrics)?)`, or
//!   `.with_mode(Mode::dry_run_stdout())` for `--dry-run`; then either spawn [`run`] with a
//!   `watch::Receiver<Arc<PluginConfig>>`, or call [`reconcile`]/[`error_policy`]
//!   yourself. Register [`RolloutMetrics`] and [`MonitorMetrics`] on the `/metrics` registry.
//! - For `/state` and the extender's filter, call [`monitor()`] with the view, the Node
//!   observations, plugin health reports, heartbeats and the DaemonSets seen, and skip nodes
//!   with `exclude_from_ranking`.
//!
//! # Contract with the device plugin image
//! The derived image carries `/etc/kudos/plugin/<vendor>.json` ([`VendorPluginConfig`],
//! `version: v1`, written with [`VendorPluginConfig::to_file_bytes`], which the plugin reads
//! with [`VendorPluginConfig::read`]) and sets [`kudos_api::env::RESOURCE_NAME`],
//! [`kudos_api::env::VENDOR`] (comma-separated) and [`kudos_api::env::PLUGIN_CONFIG_DIR`].
//! The DaemonSet adds [`kudos_api::env::NODE_NAME`], [`kudos_api::env::STATE_DIR`]
//! (`/var/lib/kudos`, a host directory) and, for NVIDIA, [`kudos_api::env::NVML_LIBRARY_DIR`].
//!
//! TLS: the registry client uses rustls with the `ring` provider only;
//! [`install_crypto_provider`] is called by [`ImageDeriver::new`].
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod apply;
pub mod credentials;
#[cfg(test)]
mod fixtures;
pub mod handover;
pub mod image;
pub mod metrics;
pub mod monitor;
pub mod reconcile;
pub mod registry;
pub mod render;
pub mod retry;
pub mod template;

pub use apply::{ApplyError, ApplyReport, apply, apply_daemonsets, prune_daemonsets};
pub use credentials::{CredentialSource, CredentialsError};
pub use image::derive_tag;
pub use kudos_api::{
    DerivedImage, DeviceRecord, PluginConfig, PluginConfigError, PluginGroup, VendorEntry,
    VendorPluginConfig,
};
pub use metrics::{MonitorMetrics, RolloutMetrics};
pub use monitor::{
    ExclusionReason, MonitorInputs, MonitorPolicy, NodeMonitor, NodeObservation, PluginHealth,
    RolloutState, monitor,
};
pub use reconcile::{Ctx, Error, ImageRecorder, Mode, error_policy, reconcile, run};
pub use registry::{
    DeriveError, ImageDeriver, PlainHttp, RegistrySettings, install_crypto_provider,
};
pub use render::{
    RolloutSettings, render_daemonsets, render_daemonsets_from, render_yaml, render_yaml_from,
};
pub use retry::RetryPolicy;
