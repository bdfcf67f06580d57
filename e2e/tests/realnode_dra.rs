//! Issue 17 on real nodes: one cluster, one resource name, two allocation APIs. Kudos is
//! installed with `helm install` and `dra.allocationApi=auto` on the two real nodes of
//! `realnode_kudos` (real kubelets v1.37, containerd with CDI, runc; four fake V100s on node
//! a, four fake T4s on node b). Node a keeps the device plugin through its
//! `kudos.dev/allocation-api=device-plugin` label; node b's kubelet is v1.37, so `auto` puts it
//! on DRA. The same pod spec (`kudos.dev/gpu: 1`, `schedulerName: kudos`) then:
//! - runs on node a through the device plugin (no claim), and on node b through a DRA claim
//!   the real kube-scheduler allocated from the plugin's ResourceSlice, the plugin prepared
//!   and containerd applied through CDI (the workload exits 1 unless it is given a device it
//!   can open through NVML), every pod placed after Kudos ranked it (its
//!   `kudos.dev/placement` annotation);
//! - every run is reported once (the node agent attributes DRA devices through PodResources);
//! - a device that raises XID 79 is tainted in the slice (the orchestrator counts 3 of 4 from
//!   it) and never allocated: with node a full, node b takes three pods and the eighth waits;
//! - deleting node b's plugin pod while its claims are prepared loses none: the jobs finish,
//!   the new plugin keeps the failing device tainted, prepares a new job's claim and
//!   unprepares the old ones from its checkpoint (every claim goes, every CDI spec file goes,
//!   the kubelet logs no unprepare failure);
//! - the host is left exactly as it was.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use kudos_api::dra::{AllocationApi, DRIVER, UNHEALTHY_TAINT_KEY};
use kudos_api::labels;
use kudos_e2e::proc::wait_for;
use kudos_e2e::realnode::scenario::{
    self, InstallOptions, NODE_A, NODE_B, Reaper, job_with_work, model_runs, state,
};
use kudos_e2e::realnode::{NODE_LABEL, RealCluster, gpus};
use kudos_e2e::{RunDir, require_bins};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Jobs of the first wave: one per device, all running at once, so both nodes take four.
const FIRST: usize = 8;
/// Work units of a first-wave job: 10 s on its class's fast model, 30 s on the other, so no
/// job ends before the last is placed.
const FIRST_WORK: f64 = 30.0;
/// Jobs of the second wave (node b has one device fewer then).
const SECOND: usize = 8;
/// Work units of a second-wave job: 15 s on its class's fast model, 45 s on the other, long
/// enough to restart node b's plugin while its claims are prepared.
const LONG_WORK: f64 = 45.0;
/// The device of node b that raises XIDs.
const SICK: u32 = 1;

/// Every claim seen while it was allocated: claim name → (pod it was reserved for, devices as
/// `pool/device`). Generated claims go with their pods, so they are recorded as they appear.
#[derive(Clone, Default)]
struct Claims(Arc<Mutex<Seen>>);

/// Claim name → (its pod, its devices as `pool/device`).
type Seen = BTreeMap<String, (String, Vec<String>)>;

