//! `kudos-device-plugin` beside the upstream sample device plugin on the kubelet's real device
//! manager: Allocate p50/p99/max, re-registration after a kubelet restart, RSS. Prints the
//! command line, a table and one JSON line with every figure.
//!
//! `kudos-e2e-plugin-side-by-side [--allocations N] [--restarts N] [--gpus N] [--warmup N]`
//! (see `--help`; compares the release `kudos-device-plugin` unless `$KUDOS_BIN_DIR` is set)

use anyhow::{Context, Result, bail};
use kudos_e2e::RunDir;
use kudos_e2e::plugin_bench::{self, GATE_FACTOR, Options, Subject};
use std::time::Duration;

const HELP: &str = "\
kudos-e2e-plugin-side-by-side: kudos-device-plugin beside the upstream sample device plugin
(k8s.io/kubernetes/test/images/sample-device-plugin), each registered with its own kubelet-dm
(the kubelet's real device manager, e2e/_out/bin), both running at once and measured in
alternation:
  - Allocate latency (p50, p99, max): sequential calls of one device each over one connection
    to the plugin's Unix socket. The kubelet is the normal caller; dialing the same socket
    measures the plugin and the gRPC round trip, not the kubelet's admission path.
  - re-registration: kubelet restart request -> the new device manager reports the plugin's
    full capacity again (p50, max); the restart call alone is shown too.
  - RSS (VmRSS) once registered and idle, after the Allocate loop, after the restarts; VmHWM.
Kudos runs with fake NVML GPUs, no orchestrator, metrics on loopback, log level info; the
sample plugin unmodified with its defaults (example.com/resource, 2 devices, klog logging
every Allocate; it waits 10 s before re-registering after a kubelet restart).

Usage: kudos-e2e-plugin-side-by-side [OPTIONS]

Options:
  --allocations N   measured Allocate calls per plugin [default: 2000]
  --warmup N        unmeasured Allocate calls per plugin before those [default: 100]
  --restarts N      kubelet restarts per plugin [default: 5]
  --gpus N          fake GPUs given to Kudos [default: 8]
  -h, --help        this text

Binaries: kudos-device-plugin from $KUDOS_BIN_DIR, else the release build
(target/release; cargo build --release -p kudos-device-plugin), sample-device-plugin and
kubelet-dm from e2e/_out/bin ($KUDOS_E2E_BIN_DIR; built by e2e/build). Needs root
(kubelet-dm's mount namespace).
Logs: e2e/_work/plugin-side-by-side-*/ (kept when the run fails or KUDOS_E2E_KEEP=1).";

fn parse(args: &[String]) -> Result<Option<Options>> {
    let mut o = Options::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (a.as_str(), None),
        };
        let mut value = |name: &str| -> Result<usize> {
            let v = match &inline {
                Some(v) => v.clone(),
                None => it
                    .next()
                    .with_context(|| format!("{name} needs a value"))?
                    .clone(),
            };
            v.parse()
                .with_context(|| format!("{name} {v:?}: a whole number"))
        };
        match flag {
            "-h" | "--help" => return Ok(None),
            "--allocations" => o.allocations = value(flag)?,
            "--warmup" => o.warmup = value(flag)?,
            "--restarts" => o.restarts = value(flag)?,
            "--gpus" => {
                o.gpus = u32::try_from(value(flag)?).context("--gpus: too many")?;
            }
            _ => bail!("unknown argument {a:?} (see --help)"),
        }
    }
    if o.allocations == 0 || o.restarts == 0 || o.gpus == 0 {
        bail!("--allocations, --restarts and --gpus must each be at least 1");
    }
    Ok(Some(o))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(opts) = parse(&args)? else {
        println!("{HELP}");
        return Ok(());
    };
    let env = std::env::var("KUDOS_BIN_DIR")
        .map(|d| format!("KUDOS_BIN_DIR={d}"))
        .ok();
    let command = env
        .into_iter()
        .chain(std::iter::once("kudos-e2e-plugin-side-by-side".to_string()))
        .chain(args.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    let bins = [
        kudos_e2e::paths::upstream_bin("kubelet-dm"),
        Subject::Kudos.binary(),
        Subject::Sample.binary(),
    ];
    let missing: Vec<String> = bins
        .iter()
        .filter(|b| !b.is_file())
        .map(|b| b.display().to_string())
        .collect();
    if !missing.is_empty() {
        bail!(
            "missing {} (e2e/build builds kubelet-dm and sample-device-plugin; cargo build --release -p kudos-device-plugin for the plugin)",
            missing.join(", ")
        );
    }
    println!("command: {command}");
    println!("kudos-device-plugin: {}", Subject::Kudos.describe());
    println!("sample-device-plugin: {}", Subject::Sample.describe());
    let before = plugin_bench::machine();
    println!("machine at start: {before}");
    let run = RunDir::new("plugin-side-by-side")?;
    let started = std::time::Instant::now();
    let c = plugin_bench::compare(&opts, &run, |line| eprintln!("... {line}")).await?;
    let took = started.elapsed();
    let after = plugin_bench::machine();
    println!();
    print!("{}", c.table());
    println!();
    for r in c.ratios() {
        println!(
            "{:<24} kudos/sample {:.2} ({} the {GATE_FACTOR}x gate)",
            r.figure,
            r.ratio(),
            if r.ratio() <= GATE_FACTOR {
                "within"
            } else {
                "OVER"
            }
        );
    }
    let mut j = c.json();
    j["command"] = command.into();
    j["options"] = serde_json::json!({
        "allocations": opts.allocations,
        "warmup": opts.warmup,
        "restarts": opts.restarts,
        "gpus": opts.gpus,
    });
    j["machine"] = serde_json::json!({"start": before, "end": after});
    j["wall_s"] = took.as_secs_f64().into();
    println!("{j}");
    eprintln!("done in {:.0?}", Duration::from_secs(took.as_secs()));
    run.pass();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags() {
        let o = parse(&args(&[
            "--allocations",
            "10",
            "--restarts=2",
            "--gpus",
            "4",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (o.allocations, o.restarts, o.gpus, o.warmup),
            (10, 2, 4, 100)
        );
        assert!(parse(&args(&["--help"])).unwrap().is_none());
        assert!(parse(&args(&["--allocations"])).is_err());
        assert!(parse(&args(&["--allocations", "x"])).is_err());
        assert!(parse(&args(&["--restarts", "0"])).is_err());
        assert!(parse(&args(&["--bogus"])).is_err());
    }
}
