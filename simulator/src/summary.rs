//! Files for publishing a sweep: a markdown summary (one row per rate: every policy's average
//! JCT with its spread over seeds, Kudos' ratios to kube-default, the greedy oracle and
//! fastest-type with their per-seed spread, and the headline targets checked at every rate) and
//! a CSV with one row per (rate, policy, seed).

use crate::output::Cell;
use std::fmt::Write as _;

/// The headline targets the summary checks at every rate.
pub mod target {
    /// kube-default's average JCT at least this many times its value at the lowest rate marks
    /// the knee and the loads beyond it.
    pub const KNEE_FACTOR: f64 = 2.0;
    /// kudos / kube-default at most this where kube-default's JCT has doubled.
    pub const VS_KUBE: f64 = 0.5;
    /// kudos / greedy oracle at most this where kube-default's JCT has doubled.
    pub const VS_ORACLE: f64 = 1.10;
    /// kudos / fastest-type at most this at every load.
    pub const VS_FASTEST: f64 = 1.0;
}

/// The mean, lowest and highest of some per-seed values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// What the headline uses (a mean, or a ratio of means).
    pub value: f64,
    /// Lowest per-seed value.
    pub min: f64,
    /// Highest per-seed value.
    pub max: f64,
}

impl Spread {
    fn text(self, digits: usize) -> String {
        format!(
            "{:.d$} ({:.d$}–{:.d$})",
            self.value,
            self.min,
            self.max,
            d = digits
        )
    }
}

fn min_max(v: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = v.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), x| {
        (l.min(x), h.max(x))
    });
    lo.is_finite().then_some((lo, hi))
}

fn cell<'a>(cells: &'a [Cell], rate: f64, policy: &str) -> Option<&'a Cell> {
    cells
        .iter()
        .find(|c| c.rate_per_hour == Some(rate) && c.policy == policy)
}

/// Average JCT of `policy` at `rate`: the mean over seeds and the per-seed range.
pub fn jct(cells: &[Cell], rate: f64, policy: &str) -> Option<Spread> {
    let c = cell(cells, rate, policy)?;
    let (min, max) = min_max(c.per_seed.iter().map(|m| m.avg_jct_h))?;
    Some(Spread {
        value: c.mean.avg_jct_h,
        min,
        max,
    })
}

/// `num / den` at `rate`: the ratio of the means over seeds, and the range of the per-seed
/// ratios (each seed is the same job stream under both policies).
pub fn ratio(cells: &[Cell], rate: f64, num: &str, den: &str) -> Option<Spread> {
    let (a, b) = (cell(cells, rate, num)?, cell(cells, rate, den)?);
    let per_seed = a
        .per_seed
        .iter()
        .zip(&b.per_seed)
        .map(|(x, y)| x.avg_jct_h / y.avg_jct_h.max(1e-9));
    let (min, max) = min_max(per_seed)?;
    Some(Spread {
        value: a.mean.avg_jct_h / b.mean.avg_jct_h.max(1e-9),
        min,
        max,
    })
}

/// At how many of the seeds `num` was slower than `den` at `rate`, and of how many.
pub fn seeds_above(cells: &[Cell], rate: f64, num: &str, den: &str) -> Option<(usize, usize)> {
    let (a, b) = (cell(cells, rate, num)?, cell(cells, rate, den)?);
    let n = a.per_seed.len().min(b.per_seed.len());
    let k = a
        .per_seed
        .iter()
        .zip(&b.per_seed)
        .filter(|(x, y)| x.avg_jct_h > y.avg_jct_h)
        .count();
    Some((k, n))
}

/// Kudos' MAPE after 5 runs of the (class, GPU type) pair at `rate`, over seeds.
pub fn mape5(cells: &[Cell], rate: f64) -> Option<Spread> {
    let c = cell(cells, rate, "kudos")?;
    let (min, max) = min_max(c.per_seed.iter().filter_map(|m| m.mape_after5))?;
    Some(Spread {
        value: c.mean.mape_after5?,
        min,
        max,
    })
}

