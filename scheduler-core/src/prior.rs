//! The device-capability prior of the first model (§2.2 step 2, last fallback).
//!
//! When nothing at all has been observed for a device profile, the predicted time is scaled by a
//! relative speed looked up from the device model name. The table is small and derived from public
//! specifications only: the geometric mean of peak FP32 (non-tensor) throughput and memory
//! bandwidth, normalised to the V100 (SXM2: 15.7 TFLOPS, 900 GB/s) = 1.0. Training throughput is
//! bounded by compute for some models and by memory for others, so neither number alone is a fair
//! prior; the geometric mean is a deliberately rough middle. It is a *prior*: data replaces it
//! quickly, and the configuration can override or extend it.
//!
//! Model names are free-form (`Tesla V100-SXM2-16GB`, `NVIDIA A100-SXM4-80GB`, `k80`, `V100M32`).
//! A table key matches when it occurs in the lower-cased, alphanumeric-only model name; the longest
//! matching key wins (so `A100` is not read as `A10`). Unknown models get the neutral speed 1.0 and
//! a wider uncertainty. Nothing else in the crate treats any model specially.
//!
//! The prior's uncertainty says honestly how wrong it can be: a factor [`PRIOR_RANGE`] (20) for
//! some workloads. It therefore ranks devices before any data, but it never decides on its own
//! which devices a class is tried on: see the exploration guarantee in [`crate::predict`].

use std::collections::BTreeMap;

/// Built-in relative speeds (V100 = 1.0): `(key, fp32 TFLOPS, memory GB/s)` from vendor data sheets.
const SPECS: &[(&str, f64, f64)] = &[
    ("k80", 4.37, 240.0), // per GPU (a K80 board holds two)
    ("m60", 4.8, 160.0),
    ("p4", 5.5, 192.0),
    ("p40", 11.8, 346.0),
    ("p100", 10.6, 732.0),
    ("v100", 15.7, 900.0),
    ("t4", 8.1, 320.0),
    ("a10", 31.2, 600.0),
    ("a30", 10.3, 933.0),
    ("a40", 37.4, 696.0),
    ("a100", 19.5, 2039.0),
    ("l4", 30.3, 300.0),
    ("l40", 90.5, 864.0),
    ("l40s", 91.6, 864.0),
    ("h100", 67.0, 3350.0),
    ("h200", 67.0, 4800.0),
    ("mi100", 23.1, 1229.0),
    ("mi250", 47.9, 3277.0),
    ("mi300", 163.4, 5300.0),
];

const V100_TFLOPS: f64 = 15.7;
const V100_GBPS: f64 = 900.0;

/// How far off a spec-sheet speed can be for some workload: a factor 20 either way (Gavel's
/// V100/K80 speed-ups alone run from 0.66x to 11.6x, against 2.1x from the specifications).
pub const PRIOR_RANGE: f64 = 20.0;
/// Log-space standard deviation of a prior from the table: `PRIOR_RANGE` is its 95% bound.
pub const KNOWN_PRIOR_LOG_SD: f64 = 1.53; // ln(20) / 1.96
/// Log-space standard deviation of the neutral prior for an unknown model.
pub const UNKNOWN_PRIOR_LOG_SD: f64 = 2.0;

/// A relative speed and whether it came from a table (built-in or configured) or is neutral.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Capability {
    /// Relative speed, V100 = 1.0.
    pub speed: f64,
    /// `false` for the neutral default of an unknown model.
    pub known: bool,
}

impl Capability {
    /// Log-space standard deviation of this prior.
    pub fn log_sd(&self) -> f64 {
        if self.known {
            KNOWN_PRIOR_LOG_SD
        } else {
            UNKNOWN_PRIOR_LOG_SD
        }
    }
}

fn normalise(s: &str) -> String {
    s.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// The built-in table as `(key, relative speed)`, for documentation and `/explain`.
pub fn builtin_table() -> Vec<(&'static str, f64)> {
    SPECS
        .iter()
        .map(|&(k, tf, bw)| (k, ((tf / V100_TFLOPS) * (bw / V100_GBPS)).sqrt()))
        .collect()
}

/// Relative speed of a device model: configured overrides first, then the built-in table, longest
/// matching key first; unknown models are neutral.
pub fn capability(model: &str, overrides: &BTreeMap<String, f64>) -> Capability {
    let name = normalise(model);
    let mut best: Option<(usize, f64)> = None;
    for (key, speed) in overrides {
        let k = normalise(key);
        if !k.is_empty() && name.contains(&k) && best.is_none_or(|(len, _)| k.len() > len) {
            best = Some((k.len(), *speed));
        }
    }
    if let Some((_, speed)) = best {
        return Capability { speed, known: true };
    }
    for (key, speed) in builtin_table() {
        if name.contains(key) && best.is_none_or(|(len, _)| key.len() > len) {
            best = Some((key.len(), speed));
        }
    }
    match best {
        Some((_, speed)) => Capability { speed, known: true },
        None => Capability {
            speed: 1.0,
            known: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_key_wins_and_names_are_free_form() {
        let none = BTreeMap::new();
        let a100 = capability("NVIDIA A100-SXM4-80GB", &none);
        let a10 = capability("NVIDIA A10", &none);
        assert!(a100.known && a10.known);
        assert_ne!(a100.speed, a10.speed);
        assert!((capability("Tesla V100-SXM2-16GB", &none).speed - 1.0).abs() < 1e-12);
        assert!(capability("k80_unconsolidated", &none).speed < 0.5);
        assert!(capability("H200", &none).speed > capability("H100", &none).speed);
    }

    #[test]
    fn unknown_is_neutral_and_overrides_win() {
        let mut o = BTreeMap::new();
        let g1 = capability("G1", &o);
        assert_eq!(
            g1,
            Capability {
                speed: 1.0,
                known: false
            }
        );
        o.insert("G1".to_owned(), 2.5);
        o.insert("v100".to_owned(), 0.9);
        assert_eq!(capability("g1", &o).speed, 2.5);
        assert_eq!(capability("Tesla V100", &o).speed, 0.9);
    }
}
