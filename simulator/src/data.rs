//! Loading the workload and cluster data sets (everything except the throughput table).
//!
//! Each loader takes the text and a file name for error messages, so the same code parses the
//! extracts compiled into the binary and the full files under `--data-dir`.

use crate::error::{DataError, Row};
use crate::throughput::ThroughputTable;
use std::path::{Path, PathBuf};

/// Gavel's isolated throughputs, compiled in (see `simulator/data/README.md`).
pub const EMBEDDED_THROUGHPUTS: &str = include_str!("../data/isolated_throughputs.csv");
/// A second throughput table, modelled from public GPU specifications (T4, A10, A100, H100,
/// L40S; see `simulator/data/README.md`): not measurements.
pub const EMBEDDED_SPEC_THROUGHPUTS: &str = include_str!("../data/spec_throughputs.csv");
/// A seeded 2,000-row sample of the Philly job distribution.
pub const EMBEDDED_PHILLY: &str = include_str!("../data/philly_job_distribution_sample.csv");
/// Per-job median mini-batch-time CoV from Alibaba PAI 2020.
pub const EMBEDDED_COV: &str = include_str!("../data/pai_cov_per_job_median.csv");

/// Paths of the data sets inside a `--data-dir` (the layout of `shared/data`).
pub mod paths {
    /// Gavel's throughput table.
    pub const THROUGHPUTS: &str = "gavel/isolated_throughputs.csv";
    /// Philly (duration, GPUs) pairs.
    pub const PHILLY: &str = "gavel/philly_job_distribution.csv";
    /// Philly VC traces directory.
    pub const VC_TRACES: &str = "gavel/philly_vc_traces";
    /// PAI mini-batch CoV.
    pub const COV: &str = "alibaba_pai_v2020/minibatch_time_coefficient_variation.csv";
    /// Alibaba 2023 GPU node list.
    pub const ALIBABA_NODES: &str = "alibaba_gpu_v2023/openb_node_list_gpu_node.csv";
}

/// Reads a whole file, naming it in the error.
pub fn read(path: &Path) -> Result<String, DataError> {
    std::fs::read_to_string(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The default data directory for tests and benches: `$KUDOS_DATA_DIR`, else
/// `<manifest>/../../shared/data`; `None` when it does not exist.
pub fn default_data_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("KUDOS_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"));
    dir.join(paths::THROUGHPUTS).is_file().then_some(dir)
}

/// One `(duration, GPUs)` pair from the Philly job distribution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PhillyJob {
    /// Run time in seconds (on the reference GPU, by Gavel's convention).
    pub duration_s: f64,
    /// GPUs requested.
    pub gpus: u32,
}

fn reader(text: &str, delimiter: u8, headers: bool) -> csv::Reader<&[u8]> {
    csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .has_headers(headers)
        .flexible(true)
        .from_reader(text.as_bytes())
}

/// Looks up columns of `rdr` by header name; a missing one is an error naming it.
fn columns<'h>(
    rdr: &mut csv::Reader<&[u8]>,
    file: &'h str,
) -> Result<impl Fn(&str) -> Result<usize, DataError> + 'h, DataError> {
    let headers = rdr.headers().map_err(|e| DataError::csv(file, e))?.clone();
    Ok(move |name: &str| {
        headers
            .iter()
            .position(|h| h.trim() == name)
            .ok_or_else(|| DataError::invalid(file, format!("no column named {name:?}")))
    })
}

/// Parses `duration_s,num_gpus` rows.
pub fn parse_philly_distribution(text: &str, file: &str) -> Result<Vec<PhillyJob>, DataError> {
    let mut rdr = reader(text, b',', true);
    let col = columns(&mut rdr, file)?;
    let (d, g) = (col("duration_s")?, col("num_gpus")?);
    let mut out = Vec::new();
    for rec in Row::records(&mut rdr, file) {
        let (row, rec) = rec?;
        let dc = row.cell(d, "duration_s");
        let duration_s = dc.non_negative(rec.get(d).unwrap_or(""))?;
        if duration_s <= 0.0 {
            return Err(dc.err("duration must be > 0"));
        }
        let gpus = row
            .cell(g, "num_gpus")
            .positive_int(rec.get(g).unwrap_or(""))?;
        out.push(PhillyJob { duration_s, gpus });
    }
    if out.is_empty() {
        return Err(DataError::invalid(file, "no rows"));
    }
    Ok(out)
}

