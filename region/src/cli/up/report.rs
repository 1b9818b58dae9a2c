//! What `gsharectl up` prints about the demo: tables of deadline
//! attainment, GPU utilization and bills.

use std::collections::BTreeMap;

use std::time::Duration;

use super::demo::DemoFunction;
use super::gpu_usage::GpuUsage;
use super::instances::Trace;
use super::layout::Layout;
use super::load::{self, LoadReport};
use crate::cli::region_client::print_table;

/// A table with its rows indented by two spaces.
pub fn print_indented(rows: &[Vec<String>]) {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut r = r.clone();
            if let Some(first) = r.first_mut() {
                *first = format!("  {first}");
            }
            r
        })
        .collect();
    print_table(&rows);
}

/// Attainment overall, by tier, the functions that missed, errors by status.
pub fn print_attainment(r: &LoadReport) {
    println!(
        "up: deadline attainment (answered 200 within the deadline) over {:.1} s:",
        r.elapsed.as_secs_f64()
    );
    let mut rows = vec![[
        "TIER",
        "INVOCATIONS",
        "WITHIN",
        "LATE",
        "ERRORS",
        "ATTAINMENT",
    ]
    .map(String::from)
    .to_vec()];
    let row = |name: &str, a: &load::Attainment| {
        vec![
            name.to_string(),
            a.invocations.to_string(),
            a.within.to_string(),
            a.late.to_string(),
            a.errors.to_string(),
            format!("{:.3}", a.fraction()),
        ]
    };
    for (tier, a) in &r.by_tier {
        rows.push(row(tier.as_str(), a));
    }
    rows.push(row("all", &r.overall));
    print_indented(&rows);
    let misses: Vec<String> = r
        .by_function
        .iter()
        .filter(|(_, a)| a.within < a.invocations)
        .map(|(f, a)| format!("{f} {}/{}", a.invocations - a.within, a.invocations))
        .collect();
    if !misses.is_empty() {
        println!("  missed deadlines: {}", misses.join(", "));
    }
    if !r.statuses.is_empty() {
        let s: Vec<String> = r
            .statuses
            .iter()
            .map(|(code, n)| match code {
                0 => format!("no answer: {n}"),
                c => format!("HTTP {c}: {n}"),
            })
            .collect();
        println!("  errors by status: {}", s.join(", "));
    }
}

/// Mean utilization and memory per node and GPU, swaps per agent.
pub fn print_gpu_usage(u: &GpuUsage, layout: &Layout) {
    println!("up: GPU utilization during the load (mean of the agents' heartbeats):");
    let mut rows = vec![[
        "NODE",
        "POOL",
        "GPU",
        "UTILIZATION",
        "MEMORY MiB",
        "SAMPLES",
    ]
    .map(String::from)
    .to_vec()];
    for ((node, gpu), s) in &u.gpus {
        let pool = layout
            .agents
            .iter()
            .find(|a| &a.node == node)
            .map_or("", |a| a.pool.as_str());
        rows.push(vec![
            node.clone(),
            pool.to_string(),
            gpu.to_string(),
            format!("{:.1}%", s.mean_utilization_pct()),
            s.mean_memory_mib().to_string(),
            s.samples.to_string(),
        ]);
    }
    print_indented(&rows);
    let swaps: Vec<String> = u
        .swaps
        .iter()
        .map(|(n, s)| {
            format!(
                "{n}: {} swap-in, {} swap-out, {} cold start, {} move",
                s.swap_in, s.swap_out, s.cold_start, s.moves
            )
        })
        .collect();
    if !swaps.is_empty() {
        println!("  swaps: {}", swaps.join("; "));
    }
}

/// Each tenant's bill in the price list's unit and currency.
pub fn print_bills(bills: &BTreeMap<&'static str, Option<u64>>, layout: &Layout) {
    let pricing = layout.topology.pricing();
    println!(
        "up: bills (metered usage × price, {}; usage arrives from the agents' meters):",
        pricing.unit
    );
    let mut rows = vec![[
        "TENANT".to_string(),
        pricing.unit.to_uppercase(),
        pricing.currency.clone(),
    ]
    .to_vec()];
    for (t, total) in bills {
        rows.push(match total {
            Some(v) => vec![
                t.to_string(),
                v.to_string(),
                format!(
                    "{:.6}",
                    *v as f64 / pricing.units_per_currency.max(1) as f64
                ),
            ],
            None => vec![t.to_string(), "-".into(), "(not readable)".into()],
        });
    }
    print_indented(&rows);
}

/// What the autoscaler did to the demo's scaling functions, as sampled
/// from the replicated state: only what was seen (a scale-out or a scale to
/// zero that no sample caught is not claimed). Times are seconds since
/// the functions were deployed; `load_began` is when the load started.
pub fn print_scaling(
    functions: &[DemoFunction],
    traces: &BTreeMap<String, Trace>,
    load_began: Option<Duration>,
) {
    if functions.is_empty() {
        return;
    }
    let since_load = load_began.map_or(String::new(), |d| {
        format!("; the load began at {:.1} s", d.as_secs_f64())
    });
    println!(
        "up: scaling (instances in the replicated state, sampled every 250 ms; seconds since \
         deploy{since_load}):"
    );
    let mut rows = vec![[
        "FUNCTION", "MIN-MAX", "SAMPLES", "START", "PEAK", "PEAK AT", "ZERO AT", "LAST",
    ]
    .map(String::from)
    .to_vec()];
    for f in functions {
        let t = traces.get(&f.id()).cloned().unwrap_or_default();
        let secs = |d: Duration| format!("{:.1}", d.as_secs_f64());
        let (peak, peak_at) = t.peak().map_or(("-".into(), "-".into()), |(n, at)| {
            (n.to_string(), secs(at))
        });
        rows.push(vec![
            f.id(),
            format!("{}-{}", f.instances.0, f.instances.1),
            t.samples.len().to_string(),
            t.first().map_or("-".into(), |n| n.to_string()),
            peak,
            peak_at,
            t.reached_zero().map_or("-".into(), secs),
            t.samples
                .last()
                .map_or("-".into(), |s| s.instances.to_string()),
        ]);
    }
    print_indented(&rows);
    for f in functions {
        let t = traces.get(&f.id()).cloned().unwrap_or_default();
        let (Some(first), Some((peak, at))) = (t.first(), t.peak()) else {
            println!("  {}: no sample of its instances", f.id());
            continue;
        };
        if peak > first.max(1) {
            println!(
                "  {}: scaled out from {} to {peak} instances (first seen at {:.1} s)",
                f.id(),
                first.max(1),
                at.as_secs_f64()
            );
        } else if f.instances.0 > 0 {
            println!("  {}: did not scale out (peak {peak})", f.id());
        }
        if f.instances.0 == 0 {
            match t.reached_zero() {
                Some(z) => println!(
                    "  {}: scaled to zero at {:.1} s (idle timeout {} s)",
                    f.id(),
                    z.as_secs_f64(),
                    f.idle_timeout_s
                ),
                None => println!(
                    "  {}: was not seen at zero after serving (last count {})",
                    f.id(),
                    t.samples.last().map_or(0, |s| s.instances)
                ),
            }
        }
    }
}
