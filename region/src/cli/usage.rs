//! `gsharectl usage` (tenant): metered usage per hour.

use serde_json::Value;

use super::region_client::{cell, RegionArgs};

/// `gsharectl usage [--from ms] [--to ms]`
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    region: RegionArgs,
    /// Start (Unix ms, inclusive hour).
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// End (Unix ms, exclusive; default: all).
    #[arg(long)]
    to: Option<u64>,
}

/// Runs `gsharectl usage`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let mut path = format!("/v1/usage?from={}", a.from);
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
        "GPU-ms (milli)",
        "MiB-ms",
    ]
    .map(String::from)
    .to_vec()];
    for l in v.as_array().into_iter().flatten() {
        let k = &l["key"];
        rows.push(vec![
            cell(&k["hour"]),
            cell(&k["function"]),
            cell(&k["gpu_model"]),
            cell(&k["pool_kind"]),
            cell(&k["tier"]),
            cell(&l["usage"]["invocations"]),
            cell(&l["usage"]["compute_milli_gpu_ms"]),
            cell(&l["usage"]["memory_mib_ms"]),
        ]);
    }
    rows
}
