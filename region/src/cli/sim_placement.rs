//! `gsharectl sim placement`: replays the FGD paper's placement experiment
//! (USENIX ATC'23, "Beware of Fragmentation") for each policy × seed, in
//! parallel, and writes the paper's discrete allocation table.
//!
//! ```text
//!   --nodes/--pods (or the embedded synthetic default)
//!        │
//!        ▼
//!   jobs = pod lists × policies × seeds ──▶ worker threads (one per core)
//!        │                                   core::sim::run_experiment
//!        ▼
//!   --csv rows, --svg mean curves, a table vs the paper (--expected)
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use gshare_core::placement::{
    canonical_policy_name, parse_node_csv, parse_pod_csv, FragModel, GpuModels,
};
use gshare_core::sim::synthetic::{default_workload, DEFAULT_WORKLOAD};
use gshare_core::sim::variant::{derive, Variant};
use gshare_core::sim::{
    csv_header, csv_row, mean_of, paper_label, run_experiment, CurveDeviation, ExpectedTable,
    ExperimentResult, Workload,
};

/// Where the expected results usually are, relative to a pod list
/// (`…/data/alibaba-gpu-v2023/csv/x.csv` → `…/data/fgd-simulator-expected-results/`).
const EXPECTED_REL: &str = "../../fgd-simulator-expected-results/analysis_allo_discrete.csv";

