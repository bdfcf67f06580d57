//! Process plumbing shared by every Kudos binary: one way to configure logs, to wait for a
//! shutdown signal and to serve metrics text, so the four daemons behave alike at 3 a.m.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "redb")]
pub mod damaged_file;
pub mod duration;
pub mod exposition;
pub mod grpc_tls;

use clap::{Args, ValueEnum};
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Logging flags every binary accepts.
#[derive(Clone, Debug, Args)]
pub struct LogArgs {
    /// Log filter in `RUST_LOG` syntax, e.g. `info` or `kudos_orchestrator=debug,info`.
    #[arg(
        long = "log-level",
        env = "KUDOS_LOG",
        default_value = "info",
        global = true
    )]
    pub level: String,
    /// Log format.
    #[arg(long = "log-format", env = "KUDOS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub format: LogFormat,
}

impl LogArgs {
    /// Installs the global tracing subscriber. Logs go to stderr so stdout stays clean for
    /// command output (the simulator's tables, dry-run manifests).
    pub fn init(&self) -> anyhow::Result<()> {
        let filter = EnvFilter::try_new(&self.level)
            .map_err(|e| anyhow::anyhow!("invalid --log-level {:?}: {e}", self.level))?;
        let registry = tracing_subscriber::registry().with(filter);
        let result = match self.format {
            // Colours only on a terminal: in `kubectl logs`, a file or a collector the escape
            // codes would sit between every field name and its value and defeat grep.
            LogFormat::Text => registry
                .with(
                    fmt::layer()
                        .with_writer(std::io::stderr)
                        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                        .with_target(true),
                )
                .try_init(),
            LogFormat::Json => registry
                .with(
                    fmt::layer()
                        .json()
                        .with_writer(std::io::stderr)
                        .with_current_span(true),
                )
                .try_init(),
        };
        result.map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
    }
}

/// The start of a command: parses the command line, installs the log subscriber its flags ask
/// for (`log` finds them) and turns the flags into settings with `settings`. A failure is said
/// on stderr and becomes `Err` with the usage-error exit code (2).
pub fn parse_settings<A: clap::Parser, S, E: std::fmt::Display>(
    log: impl FnOnce(&A) -> &LogArgs,
    settings: impl FnOnce(A) -> Result<S, E>,
) -> Result<S, std::process::ExitCode> {
    let usage_error = |e: &dyn std::fmt::Display| {
        eprintln!("error: {e:#}");
        std::process::ExitCode::from(2)
    };
    let args = A::parse();
    log(&args).init().map_err(|e| usage_error(&e))?;
    settings(args).map_err(|e| usage_error(&e))
}

/// Resolves when the process receives SIGTERM or SIGINT (Ctrl-C).
///
/// Kubernetes sends SIGTERM on pod deletion and SIGKILL after the grace period, so servers
/// drain when this resolves and must finish well inside the grace period.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install the SIGTERM handler; only Ctrl-C stops this process");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
        r = tokio::signal::ctrl_c() => match r {
            Ok(()) => tracing::info!("SIGINT received, shutting down"),
            Err(e) => tracing::error!(error = %e, "waiting for Ctrl-C failed"),
        },
    }
}

/// Builds the async runtime, drives a daemon's main future to completion and maps the outcome
/// to the process exit code: success on a clean shutdown, failure (logged with the whole cause
/// chain, so the last log line says why the process stopped) on an error or when the runtime
/// cannot start. Every binary ends the same way through this one function.
pub fn run_daemon<F>(mut runtime: tokio::runtime::Builder, main: F) -> std::process::ExitCode
where
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    let rt = match runtime.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = rt.block_on(main);
    // Dropping a runtime waits for every blocking task; one stuck in a hung driver or peer
    // would keep the process alive past its grace period after its work is done.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "exiting");
            std::process::ExitCode::FAILURE
        }
    }
}
