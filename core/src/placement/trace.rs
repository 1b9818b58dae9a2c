//! Parsing the openb CSVs (Alibaba GPU cluster trace, 2023): node lists
//! (`sn,cpu_milli,memory_mib,gpu,model`) and pod lists (`name,cpu_milli,
//! memory_mib,num_gpu,gpu_milli[,gpu_spec,…]`). Columns are found by header
//! name; optional ones may be missing (the multigpu list has only five).
//! Input is a `&str`: the caller reads the file.

use super::cluster::{GpuModels, NodeSpec};
use super::request::{GpuSpec, PodRequest};

/// A CSV that cannot be read as a node or pod list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// The file has no header line.
    #[error("empty file: no header line")]
    Empty,
    /// A required column is missing from the header.
    #[error("missing column {column:?} (header: {header})")]
    MissingColumn {
        /// The column expected.
        column: &'static str,
        /// The header found.
        header: String,
    },
    /// A cell does not parse.
    #[error("line {line}: column {column:?}: cannot parse {value:?}")]
    BadValue {
        /// 1-based line number.
        line: usize,
        /// Column name.
        column: &'static str,
        /// The cell.
        value: String,
    },
    /// A row asks for something the model does not cover.
    #[error("line {line}: {reason}")]
    Unsupported {
        /// 1-based line number.
        line: usize,
        /// What is not supported.
        reason: String,
    },
}

fn split(line: &str) -> Vec<&str> {
    // The openb files hold no quoted fields; strip quotes if any appear.
    line.split(',')
        .map(|c| c.trim().trim_matches('"'))
        .collect()
}

struct Table<'a> {
    header: Vec<&'a str>,
    rows: Vec<(usize, Vec<&'a str>)>,
}

impl<'a> Table<'a> {
    fn parse(text: &'a str) -> Result<Self, TraceError> {
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        let (_, head) = lines.next().ok_or(TraceError::Empty)?;
        let header = split(head.trim_start_matches('\u{feff}'));
        let rows = lines.map(|(i, l)| (i + 1, split(l))).collect();
        Ok(Self { header, rows })
    }

    fn col(&self, name: &'static str) -> Result<usize, TraceError> {
        self.header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| TraceError::MissingColumn {
                column: name,
                header: self.header.join(","),
            })
    }

    fn opt_col(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| *h == name)
    }
}

/// 2^64 as a float: the first whole number a `u64` does not hold.
const U64_END: f64 = 18_446_744_073_709_551_616.0;

fn cell<'a>(row: &[&'a str], ix: usize) -> &'a str {
    row.get(ix).copied().unwrap_or("")
}

fn num<T: std::str::FromStr>(
    row: &[&str],
    ix: usize,
    line: usize,
    column: &'static str,
) -> Result<T, TraceError> {
    let v = cell(row, ix);
    // Accept "8" and "8.0" (pandas writes floats for columns with gaps),
    // but only whole numbers a u64 holds: `1e30 as u64` would saturate to
    // u64::MAX and pass as a real quantity.
    let parsed = v.parse::<T>().ok().or_else(|| {
        v.parse::<f64>()
            .ok()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < U64_END)
            .and_then(|f| format!("{}", f as u64).parse::<T>().ok())
    });
    parsed.ok_or_else(|| TraceError::BadValue {
        line,
        column,
        value: v.to_string(),
    })
}