fn rates(cells: &[Cell]) -> Vec<f64> {
    let mut v: Vec<f64> = cells.iter().filter_map(|c| c.rate_per_hour).collect();
    v.sort_by(f64::total_cmp);
    v.dedup();
    v
}

/// Which targets `rate` misses (empty: none, or nothing to compare).
pub fn misses(cells: &[Cell], rate: f64) -> Vec<String> {
    let mut out = Vec::new();
    let lowest = rates(cells).first().copied();
    let base = lowest.and_then(|r| jct(cells, r, "kube-default"));
    let here = jct(cells, rate, "kube-default");
    let doubled =
        matches!((base, here), (Some(b), Some(h)) if h.value >= target::KNEE_FACTOR * b.value);
    if doubled {
        if let Some(r) = ratio(cells, rate, "kudos", "kube-default")
            && r.value > target::VS_KUBE
        {
            out.push(format!("/kube {:.3} > {}", r.value, target::VS_KUBE));
        }
        if let Some(r) = ratio(cells, rate, "kudos", "greedy-oracle")
            && r.value > target::VS_ORACLE
        {
            out.push(format!("/oracle {:.3} > {:.2}", r.value, target::VS_ORACLE));
        }
    }
    if let Some(r) = ratio(cells, rate, "kudos", "fastest-type")
        && r.value > target::VS_FASTEST
    {
        out.push(format!("/fastest {:.3} > 1", r.value));
    }
    out
}

