//! `gsharectl usage` (tenant; operator with `--tenant`): metered usage
//! per hour, in GPU-hours and GiB-hours (`--json`: the integers as metered,
//! milli-GPU·ms and MiB·ms).

use serde_json::Value;

use super::human::{hour, ratio, MIB_MS_PER_GIB_HOUR, MILLI_GPU_MS_PER_GPU_HOUR};
use super::region_client::{cell, RegionArgs};

/// `gsharectl usage [--tenant t] [--from ms] [--to ms]`
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    region: RegionArgs,
    /// Another tenant's usage, also a deleted tenant's (operator token).
    #[arg(long)]
    tenant: Option<String>,
    /// Start (Unix ms, inclusive hour).
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// End (Unix ms, exclusive; default: all).
    #[arg(long)]
    to: Option<u64>,
}

/// Runs `gsharectl usage`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let base = match &a.tenant {
        Some(t) => format!("/v1/tenants/{t}/usage"),
        None => "/v1/usage".into(),
    };
    let mut path = format!("{base}?from={}", a.from);
    if let Some(to) = a.to {
        path.push_str(&format!("&to={to}"));
    }
    let v = a.region.call("GET", &path, None)?;
    a.region.show(&v, table);
    Ok(())
}

fn table(v: &Value) -> Vec<Vec<String>> {
    let mut rows = vec![[
        "HOUR",
        "FUNCTION",
        "GPU MODEL",
        "POOL KIND",
        "TIER",
        "INVOCATIONS",
        "GPU-HOURS",
        "GiB-HOURS",
    ]
    .map(String::from)
    .to_vec()];
    for l in v.as_array().into_iter().flatten() {
        let k = &l["key"];
        rows.push(vec![
            k["hour"].as_u64().map_or_else(|| cell(&k["hour"]), hour),
            cell(&k["function"]),
            cell(&k["gpu_model"]),
            cell(&k["pool_kind"]),
            cell(&k["tier"]),
            cell(&l["usage"]["invocations"]),
            quantity(
                &l["usage"]["compute_milli_gpu_ms"],
                MILLI_GPU_MS_PER_GPU_HOUR,
            ),
            quantity(&l["usage"]["memory_mib_ms"], MIB_MS_PER_GIB_HOUR),
        ]);
    }
    rows
}

fn quantity(v: &Value, per_hour: u64) -> String {
    v.as_u64().map_or_else(|| cell(v), |n| ratio(n, per_hour))
}
