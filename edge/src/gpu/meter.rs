//! Live readings of real GPUs (NVML) for heartbeats.

use gshare_core::protocol::GpuStatus;
use nvml_wrapper::Nvml;
use std::sync::Arc;

/// Reads NVML's utilization and memory counters; on simulated GPUs there
/// is nothing to read and every reading is `None`.
#[derive(Clone, Default)]
pub struct GpuMeter {
    nvml: Option<Arc<Nvml>>,
}

impl std::fmt::Debug for GpuMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuMeter")
            .field("nvml", &self.nvml.is_some())
            .finish()
    }
}

/// One GPU's measured counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuReading {
    /// NVML's GPU utilization over its last sample period, percent.
    pub utilization_pct: Option<u32>,
    /// Memory in use on the device (all processes), MiB.
    pub memory_used_mib: Option<u64>,
}

impl GpuMeter {
    /// A meter over `nvml` (`None`: simulated GPUs).
    pub fn new(nvml: Option<Arc<Nvml>>) -> Self {
        GpuMeter { nvml }
    }

    /// Reads GPU `index`. NVML errors are logged and give `None`.
    pub fn read(&self, index: u32) -> GpuReading {
        let Some(nvml) = &self.nvml else {
            return GpuReading::default();
        };
        let device = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(gpu = index, "NVML device: {e}");
                return GpuReading::default();
            }
        };
        let utilization_pct = match device.utilization_rates() {
            Ok(u) => Some(u.gpu),
            Err(e) => {
                tracing::warn!(gpu = index, "NVML utilization: {e}");
                None
            }
        };
        let memory_used_mib = match device.memory_info() {
            Ok(m) => Some(m.used >> 20),
            Err(e) => {
                tracing::warn!(gpu = index, "NVML memory: {e}");
                None
            }
        };
        GpuReading {
            utilization_pct,
            memory_used_mib,
        }
    }

    /// Fills the measured fields of every GPU in `gpus`.
    pub fn fill(&self, gpus: &mut [GpuStatus]) {
        for g in gpus {
            let r = self.read(g.index);
            g.measured_utilization_pct = r.utilization_pct;
            g.measured_memory_used_mib = r.memory_used_mib;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(index: u32) -> GpuStatus {
        GpuStatus {
            index,
            utilization_milli: 500,
            memory_used_mib: 1024,
            resident: vec![],
            queued: 0,
            measured_utilization_pct: Some(99),
            measured_memory_used_mib: Some(99),
        }
    }

    #[test]
    fn simulated_gpus_have_no_measurements_and_keep_the_executor_figures() {
        let meter = GpuMeter::new(None);
        assert_eq!(meter.read(0), GpuReading::default());
        let mut gpus = vec![status(0), status(1)];
        meter.fill(&mut gpus);
        for g in &gpus {
            assert_eq!(g.measured_utilization_pct, None);
            assert_eq!(g.measured_memory_used_mib, None);
            assert_eq!((g.utilization_milli, g.memory_used_mib), (500, 1024));
        }
    }
}
