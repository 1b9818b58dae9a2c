//! The FGD artifact's discrete allocation table
//! (`experiments/analysis/merge_alloc_discrete.py`): one row per experiment,
//! `workload,sc_policy,tune,seed,total_gpus,0,1,…,130`, column `k` the mean
//! allocated GPU % over the arrivals whose arrived GPU % rounds to `k`
//! (widening to `k±1` where there are none).

use super::placement::PlacementEvent;

/// Columns `0..=130`.
pub const ARRIVED_COLUMNS: usize = 131;

/// Python's `round(x)` / `round(x, 2)`: half to even.
fn round_half_even(x: f64, decimals: i32) -> f64 {
    let f = 10f64.powi(decimals);
    let y = x * f;
    let r = y.round();
    let r = if (y - y.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - y.signum()
    } else {
        r
    };
    r / f
}

/// The discrete curve of one experiment: 131 values (allocated GPU % at
/// arrived 0..=130 %), each rounded to 2 decimals. A column that has no
/// arrival even within ±1 % (only past the end of a short run) repeats the
/// previous column, so that every cell is filled.
pub fn discrete_curve(events: &[PlacementEvent], total_gpus: u32) -> Vec<f64> {
    let denom = total_gpus as f64 * 10.0;
    let mut sum = vec![0.0f64; ARRIVED_COLUMNS];
    let mut cnt = vec![0u32; ARRIVED_COLUMNS];
    for e in events {
        let arr = round_half_even(e.arrived_milli as f64 / denom, 0);
        if !(0.0..ARRIVED_COLUMNS as f64).contains(&arr) {
            continue;
        }
        let k = arr as usize;
        sum[k] += round_half_even(e.used_milli as f64 / denom, 2);
        cnt[k] += 1;
    }
    let mut out = Vec::with_capacity(ARRIVED_COLUMNS);
    for k in 0..ARRIVED_COLUMNS {
        let v = if cnt[k] > 0 {
            Some(sum[k] / cnt[k] as f64)
        } else {
            let lo = k.saturating_sub(1);
            let hi = (k + 1).min(ARRIVED_COLUMNS - 1);
            let (s, c) = (lo..=hi).fold((0.0, 0u32), |(s, c), j| (s + sum[j], c + cnt[j]));
            (c > 0).then(|| s / c as f64)
        };
        let v = v.unwrap_or_else(|| out.last().copied().unwrap_or(0.0));
        out.push(round_half_even(v, 2));
    }
    out
}

/// The CSV header line (no newline).
pub fn csv_header() -> String {
    let mut h = String::from("workload,sc_policy,tune,seed,total_gpus");
    for k in 0..ARRIVED_COLUMNS {
        h.push(',');
        h.push_str(&k.to_string());
    }
    h
}

/// One CSV row (no newline).
pub fn csv_row(
    workload: &str,
    policy: &str,
    tune: f64,
    seed: u64,
    total_gpus: u32,
    curve: &[f64],
) -> String {
    let mut r = format!("{workload},{policy},{tune},{seed},{total_gpus}");
    for v in curve {
        r.push(',');
        r.push_str(&format!("{v}"));
    }
    r
}

/// One row of an expected-results table.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpectedRow {
    /// Workload (pod list stem).
    pub workload: String,
    /// Policy label (`01-Random` …).
    pub sc_policy: String,
    /// Seed.
    pub seed: u64,
    /// Allocated GPU % at arrived 0..=130 %.
    pub curve: Vec<f64>,
}

/// A parsed `analysis_allo_discrete.csv`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExpectedTable {
    /// Rows in file order.
    pub rows: Vec<ExpectedRow>,
}

/// A malformed expected-results table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected-results table, line {line}: {reason}")]
pub struct ExpectedTableError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

impl ExpectedTable {
    /// Parses the table (columns by header name).
    pub fn parse(text: &str) -> Result<Self, ExpectedTableError> {
        let mut lines = text.lines().enumerate();
        let (_, head) = lines.next().ok_or(ExpectedTableError {
            line: 1,
            reason: "empty".into(),
        })?;
        let header: Vec<&str> = head.split(',').map(str::trim).collect();
        let col = |name: &str| {
            header
                .iter()
                .position(|h| *h == name)
                .ok_or(ExpectedTableError {
                    line: 1,
                    reason: format!("missing column {name:?}"),
                })
        };
        let (w, p, s) = (col("workload")?, col("sc_policy")?, col("seed")?);
        let cols: Vec<usize> = (0..ARRIVED_COLUMNS)
            .map(|k| col(&k.to_string()))
            .collect::<Result<_, _>>()?;
        let mut rows = Vec::new();
        for (i, line) in lines {
            if line.trim().is_empty() {
                continue;
            }
            let cells: Vec<&str> = line.split(',').map(str::trim).collect();
            let get = |c: usize| cells.get(c).copied().unwrap_or("");
            let bad = |what: &str, v: &str| ExpectedTableError {
                line: i + 1,
                reason: format!("{what}: cannot parse {v:?}"),
            };
            let curve = cols
                .iter()
                .map(|&c| get(c).parse::<f64>().map_err(|_| bad("value", get(c))))
                .collect::<Result<Vec<_>, _>>()?;
            rows.push(ExpectedRow {
                workload: get(w).to_string(),
                sc_policy: get(p).to_string(),
                seed: get(s).parse().map_err(|_| bad("seed", get(s)))?,
                curve,
            });
        }
        Ok(Self { rows })
    }

