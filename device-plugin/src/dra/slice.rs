//! The node's ResourceSlice: one slice, one pool (named after the node), one device per
//! discovered device, for the driver `gpu.kudos.dev`.
//!
//! Building is pure ([`devices`], [`build`]); [`Publisher`] applies it (server-side apply,
//! field manager `kudos-device-plugin`, name `<node>-gpu.kudos.dev`) whenever the content
//! changes, bumping the pool generation. The content's hash is kept in an annotation so a
//! periodic check (and one after each kubelet registration: a starting kubelet deletes its
//! node's slices) can tell from one GET whether the stored slice is still ours and current.
//!
//! An unhealthy device stays in the slice with a `NoSchedule` taint (KEP-5055), so the
//! scheduler allocates it to no new claim while claims already using it are left alone.

use crate::backend::{Arch, Backends, Health};
use crate::health::HealthMap;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kudos_api::dra::{self, attribute};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// Server-side apply field manager.
pub const FIELD_MANAGER: &str = "kudos-device-plugin";
/// Annotation holding the hash of the published devices.
pub const CONTENT_HASH_ANNOTATION: &str = "gpu.kudos.dev/content-hash";
/// Most devices one slice may hold when a device carries a taint (the API server's
/// `ResourceSliceMaxDevicesWithAdvancedFeatures`).
pub const MAX_DEVICES: usize = 64;
/// Longest string attribute value the API server accepts.
pub const MAX_ATTRIBUTE_LEN: usize = 64;

/// Publishing errors.
#[derive(Debug, thiserror::Error)]
pub enum SliceError {
    /// The API server refused or could not be reached.
    #[error("{action} ResourceSlice {name}: {source}{}", hint(.source))]
    Api {
        /// What was being done.
        action: &'static str,
        /// The slice.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// A hint for the operator on the usual refusals.
fn hint(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) if s.code == 403 => {
            " (RBAC: the plugin's ServiceAccount needs get, create, patch and delete on resourceslices.resource.k8s.io, and get on resourceclaims)"
        }
        kube::Error::Api(s) if s.code == 404 => {
            " (is resource.k8s.io/v1 served? DRA needs Kubernetes 1.34 or later with the DynamicResourceAllocation feature on)"
        }
        kube::Error::Api(s) if s.code == 422 => {
            " (the API server rejected the slice; device taints need the DRADeviceTaints feature, GA in 1.37)"
        }
        _ => "",
    }
}

/// The slice's name: `<node>-gpu.kudos.dev`, or, when that is no valid object name (a node
/// name near the length limits), a readable prefix of the node name and a hash of all of it.
pub fn slice_name(node: &str) -> String {
    let name = format!("{node}-{}", dra::DRIVER);
    if kudos_api::bounds::is_dns_subdomain(&name) {
        return name;
    }
    // `<prefix>-<8 hex>-gpu` is the first label: at most 50 + 1 + 8 + 4 = 63 characters.
    let mut base: String = node
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() { c } else { '-' }
        })
        .collect();
    base.truncate(50);
    let base = base.trim_matches('-');
    let h = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let base = if base.is_empty() { "node" } else { base };
    format!("{base}-{:08x}-{}", h as u32, dra::DRIVER)
}

fn string_attr(value: &str) -> Option<res::DeviceAttribute> {
    (value.len() <= MAX_ATTRIBUTE_LEN).then(|| res::DeviceAttribute {
        string: Some(value.to_owned()),
        ..Default::default()
    })
}

/// Device attributes whose values are too long for a ResourceSlice (left out of it), as
/// `(device ID, attribute)`.
pub fn oversized_attributes(backends: &Backends) -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    for d in backends.devices() {
        for (name, value) in [(attribute::MODEL, &d.model), (attribute::UUID, &d.uuid)] {
            if value.len() > MAX_ATTRIBUTE_LEN {
                out.push((d.id.clone(), name));
            }
        }
    }
    out
}