/// Arguments of `gsharectl sim placement`.
#[derive(Debug, Args)]
#[command(
    after_help = "Each seed shuffles the pod list, inflates it to --tune x the cluster GPU capacity, and lets \
        every pod arrive once (no retries, no departures); the table reports unallocated GPU % when the \
        arrived GPU demand equals the capacity (the FGD paper's headline), next to the paper's value when known.\n\n\
        Examples:\n  \
        gsharectl sim placement                       # embedded synthetic workload, all policies, seeds 42-51\n  \
        gsharectl sim placement --nodes openb_node_list_gpu_node.csv --pods openb_pod_list_default.csv \\\n      \
        --policy random,dotprod,clustering,packing,bestfit,fgd,gshare,gshare-noremap --seeds 42-51 --tune 1.3 \\\n      \
        --csv out.csv --svg out.svg\n\n\
        Workload families (the paper's knobs; a seeded variant of each --pods list, see docs/placement.md):\n  \
        gsharectl sim placement --nodes N.csv --pods openb_pod_list_default.csv --variant gpushare=60 --policy fgd,gshare\n  \
        gsharectl sim placement --nodes N.csv --pods openb_pod_list_default.csv --variant cpu=200,gpuspec=10\n  \
        gsharectl sim placement --nodes N.csv --pods openb_pod_list_default.csv --variant grid \\\n      \
        --policy fgd,gshare --seeds 42-51 --compare fgd,gshare      # the 22 grid points, paired table\n\
        Knobs: cpu=<pct> CPU-only demand, % of the list's (0..1000); gpushare=<pct> GPU-sharing tasks, % of the GPU \
        milli; multigpu=<pct> multi-GPU tasks, % of the GPU milli; gpuspec=<pct> GPU tasks with a GPU-model \
        constraint, % of GPU tasks (each 0..100). Grid: cpu 0,50,100,150,200,250,300; gpushare 20,40,60,80,100; \
        gpuspec 5,10,15,20,25,33; multigpu 20,30,40,50.\n\n\
        Traces: https://github.com/alibaba/clusterdata (cluster-trace-gpu-v2023, csv/).\n\
        Policy names: random, dotprod, clustering, packing, bestfit, fgd, gshare, gshare-noremap\n\
        (the paper's labels 01-Random ... 06-FGD are accepted too)."
)]
pub struct SimPlacementArgs {
    /// Node list CSV (openb_node_list_gpu_node.csv). Without --nodes and
    /// --pods the embedded synthetic workload is used.
    #[arg(long, value_name = "CSV", requires = "pods")]
    pub nodes: Option<PathBuf>,
    /// Pod list CSV(s), comma-separated (e.g. openb_pod_list_default.csv);
    /// each is one workload named by its file stem.
    #[arg(
        long,
        value_name = "CSV[,CSV...]",
        value_delimiter = ',',
        requires = "nodes"
    )]
    pub pods: Vec<PathBuf>,
    /// Policies, comma-separated; each name is written verbatim as sc_policy.
    #[arg(
        long,
        value_name = "P1,P2,...",
        value_delimiter = ',',
        default_value = "random,dotprod,clustering,packing,bestfit,fgd,gshare,gshare-noremap"
    )]
    pub policy: Vec<String>,
    /// Seeds: one (42), a range (42-51) or a list (42,45).
    #[arg(long, value_name = "SEEDS", default_value = "42-51")]
    pub seeds: String,
    /// Inflate (or trim) the pod list to this multiple of the cluster's GPU capacity.
    #[arg(long, default_value_t = 1.3)]
    pub tune: f64,
    /// Write one row per workload x policy x seed (the paper's columns) here.
    #[arg(long, value_name = "OUT.csv")]
    pub csv: Option<PathBuf>,
    /// Draw the mean curves per policy (allocated GPU % vs arrived %) here.
    #[arg(long, value_name = "OUT.svg")]
    pub svg: Option<PathBuf>,
    /// Write the per-policy summary (means over seeds, the paper's value,
    /// deviations, remaps) as JSON here.
    #[arg(long, value_name = "OUT.json")]
    pub json: Option<PathBuf>,
    /// The paper's analysis_allo_discrete.csv, to print its values alongside
    /// (default: looked up next to the data directory of --pods).
    #[arg(long, value_name = "CSV")]
    pub expected: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seed of the embedded synthetic workload.
    #[arg(long, default_value_t = 2023)]
    pub synthetic_seed: u64,
    /// Run a seeded variant of each pod list instead of the list itself:
    /// `<knob>=<pct>[,<knob>=<pct>...]` (knobs cpu, gpushare, gpuspec,
    /// multigpu), or `grid` for the paper's 22 points one knob at a time.
    /// Repeat the flag for several variants; each is a workload named
    /// `<list>+<variant>`.
    #[arg(long, value_name = "KNOB=PCT[,...]|grid", action = clap::ArgAction::Append)]
    pub variant: Vec<String>,
    /// Seed of the variant derivation (one variant per seed, shared by all
    /// experiment seeds, as the paper used one file per family).
    #[arg(long, default_value_t = 1)]
    pub variant_seed: u64,
    /// Print a paired comparison of two policies per workload: mean
    /// unallocated % of each, their difference (B - A), the standard error
    /// of the per-seed difference, and a verdict.
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub compare: Vec<String>,
}

/// Parses the `--variant` values (`grid` expands to the 22 grid points).
pub fn parse_variants(values: &[String]) -> Result<Vec<Variant>> {
    let mut out = Vec::new();
    for v in values {
        if v.trim() == "grid" {
            out.extend(Variant::grid());
        } else {
            out.push(Variant::parse(v)?);
        }
    }
    Ok(out)
}

/// Each workload's variants (named `<workload>+<variant>`), in order.
pub fn variant_workloads(
    workloads: &[Workload],
    variants: &[Variant],
    seed: u64,
) -> Result<Vec<Workload>> {
    let mut out = Vec::new();
    for w in workloads {
        for v in variants {
            let pods = derive(&w.pods, &w.nodes, v, seed)
                .with_context(|| format!("deriving {v} from {}", w.name))?;
            out.push(Workload {
                name: format!("{}+{v}", w.name),
                models: w.models.clone(),
                nodes: w.nodes.clone(),
                pods,
            });
        }
    }
    Ok(out)
}

