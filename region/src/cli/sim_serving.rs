//! `gsharectl sim serving`: replay a trace through the executor under
//! gshare and the baselines, side by side, and write JSON (and an SVG).
//!
//! JSON: `{"trace", "slack", "events", "wall_s", "policies": [...]}`; each
//! policy has `policy`, `gpus`, `deadline_attainment`, `p50_ms`, `p99_ms`,
//! `gpu_hours`, `utilization`, `swaps`, `cold_starts`, `cost`, `min_gpus`,
//! and the extra keys `requests`, `met`, `rejected`, `swap_outs`, `remaps`,
//! `unloads`, `static_slices`, `runs`, `events`; `bound` also has
//! `bound_kind`, `bound_min_gpus` and, searched, `edf_min_gpus` (its
//! `min_gpus` is the proven bound). `events` at the top counts
//! every simulated event of every run (searches included); `wall_s` is the
//! wall time of those runs, without loading the trace.

use anyhow::{bail, Context};
use gshare_core::sim::serving::{
    evaluate, GpuCount, LlmSpec, PolicyOutcome, ServingParams, ServingPolicy, ServingTrace,
    SyntheticSpec, MAX_GPUS,
};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Instant;

/// The default topology, identical to `configs/examples/topology.toml`.
pub const DEFAULT_TOPOLOGY: &str = include_str!("../../../configs/examples/topology.toml");

