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
    /// Continuous batching (LLM serving), parts per million; 0: each request
    /// runs alone. A request that joins `k` requests of its function already
    /// running on the same instance takes `1 + k × batch_ppm / 10⁶` times
    /// its solo service time (each decode step carries the batch's other
    /// sequences) and adds only `batch_ppm / 10⁶` of its compute share (the
    /// weights each step reads are paid by the batch's first request; see
    /// [`FunctionProfile::batched`]).
    pub batch_ppm: u32,
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

    /// Service time and compute share of a request whose solo service on
    /// `compute` is `solo_us` when it joins `running` requests of its
    /// function on one instance: `(solo_us × (1 + running × batch_ppm / 10⁶),
    /// compute × batch_ppm / 10⁶ rounded up)`; `(solo_us, compute)` with
    /// nothing running or without batching. The caller decides whether a
    /// joiner may take the smaller share (it must not outlive a request
    /// that pays the whole share).
    pub fn batched(&self, solo_us: Micros, compute: MilliGpu, running: u32) -> (Micros, MilliGpu) {
        batched(self.batch_ppm, solo_us, compute, running)
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

/// [`FunctionProfile::batched`] for a function batching at `batch_ppm`.
pub(crate) fn batched(
    batch_ppm: u32,
    solo_us: Micros,
    compute: MilliGpu,
    running: u32,
) -> (Micros, MilliGpu) {
    if batch_ppm == 0 || running == 0 {
        return (solo_us, compute);
    }
    let ppm = u128::from(batch_ppm);
    let extra = u128::from(solo_us) * u128::from(running) * ppm / 1_000_000;
    let service = Micros::try_from(u128::from(solo_us) + extra).unwrap_or(Micros::MAX);
    let share = (u128::from(compute) * ppm).div_ceil(1_000_000).max(1);
    (
        service,
        MilliGpu::try_from(share).unwrap_or(compute).min(compute),
    )
}
