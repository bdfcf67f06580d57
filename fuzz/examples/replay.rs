//! Runs one target on saved inputs, on stable, and prints each input's time and the process's
//! peak memory: to reproduce a libFuzzer finding without nightly, or to see whether it holds in
//! a release build (the libFuzzer build has debug assertions on, in redb too):
//!
//! ```text
//! cargo run --release -p kudos-fuzz --example replay -- store fuzz/libfuzzer/artifacts/store/oom-...
//! ```

use std::time::Instant;

fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(name) = args.next() else {
        eprintln!("usage: replay <target> <input>...");
        return std::process::ExitCode::from(2);
    };
    let Some(&(_, target)) = kudos_fuzz::TARGETS.iter().find(|(n, _)| *n == name) else {
        let names: Vec<&str> = kudos_fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
        eprintln!("no target {name:?}; the targets are {names:?}");
        return std::process::ExitCode::from(2);
    };
    kudos_fuzz::count_caught_panics();
    for path in args {
        let input = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("{path}: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        let t = Instant::now();
        target(&input);
        println!(
            "{path}: {} bytes, {:.3} s",
            input.len(),
            t.elapsed().as_secs_f64()
        );
    }
    let peak = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(str::to_owned)
        });
    println!("peak memory: {}", peak.as_deref().unwrap_or("unknown"));
    std::process::ExitCode::SUCCESS
}