impl Claims {
    fn spawn(api: Api<ResourceClaim>) -> (Self, tokio::task::JoinHandle<()>) {
        let seen = Claims::default();
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                loop {
                    if let Ok(list) = api.list(&ListParams::default()).await {
                        for c in list.items {
                            let devices: Vec<String> = kudos_e2e::dra::allocated(&c)
                                .iter()
                                .filter(|r| r.driver == DRIVER)
                                .map(|r| format!("{}/{}", r.pool, r.device))
                                .collect();
                            let pod = c
                                .status
                                .as_ref()
                                .and_then(|s| s.reserved_for.as_ref())
                                .and_then(|r| r.first())
                                .map(|r| r.name.clone())
                                .unwrap_or_default();
                            if let (Some(name), false) = (c.metadata.name, devices.is_empty())
                                && let Ok(mut m) = seen.0.lock()
                            {
                                m.entry(name).or_insert((pod, devices));
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        });
        (seen, task)
    }

    fn snapshot(&self) -> Seen {
        self.0.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// Node b's devices in its ResourceSlices: name → unhealthy-tainted.
async fn slice_devices(slices: &Api<ResourceSlice>) -> Option<BTreeMap<String, bool>> {
    let lp = ListParams::default().fields(&format!("spec.nodeName={NODE_B},spec.driver={DRIVER}"));
    let mut out = BTreeMap::new();
    for s in slices.list(&lp).await.ok()?.items {
        for d in s.spec.devices.unwrap_or_default() {
            let tainted = d
                .taints
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == UNHEALTHY_TAINT_KEY);
            out.insert(d.name, tainted);
        }
    }
    Some(out)
}

/// Deletes every job pod and waits until each claim is gone (the plugin unprepared it, the
/// kubelet released it, the claim controller deleted it) and node b's CDI directory `cdi` is
/// empty again.
async fn remove_jobs(client: &kube::Client, cdi: &std::path::Path) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    pods.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    wait_for(
        "every job pod, ResourceClaim and CDI spec gone",
        Duration::from_secs(120),
        Duration::from_millis(500),
        async || {
            let no_pods = pods
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty();
            let no_claims = claims
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty();
            let no_specs = std::fs::read_dir(cdi).ok()?.next().is_none();
            (no_pods && no_claims && no_specs).then_some(())
        },
    )
    .await
    .with_context(|| {
        let left: Vec<_> = std::fs::read_dir(cdi)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        format!("CDI specs on node b: {left:?}")
    })
}

/// The extended-resource claim kube-scheduler made for `pod`, if any.
fn claim_of(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .extended_resource_claim_status
        .as_ref()
        .map(|c| c.resource_claim_name.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_name_through_dra_on_one_real_node_and_the_device_plugin_on_the_other() -> Result<()> {
    if !require_bins("realnode_dra", &scenario::required_files()) {
        return Ok(());
    }
    let run = RunDir::new("realnode-dra")?;
    let t0 = Instant::now();
    let mut opts = gpus::two_gpu_nodes(run.path(), gpus::IMAGES)?;
    opts.nodes[0].1.push((
        labels::ALLOCATION_API.into(),
        AllocationApi::DevicePlugin.as_str().into(),
    ));
    let driver_b = opts.drivers.get("b").cloned().context("node b's driver")?;
    let mut cluster = RealCluster::start(&run, opts).await?;
    let client = cluster.cp.client.clone();
    eprintln!("RESULT cluster Ready after {:?}", t0.elapsed());
    let _kudos = scenario::install(
        &run,
        &mut cluster,
        std::path::Path::new(env!("CARGO_BIN_EXE_kudos-e2e-adapt")),
        &InstallOptions {
            set: vec!["dra.allocationApi=auto".into()],
            dra_nodes: vec![NODE_B],
        },
    )
    .await?;
    let s = state().context("/state")?;
    eprintln!("RESULT /state allocationApi: {}", s["allocationApi"]);
    assert_eq!(s["allocationApi"][NODE_A]["api"], "device-plugin", "{s}");
    assert_eq!(s["allocationApi"][NODE_B]["api"], "dra", "{s}");

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let (claims, recorder) = Claims::spawn(Api::namespaced(client.clone(), "default"));

    // === wave 1: one job per device, the same spec on both nodes ===
    let reaper = Reaper::spawn(pods.clone());
    let mut on_b = BTreeMap::new();
    for i in 0..FIRST {
        pods.create(&PostParams::default(), &job_with_work(i, FIRST_WORK))
            .await?;
    }
    for i in 0..FIRST {
        let name = format!("job-{i:02}");
        let pod = wait_for(
            &format!("{name} bound and its claim status written"),
            Duration::from_secs(120),
            Duration::from_millis(200),
            async || {
                let p = pods.get(&name).await.ok()?;
                let node = p.spec.as_ref()?.node_name.clone()?;
                (node == NODE_A || claim_of(&p).is_some()).then_some(p)
            },
        )
        .await?;
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        match (node.as_deref(), claim_of(&pod)) {
            (Some(NODE_A), None) => {}
            (Some(NODE_B), Some(claim)) => {
                on_b.insert(name, claim);
            }
            other => panic!("{name}: (node, claim) {other:?}"),
        }
    }
    let placed = reaper.wait_all(FIRST).await?;
    eprintln!("RESULT wave 1: {placed:?}");
    let failed: Vec<_> = placed.iter().filter(|p| p.2 != "Succeeded").collect();
    assert!(failed.is_empty(), "jobs failed: {failed:?}");
    assert_eq!(on_b.len(), FIRST / 2, "jobs on the DRA node: {on_b:?}");
    let seen = claims.snapshot();
    for (pod, claim) in &on_b {
        let (owner, devices) = seen
            .get(claim)
            .with_context(|| format!("{pod}'s claim {claim} never seen allocated: {seen:?}"))?;
        assert_eq!(owner, pod);
        assert_eq!(devices.len(), 1, "{claim}: {devices:?}");
        assert!(
            devices[0].starts_with(&format!("{NODE_B}/")),
            "{claim}: {devices:?}"
        );
    }
    let distinct: BTreeSet<_> = on_b.values().map(|c| &seen[c].1[0]).collect();
    assert_eq!(
        distinct.len(),
        FIRST / 2,
        "four jobs, four devices: {seen:?}"
    );
    let explained = kudos_e2e::pods::explained(&client, "default").await?;
    for (name, _, _) in &placed {
        assert!(
            explained.contains(name),
            "{name} has neither a {} annotation nor a KudosRanked event",
            labels::PLACEMENT
        );
    }
    eprintln!(
        "RESULT wave 1 after {:?}: 4 jobs on {NODE_A} through the device plugin, 4 on {NODE_B} through DRA claims {:?}, all ranked by Kudos",
        t0.elapsed(),
        on_b.values().map(|c| &seen[c]).collect::<Vec<_>>()
    );
    let runs = wait_for(
        "every wave-1 run reported",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async { model_runs().filter(|r| *r >= FIRST as u64) },
    )
    .await?;
    assert_eq!(runs, FIRST as u64, "runs reported (exactly one per job)");
    let cdi = cluster.nodes[1].dir.join("host_run_cdi");
    remove_jobs(&client, &cdi).await?;
    eprintln!("RESULT wave 1's claims unprepared and deleted, its CDI specs removed");

    // === an unhealthy device: tainted, never allocated ===
    gpus::inject_xid(&driver_b, SICK, 79)?;
    let devices = wait_for(
        "one of node b's devices tainted unhealthy",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let d = slice_devices(&slices).await?;
            (d.values().filter(|t| **t).count() == 1).then_some(d)
        },
    )
    .await?;
    let sick = devices
        .iter()
        .find(|(_, t)| **t)
        .map(|(n, _)| format!("{NODE_B}/{n}"))
        .context("the tainted device")?;
    eprintln!("RESULT XID 79 on device {SICK} of {NODE_B}: {sick} tainted");
    // The orchestrator reads node b's devices from the slice too (the chart's RBAC allows it).
    let counted = wait_for(
        "/state counts node b's slice: 3 healthy of 4",
        Duration::from_secs(30),
        Duration::from_millis(250),
        || async {
            let c = state()?["allocationApi"][NODE_B]["sliceDevices"].clone();
            (c == serde_json::json!({"healthy": 3, "total": 4})).then_some(c)
        },
    )
    .await;
    assert!(
        counted.is_ok(),
        "/state: {:?}",
        state().map(|s| s["allocationApi"].clone())
    );
    // The plugin lets a device recover after 60 s without a critical event: it keeps raising
    // them for the rest of the test.
    let keep_sick = tokio::spawn({
        let driver_b = driver_b.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(20)).await;
                if let Err(e) = gpus::inject_xid(&driver_b, SICK, 79) {
                    eprintln!("injecting an XID: {e:#}");
                }
            }
        }
    });

