//! A Helm post-renderer for the real-node scenarios: `helm install --post-renderer` hands it the
//! chart's rendered manifests on stdin and installs what it prints, each object changed only
//! as a cluster without kube-proxy and cluster DNS forces (`kudos_e2e::realnode::kudos::adapt`).
//!
//! `kudos-e2e-adapt --api-port PORT < rendered.yaml > adapted.yaml`

use anyhow::{Context, Result, bail};
use std::io::{Read, Write};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = match (args.next().as_deref(), args.next()) {
        (Some("--api-port"), Some(p)) => p.parse().context("--api-port: a port number")?,
        _ => bail!("usage: kudos-e2e-adapt --api-port PORT < rendered.yaml"),
    };
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let mut out = std::io::stdout().lock();
    for doc in serde_yaml::Deserializer::from_str(&input) {
        let v: serde_json::Value =
            serde::Deserialize::deserialize(doc).context("parse a rendered manifest")?;
        if v.is_null() {
            continue;
        }
        let adapted = kudos_e2e::realnode::kudos::adapt(v, port);
        writeln!(out, "---\n{}", serde_yaml::to_string(&adapted)?)?;
    }
    Ok(())
}
