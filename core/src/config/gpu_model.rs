//! A GPU model of the region's catalog.

use crate::model::Mib;
use serde::{Deserialize, Serialize};

/// One GPU model: what nodes' GPUs and prices refer to by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuModel {
    /// Name, unique in the topology, e.g. `A100-SXM4-80GB`.
    pub name: String,
    /// GPU memory of one GPU, MiB.
    pub memory_mib: Mib,
    /// Host-to-device bandwidth of one GPU (swap-in speed), MiB/s.
    pub h2d_mib_per_s: u64,
}