/// The run-time noise sigma from the PAI CoV table: the median over jobs of each job's median
/// CoV across iterations (rows are jobs, columns iterations, empty cells allowed).
pub fn parse_cov_sigma(text: &str, file: &str) -> Result<f64, DataError> {
    let mut rdr = reader(text, b',', true);
    let mut per_job = Vec::new();
    for rec in Row::records(&mut rdr, file) {
        let (row, rec) = rec?;
        let mut values = Vec::new();
        for (i, raw) in rec.iter().enumerate().skip(1) {
            if raw.trim().is_empty() {
                continue;
            }
            values.push(row.cell(i, "coefficient of variation").non_negative(raw)?);
        }
        if let Some(m) = median(&mut values) {
            per_job.push(m);
        }
    }
    median(&mut per_job).ok_or_else(|| DataError::invalid(file, "no values"))
}

/// Median of a slice (sorted in place); `None` when empty.
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// One job of a Philly VC trace.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceJob {
    /// Index into the throughput table's job types.
    pub job_type: usize,
    /// Total steps to run.
    pub total_steps: f64,
    /// Arrival time in seconds.
    pub arrival_s: f64,
    /// GPUs requested.
    pub gpus: u32,
}

/// Parses a Gavel Philly VC trace (tab-separated, no header: job_type, command, steps_arg,
/// needs_data, total_steps, arrival_time_s, scale_factor). Job types must be in `table`.
pub fn parse_vc_trace(
    text: &str,
    file: &str,
    table: &ThroughputTable,
) -> Result<Vec<TraceJob>, DataError> {
    let mut rdr = reader(text, b'\t', false);
    let mut out = Vec::new();
    for rec in Row::records(&mut rdr, file) {
        let (row, rec) = rec?;
        let cell = |column: usize, name: &'static str| row.cell(column, name);
        if rec.len() < 7 {
            return Err(cell(rec.len(), "record").err(format!(
                "expected 7 tab-separated columns, found {}",
                rec.len()
            )));
        }
        let name = rec[0].trim();
        let job_type = table.job_type_index(name).ok_or_else(|| {
            cell(0, "job_type").err(format!("job type {name:?} is not in the throughput table"))
        })?;
        let total_steps = cell(4, "total_steps").non_negative(&rec[4])?;
        let arrival_s = cell(5, "arrival_time_s").non_negative(&rec[5])?;
        let gpus = cell(6, "scale_factor").positive_int(&rec[6])?;
        out.push(TraceJob {
            job_type,
            total_steps,
            arrival_s,
            gpus,
        });
    }
    if out.is_empty() {
        return Err(DataError::invalid(file, "no rows"));
    }
    Ok(out)
}

/// One node of the Alibaba 2023 node list.
#[derive(Clone, Debug, PartialEq)]
pub struct AlibabaNode {
    /// Node name (`sn`).
    pub name: String,
    /// CPU in millicores.
    pub cpu_milli: u64,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// GPU count.
    pub gpus: u32,
    /// GPU model as written in the list (`P100`, `T4`, `V100M16`, `G2`, ...).
    pub model: String,
}

