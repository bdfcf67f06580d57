//! Kubelet conformance: the plugin with NVIDIA devices from the fake NVML (real nvml-wrapper
//! loading path), driven by a kubelet stand-in over Unix sockets.

use crate::support;

use kudos_nvml::fake::{FakeLink, FakeNvml, NVML_ERROR_UNKNOWN};
use kudos_proto::deviceplugin::v1beta1 as api;
use std::time::Duration;
use support::{Kubelet, Plugin, flags, healthy, plugin_client};
use tonic::Code;

struct Env {
    _tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
    fake: FakeNvml,
    kubelet: Kubelet,
    plugin: Plugin,
}

async fn setup(gpus: u32, extra: &[&str]) -> Env {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("device-plugins");
    std::fs::create_dir_all(&dir).expect("dir");
    let nvml_dir = tmp.path().join("nvml");
    std::fs::create_dir_all(&nvml_dir).expect("dir");
    let fake = FakeNvml::new(&nvml_dir, gpus).expect("fake nvml");
    let mut kubelet = Kubelet::new(&dir);
    kubelet.start();
    let mut f = flags(&dir, fake.library(), &tmp.path().join("cache/name"));
    for x in extra {
        // A flag given here replaces the default one.
        let name = x.split('=').next().unwrap_or(x);
        f.retain(|d| d.split('=').next() != Some(name));
        f.push(x.to_string());
    }
    let plugin = Plugin::start(&f);
    Env {
        _tmp: tmp,
        dir,
        fake,
        kubelet,
        plugin,
    }
}

fn id(fake: &FakeNvml, i: usize) -> String {
    format!("nv-{}", fake.devices[i].uuid)
}

#[tokio::test]
async fn registers_then_lists_every_device_with_numa() {
    let mut e = setup(4, &[]).await;
    let (reg, _) = e.kubelet.registration().await;
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.endpoint, "kudos.sock");
    assert_eq!(reg.resource_name, "kudos.dev/gpu");
    let opts = reg.options.expect("options");
    assert!(opts.get_preferred_allocation_available && !opts.pre_start_required);
    // Options match what the server answers.
    let mut c = plugin_client(&e.dir, "kudos.sock").await;
    assert_eq!(
        c.get_device_plugin_options(api::Empty {})
            .await
            .expect("options")
            .into_inner(),
        opts
    );

    // The full list arrives at once.
    let list = e.kubelet.list_where(|_| true).await;
    assert_eq!(list.len(), 4);
    assert_eq!(healthy(&list), 4);
    for (i, d) in list.iter().enumerate() {
        assert_eq!(d.id, id(&e.fake, i));
        assert!(d.id.len() <= 63);
        let numa: Vec<i64> = d
            .topology
            .as_ref()
            .expect("topology")
            .nodes
            .iter()
            .map(|n| n.id)
            .collect();
        assert_eq!(numa, vec![0]);
    }
    e.plugin.stop().await;
    assert!(
        !e.dir.join("kudos.sock").exists(),
        "socket removed on shutdown"
    );
}

#[tokio::test]
async fn xids_flip_health_and_devices_recover() {
    // Quiet period long enough that the unhealthy state outlives the Allocate check below.
    let mut e = setup(4, &["--recovery-quiet-seconds=2"]).await;
    e.kubelet.registration().await;
    e.kubelet.list_where(|l| healthy(l) == 4).await;

    // An application XID is ignored; XID 79 (fallen off the bus) is not.
    e.fake.xid(1, 13);
    e.fake.xid(2, 79);
    e.fake.write().expect("write");
    let list = e.kubelet.list_where(|l| healthy(l) == 3).await;
    let bad: Vec<&str> = list
        .iter()
        .filter(|d| d.health == api::UNHEALTHY)
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(bad, vec![id(&e.fake, 2).as_str()]);

    // Allocate refuses the unhealthy device, naming it.
    let mut c = plugin_client(&e.dir, "kudos.sock").await;
    let err = c
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![id(&e.fake, 2)],
            }],
        })
        .await
        .expect_err("unhealthy");
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains(&id(&e.fake, 2)));

    // No further critical event and the probe passes: healthy again.
    e.kubelet.list_where(|l| healthy(l) == 4).await;
    e.plugin.stop().await;
}

#[tokio::test]
async fn nvml_not_answering_marks_every_gpu_unhealthy_until_it_answers() {
    let mut e = setup(2, &[]).await;
    e.kubelet.registration().await;
    e.kubelet.list_where(|l| healthy(l) == 2).await;
    e.fake.fail = Some(NVML_ERROR_UNKNOWN);
    e.fake.write().expect("write");
    e.kubelet.list_where(|l| healthy(l) == 0).await;
    e.fake.fail = None;
    e.fake.write().expect("write");
    e.kubelet.list_where(|l| healthy(l) == 2).await;
    e.plugin.stop().await;
}

