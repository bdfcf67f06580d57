//! `kudos-sim-bench`: wall time of simulating 10,000 jobs on 108 GPUs, per policy.
//!
//! A binary rather than a test so no assertion depends on machine speed. Run it with
//! `cargo run --release -p kudos-sim --bin kudos-sim-bench [-- ARGS]`; it takes the same flags as
//! `kudos-sim` (defaults here: B1, 10,000 jobs, Gavel's 108 one-GPU nodes).
use clap::Parser;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let mut argv: Vec<String> = std::env::args().collect();
    let has = |f: &str, v: &[String]| v.iter().any(|a| a == f || a.starts_with(&format!("{f}=")));
    if !has("--jobs", &argv) {
        argv.extend(["--jobs".into(), "10000".into()]);
    }
    if !has("--cluster", &argv) {
        argv.extend(["--cluster".into(), "per-type:36x1".into()]);
    }
    let args = kudos_sim::cli::Args::parse_from(argv);
    let s = kudos_sim::cli::Settings::from_args(&args)?;
    println!("{}", s.describe_text());
    for &rate in &s.rates {
        for name in &s.policies {
            let t = Instant::now();
            let m = kudos_sim::run_one(&s, rate, s.seeds[0], name, &mut || {})?;
            println!(
                "{name:<13} rate {rate}/h: {} jobs simulated in {:.3} s (avg JCT {:.2} h)",
                s.workload.jobs,
                t.elapsed().as_secs_f64(),
                m.avg_jct_h
            );
        }
    }
    Ok(())
}
