//! The serving simulator's parameters, taken from a region topology
//! (`configs/examples/topology.toml` is the default the CLI embeds).
//!
//! ```text
//!   Topology ─▶ the largest GPU group of a center pool (first on ties)
//!              ├─ GPU model, memory, H2D bandwidth
//!              ├─ its node's cold-start and swap costs, swap_mib ÷ GPUs = host memory per GPU
//!              └─ the price list and the price of (GPU model, pool kind)
//! ```
//!
//! What a topology does not say is fixed here and documented: the profile
//! of trace models the trace does not describe ([`TRACE_MEMORY_MIB`],
//! [`TRACE_SATURATION_MILLI`]) and the slice counts the `static` baseline
//! tries ([`STATIC_SLICES`]).

use crate::config::{charge, ConfigError, Price, PriceList, Topology, Usage};
use crate::executor::LoadCosts;
use crate::model::{Mib, MilliGpu, PoolKind, Tier};

/// GPU memory of a trace model the trace does not describe: a Stable
/// Diffusion XL class pipeline in fp16 (about 6.5 GiB of weights) with its
/// working set, MiB.
pub const TRACE_MEMORY_MIB: Mib = 8_192;
/// Saturation share of a trace model: diffusion is compute-bound, a request
/// uses the whole GPU.
pub const TRACE_SATURATION_MILLI: MilliGpu = 1000;
/// MIG/MPS-like partitions the `static` baseline tries; it reports its best.
pub const STATIC_SLICES: [u32; 4] = [2, 3, 4, 7];

/// Everything the serving simulator needs besides the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingParams {
    /// GPU model simulated.
    pub gpu_model: String,
    /// Kind of the pool it comes from (selects the price).
    pub pool_kind: PoolKind,
    /// Memory of one GPU, MiB.
    pub gpu_memory_mib: Mib,
    /// Host memory per GPU for swapped-out weights, MiB.
    pub host_memory_mib_per_gpu: Mib,
    /// Swap-in and cold-start costs.
    pub load: LoadCosts,
    /// The price list (currency, unit, tier discounts).
    pub pricing: PriceList,
    /// The price of this GPU model in this pool kind.
    pub price: Price,
    /// GPU memory of a trace function whose model is not described, MiB.
    pub trace_memory_mib: Mib,
    /// Saturation share of a trace function (see [`crate::model::LatencyProfile`]).
    pub trace_saturation_milli: MilliGpu,
    /// Slice counts the `static` baseline tries.
    pub static_slices: Vec<u32>,
}

/// A topology the serving simulator cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServingParamsError {
    /// The topology file itself is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No center pool has a GPU.
    #[error("the topology has no GPU in a center pool to simulate")]
    NoCenterGpu,
    /// The chosen GPU has no price.
    #[error("no price for GPU model {gpu_model} in {pool_kind} pools")]
    NoPrice {
        /// GPU model.
        gpu_model: String,
        /// Pool kind.
        pool_kind: PoolKind,
    },
}

impl ServingParams {
    /// Parse a topology TOML (`file` names it in messages) and map it.
    pub fn from_toml(file: &str, text: &str) -> Result<Self, ServingParamsError> {
        Self::from_topology(&Topology::from_toml(file, text)?)
    }

    /// Map a topology to simulator parameters (see the module docs).
    pub fn from_topology(t: &Topology) -> Result<Self, ServingParamsError> {
        let (node, group) = t
            .pools()
            .iter()
            .filter(|p| p.kind == PoolKind::Center)
            .flat_map(|p| p.nodes.iter())
            .flat_map(|n| n.gpus.iter().map(move |g| (n, g)))
            .fold(
                None,
                |best: Option<(_, &crate::config::GpuGroup)>, (n, g)| match best {
                    Some((_, b)) if b.count >= g.count => best,
                    _ => Some((n, g)),
                },
            )
            .ok_or(ServingParamsError::NoCenterGpu)?;
        let price = t
            .pricing()
            .price(&group.model, node.kind)
            .cloned()
            .ok_or_else(|| ServingParamsError::NoPrice {
                gpu_model: group.model.clone(),
                pool_kind: node.kind,
            })?;
        Ok(Self {
            gpu_model: group.model.clone(),
            pool_kind: node.kind,
            gpu_memory_mib: group.memory_mib,
            host_memory_mib_per_gpu: node.swap_mib / node.gpu_count().max(1) as u64,
            load: LoadCosts {
                h2d_mib_per_s: group.h2d_mib_per_s,
                swap_setup_us: node.swap.setup_us,
                cold_setup_us: node.cold_start.setup_us,
                storage_mib_per_s: node.cold_start.storage_mib_per_s,
            },
            pricing: t.pricing().clone(),
            price,
            trace_memory_mib: TRACE_MEMORY_MIB.min(group.memory_mib),
            trace_saturation_milli: TRACE_SATURATION_MILLI,
            static_slices: STATIC_SLICES.to_vec(),
        })
    }

    /// What `usage` per billed tier (indexed as [`Tier::ALL`]) costs, in
    /// units of the price list (each tier's line rounded once).
    pub fn bill(&self, usage: &[Usage; 4]) -> u64 {
        Tier::ALL
            .iter()
            .zip(usage)
            .map(|(tier, u)| {
                charge(&self.price, self.pricing.discount_bp(*tier), u)
                    .map_or(u64::MAX, |c| c.total)
            })
            .fold(0u64, u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../../../configs/examples/topology.toml");

    #[test]
    fn maps_the_example_topology() {
        let p = ServingParams::from_toml("topology.toml", EXAMPLE).unwrap();
        assert_eq!(p.gpu_model, "A100-SXM4-80GB");
        assert_eq!(p.pool_kind, PoolKind::Center);
        assert_eq!(p.gpu_memory_mib, 81_920);
        assert_eq!(p.host_memory_mib_per_gpu, 786_432 / 8);
        assert!(p.load.cold_start_us(8_192) > 5 * p.load.swap_in_us(8_192));
        // One exclusive GPU-hour of compute, nothing else: the list's gpu_hour.
        let mut usage = [Usage::default(); 4];
        usage[0].compute_milli_gpu_ms = 1_000 * 3_600_000;
        assert_eq!(p.bill(&usage), p.price.gpu_hour);
    }

    #[test]
    fn a_topology_without_center_gpus_is_refused() {
        let edge_only = EXAMPLE.replace("kind = \"center\"", "kind = \"edge\"");
        let e = ServingParams::from_toml("t.toml", &edge_only).unwrap_err();
        assert!(
            matches!(
                e,
                ServingParamsError::NoCenterGpu | ServingParamsError::Config(_)
            ),
            "{e}"
        );
    }
}
