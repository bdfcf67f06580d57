//! Kudos node agent: samples GPUs while pods run, attributes them to pods and reports each run to the orchestrator.
#![forbid(unsafe_code)]

use clap::Parser;
use std::process::ExitCode;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(name = "kudos-node-agent", version, about = "Kudos node agent: samples GPUs while pods run, attributes them to pods and reports each run to the orchestrator.")]
pub struct Args {
    #[command(flatten)]
    pub log: kudos_common::LogArgs,
}

/// Parses arguments, runs, and maps the outcome to an exit code.
pub fn main_with_args() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = args.log.init() {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "exiting");
            ExitCode::FAILURE
        }
    }
}

/// Runs until SIGTERM.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    tracing::info!("started");
    kudos_common::shutdown_signal().await;
    Ok(())
}
