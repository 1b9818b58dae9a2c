//! What it costs to bring a function's weights onto a GPU.
//!
//! ```text
//!   swap-in    = swap_setup_us + bytes / h2d bandwidth          (weights in host memory)
//!   cold start = bytes / storage bandwidth + swap-in            (weights fetched from storage
//!                                                                 into host memory first)
//! ```
//!
//! A cold start is therefore always slower than a swap-in of the same
//! weights; docs/serving.md derives the default numbers from the Alibaba
//! GenAI model-load latency distributions.

use crate::model::{Mib, Micros};

/// Parameters of the two ways weights reach a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadCosts {
    /// Host-to-device copy bandwidth of the GPU, MiB per second.
    pub h2d_mib_per_s: u64,
    /// Fixed cost of a swap-in (allocations, runtime/pipeline setup), µs.
    pub swap_setup_us: Micros,
    /// Storage-to-host bandwidth for a cold start, MiB per second.
    pub storage_mib_per_s: u64,
}

impl LoadCosts {
    /// Time to bring `memory_mib` of weights from host memory onto the GPU.
    pub fn swap_in_us(&self, memory_mib: Mib) -> Micros {
        self.swap_setup_us + transfer_us(memory_mib, self.h2d_mib_per_s)
    }

    /// Time to bring `memory_mib` of weights from storage onto the GPU
    /// (through host memory).
    pub fn cold_start_us(&self, memory_mib: Mib) -> Micros {
        transfer_us(memory_mib, self.storage_mib_per_s) + self.swap_in_us(memory_mib)
    }
}

fn transfer_us(memory_mib: Mib, mib_per_s: u64) -> Micros {
    (memory_mib * 1_000_000).div_ceil(mib_per_s.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_start_is_fetch_plus_swap_in() {
        let c = LoadCosts {
            h2d_mib_per_s: 20_000,
            swap_setup_us: 1_000_000,
            storage_mib_per_s: 400,
        };
        assert_eq!(c.swap_in_us(8_000), 1_400_000);
        assert_eq!(c.cold_start_us(8_000), 20_000_000 + 1_400_000);
    }
}
