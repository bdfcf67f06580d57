//! Socket handover: during a rollout a node's old plugin pod and its replacement overlap, both
//! serving `kudos.sock` for the same resource. The newcomer waits while the old one serves,
//! serves once it stops, and the old one's shutdown leaves the newcomer's socket in place: one
//! registration each, no fight. Against the kubelet stand-in, and against the kubelet's real
//! device manager (kubelet-dm) where it is built.

use crate::support;

use kudos_device_plugin::runtime::FileId;
use kudos_nvml::fake::FakeNvml;
use kudos_proto::deviceplugin::v1beta1 as api;
use kudos_testkit::paths::upstream_bin;
use kudos_testkit::{KubeletDm, RunDir};
use std::path::Path;
use std::time::{Duration, Instant};
use support::{Kubelet, Plugin, flags, plugin_client};

/// A fake NVML with `gpus` GPUs in `dir`, and the flags of a plugin using it on `plugins`.
fn plugin_flags(dir: &Path, plugins: &Path, gpus: u32) -> (FakeNvml, Vec<String>) {
    std::fs::create_dir_all(dir).expect("dir");
    let fake = FakeNvml::new(dir, gpus).expect("fake nvml");
    let f = flags(plugins, fake.library(), &dir.join("name-cache"));
    (fake, f)
}

#[tokio::test]
async fn a_second_plugin_waits_for_the_first_and_its_socket_survives_the_first_stopping() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("device-plugins");
    std::fs::create_dir_all(&dir).expect("dir");
    let sock = dir.join("kudos.sock");
    let mut kubelet = Kubelet::new(&dir);
    kubelet.start();
    // One GPU in the old plugin, two in the new one: the list says who serves.
    let (_fake_old, old_flags) = plugin_flags(&tmp.path().join("old"), &dir, 1);
    let (_fake_new, new_flags) = plugin_flags(&tmp.path().join("new"), &dir, 2);

    let old = Plugin::start(&old_flags);
    kubelet.registration().await;
    kubelet.list_where(|l| l.len() == 1).await;
    let old_socket = FileId::of(&sock).expect("the old plugin's socket");

    // The new plugin neither replaces the socket nor registers while the old one serves.
    let new = Plugin::start(&new_flags);
    kubelet
        .no_registration_for(Duration::from_millis(1500))
        .await;
    assert_eq!(FileId::of(&sock), Some(old_socket), "socket left alone");
    let mut c = plugin_client(&dir, "kudos.sock").await;
    let list = c
        .list_and_watch(api::Empty {})
        .await
        .expect("stream")
        .into_inner()
        .message()
        .await
        .expect("list")
        .expect("one");
    assert_eq!(list.devices.len(), 1, "still the old plugin serving");
    drop(c);

    // The old plugin stops: the new one serves and registers, once.
    let stopped = Instant::now();
    old.stop().await;
    kubelet.registration().await;
    eprintln!(
        "handover: registered {:?} after the old plugin's stop began",
        stopped.elapsed()
    );
    kubelet.list_where(|l| l.len() == 2).await;
    let new_socket = FileId::of(&sock).expect("the old plugin's shutdown left the new socket");
    assert_ne!(new_socket, old_socket);
    kubelet
        .no_registration_for(Duration::from_millis(1500))
        .await;
    assert_eq!(FileId::of(&sock), Some(new_socket));
    new.stop().await;
    assert!(!sock.exists(), "the new plugin removes its own socket");
}

#[tokio::test]
async fn a_stale_socket_file_is_replaced_at_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("device-plugins");
    std::fs::create_dir_all(&dir).expect("dir");
    // A socket whose process died: the file stays, connections are refused.
    drop(std::os::unix::net::UnixListener::bind(dir.join("kudos.sock")).expect("bind"));
    let mut kubelet = Kubelet::new(&dir);
    kubelet.start();
    let (_fake, f) = plugin_flags(&tmp.path().join("nvml"), &dir, 1);
    let plugin = Plugin::start(&f);
    kubelet.registration().await;
    kubelet.list_where(|l| l.len() == 1).await;
    plugin.stop().await;
}

/// Lines of `log` containing `needle`.
fn count_lines(log: &Path, needle: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handover_with_the_kubelets_device_manager_registers_each_plugin_once() -> anyhow::Result<()>
{
    let Some(run) = RunDir::for_test("dp-handover", &[upstream_bin("kubelet-dm")])? else {
        return Ok(());
    };
    let log = run.join("kubelet-dm.log");
    let dm = KubeletDm::start(&run.join("kubelet"), &log).await?;
    let dir = dm.device_plugin_dir();
    let gpus = |dm: &KubeletDm| -> (i64, i64) {
        let c = dm.capacity().unwrap_or_else(|e| panic!("capacity: {e}"));
        let get = |m: &std::collections::BTreeMap<String, i64>| {
            m.get("kudos.dev/gpu").copied().unwrap_or(0)
        };
        (get(&c.capacity), get(&c.allocatable))
    };
    let wait_for = async |what: &str, want: (i64, i64)| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while gpus(&dm) != want {
            assert!(Instant::now() < deadline, "{what}: {:?}", gpus(&dm));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let (_fake_old, old_flags) = plugin_flags(&run.join("old"), &dir, 1);
    let (_fake_new, new_flags) = plugin_flags(&run.join("new"), &dir, 2);

    let old = Plugin::start(&old_flags);
    wait_for("the old plugin's GPU", (1, 1)).await;
    let new = Plugin::start(&new_flags);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(gpus(&dm), (1, 1), "the old plugin keeps serving");

    let stopped = Instant::now();
    old.stop().await;
    wait_for("the new plugin's GPUs", (2, 2)).await;
    eprintln!(
        "RESULT handover with kubelet-dm: new plugin's GPUs allocatable {} ms after the old plugin's stop began",
        stopped.elapsed().as_millis()
    );
    // Nothing flaps afterwards, and the kubelet saw one registration per plugin.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(gpus(&dm), (2, 2));
    let registrations = count_lines(&log, "Got registration request from device plugin");
    let refused = count_lines(&log, "already connected");
    assert_eq!((registrations, refused), (2, 0), "see {}", log.display());

    // A real kubelet restart after the handover still re-registers at once.
    let restarted = Instant::now();
    let generation = dm.restart()?;
    let deadline = restarted + Duration::from_secs(20);
    while dm.capacity()?.generation != generation || gpus(&dm) != (2, 2) {
        assert!(
            Instant::now() < deadline,
            "no re-registration after a kubelet restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "RESULT re-registration after a kubelet restart: {} ms",
        restarted.elapsed().as_millis()
    );
    new.stop().await;
    assert!(!dir.join("kudos.sock").exists());
    drop(dm);
    run.pass();
    Ok(())
}
