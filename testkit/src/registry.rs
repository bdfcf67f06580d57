//! Debian's `docker-registry` (distribution v2) on a loopback port, a plugin base image pushed
//! into it, and `skopeo` to read images back the way a container runtime would.

use crate::paths::system_bin;
use crate::proc::Proc;
use anyhow::{Context, Result, bail};
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// What a registry test runs: `docker-registry` and `skopeo` (for [`crate::require_bins`]).
pub fn bins() -> Vec<PathBuf> {
    vec![system_bin("docker-registry"), system_bin("skopeo")]
}

/// A running registry. Dropping it stops it.
#[derive(Debug)]
pub struct Registry {
    proc: Proc,
    /// `127.0.0.1:<port>`.
    pub addr: String,
}

impl Registry {
    /// Starts a registry on `127.0.0.1:port` with its configuration, storage and log under
    /// `dir`, and waits until it accepts connections. Tests that first need the registry down
    /// pick the port with [`crate::proc::free_port`] and start it later.
    pub async fn start(dir: &Path, port: u16) -> Result<Self> {
        let config = dir.join("docker-registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.join("docker-registry").display()
            ),
        )?;
        let mut cmd = Command::new(system_bin("docker-registry"));
        cmd.arg("serve").arg(&config);
        let log = dir.join("docker-registry.log");
        let mut proc = Proc::spawn("docker-registry", cmd, &log)?;
        let addr = format!("127.0.0.1:{port}");
        proc.wait_ready("connections", Duration::from_secs(20), async || {
            std::net::TcpStream::connect(&addr).ok().map(|_| ())
        })
        .await?;
        Ok(Self { proc, addr })
    }

    /// Pushes `kudos/device-plugin:base`, a minimal device-plugin base image (one layer holding
    /// an executable script `/kudos-device-plugin`, its entrypoint; `PATH` set), as an OCI
    /// image over plain HTTP. Returns its reference (`<addr>/kudos/device-plugin:base`).
    pub async fn push_plugin_base(&self) -> Result<String> {
        let reference = format!("{}/kudos/device-plugin:base", self.addr);
        let (layer, diff_id) = script_layer("kudos-device-plugin", b"#!/bin/sh\necho plugin\n")?;
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/usr/bin:/bin"], "Entrypoint": ["/kudos-device-plugin"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": "kudos-testkit plugin base"}],
        });
        let client = oci_client::Client::new(ClientConfig {
            protocol: ClientProtocol::Http,
            ..ClientConfig::default()
        });
        client
            .push(
                &reference.parse()?,
                &[ImageLayer::oci_v1_gzip(layer, None)],
                Config::oci_v1(serde_json::to_vec(&config)?, None),
                &RegistryAuth::Anonymous,
                None,
            )
            .await
            .with_context(|| format!("push {reference}"))?;
        Ok(reference)
    }

    /// Fails with the log's tail when the registry has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.proc.check_running()
    }
}

/// A gzip-compressed tar holding one executable file, and its diff id (`sha256:` of the tar).
fn script_layer(name: &str, body: &[u8]) -> Result<(Vec<u8>, String)> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_ustar();
    header.set_size(body.len() as u64);
    header.set_mode(0o755);
    header.set_cksum();
    tar.append_data(&mut header, name, body)?;
    let tar = tar.into_inner()?;
    let diff_id = format!("sha256:{:x}", Sha256::digest(&tar));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar)?;
    Ok((gz.finish()?, diff_id))
}

/// Runs `skopeo` with `args`: its stdout, or an error carrying its stderr.
pub fn skopeo(args: &[&str]) -> Result<Vec<u8>> {
    let out = Command::new(system_bin("skopeo"))
        .args(args)
        .output()
        .context("run skopeo")?;
    if !out.status.success() {
        bail!("skopeo {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(out.stdout)
}

/// `skopeo inspect --tls-verify=false` of `docker://<reference>` (`--raw` for the manifest,
/// `--config` for the image configuration via `extra`), parsed as JSON.
pub fn inspect(reference: &str, extra: &[&str]) -> Result<serde_json::Value> {
    let target = format!("docker://{reference}");
    let mut args = vec!["inspect", "--tls-verify=false"];
    args.extend_from_slice(extra);
    args.push(&target);
    serde_json::from_slice(&skopeo(&args)?).context("skopeo inspect output is not JSON")
}
