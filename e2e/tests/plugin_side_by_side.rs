//! The short form of `kudos-e2e-plugin-side-by-side`: `kudos-device-plugin` and the upstream
//! sample device plugin, each on its own kubelet-dm (the kubelet's real device manager), measured
//! in alternation in the same run. Fails when Kudos is over twice the sample plugin on Allocate
//! p50, re-registration p50 after a kubelet restart, or RSS. Ratios within one run, not absolute
//! times, so a slow or busy machine slows both columns alike. Kudos is its release build
//! (`$KUDOS_BIN_DIR` overrides).

use kudos_e2e::plugin_bench::{self, GATE_FACTOR, Options, Subject};
use kudos_e2e::{RunDir, paths::upstream_bin, require_bins};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "current_thread")]
async fn kudos_plugin_within_twice_the_sample_plugin() -> anyhow::Result<()> {
    // The release plugin (what ships; `Subject::binary`): scripts/test and e2e/run build it
    // (images/build --profile release) before `cargo test`.
    let kudos = Subject::Kudos.binary();
    if !kudos.is_file() {
        eprintln!(
            "plugin_side_by_side: measures the release build: cargo build --release -p kudos-device-plugin"
        );
    }
    if !require_bins(
        "plugin_side_by_side",
        &[
            upstream_bin("kubelet-dm"),
            kudos.clone(),
            Subject::Sample.binary(),
        ],
    ) {
        return Ok(());
    }
    let opts = Options {
        allocations: 300,
        warmup: 50,
        restarts: 2,
        gpus: 8,
        settle: Duration::from_secs(1),
    };
    eprintln!("kudos-device-plugin: {}", Subject::Kudos.describe());
    let run = RunDir::new("plugin-side-by-side")?;
    let t = Instant::now();
    let c = plugin_bench::compare(&opts, &run, |l| eprintln!("... {l}")).await?;
    eprint!("{}", c.table());
    eprintln!("RESULT {}", c.json());
    eprintln!("side-by-side took {:?}", t.elapsed());
    let over = c.over(GATE_FACTOR);
    assert!(
        over.is_empty(),
        "kudos-device-plugin over {GATE_FACTOR}x the sample device plugin: {}",
        over.iter()
            .map(|r| format!(
                "{} {:.2}x (kudos {:.6}, sample {:.6})",
                r.figure,
                r.ratio(),
                r.kudos,
                r.sample
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    run.pass();
    Ok(())
}
