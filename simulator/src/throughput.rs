//! The throughput table: the ground truth of how fast each job type runs on each GPU type.
//!
//! The layout is Gavel's `isolated_throughputs.csv`: job type, model family, batch size, scale
//! factor, then one `<gpu>_steps_per_s` column per GPU type and optionally
//! `<gpu>_unconsolidated_steps_per_s` columns for a multi-GPU job spread over servers. GPU type
//! names come from the headers and are free-form, so the simulator works with any table of this
//! layout and never assumes particular GPU models. An empty cell or `0` means "not measured"
//! (Gavel writes `0.0` where a model did not fit in memory): the job type cannot run there.

use crate::error::{DataError, Row};
use std::collections::HashMap;

/// Suffix of every throughput column.
const STEPS_SUFFIX: &str = "_steps_per_s";
/// Marker of an unconsolidated (spread over servers) throughput column.
const UNCONSOLIDATED: &str = "_unconsolidated";

/// Throughputs of one job type at one scale factor.
#[derive(Clone, Debug, PartialEq)]
pub struct ScaleRow {
    /// GPUs the job uses.
    pub scale_factor: u32,
    /// Steps/s with all GPUs on one server, per GPU type; `None` when not measured.
    pub consolidated: Vec<Option<f64>>,
    /// Steps/s with the GPUs spread over servers, per GPU type; `None` when not measured.
    pub unconsolidated: Vec<Option<f64>>,
}

/// One job type (a model at a batch size) with its rows by scale factor.
#[derive(Clone, Debug, PartialEq)]
pub struct JobType {
    /// Job type name, e.g. `ResNet-18 (batch size 64)`.
    pub name: String,
    /// Model family, e.g. `ResNet-18`: the only thing a scheduler sees (the pod's class).
    pub family: String,
    /// Rows sorted by scale factor.
    pub rows: Vec<ScaleRow>,
}

impl JobType {
    /// The row for exactly `scale_factor` GPUs.
    pub fn row(&self, scale_factor: u32) -> Option<&ScaleRow> {
        self.rows.iter().find(|r| r.scale_factor == scale_factor)
    }

    /// The largest measured scale factor that is at most `gpus` (at least the smallest one).
    pub fn fit_scale_factor(&self, gpus: u32) -> u32 {
        self.rows
            .iter()
            .map(|r| r.scale_factor)
            .filter(|s| *s <= gpus)
            .max()
            .unwrap_or_else(|| self.rows[0].scale_factor)
    }
}

/// A parsed throughput table.
#[derive(Clone, Debug, PartialEq)]
pub struct ThroughputTable {
    /// GPU type names in column order.
    pub gpu_types: Vec<String>,
    /// Job types in first-seen order.
    pub job_types: Vec<JobType>,
    by_name: HashMap<String, usize>,
}

impl ThroughputTable {
    /// Parses a table from CSV text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Self, DataError> {
        let mut rdr = csv::ReaderBuilder::new()
            .has_headers(true)
            .flexible(false)
            .from_reader(text.as_bytes());
        let headers = rdr.headers().map_err(|e| DataError::csv(file, e))?.clone();
        if headers.len() < 5 {
            return Err(DataError::invalid(
                file,
                format!(
                    "expected job type, model family, batch size, scale factor and at least one \
                     `<gpu>{STEPS_SUFFIX}` column; found {} columns",
                    headers.len()
                ),
            ));
        }
        let header_row = Row { file, line: 1 };
        // Column index -> (gpu index, unconsolidated?)
        let mut gpu_types: Vec<String> = Vec::new();
        let mut columns: Vec<(usize, bool)> = Vec::new();
        let mut pending_unconsolidated: Vec<(usize, String)> = Vec::new();
        for (i, h) in headers.iter().enumerate().skip(4) {
            let h = h.trim();
            let cell = header_row.cell(i, h);
            let stem = h.strip_suffix(STEPS_SUFFIX).ok_or_else(|| {
                cell.err(format!(
                    "a throughput column's name must end with `{STEPS_SUFFIX}`"
                ))
            })?;
            if let Some(pos) = stem.find(UNCONSOLIDATED) {
                pending_unconsolidated.push((i, stem[..pos].to_owned()));
                columns.push((usize::MAX, true));
            } else {
                if stem.is_empty() {
                    return Err(cell.err("empty GPU type name"));
                }
                if gpu_types.iter().any(|g| g == stem) {
                    return Err(cell.err(format!("GPU type {stem:?} appears twice")));
                }
                gpu_types.push(stem.to_owned());
                columns.push((gpu_types.len() - 1, false));
            }
        }
        for (i, gpu) in pending_unconsolidated {
            let g = gpu_types.iter().position(|x| *x == gpu).ok_or_else(|| {
                header_row.cell(i, &headers[i]).err(format!(
                    "unconsolidated column for GPU type {gpu:?}, which has no `{gpu}{STEPS_SUFFIX}` column"
                ))
            })?;
            if columns.contains(&(g, true)) {
                return Err(DataError::invalid(
                    file,
                    format!("two unconsolidated columns for GPU type {gpu:?}"),
                ));
            }
            columns[i - 4] = (g, true);
        }

