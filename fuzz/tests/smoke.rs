//! The short fuzz run CI makes of every target, on stable: each seed (`kudos_fuzz::seeds`),
//! each saved input under `fuzz/regressions/<target>/` (inputs that once failed), then
//! mutations of them. No coverage feedback: this catches shallow regressions; the long runs
//! are libFuzzer's (`fuzz/README.md`).
//!
//! `KUDOS_FUZZ_SMOKE_RUNS` sets the mutations per target (default below); `KUDOS_FUZZ_SEED`
//! the generator's seed (default: fixed, so CI repeats itself). A failing input is written to
//! `target/fuzz-smoke/<target>-<n>` and named in the failure, ready for
//! `cargo +nightly fuzz run --fuzz-dir fuzz/libfuzzer <target> <file>`. Besides panics, an
//! input fails when it makes one allocation over [`MAX_ALLOCATION`].

use kudos_fuzz::mutate::{Rng, mutate, parse_dict};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The largest single allocation an input may make. Far above what any target needs (its
/// files and bodies are kilobytes) and far below the memory limits the processes run under
/// (512 Mi for the orchestrator, 64 Mi for the node agent): an input that allocates more
/// would get a deployed process killed, which no `catch_unwind` sees. Found this way: a
/// damaged page pointer made redb allocate 2.1 GB before reading the page.
const MAX_ALLOCATION: usize = 64 << 20;

/// The system allocator, recording the largest request since the last [`take_largest`].
struct LargestAllocation;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

fn take_largest() -> usize {
    LARGEST.swap(0, Ordering::Relaxed)
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

fn saved_inputs(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    paths
        .iter()
        .filter(|p| p.is_file())
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect()
}

fn smoke(name: &str, default_runs: u64, max_len: usize) {
    kudos_fuzz::count_caught_panics();
    let (_, target) = kudos_fuzz::TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no target {name}"));
    let dict_text =
        std::fs::read_to_string(manifest_dir().join("dict").join(format!("{name}.dict")))
            .unwrap_or_default();
    let dict = parse_dict(&dict_text);
    let dict: Vec<&[u8]> = dict.iter().map(Vec::as_slice).collect();
    let mut corpus = kudos_fuzz::seeds::seeds(name);
    assert!(!corpus.is_empty(), "target {name} has no seeds");
    corpus.extend(saved_inputs(&manifest_dir().join("regressions").join(name)));
    let runs = env_number("KUDOS_FUZZ_SMOKE_RUNS", default_runs);
    let mut rng = Rng::new(env_number("KUDOS_FUZZ_SEED", 0x006b_7564_6f73));
    let fail_dir = manifest_dir().join("../target/fuzz-smoke");
    let try_one = |n: u64, input: &[u8]| {
        take_largest();
        let outcome = std::panic::catch_unwind(|| target(input));
        // Other targets' tests run in parallel and count too: with --test-threads=1 the
        // input named below is certain.
        let largest = take_largest();
        let failure = if outcome.is_err() {
            "panicked (message above)".to_owned()
        } else if largest > MAX_ALLOCATION {
            format!("allocated {largest} bytes at once (at most {MAX_ALLOCATION})")
        } else {
            return;
        };
        let _ = std::fs::create_dir_all(&fail_dir);
        let path = fail_dir.join(format!("{name}-{n}"));
        let saved = std::fs::write(&path, input).is_ok();
        panic!(
            "target {name}, input {n} ({} bytes{}) {failure}",
            input.len(),
            if saved {
                format!(", saved to {}", path.display())
            } else {
                String::new()
            },
        );
    };
    for (n, input) in corpus.iter().enumerate() {
        try_one(n as u64, input);
    }
    for n in 0..runs {
        let mut input = corpus[rng.below(corpus.len())].clone();
        mutate(&mut input, &corpus, &dict, &mut rng, max_len);
        try_one(corpus.len() as u64 + n, &input);
    }
    eprintln!(
        "{name}: {} seeds and saved inputs, {runs} mutations, no escaped panic ({} panics caught inside the product so far)",
        corpus.len(),
        kudos_fuzz::caught_panics()
    );
}

#[test]
fn extender_smoke() {
    smoke("extender", 3_000, 8192);
}

#[test]
fn config_smoke() {
    smoke("config", 3_000, 8192);
}

#[test]
fn grpc_smoke() {
    smoke("grpc", 1_500, 8192);
}

#[test]
fn store_smoke() {
    smoke("store", 300, 4096);
}
