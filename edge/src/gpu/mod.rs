//! GPU backends: where the node's GPUs come from and how their memory is
//! accounted.
//!
//! - `simulated`: GPUs from the config; [`SimulatedGpu`] accounts every
//!   MiB exactly and a load takes the time its bytes need at the GPU's
//!   host-to-device bandwidth (the executor's `LoadCosts`).
//! - `nvml`: GPUs discovered through NVML (model, memory); with no driver
//!   NVML fails cleanly and the config's `nvml_fallback` decides.
//!   [`GpuMeter`] reads NVML's utilization and memory counters for heartbeats;
//!   [`inventory`] reads UUIDs, MIG and compute modes and the PCIe link.

mod discovery;
mod inventory;
mod meter;
mod simulated;

pub use discovery::{discover, is_unavailable, Discovered, GpuError};
pub use inventory::{inventory, GpuDetails, NvmlInventory};
pub use meter::{GpuMeter, GpuReading};
pub use simulated::{AccountingError, SimulatedGpu};

use gshare_core::model::Mib;

/// One GPU of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Index on the node.
    pub index: u32,
    /// Model name.
    pub model: String,
    /// Memory, MiB.
    pub memory_mib: Mib,
    /// Host-to-device bandwidth, MiB/s.
    pub h2d_mib_per_s: u64,
}
