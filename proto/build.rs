//! Compiles the .proto sources with protox (pure Rust, no `protoc`) and generates prost
//! messages plus tonic clients and servers into OUT_DIR.

use std::path::PathBuf;

/// The kubelet's own APIs, kept as upstream defines them (third_party/), then Kudos' own (proto/).
const PROTOS: &[&str] = &[
    "third_party/kubelet/deviceplugin/v1beta1/api.proto",
    "third_party/kubelet/podresources/v1/api.proto",
    "third_party/kubelet/dra/v1/api.proto",
    "third_party/kubelet/pluginregistration/v1/api.proto",
    "proto/kudos/v1/kudos.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let includes = [root.join("proto"), root.join("third_party")];
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let files: Vec<PathBuf> = PROTOS.iter().map(|p| root.join(p)).collect();
    let descriptors = protox::compile(&files, &includes)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
