//! The metrics exposition every daemon's `/metrics` serves: OpenMetrics text (what
//! prometheus-client writes, and what Prometheus asks for) or, for scrapers and tools that do not
//! speak OpenMetrics (`curl`, `promtool check metrics`), the Prometheus text format 0.0.4 derived
//! from it. One conversion, so the daemons cannot drift apart in what they serve.

/// Content type of the OpenMetrics text exposition.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Content type of the Prometheus text format 0.0.4.
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The body a scraper asked for with its `Accept` header, and its content type: `openmetrics`
/// as is when the header names OpenMetrics, else converted by [`prometheus_text`].
pub fn negotiate(accept: Option<&str>, openmetrics: String) -> (&'static str, String) {
    if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
        (OPENMETRICS_CONTENT_TYPE, openmetrics)
    } else {
        (PROMETHEUS_TEXT_CONTENT_TYPE, prometheus_text(&openmetrics))
    }
}

/// The Prometheus text format 0.0.4 of an OpenMetrics exposition: the same samples, with
/// counter metadata named after the `_total` samples (as 0.0.4 parsers expect) and without the
/// OpenMetrics-only `# UNIT` and `# EOF` lines.
pub fn prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 256);
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "].into_iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        match meta {
            Some(m) => out.push_str(m.trim_end()),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OM: &str = "# HELP jobs Jobs seen.\n# TYPE jobs counter\njobs_total 3\n\
                      # HELP depth Queue depth.\n# TYPE depth gauge\n# UNIT depth reports\n\
                      depth 1\n# EOF\n";

    #[test]
    fn counters_take_their_total_names_and_openmetrics_lines_go() {
        assert_eq!(
            prometheus_text(OM),
            "# HELP jobs_total Jobs seen.\n# TYPE jobs_total counter\njobs_total 3\n\
             # HELP depth Queue depth.\n# TYPE depth gauge\ndepth 1\n"
        );
    }

    #[test]
    fn openmetrics_only_when_asked_for() {
        let om = "application/openmetrics-text;version=1.0.0,text/plain;q=0.5";
        assert_eq!(
            negotiate(Some(om), OM.into()),
            (OPENMETRICS_CONTENT_TYPE, OM.into())
        );
        for accept in [None, Some("text/plain")] {
            let (ct, body) = negotiate(accept, OM.into());
            assert_eq!(ct, PROMETHEUS_TEXT_CONTENT_TYPE);
            assert!(!body.contains("# EOF"), "{body}");
        }
    }
}
