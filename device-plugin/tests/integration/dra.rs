//! DRA mode against a real kube-apiserver (etcd + kube-apiserver 1.37 from `e2e/_out/bin`):
//! the plugin (in-process, NVIDIA devices from the fake NVML) publishes its ResourceSlice,
//! taints a device that goes unhealthy, answers the kubelet's registration `GetInfo`, prepares
//! a ResourceClaim allocated through the status subresource over the real Unix socket (CDI
//! spec written), and after a restart unprepares it from its checkpoint alone. A second test
//! puts the real kube-scheduler between the two: a pod asking for `kudos.dev/gpu: 1` is given a
//! claim on the plugin's slice through the `kudos-gpu` DeviceClass, never the tainted device,
//! and the plugin prepares that claim. Skips with a message when the binaries are missing;
//! `KUDOS_E2E_REQUIRE=1` turns the skip into a failure.

use crate::support;

use k8s_openapi::api::resource::v1 as res;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kudos_api::dra::{DRIVER, UNHEALTHY_TAINT_KEY, attribute, device_name};
use kudos_nvml::fake::FakeNvml;
use kudos_proto::dra::v1 as dra;
use kudos_proto::pluginregistration::v1 as reg;
use kudos_proto::unix;
use kudos_testkit::paths::upstream_bin;
use kudos_testkit::proc::wait_for;
use kudos_testkit::{ControlPlane, ControlPlaneOptions};
use std::path::Path;
use std::time::Duration;
use support::Plugin;

const NODE: &str = "node-a";
const SLICE: &str = "node-a-gpu.kudos.dev";
const WAIT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(100);

