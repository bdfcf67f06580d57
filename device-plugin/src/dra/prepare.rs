//! From an allocated ResourceClaim to what the container gets: pure, no I/O.
//!
//! The claim's `status.allocation.devices.results` entries for this driver and this node's
//! pool name the devices; each maps back to a local device through its DRA name. Devices are
//! grouped by request and backend, and each group's backend allocates them exactly as the
//! device-plugin `Allocate` does ([`DeviceBackend::allocate`]): a request is what one
//! container gets (the scheduler gives each container of an extended-resource pod its own
//! request), so its devices share one environment (`NVIDIA_VISIBLE_DEVICES=a,b`) and each
//! device brings its own device nodes.

use super::cdi;
use super::checkpoint::{PreparedClaim, PreparedDevice};
use crate::backend::{Backends, Device, DeviceBackend};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kudos_api::dra::DRIVER;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The local devices by DRA device name: name → device ID.
pub fn device_names(backends: &Backends) -> BTreeMap<String, String> {
    backends
        .devices()
        .map(|d| (kudos_api::dra::device_name(&d.id), d.id.clone()))
        .collect()
}

/// Whether a claim UID from the kubelet is safe in a file name (`[A-Za-z0-9-]`, 1 to 64
/// characters; Kubernetes UIDs are 36).
pub fn valid_uid(uid: &str) -> bool {
    (1..=64).contains(&uid.len()) && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Checks the claim identity the kubelet sent before it becomes part of an API path.
pub fn check_claim_ref(namespace: &str, name: &str, uid: &str) -> Result<(), String> {
    if !valid_uid(uid) {
        return Err(format!("claim UID {uid:?} is not a UID"));
    }
    if namespace.len() > 63 || !kudos_api::bounds::is_dns_label(namespace) {
        return Err(format!(
            "claim namespace {namespace:?} is not a namespace name"
        ));
    }
    if !kudos_api::bounds::is_dns_subdomain(name) {
        return Err(format!("claim name {name:?} is not an object name"));
    }
    Ok(())
}

/// The request a result belongs to, without a subrequest (`gpu/large` → `gpu`).
fn base_request(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

/// One of our results: its request, backend and device.
struct Entry<'a> {
    request: &'a str,
    backend: &'a Arc<dyn DeviceBackend>,
    device: &'a Device,
    name: &'a str,
}

/// What preparing `claim` (the kubelet asked for `uid`) on `node` gives, or why it cannot
/// be prepared.
pub fn plan(
    claim: &ResourceClaim,
    uid: &str,
    node: &str,
    backends: &Backends,
    names: &BTreeMap<String, String>,
) -> Result<PreparedClaim, String> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let found = claim.metadata.uid.as_deref().unwrap_or_default();
    if found != uid {
        return Err(format!(
            "claim {namespace}/{name} has UID {found}, not {uid}: it was deleted and re-created"
        ));
    }
    let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(format!("claim {namespace}/{name} is not allocated"));
    };
    let results = allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    let mut entries = Vec::new();
    let mut seen = BTreeSet::new();
    for r in results.iter().filter(|r| r.driver == DRIVER) {
        if r.pool != node {
            return Err(format!(
                "device {} is allocated from pool {:?}; this node's pool is {node:?}",
                r.device, r.pool
            ));
        }
        let Some((backend, device)) = names.get(&r.device).and_then(|id| backends.lookup(id))
        else {
            return Err(format!("device {} is not a device of this node", r.device));
        };
        if !seen.insert(r.device.as_str()) {
            return Err(format!(
                "device {} is allocated twice in one claim",
                r.device
            ));
        }
        entries.push(Entry {
            request: base_request(&r.request),
            backend,
            device,
            name: &r.device,
        });
    }

    // Each (request, backend) group's allocation: its environment is shared by its devices.
    let mut groups: Vec<(&str, &Arc<dyn DeviceBackend>, Vec<&Device>)> = Vec::new();
    for e in &entries {
        match groups
            .iter_mut()
            .find(|(r, b, _)| *r == e.request && Arc::ptr_eq(b, e.backend))
        {
            Some((_, _, devices)) => devices.push(e.device),
            None => groups.push((e.request, e.backend, vec![e.device])),
        }
    }
    let allocations: Vec<_> = groups
        .iter()
        .map(|(r, b, devices)| (*r, *b, b.allocate(devices)))
        .collect();

    let mut devices = Vec::with_capacity(entries.len());
    let mut cdi_devices = Vec::with_capacity(entries.len());
    for e in &entries {
        let Some((_, _, group)) = allocations
            .iter()
            .find(|(r, b, _)| *r == e.request && Arc::ptr_eq(b, e.backend))
        else {
            continue; // every entry has its group
        };
        let own = e.backend.allocate(&[e.device]);
        let cdi_name = cdi::device_name(uid, e.name);
        let mut ids = vec![cdi::qualified(&cdi_name)];
        // A vendor's own CDI devices (`--cdi`: nvidia.com/gpu=<uuid>) are passed on too.
        ids.extend(own.cdi_devices.iter().cloned());
        cdi_devices.push(cdi::device(cdi_name, group, &own));
        devices.push(PreparedDevice {
            request_names: vec![e.request.to_owned()],
            pool_name: node.to_owned(),
            device_name: e.name.to_owned(),
            cdi_device_ids: ids,
        });
    }
    Ok(PreparedClaim {
        namespace,
        name,
        devices,
        cdi_spec: cdi::spec(cdi_devices),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::backend::fake::FakeBackend;
    use k8s_openapi::api::resource::v1 as res;

    fn backends() -> Backends {
        let a: Arc<dyn DeviceBackend> = Arc::new(FakeBackend::new("acme", 3, 1));
        let b: Arc<dyn DeviceBackend> = Arc::new(FakeBackend::new("beta", 1, 1));
        Backends::new(vec![a, b]).expect("backends")
    }

    /// One allocation result of this driver.
    pub(crate) fn result(
        request: &str,
        pool: &str,
        device: &str,
    ) -> res::DeviceRequestAllocationResult {
        res::DeviceRequestAllocationResult {
            request: request.into(),
            driver: DRIVER.into(),
            pool: pool.into(),
            device: device.into(),
            ..Default::default()
        }
    }

    fn claim(results: Vec<res::DeviceRequestAllocationResult>) -> ResourceClaim {
        allocated_claim("train", "u-1", results)
    }

    /// Claim `ml/<name>` with UID `uid`, allocated `results`.
    pub(crate) fn allocated_claim(
        name: &str,
        uid: &str,
        results: Vec<res::DeviceRequestAllocationResult>,
    ) -> ResourceClaim {
        let mut c = ResourceClaim::default();
        c.metadata.namespace = Some("ml".into());
        c.metadata.name = Some(name.into());
        c.metadata.uid = Some(uid.into());
        c.status = Some(res::ResourceClaimStatus {
            allocation: Some(res::AllocationResult {
                devices: Some(res::DeviceAllocationResult {
                    results: Some(results),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        c
    }

    #[test]
    fn devices_of_one_request_share_its_environment_and_keep_their_own_nodes() {
        let b = backends();
        let names = device_names(&b);
        let mut other = result("nic", "node-a", "eth0");
        other.driver = "net.example.com".into();
        let c = claim(vec![
            result("gpus", "node-a", "acme-dev0"),
            other,
            result("gpus", "node-a", "acme-dev2"),
            result("one/small", "node-a", "acme-dev1"),
            result("gpus", "node-a", "beta-dev0"),
        ]);
        let p = plan(&c, "u-1", "node-a", &b, &names).expect("plan");
        assert_eq!((p.namespace.as_str(), p.name.as_str()), ("ml", "train"));
        let wire: Vec<(&str, &str)> = p
            .devices
            .iter()
            .map(|d| (d.request_names[0].as_str(), d.device_name.as_str()))
            .collect();
        // Results order, other drivers skipped, subrequests reported as their request.
        assert_eq!(
            wire,
            [
                ("gpus", "acme-dev0"),
                ("gpus", "acme-dev2"),
                ("one", "acme-dev1"),
                ("gpus", "beta-dev0")
            ]
        );
        assert_eq!(
            p.devices[0].cdi_device_ids,
            ["gpu.kudos.dev/gpu=u-1-acme-dev0"]
        );
        assert!(p.devices.iter().all(|d| d.pool_name == "node-a"));
        let spec = &p.cdi_spec;
        assert_eq!(spec.devices.len(), 4);
        let env = |i: usize| spec.devices[i].container_edits.env.clone();
        assert_eq!(env(0), ["ACME_VISIBLE_DEVICES=acme-uuid-0,acme-uuid-2"]);
        assert_eq!(env(1), env(0), "one request, one environment");
        assert_eq!(env(2), ["ACME_VISIBLE_DEVICES=acme-uuid-1"]);
        assert_eq!(env(3), ["BETA_VISIBLE_DEVICES=beta-uuid-0"]);
        let nodes: Vec<&str> = spec.devices[1]
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(nodes, ["/dev/shared", "/dev/acme-dev2"]);
    }

    #[test]
    fn claims_that_cannot_be_prepared_here_say_why() {
        let b = backends();
        let names = device_names(&b);
        let ok = claim(vec![result("gpu", "node-a", "acme-dev0")]);
        let cases = [
            (plan(&ok, "u-2", "node-a", &b, &names), "re-created"),
            (plan(&ok, "u-1", "node-b", &b, &names), "pool"),
            (
                plan(
                    &claim(vec![result("gpu", "node-a", "acme-dev9")]),
                    "u-1",
                    "node-a",
                    &b,
                    &names,
                ),
                "not a device of this node",
            ),
            (
                plan(
                    &claim(vec![
                        result("a", "node-a", "acme-dev0"),
                        result("b", "node-a", "acme-dev0"),
                    ]),
                    "u-1",
                    "node-a",
                    &b,
                    &names,
                ),
                "twice",
            ),
        ];
        for (got, says) in cases {
            let e = got.expect_err(says);
            assert!(e.contains(says), "{e}");
        }
        let mut unallocated = ok.clone();
        unallocated.status = None;
        let e = plan(&unallocated, "u-1", "node-a", &b, &names).expect_err("unallocated");
        assert!(e.contains("not allocated"), "{e}");
        // A claim with none of our devices prepares to nothing.
        let p = plan(&claim(vec![]), "u-1", "node-a", &b, &names).expect("empty");
        assert!(p.devices.is_empty() && p.cdi_spec.devices.is_empty());
    }

    #[test]
    fn claim_references_are_checked_before_use_in_paths() {
        assert!(check_claim_ref("ml", "train-0", "0b6e3c9a-1d2f-4e5a-9b8c-7d6e5f4a3b2c").is_ok());
        assert!(check_claim_ref("ml", "train", "../../etc").is_err());
        assert!(check_claim_ref("ml", "train", "").is_err());
        assert!(check_claim_ref("ml/x", "train", "u").is_err());
        assert!(check_claim_ref("ml", "a/b", "u").is_err());
        assert!(check_claim_ref("ml", "", "u").is_err());
    }
}
