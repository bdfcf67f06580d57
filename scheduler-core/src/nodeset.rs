//! The node set of a class (§2.2 step 1): which candidates can run the pod at all.
//!
//! A node qualifies when it is healthy and fresh, has the free devices, CPU and memory the pod
//! requests, carries devices the class allows (vendor or model lists, minimum device memory),
//! and its devices' vendor is one the pod's image can use ([`check_vendor`]).
//! Every exclusion carries a reason an operator can act on, because "why did my pod not go to
//! node X" is the first question anyone asks a scheduler. Device-level checks depend only on the
//! profile, so [`crate::Scheduler::rank`] evaluates them once per distinct profile.

use crate::config::{ClassConfig, SchedulerConfig};
use crate::predict::ModelState;
use crate::types::{DeviceProfile, NodeHealth, NodeState, PodSpec, RejectionKind};

const GIB: f64 = (1u64 << 30) as f64;

/// Node-level checks (health and room), independent of the class.
pub fn check_node(node: &NodeState, pod: &PodSpec) -> Result<(), String> {
    check_node_kind(node, pod).map_err(|(_, reason)| reason)
}

/// Class-level checks on a device profile.
pub fn check_profile(
    class: &str,
    config: Option<&ClassConfig>,
    profile: &DeviceProfile,
) -> Result<(), String> {
    check_profile_kind(class, config, profile).map_err(|(_, reason)| reason)
}

/// Whether the pod's image can use the profile's vendor. Every vendor registers the same
/// unified resource name, so this is what keeps a CUDA image off an AMD node. The vendors are,
/// in order: the pod's own (`kudos.dev/vendors`); else, when its class restricts vendors or
/// models, that restriction alone ([`check_profile_kind`]); else `default_vendors` (empty: any).
pub fn check_vendor(
    pod: &PodSpec,
    class: Option<&ClassConfig>,
    config: &SchedulerConfig,
    profile: &DeviceProfile,
) -> Result<(), (RejectionKind, String)> {
    let class_restricts =
        class.is_some_and(|c| !c.allowed_vendors.is_empty() || !c.allowed_models.is_empty());
    let (allowed, whose) = if !pod.vendors.is_empty() {
        (&pod.vendors, "the pod's kudos.dev/vendors")
    } else if class_restricts || config.default_vendors.is_empty() {
        return Ok(());
    } else {
        (
            &config.default_vendors,
            "the default for a pod without kudos.dev/vendors",
        )
    };
    if allowed
        .iter()
        .any(|v| v.eq_ignore_ascii_case(&profile.vendor))
    {
        return Ok(());
    }
    Err((
        RejectionKind::VendorNotAllowed,
        format!(
            "node has {} devices; {whose} allows {}",
            profile.vendor,
            allowed.join(", ")
        ),
    ))
}

/// Every device-level check of `pod` on `profile`, in order: the vendor ([`check_vendor`]);
/// with a class, the class's device rules ([`check_profile_kind`]) and, for a pod that leaves
/// the vendor to Kudos, what the class's runs taught (`ModelState::vendor_excluded`).
pub fn check_devices(
    pod: &PodSpec,
    class: Option<(&str, Option<&ClassConfig>)>,
    config: &SchedulerConfig,
    state: &ModelState,
    profile: &DeviceProfile,
) -> Result<(), (RejectionKind, String)> {
    check_vendor(pod, class.and_then(|(_, c)| c), config, profile)?;
    let Some((name, class_config)) = class else {
        return Ok(());
    };
    check_profile_kind(name, class_config, profile)?;
    match state.vendor_excluded(name, &profile.vendor) {
        Some(why) if pod.vendors.is_empty() => Err((RejectionKind::VendorNotAllowed, why)),
        _ => Ok(()),
    }
}

/// Whether [`check_node_kind`] passes, without building a reason: ranking's per-node test, with
/// the reason written only for a node that fails it.
#[inline]
pub(crate) fn node_kind_fits(node: &NodeState, pod: &PodSpec) -> bool {
    matches!(node.health, NodeHealth::Healthy)
        && pod.gpus <= node.free_devices
        && pod.cpu_milli
            <= node
                .cpu_allocatable_milli
                .saturating_sub(node.cpu_requested_milli)
        && pod.memory_bytes
            <= node
                .memory_allocatable_bytes
                .saturating_sub(node.memory_requested_bytes)
}

