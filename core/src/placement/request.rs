//! A task's resource request, as one row of the openb pod list.

/// The GPU models a task may run on, as a mask over [`super::GpuModels`] ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuSpec(u64);

impl GpuSpec {
    /// No constraint: any GPU model.
    pub const ANY: GpuSpec = GpuSpec(u64::MAX);

    /// Only the models whose ids are in `ids`. An empty list admits no
    /// model (a constraint naming only unknown models fits nowhere, as in
    /// the FGD simulator).
    pub fn only(ids: &[u8]) -> Self {
        GpuSpec(ids.iter().fold(0u64, |m, &i| m | (1u64 << i)))
    }

    /// A spec from a raw mask (see [`GpuSpec::mask`]).
    pub fn from_mask(mask: u64) -> Self {
        GpuSpec(mask)
    }

    /// Whether a node of GPU model `model` is acceptable (`None` = a
    /// CPU-only node, acceptable only without constraint).
    pub fn admits(self, model: Option<u8>) -> bool {
        match model {
            Some(m) => self.0 & (1u64 << m) != 0,
            None => self == GpuSpec::ANY,
        }
    }

    /// True when the task names no model.
    pub fn is_any(self) -> bool {
        self == GpuSpec::ANY
    }

    /// The raw mask.
    pub fn mask(self) -> u64 {
        self.0
    }
}

/// What one task asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRequest {
    /// Task name (the trace's `name`).
    pub name: String,
    /// CPU request in milli-CPU.
    pub cpu_milli: u32,
    /// Memory request in MiB.
    pub memory_mib: u64,
    /// Number of GPUs (0 = CPU-only).
    pub num_gpu: u8,
    /// Milli-GPU per GPU (`1000` = whole GPUs; below 1000 only with
    /// `num_gpu == 1`). Zero when `num_gpu == 0`.
    pub gpu_milli: u16,
    /// Acceptable GPU models.
    pub gpu_spec: GpuSpec,
}

impl PodRequest {
    /// True for a GPU-sharing task (one GPU, less than all of it).
    pub fn is_fractional(&self) -> bool {
        self.num_gpu == 1 && self.gpu_milli < 1000 && self.gpu_milli > 0
    }

    /// Total milli-GPU asked for (`num_gpu × gpu_milli`).
    pub fn total_milli(&self) -> u64 {
        self.num_gpu as u64 * self.gpu_milli as u64
    }

    /// True when the task asks for at least some GPU.
    pub fn wants_gpu(&self) -> bool {
        self.num_gpu > 0 && self.gpu_milli > 0
    }
}
