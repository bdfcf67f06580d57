//! Cluster shapes and the free-GPU bookkeeping the event loop and the policies share.
//!
//! A shape names GPU types from the throughput table, never built-in models, so any table
//! works: `per-type:9x4` (9 nodes of 4 GPUs for every GPU type in the table),
//! `v100=36x1,k80=9x4` (explicit), or `alibaba[:FILE]` (the Alibaba 2023 node list with its
//! models mapped onto table types by `--gpu-map`).

use crate::data::AlibabaNode;
use crate::throughput::ThroughputTable;
use std::collections::BTreeMap;

/// One simulated node.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Node name.
    pub name: String,
    /// Index of its GPU type in the throughput table.
    pub gpu_type: usize,
    /// GPUs on the node.
    pub total: u32,
    /// GPUs not allocated (0 while the node has not joined).
    pub free: u32,
    /// Speed multiplier of the node's GPUs for runs that start now (1 = as measured; a
    /// `slow` event sets 1/3 for a 3x slowdown). Hidden from every policy but the oracle.
    pub speed: f64,
    /// The node is part of the cluster (a `join` event brings a node online later).
    pub online: bool,
}

impl Node {
    /// An online node with every GPU free, at measured speed.
    pub fn new(name: String, gpu_type: usize, total: u32) -> Self {
        Node {
            name,
            gpu_type,
            total,
            free: total,
            speed: 1.0,
            online: true,
        }
    }
}

/// The nodes and their allocation state.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    /// All nodes.
    pub nodes: Vec<Node>,
    /// Largest node: a job needing more GPUs than this runs as a gang over several nodes.
    pub max_node_gpus: u32,
    free_by_type: Vec<u32>,
    total_by_type: Vec<u32>,
}

/// A cluster shape as given on the command line.
#[derive(Clone, Debug, PartialEq)]
pub enum ClusterShape {
    /// `count` nodes of `gpus` GPUs for every GPU type in the table.
    PerType {
        /// Nodes per type.
        count: u32,
        /// GPUs per node.
        gpus: u32,
    },
    /// Explicit `(type name, nodes, GPUs per node)` groups.
    Explicit(Vec<(String, u32, u32)>),
    /// The Alibaba 2023 node list; `None` = the file under `--data-dir`.
    Alibaba(Option<std::path::PathBuf>),
}

impl std::str::FromStr for ClusterShape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        fn nxg(s: &str) -> Result<(u32, u32), String> {
            let (n, g) = s
                .split_once(['x', 'X'])
                .ok_or_else(|| format!("expected NODESxGPUS such as 9x4, found {s:?}"))?;
            let n: u32 = n
                .trim()
                .parse()
                .map_err(|_| format!("bad node count in {s:?}"))?;
            let g: u32 = g
                .trim()
                .parse()
                .map_err(|_| format!("bad GPU count in {s:?}"))?;
            if n == 0 || g == 0 {
                return Err(format!("node and GPU counts must be positive in {s:?}"));
            }
            Ok((n, g))
        }
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("per-type:") {
            let (count, gpus) = nxg(rest)?;
            return Ok(ClusterShape::PerType { count, gpus });
        }
        if s == "alibaba" {
            return Ok(ClusterShape::Alibaba(None));
        }
        if let Some(path) = s.strip_prefix("alibaba:") {
            return Ok(ClusterShape::Alibaba(Some(path.into())));
        }
        let mut groups = Vec::new();
        for part in s.split(',') {
            let (name, spec) = part.split_once('=').ok_or_else(|| {
                format!("expected per-type:NxG, alibaba[:FILE] or TYPE=NxG,...; found {part:?}")
            })?;
            let (n, g) = nxg(spec)?;
            groups.push((name.trim().to_owned(), n, g));
        }
        Ok(ClusterShape::Explicit(groups))
    }
}