/// The slice's devices: at most [`MAX_DEVICES`], in discovery order, each with its
/// attributes, memory capacity and, when unhealthy, the unhealthy taint.
pub fn devices(backends: &Backends, health: &HealthMap) -> Vec<res::Device> {
    // Devices per vendor, for the profile (`vendor|model|count|memory`, the orchestrator's
    // ProfileRecord: count is the vendor's devices on the node).
    let mut per_vendor: BTreeMap<&str, usize> = BTreeMap::new();
    for d in backends.devices() {
        *per_vendor.entry(d.vendor.as_str()).or_default() += 1;
    }
    backends
        .devices()
        .take(MAX_DEVICES)
        .map(|d| {
            let count = per_vendor.get(d.vendor.as_str()).copied().unwrap_or(1);
            let profile = format!("{}|{}|{count}|{}", d.vendor, d.model, d.memory_bytes);
            let mut attributes = BTreeMap::new();
            let strings = [
                (attribute::VENDOR, d.vendor.as_str()),
                (attribute::MODEL, d.model.as_str()),
                (attribute::PROFILE, profile.as_str()),
                (attribute::DEVICE_ID, d.id.as_str()),
                (attribute::UUID, d.uuid.as_str()),
            ];
            for (name, value) in strings {
                if let Some(a) = string_attr(value) {
                    attributes.insert(name.to_owned(), a);
                }
            }
            match &d.arch {
                Some(Arch::Cuda(major, minor)) => {
                    attributes.insert(
                        attribute::CUDA_COMPUTE_CAPABILITY.to_owned(),
                        res::DeviceAttribute {
                            version: Some(format!("{major}.{minor}.0")),
                            ..Default::default()
                        },
                    );
                }
                Some(Arch::Gfx(gfx)) => {
                    if let Some(a) = string_attr(gfx) {
                        attributes.insert(attribute::GFX_VERSION.to_owned(), a);
                    }
                }
                None => {}
            }
            if let Some(n) = d.numa_node {
                attributes.insert(
                    attribute::NUMA_NODE.to_owned(),
                    res::DeviceAttribute {
                        int: Some(n),
                        ..Default::default()
                    },
                );
            }
            let capacity = (d.memory_bytes > 0).then(|| {
                [(
                    dra::CAPACITY_MEMORY.to_owned(),
                    res::DeviceCapacity {
                        value: Quantity(d.memory_bytes.to_string()),
                        request_policy: None,
                    },
                )]
                .into()
            });
            let taints = (health.get(&d.id) == Some(&Health::Unhealthy)).then(|| {
                vec![res::DeviceTaint {
                    key: dra::UNHEALTHY_TAINT_KEY.to_owned(),
                    effect: "NoSchedule".to_owned(),
                    value: None,
                    time_added: None,
                }]
            });
            res::Device {
                name: dra::device_name(&d.id),
                attributes: Some(attributes),
                capacity,
                taints,
                ..Default::default()
            }
        })
        .collect()
}

/// Hash of the devices (64-bit FNV-1a of their JSON), the slice's content identity.
pub fn content_hash(devices: &[res::Device]) -> String {
    let bytes = serde_json::to_vec(devices).unwrap_or_default();
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{h:016x}")
}

/// The node's slice with `devices` at pool `generation`.
pub fn build(
    node: &str,
    devices: Vec<res::Device>,
    generation: i64,
    owner: Option<OwnerReference>,
) -> res::ResourceSlice {
    let mut slice = res::ResourceSlice::default();
    slice.metadata.name = Some(slice_name(node));
    slice.metadata.annotations =
        Some([(CONTENT_HASH_ANNOTATION.to_owned(), content_hash(&devices))].into());
    slice.metadata.owner_references = owner.map(|o| vec![o]);
    slice.spec = res::ResourceSliceSpec {
        driver: dra::DRIVER.to_owned(),
        node_name: Some(node.to_owned()),
        pool: res::ResourcePool {
            name: node.to_owned(),
            generation,
            resource_slice_count: 1,
        },
        devices: Some(devices),
        ..Default::default()
    };
    slice
}

// === impl Publisher ===

/// Keeps the node's slice current.
pub struct Publisher {
    slices: Api<res::ResourceSlice>,
    nodes: Api<Node>,
    node: String,
    name: String,
    backends: Backends,
    generation: i64,
    /// Hash of what was last applied (or found current).
    published: Option<String>,
    /// The Node as owner (garbage collection with the Node); looked up once.
    owner: Option<Option<OwnerReference>>,
}

impl Publisher {
    /// A publisher for `node`'s devices.
    pub fn new(client: kube::Client, node: String, backends: Backends) -> Self {
        Publisher {
            slices: Api::all(client.clone()),
            nodes: Api::all(client),
            name: slice_name(&node),
            node,
            backends,
            generation: 0,
            published: None,
            owner: None,
        }
    }