/// Two policies compared on one workload, paired by seed.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Workload.
    pub workload: String,
    /// Mean unallocated % at 100 % arrived of the first policy.
    pub a: f64,
    /// The same for the second.
    pub b: f64,
    /// Mean of the per-seed differences `b - a`, pp.
    pub diff: f64,
    /// Standard error of that mean (sample s.d. / sqrt(seeds)).
    pub se: f64,
    /// Seeds paired.
    pub seeds: usize,
}

impl Comparison {
    /// "B better" when it leaves less unallocated by more than one s.e.,
    /// "A better" the other way, else a tie.
    pub fn verdict(&self, a: &str, b: &str) -> String {
        if self.diff.abs() <= self.se {
            "tie (within 1 s.e.)".to_string()
        } else if self.diff < 0.0 {
            format!("{b} better")
        } else {
            format!("{a} better")
        }
    }
}

/// Pairs `a` and `b` by seed on every workload that has both.
pub fn compare(rows: &[Row], a: &str, b: &str) -> Vec<Comparison> {
    let mut workloads: Vec<&str> = Vec::new();
    for r in rows {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    let mut out = Vec::new();
    for w in workloads {
        let of = |p: &str| -> Vec<&Row> {
            rows.iter()
                .filter(|r| r.workload == w && r.policy_label == p)
                .collect()
        };
        let (ra, rb) = (of(a), of(b));
        let pairs: Vec<(f64, f64)> = ra
            .iter()
            .filter_map(|x| {
                rb.iter()
                    .find(|y| y.result.seed == x.result.seed)
                    .map(|y| (x.result.unallocated_at_100(), y.result.unallocated_at_100()))
            })
            .collect();
        if pairs.is_empty() {
            continue;
        }
        let n = pairs.len() as f64;
        let d: Vec<f64> = pairs.iter().map(|(x, y)| y - x).collect();
        let diff = d.iter().sum::<f64>() / n;
        let var = if pairs.len() > 1 {
            d.iter().map(|v| (v - diff).powi(2)).sum::<f64>() / (n - 1.0)
        } else {
            0.0
        };
        out.push(Comparison {
            workload: w.to_string(),
            a: pairs.iter().map(|p| p.0).sum::<f64>() / n,
            b: pairs.iter().map(|p| p.1).sum::<f64>() / n,
            diff,
            se: (var / n).sqrt(),
            seeds: pairs.len(),
        });
    }
    out
}

/// The comparison as a Markdown table.
pub fn format_comparison(cmp: &[Comparison], a: &str, b: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| workload | {a}: unalloc. % @100 | {b} | {b} - {a} (pp) | s.e. of per-seed diff | seeds | verdict |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---|");
    for c in cmp {
        let _ = writeln!(
            s,
            "| {} | {:.2} | {:.2} | {:+.2} | {:.2} | {} | {} |",
            c.workload,
            c.a,
            c.b,
            c.diff,
            c.se,
            c.seeds,
            c.verdict(a, b)
        );
    }
    s
}

/// Parses `42`, `42-51` or `42,45,50`.
pub fn parse_seeds(s: &str) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (u64, u64) = (a.trim().parse()?, b.trim().parse()?);
            if b < a {
                bail!("seed range {part:?} is empty");
            }
            out.extend(a..=b);
        } else {
            out.push(part.parse().with_context(|| format!("bad seed {part:?}"))?);
        }
    }
    if out.is_empty() {
        bail!("no seeds in {s:?}");
    }
    Ok(out)
}

/// Reads a node list and pod lists from files.
pub fn load_workloads(nodes: &Path, pods: &[PathBuf]) -> Result<Vec<Workload>> {
    let mut models = GpuModels::default();
    let text =
        std::fs::read_to_string(nodes).with_context(|| format!("reading {}", nodes.display()))?;
    let node_specs = parse_node_csv(&text, &mut models)
        .with_context(|| format!("parsing {}", nodes.display()))?;
    pods.iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let pods = parse_pod_csv(&text, &models)
                .with_context(|| format!("parsing {}", p.display()))?;
            Ok(Workload {
                name: p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                models: models.clone(),
                nodes: node_specs.clone(),
                pods,
            })
        })
        .collect()
}

