//! `promtool check metrics`: every daemon's `/metrics` exposition is checked with the real
//! Prometheus linter, driven from here only.

/// What `promtool check metrics` said about an exposition.
#[derive(Clone, Debug)]
pub struct PromtoolReport {
    /// Whether promtool exited successfully.
    pub success: bool,
    /// Everything it printed (stdout, then stderr): lint remarks, one per line.
    pub output: String,
}

/// Runs Debian's `promtool check metrics` (at `/usr/bin/promtool`) over a `/metrics` body.
///
/// Every daemon's metrics tests check their exposition with the real Prometheus linter; this is
/// the one place that drives it. Returns `None`, after printing a note, when promtool is not
/// installed (`scripts/test` installs it, so CI always checks); an error when it cannot be run.
pub fn promtool_check_metrics(text: &str) -> std::io::Result<Option<PromtoolReport>> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let promtool = std::path::Path::new("/usr/bin/promtool");
    if !promtool.exists() {
        eprintln!("note: /usr/bin/promtool absent; skipping `promtool check metrics`");
        return Ok(None);
    }
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    Ok(Some(PromtoolReport {
        success: out.status.success(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }))
}