/// A `MODEL=TYPE,...` mapping from Alibaba GPU models to throughput-table GPU types.
///
/// Default: `P100=p100,V100M16=v100,V100M32=v100,T4=p100,A10=v100`. The table has no T4 or A10;
/// the T4's FP32 training speed (8.1 TFLOPS, 320 GB/s) is nearest the P100's (9.3 TFLOPS) and
/// the A10's (31 TFLOPS FP32, 600 GB/s) nearest the V100's. G1/G2/G3 are undisclosed models:
/// guessing their speed would invent data, so they are left out unless mapped explicitly.
pub const DEFAULT_GPU_MAP: &str = "P100=p100,V100M16=v100,V100M32=v100,T4=p100,A10=v100";

/// Parses a `MODEL=TYPE,...` mapping.
pub fn parse_gpu_map(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut m = BTreeMap::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("expected MODEL=TYPE, found {part:?}"))?;
        m.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(m)
}

impl Cluster {
    /// Builds a cluster from nodes.
    pub fn new(nodes: Vec<Node>, gpu_types: usize) -> Self {
        let mut c = Cluster {
            max_node_gpus: nodes.iter().map(|n| n.total).max().unwrap_or(0),
            nodes,
            free_by_type: vec![0; gpu_types],
            total_by_type: vec![0; gpu_types],
        };
        for n in &c.nodes {
            c.free_by_type[n.gpu_type] += n.free;
            c.total_by_type[n.gpu_type] += n.total;
        }
        c
    }

