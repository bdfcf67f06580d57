//! The binary as a process: how it refuses bad settings (exit code 2, a clear message, never a
//! panic) and how fast it exits on SIGTERM while the kubelet does not answer.

use crate::support;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::{Kubelet, plugin_client};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kudos-device-plugin");

/// Runs the plugin with `args` until it exits (it must refuse them before starting).
fn refused(args: &[&str]) -> Output {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(PLUGIN)
        .args([
            "--node-name=n1",
            "--metrics-addr=off",
            &format!("--device-plugin-dir={}", tmp.path().display()),
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the plugin");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{args:?} was not refused: the plugin kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn vendor_names_the_orchestrator_refuses_stop_the_plugin_with_exit_code_2() {
    let long = "v".repeat(kudos_api::bounds::MAX_VENDOR_NAME_LEN + 1);
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("devices.json");
    std::fs::write(
        &file,
        format!(
            r#"{{"version":"v1","vendor":"{long}","resourceName":"acme.com/npu","devices":[{{"id":"0"}}]}}"#
        ),
    )
    .expect("write");
    for (arg, says) in [
        (format!("--vendor={long}"), "--vendor: vendor name"),
        ("--vendor=Acme_Corp".to_string(), "--vendor: vendor name"),
        (
            format!("--static-devices={}", file.display()),
            "--static-devices: invalid",
        ),
    ] {
        let out = refused(&[&arg]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{arg}: {stderr}");
        assert!(stderr.contains(says), "{arg}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn huge_duration_flags_are_usage_errors_not_panics() {
    for flag in [
        "--probe-interval=999999999999h",
        "--register-timeout=1e300",
        "--recovery-quiet-seconds=18446744073709551616",
        "--report-interval=8d",
    ] {
        let out = refused(&[flag]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {stderr}");
        assert!(!stderr.contains("panicked"), "{flag}: {stderr}");
        let name = flag.split('=').next().unwrap_or(flag);
        assert!(
            stderr.contains(name.trim_end_matches("-seconds")),
            "{flag}: {stderr}"
        );
    }
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A static device file with one device, so the plugin starts without NVML.
fn static_devices(dir: &Path) -> PathBuf {
    let path = dir.join("devices.json");
    std::fs::write(
        &path,
        r#"{"version":"v1","vendor":"acme","resourceName":"acme.com/npu","devices":[{"id":"npu0"}]}"#,
    )
    .expect("write");
    path
}

/// Starts the plugin binary on `dir` with one static device and a 60 s `--register-timeout`.
fn start_plugin(tmp: &Path, dir: &Path) -> Killed {
    let child = Command::new(PLUGIN)
        .args([
            "--node-name=n1",
            "--metrics-addr=off",
            "--log-level=warn",
            "--backends=static",
            "--register-timeout=60s",
            &format!("--device-plugin-dir={}", dir.display()),
            &format!("--name-cache={}", tmp.join("name").display()),
            &format!("--static-devices={}", static_devices(tmp).display()),
        ])
        .spawn()
        .expect("start the plugin");
    Killed(child)
}

/// Sends SIGTERM; returns how long the plugin took to exit cleanly (it must, within 20 s).
fn terminate(child: &mut Killed) -> Duration {
    let signalled = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("wait") {
            break s;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(20),
            "still running 20 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(
        (status.code(), status.signal()),
        (Some(0), None),
        "a clean exit"
    );
    signalled.elapsed()
}

/// A kubelet that accepts connections on `kubelet.sock` and never answers; says when the
/// first connection arrives.
fn hung_kubelet(dir: &Path) -> std::sync::mpsc::Receiver<()> {
    let listener =
        std::os::unix::net::UnixListener::bind(dir.join("kubelet.sock")).expect("bind kubelet");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
            let _ = tx.send(());
        }
    });
    rx
}

/// SIGTERM while a `Register` call hangs on a kubelet that never answers: the plugin exits
/// promptly and cleanly, not after `--register-timeout` (60 s here).
#[test]
fn sigterm_while_registration_hangs_exits_promptly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("device-plugins");
    std::fs::create_dir_all(&dir).expect("dir");
    let connected = hung_kubelet(&dir);
    let mut child = start_plugin(tmp.path(), &dir);
    connected
        .recv_timeout(Duration::from_secs(20))
        .expect("the plugin dials the kubelet");
    // The Register call is in flight and will not be answered.
    std::thread::sleep(Duration::from_millis(200));
    let took = terminate(&mut child);
    eprintln!(
        "RESULT exit after SIGTERM, Register hanging: {} ms",
        took.as_millis()
    );
    assert!(!dir.join("kudos.sock").exists(), "its socket removed");
}

/// SIGTERM while a client (a kubelet that stopped) holds a `ListAndWatch` stream open and
/// never hangs up: the shutdown waits at most 1 s for the hang-up and 2 s for the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_a_stopped_kubelet_holds_its_stream_exits_promptly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("device-plugins");
    std::fs::create_dir_all(&dir).expect("dir");
    let mut kubelet = Kubelet::new(&dir);
    kubelet.start();
    let mut child = start_plugin(tmp.path(), &dir);
    kubelet.registration().await;
    kubelet.list_where(|l| l.len() == 1).await;
    let mut c = plugin_client(&dir, "kudos.sock").await;
    let _held = c
        .list_and_watch(kudos_proto::deviceplugin::v1beta1::Empty {})
        .await
        .expect("stream");
    let took = tokio::task::spawn_blocking(move || terminate(&mut child))
        .await
        .expect("terminate");
    eprintln!(
        "RESULT exit after SIGTERM, a stream held open: {} ms",
        took.as_millis()
    );
    assert!(!dir.join("kudos.sock").exists(), "its socket removed");
}