/// Parses a node list; GPU model names are interned into `models`.
pub fn parse_node_csv(text: &str, models: &mut GpuModels) -> Result<Vec<NodeSpec>, TraceError> {
    let t = Table::parse(text)?;
    let (sn, cpu, mem, gpu) = (
        t.col("sn")?,
        t.col("cpu_milli")?,
        t.col("memory_mib")?,
        t.col("gpu")?,
    );
    let model = t.opt_col("model");
    let mut out = Vec::with_capacity(t.rows.len());
    for (line, row) in &t.rows {
        let gpus: u32 = num(row, gpu, *line, "gpu")?;
        if gpus as usize > super::MAX_GPUS_PER_NODE {
            return Err(TraceError::Unsupported {
                line: *line,
                reason: format!(
                    "{gpus} GPUs on one node (at most {})",
                    super::MAX_GPUS_PER_NODE
                ),
            });
        }
        let name = model.map(|m| cell(row, m)).unwrap_or("");
        let model_id = if gpus == 0 || name.is_empty() || name == "nan" {
            None
        } else {
            Some(models.intern(name).ok_or_else(|| TraceError::Unsupported {
                line: *line,
                reason: "more than 64 GPU models".to_string(),
            })?)
        };
        out.push(NodeSpec {
            name: cell(row, sn).to_string(),
            cpu_milli: num(row, cpu, *line, "cpu_milli")?,
            memory_mib: num(row, mem, *line, "memory_mib")?,
            gpus: gpus as u8,
            model: model_id,
        });
    }
    Ok(out)
}

/// Parses a GPU-model constraint (`"V100M16|V100M32"`; empty or `nan` =
/// none) against the cluster's `models`.
pub fn parse_gpu_spec(spec: &str, models: &GpuModels) -> GpuSpec {
    let names: Vec<&str> = spec
        .split('|')
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "nan")
        .collect();
    if names.is_empty() {
        return GpuSpec::ANY;
    }
    let ids: Vec<u8> = names.iter().filter_map(|n| models.id(n)).collect();
    GpuSpec::only(&ids)
}

/// Parses a pod list. A GPU task without a `gpu_milli` column asks for whole
/// GPUs; `gpu_milli` above 1000 is clamped to 1000 (as the simulator's
/// converter does).
pub fn parse_pod_csv(text: &str, models: &GpuModels) -> Result<Vec<PodRequest>, TraceError> {
    let t = Table::parse(text)?;
    let (name, cpu, mem, ngpu) = (
        t.col("name")?,
        t.col("cpu_milli")?,
        t.col("memory_mib")?,
        t.col("num_gpu")?,
    );
    let milli = t.opt_col("gpu_milli");
    let spec = t.opt_col("gpu_spec");
    let mut out = Vec::with_capacity(t.rows.len());
    for (line, row) in &t.rows {
        let num_gpu: u32 = num(row, ngpu, *line, "num_gpu")?;
        let gpu_milli: u32 = match milli {
            Some(m) if num_gpu > 0 => num::<u32>(row, m, *line, "gpu_milli")?.min(1000),
            None if num_gpu > 0 => 1000,
            _ => 0,
        };
        let (num_gpu, gpu_milli) = if gpu_milli == 0 {
            (0, 0)
        } else {
            (num_gpu, gpu_milli)
        };
        if num_gpu as usize > super::MAX_GPUS_PER_NODE {
            return Err(TraceError::Unsupported {
                line: *line,
                reason: format!("{num_gpu} GPUs for one task"),
            });
        }
        if num_gpu > 1 && gpu_milli < 1000 {
            return Err(TraceError::Unsupported {
                line: *line,
                reason: format!(
                    "{num_gpu} GPUs of {gpu_milli} milli each (sharing tasks use one GPU)"
                ),
            });
        }
        out.push(PodRequest {
            name: cell(row, name).to_string(),
            cpu_milli: num(row, cpu, *line, "cpu_milli")?,
            memory_mib: num(row, mem, *line, "memory_mib")?,
            num_gpu: num_gpu as u8,
            gpu_milli: gpu_milli as u16,
            gpu_spec: spec.map_or(GpuSpec::ANY, |s| parse_gpu_spec(cell(row, s), models)),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_float_cell_beyond_u64_is_refused_not_saturated() {
        let mut models = GpuModels::default();
        let csv = "sn,cpu_milli,memory_mib,gpu,model\nn1,1000,1e30,0,\n";
        assert_eq!(
            parse_node_csv(csv, &mut models),
            Err(TraceError::BadValue {
                line: 2,
                column: "memory_mib",
                value: "1e30".into()
            })
        );
        let csv = "sn,cpu_milli,memory_mib,gpu,model\nn1,1000,2048.0,0,\n";
        assert_eq!(
            parse_node_csv(csv, &mut models).unwrap()[0].memory_mib,
            2048
        );
    }
}