    // === wave 2: longer jobs; node b has three devices, the eighth job waits ===
    let reaper = Reaper::spawn(pods.clone());
    for i in FIRST..FIRST + SECOND {
        pods.create(&PostParams::default(), &job_with_work(i, LONG_WORK))
            .await?;
    }
    let running_on = async |node: &str| -> usize {
        let lp =
            ListParams::default().fields(&format!("spec.nodeName={node},status.phase=Running"));
        pods.list(&lp).await.map_or(0, |l| l.items.len())
    };
    wait_for(
        "4 jobs running on node a and 3 on node b",
        Duration::from_secs(120),
        Duration::from_millis(250),
        async || (running_on(NODE_A).await == 4 && running_on(NODE_B).await == 3).then_some(()),
    )
    .await?;
    let waiting: Vec<String> = pods
        .list(&ListParams::default().fields("spec.nodeName="))
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    eprintln!("RESULT wave 2: 4 running on {NODE_A}, 3 on {NODE_B}, waiting: {waiting:?}");
    assert_eq!(waiting.len(), 1, "one job waits for a device: {waiting:?}");
    let (reason, message) =
        kudos_e2e::pods::unschedulable(&pods, &waiting[0], Duration::from_secs(60)).await?;
    eprintln!("RESULT {} waits: {reason}: {message}", waiting[0]);

