//! Mid-run events: what changes in the cluster while jobs run, to test learning under change.
//!
//! - `slow:NODE@HOURS:FACTOR`: from `HOURS` on, runs that start on node `NODE` take `FACTOR`
//!   times longer (thermal throttling, a failing card). Runs already going keep their speed.
//! - `join:TYPE=NxG@HOURS`: `N` new nodes of `G` GPUs of table type `TYPE` join at `HOURS`
//!   (named `TYPE-join-000`, ...). Before that they do not exist for any policy.
//! - `class:FAMILY@HOURS:FACTOR`: from `HOURS` on, runs of model family `FAMILY` that start take
//!   `FACTOR` times longer on every GPU type (a new framework version, a changed input pipeline).
//!
//! Times are simulated hours from the first arrival (time 0). The oracle knows node speeds.

use crate::cluster::Cluster;
use crate::throughput::ThroughputTable;

/// An event as given on the command line.
#[derive(Clone, Debug, PartialEq)]
pub enum EventSpec {
    /// A node slows down.
    Slow {
        /// Node name.
        node: String,
        /// Hours.
        at_h: f64,
        /// Run-time multiplier (3 = three times slower).
        factor: f64,
    },
    /// Nodes of a GPU type join.
    Join {
        /// Table GPU type.
        gpu_type: String,
        /// Nodes.
        nodes: u32,
        /// GPUs per node.
        gpus: u32,
        /// Hours.
        at_h: f64,
    },
    /// A model family's runs change speed.
    Class {
        /// Model family.
        family: String,
        /// Hours.
        at_h: f64,
        /// Run-time multiplier.
        factor: f64,
    },
}

fn positive(what: &str, s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{what} must be a positive number, found {s:?}")),
    }
}

fn hours(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("the time must be hours >= 0, found {s:?}")),
    }
}

impl std::str::FromStr for EventSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let usage =
            "expected slow:NODE@HOURS:FACTOR, join:TYPE=NxG@HOURS or class:FAMILY@HOURS:FACTOR";
        let (kind, rest) = s
            .split_once(':')
            .ok_or_else(|| format!("{usage}; found {s:?}"))?;
        let (what, when) = rest
            .rsplit_once('@')
            .ok_or_else(|| format!("{usage}; found {s:?}"))?;
        match kind.trim() {
            "slow" | "class" => {
                let (at, factor) = when
                    .split_once(':')
                    .ok_or_else(|| format!("{usage}; found {s:?}"))?;
                let (at_h, factor) = (hours(at)?, positive("the factor", factor)?);
                let name = what.trim().to_owned();
                if name.is_empty() {
                    return Err(format!("{usage}; found {s:?}"));
                }
                Ok(if kind.trim() == "slow" {
                    EventSpec::Slow {
                        node: name,
                        at_h,
                        factor,
                    }
                } else {
                    EventSpec::Class {
                        family: name,
                        at_h,
                        factor,
                    }
                })
            }
            "join" => {
                let (ty, shape) = what
                    .split_once('=')
                    .ok_or_else(|| format!("{usage}; found {s:?}"))?;
                let (n, g) = shape
                    .split_once(['x', 'X'])
                    .ok_or_else(|| format!("{usage}; found {s:?}"))?;
                let count = |v: &str| match v.trim().parse::<u32>() {
                    Ok(c) if c > 0 => Ok(c),
                    _ => Err(format!("node and GPU counts must be positive in {s:?}")),
                };
                Ok(EventSpec::Join {
                    gpu_type: ty.trim().to_owned(),
                    nodes: count(n)?,
                    gpus: count(g)?,
                    at_h: hours(when)?,
                })
            }
            other => Err(format!("unknown event kind {other:?}; {usage}")),
        }
    }
}

/// What an event does, resolved against the cluster and the table.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Node index and run-time multiplier.
    Slow(usize, f64),
    /// Node indices that come online.
    Join(Vec<usize>),
    /// Job-type indices and run-time multiplier.
    Class(Vec<usize>, f64),
}

/// A resolved event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Simulated seconds.
    pub at: f64,
    /// What happens.
    pub action: Action,
}

/// Resolves events against the table and adds joining nodes to `cluster` (offline until their
/// time). Returns them sorted by time.
pub fn resolve(
    specs: &[EventSpec],
    cluster: &mut Cluster,
    table: &ThroughputTable,
) -> Result<Vec<Event>, String> {
    let mut out = Vec::new();
    // Joins first, so `slow` may name a joining node.
    for spec in specs {
        if let EventSpec::Join {
            gpu_type,
            nodes,
            gpus,
            at_h,
        } = spec
        {
            let t = table.gpu_index(gpu_type).ok_or_else(|| {
                format!(
                    "--event join: GPU type {gpu_type:?} is not in the table ({:?})",
                    table.gpu_types
                )
            })?;
            let name = table.gpu_types[t].clone();
            let added = cluster.add_offline(t, &name, *nodes, *gpus);
            out.push(Event {
                at: at_h * 3600.0,
                action: Action::Join(added),
            });
        }
    }
    for spec in specs {
        match spec {
            EventSpec::Slow { node, at_h, factor } => {
                let i = cluster
                    .nodes
                    .iter()
                    .position(|n| n.name == *node)
                    .ok_or_else(|| format!("--event slow: no node named {node:?}"))?;
                out.push(Event {
                    at: at_h * 3600.0,
                    action: Action::Slow(i, *factor),
                });
            }
            EventSpec::Class {
                family,
                at_h,
                factor,
            } => {
                let types: Vec<usize> = (0..table.job_types.len())
                    .filter(|&j| table.job_types[j].family == *family)
                    .collect();
                if types.is_empty() {
                    return Err(format!(
                        "--event class: no model family {family:?} in the table"
                    ));
                }
                out.push(Event {
                    at: at_h * 3600.0,
                    action: Action::Class(types, *factor),
                });
            }
            EventSpec::Join { .. } => {}
        }
    }
    out.sort_by(|a, b| a.at.total_cmp(&b.at));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_and_reject_nonsense() {
        assert_eq!(
            "slow:v100-000@10:3".parse(),
            Ok(EventSpec::Slow {
                node: "v100-000".into(),
                at_h: 10.0,
                factor: 3.0
            })
        );
        assert_eq!(
            "join:v100=4x2@5.5".parse(),
            Ok(EventSpec::Join {
                gpu_type: "v100".into(),
                nodes: 4,
                gpus: 2,
                at_h: 5.5
            })
        );
        assert_eq!(
            "class:ResNet-50@1:0.5".parse(),
            Ok(EventSpec::Class {
                family: "ResNet-50".into(),
                at_h: 1.0,
                factor: 0.5
            })
        );
        for bad in [
            "slow:n@1",
            "slow:n@x:3",
            "slow:n@1:-2",
            "join:v100=0x1@1",
            "melt:n@1:2",
            "x",
        ] {
            assert!(bad.parse::<EventSpec>().is_err(), "{bad}");
        }
    }
}