/// One finished experiment and the labels it is reported under.
#[derive(Debug, Clone)]
pub struct Row {
    /// Workload name.
    pub workload: String,
    /// Policy name as given.
    pub policy_label: String,
    /// Result.
    pub result: ExperimentResult,
}

/// Runs every workload × policy × seed on `threads` threads.
pub fn run_all(
    workloads: &[Workload],
    policies: &[String],
    seeds: &[u64],
    tune: f64,
    threads: usize,
) -> Result<Vec<Row>> {
    for p in policies {
        canonical_policy_name(p)?;
    }
    let frags: Vec<FragModel> = workloads.iter().map(Workload::frag_model).collect();
    let mut jobs = Vec::new();
    for w in 0..workloads.len() {
        for p in policies {
            for &s in seeds {
                jobs.push((w, p.clone(), s));
            }
        }
    }
    // Costly policies first, so that the tail is short.
    jobs.sort_by_key(|(_, p, _)| !p.to_ascii_lowercase().contains("fgd") && !p.contains("gshare"));
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let out: Mutex<Vec<(usize, Row)>> = Mutex::new(Vec::with_capacity(jobs.len()));
    let err: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    let (next_ref, done_ref, out_ref, err_ref) = (&next, &done, &out, &err);
    let (jobs_ref, frags_ref) = (&jobs, &frags);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                let (next, done, out, err) = (next_ref, done_ref, out_ref, err_ref);
                let (jobs, frags) = (jobs_ref, frags_ref);
                scope.spawn(move || loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some((w, p, s)) = jobs.get(k) else { break };
                    let r = run_experiment(&workloads[*w], &frags[*w], p, *s, tune);
                    done.fetch_add(1, Ordering::Relaxed);
                    match r {
                        Ok(result) => out.lock().unwrap_or_else(|e| e.into_inner()).push((
                            k,
                            Row {
                                workload: workloads[*w].name.clone(),
                                policy_label: p.clone(),
                                result,
                            },
                        )),
                        Err(e) => *err.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.into()),
                    }
                })
            })
            .collect();
        progress(&done, jobs.len(), || {
            workers.iter().all(|w| w.is_finished())
        });
    });
    if let Some(e) = err.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let mut rows = out.into_inner().unwrap_or_else(|e| e.into_inner());
    rows.sort_by(|a, b| {
        (
            a.1.workload.as_str(),
            policies.iter().position(|p| *p == a.1.policy_label),
            a.1.result.seed,
        )
            .cmp(&(
                b.1.workload.as_str(),
                policies.iter().position(|p| *p == b.1.policy_label),
                b.1.result.seed,
            ))
            .then(a.0.cmp(&b.0))
    });
    Ok(rows.into_iter().map(|(_, r)| r).collect())
}

/// Shows `done` of `total` experiments on stderr once a second, from the
/// first second on (a shorter run prints nothing), until `finished()`.
/// On a terminal the line is redrawn in place; elsewhere one line a second.
fn progress(done: &AtomicUsize, total: usize, finished: impl Fn() -> bool) {
    use std::io::{IsTerminal as _, Write as _};
    let start = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut shown = false;
    let mut next = std::time::Duration::from_secs(1);
    while !finished() {
        std::thread::sleep(std::time::Duration::from_millis(50));
        if start.elapsed() < next || finished() {
            continue;
        }
        next += std::time::Duration::from_secs(1);
        let n = done.load(Ordering::Relaxed);
        let line = format!(
            "sim placement: {n}/{total} experiments done ({:.0} %), {:.0} s",
            n as f64 * 100.0 / total.max(1) as f64,
            start.elapsed().as_secs_f64()
        );
        let mut e = std::io::stderr().lock();
        let _ = if tty {
            write!(e, "\r{line}")
        } else {
            writeln!(e, "{line}")
        };
        shown = true;
    }
    if shown && tty {
        let _ = writeln!(std::io::stderr());
    }
}

