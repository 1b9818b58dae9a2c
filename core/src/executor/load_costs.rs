//! What it costs to bring a function's weights onto a GPU (the same rule
//! as the topology's `[cold_start]` and `[swap]`, see `config::ColdStart`):
//!
//! ```text
//!   swap-in    = swap_setup_us + weights / h2d bandwidth        (weights in host memory)
//!   cold start = cold_setup_us + weights / storage bandwidth    (weights not in host memory:
//!                                                                 start the runtime, read storage)
//! ```
//!
//! docs/serving.md derives the default numbers from the Alibaba GenAI
//! model-load latency distributions.

use crate::model::{Mib, Micros};

/// Parameters of the two ways weights reach a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadCosts {
    /// Host-to-device copy bandwidth of the GPU, MiB per second.
    pub h2d_mib_per_s: u64,
    /// Fixed cost of a swap-in (allocation, pipeline setup), µs.
    pub swap_setup_us: Micros,
    /// Fixed cost of a cold start (runtime start, CUDA context), µs.
    pub cold_setup_us: Micros,
    /// Storage read bandwidth for a cold start, MiB per second.
    pub storage_mib_per_s: u64,
}

impl LoadCosts {
    /// Time to bring `memory_mib` of weights from host memory onto the GPU.
    pub fn swap_in_us(&self, memory_mib: Mib) -> Micros {
        self.swap_setup_us
            .saturating_add(transfer_us(memory_mib, self.h2d_mib_per_s))
    }

    /// Time to bring `memory_mib` of weights from storage onto the GPU.
    pub fn cold_start_us(&self, memory_mib: Mib) -> Micros {
        self.cold_setup_us
            .saturating_add(transfer_us(memory_mib, self.storage_mib_per_s))
    }
}

fn transfer_us(memory_mib: Mib, mib_per_s: u64) -> Micros {
    memory_mib
        .saturating_mul(1_000_000)
        .div_ceil(mib_per_s.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_in_and_cold_start_follow_their_bandwidths() {
        let c = LoadCosts {
            h2d_mib_per_s: 20_000,
            swap_setup_us: 1_000_000,
            cold_setup_us: 2_000_000,
            storage_mib_per_s: 400,
        };
        assert_eq!(c.swap_in_us(8_000), 1_400_000);
        assert_eq!(c.cold_start_us(8_000), 2_000_000 + 20_000_000);
    }
}
