//! A loopback cluster for a developer: etcd, kube-apiserver, kube-scheduler (wired to a
//! `kudos-orchestrator` unless `--no-kudos`) and N Node objects, until Ctrl-C / SIGTERM.
//!
//! `kudos-e2e-up [--nodes N (default 24; 0 = none; "alibaba" = the 1,213 trace shapes)] [--no-kudos]`
//! Prints `export KUBECONFIG=...`; logs are in the printed run directory (kept).

use anyhow::{Context, Result};
use kudos_e2e::nodes::{alibaba_shapes, create_nodes, uniform_shapes};
use kudos_e2e::orchestrator::Orchestrator;
use kudos_e2e::{ControlPlane, ControlPlaneOptions, ExtenderOptions, RunDir};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut nodes = "24".to_string();
    let mut kudos = true;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--nodes" => nodes = it.next().context("--nodes needs a value")?,
            "--no-kudos" => kudos = false,
            _ => anyhow::bail!("usage: kudos-e2e-up [--nodes N|alibaba] [--no-kudos]"),
        }
    }
    let run = RunDir::new("up")?;
    let mut cp = ControlPlane::start(&run, ControlPlaneOptions::default()).await?;
    let shapes = if nodes == "alibaba" {
        alibaba_shapes()?
    } else {
        let n: usize = nodes.parse()?;
        let mut v = uniform_shapes(&["V100M32", "P100", "T4"], n.div_ceil(3), 8);
        v.truncate(n);
        v
    };
    create_nodes(&cp.client, &shapes, "kudos.dev/gpu").await?;
    let mut orch = None;
    if kudos {
        let names: Vec<String> = shapes.iter().map(|s| s.name.clone()).collect();
        let o = Orchestrator::start(run.path(), Some(&cp.kubeconfig), &names, &[]).await?;
        cp.start_scheduler(100, Some(&ExtenderOptions::kudos(o.extender_url())))?;
        println!(
            "orchestrator: http://{} (extender, /explain, /state), gRPC {}",
            o.http_addr, o.grpc_addr
        );
        orch = Some(o);
    } else {
        cp.start_scheduler(100, None)?;
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
    if let Some(o) = orch.as_mut() {
        o.stop();
    }
    cp.stop();
    Ok(())
}