/// The markdown summary. `header` is printed above the table (settings, command).
pub fn markdown(cells: &[Cell], header: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{header}\n");
    let names: Vec<&str> = {
        let mut v: Vec<&str> = Vec::new();
        for c in cells {
            if !v.contains(&c.policy.as_str()) {
                v.push(&c.policy);
            }
        }
        v
    };
    let seeds = cells.first().map_or(0, |c| c.seeds.len());
    let _ = writeln!(
        out,
        "Average JCT in hours: mean over {seeds} seeds (lowest–highest seed). Ratios: ratio of the \
         means (lowest–highest per-seed ratio, same jobs under both policies). kube ×2: \
         kube-default's JCT is at least {}× its value at the lowest rate. Targets: kudos/kube ≤ \
         {} and kudos/g-oracle ≤ {:.2} where kube ×2; kudos/fastest ≤ 1 at every rate (ratio of the \
         means; the seeds where Kudos was slower are counted). g-oracle/kube: what the greedy \
         oracle reaches, for scale.\n",
        target::KNEE_FACTOR,
        target::VS_KUBE,
        target::VS_ORACLE
    );
    let mut head = vec!["rate (jobs/h)".to_owned()];
    head.extend(names.iter().map(|n| (*n).to_owned()));
    head.extend(
        [
            "kube ×2",
            "kudos/kube",
            "kudos/g-oracle",
            "g-oracle/kube",
            "kudos/fastest",
            "kudos MAPE@5",
            "misses",
        ]
        .map(str::to_owned),
    );
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
    let lowest = rates(cells).first().copied();
    for rate in rates(cells) {
        let opt = |s: Option<Spread>, d: usize| s.map_or_else(|| "-".to_owned(), |s| s.text(d));
        let mut row = vec![format!("{rate}")];
        row.extend(names.iter().map(|n| opt(jct(cells, rate, n), 1)));
        let doubled = match (
            lowest.and_then(|r| jct(cells, r, "kube-default")),
            jct(cells, rate, "kube-default"),
        ) {
            (Some(b), Some(h)) => format!("{:.1}×", h.value / b.value),
            _ => "-".into(),
        };
        row.push(doubled);
        row.push(opt(ratio(cells, rate, "kudos", "kube-default"), 2));
        row.push(opt(ratio(cells, rate, "kudos", "greedy-oracle"), 2));
        row.push(opt(ratio(cells, rate, "greedy-oracle", "kube-default"), 2));
        row.push(opt(ratio(cells, rate, "kudos", "fastest-type"), 2));
        if let Some((k, n)) = seeds_above(cells, rate, "kudos", "fastest-type")
            && k > 0
            && let Some(last) = row.last_mut()
        {
            last.push_str(&format!(", slower at {k}/{n} seeds"));
        }
        row.push(mape5(cells, rate).map_or_else(
            || "-".into(),
            |m| {
                format!(
                    "{:.0}% ({:.0}–{:.0}%)",
                    100.0 * m.value,
                    100.0 * m.min,
                    100.0 * m.max
                )
            },
        ));
        let m = misses(cells, rate);
        row.push(if m.is_empty() {
            "none".into()
        } else {
            m.join("; ")
        });
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out
}

/// One CSV row per (rate, policy, seed).
pub fn seeds_csv(cells: &[Cell], info: &str) -> String {
    let mut out = String::from(
        "info,rate_per_hour,policy,seed,avg_jct_h,p50_jct_h,p95_jct_h,avg_queue_h,utilization,fastest_share,mape,mape_after5\n",
    );
    let opt = |v: Option<f64>| v.map_or_else(String::new, |x| format!("{x:.4}"));
    for c in cells {
        for (seed, m) in c.seeds.iter().zip(&c.per_seed) {
            let _ = writeln!(
                out,
                "{info},{},{},{seed},{:.3},{:.3},{:.3},{:.3},{:.4},{:.4},{},{}",
                c.rate_per_hour.map_or_else(String::new, |r| r.to_string()),
                c.policy,
                m.avg_jct_h,
                m.p50_jct_h,
                m.p95_jct_h,
                m.avg_queue_h,
                m.utilization,
                m.fastest_share,
                opt(m.mape),
                opt(m.mape_after5),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn c(rate: f64, policy: &str, jcts: &[f64]) -> Cell {
        let per_seed: Vec<Metrics> = jcts
            .iter()
            .map(|j| Metrics {
                avg_jct_h: *j,
                mape_after5: (policy == "kudos").then_some(0.5),
                ..Metrics::default()
            })
            .collect();
        Cell {
            rate_per_hour: Some(rate),
            policy: policy.into(),
            seeds: (0..jcts.len() as u64).collect(),
            mean: crate::metrics::mean_of(&per_seed),
            per_seed,
        }
    }

    #[test]
    fn ratios_spreads_and_misses() {
        let cells = vec![
            c(1.0, "kube-default", &[10.0, 10.0]),
            c(1.0, "fastest-type", &[5.0, 5.0]),
            c(1.0, "kudos", &[6.0, 4.0]),
            c(1.0, "greedy-oracle", &[4.0, 4.0]),
            c(2.0, "kube-default", &[20.0, 40.0]),
            c(2.0, "fastest-type", &[12.0, 12.0]),
            c(2.0, "kudos", &[10.0, 10.0]),
            c(2.0, "greedy-oracle", &[8.0, 10.0]),
        ];
        let r = ratio(&cells, 2.0, "kudos", "kube-default").unwrap();
        assert_eq!((r.value, r.min, r.max), (10.0 / 30.0, 0.25, 0.5));
        let j = jct(&cells, 1.0, "kudos").unwrap();
        assert_eq!((j.value, j.min, j.max), (5.0, 4.0, 6.0));
        // Below the knee only fastest-type counts: 5/5 = 1 is not a miss.
        assert!(misses(&cells, 1.0).is_empty());
        // At 2 jobs/h kube-default tripled: kudos/oracle = 10/9 > 1.10 misses.
        assert_eq!(misses(&cells, 2.0), vec!["/oracle 1.111 > 1.10".to_owned()]);
        let md = markdown(&cells, "# test");
        assert!(md.contains("| 2 |"), "{md}");
        assert!(md.contains("3.0×"), "{md}");
        // Seed 0 at 1 job/h: kudos 6 h against fastest-type's 5 h.
        assert_eq!(
            seeds_above(&cells, 1.0, "kudos", "fastest-type"),
            Some((1, 2))
        );
        assert!(md.contains("slower at 1/2 seeds"), "{md}");
        let csv = seeds_csv(&cells, "declared");
        assert_eq!(csv.lines().count(), 1 + 16);
    }
}
