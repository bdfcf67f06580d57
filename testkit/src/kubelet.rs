//! Client for `kubelet-dm` (`e2e/cmd/kubelet-dm`): the kubelet's real device manager and
//! PodResources server in a private mount namespace where `--root-dir` is `/var/lib/kubelet`.

use crate::http;
use crate::paths::upstream_bin;
use crate::proc::Proc;
use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A running kubelet-dm.
#[derive(Debug)]
pub struct KubeletDm {
    proc: Proc,
    /// `127.0.0.1:<port>` of the control API.
    pub addr: String,
    /// Host directory that is `/var/lib/kubelet` inside the namespace.
    pub root: PathBuf,
}

/// Capacity and allocatable per resource, and device health per resource.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Capacity {
    /// Capacity (healthy + unhealthy devices).
    pub capacity: BTreeMap<String, i64>,
    /// Allocatable (healthy devices).
    pub allocatable: BTreeMap<String, i64>,
    /// Allocatable (healthy) device id → health, per resource (the device manager's
    /// `GetAllocatableDevices`; unhealthy devices are absent).
    pub devices: BTreeMap<String, BTreeMap<String, String>>,
    /// Increments on each (re)start of the manager.
    pub generation: u64,
}

impl KubeletDm {
    /// Starts kubelet-dm with `root` as its `/var/lib/kubelet`, logging to `log`.
    pub async fn start(root: &Path, log: &Path) -> Result<Self> {
        std::fs::create_dir_all(root)?;
        let addr_file = root.with_extension("addr");
        let _ = std::fs::remove_file(&addr_file);
        let mut cmd = Command::new(upstream_bin("kubelet-dm"));
        cmd.arg(format!("--root-dir={}", root.display()))
            .arg(format!("--addr-file={}", addr_file.display()))
            .arg(format!(
                "--v={}",
                std::env::var("KUDOS_E2E_KUBELET_V").unwrap_or_else(|_| "2".into())
            ));
        let mut proc = Proc::spawn("kubelet-dm", cmd, log)?;
        let addr = proc
            .wait_ready("its address file", Duration::from_secs(20), async || {
                std::fs::read_to_string(&addr_file).ok()
            })
            .await?;
        Ok(Self {
            proc,
            addr,
            root: root.to_path_buf(),
        })
    }

    /// The device-plugin directory as seen from the host.
    pub fn device_plugin_dir(&self) -> PathBuf {
        self.root.join("device-plugins")
    }

    /// The PodResources socket as seen from the host.
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.root.join("pod-resources/kubelet.sock")
    }

    /// Capacity, allocatable and device health.
    pub fn capacity(&self) -> Result<Capacity> {
        Ok(serde_json::from_value(http::get_json(
            &self.addr,
            "/capacity",
        )?)?)
    }

    /// Admits a pod through the kubelet's topology-manager admit handler (policy none), which
    /// calls the device manager's Allocate for each container. `containers` are
    /// `(name, [(resource, quantity)])`. Returns the harness's JSON answer.
    pub fn admit(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        containers: &[(&str, &[(&str, &str)])],
    ) -> Result<Value> {
        let cs: Vec<Value> = containers
            .iter()
            .map(|(n, reqs)| {
                let r: serde_json::Map<String, Value> = reqs
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), json!(v)))
                    .collect();
                json!({"name": n, "requests": r})
            })
            .collect();
        http::post_json(
            &self.addr,
            "/pods",
            &json!({"namespace": namespace, "name": name, "uid": uid, "containers": cs}),
        )
    }

    /// Marks a pod terminated; its devices are freed.
    pub fn delete_pod(&self, uid: &str) -> Result<()> {
        http::request("DELETE", &self.addr, &format!("/pods/{uid}"), None)?.json()?;
        Ok(())
    }

    /// Restarts the kubelet side as the kubelet does: stop, delete sockets, start (the new
    /// registration server deletes every socket in `device-plugins/`). Returns the new generation.
    pub fn restart(&self) -> Result<u64> {
        let v = http::post_json(&self.addr, "/restart", &json!({}))?;
        v["generation"].as_u64().context("generation")
    }

    /// Starts a process inside the namespace (it sees `/var/lib/kubelet`). Returns its pid.
    pub fn spawn(&self, argv: &[String], env: &[(&str, String)], log: &Path) -> Result<u32> {
        let env: serde_json::Map<String, Value> = env
            .iter()
            .map(|(k, v)| ((*k).to_string(), json!(v)))
            .collect();
        let v = http::post_json(
            &self.addr,
            "/spawn",
            &json!({"argv": argv, "env": env, "log": log}),
        )?;
        Ok(v["pid"].as_u64().context("pid")? as u32)
    }

    /// Sends a signal to a process started with [`KubeletDm::spawn`].
    pub fn kill(&self, pid: u32, signal: i32) -> Result<()> {
        http::post_json(&self.addr, "/kill", &json!({"pid": pid, "signal": signal}))?;
        Ok(())
    }

    /// Fails when kubelet-dm exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.proc.check_running()
    }
}

/// Calls the kubelet PodResources v1 `List` over the unix socket `socket`, as the node agent
/// does.
pub async fn pod_resources_list(
    socket: &Path,
) -> Result<kudos_proto::podresources::v1::ListPodResourcesResponse> {
    use kudos_proto::podresources::v1::{
        ListPodResourcesRequest, pod_resources_lister_client::PodResourcesListerClient,
    };
    let channel = kudos_proto::unix::connect(socket)
        .await
        .with_context(|| format!("connect {}", socket.display()))?;
    let mut c = PodResourcesListerClient::new(channel);
    Ok(c.list(ListPodResourcesRequest {}).await?.into_inner())
}
