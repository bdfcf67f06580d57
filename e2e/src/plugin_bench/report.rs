//! The side-by-side's figures, the ratios the regression gate reads, and their table and JSON.

use super::Subject;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;

/// p50, p99 and max of a set of durations, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Samples.
    pub n: usize,
    /// Median (nearest rank).
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Summary {
    /// Summarizes `samples`; all zero when empty.
    pub fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        let at = |p: f64| {
            let Some(last) = samples.len().checked_sub(1) else {
                return 0.0;
            };
            samples[((last as f64 * p).round() as usize).min(last)].as_secs_f64()
        };
        Self {
            n: samples.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: at(1.0),
        }
    }

    fn json(&self) -> Value {
        json!({"n": self.n, "p50_s": self.p50, "p99_s": self.p99, "max_s": self.max})
    }
}

/// One plugin's figures.
#[derive(Debug, Clone)]
pub struct Figures {
    /// Which plugin.
    pub subject: Subject,
    /// The binary run.
    pub binary: PathBuf,
    /// The resource it registered.
    pub resource: String,
    /// Devices it listed.
    pub devices: usize,
    /// From starting the process until the kubelet reports its capacity, in seconds.
    pub first_registration: f64,
    /// Allocate round trips over the plugin's socket.
    pub allocate: Summary,
    /// Kubelet restart request → full capacity again.
    pub reregistration: Summary,
    /// The kubelet restart call alone (same kubelet code for both plugins).
    pub restart_call: Summary,
    /// VmRSS once registered and idle, in bytes.
    pub rss_steady: u64,
    /// VmRSS after the Allocate loop, in bytes.
    pub rss_after_allocate: u64,
    /// VmRSS after the restarts, in bytes.
    pub rss_after_restarts: u64,
    /// VmHWM (peak resident) at the end, in bytes.
    pub rss_peak: u64,
}

impl Figures {
    /// The figures as JSON (seconds, bytes).
    pub fn json(&self) -> Value {
        json!({
            "binary": self.binary.display().to_string(),
            "resource": self.resource,
            "devices": self.devices,
            "first_registration_s": self.first_registration,
            "allocate": self.allocate.json(),
            "reregistration": self.reregistration.json(),
            "restart_call": self.restart_call.json(),
            "rss_steady_bytes": self.rss_steady,
            "rss_after_allocate_bytes": self.rss_after_allocate,
            "rss_after_restarts_bytes": self.rss_after_restarts,
            "rss_peak_bytes": self.rss_peak,
        })
    }
}

/// Both plugins' figures from one run.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// `kudos-device-plugin`.
    pub kudos: Figures,
    /// The upstream sample plugin.
    pub sample: Figures,
}

/// One gated figure: Kudos over the sample plugin.
#[derive(Debug, Clone)]
pub struct Ratio {
    /// What is compared.
    pub figure: &'static str,
    /// Kudos' value (seconds or bytes).
    pub kudos: f64,
    /// The sample plugin's value.
    pub sample: f64,
}

impl Ratio {
    /// Kudos / sample (infinite when the sample's value is 0).
    pub fn ratio(&self) -> f64 {
        if self.sample > 0.0 {
            self.kudos / self.sample
        } else {
            f64::INFINITY
        }
    }
}

impl Comparison {
    /// The figures the regression gate compares: Allocate p50, re-registration p50, RSS when
    /// steady and after the Allocate loop.
    pub fn ratios(&self) -> Vec<Ratio> {
        let (k, s) = (&self.kudos, &self.sample);
        [
            ("Allocate p50", k.allocate.p50, s.allocate.p50),
            (
                "re-registration p50",
                k.reregistration.p50,
                s.reregistration.p50,
            ),
            ("RSS steady", k.rss_steady as f64, s.rss_steady as f64),
            (
                "RSS after Allocate loop",
                k.rss_after_allocate as f64,
                s.rss_after_allocate as f64,
            ),
        ]
        .into_iter()
        .map(|(figure, kudos, sample)| Ratio {
            figure,
            kudos,
            sample,
        })
        .collect()
    }

    /// The gated figures where Kudos is over `factor` times the sample plugin.
    pub fn over(&self, factor: f64) -> Vec<Ratio> {
        self.ratios()
            .into_iter()
            .filter(|r| r.ratio() > factor)
            .collect()
    }

    /// Everything as one JSON object.
    pub fn json(&self) -> Value {
        let ratios: serde_json::Map<String, Value> = self
            .ratios()
            .iter()
            .map(|r| (r.figure.to_string(), json!(r.ratio())))
            .collect();
        json!({
            "kudos": self.kudos.json(),
            "sample": self.sample.json(),
            "ratio_kudos_over_sample": ratios,
        })
    }