        let n = gpu_types.len();
        let mut table = ThroughputTable {
            gpu_types,
            job_types: Vec::new(),
            by_name: HashMap::new(),
        };
        for rec in Row::records(&mut rdr, file) {
            let (row, rec) = rec?;
            let cell = |column: usize| row.cell(column, headers.get(column).unwrap_or(""));
            let name = rec[0].trim();
            if name.is_empty() {
                return Err(cell(0).err("empty job type"));
            }
            let family = rec[1].trim();
            if family.is_empty() {
                return Err(cell(1).err("empty model family"));
            }
            let scale_factor = cell(3).positive_int(&rec[3])?;
            let mut consolidated = vec![None; n];
            let mut unconsolidated = vec![None; n];
            let mut has_unconsolidated = vec![false; n];
            for (k, &(g, spread)) in columns.iter().enumerate() {
                let raw = rec[k + 4].trim();
                let value = if raw.is_empty() {
                    None
                } else {
                    Some(cell(k + 4).non_negative(raw)?).filter(|v| *v > 0.0)
                };
                if spread {
                    unconsolidated[g] = value;
                    has_unconsolidated[g] = true;
                } else {
                    consolidated[g] = value;
                }
            }
            // Without an unconsolidated column the spread job is taken to run as fast as the
            // consolidated one (true for scale factor 1, optimistic otherwise).
            for g in 0..n {
                if !has_unconsolidated[g] {
                    unconsolidated[g] = consolidated[g];
                }
            }
            let row = ScaleRow {
                scale_factor,
                consolidated,
                unconsolidated,
            };
            let idx = match table.by_name.get(name) {
                Some(&i) => i,
                None => {
                    table.job_types.push(JobType {
                        name: name.to_owned(),
                        family: family.to_owned(),
                        rows: Vec::new(),
                    });
                    table
                        .by_name
                        .insert(name.to_owned(), table.job_types.len() - 1);
                    table.job_types.len() - 1
                }
            };
            let jt = &mut table.job_types[idx];
            if jt.family != family {
                return Err(cell(1).err(format!(
                    "job type {name:?} was given model family {:?} on an earlier line",
                    jt.family
                )));
            }
            if jt.row(scale_factor).is_some() {
                return Err(cell(3).err(format!(
                    "job type {name:?} at scale factor {scale_factor} appears twice"
                )));
            }
            jt.rows.push(row);
            jt.rows.sort_by_key(|r| r.scale_factor);
        }
        if table.job_types.is_empty() {
            return Err(DataError::invalid(file, "no rows"));
        }
        Ok(table)
    }

    /// Index of a job type by name.
    pub fn job_type_index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Index of a GPU type by name (exact, then ASCII case-insensitive).
    pub fn gpu_index(&self, name: &str) -> Option<usize> {
        self.gpu_types.iter().position(|g| g == name).or_else(|| {
            self.gpu_types
                .iter()
                .position(|g| g.eq_ignore_ascii_case(name))
        })
    }

    /// Steps/s of `job_type` at `scale_factor` on `gpu`, consolidated or spread over servers.
    pub fn throughput(
        &self,
        job_type: usize,
        scale_factor: u32,
        gpu: usize,
        spread: bool,
    ) -> Option<f64> {
        let row = self.job_types[job_type].row(scale_factor)?;
        if spread {
            row.unconsolidated[gpu]
        } else {
            row.consolidated[gpu]
        }
    }

    /// The GPU types ordered fastest first by the geometric mean, over the job types at scale
    /// factor 1 measured on every type, of throughput relative to the first GPU type. This is the
    /// static preference of the `fastest-type` baseline: what an operator would write down
    /// after reading the spec sheets, with no per-job knowledge.
    pub fn types_by_mean_speed(&self) -> Vec<usize> {
        let n = self.gpu_types.len();
        let mut log_sum = vec![0.0; n];
        let mut count = 0usize;
        for jt in &self.job_types {
            let Some(row) = jt.row(1) else { continue };
            let Some(all) = row
                .consolidated
                .iter()
                .copied()
                .collect::<Option<Vec<f64>>>()
            else {
                continue;
            };
            for g in 0..n {
                log_sum[g] += (all[g] / all[0]).ln();
            }
            count += 1;
        }
        let mut order: Vec<usize> = (0..n).collect();
        if count > 0 {
            order.sort_by(|a, b| log_sum[*b].total_cmp(&log_sum[*a]));
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FREE_FORM: &str = "kind,family,bs,sf,Gaudi 2_steps_per_s,mi250x_steps_per_s,Gaudi 2_unconsolidated_steps_per_s\n\
        A,fam-a,32,1,10,5,10\n\
        A,fam-a,32,2,18,,9\n\
        B,fam-b,,1,0.0,7,\n";

    #[test]
    fn parses_free_form_gpu_names() {
        let t = ThroughputTable::parse(FREE_FORM, "t.csv").unwrap();
        assert_eq!(t.gpu_types, vec!["Gaudi 2", "mi250x"]);
        assert_eq!(t.job_types.len(), 2);
        let a = t.job_type_index("A").unwrap();
        assert_eq!(t.throughput(a, 2, 0, false), Some(18.0));
        assert_eq!(t.throughput(a, 2, 0, true), Some(9.0));
        // Empty cell: not measured.
        assert_eq!(t.throughput(a, 2, 1, false), None);
        // No unconsolidated column for mi250x: falls back to consolidated.
        assert_eq!(t.throughput(a, 1, 1, true), Some(5.0));
        let b = t.job_type_index("B").unwrap();
        // 0 means "not measured".
        assert_eq!(t.throughput(b, 1, 0, false), None);
        assert_eq!(t.job_types[b].family, "fam-b");
        assert_eq!(t.gpu_index("MI250X"), Some(1));
    }

    #[test]
    fn parses_the_embedded_gavel_table() {
        let t = ThroughputTable::parse(crate::data::EMBEDDED_THROUGHPUTS, "embedded").unwrap();
        assert_eq!(t.gpu_types, vec!["k80", "p100", "v100"]);
        assert_eq!(t.job_types.len(), 26);
        let fams: std::collections::BTreeSet<_> =
            t.job_types.iter().map(|j| j.family.as_str()).collect();
        assert_eq!(fams.len(), 7);
        // Fastest first by mean speed: v100, p100, k80.
        assert_eq!(t.types_by_mean_speed(), vec![2, 1, 0]);
    }

    fn err_of(text: &str) -> String {
        ThroughputTable::parse(text, "bad.csv")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn bad_header_names_the_column() {
        let e = err_of("a,b,c,d,v100_steps_per_s,p100_speed\nA,f,1,1,2,3\n");
        assert!(
            e.contains("bad.csv") && e.contains("column 6") && e.contains("p100_speed"),
            "{e}"
        );
    }

    #[test]
    fn bad_number_names_line_and_column() {
        let e = err_of("a,b,c,d,v100_steps_per_s\nA,f,1,1,2\nB,f,1,1,fast\n");
        assert!(
            e.contains("line 3") && e.contains("column 5") && e.contains("fast"),
            "{e}"
        );
        let e = err_of("a,b,c,d,v100_steps_per_s\nA,f,1,1,-2\n");
        assert!(e.contains("line 2") && e.contains(">= 0"), "{e}");
    }

    #[test]
    fn bad_scale_factor_and_duplicates_are_rejected() {
        let e = err_of("a,b,c,d,v100_steps_per_s\nA,f,1,zero,2\n");
        assert!(
            e.contains("column 4") && e.contains("positive integer"),
            "{e}"
        );
        let e = err_of("a,b,c,d,v100_steps_per_s\nA,f,1,1,2\nA,f,1,1,3\n");
        assert!(e.contains("line 3") && e.contains("twice"), "{e}");
        let e = err_of("a,b,c,d,v100_steps_per_s,t4_unconsolidated_steps_per_s\nA,f,1,1,2,3\n");
        assert!(e.contains("no `t4_steps_per_s`"), "{e}");
    }

    #[test]
    fn ragged_rows_and_empty_tables_are_rejected() {
        let e = err_of("a,b,c,d,v100_steps_per_s\nA,f,1,1\n");
        assert!(e.contains("bad.csv") && e.contains("line 2"), "{e}");
        let e = err_of("a,b,c,d,v100_steps_per_s\n");
        assert!(e.contains("no rows"), "{e}");
        let e = err_of("a,b,c,d\n");
        assert!(e.contains("at least one"), "{e}");
    }
}