    /// The mean curve over seeds of `workload` × `sc_policy` (`None` if absent).
    pub fn mean_curve(&self, workload: &str, sc_policy: &str) -> Option<Vec<f64>> {
        let rows: Vec<&ExpectedRow> = self
            .rows
            .iter()
            .filter(|r| r.workload == workload && r.sc_policy == sc_policy)
            .collect();
        if rows.is_empty() {
            return None;
        }
        Some(mean_of(rows.iter().map(|r| r.curve.as_slice())))
    }
}

/// Element-wise mean of equally long curves.
pub fn mean_of<'a>(curves: impl Iterator<Item = &'a [f64]>) -> Vec<f64> {
    let mut sum = vec![0.0; ARRIVED_COLUMNS];
    let mut n = 0usize;
    for c in curves {
        for (s, v) in sum.iter_mut().zip(c) {
            *s += v;
        }
        n += 1;
    }
    sum.iter().map(|s| s / n.max(1) as f64).collect()
}

/// The paper's row label for a canonical baseline name (`fgd` → `06-FGD`).
pub fn paper_label(policy: &str) -> Option<&'static str> {
    Some(match policy {
        "random" => "01-Random",
        "dotprod" => "02-DotProd",
        "clustering" => "03-GpuClustering",
        "packing" => "04-GpuPacking",
        "bestfit" => "05-BestFit",
        "fgd" => "06-FGD",
        _ => return None,
    })
}

/// How far one mean curve is from another: at 100 % arrived, on average over
/// columns 0..=130, and at worst.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CurveDeviation {
    /// |ours − paper| at column 100, percentage points.
    pub at_100: f64,
    /// Mean |ours − paper| over all columns.
    pub mean: f64,
    /// Max |ours − paper| over all columns.
    pub max: f64,
}

impl CurveDeviation {
    /// Compares `ours` with `paper`.
    pub fn between(ours: &[f64], paper: &[f64]) -> Self {
        let d: Vec<f64> = ours.iter().zip(paper).map(|(a, b)| (a - b).abs()).collect();
        Self {
            at_100: d[100],
            mean: d.iter().sum::<f64>() / d.len() as f64,
            max: d.iter().cloned().fold(0.0, f64::max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(arrived: u64, used: u64) -> PlacementEvent {
        PlacementEvent {
            arrived_milli: arrived,
            used_milli: used,
        }
    }

    #[test]
    fn columns_average_rounded_arrivals_and_widen_when_empty() {
        // 10 GPUs: 1 % = 100 milli.
        let events = [ev(40, 40), ev(100, 100), ev(120, 100), ev(350, 300)];
        let c = discrete_curve(&events, 10);
        assert_eq!(c.len(), ARRIVED_COLUMNS);
        assert_eq!(c[0], 0.4); // 0.4 % rounds to 0
        assert_eq!(c[1], 1.0); // mean of 1.0 and 1.0
        assert_eq!(c[2], 1.0); // empty: widened to columns 1..=3
        assert_eq!(c[3], 3.0);
        assert_eq!(c[4], 3.0); // 3.5 % rounds half to even: 4
        assert_eq!(c[130], c[129]); // past the run: the last value repeats
        assert_eq!(round_half_even(2.5, 0), 2.0);
        assert_eq!(round_half_even(3.5, 0), 4.0);
    }

    #[test]
    fn expected_table_round_trips_our_rows() {
        let curve: Vec<f64> = (0..ARRIVED_COLUMNS).map(|k| k as f64 * 0.5).collect();
        let text = format!(
            "{}\n{}\n{}\n",
            csv_header(),
            csv_row("w", "06-FGD", 1.3, 42, 6212, &curve),
            csv_row("w", "06-FGD", 1.3, 43, 6212, &vec![1.0; ARRIVED_COLUMNS])
        );
        assert_eq!(csv_header().split(',').count(), 5 + ARRIVED_COLUMNS);
        let t = ExpectedTable::parse(&text).unwrap();
        assert_eq!(t.rows.len(), 2);
        assert_eq!(t.rows[0].curve, curve);
        let m = t.mean_curve("w", "06-FGD").unwrap();
        assert_eq!(m[10], (5.0 + 1.0) / 2.0);
        assert!(t.mean_curve("w", "01-Random").is_none());
        let d = CurveDeviation::between(&m, &m);
        assert_eq!((d.at_100, d.mean, d.max), (0.0, 0.0, 0.0));
        assert!(ExpectedTable::parse("workload,seed\n").is_err());
        assert_eq!(paper_label("fgd"), Some("06-FGD"));
    }
}
