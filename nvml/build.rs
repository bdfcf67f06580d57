//! Compiles the fake `libnvidia-ml.so.1` (fake/fake_nvml.c) into OUT_DIR so tests of this crate
//! and of its users can load it through nvml-wrapper's real dynamic-loading path.
//! It is a few hundred lines of C; the build costs well under a second.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "fake/fake_nvml.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let lib = out.join("libnvidia-ml.so.1");
    let compiler = cc::Build::new().get_compiler();
    let mut cmd: Command = compiler.to_command();
    cmd.args([
        "-shared",
        "-fPIC",
        "-O1",
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
        "-o",
    ])
    .arg(&lib)
    .arg(src)
    .args(["-lpthread", "-ldl"]);
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler: {e}"));
    assert!(status.success(), "compiling {src} failed: {status}");
    println!("cargo:rustc-env=KUDOS_FAKE_NVML_LIBRARY={}", lib.display());
}