    /// Builds a per-type or explicit shape.
    pub fn from_shape(shape: &ClusterShape, table: &ThroughputTable) -> Result<Self, String> {
        let groups: Vec<(usize, u32, u32)> = match shape {
            ClusterShape::PerType { count, gpus } => (0..table.gpu_types.len())
                .map(|g| (g, *count, *gpus))
                .collect(),
            ClusterShape::Explicit(groups) => groups
                .iter()
                .map(|(name, n, g)| {
                    table.gpu_index(name).map(|t| (t, *n, *g)).ok_or_else(|| {
                        format!(
                            "GPU type {name:?} is not in the throughput table (it has {:?})",
                            table.gpu_types
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
            ClusterShape::Alibaba(_) => {
                return Err(
                    "the Alibaba shape needs its node list: use Cluster::from_alibaba".into(),
                );
            }
        };
        let mut nodes = Vec::new();
        for (t, n, g) in groups {
            for i in 0..n {
                nodes.push(Node::new(format!("{}-{i:03}", table.gpu_types[t]), t, g));
            }
        }
        Ok(Cluster::new(nodes, table.gpu_types.len()))
    }

    /// Builds the Alibaba cluster; returns it and the per-model count of nodes left out
    /// because their model is not mapped.
    pub fn from_alibaba(
        list: &[AlibabaNode],
        map: &BTreeMap<String, String>,
        table: &ThroughputTable,
    ) -> Result<(Self, BTreeMap<String, usize>), String> {
        let mut skipped = BTreeMap::new();
        let mut nodes = Vec::new();
        for n in list {
            let Some(target) = map.get(&n.model) else {
                *skipped.entry(n.model.clone()).or_insert(0) += 1;
                continue;
            };
            let t = table.gpu_index(target).ok_or_else(|| {
                format!(
                    "--gpu-map maps {} to {target:?}, which is not in the throughput table (it has {:?})",
                    n.model, table.gpu_types
                )
            })?;
            nodes.push(Node::new(n.name.clone(), t, n.gpus));
        }
        if nodes.is_empty() {
            return Err(
                "no node of the Alibaba list has a mapped GPU model (see --gpu-map)".into(),
            );
        }
        Ok((Cluster::new(nodes, table.gpu_types.len()), skipped))
    }

    /// All GPUs.
    pub fn total_gpus(&self) -> u32 {
        self.total_by_type.iter().sum()
    }

    /// Free GPUs.
    pub fn free_gpus(&self) -> u32 {
        self.free_by_type.iter().sum()
    }

    /// Free GPUs of one type.
    pub fn free_of_type(&self, gpu_type: usize) -> u32 {
        self.free_by_type[gpu_type]
    }

    /// GPUs of one type.
    pub fn total_of_type(&self, gpu_type: usize) -> u32 {
        self.total_by_type[gpu_type]
    }

    /// Takes `gpus` from node `i`. Panics if it has fewer free: placements are validated first.
    pub fn allocate(&mut self, i: usize, gpus: u32) {
        let n = &mut self.nodes[i];
        assert!(
            n.free >= gpus,
            "node {} has {} free GPUs, {} asked",
            n.name,
            n.free,
            gpus
        );
        n.free -= gpus;
        self.free_by_type[n.gpu_type] -= gpus;
    }

    /// Adds `count` offline nodes of `gpus` GPUs of `gpu_type`, named `<type>-join-<k>`, that
    /// come online with [`Cluster::bring_online`]. Returns their indices.
    pub fn add_offline(
        &mut self,
        gpu_type: usize,
        name: &str,
        count: u32,
        gpus: u32,
    ) -> Vec<usize> {
        let mut added = Vec::new();
        for k in 0..count {
            let mut n = Node::new(format!("{name}-join-{k:03}"), gpu_type, gpus);
            n.free = 0;
            n.online = false;
            self.total_by_type[gpu_type] += gpus;
            self.max_node_gpus = self.max_node_gpus.max(gpus);
            self.nodes.push(n);
            added.push(self.nodes.len() - 1);
        }
        added
    }

    /// Brings an offline node online with all its GPUs free.
    pub fn bring_online(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        if n.online {
            return;
        }
        n.online = true;
        n.free = n.total;
        self.free_by_type[n.gpu_type] += n.total;
    }

    /// Returns `gpus` to node `i`.
    pub fn release(&mut self, i: usize, gpus: u32) {
        let n = &mut self.nodes[i];
        assert!(
            n.free + gpus <= n.total,
            "node {} would have more free GPUs than it has",
            n.name
        );
        n.free += gpus;
        self.free_by_type[n.gpu_type] += gpus;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse() {
        assert_eq!(
            "per-type:9x4".parse(),
            Ok(ClusterShape::PerType { count: 9, gpus: 4 })
        );
        assert_eq!(
            "v100=2x8, k80=3x1".parse(),
            Ok(ClusterShape::Explicit(vec![
                ("v100".into(), 2, 8),
                ("k80".into(), 3, 1)
            ]))
        );
        assert_eq!("alibaba".parse(), Ok(ClusterShape::Alibaba(None)));
        assert!("per-type:9".parse::<ClusterShape>().is_err());
        assert!("v100=0x4".parse::<ClusterShape>().is_err());
    }

    #[test]
    fn per_type_uses_table_types_and_counts_free() {
        let t = ThroughputTable::parse("a,b,c,d,x_steps_per_s,y_steps_per_s\nA,f,1,1,1,2\n", "t")
            .unwrap();
        let mut c = Cluster::from_shape(&ClusterShape::PerType { count: 3, gpus: 4 }, &t).unwrap();
        assert_eq!(c.total_gpus(), 24);
        assert_eq!(c.max_node_gpus, 4);
        c.allocate(0, 3);
        assert_eq!(
            (c.free_of_type(0), c.free_of_type(1), c.free_gpus()),
            (9, 12, 21)
        );
        c.release(0, 3);
        assert_eq!(c.free_gpus(), 24);
        let e = Cluster::from_shape(&"z=1x1".parse().unwrap(), &t).unwrap_err();
        assert!(e.contains("\"z\""), "{e}");
    }

    #[test]
    fn alibaba_mapping_skips_unmapped_models() {
        let t = ThroughputTable::parse(crate::data::EMBEDDED_THROUGHPUTS, "t").unwrap();
        let list = vec![
            AlibabaNode {
                name: "a".into(),
                cpu_milli: 1,
                memory_mib: 1,
                gpus: 2,
                model: "T4".into(),
            },
            AlibabaNode {
                name: "b".into(),
                cpu_milli: 1,
                memory_mib: 1,
                gpus: 8,
                model: "G2".into(),
            },
        ];
        let map = parse_gpu_map(DEFAULT_GPU_MAP).unwrap();
        let (c, skipped) = Cluster::from_alibaba(&list, &map, &t).unwrap();
        assert_eq!(c.nodes.len(), 1);
        assert_eq!(c.nodes[0].gpu_type, t.gpu_index("p100").unwrap());
        assert_eq!(skipped.get("G2"), Some(&1));
    }
}