/// Arguments of `gsharectl sim serving`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["trace", "llm_trace", "synthetic"])))]
pub struct Args {
    /// Region topology TOML (GPU model, H2D bandwidth, host memory, cold-start
    /// and swap costs, prices); the largest GPU group of a center pool is
    /// simulated. Default: the embedded configs/examples/topology.toml.
    #[arg(long)]
    pub topology: Option<PathBuf>,
    /// Trace CSV (Alibaba GenAI lora_request_trace, or Azure LLM inference
    /// as one 8B model). One of --trace, --llm-trace and --synthetic is required.
    #[arg(long, conflicts_with_all = ["synthetic", "llm_trace"])]
    pub trace: Option<PathBuf>,
    /// The LLM serving workload: an Azure LLM inference CSV's arrivals and
    /// token counts over --models models of mixed sizes (0.5–14 GiB, Zipf
    /// popularity, seeded by --seed), batched prefill and decode.
    #[arg(long, conflicts_with = "synthetic")]
    pub llm_trace: Option<PathBuf>,
    /// --llm-trace: number of models.
    #[arg(long, default_value_t = 50, requires = "llm_trace")]
    pub models: u32,
    /// Generate a synthetic trace instead.
    #[arg(long)]
    pub synthetic: bool,
    /// Synthetic: number of functions.
    #[arg(long, default_value_t = 1000, requires = "synthetic")]
    pub functions: u32,
    /// Synthetic: number of invocations.
    #[arg(long, default_value_t = 100_000, requires = "synthetic")]
    pub invocations: u64,
    /// Seed of --synthetic and --llm-trace.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Synthetic: mean inter-arrival time, ms.
    #[arg(long, default_value_t = 100.0, requires = "synthetic")]
    pub interarrival_ms: f64,
    /// Policies to compare, comma-separated: exclusive (whole GPUs, cold
    /// starts), exclusive-swap (whole GPUs, host-memory weight cache),
    /// static (fixed slices), gshare, bound (proven lower bound on GPUs,
    /// with the central-queue EDF estimate).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "exclusive,exclusive-swap,static,gshare,bound"
    )]
    pub policy: Vec<String>,
    /// Simulate exactly this many GPUs.
    #[arg(
        long,
        conflicts_with = "min_gpus",
        required_unless_present = "min_gpus"
    )]
    pub gpus: Option<u32>,
    /// Search the smallest GPU count with attainment ≥ 0.99.
    #[arg(long)]
    pub min_gpus: bool,
    /// Cap of the --min-gpus search.
    #[arg(long, default_value_t = MAX_GPUS)]
    pub max_gpus: u32,
    /// Deadline = arrival + slack × service time on a whole GPU.
    #[arg(long, default_value_t = 2.0)]
    pub slack: f64,
    /// Where to write the JSON report (the table is printed to stdout either way).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Where to write an SVG chart.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// Run the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    if !(args.slack.is_finite() && args.slack >= 1.0) {
        bail!("--slack must be ≥ 1 (got {})", args.slack);
    }
    let params = match &args.topology {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            ServingParams::from_toml(&p.display().to_string(), &text)?
        }
        None => ServingParams::from_toml(
            "configs/examples/topology.toml (embedded)",
            DEFAULT_TOPOLOGY,
        )?,
    };
    let policies = args
        .policy
        .iter()
        .map(|p| p.trim().parse::<ServingPolicy>())
        .collect::<Result<Vec<_>, _>>()?;
    if args.models == 0 {
        bail!("--models must be > 0");
    }
    let read = |path: &PathBuf| -> anyhow::Result<(String, String)> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading trace {}", path.display()))?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        Ok((name, text))
    };
    let trace = match (&args.trace, &args.llm_trace) {
        (_, Some(path)) => {
            let (name, text) = read(path)?;
            LlmSpec {
                models: args.models,
                seed: args.seed,
            }
            .build(&name, &text, &params)
            .with_context(|| format!("parsing {}", path.display()))?
        }
        (Some(path), None) => {
            let (name, text) = read(path)?;
            ServingTrace::parse(&name, &text, &params)
                .with_context(|| format!("parsing {}", path.display()))?
        }
        (None, None) => {
            let mut spec = SyntheticSpec::new(args.functions, args.invocations, args.seed);
            spec.mean_interarrival_us = (args.interarrival_ms * 1_000.0).round().max(1.0) as u64;
            spec.generate()
        }
    };
    let gpus = match (args.gpus, args.min_gpus) {
        (Some(n), _) if n > 0 => GpuCount::Fixed(n),
        (Some(_), _) => bail!("--gpus must be > 0"),
        (None, _) => GpuCount::Min {
            max: args.max_gpus.clamp(1, MAX_GPUS),
        },
    };

    let start = Instant::now();
    let outcomes: Vec<PolicyOutcome> = std::thread::scope(|s| {
        let handles: Vec<_> = policies
            .iter()
            .map(|&p| {
                let (trace, params) = (&trace, &params);
                s.spawn(move || evaluate(trace, params, p, gpus, args.slack))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("simulation thread panicked"))
            .collect()
    });
    let wall_s = start.elapsed().as_secs_f64();
    let events: u64 = outcomes.iter().map(|o| o.events).sum();

    let report = json!({
        "trace": trace.name,
        "slack": args.slack,
        "events": events,
        "wall_s": wall_s,
        "events_per_s": events as f64 / wall_s.max(1e-9),
        "requests": trace.requests.len(),
        "functions": trace.functions.len(),
        "gpu_model": params.gpu_model,
        "currency": params.pricing.currency,
        "policies": outcomes.iter().map(policy_json).collect::<Vec<_>>(),
    });
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(svg) = &args.svg {
        std::fs::write(svg, chart(&trace.name, args.slack, &outcomes))
            .with_context(|| format!("writing {}", svg.display()))?;
    }
    // The table goes to stdout; a closed pipe is an error, not a panic.
    let mut table = String::new();
    for o in &outcomes {
        let r = &o.report;
        let searched = match o.min_gpus {
            Some(Some(n)) => n.to_string(),
            Some(None) => "null".into(),
            None => "-".into(),
        };
        if let Some((bound, kind)) = o.bound {
            table += &format!(
                "bound     min_gpus {bound:>6} ({}); EDF estimate (not a bound) min_gpus {searched} (memory packs into {})\n",
                kind.as_str(),
                o.edf_memory_gpus.map_or("-".into(), |n| n.to_string())
            );
        }
        table += &format!(
            "{:<14} gpus {:>5} min_gpus {:>6} attainment {:.4} p99 {:>9.1} ms cost {:>10.2} swaps {} cold {}\n",
            if o.bound.is_some() { "edf-estimate" } else { r.policy.as_str() },
            r.gpus,
            searched,
            r.attainment(),
            r.p99_us as f64 / 1e3,
            r.cost(),
            r.swaps,
            r.cold_starts,
        );
    }
    table += &format!(
        "{events} events in {wall_s:.3} s ({:.2} M events/s)\n",
        events as f64 / wall_s.max(1e-9) / 1e6
    );
    std::io::Write::write_all(&mut std::io::stdout().lock(), table.as_bytes())
        .context("writing the table to stdout")?;
    Ok(())
}

