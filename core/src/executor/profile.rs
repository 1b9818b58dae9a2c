//! What the executor must know about a function to serve it.

use crate::model::{LatencyProfile, Mib, Micros, MilliGpu, Tier, WHOLE_GPU};

/// The executor's view of one function: its tier, the GPU memory one
/// instance holds (weights plus working set, also the bytes a swap moves)
/// and the compute share beyond which its requests get no faster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionProfile {
    /// Sharing tier bought by the tenant.
    pub tier: Tier,
    /// GPU memory of one instance, MiB; also the size of its weights in host memory.
    pub memory_mib: Mib,
    /// Compute share (milli-GPU) beyond which a request gets no faster
    /// (see [`LatencyProfile`]).
    pub saturation_milli: MilliGpu,
}

impl FunctionProfile {
    /// Service time of a request that takes `full_gpu_us` on a whole GPU when
    /// it runs on `compute_milli`, by the latency model of [`LatencyProfile`].
    pub fn service_us(&self, full_gpu_us: Micros, compute_milli: MilliGpu) -> Micros {
        LatencyProfile {
            full_gpu_us,
            saturation_milli: self.saturation_milli,
        }
        .service_us(compute_milli)
    }

    /// The compute share a request of this function asks for on a
    /// fine-grained GPU: the whole GPU for `exclusive`, otherwise its
    /// saturation share (more would not make it faster).
    pub fn request_compute(&self) -> MilliGpu {
        if self.tier == Tier::Exclusive {
            WHOLE_GPU
        } else {
            self.saturation_milli.clamp(1, WHOLE_GPU)
        }
    }
}