fn plugin_flags(tmp: &Path, fake: &FakeNvml, kubeconfig: &Path) -> Vec<String> {
    let p = |name: &str| tmp.join(name).display().to_string();
    vec![
        "--allocation-api=dra".into(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--kubelet-registry-dir={}", p("registry")),
        format!("--kubelet-plugins-dir={}", p("plugins")),
        format!("--cdi-root={}", p("cdi")),
        format!("--device-plugin-dir={}", p("device-plugins")),
        format!("--name-cache={}", p("state/resource-name")),
        format!("--nvml-library={}", fake.library().display()),
        format!("--dev-root={}", p("host")),
        "--backends=nvidia".into(),
        "--nvidia-device-specs".into(),
        "--probe-interval=100ms".into(),
        "--recovery-quiet=2s".into(),
    ]
}

/// A short temporary directory (Unix socket paths are short, so not the run directory) and `n`
/// fake NVIDIA GPUs in it.
fn fake_gpus(n: u32) -> anyhow::Result<(tempfile::TempDir, FakeNvml)> {
    let tmp = tempfile::tempdir()?;
    let nvml_dir = tmp.path().join("nvml");
    std::fs::create_dir_all(&nvml_dir)?;
    let fake = FakeNvml::new(&nvml_dir, n)?;
    Ok((tmp, fake))
}

/// The DRA device names of the fake GPUs, in order.
fn dra_names(fake: &FakeNvml) -> Vec<String> {
    fake.devices
        .iter()
        .map(|d| device_name(&format!("nv-{}", d.uuid)))
        .collect()
}

/// The plugin's ResourceSlice, once published.
async fn published(slices: &Api<res::ResourceSlice>) -> anyhow::Result<res::ResourceSlice> {
    wait_for("the ResourceSlice", WAIT, POLL, async || {
        slices.get_opt(SLICE).await.ok().flatten()
    })
    .await
}

fn taints(slice: &res::ResourceSlice, device: &str) -> Vec<String> {
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .filter(|d| d.name == device)
        .flat_map(|d| {
            d.taints
                .iter()
                .flatten()
                .map(|t| format!("{}:{}", t.key, t.effect))
        })
        .collect()
}

async fn dra_client(
    socket: &Path,
) -> anyhow::Result<dra::dra_plugin_client::DraPluginClient<tonic::transport::Channel>> {
    let channel = wait_for("the DRA socket", WAIT, POLL, async || {
        unix::connect(socket).await.ok()
    })
    .await?;
    Ok(dra::dra_plugin_client::DraPluginClient::new(channel))
}

/// A claim for one GPU of the `kudos-gpu` class, allocated `device` of this node's pool
/// through the status subresource, as the scheduler would.
async fn allocated_claim(
    claims: &Api<res::ResourceClaim>,
    name: &str,
    device: &str,
) -> anyhow::Result<res::ResourceClaim> {
    let mut c = res::ResourceClaim::default();
    c.metadata.name = Some(name.into());
    c.spec.devices = Some(res::DeviceClaim {
        requests: Some(vec![res::DeviceRequest {
            name: "gpu".into(),
            exactly: Some(res::ExactDeviceRequest {
                device_class_name: kudos_api::dra::DEVICE_CLASS.into(),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    });
    claims.create(&PostParams::default(), &c).await?;
    let status = serde_json::json!({
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
        ]}}}
    });
    Ok(claims
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_mode_publishes_prepares_and_keeps_claims_across_a_restart() -> anyhow::Result<()> {
    let opts = ControlPlaneOptions::default();
    let Some((run, cp)) = ControlPlane::for_test("dp-dra", opts, &[]).await? else {
        return Ok(());
    };
    let (tmp, mut fake) = fake_gpus(2)?;
    let flags = plugin_flags(tmp.path(), &fake, &cp.kubeconfig);
    let names = dra_names(&fake);
    let plugin = Plugin::start(&flags);

    // === the ResourceSlice ===
    let slices: Api<res::ResourceSlice> = Api::all(cp.client.clone());
    let slice = published(&slices).await?;
    assert_eq!(slice.spec.driver, DRIVER);
    assert_eq!(slice.spec.node_name.as_deref(), Some(NODE));
    assert_eq!(
        (
            slice.spec.pool.name.as_str(),
            slice.spec.pool.resource_slice_count
        ),
        (NODE, 1)
    );
    let devices = slice.spec.devices.clone().unwrap_or_default();
    let published: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(published, names);
    let attrs = devices[1].attributes.clone().unwrap_or_default();
    let s = |k: &str| {
        attrs
            .get(k)
            .and_then(|a| a.string.clone())
            .unwrap_or_default()
    };
    assert_eq!(s(attribute::VENDOR), "nvidia");
    assert_eq!(s(attribute::MODEL), "NVIDIA H100 80GB HBM3");
    assert_eq!(s(attribute::UUID), fake.devices[1].uuid);
    assert_eq!(
        s(attribute::DEVICE_ID),
        format!("nv-{}", fake.devices[1].uuid)
    );
    assert_eq!(attrs[attribute::NUMA_NODE].int, Some(0));
    assert_eq!(
        attrs[attribute::CUDA_COMPUTE_CAPABILITY].version.as_deref(),
        Some("9.0.0"),
        "the compute capability NVML reports, as a version the API server accepted"
    );
    let memory = &devices[1].capacity.as_ref().expect("capacity")["memory"]
        .value
        .0;
    assert_eq!(
        memory,
        &(80_u64 << 30).to_string(),
        "device memory in bytes"
    );
    assert!(taints(&slice, &names[1]).is_empty());
    assert!(
        std::fs::read_dir(tmp.path().join("device-plugins"))
            .map(|d| d.count())
            .unwrap_or(0)
            == 0,
        "DRA mode serves no device-plugin socket"
    );

    // === registration, as the kubelet's plugin watcher asks ===
    let reg_socket = tmp.path().join("registry/gpu.kudos.dev-reg.sock");
    let dra_socket = tmp.path().join("plugins/gpu.kudos.dev/dra.sock");
    let channel = wait_for("the registration socket", WAIT, POLL, async || {
        unix::connect(&reg_socket).await.ok()
    })
    .await?;
    let mut registration = reg::registration_client::RegistrationClient::new(channel);
    let info = registration
        .get_info(reg::InfoRequest {})
        .await?
        .into_inner();
    assert_eq!(
        info,
        reg::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: DRIVER.into(),
            endpoint: dra_socket.display().to_string(),
            supported_versions: vec!["v1.DRAPlugin".into()],
        }
    );
    registration
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await?;

    // === an unhealthy device is tainted, and untainted once it recovers ===
    let generation = slice.spec.pool.generation;
    fake.xid(1, 79);
    fake.write()?;
    let tainted = wait_for("the unhealthy taint", WAIT, POLL, async || {
        let s = slices.get_opt(SLICE).await.ok().flatten()?;
        (!taints(&s, &names[1]).is_empty()).then_some(s)
    })
    .await?;
    assert_eq!(
        taints(&tainted, &names[1]),
        [format!("{UNHEALTHY_TAINT_KEY}:NoSchedule")]
    );
    assert!(taints(&tainted, &names[0]).is_empty());
    assert!(tainted.spec.pool.generation > generation);
    let recovered = wait_for("the taint removed", WAIT, POLL, async || {
        let s = slices.get_opt(SLICE).await.ok().flatten()?;
        taints(&s, &names[1]).is_empty().then_some(s)
    })
    .await?;
    assert!(recovered.spec.pool.generation > tainted.spec.pool.generation);

    // === a claim allocated device 0, prepared over the DRA socket ===
    let claims: Api<res::ResourceClaim> = Api::namespaced(cp.client.clone(), "default");
    let claim = allocated_claim(&claims, "train", &names[0]).await?;
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let wire = dra::Claim {
        namespace: "default".into(),
        uid: uid.clone(),
        name: "train".into(),
    };
    let mut client = dra_client(&dra_socket).await?;
    let stranger = dra::Claim {
        uid: "0b6e3c9a-0000-0000-0000-000000000000".into(),
        ..wire.clone()
    };
    let resp = client
        .node_prepare_resources(dra::NodePrepareResourcesRequest {
            claims: vec![wire.clone(), stranger.clone()],
        })
        .await?
        .into_inner();
    let prepared = resp.claims[&uid].clone();
    assert_eq!(prepared.error, "");
    let cdi_id = format!("gpu.kudos.dev/gpu={uid}-{}", names[0]);
    assert_eq!(
        prepared.devices,
        [dra::Device {
            request_names: vec!["gpu".into()],
            pool_name: NODE.into(),
            device_name: names[0].clone(),
            cdi_device_ids: vec![cdi_id],
            share_id: None,
        }]
    );
    // The same name with another UID: a replaced claim, refused in its own entry.
    assert!(resp.claims[&stranger.uid].error.contains("re-created"));

    let cdi_file = tmp.path().join(format!("cdi/gpu.kudos.dev-{uid}.json"));
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&cdi_file)?)?;
    assert_eq!(spec["cdiVersion"], "0.6.0");
    assert_eq!(spec["kind"], "gpu.kudos.dev/gpu");
    let device = &spec["devices"][0];
    assert_eq!(device["name"], format!("{uid}-{}", names[0]));
    assert_eq!(
        device["containerEdits"]["env"],
        serde_json::json!([format!("NVIDIA_VISIBLE_DEVICES={}", fake.devices[0].uuid)])
    );
    let host = tmp.path().join("host/dev").display().to_string();
    assert_eq!(
        device["containerEdits"]["deviceNodes"],
        serde_json::json!([
            {"path": "/dev/nvidiactl", "hostPath": format!("{host}/nvidiactl"), "permissions": "rw"},
            {"path": "/dev/nvidia0", "hostPath": format!("{host}/nvidia0"), "permissions": "rw"},
        ])
    );

    // === restart: the claim survives in the checkpoint, without the API server's copy ===
    plugin.stop().await;
    assert!(
        !reg_socket.exists() && !dra_socket.exists(),
        "sockets removed"
    );
    claims.delete("train", &DeleteParams::default()).await?;
    let plugin = Plugin::start(&flags);
    let mut client = dra_client(&dra_socket).await?;
    let again = client
        .node_prepare_resources(dra::NodePrepareResourcesRequest {
            claims: vec![wire.clone()],
        })
        .await?
        .into_inner();
    assert_eq!(
        again.claims[&uid], prepared,
        "idempotent, from the checkpoint"
    );
    for _ in 0..2 {
        let resp = client
            .node_unprepare_resources(dra::NodeUnprepareResourcesRequest {
                claims: vec![wire.clone()],
            })
            .await?
            .into_inner();
        assert_eq!(resp.claims[&uid].error, "", "unprepare is idempotent");
    }
    assert!(!cdi_file.exists(), "the CDI spec is removed");
    plugin.stop().await;
    run.pass();
    Ok(())
}

/// The chain without the kubelet: the plugin's own slice (device 1 tainted unhealthy), the
/// chart's `kudos-gpu` DeviceClass, the real kube-scheduler allocating a pod's `kudos.dev/gpu`
/// through it, and the plugin preparing the claim the scheduler made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_scheduler_allocates_from_the_plugins_slice_and_the_plugin_prepares_it()
-> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    // The scheduler starts once the plugin's slice is published.
    let scheduler = [upstream_bin("kube-scheduler")];
    let opts = ControlPlaneOptions::default();
    let Some((run, mut cp)) = ControlPlane::for_test("dp-dra-scheduler", opts, &scheduler).await?
    else {
        return Ok(());
    };
    let (tmp, mut fake) = fake_gpus(2)?;
    let mut flags = plugin_flags(tmp.path(), &fake, &cp.kubeconfig);
    // Device 1 stays unhealthy for the whole test.
    flags.retain(|f| !f.starts_with("--recovery-quiet"));
    flags.push("--recovery-quiet=10m".into());
    let names = dra_names(&fake);
    let plugin = Plugin::start(&flags);
    let slices: Api<res::ResourceSlice> = Api::all(cp.client.clone());
    // The XID only counts once the plugin watches for it: after its first slice.
    published(&slices).await?;
    fake.xid(1, 79);
    fake.write()?;
    wait_for("the slice with device 1 tainted", WAIT, POLL, async || {
        let s = slices.get_opt(SLICE).await.ok().flatten()?;
        (!taints(&s, &names[1]).is_empty()).then_some(())
    })
    .await?;

    // The Node (no kudos.dev/gpu allocatable: its devices are in the slice) and the class.
    let shape = kudos_testkit::nodes::NodeShape {
        name: NODE.into(),
        cpu_milli: 8_000,
        memory_mib: 16_384,
        gpu: 0,
        model: "H100".into(),
    };
    kudos_testkit::nodes::create_nodes(&cp.client, &[shape], "example.com/unused").await?;
    Api::<res::DeviceClass>::all(cp.client.clone())
        .create(
            &PostParams::default(),
            &kudos_testkit::dra::device_class("kudos.dev/gpu")?,
        )
        .await?;
    cp.start_scheduler(50, None)?;

    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let pod = |name: &str| -> anyhow::Result<Pod> {
        let r = serde_json::json!({"kudos.dev/gpu": "1"});
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "registry.invalid/none:0",
                     "resources": {"requests": r, "limits": r}}]}
        }))?)
    };
    pods.create(&PostParams::default(), &pod("gpu-0")?).await?;
    let claim_name = wait_for(
        "gpu-0 bound with a claim",
        Duration::from_secs(60),
        POLL,
        async || {
            let p = pods.get("gpu-0").await.ok()?;
            p.spec.as_ref()?.node_name.as_ref()?;
            Some(
                p.status?
                    .extended_resource_claim_status?
                    .resource_claim_name,
            )
        },
    )
    .await?;
    let claims: Api<res::ResourceClaim> = Api::namespaced(cp.client.clone(), "default");
    let claim = claims.get(&claim_name).await?;
    let results = kudos_testkit::dra::allocated(&claim);
    assert_eq!(results.len(), 1, "{claim:?}");
    assert_eq!(
        (results[0].driver.as_str(), results[0].pool.as_str()),
        (DRIVER, NODE)
    );
    assert_eq!(results[0].device, names[0], "never the tainted device");

    // The tainted device is the only one left: the next pod waits.
    pods.create(&PostParams::default(), &pod("gpu-1")?).await?;
    let message = wait_for(
        "gpu-1 unschedulable",
        Duration::from_secs(60),
        POLL,
        async || {
            let c = pods
                .get("gpu-1")
                .await
                .ok()?
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "PodScheduled")?;
            (c.status == "False").then(|| c.message.unwrap_or_default())
        },
    )
    .await?;
    assert!(message.contains("cannot allocate all claims"), "{message}");

    // The kubelet would now ask the plugin to prepare the scheduler's claim.
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let mut client = dra_client(&tmp.path().join("plugins/gpu.kudos.dev/dra.sock")).await?;
    let resp = client
        .node_prepare_resources(dra::NodePrepareResourcesRequest {
            claims: vec![dra::Claim {
                namespace: "default".into(),
                uid: uid.clone(),
                name: claim_name.clone(),
            }],
        })
        .await?
        .into_inner();
    let prepared = &resp.claims[&uid];
    assert_eq!(prepared.error, "");
    assert_eq!(prepared.devices.len(), 1);
    assert_eq!(prepared.devices[0].device_name, names[0]);
    assert_eq!(
        prepared.devices[0].cdi_device_ids,
        [format!("gpu.kudos.dev/gpu={uid}-{}", names[0])]
    );
    assert!(
        tmp.path()
            .join(format!("cdi/gpu.kudos.dev-{uid}.json"))
            .exists()
    );
    plugin.stop().await;
    cp.check_running()?;
    run.pass();
    Ok(())
}