fn policy_json(o: &PolicyOutcome) -> Value {
    let r = &o.report;
    let mut v = json!({
        "policy": r.policy.as_str(),
        "gpus": r.gpus,
        "deadline_attainment": r.attainment(),
        "p50_ms": r.p50_us as f64 / 1e3,
        "p99_ms": r.p99_us as f64 / 1e3,
        "gpu_hours": r.gpu_hours(),
        "utilization": r.utilization(),
        "swaps": r.swaps,
        "cold_starts": r.cold_starts,
        "cost": r.cost(),
        "min_gpus": o.min_gpus.flatten(),
        "requests": r.requests,
        "met": r.met,
        "rejected": r.rejected,
        "swap_outs": r.swap_outs,
        "remaps": r.remaps,
        "unloads": r.unloads,
        "static_slices": r.static_slices,
        "runs": o.runs,
        "events": o.events,
    });
    if let Some((bound, kind)) = o.bound {
        // `min_gpus` is the proven bound; the runs are the EDF estimate's.
        if o.min_gpus.is_some() {
            v["edf_min_gpus"] = json!(o.min_gpus.flatten());
            v["min_gpus"] = json!(bound);
        }
        v["bound_min_gpus"] = json!(bound);
        v["bound_kind"] = json!(kind.as_str());
        v["edf_memory_gpus"] = json!(o.edf_memory_gpus);
    }
    v
}

/// A bar chart: GPUs used (min_gpus when searched) and attainment per policy.
fn chart(trace: &str, slack: f64, outcomes: &[PolicyOutcome]) -> String {
    let (w, bar_h, gap, left) = (640.0, 28.0, 14.0, 110.0);
    let max_gpus = outcomes
        .iter()
        .map(|o| o.report.gpus)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let h = 60.0 + outcomes.len() as f64 * (bar_h + gap);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"13\">\n\
         <text x=\"10\" y=\"22\" font-size=\"15\">{} — slack {slack}: GPUs (bar) and deadline attainment</text>\n",
        escape(trace)
    );
    for (i, o) in outcomes.iter().enumerate() {
        let r = &o.report;
        let y = 40.0 + i as f64 * (bar_h + gap);
        let len = (w - left - 150.0) * r.gpus as f64 / max_gpus;
        let label = match o.min_gpus {
            Some(None) => format!("> {} GPUs", r.gpus),
            _ => format!("{} GPUs", r.gpus),
        };
        s += &format!(
            "<text x=\"10\" y=\"{:.0}\">{}</text><rect x=\"{left}\" y=\"{y:.0}\" width=\"{len:.1}\" height=\"{bar_h}\" fill=\"#4a7ab5\"/>\
             <text x=\"{:.1}\" y=\"{:.0}\">{label}, {:.2} %</text>\n",
            y + bar_h * 0.65,
            r.policy.as_str(),
            left + len + 6.0,
            y + bar_h * 0.65,
            r.attainment() * 100.0
        );
    }
    s + "</svg>\n"
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