    // === node b's plugin pod deleted while its three claims are prepared ===
    let system: Api<Pod> = Api::namespaced(client.clone(), "kudos-system");
    let plugin_lp = ListParams::default()
        .labels(labels::PLUGIN_GROUP)
        .fields(&format!("spec.nodeName={NODE_B}"));
    let old: Vec<String> = system
        .list(&plugin_lp)
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.uid)
        .collect();
    assert_eq!(old.len(), 1, "node b's plugin pods: {old:?}");
    system
        .delete_collection(&DeleteParams::default(), &plugin_lp)
        .await?;
    let restarted = Instant::now();
    wait_for(
        "a new plugin pod ready on node b",
        Duration::from_secs(120),
        Duration::from_millis(250),
        async || {
            let l = system.list(&plugin_lp).await.ok()?;
            l.items
                .iter()
                .any(|p| {
                    p.metadata.uid.as_ref().is_some_and(|u| !old.contains(u))
                        && p.status
                            .as_ref()
                            .and_then(|s| s.container_statuses.as_ref())
                            .is_some_and(|cs| cs.iter().all(|c| c.ready))
                })
                .then_some(())
        },
    )
    .await?;
    eprintln!(
        "RESULT node b's plugin pod replaced after {:?}",
        restarted.elapsed()
    );
    let placed = reaper.wait_all(SECOND).await?;
    eprintln!("RESULT wave 2: {placed:?}");
    let failed: Vec<_> = placed.iter().filter(|p| p.2 != "Succeeded").collect();
    assert!(failed.is_empty(), "jobs failed: {failed:?}");

    // The restarted plugin prepares new claims: one more job, kept to node b.
    let last = FIRST + SECOND;
    let mut extra = job_with_work(last, 3.0);
    if let Some(spec) = extra.spec.as_mut() {
        spec.node_selector = Some(BTreeMap::from([(NODE_LABEL.into(), "b".into())]));
    }
    pods.create(&PostParams::default(), &extra).await?;
    let name = format!("job-{last:02}");
    let phase = wait_for(
        &format!("{name} finished on node b"),
        Duration::from_secs(120),
        Duration::from_millis(250),
        async || {
            let p = pods.get(&name).await.ok()?.status?.phase?;
            matches!(p.as_str(), "Succeeded" | "Failed").then_some(p)
        },
    )
    .await?;
    assert_eq!(phase, "Succeeded", "{name} after the plugin restart");
    let runs = wait_for(
        "every run reported",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async { model_runs().filter(|r| *r > last as u64) },
    )
    .await?;
    assert_eq!(runs, last as u64 + 1, "runs reported");

    // Every claim goes once its pod does: the three prepared before the restart are unprepared
    // by the new plugin, from its checkpoint.
    remove_jobs(&client, &cdi).await?;
    recorder.abort();
    let seen = claims.snapshot();
    eprintln!("RESULT claims allocated over the run: {seen:?}");
    let second_wave = |pod: &str| {
        pod.trim_start_matches("job-")
            .parse::<usize>()
            .is_ok_and(|i| i >= FIRST)
    };
    let on_sick: Vec<_> = seen
        .iter()
        .filter(|(_, (pod, d))| second_wave(pod) && d.contains(&sick))
        .collect();
    assert!(
        on_sick.is_empty(),
        "the tainted device was allocated: {on_sick:?}"
    );
    let on_b = seen.values().filter(|(pod, _)| second_wave(pod)).count();
    assert!(on_b >= 4, "claims on node b after the taint: {seen:?}");
    assert!(
        seen.values().any(|(pod, _)| *pod == name),
        "{name} ran on node b without a claim: {seen:?}"
    );
    let log = std::fs::read_to_string(cluster.nodes[1].kubelet_log())?;
    let failures: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("nprepare") && (l.contains("rror") || l.contains("ailed")))
        .collect();
    assert!(
        failures.is_empty(),
        "the kubelet logged unprepare failures: {failures:#?}"
    );
    keep_sick.abort();
    eprintln!(
        "RESULT {} claims over the run, none on {sick} once tainted; after the plugin restart every claim and CDI spec went, no unprepare failure; done after {:?}",
        seen.len(),
        t0.elapsed()
    );

    cluster.shutdown_clean()?;
    run.pass();
    Ok(())
}
