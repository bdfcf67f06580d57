//! Device inventory from ResourceSlices of the Kudos DRA driver (`gpu.kudos.dev`): on a DRA
//! node these are the devices the scheduler allocates from, tainted ones excluded. The index
//! counts a DRA node's free devices from them (the plugin's report is the fallback until the
//! slice is seen) and takes the node's device profile from them when no plugin has reported.
//! Kept per slice, summed per node; the watch in `crate::watch` is the only writer.

use k8s_openapi::api::resource::v1::ResourceSlice;
use kudos_api::dra::{CAPACITY_MEMORY, DRIVER, UNHEALTHY_TAINT_KEY, attribute};
use std::collections::BTreeMap;

/// Slices kept at most: beyond it, new slices are ignored (logged). Each node publishes one.
pub const MAX_SLICES: usize = 100_000;

/// One node-local slice of the Kudos driver, summarised.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceDevices {
    /// The node it is local to.
    pub node: String,
    /// Devices.
    pub total: u32,
    /// Devices without the unhealthy taint.
    pub healthy: u32,
    /// Vendor, model and memory of its first device (the plugin publishes one model per
    /// node, as it reports one profile).
    pub vendor: String,
    /// Model.
    pub model: String,
    /// Device memory in bytes.
    pub memory_bytes: u64,
}

/// The summary of `slice`, or `None` when it is not a node-local slice of the Kudos driver.
pub fn summarise(slice: &ResourceSlice) -> Option<SliceDevices> {
    let spec = &slice.spec;
    if spec.driver != DRIVER {
        return None;
    }
    let node = spec.node_name.clone().filter(|n| !n.is_empty())?;
    let devices = spec.devices.as_deref().unwrap_or_default();
    let healthy = devices
        .iter()
        .filter(|d| {
            !d.taints
                .iter()
                .flatten()
                .any(|t| t.key == UNHEALTHY_TAINT_KEY)
        })
        .count();
    let first = devices.first();
    let attr = |name: &str| {
        first
            .and_then(|d| d.attributes.as_ref())
            .and_then(|a| a.get(name))
            .and_then(|v| v.string.clone())
            .unwrap_or_default()
    };
    let memory_bytes = first
        .and_then(|d| d.capacity.as_ref())
        .and_then(|c| c.get(CAPACITY_MEMORY))
        .and_then(|c| crate::quantity::units(&c.value.0))
        .unwrap_or(0);
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    Some(SliceDevices {
        node,
        total: count(devices.len()),
        healthy: count(healthy),
        vendor: attr(attribute::VENDOR),
        model: attr(attribute::MODEL),
        memory_bytes,
    })
}

/// Every Kudos-driver slice, by node (read per candidate node on every filter) and by name.
#[derive(Debug, Default)]
pub struct SliceInventory {
    by_node: BTreeMap<String, BTreeMap<String, SliceDevices>>,
    node_of: BTreeMap<String, String>,
}

impl SliceInventory {
    /// Adds or replaces slice `name` (`None`: not ours, forgotten). Returns whether what is
    /// kept changed.
    pub fn apply(&mut self, name: &str, devices: Option<SliceDevices>) -> bool {
        let kept = self
            .node_of
            .get(name)
            .and_then(|node| self.by_node.get(node)?.get(name));
        if kept == devices.as_ref() {
            return false;
        }
        let had = kept.is_some();
        if let Some(old) = self.node_of.remove(name)
            && let Some(m) = self.by_node.get_mut(&old)
        {
            m.remove(name);
            if m.is_empty() {
                self.by_node.remove(&old);
            }
        }
        let Some(d) = devices else {
            return true;
        };
        if self.node_of.len() >= MAX_SLICES {
            tracing::warn!(
                slice = name,
                limit = MAX_SLICES,
                "too many ResourceSlices of the Kudos driver; ignoring this one"
            );
            return had;
        }
        self.node_of.insert(name.to_owned(), d.node.clone());
        self.by_node
            .entry(d.node.clone())
            .or_default()
            .insert(name.to_owned(), d);
        true
    }

    /// Replaces everything (a watch restart's full list).
    pub fn reset(&mut self, all: Vec<(String, SliceDevices)>) {
        self.by_node.clear();
        self.node_of.clear();
        for (name, d) in all {
            self.apply(&name, Some(d));
        }
    }

    /// `node`'s devices over all its slices, as (healthy, total), with its first slice's
    /// summary for the profile; `None` when it has none.
    pub fn node(&self, node: &str) -> Option<((u32, u32), &SliceDevices)> {
        let slices = self.by_node.get(node)?;
        let first = slices.values().next()?;
        let counts = slices.values().fold((0u32, 0u32), |(h, t), d| {
            (h.saturating_add(d.healthy), t.saturating_add(d.total))
        });
        Some((counts, first))
    }

    /// Slices kept.
    pub fn len(&self) -> usize {
        self.node_of.len()
    }

    /// Whether no slice is kept.
    pub fn is_empty(&self) -> bool {
        self.node_of.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(driver: &str, node: Option<&str>, tainted: &[bool]) -> ResourceSlice {
        let devices: Vec<_> = tainted
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let taints = t.then(
                    || serde_json::json!([{"key": UNHEALTHY_TAINT_KEY, "effect": "NoSchedule"}]),
                );
                serde_json::json!({
                    "name": format!("gpu-{i}"),
                    "attributes": {"vendor": {"string": "nvidia"}, "model": {"string": "Tesla T4"}},
                    "capacity": {"memory": {"value": "16Gi"}},
                    "taints": taints,
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": "p", "generation": 1,
                     "resourceSliceCount": 1}, "devices": devices},
        }))
        .expect("slice")
    }

    #[test]
    fn a_slice_counts_its_untainted_devices_and_names_the_model() {
        let s = summarise(&slice(DRIVER, Some("n1"), &[false, true, false])).expect("ours");
        assert_eq!(
            s,
            SliceDevices {
                node: "n1".into(),
                total: 3,
                healthy: 2,
                vendor: "nvidia".into(),
                model: "Tesla T4".into(),
                memory_bytes: 16 << 30,
            }
        );
        assert_eq!(
            summarise(&slice("gpu.nvidia.com", Some("n1"), &[false])),
            None
        );
        assert_eq!(
            summarise(&slice(DRIVER, None, &[false])),
            None,
            "not node-local"
        );
    }

    #[test]
    fn slices_sum_per_node_and_go_when_deleted() {
        let mut inv = SliceInventory::default();
        let d = |node: &str, healthy, total| SliceDevices {
            node: node.into(),
            healthy,
            total,
            ..Default::default()
        };
        inv.apply("a-1", Some(d("a", 3, 4)));
        inv.apply("a-2", Some(d("a", 2, 2)));
        assert!(inv.apply("b-1", Some(d("b", 1, 1))));
        assert!(!inv.apply("b-1", Some(d("b", 1, 1))), "the same again");
        assert!(!inv.apply("c-1", None), "an unknown slice gone");
        assert_eq!(inv.node("a").map(|n| n.0), Some((5, 6)));
        inv.apply("a-2", None);
        assert_eq!(inv.node("a").map(|n| n.0), Some((3, 4)));
        assert!(inv.node("c").is_none());
        inv.reset(vec![("b-1".into(), d("b", 0, 1))]);
        assert!(inv.node("a").is_none());
        assert_eq!(inv.node("b").map(|n| n.0), Some((0, 1)));
        assert_eq!(inv.len(), 1);
    }
}