#[tokio::test]
async fn allocate_answers_per_container_in_order_and_rejects_unknown_ids() {
    let mut e = setup(4, &["--nvidia-device-specs", "--cdi"]).await;
    e.kubelet.registration().await;
    e.kubelet.list_where(|l| healthy(l) == 4).await;
    let mut c = plugin_client(&e.dir, "kudos.sock").await;
    let req = api::AllocateRequest {
        container_requests: vec![
            api::ContainerAllocateRequest {
                devices_ids: vec![id(&e.fake, 3), id(&e.fake, 0)],
            },
            api::ContainerAllocateRequest {
                devices_ids: vec![id(&e.fake, 1)],
            },
        ],
    };
    let resp = c
        .allocate(req.clone())
        .await
        .expect("allocate")
        .into_inner();
    assert_eq!(resp.container_responses.len(), 2);
    let first = &resp.container_responses[0];
    let uuids = format!("{},{}", e.fake.devices[3].uuid, e.fake.devices[0].uuid);
    assert_eq!(first.envs.get("NVIDIA_VISIBLE_DEVICES"), Some(&uuids));
    let nodes: Vec<&str> = first
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert!(
        nodes.contains(&"/dev/nvidiactl")
            && nodes.contains(&"/dev/nvidia3")
            && nodes.contains(&"/dev/nvidia0")
    );
    assert!(!nodes.contains(&"/dev/nvidia1"));
    let cdi: Vec<&str> = first.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(cdi.len(), 2);
    assert!(cdi[0].starts_with("nvidia.com/gpu=GPU-"));
    assert_eq!(
        resp.container_responses[1]
            .envs
            .get("NVIDIA_VISIBLE_DEVICES"),
        Some(&e.fake.devices[1].uuid)
    );

    // Idempotent: the same request gets the same answer.
    assert_eq!(c.allocate(req).await.expect("again").into_inner(), resp);

    // Unknown IDs are rejected, naming the ID; so are empty and duplicate requests.
    for (ids, code, needle) in [
        (
            vec!["nv-GPU-nope".to_string()],
            Code::InvalidArgument,
            "nv-GPU-nope",
        ),
        (
            vec![id(&e.fake, 0), "amd-0000:00:00.0".into()],
            Code::InvalidArgument,
            "amd-0000:00:00.0",
        ),
        (vec![], Code::InvalidArgument, "no devices"),
        (
            vec![id(&e.fake, 0), id(&e.fake, 0)],
            Code::InvalidArgument,
            "twice",
        ),
    ] {
        let err = c
            .allocate(api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest { devices_ids: ids }],
            })
            .await
            .expect_err("rejected");
        assert_eq!(err.code(), code);
        assert!(err.message().contains(needle), "{}", err.message());
    }
    e.plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_allocates_all_succeed_with_their_own_answers() {
    let mut e = setup(8, &[]).await;
    e.kubelet.registration().await;
    e.kubelet.list_where(|l| healthy(l) == 8).await;
    let mut tasks = Vec::new();
    for k in 0..64usize {
        let dir = e.dir.clone();
        let ids = vec![id(&e.fake, k % 8)];
        let want = e.fake.devices[k % 8].uuid.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = plugin_client(&dir, "kudos.sock").await;
            let r = c
                .allocate(api::AllocateRequest {
                    container_requests: vec![api::ContainerAllocateRequest { devices_ids: ids }],
                })
                .await
                .expect("allocate")
                .into_inner();
            assert_eq!(
                r.container_responses[0].envs.get("NVIDIA_VISIBLE_DEVICES"),
                Some(&want)
            );
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    e.plugin.stop().await;
}

#[tokio::test]
async fn preferred_allocation_uses_nvlink_and_never_fails_on_valid_input() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let nvml_dir = tmp.path().join("nvml");
    std::fs::create_dir_all(&nvml_dir).expect("dir");
    let mut fake = FakeNvml::new(&nvml_dir, 8).expect("fake");
    fake.links.push(FakeLink {
        a: 1,
        b: 6,
        level: 0,
        nvlinks: 12,
    });
    fake.links.push(FakeLink {
        a: 2,
        b: 3,
        level: 10,
        nvlinks: 0,
    });
    fake.write().expect("write");
    let dir = tmp.path().join("dp");
    std::fs::create_dir_all(&dir).expect("dir");
    let mut kubelet = Kubelet::new(&dir);
    kubelet.start();
    let plugin = Plugin::start(&flags(&dir, fake.library(), &tmp.path().join("c")));
    kubelet.registration().await;
    kubelet.list_where(|l| l.len() == 8).await;
    let mut c = plugin_client(&dir, "kudos.sock").await;
    let all: Vec<String> = (0..8).map(|i| id(&fake, i)).collect();
    let ask = |avail: Vec<String>, must: Vec<String>, size: i32| api::PreferredAllocationRequest {
        container_requests: vec![api::ContainerPreferredAllocationRequest {
            available_device_i_ds: avail,
            must_include_device_i_ds: must,
            allocation_size: size,
        }],
    };
    let pick = |r: api::PreferredAllocationResponse| {
        let mut v = r.container_responses[0].device_i_ds.clone();
        v.sort();
        v
    };
    // NVLinked pair 1-6 beats anything else, although they sit on different NUMA nodes.
    let r = c
        .get_preferred_allocation(ask(all.clone(), vec![], 2))
        .await
        .expect("pref")
        .into_inner();
    let mut want = vec![id(&fake, 1), id(&fake, 6)];
    want.sort();
    assert_eq!(pick(r), want);
    // With 2 required, its board neighbour 3 is chosen.
    let r = c
        .get_preferred_allocation(ask(all.clone(), vec![id(&fake, 2)], 2))
        .await
        .expect("pref")
        .into_inner();
    let mut want = vec![id(&fake, 2), id(&fake, 3)];
    want.sort();
    assert_eq!(pick(r), want);
    // Without 1 and 6: three on one NUMA node, including the PCIe-switch pair 2-3.
    let avail: Vec<String> = [0, 2, 4, 5, 7, 3].iter().map(|&i| id(&fake, i)).collect();
    let r = c
        .get_preferred_allocation(ask(avail.clone(), vec![], 3))
        .await
        .expect("pref")
        .into_inner();
    assert_eq!(pick(r), vec![id(&fake, 0), id(&fake, 2), id(&fake, 3)]);
    // Must-include 4 keeps the rest on NUMA node 1.
    let r = c
        .get_preferred_allocation(ask(avail, vec![id(&fake, 4)], 3))
        .await
        .expect("pref")
        .into_inner();
    assert_eq!(pick(r), vec![id(&fake, 4), id(&fake, 5), id(&fake, 7)]);
    // Invalid input is an error, not a panic.
    assert_eq!(
        c.get_preferred_allocation(ask(all, vec![], 9))
            .await
            .expect_err("too big")
            .code(),
        Code::InvalidArgument
    );
    plugin.stop().await;
}

