//! Fuzz targets for everything Kudos reads from outside: the extender's HTTP verbs, the
//! configuration files, the gRPC ingestion services and the on-disk stores.
//!
//! Each target is a function of bytes that must never panic, hang or exhaust memory, whatever
//! the bytes are; where the input has a meaning, it also checks what a user relies on (an
//! extender answer names only nodes it was offered, a refused request is a 4xx with a JSON
//! error, a damaged store opens empty or intact). The same functions run
//!
//! - under libFuzzer (`fuzz/libfuzzer`, `cargo +nightly fuzz run --fuzz-dir fuzz/libfuzzer
//!   <target>`), for the long runs, and
//! - in `tests/smoke.rs` on stable, in CI: the committed corpus plus a few thousand mutations
//!   of it per target.
//!
//! A target builds its peers fresh for every input (index, router, store, runtime), so a
//! crash reproduces from the one input that caused it.
#![forbid(unsafe_code)]

pub mod config;
pub mod extender;
pub mod grpc;
pub mod mutate;
pub mod seeds;
pub mod store;

use std::sync::atomic::{AtomicU64, Ordering};

/// A fuzz target: takes any bytes, panics only on a defect.
pub type Target = fn(&[u8]);

/// The targets by name, as `fuzz/libfuzzer/fuzz_targets/<name>.rs` and `fuzz/corpus/<name>/`
/// call them.
pub const TARGETS: [(&str, Target); 4] = [
    ("extender", extender::run),
    ("config", config::run),
    ("grpc", grpc::run),
    ("store", store::run),
];

/// The extender over `index`, as the orchestrator builds it in standalone mode (binds are
/// only recorded).
pub(crate) fn extender_for(
    index: kudos_orchestrator::index::SharedIndex,
    metrics: std::sync::Arc<kudos_orchestrator::metrics::Metrics>,
    unified: &str,
) -> kudos_orchestrator::extender::Extender {
    use kudos_orchestrator::extender::{ExplainCache, Extender, bind::LocalBinder, ledger::Ledger};
    Extender {
        index,
        ledger: Ledger::new(false),
        explain: ExplainCache::default(),
        binder: std::sync::Arc::new(LocalBinder),
        metrics,
        unified: unified.into(),
        last_filter: Default::default(),
        filter_top_nodes: None,
        events: None,
    }
}

/// A runtime for one input: current-thread (the input's requests run in order), with timers
/// and a blocking pool. Dropping it ends every task the input started.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        // Not an input's fault: the machine cannot make a thread or a timer.
        Err(e) => panic!("cannot build a tokio runtime: {e}"),
    }
}

/// A scratch directory on tmpfs where there is one (the stores fsync every commit).
pub(crate) fn scratch() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    };
    match dir {
        Ok(d) => d,
        Err(e) => panic!("cannot make a scratch directory: {e}"),
    }
}

static CAUGHT_PANICS: AtomicU64 = AtomicU64::new(0);

/// Panics inside redb that the product caught and turned into errors (redb panics on some
/// damaged pages; the stores catch that and report the file as damaged). Counted by the hook
/// that [`count_caught_panics`] installs.
pub fn caught_panics() -> u64 {
    CAUGHT_PANICS.load(Ordering::Relaxed)
}

/// Wraps the panic hook: a panic raised inside redb's code is counted and kept quiet (the
/// stores catch those on purpose; `KUDOS_FUZZ_VERBOSE=1` prints them with a backtrace, to tell
/// where one escaped); any other panic goes
/// to the hook that was there before, which under libFuzzer aborts and saves the input.
/// Installed once, however often it is called.
pub fn count_caught_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let verbose = std::env::var_os("KUDOS_FUZZ_VERBOSE").is_some();
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_redb = info.location().is_some_and(|l| l.file().contains("/redb-"));
            if !in_redb {
                return previous(info);
            }
            CAUGHT_PANICS.fetch_add(1, Ordering::Relaxed);
            if verbose {
                let trace = std::backtrace::Backtrace::force_capture();
                eprintln!("panic inside redb (the store catches it): {info}\n{trace}");
            }
        }));
    });
}