/// [`check_node`] with the reason's category.
pub fn check_node_kind(node: &NodeState, pod: &PodSpec) -> Result<(), (RejectionKind, String)> {
    match &node.health {
        NodeHealth::Healthy => {}
        NodeHealth::Unhealthy { reason } => {
            return Err((
                RejectionKind::Unhealthy,
                format!("node is unhealthy: {reason}"),
            ));
        }
        NodeHealth::Stale { age_seconds } => {
            return Err((
                RejectionKind::Stale,
                format!(
                    "node is stale: no agent heartbeat for {age_seconds:.0}s; check the kudos node agent"
                ),
            ));
        }
    }
    if pod.gpus > node.free_devices {
        let kind = if pod.gpus > node.profile.count {
            RejectionKind::NoDevices
        } else {
            RejectionKind::NoRoom
        };
        return Err((
            kind,
            format!(
                "needs {} free device(s), node has {} free of {}",
                pod.gpus, node.free_devices, node.profile.count
            ),
        ));
    }
    let cpu_free = node
        .cpu_allocatable_milli
        .saturating_sub(node.cpu_requested_milli);
    if pod.cpu_milli > cpu_free {
        return Err((
            RejectionKind::NoRoom,
            format!(
                "needs {}m CPU, node has {}m free of {}m allocatable",
                pod.cpu_milli, cpu_free, node.cpu_allocatable_milli
            ),
        ));
    }
    let mem_free = node
        .memory_allocatable_bytes
        .saturating_sub(node.memory_requested_bytes);
    if pod.memory_bytes > mem_free {
        return Err((
            RejectionKind::NoRoom,
            format!(
                "needs {:.2} GiB memory, node has {:.2} GiB free of {:.2} GiB allocatable",
                pod.memory_bytes as f64 / GIB,
                mem_free as f64 / GIB,
                node.memory_allocatable_bytes as f64 / GIB
            ),
        ));
    }
    Ok(())
}

/// [`check_profile`] with the reason's category.
pub fn check_profile_kind(
    class: &str,
    config: Option<&ClassConfig>,
    profile: &DeviceProfile,
) -> Result<(), (RejectionKind, String)> {
    let Some(cfg) = config else { return Ok(()) };
    let vendor_ok = cfg
        .allowed_vendors
        .iter()
        .any(|v| v.eq_ignore_ascii_case(&profile.vendor));
    let model_ok = cfg
        .allowed_models
        .iter()
        .any(|m| m.eq_ignore_ascii_case(&profile.model));
    let restricted = !cfg.allowed_vendors.is_empty() || !cfg.allowed_models.is_empty();
    if restricted && !vendor_ok && !model_ok {
        return Err((
            RejectionKind::ClassForbidsDevice,
            format!(
                "class {class} allows vendors {:?} and models {:?}; node has {} {}",
                cfg.allowed_vendors, cfg.allowed_models, profile.vendor, profile.model
            ),
        ));
    }
    if profile.memory_bytes < cfg.min_device_memory_bytes {
        return Err((
            RejectionKind::InsufficientDeviceMemory,
            format!(
                "class {class} needs {:.1} GiB per device; node's {} has {:.1} GiB",
                cfg.min_device_memory_bytes as f64 / GIB,
                profile.model,
                profile.memory_bytes as f64 / GIB
            ),
        ));
    }
    Ok(())
}