/// Summary of one workload × policy over its seeds.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Workload.
    pub workload: String,
    /// Policy as given.
    pub policy_label: String,
    /// Mean curve over seeds.
    pub mean_curve: Vec<f64>,
    /// Mean unallocated % at 100 % arrived.
    pub unallocated_100: f64,
    /// Mean tasks remapped per 1,000 pods.
    pub remaps_per_1000: f64,
    /// Mean failed pods.
    pub failed: f64,
    /// The paper's mean curve, when known.
    pub paper: Option<Vec<f64>>,
}

/// Groups rows by workload × policy.
pub fn summarise(rows: &[Row], expected: Option<&ExpectedTable>) -> Vec<Summary> {
    let mut out: Vec<Summary> = Vec::new();
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in rows {
        let k = (r.workload.clone(), r.policy_label.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for (w, p) in keys {
        let rs: Vec<&Row> = rows
            .iter()
            .filter(|r| r.workload == w && r.policy_label == p)
            .collect();
        let n = rs.len() as f64;
        let mean_curve = mean_of(rs.iter().map(|r| r.result.curve.as_slice()));
        let paper = expected.and_then(|t| {
            let label = paper_label(rs[0].result.policy)?;
            t.mean_curve(&w, label)
        });
        out.push(Summary {
            unallocated_100: 100.0 - mean_curve[100],
            remaps_per_1000: rs.iter().map(|r| r.result.remaps_per_1000()).sum::<f64>() / n,
            failed: rs.iter().map(|r| r.result.failed as f64).sum::<f64>() / n,
            workload: w,
            policy_label: p,
            mean_curve,
            paper,
        });
    }
    out
}

/// The summaries as JSON (one object per workload x policy).
pub fn summaries_json(summaries: &[Summary]) -> serde_json::Value {
    let round = |v: f64| (v * 100.0).round() / 100.0;
    serde_json::Value::Array(
        summaries
            .iter()
            .map(|x| {
                let d = x
                    .paper
                    .as_ref()
                    .map(|p| CurveDeviation::between(&x.mean_curve, p));
                serde_json::json!({
                    "workload": x.workload,
                    "policy": x.policy_label,
                    "unallocated_pct_at_100": round(x.unallocated_100),
                    "paper_unallocated_pct_at_100": x.paper.as_ref().map(|p| round(100.0 - p[100])),
                    "deviation_at_100": d.map(|d| round(d.at_100)),
                    "deviation_mean": d.map(|d| round(d.mean)),
                    "deviation_max": d.map(|d| round(d.max)),
                    "remaps_per_1000_pods": round(x.remaps_per_1000),
                    "failed_pods_mean": round(x.failed),
                    "mean_curve": x.mean_curve,
                })
            })
            .collect(),
    )
}

/// The printed table.
pub fn format_table(summaries: &[Summary]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<28} {:<16} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8}",
        "workload", "policy", "unalloc%", "paper%", "d@100", "dmean", "dmax", "remap/1k", "failed"
    );
    for x in summaries {
        let (paper, d) = match &x.paper {
            Some(p) => (
                format!("{:.2}", 100.0 - p[100]),
                Some(CurveDeviation::between(&x.mean_curve, p)),
            ),
            None => ("-".to_string(), None),
        };
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        let _ = writeln!(
            s,
            "{:<28} {:<16} {:>9.2} {:>9} {:>8} {:>8} {:>8} {:>9.2} {:>8.0}",
            x.workload,
            x.policy_label,
            x.unallocated_100,
            paper,
            f(d.map(|d| d.at_100)),
            f(d.map(|d| d.mean)),
            f(d.map(|d| d.max)),
            x.remaps_per_1000,
            x.failed
        );
    }
    s
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// A dash pattern per policy besides its colour, so that lines stay apart
/// where they overlap and in grey print.
const DASHES: [&str; 8] = [
    "",
    "7 3",
    "2 2",
    "9 3 2 3",
    "4 4",
    "12 4",
    "1 3",
    "6 2 1 2 1 2",
];

