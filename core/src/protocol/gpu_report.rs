//! What an agent tells the region about its GPUs.

use crate::model::{Mib, MilliGpu};
use crate::state::InstanceId;
use serde::{Deserialize, Serialize};

/// One GPU of the node, as discovered (NVML) or configured (simulated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeGpu {
    /// Index on the node.
    pub index: u32,
    /// GPU model name (as in the topology's catalog).
    pub model: String,
    /// GPU memory, MiB.
    pub memory_mib: Mib,
}

/// Live state of one GPU, sent in every heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuStatus {
    /// Index on the node.
    pub index: u32,
    /// Compute in use (milli-GPU, may exceed 1000 while overcommitted).
    pub utilization_milli: MilliGpu,
    /// GPU memory held by resident instances, MiB.
    pub memory_used_mib: Mib,
    /// Instances whose weights are on this GPU now.
    pub resident: Vec<InstanceId>,
    /// Requests queued on this GPU.
    pub queued: u32,
    /// NVML's measured GPU utilization, percent (`None`: simulated GPU or
    /// the reading failed).
    pub measured_utilization_pct: Option<u32>,
    /// NVML's measured device memory in use (all processes), MiB (`None`:
    /// simulated GPU or the reading failed).
    pub measured_memory_used_mib: Option<Mib>,
}
