//! The serving simulator's parameters: one GPU model, host memory, load
//! costs, prices per tier and the profile given to trace functions.
//!
//! They come from a small strict TOML file (`configs/examples/serving.toml`
//! is the default the CLI embeds): unknown keys are errors, and every
//! invalid value is reported at once with its key path.

use crate::executor::LoadCosts;
use crate::model::{Mib, Micros, MilliGpu, Tier, WHOLE_GPU};
use serde::Deserialize;

/// Everything the serving simulator needs besides the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingParams {
    /// GPU model name (informational).
    pub gpu_model: String,
    /// Memory of one GPU, MiB.
    pub gpu_memory_mib: Mib,
    /// Host memory per GPU for swapped-out weights, MiB.
    pub host_memory_mib_per_gpu: Mib,
    /// Swap-in and cold-start costs.
    pub load: LoadCosts,
    /// Price of one GPU-hour per tier, in cents:
    /// `[exclusive, guaranteed, burstable, oversubscribed]`.
    pub price_cents_per_gpu_hour: [u64; 4],
    /// GPU memory of a trace function whose model is not described, MiB.
    pub trace_memory_mib: Mib,
    /// Saturation share of a trace function (see [`crate::model::LatencyProfile`]).
    pub trace_saturation_milli: MilliGpu,
    /// Slice counts the `static` baseline tries; it reports its best.
    pub static_slices: Vec<u32>,
}

impl ServingParams {
    /// Price of one GPU-hour of `tier`, cents.
    pub fn price_cents(&self, tier: Tier) -> u64 {
        let i = Tier::ALL.iter().position(|t| *t == tier).unwrap_or(0);
        self.price_cents_per_gpu_hour[i]
    }

    /// Parse and validate a serving TOML document.
    pub fn from_toml(text: &str) -> Result<Self, ServingParamsError> {
        let raw: RawParams =
            toml::from_str(text).map_err(|e| ServingParamsError::Syntax(e.to_string()))?;
        let mut problems = Vec::new();
        let mut positive = |key: &str, v: u64| {
            if v == 0 {
                problems.push(format!("{key}: must be > 0"));
            }
        };
        positive("gpu.memory_mib", raw.gpu.memory_mib);
        positive("gpu.h2d_mib_per_s", raw.gpu.h2d_mib_per_s);
        positive("load.storage_mib_per_s", raw.load.storage_mib_per_s);
        positive("trace_defaults.memory_mib", raw.trace_defaults.memory_mib);
        let sat = raw.trace_defaults.saturation_milli;
        if sat == 0 || sat > WHOLE_GPU {
            problems.push(format!(
                "trace_defaults.saturation_milli: {sat} not in 1..=1000"
            ));
        }
        if raw.trace_defaults.memory_mib > raw.gpu.memory_mib {
            problems.push("trace_defaults.memory_mib: larger than gpu.memory_mib".into());
        }
        if raw.static_baseline.slices.is_empty() {
            problems.push("static_baseline.slices: must list at least one slice count".into());
        }
        for k in &raw.static_baseline.slices {
            if *k < 2 || *k > 64 {
                problems.push(format!("static_baseline.slices: {k} not in 2..=64"));
            }
        }
        let p = &raw.prices;
        if p.oversubscribed > p.burstable
            || p.burstable > p.guaranteed
            || p.guaranteed > p.exclusive
        {
            problems.push(
                "prices: must not increase from exclusive to guaranteed to burstable to oversubscribed"
                    .into(),
            );
        }
        if !problems.is_empty() {
            return Err(ServingParamsError::Invalid(problems));
        }
        Ok(Self {
            gpu_model: raw.gpu.model,
            gpu_memory_mib: raw.gpu.memory_mib,
            host_memory_mib_per_gpu: raw.host.memory_mib_per_gpu,
            load: LoadCosts {
                h2d_mib_per_s: raw.gpu.h2d_mib_per_s,
                swap_setup_us: raw.load.swap_setup_ms * 1_000,
                storage_mib_per_s: raw.load.storage_mib_per_s,
            },
            price_cents_per_gpu_hour: [p.exclusive, p.guaranteed, p.burstable, p.oversubscribed],
            trace_memory_mib: raw.trace_defaults.memory_mib,
            trace_saturation_milli: sat,
            static_slices: raw.static_baseline.slices,
        })
    }

    /// Swap-in time of a trace function with the default profile, µs.
    pub fn trace_swap_in_us(&self) -> Micros {
        self.load.swap_in_us(self.trace_memory_mib)
    }
}

/// A serving TOML document that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServingParamsError {
    /// Not TOML, a missing key, an unknown key or a wrong type.
    #[error("serving parameters: {0}")]
    Syntax(String),
    /// Values that parse but make no sense, all of them.
    #[error("serving parameters: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawParams {
    gpu: RawGpu,
    host: RawHost,
    load: RawLoad,
    prices: RawPrices,
    trace_defaults: RawTraceDefaults,
    static_baseline: RawStatic,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGpu {
    model: String,
    memory_mib: u64,
    h2d_mib_per_s: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    memory_mib_per_gpu: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLoad {
    swap_setup_ms: u64,
    storage_mib_per_s: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrices {
    exclusive: u64,
    guaranteed: u64,
    burstable: u64,
    oversubscribed: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTraceDefaults {
    memory_mib: u64,
    saturation_milli: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStatic {
    slices: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[gpu]
model = "test"
memory_mib = 81920
h2d_mib_per_s = 24000
[host]
memory_mib_per_gpu = 131072
[load]
swap_setup_ms = 1400
storage_mib_per_s = 400
[prices]
exclusive = 400
guaranteed = 300
burstable = 200
oversubscribed = 140
[trace_defaults]
memory_mib = 8192
saturation_milli = 1000
[static_baseline]
slices = [2, 4, 7]
"#;

    #[test]
    fn parses_a_valid_document() {
        let p = ServingParams::from_toml(GOOD).unwrap();
        assert_eq!(p.load.swap_setup_us, 1_400_000);
        assert_eq!(p.price_cents(Tier::Oversubscribed), 140);
        assert_eq!(p.static_slices, vec![2, 4, 7]);
    }

    #[test]
    fn reports_every_problem_and_unknown_keys() {
        let bad = GOOD
            .replace("saturation_milli = 1000", "saturation_milli = 0")
            .replace("slices = [2, 4, 7]", "slices = [1]");
        let e = ServingParams::from_toml(&bad).unwrap_err();
        assert_eq!(
            e,
            ServingParamsError::Invalid(vec![
                "trace_defaults.saturation_milli: 0 not in 1..=1000".into(),
                "static_baseline.slices: 1 not in 2..=64".into(),
            ])
        );
        let unknown = GOOD.replace("[host]", "[host]\nswap = 1");
        assert!(matches!(
            ServingParams::from_toml(&unknown),
            Err(ServingParamsError::Syntax(_))
        ));
    }
}
