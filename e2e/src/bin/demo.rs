//! `kudos-e2e-demo`: Kudos on a two-node cluster on this machine, in one command (run it
//! through `scripts/demo`, which builds what it needs first).
//!
//! It brings up real kubelets with containerd and runc (node a: 4 fake V100s, node b: 4 fake
//! T4s, see `testkit/src/realnode`), installs Kudos with `helm install`, runs a workload of two
//! job classes (X fastest on the V100s, Y on the T4s) and prints how placement improved as
//! Kudos learned, window by window, with the predictions it learned. Then it uninstalls Kudos,
//! tears the cluster down and checks the host is exactly as it was (exit code 1 if not).
//! Needs root (mount namespaces, cgroups, loopback addresses), like the real-node tests.
//!
//! `kudos-e2e-demo [--jobs N]` (default 40, at least 10)

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use kudos_e2e::realnode::scenario::{self, Reaper, class_of, job};
use kudos_e2e::realnode::{RealCluster, gpus};
use kudos_e2e::{RunDir, require_bins};
use std::time::{Duration, Instant};

const WINDOW: usize = 10;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut jobs = 40;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--jobs" => {
                jobs = args
                    .next()
                    .context("--jobs needs a number")?
                    .parse()
                    .context("--jobs: a number")?;
            }
            "-h" | "--help" => {
                println!("usage: kudos-e2e-demo [--jobs N]   (run it through scripts/demo)");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}; usage: kudos-e2e-demo [--jobs N]"),
        }
    }
    if jobs < WINDOW {
        bail!("--jobs must be at least {WINDOW}");
    }
    if !require_bins("kudos-e2e-demo", &scenario::required_files()) {
        bail!("missing files (listed above): run scripts/demo, which builds them");
    }
    let adapt = std::env::current_exe()?.with_file_name("kudos-e2e-adapt");
    let run = RunDir::new("demo")?;
    let t0 = Instant::now();
    println!(
        "Starting two real nodes (4 x {} and 4 x {}) ...",
        gpus::MODEL_A,
        gpus::MODEL_B
    );
    let mut cluster =
        RealCluster::start(&run, gpus::two_gpu_nodes(run.path(), gpus::IMAGES)?).await?;
    println!("Installing Kudos with helm (rollout on, Kudos' own scheduler) ...");
    let kudos = scenario::install(&run, &mut cluster, &adapt, &Default::default()).await?;
    let access = kudos_e2e::realnode::access::get()?;
    println!(
        "Kudos ready after {:.0?}; its status page (HTTPS, a token bound to ClusterRole kudos-reader):\n  curl {} {}/status",
        t0.elapsed(),
        access
            .curl_args(kudos_e2e::realnode::access::As::Reader)
            .join(" "),
        access.base()
    );
    println!("Submitting {jobs} jobs, one per free GPU ...");
    let pods: Api<Pod> = Api::namespaced(cluster.cp.client.clone(), "default");
    let reaper = Reaper::spawn(pods.clone());
    for i in 0..jobs {
        reaper.wait_for_free_device(i).await?;
        pods.create(&PostParams::default(), &job(i)).await?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let placed = reaper.wait_all(jobs).await?;
    let failed = placed.iter().filter(|p| p.2 != "Succeeded").count();

    println!();
    println!(
        "Jobs on their class's faster node (X: {}, Y: {}), by window:",
        scenario::NODE_A,
        scenario::NODE_B
    );
    for from in (0..jobs).step_by(WINDOW) {
        let to = (from + WINDOW).min(jobs);
        let window: Vec<_> = placed
            .iter()
            .filter(|(n, _, _)| {
                n.trim_start_matches("job-")
                    .parse::<usize>()
                    .is_ok_and(|i| (from..to).contains(&i))
            })
            .cloned()
            .collect();
        let (fast, total) = scenario::on_faster_node(&window, 0);
        println!(
            "  jobs {from:>3}-{:<3} {fast:>2}/{total:<2} {}",
            to - 1,
            "#".repeat(fast * 20 / total.max(1))
        );
    }
    println!("What Kudos learned (predicted seconds per node, from /explain):");
    for parity in [0, 1] {
        let (class, fast) = class_of(parity);
        match scenario::ranked_both(parity, jobs) {
            Some((i, entries)) => {
                println!("  class {class} (faster on {fast}), job-{i:02}: {entries:.2?}");
            }
            None => println!("  class {class}: no job was ranked on both nodes"),
        }
    }
    if failed > 0 {
        println!("{failed} job(s) failed");
    }
    let page = scenario::status_page(&run.join("status-page"))?;
    let shot = kudos_e2e::paths::repo_root().join("e2e/_work/demo-status.png");
    std::fs::copy(&page.screenshot, &shot)?;
    println!("The status page as a browser showed it: {}", shot.display());

    println!();
    println!("Uninstalling Kudos and tearing the cluster down ...");
    kudos.helm.uninstall()?;
    drop(kudos);
    cluster.shutdown_clean()?;
    println!("Host left as it was found. Done in {:.0?}.", t0.elapsed());
    run.pass();
    if failed > 0 {
        bail!("{failed} job(s) failed");
    }
    Ok(())
}