    /// The slice's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn err(&self, action: &'static str) -> impl FnOnce(kube::Error) -> SliceError + '_ {
        move |source| SliceError::Api {
            action,
            name: self.name.clone(),
            source,
        }
    }

    async fn owner(&mut self) -> Option<OwnerReference> {
        if let Some(o) = &self.owner {
            return o.clone();
        }
        let found = match self.nodes.get_opt(&self.node).await {
            Ok(Some(n)) => n.metadata.uid.map(|uid| OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: self.node.clone(),
                uid,
                controller: Some(true),
                block_owner_deletion: None,
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::info!(node = %self.node, error = %e, "cannot read the Node; the ResourceSlice gets no owner (it is not garbage-collected with the Node)");
                None
            }
        };
        self.owner = Some(found.clone());
        found
    }

    /// Makes the stored slice match `health`. Without `check_server` a content equal to the
    /// last one applied is not looked at again. Returns whether the slice was written.
    pub async fn reconcile(
        &mut self,
        health: &HealthMap,
        check_server: bool,
    ) -> Result<bool, SliceError> {
        let devices = devices(&self.backends, health);
        let hash = content_hash(&devices);
        if !check_server && self.published.as_deref() == Some(hash.as_str()) {
            return Ok(false);
        }
        let stored = self
            .slices
            .get_opt(&self.name)
            .await
            .map_err(self.err("reading"))?;
        if let Some(s) = &stored {
            let stored_hash = s
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CONTENT_HASH_ANNOTATION));
            self.generation = self.generation.max(s.spec.pool.generation);
            if stored_hash == Some(&hash) && s.spec.node_name.as_deref() == Some(&self.node) {
                self.published = Some(hash);
                return Ok(false);
            }
        }
        let generation = self.generation + 1;
        let owner = self.owner().await;
        let slice = build(&self.node, devices, generation, owner);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        self.slices
            .patch(&self.name, &params, &Patch::Apply(&slice))
            .await
            .map_err(self.err("applying"))?;
        self.generation = generation;
        self.published = Some(hash);
        tracing::info!(slice = %self.name, generation, created = stored.is_none(), "published the ResourceSlice");
        Ok(true)
    }

    /// Deletes the slice (the node stops using DRA); a missing one is fine.
    pub async fn withdraw(&mut self) -> Result<(), SliceError> {
        match self
            .slices
            .delete(&self.name, &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(self.err("deleting")(e)),
        }
        self.published = None;
        tracing::info!(slice = %self.name, "withdrew the ResourceSlice");
        Ok(())
    }
}