/// How many members of a gang (each asking for what `pod` asks) fit on a node.
pub fn slots(node: &NodeState, pod: &PodSpec, cap: u32) -> u32 {
    let per = |free: u64, each: u64| free.checked_div(each).unwrap_or(u64::from(cap));
    let gpu = per(u64::from(node.free_devices), u64::from(pod.gpus));
    let cpu = per(
        node.cpu_allocatable_milli
            .saturating_sub(node.cpu_requested_milli),
        pod.cpu_milli,
    );
    let mem = per(
        node.memory_allocatable_bytes
            .saturating_sub(node.memory_requested_bytes),
        pod.memory_bytes,
    );
    gpu.min(cpu).min(mem).min(u64::from(cap)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(vendor: &str, model: &str, mem_gib: u64) -> DeviceProfile {
        DeviceProfile {
            vendor: vendor.into(),
            model: model.into(),
            count: 8,
            memory_bytes: mem_gib << 30,
        }
    }

    #[test]
    fn the_fast_fit_test_agrees_with_the_reasoned_one() {
        let healths = [
            NodeHealth::Healthy,
            NodeHealth::Stale { age_seconds: 9.0 },
            NodeHealth::Unhealthy { reason: "x".into() },
        ];
        let mut checked = 0;
        for health in &healths {
            for (free, gpus) in [(0, 0), (0, 1), (2, 2), (2, 3)] {
                for (alloc, used, asked) in [
                    (0, 0, 0),
                    (4000, 3000, 1000),
                    (4000, 3000, 1001),
                    (1, 2, 0),
                    (1, 2, 1),
                ] {
                    let node = NodeState {
                        name: "n".into(),
                        profile: profile("nvidia", "T4", 16),
                        free_devices: free,
                        cpu_allocatable_milli: alloc,
                        cpu_requested_milli: used,
                        memory_allocatable_bytes: alloc << 20,
                        memory_requested_bytes: used << 20,
                        health: health.clone(),
                    };
                    for (cpu, memory) in [(asked, 0), (0, asked << 20), (asked, asked << 20)] {
                        let pod = PodSpec {
                            namespace: "d".into(),
                            name: "p".into(),
                            class: None,
                            gpus,
                            cpu_milli: cpu,
                            memory_bytes: memory,
                            ..Default::default()
                        };
                        let fits = node_kind_fits(&node, &pod);
                        assert_eq!(
                            fits,
                            check_node_kind(&node, &pod).is_ok(),
                            "{node:?} {pod:?}"
                        );
                        checked += usize::from(fits);
                    }
                }
            }
        }
        assert!(checked > 10, "some pods fit: {checked}");
    }

    #[test]
    fn class_constraints_explain_themselves() {
        let cfg = ClassConfig {
            allowed_vendors: vec!["NVIDIA".into()],
            allowed_models: vec!["MI300X".into()],
            min_device_memory_bytes: 24 << 30,
            threshold_factor: None,
        };
        assert!(check_profile("llm", Some(&cfg), &profile("nvidia", "A100", 80)).is_ok());
        assert!(check_profile("llm", Some(&cfg), &profile("amd", "mi300x", 192)).is_ok());
        let e = check_profile("llm", Some(&cfg), &profile("amd", "MI250", 64)).unwrap_err();
        assert!(e.contains("allows vendors"), "{e}");
        let e = check_profile("llm", Some(&cfg), &profile("nvidia", "T4", 16)).unwrap_err();
        assert!(e.contains("needs 24.0 GiB"), "{e}");
        assert!(check_profile("any", None, &profile("x", "y", 1)).is_ok());
    }

    #[test]
    fn vendors_come_from_the_pod_then_the_class_then_the_default() {
        let pod = |vendors: &[&str]| PodSpec {
            vendors: vendors.iter().map(|v| (*v).to_owned()).collect(),
            ..crate::tests::pod(Some("c"))
        };
        let config = SchedulerConfig::default();
        let (nv, amd) = (profile("nvidia", "A100", 80), profile("amd", "MI300X", 192));
        let kind = |r: Result<(), (RejectionKind, String)>| r.map_err(|(k, _)| k);
        // Nothing declared: the default, NVIDIA.
        assert_eq!(config.default_vendors, ["nvidia"]);
        assert!(check_vendor(&pod(&[]), None, &config, &nv).is_ok());
        let (k, why) = check_vendor(&pod(&[]), None, &config, &amd).unwrap_err();
        assert_eq!(k, RejectionKind::VendorNotAllowed);
        assert!(k.is_permanent());
        assert!(
            why.contains("without kudos.dev/vendors allows nvidia"),
            "{why}"
        );
        // The pod's own list wins, whatever the default.
        assert!(check_vendor(&pod(&["amd"]), None, &config, &amd).is_ok());
        assert_eq!(
            kind(check_vendor(&pod(&["amd"]), None, &config, &nv)),
            Err(RejectionKind::VendorNotAllowed)
        );
        // A class that restricts vendors or models decides for pods that name none.
        let class = ClassConfig {
            allowed_models: vec!["MI300X".into()],
            ..Default::default()
        };
        assert!(check_vendor(&pod(&[]), Some(&class), &config, &amd).is_ok());
        // An empty default lets such pods use any vendor.
        let open = SchedulerConfig {
            default_vendors: Vec::new(),
            ..SchedulerConfig::default()
        };
        assert!(check_vendor(&pod(&[]), None, &open, &amd).is_ok());
        let blank = SchedulerConfig {
            default_vendors: vec![" ".into()],
            ..SchedulerConfig::default()
        };
        assert!(blank.validate().is_err());
    }
}
