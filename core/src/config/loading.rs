//! What it costs to bring a function's weights onto a GPU: a cold start
//! (from storage) or a swap-in (from host memory).
//!
//! ```text
//!   storage ──cold start: setup_us + MiB ÷ storage_mib_per_s──▶ GPU
//!   host RAM ──swap-in:   setup_us + MiB ÷ h2d_mib_per_s──────▶ GPU
//!   GPU ──────swap-out:   setup_us + MiB ÷ h2d_mib_per_s──────▶ host RAM
//! ```
//!
//! A cold start pays the runtime's start (process, CUDA context, framework)
//! and reads the weights from storage; it is paid whenever the weights are
//! not already in the node's host memory. A swap moves weights that are in
//! host memory over PCIe at the GPU's host-to-device bandwidth (the
//! device-to-host direction is taken to be as fast: PCIe is symmetric).
//! All times are whole microseconds, rounded up.

use crate::model::{Mib, Micros};
use serde::{Deserialize, Serialize};

/// Loading weights from storage onto a GPU (the slow path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColdStart {
    /// Fixed cost of every cold start (runtime start, CUDA context, ...), µs.
    pub setup_us: Micros,
    /// Read bandwidth of the storage the weights come from, MiB/s (≥ 1).
    pub storage_mib_per_s: u64,
}

impl ColdStart {
    /// Time of a cold start of `weights_mib` of weights.
    pub fn time_us(&self, weights_mib: Mib) -> Micros {
        self.setup_us
            .saturating_add(transfer_us(weights_mib, self.storage_mib_per_s))
    }
}

/// Moving weights between host memory and a GPU (the fast path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwapCost {
    /// Fixed cost of every swap-in or swap-out (allocation, pinning, launch), µs.
    pub setup_us: Micros,
}

impl SwapCost {
    /// Time to swap `weights_mib` in (or out) over a link of `h2d_mib_per_s`.
    pub fn time_us(&self, weights_mib: Mib, h2d_mib_per_s: u64) -> Micros {
        self.setup_us
            .saturating_add(transfer_us(weights_mib, h2d_mib_per_s))
    }
}

/// `mib / mib_per_s` in microseconds, rounded up (a zero bandwidth counts as 1 MiB/s).
pub fn transfer_us(mib: Mib, mib_per_s: u64) -> Micros {
    let us = (mib as u128 * 1_000_000).div_ceil(mib_per_s.max(1) as u128);
    u64::try_from(us).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_start_is_setup_plus_bytes_over_storage_bandwidth() {
        let c = ColdStart {
            setup_us: 1_500_000,
            storage_mib_per_s: 2048,
        };
        // 10 GiB at 2 GiB/s = 5 s, plus 1.5 s setup.
        assert_eq!(c.time_us(10 * 1024), 6_500_000);
        assert_eq!(c.time_us(0), 1_500_000);
    }

    #[test]
    fn swap_is_setup_plus_bytes_over_h2d_rounded_up() {
        let s = SwapCost { setup_us: 2_000 };
        // 1 MiB at 3 MiB/s = 333_333.33 µs, rounded up.
        assert_eq!(s.time_us(1, 3), 2_000 + 333_334);
        // 24 GiB at 24 GiB/s = 1 s.
        assert_eq!(s.time_us(24 * 1024, 24 * 1024), 1_002_000);
    }
}