/// Publishes on every health change, on `poke` (the kubelet registered us: a starting kubelet
/// deletes its node's slices) and every `resync`, retrying failures with back-off up to
/// `resync`, until `stop` changes.
pub async fn run(
    mut publisher: Publisher,
    mut health: watch::Receiver<Arc<HealthMap>>,
    poke: Arc<Notify>,
    resync: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut check_server = true;
    let mut backoff = Duration::from_millis(500);
    let mut failing: Option<String> = None;
    loop {
        let snapshot = health.borrow_and_update().clone();
        let wait = match publisher.reconcile(&snapshot, check_server).await {
            Ok(_) => {
                if failing.take().is_some() {
                    tracing::info!(slice = %publisher.name(), "publishing the ResourceSlice works again");
                }
                backoff = Duration::from_millis(500);
                check_server = false;
                resync
            }
            Err(e) => {
                let text = e.to_string();
                if failing.as_deref() != Some(text.as_str()) {
                    tracing::error!(error = %text, retry_in = ?backoff, "cannot publish the ResourceSlice; the scheduler does not see this node's devices until it works (repeats of this error are logged at debug)");
                } else {
                    tracing::debug!(error = %text, retry_in = ?backoff, "publishing the ResourceSlice failed again");
                }
                failing = Some(text);
                let wait = backoff;
                backoff = (backoff * 2).min(resync);
                check_server = true;
                wait
            }
        };
        tokio::select! {
            _ = stop.changed() => return,
            changed = health.changed() => if changed.is_err() { return },
            _ = poke.notified() => check_server = true,
            _ = tokio::time::sleep(wait) => check_server = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{DeviceBackend, fake::FakeBackend};

    fn backends(n: usize) -> Backends {
        let fake: Arc<dyn DeviceBackend> = Arc::new(FakeBackend::new("acme", n, 2));
        Backends::new(vec![fake]).expect("backends")
    }

    #[test]
    fn every_device_is_published_with_its_attributes_and_memory() {
        let b = backends(3);
        let devs = devices(&b, &HealthMap::default());
        assert_eq!(devs.len(), 3);
        let d = &devs[2];
        assert_eq!(d.name, "acme-dev2");
        let attrs = d.attributes.as_ref().expect("attributes");
        let s = |k: &str| attrs.get(k).and_then(|a| a.string.clone());
        assert_eq!(s(attribute::VENDOR).as_deref(), Some("acme"));
        assert_eq!(s(attribute::MODEL).as_deref(), Some("acme model"));
        assert_eq!(s(attribute::DEVICE_ID).as_deref(), Some("acme-dev2"));
        assert_eq!(s(attribute::UUID).as_deref(), Some("acme-uuid-2"));
        assert_eq!(
            s(attribute::PROFILE).as_deref(),
            Some("acme|acme model|3|17179869184")
        );
        assert_eq!(attrs[attribute::NUMA_NODE].int, Some(1));
        let cap = d.capacity.as_ref().expect("capacity");
        assert_eq!(cap[dra::CAPACITY_MEMORY].value.0, "17179869184");
        assert!(d.taints.is_none());

        let slice = build("node-a", devs, 4, None);
        assert_eq!(slice.metadata.name.as_deref(), Some("node-a-gpu.kudos.dev"));
        assert_eq!(slice.spec.driver, "gpu.kudos.dev");
        assert_eq!(slice.spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(
            (
                slice.spec.pool.name.as_str(),
                slice.spec.pool.generation,
                slice.spec.pool.resource_slice_count
            ),
            ("node-a", 4, 1)
        );
        let json = serde_json::to_value(&slice).expect("json");
        assert_eq!(json["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(json["kind"], "ResourceSlice");
    }

    #[test]
    fn an_unhealthy_device_carries_the_no_schedule_taint_and_changes_the_hash() {
        let b = backends(2);
        let healthy = devices(&b, &HealthMap::default());
        let sick: HealthMap = [("acme-dev1".to_string(), Health::Unhealthy)].into();
        let tainted = devices(&b, &sick);
        assert!(tainted[0].taints.is_none());
        let t = &tainted[1].taints.as_ref().expect("taint")[0];
        assert_eq!(
            (t.key.as_str(), t.effect.as_str()),
            ("gpu.kudos.dev/unhealthy", "NoSchedule")
        );
        assert_ne!(content_hash(&healthy), content_hash(&tainted));
        assert_eq!(
            content_hash(&healthy),
            content_hash(&devices(&b, &HealthMap::default()))
        );
    }

    #[test]
    fn slice_names_are_valid_object_names() {
        assert_eq!(slice_name("gpu-1"), "gpu-1-gpu.kudos.dev");
        let long = format!("{}.{}", "n".repeat(40), "x".repeat(62));
        let name = slice_name(&long);
        assert!(name.len() <= 253, "{name}");
        assert!(kudos_api::bounds::is_dns_subdomain(&name), "{name}");
        assert!(name.ends_with("-gpu.kudos.dev"), "{name}");
        assert_ne!(slice_name(&long), slice_name(&format!("{long}x")));
    }

    #[test]
    fn over_long_values_are_left_out_and_reported() {
        let mut fake = FakeBackend::new("acme", 1, 1);
        fake.set_model(&"m".repeat(65));
        let b = Backends::new(vec![Arc::new(fake) as Arc<dyn DeviceBackend>]).expect("ok");
        let d = &devices(&b, &HealthMap::default())[0];
        let attrs = d.attributes.as_ref().expect("attributes");
        assert!(!attrs.contains_key(attribute::MODEL));
        assert!(!attrs.contains_key(attribute::PROFILE));
        assert!(attrs.contains_key(attribute::VENDOR));
        assert_eq!(
            oversized_attributes(&b),
            vec![("acme-dev0".to_string(), attribute::MODEL)]
        );
    }

    #[test]
    fn refusals_name_the_likely_cause() {
        let refused = |code: u16| {
            SliceError::Api {
                action: "applying",
                name: "n-gpu.kudos.dev".into(),
                source: kube::Error::Api(
                    kube::core::Status::failure("no", "Reason")
                        .with_code(code)
                        .boxed(),
                ),
            }
            .to_string()
        };
        assert!(refused(403).contains("RBAC"), "{}", refused(403));
        assert!(
            refused(404).contains("resource.k8s.io/v1"),
            "{}",
            refused(404)
        );
        assert!(refused(422).contains("DRADeviceTaints"), "{}", refused(422));
        assert!(refused(500).starts_with("applying ResourceSlice n-gpu.kudos.dev: "));
    }

    #[test]
    fn a_slice_holds_at_most_64_devices() {
        assert_eq!(devices(&backends(70), &HealthMap::default()).len(), 64);
    }
}
