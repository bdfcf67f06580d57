//! A loopback cluster for a developer or a shell test: etcd, kube-apiserver, kube-scheduler
//! (wired to a `kudos-orchestrator` unless `--no-kudos`) and N Node objects, until Ctrl-C /
//! SIGTERM. The control plane is the test kit's, the one every Rust test runs.
//!
//! Prints `export KUBECONFIG=...`; logs are in the printed run directory (kept; under
//! `$KUDOS_E2E_WORK_DIR` when set).

use anyhow::{Context, Result};
use kudos_e2e::cluster::ADMIN_TOKEN;
use kudos_e2e::nodes::{alibaba_shapes, create_nodes, uniform_shapes};
use kudos_e2e::orchestrator::Orchestrator;
use kudos_e2e::{ControlPlane, ControlPlaneOptions, ExtenderOptions, RunDir};
use std::path::{Path, PathBuf};

const HELP: &str = "\
kudos-e2e-up: a loopback Kubernetes control plane (the test kit's) until Ctrl-C or SIGTERM

USAGE: kudos-e2e-up [--nodes N|alibaba] [--no-kudos] [--no-scheduler] [--env-file FILE]

  --nodes N        Node objects to create (default 24; 0 = none; alibaba = the 1,213 trace shapes)
  --no-kudos       no kudos-orchestrator; kube-scheduler runs without the extender
  --no-scheduler   no kube-scheduler (and no orchestrator): etcd and kube-apiserver only
  --env-file FILE  once the API server is ready, write shell assignments a script can source:
                   KUDOS_UP_SERVER (https URL), KUDOS_UP_CA (CA file), KUDOS_UP_TOKEN (an admin
                   bearer token, group system:masters), KUDOS_UP_KUBECONFIG, KUDOS_UP_RUN_DIR
                   (logs). Written to FILE.tmp and renamed, so it appears complete

Needs etcd, kube-apiserver and kube-scheduler in e2e/_out/bin (e2e/build).
";

struct Opts {
    nodes: String,
    kudos: bool,
    scheduler: bool,
    env_file: Option<PathBuf>,
}

fn opts() -> Result<Option<Opts>> {
    let mut o = Opts {
        nodes: "24".into(),
        kudos: true,
        scheduler: true,
        env_file: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--nodes" => o.nodes = it.next().context("--nodes needs a value")?,
            "--no-kudos" => o.kudos = false,
            "--no-scheduler" => (o.kudos, o.scheduler) = (false, false),
            "--env-file" => {
                o.env_file = Some(it.next().context("--env-file needs a path")?.into());
            }
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(None);
            }
            other => anyhow::bail!("unknown argument {other}\n\n{HELP}"),
        }
    }
    Ok(Some(o))
}

/// A shell word for `v`: single-quoted, with any `'` closed, escaped and reopened.
fn shell_quoted(v: &str) -> String {
    format!("'{}'", v.replace('\'', r"'\''"))
}

fn write_env_file(path: &Path, cp: &ControlPlane, run: &RunDir) -> Result<()> {
    let vars = [
        ("KUDOS_UP_SERVER", cp.server.clone()),
        ("KUDOS_UP_CA", cp.ca_file().display().to_string()),
        ("KUDOS_UP_TOKEN", ADMIN_TOKEN.to_string()),
        ("KUDOS_UP_KUBECONFIG", cp.kubeconfig.display().to_string()),
        ("KUDOS_UP_RUN_DIR", run.path().display().to_string()),
    ];
    let text: String = vars
        .iter()
        .map(|(k, v)| format!("{k}={}\n", shell_quoted(v)))
        .collect();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let Some(o) = opts()? else {
        return Ok(());
    };
    let run = RunDir::new("up")?;
    let mut cp = ControlPlane::start(&run, ControlPlaneOptions::default()).await?;
    let shapes = if o.nodes == "alibaba" {
        alibaba_shapes()?
    } else {
        let n: usize = o
            .nodes
            .parse()
            .with_context(|| format!("--nodes {}: not a number or alibaba", o.nodes))?;
        let mut v = uniform_shapes(&["V100M32", "P100", "T4"], n.div_ceil(3), 8);
        v.truncate(n);
        v
    };
    create_nodes(&cp.client, &shapes, "kudos.dev/gpu").await?;
    let mut orch = None;
    if o.kudos {
        let names: Vec<String> = shapes.iter().map(|s| s.name.clone()).collect();
        let k = Orchestrator::start(run.path(), Some(&cp.kubeconfig), &names, &[]).await?;
        cp.start_scheduler(100, Some(&ExtenderOptions::kudos(k.extender_url())))?;
        println!(
            "orchestrator: http://{} (extender, /explain, /state), gRPC {}",
            k.http_addr, k.grpc_addr
        );
        orch = Some(k);
    } else if o.scheduler {
        cp.start_scheduler(100, None)?;
    }
    if let Some(path) = &o.env_file {
        write_env_file(path, &cp, &run)?;
    }
    println!("{} nodes; logs in {}", shapes.len(), run.path().display());
    println!("export KUBECONFIG={}", cp.kubeconfig.display());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("stopping");
    cp.stop_scheduler();
    if let Some(k) = orch.as_mut() {
        k.stop();
    }
    cp.stop();
    Ok(())
}
