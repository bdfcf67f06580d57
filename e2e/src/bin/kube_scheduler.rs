//! kube-scheduler as the test kit runs it, with a configuration the caller wrote: for shell
//! tests (`charts/test.sh`) that check a configuration of their own (the chart's) against a
//! control plane `kudos-e2e-up` started, without a second copy of how kube-scheduler is run.
//! Runs until Ctrl-C or SIGTERM, then stops kube-scheduler; exits 1 with its log's tail if it
//! exits first.

use anyhow::{Context, Result, bail};
use kudos_e2e::cluster::kube_scheduler_command;
use kudos_e2e::paths::upstream_bin;
use kudos_e2e::proc::Proc;
use std::path::PathBuf;
use std::time::Duration;

const HELP: &str = "\
kudos-e2e-kube-scheduler: the upstream kube-scheduler with a given configuration, run the way
the test kit runs it (loopback serving port, its own certificates), until Ctrl-C or SIGTERM

USAGE: kudos-e2e-kube-scheduler --config FILE --kubeconfig FILE --dir DIR

  --config FILE      KubeSchedulerConfiguration (its clientConnection names the API credentials)
  --kubeconfig FILE  credentials kube-scheduler checks its own callers with (authentication and
                     authorization delegated to the API server)
  --dir DIR          its log (DIR/kube-scheduler.log) and serving certificates; created

Needs kube-scheduler in e2e/_out/bin (e2e/build) or $KUDOS_E2E_BIN_DIR.
";

struct Opts {
    config: PathBuf,
    kubeconfig: PathBuf,
    dir: PathBuf,
}

fn opts() -> Result<Option<Opts>> {
    let (mut config, mut kubeconfig, mut dir) = (None, None, None);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .map(PathBuf::from)
                .context(format!("{a} needs a value"))
        };
        match a.as_str() {
            "--config" => config = Some(value()?),
            "--kubeconfig" => kubeconfig = Some(value()?),
            "--dir" => dir = Some(value()?),
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(None);
            }
            other => bail!("unknown argument {other}\n\n{HELP}"),
        }
    }
    let missing = |f: &str| format!("{f} is required\n\n{HELP}");
    Ok(Some(Opts {
        config: config.with_context(|| missing("--config"))?,
        kubeconfig: kubeconfig.with_context(|| missing("--kubeconfig"))?,
        dir: dir.with_context(|| missing("--dir"))?,
    }))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let Some(o) = opts()? else {
        return Ok(());
    };
    let bin = upstream_bin("kube-scheduler");
    if !bin.is_file() {
        bail!("no {} (run e2e/build)", bin.display());
    }
    std::fs::create_dir_all(&o.dir).with_context(|| format!("creating {}", o.dir.display()))?;
    let cmd = kube_scheduler_command(&o.config, &o.kubeconfig, &o.dir.join("certs"));
    let mut scheduler = Proc::spawn("kube-scheduler", cmd, &o.dir.join("kube-scheduler.log"))?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = tick.tick() => scheduler.check_running()?,
        }
    }
    scheduler.stop();
    Ok(())
}