/// Parses `sn,cpu_milli,memory_mib,gpu,model`; nodes without GPUs are skipped.
pub fn parse_alibaba_nodes(text: &str, file: &str) -> Result<Vec<AlibabaNode>, DataError> {
    let mut rdr = reader(text, b',', true);
    let col = columns(&mut rdr, file)?;
    let (sn, cpu, mem, gpu, model) = (
        col("sn")?,
        col("cpu_milli")?,
        col("memory_mib")?,
        col("gpu")?,
        col("model")?,
    );
    let mut out = Vec::new();
    for rec in Row::records(&mut rdr, file) {
        let (row, rec) = rec?;
        let get = |i: usize| rec.get(i).unwrap_or("").trim();
        let cell = |column: usize, name: &'static str| row.cell(column, name);
        let gpus_f = cell(gpu, "gpu").non_negative(get(gpu))?;
        if gpus_f == 0.0 {
            continue;
        }
        out.push(AlibabaNode {
            name: get(sn).to_owned(),
            cpu_milli: cell(cpu, "cpu_milli").non_negative(get(cpu))? as u64,
            memory_mib: cell(mem, "memory_mib").non_negative(get(mem))? as u64,
            gpus: cell(gpu, "gpu").positive_int(get(gpu))?,
            model: get(model).to_owned(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_extracts_parse() {
        let p = parse_philly_distribution(EMBEDDED_PHILLY, "embedded").unwrap();
        assert_eq!(p.len(), 2000);
        let s = parse_cov_sigma(EMBEDDED_COV, "embedded").unwrap();
        assert!((s - 0.0866).abs() < 1e-3, "{s}");
    }

    #[test]
    fn extract_sigma_matches_the_full_file() {
        // This test is about the full files (the extracts stand in everywhere else): it needs
        // them, says so when it skips, and fails instead of skipping under CI.
        let Some(dir) = default_data_dir() else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but the full data set is missing: set KUDOS_DATA_DIR to shared/data"
            );
            println!(
                "SKIPPED extract_sigma_matches_the_full_file: needs the full data set \
                 (set KUDOS_DATA_DIR to shared/data)"
            );
            return;
        };
        let full = parse_cov_sigma(&read(&dir.join(paths::COV)).unwrap(), paths::COV).unwrap();
        let extract = parse_cov_sigma(EMBEDDED_COV, "embedded").unwrap();
        assert!((full - extract).abs() < 1e-12);
        let philly =
            parse_philly_distribution(&read(&dir.join(paths::PHILLY)).unwrap(), paths::PHILLY)
                .unwrap();
        assert_eq!(philly.len(), 33_192);
        let nodes =
            parse_alibaba_nodes(&read(&dir.join(paths::ALIBABA_NODES)).unwrap(), "n").unwrap();
        assert_eq!(nodes.len(), 1213);
        assert_eq!(nodes.iter().map(|n| n.gpus).sum::<u32>(), 6212);
    }

    #[test]
    fn bad_rows_name_the_cell() {
        let e =
            parse_philly_distribution("duration_s,num_gpus\n10,1\n-3,1\n", "p.csv").unwrap_err();
        assert!(e.to_string().contains("p.csv: line 3, column 1"), "{e}");
        let e = parse_philly_distribution("duration_s,num_gpus\n10,0\n", "p.csv").unwrap_err();
        assert!(e.to_string().contains("column 2 (num_gpus)"), "{e}");
        let e = parse_philly_distribution("duration,num_gpus\n10,1\n", "p.csv").unwrap_err();
        assert!(e.to_string().contains("duration_s"), "{e}");
    }

    #[test]
    fn vc_trace_needs_known_job_types() {
        let t = ThroughputTable::parse(EMBEDDED_THROUGHPUTS, "t").unwrap();
        let ok = "A3C\tcmd\t-n\t1\t100\t5.0\t1\n";
        let jobs = parse_vc_trace(ok, "vc.tsv", &t).unwrap();
        assert_eq!(jobs[0].total_steps, 100.0);
        let e = parse_vc_trace("Nope\tcmd\t-n\t1\t100\t5.0\t1\n", "vc.tsv", &t).unwrap_err();
        assert!(e.to_string().contains("vc.tsv: line 1, column 1"), "{e}");
    }
}