#[tokio::test]
async fn kubelet_restart_reregisters_within_a_second() {
    let mut e = setup(2, &[]).await;
    e.kubelet.registration().await;
    e.kubelet.list_where(|l| l.len() == 2).await;
    for _ in 0..2 {
        let recreated = e.kubelet.restart().await;
        let (reg, at) = e.kubelet.registration().await;
        assert_eq!(reg.resource_name, "kudos.dev/gpu");
        let took = at.duration_since(recreated);
        assert!(
            took < Duration::from_secs(1),
            "re-registered after {took:?}"
        );
        assert!(e.dir.join("kudos.sock").exists(), "own socket re-created");
        e.kubelet.list_where(|l| healthy(l) == 2).await;
    }
    e.plugin.stop().await;
}

#[tokio::test]
async fn own_socket_removed_is_recreated_and_reregistered() {
    let mut e = setup(1, &[]).await;
    e.kubelet.registration().await;
    e.kubelet.list_where(|l| l.len() == 1).await;
    std::fs::remove_file(e.dir.join("kudos.sock")).expect("rm");
    e.kubelet.registration().await;
    e.kubelet.list_where(|l| l.len() == 1).await;
    assert!(e.dir.join("kudos.sock").exists());
    e.plugin.stop().await;
}

#[tokio::test]
async fn closed_stream_reregisters_once() {
    let mut e = setup(1, &[]).await;
    e.kubelet.registration().await;
    e.kubelet.list_where(|l| l.len() == 1).await;
    e.kubelet.close_streams();
    e.kubelet.registration().await;
    e.kubelet.list_where(|l| l.len() == 1).await;
    // The new stream stays open: no registration loop.
    e.kubelet
        .no_registration_for(Duration::from_millis(1500))
        .await;
    e.plugin.stop().await;
}

#[tokio::test]
async fn starts_without_a_kubelet_and_registers_when_it_appears() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("not-yet");
    let nvml_dir = tmp.path().join("nvml");
    std::fs::create_dir_all(&nvml_dir).expect("dir");
    let fake = FakeNvml::new(&nvml_dir, 1).expect("fake");
    let plugin = Plugin::start(&flags(&dir, fake.library(), &tmp.path().join("c")));
    let sock = dir.join("kudos.sock");
    for _ in 0..100 {
        if sock.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(sock.exists(), "serves before the kubelet exists");
    let mut kubelet = Kubelet::new(&dir);
    kubelet.start();
    let (reg, _) = kubelet.registration().await;
    assert_eq!(reg.endpoint, "kudos.sock");
    plugin.stop().await;
}
