//! `gshare-gpu-probe`: the agent's own GPU backend, run once, for
//! `tests/gpu/check.sh` on a machine with (or without) a GPU.
//!
//! - `nvml`: discovery exactly as the agent does it ([`discover`] with
//!   `backend = "nvml"`, no fallback) plus the NVML inventory (UUIDs, MIG and
//!   compute modes, PCIe link, driver) and one meter reading per GPU. Prints
//!   one JSON object; `status` is `supported` (GPUs found), `unsupported` (no
//!   NVML here) or `failed` (NVML answered with an error). Exits 0 in all three.
//! - `mps-env`: the environment the `process` driver gives a function process
//!   for a slice ([`ProcessSpec::from_template`] over a runtime template),
//!   one `KEY=VALUE` per line, sorted; the check script starts its CUDA
//!   processes with exactly these variables.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use gshare_core::config::{GpuSource, NvmlFallback, DEFAULT_H2D_MIB_PER_S};
use gshare_edge::gpu::{discover, inventory, GpuError, GpuMeter};
use gshare_edge::runtime::process::{FunctionArgs, ProcessSpec, RuntimeTemplate, SliceLimits};
use serde_json::{json, Value};
use std::path::PathBuf;

/// The agent's GPU backend, run once.
#[derive(Parser)]
#[command(name = "gshare-gpu-probe", version, about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// NVML discovery as the agent reads it, as JSON.
    Nvml {
        /// Host-to-device bandwidth the agent assumes for NVML GPUs, MiB/s
        /// (the agent config's `gpus.nvml_h2d_mib_per_s`).
        #[arg(long, default_value_t = DEFAULT_H2D_MIB_PER_S)]
        h2d_mib_per_s: u64,
    },
    /// The environment the process driver renders for a slice.
    MpsEnv {
        /// A runtime template (`configs/examples/runtimes/*.toml`).
        #[arg(long)]
        template: PathBuf,
        /// Node GPU indices of the slice, comma-separated.
        #[arg(long, default_value = "0", value_delimiter = ',')]
        gpus: Vec<u32>,
        /// Compute per GPU, milli-GPU (1..=1000).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        compute_milli: u32,
        /// GPU memory per GPU, MiB.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        memory_mib: u64,
        /// The GPU's total memory, MiB (for `{memory_fraction}`).
        #[arg(long)]
        gpu_memory_mib: Option<u64>,
    },
}

fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Command::Nvml { h2d_mib_per_s } => {
            println!("{}", nvml_report(h2d_mib_per_s));
            Ok(())
        }
        Command::MpsEnv {
            template,
            gpus,
            compute_milli,
            memory_mib,
            gpu_memory_mib,
        } => {
            let text = std::fs::read_to_string(&template)
                .with_context(|| format!("reading {}", template.display()))?;
            let t = RuntimeTemplate::parse(&text, &template.display().to_string())?;
            let slice = SliceLimits {
                gpus,
                compute_milli,
                memory_mib,
                gpu_memory_mib,
            };
            let spec = ProcessSpec::from_template(
                &t,
                "gpu-check",
                FunctionArgs::model("probe"),
                0,
                slice,
            )?;
            for (k, v) in &spec.env {
                anyhow::ensure!(
                    !v.contains('\n'),
                    "{k}: a value with a line break cannot be printed as KEY=VALUE"
                );
                println!("{k}={v}");
            }
            Ok(())
        }
    }
}

/// Discovery, inventory and one meter reading, as one JSON object.
fn nvml_report(h2d_mib_per_s: u64) -> Value {
    let source = GpuSource::Nvml {
        fallback: NvmlFallback::Error,
        simulated: vec![],
        h2d_mib_per_s,
    };
    let discovered = match discover(&source) {
        Ok(d) => d,
        Err(e @ GpuError::NvmlUnavailable(_)) => {
            return json!({"status": "unsupported", "reason": e.to_string()});
        }
        Err(e) => return json!({"status": "failed", "reason": e.to_string()}),
    };
    let gpus: Vec<Value> = discovered
        .gpus
        .iter()
        .map(|g| {
            json!({
                "index": g.index,
                "model": g.model,
                "memory_mib": g.memory_mib,
                "h2d_mib_per_s": g.h2d_mib_per_s,
            })
        })
        .collect();
    let Some(nvml) = discovered.nvml.clone() else {
        return json!({"status": "failed", "reason": "discovery returned no NVML handle", "gpus": gpus});
    };
    let meter = GpuMeter::new(Some(nvml.clone()));
    let readings: Vec<Value> = discovered
        .gpus
        .iter()
        .map(|g| {
            let r = meter.read(g.index);
            json!({
                "index": g.index,
                "utilization_pct": r.utilization_pct,
                "memory_used_mib": r.memory_used_mib,
            })
        })
        .collect();
    let inventory = match inventory(&nvml) {
        Ok(inv) => serde_json::to_value(inv).unwrap_or(Value::Null),
        Err(e) => json!({"error": e.to_string()}),
    };
    json!({
        "status": "supported",
        "gpus": gpus,
        "inventory": inventory,
        "meter": readings,
    })
}