/// `--allocation-api=auto`: the orchestrator's answer picks the API, a changed answer switches
/// it (leaving DRA deletes the slice), and the cached answer holds while the orchestrator is
/// down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orchestrators_answer_picks_and_switches_the_api() -> anyhow::Result<()> {
    let opts = ControlPlaneOptions::default();
    let Some((run, cp)) = ControlPlane::for_test("dp-dra-switch", opts, &[]).await? else {
        return Ok(());
    };
    let (tmp, fake) = fake_gpus(1)?;
    let stub = support::Registry::named("kudos.dev/gpu");
    *stub.allocation_api.lock().expect("lock") = "dra".into();
    let (addr, _server) = support::serve_registry_on_loopback(stub.clone()).await;
    let dp_dir = tmp.path().join("device-plugins");
    std::fs::create_dir_all(&dp_dir)?;
    let mut kubelet = support::Kubelet::new(&dp_dir);
    kubelet.start();
    let mut flags = plugin_flags(tmp.path(), &fake, &cp.kubeconfig);
    flags.retain(|f| !f.starts_with("--allocation-api"));
    flags.push(format!("--orchestrator-addr={addr}"));
    flags.push("--report-interval=200ms".into());
    let reg_socket = tmp.path().join("registry/gpu.kudos.dev-reg.sock");
    let slices: Api<res::ResourceSlice> = Api::all(cp.client.clone());
    let slice_is = async |present: bool| {
        wait_for("the ResourceSlice", WAIT, POLL, async || {
            let found = slices.get_opt(SLICE).await.ok()?.is_some();
            (found == present).then_some(())
        })
        .await
    };

    // "dra": a slice and a registration socket, no device-plugin registration.
    let plugin = Plugin::start(&flags);
    slice_is(true).await?;
    assert!(reg_socket.exists());
    kubelet
        .no_registration_for(Duration::from_millis(500))
        .await;

    // "device-plugin": registered with the kubelet, the slice and the DRA sockets gone.
    *stub.allocation_api.lock().expect("lock") = "device-plugin".into();
    let (registered, _) = kubelet.registration().await;
    assert_eq!(registered.resource_name, "kudos.dev/gpu");
    slice_is(false).await?;
    assert!(!reg_socket.exists());
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("state/allocation-api"))?,
        "device-plugin\n"
    );

    // Back to "dra", then a restart with the orchestrator down: the cached answer holds.
    *stub.allocation_api.lock().expect("lock") = "dra".into();
    slice_is(true).await?;
    wait_for("the device-plugin socket removed", WAIT, POLL, async || {
        (!dp_dir.join("kudos.sock").exists()).then_some(())
    })
    .await?;
    plugin.stop().await;
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let dead_addr = format!("http://{}", dead.local_addr()?);
    drop(dead);
    flags.retain(|f| !f.starts_with("--orchestrator-addr"));
    flags.push(format!("--orchestrator-addr={dead_addr}"));
    let plugin = Plugin::start(&flags);
    wait_for("the registration socket", WAIT, POLL, async || {
        reg_socket.exists().then_some(())
    })
    .await?;
    kubelet
        .no_registration_for(Duration::from_millis(500))
        .await;
    plugin.stop().await;
    run.pass();
    Ok(())
}