/// The zoomed range of arrived workload, % (where the policies differ).
const ZOOM: (f64, f64) = (85.0, 130.0);

/// One plot panel: data ranges and where it sits.
struct Panel {
    /// Arrived %, first and last shown.
    x0: f64,
    x1: f64,
    /// Allocated %, lowest and highest shown.
    y0: f64,
    y1: f64,
    /// Top-left corner of the plot area, px.
    left: f64,
    top: f64,
}

const PLOT_W: f64 = 520.0;
const PLOT_H: f64 = 260.0;

impl Panel {
    fn x(&self, a: f64) -> f64 {
        self.left + (a - self.x0) / (self.x1 - self.x0) * PLOT_W
    }
    fn y(&self, v: f64) -> f64 {
        self.top + PLOT_H - (v - self.y0) / (self.y1 - self.y0) * PLOT_H
    }
}

/// The lowest allocated % any curve reaches within `x0..=x1`, rounded
/// down to a multiple of 5 (so the zoom shows every curve).
fn zoom_floor(curves: &[&[f64]], x0: f64, x1: f64) -> f64 {
    let lo = curves
        .iter()
        .flat_map(|c| {
            c.iter()
                .enumerate()
                .filter(|(i, _)| (*i as f64) >= x0 && (*i as f64) <= x1)
                .map(|(_, v)| *v)
        })
        .fold(f64::INFINITY, f64::min);
    if lo.is_finite() {
        ((lo / 5.0).floor() * 5.0).clamp(0.0, 95.0)
    } else {
        0.0
    }
}