    /// A table for people: one row per figure, one column per plugin, and the ratio.
    pub fn table(&self) -> String {
        let (k, s) = (&self.kudos, &self.sample);
        let ratio = |a: f64, b: f64| {
            if b > 0.0 {
                format!("{:.2}", a / b)
            } else {
                "-".into()
            }
        };
        let mut rows: Vec<[String; 4]> = vec![
            [
                "figure".into(),
                k.subject.label().into(),
                s.subject.label().into(),
                "kudos/sample".into(),
            ],
            [
                "resource (devices)".into(),
                format!("{} ({})", k.resource, k.devices),
                format!("{} ({})", s.resource, s.devices),
                String::new(),
            ],
        ];
        // (figure, kudos, sample, unit scale, unit)
        let figures: [(&str, f64, f64, f64, &str); 11] = [
            (
                "first registration",
                k.first_registration,
                s.first_registration,
                1e3,
                "ms",
            ),
            ("Allocate p50", k.allocate.p50, s.allocate.p50, 1e6, "µs"),
            ("Allocate p99", k.allocate.p99, s.allocate.p99, 1e6, "µs"),
            ("Allocate max", k.allocate.max, s.allocate.max, 1e6, "µs"),
            (
                "re-registration p50",
                k.reregistration.p50,
                s.reregistration.p50,
                1e3,
                "ms",
            ),
            (
                "re-registration max",
                k.reregistration.max,
                s.reregistration.max,
                1e3,
                "ms",
            ),
            (
                "  of which restart call p50",
                k.restart_call.p50,
                s.restart_call.p50,
                1e3,
                "ms",
            ),
            (
                "RSS steady",
                k.rss_steady as f64,
                s.rss_steady as f64,
                MIB,
                "MiB",
            ),
            (
                "RSS after Allocate loop",
                k.rss_after_allocate as f64,
                s.rss_after_allocate as f64,
                MIB,
                "MiB",
            ),
            (
                "RSS after restarts",
                k.rss_after_restarts as f64,
                s.rss_after_restarts as f64,
                MIB,
                "MiB",
            ),
            (
                "RSS peak (VmHWM)",
                k.rss_peak as f64,
                s.rss_peak as f64,
                MIB,
                "MiB",
            ),
        ];
        for (name, a, b, scale, unit) in figures {
            let digits = if unit == "µs" { 0 } else { 1 };
            let v = |x: f64| format!("{:.digits$} {unit}", x * scale);
            rows.push([name.into(), v(a), v(b), ratio(a, b)]);
        }
        let mut w = [0usize; 3];
        for r in &rows {
            for (i, c) in r.iter().take(3).enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let pad = |c: &str, n: usize| format!("{c}{}", " ".repeat(n - c.chars().count()));
        rows.iter()
            .map(|r| {
                let line = format!(
                    "{}  {}  {}  {}",
                    pad(&r[0], w[0]),
                    pad(&r[1], w[1]),
                    pad(&r[2], w[2]),
                    r[3]
                );
                format!("{}\n", line.trim_end())
            })
            .collect()
    }
}

/// Bytes → MiB factor for the table.
const MIB: f64 = 1.0 / 1048576.0;

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(subject: Subject, alloc_us: u64, rereg_ms: u64, rss_mib: u64) -> Figures {
        let d =
            |v: Vec<u64>, unit: fn(u64) -> Duration| Summary::of(v.into_iter().map(unit).collect());
        Figures {
            subject,
            binary: PathBuf::from(subject.label()),
            resource: "r".into(),
            devices: 2,
            first_registration: 0.02,
            allocate: d(
                vec![alloc_us, alloc_us / 2, alloc_us * 10],
                Duration::from_micros,
            ),
            reregistration: d(vec![rereg_ms], Duration::from_millis),
            restart_call: d(vec![1], Duration::from_millis),
            rss_steady: rss_mib << 20,
            rss_after_allocate: rss_mib << 20,
            rss_after_restarts: rss_mib << 20,
            rss_peak: rss_mib << 20,
        }
    }

    #[test]
    fn summary_nearest_rank() {
        let s = Summary::of((1..=100).rev().map(Duration::from_millis).collect());
        assert_eq!((s.n, s.p50, s.p99, s.max), (100, 0.051, 0.099, 0.1));
        assert_eq!(Summary::of(Vec::new()).max, 0.0);
    }

    #[test]
    fn gate_reads_ratios_in_one_run() {
        let c = Comparison {
            kudos: figures(Subject::Kudos, 500, 30, 8),
            sample: figures(Subject::Sample, 900, 10_000, 20),
        };
        assert!(c.over(2.0).is_empty());
        let slow = Comparison {
            kudos: figures(Subject::Kudos, 2000, 30, 41),
            ..c.clone()
        };
        let over: Vec<_> = slow.over(2.0).iter().map(|r| r.figure).collect();
        assert_eq!(
            over,
            ["Allocate p50", "RSS steady", "RSS after Allocate loop"]
        );
        let t = c.table();
        assert!(
            t.contains("Allocate p50") && t.contains("500 µs") && t.contains("0.56"),
            "{t}"
        );
        assert_eq!(c.json()["kudos"]["allocate"]["p50_s"], 0.0005);
    }
}