/// Escapes text for SVG.
fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Hand-written SVG: per workload, the mean allocated GPU % vs arrived %
/// per policy over 0–130 %, then a zoom of 85–130 % where the policies
/// part; the paper's mean curves thin and faded where known. Axes are
/// labelled; each policy has its own colour and dash pattern; the legend
/// is sized to its longest label.
pub fn render_svg(summaries: &[Summary]) -> String {
    let mut workloads: Vec<&str> = Vec::new();
    for x in summaries {
        if !workloads.contains(&x.workload.as_str()) {
            workloads.push(&x.workload);
        }
    }
    let (ml, title_h, gap) = (70.0, 34.0, 70.0);
    let legend_x = ml + PLOT_W + 20.0;
    let longest = summaries
        .iter()
        .map(|x| x.policy_label.chars().count() + 18)
        .max()
        .unwrap_or(10);
    let w = legend_x + 44.0 + longest as f64 * 7.2 + 12.0;
    let block_h = title_h + 2.0 * (PLOT_H + gap);
    let total_h = block_h * workloads.len() as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w:.0}\" height=\"{total_h:.0}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for (wi, wl) in workloads.iter().enumerate() {
        let oy = wi as f64 * block_h;
        let mine: Vec<&Summary> = summaries.iter().filter(|x| x.workload == *wl).collect();
        let _ = writeln!(
            s,
            "<text x=\"{ml}\" y=\"{}\" font-size=\"14\">{}: allocated GPU % vs arrived workload % (faded: the paper's mean)</text>",
            oy + 22.0,
            esc(wl)
        );
        let curves: Vec<&[f64]> = mine
            .iter()
            .flat_map(|x| std::iter::once(x.mean_curve.as_slice()).chain(x.paper.as_deref()))
            .collect();
        let full = Panel {
            x0: 0.0,
            x1: 130.0,
            y0: 0.0,
            y1: 100.0,
            left: ml,
            top: oy + title_h,
        };
        let zoom = Panel {
            x0: ZOOM.0,
            x1: ZOOM.1,
            y0: zoom_floor(&curves, ZOOM.0, ZOOM.1),
            y1: 100.0,
            left: ml,
            top: oy + title_h + PLOT_H + gap,
        };
        for (panel, name, xstep, ystep) in [
            (&full, "0–130 %", 10usize, 20usize),
            (&zoom, "zoom: 85–130 %", 5, 5),
        ] {
            draw_panel(&mut s, panel, name, xstep, ystep, &mine);
        }
        for (pi, sm) in mine.iter().enumerate() {
            let c = COLORS[pi % COLORS.len()];
            let d = DASHES[pi % DASHES.len()];
            let ly = oy + title_h + 14.0 + pi as f64 * 20.0;
            let _ = writeln!(
                s,
                "<line x1=\"{0}\" y1=\"{ly}\" x2=\"{1}\" y2=\"{ly}\" stroke=\"{c}\" stroke-width=\"2.5\" stroke-dasharray=\"{d}\"/><text x=\"{2}\" y=\"{3}\">{4} ({5:.2} % unalloc.)</text>",
                legend_x,
                legend_x + 36.0,
                legend_x + 44.0,
                ly + 4.0,
                esc(&sm.policy_label),
                sm.unallocated_100
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

/// One panel: frame, grid with tick labels, axis labels, the curves.
fn draw_panel(
    s: &mut String,
    p: &Panel,
    name: &str,
    xstep: usize,
    ystep: usize,
    mine: &[&Summary],
) {
    let (top, bottom, right) = (p.top, p.top + PLOT_H, p.left + PLOT_W);
    let _ = writeln!(
        s,
        "<rect x=\"{}\" y=\"{top}\" width=\"{PLOT_W}\" height=\"{PLOT_H}\" fill=\"none\" stroke=\"#333\"/><text x=\"{right}\" y=\"{}\" text-anchor=\"end\" fill=\"#555\">{name}</text>",
        p.left,
        top - 6.0
    );
    for t in (p.x0 as usize..=p.x1 as usize).step_by(xstep) {
        let x = p.x(t as f64);
        let _ = writeln!(s, "<line x1=\"{x:.1}\" y1=\"{top}\" x2=\"{x:.1}\" y2=\"{bottom}\" stroke=\"#eee\"/><text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{t}</text>", bottom + 16.0);
    }
    for v in (p.y0 as usize..=p.y1 as usize).step_by(ystep) {
        let y = p.y(v as f64);
        let _ = writeln!(s, "<line x1=\"{}\" y1=\"{y:.1}\" x2=\"{right}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v}</text>", p.left, p.left - 6.0, y + 4.0);
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">arrived workload, % of the cluster's GPU capacity</text>",
        p.left + PLOT_W / 2.0,
        bottom + 36.0
    );
    let (lx, ly) = (p.left - 44.0, top + PLOT_H / 2.0);
    let _ = writeln!(
        s,
        "<text x=\"{lx}\" y=\"{ly}\" text-anchor=\"middle\" transform=\"rotate(-90 {lx} {ly})\">allocated GPU, %</text>"
    );
    let _ = writeln!(
        s,
        "<clipPath id=\"c{0:.0}\"><rect x=\"{1}\" y=\"{top}\" width=\"{PLOT_W}\" height=\"{PLOT_H}\"/></clipPath><g clip-path=\"url(#c{0:.0})\">",
        top, p.left
    );
    let pts = |curve: &[f64]| {
        curve
            .iter()
            .enumerate()
            .filter(|(i, _)| (*i as f64) >= p.x0 && (*i as f64) <= p.x1)
            .map(|(i, v)| format!("{:.1},{:.1}", p.x(i as f64), p.y(*v)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    for (pi, sm) in mine.iter().enumerate() {
        let c = COLORS[pi % COLORS.len()];
        let d = DASHES[pi % DASHES.len()];
        if let Some(paper) = &sm.paper {
            let _ = writeln!(s, "<polyline fill=\"none\" stroke=\"{c}\" stroke-opacity=\"0.35\" stroke-width=\"1\" stroke-dasharray=\"{d}\" points=\"{}\"/>", pts(paper));
        }
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"1.8\" stroke-dasharray=\"{d}\" points=\"{}\"/>",
            pts(&sm.mean_curve)
        );
    }
    s.push_str("</g>\n");
}

/// Runs the subcommand.
pub fn run(args: SimPlacementArgs) -> Result<()> {
    let seeds = parse_seeds(&args.seeds)?;
    let workloads = match &args.nodes {
        Some(nodes) => load_workloads(nodes, &args.pods)?,
        None => vec![default_workload(args.synthetic_seed)],
    };
    let variants = parse_variants(&args.variant)?;
    let workloads = if variants.is_empty() {
        workloads
    } else {
        variant_workloads(&workloads, &variants, args.variant_seed)?
    };
    if !args.compare.is_empty() && args.compare.len() != 2 {
        bail!(
            "--compare {}: expected two policies, A,B",
            args.compare.join(",")
        );
    }
    if let [a, b] = args.compare.as_slice() {
        for p in [a, b] {
            if !args.policy.contains(p) {
                bail!(
                    "--compare {a},{b}: {p:?} is not among --policy {}",
                    args.policy.join(",")
                );
            }
        }
    }
    let expected_path = args.expected.clone().or_else(|| {
        args.pods
            .first()
            .and_then(|p| p.parent())
            .map(|d| d.join(EXPECTED_REL))
            .filter(|p| p.is_file())
    });
    let expected = match &expected_path {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Some(ExpectedTable::parse(&text)?)
        }
        None => None,
    };
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if args.nodes.is_none() {
        println!("no --nodes/--pods: running the embedded synthetic workload ({DEFAULT_WORKLOAD}, drawn from openb distributions)");
    }
    let start = Instant::now();
    let rows = run_all(&workloads, &args.policy, &seeds, args.tune, threads)?;
    let secs = start.elapsed().as_secs_f64();
    let mut wrote = Wrote::default();
    if let Some(path) = &args.csv {
        let mut text = csv_header();
        text.push('\n');
        for r in &rows {
            text.push_str(&csv_row(
                &r.workload,
                &r.policy_label,
                r.result.tune,
                r.result.seed,
                r.result.total_gpus,
                &r.result.curve,
            ));
            text.push('\n');
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        wrote.push(format!("CSV ({} rows)", rows.len()), path);
    }
    let summaries = summarise(&rows, expected.as_ref());
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&summaries_json(&summaries))?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        wrote.push("JSON summary".into(), path);
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, render_svg(&summaries))
            .with_context(|| format!("writing {}", path.display()))?;
        wrote.push("SVG plot".into(), path);
    }
    println!(
        "unallocated GPU % at 100 % arrived, mean over {} seed(s); d* = |ours - paper| of the mean curve (pp); remap/1k = tasks moved per 1,000 pods",
        seeds.len()
    );
    print!("{}", format_table(&summaries));
    if let [a, b] = args.compare.as_slice() {
        println!(
            "\n{b} vs {a}: unallocated GPU % at 100 % arrived, paired by seed (negative = {b} leaves less)"
        );
        print!("{}", format_comparison(&compare(&rows, a, b), a, b));
    }
    println!(
        "{} experiments in {:.2} s on {} thread(s): {:.2} experiments/s",
        rows.len(),
        secs,
        threads,
        rows.len() as f64 / secs.max(1e-9)
    );
    for (what, path) in &wrote.0 {
        println!("wrote {what}: {}", absolute(path).display());
    }
    Ok(())
}

/// The files a run wrote, to name at its end.
#[derive(Default)]
struct Wrote(Vec<(String, PathBuf)>);

impl Wrote {
    fn push(&mut self, what: String, path: &Path) {
        self.0.push((what, path.to_path_buf()));
    }
}

/// `path` from the root (what a user can open from anywhere).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}
