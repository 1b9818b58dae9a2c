//! Exact memory accounting of one simulated GPU.

use super::GpuInfo;
use gshare_core::executor::FunctionId;
use gshare_core::model::Mib;
use std::collections::BTreeMap;

/// A load the GPU cannot take, or a release of something it does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccountingError {
    /// Not enough free memory.
    #[error("GPU {gpu}: {function} needs {need} MiB, {free} MiB free")]
    OutOfMemory {
        /// GPU index.
        gpu: u32,
        /// The function.
        function: FunctionId,
        /// MiB asked for.
        need: Mib,
        /// MiB free.
        free: Mib,
    },
    /// Already resident.
    #[error("GPU {gpu}: {function} is already resident")]
    AlreadyResident {
        /// GPU index.
        gpu: u32,
        /// The function.
        function: FunctionId,
    },
    /// Not resident.
    #[error("GPU {gpu}: {function} is not resident")]
    NotResident {
        /// GPU index.
        gpu: u32,
        /// The function.
        function: FunctionId,
    },
}

/// One simulated GPU: who holds how much memory.
#[derive(Debug, Clone)]
pub struct SimulatedGpu {
    info: GpuInfo,
    resident: BTreeMap<FunctionId, Mib>,
    used: Mib,
}

impl SimulatedGpu {
    /// An empty GPU.
    pub fn new(info: GpuInfo) -> Self {
        Self {
            info,
            resident: BTreeMap::new(),
            used: 0,
        }
    }

    /// The GPU.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// Reserves `mib` for `function`'s weights.
    pub fn load(&mut self, function: FunctionId, mib: Mib) -> Result<(), AccountingError> {
        let gpu = self.info.index;
        if self.resident.contains_key(&function) {
            return Err(AccountingError::AlreadyResident { gpu, function });
        }
        let free = self.info.memory_mib - self.used;
        if mib > free {
            return Err(AccountingError::OutOfMemory {
                gpu,
                function,
                need: mib,
                free,
            });
        }
        self.resident.insert(function, mib);
        self.used += mib;
        Ok(())
    }

    /// Frees `function`'s memory.
    pub fn release(&mut self, function: FunctionId) -> Result<Mib, AccountingError> {
        let gpu = self.info.index;
        let mib = self
            .resident
            .remove(&function)
            .ok_or(AccountingError::NotResident { gpu, function })?;
        self.used -= mib;
        Ok(mib)
    }

    /// MiB in use.
    pub fn used_mib(&self) -> Mib {
        self.used
    }

    /// Time to copy `mib` from host memory at this GPU's bandwidth, µs.
    pub fn copy_us(&self, mib: Mib) -> u64 {
        gshare_core::config::transfer_us(mib, self.info.h2d_mib_per_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_every_mib_and_refuses_overcommit() {
        let mut g = SimulatedGpu::new(GpuInfo {
            index: 0,
            model: "g".into(),
            memory_mib: 1000,
            h2d_mib_per_s: 500,
        });
        g.load(FunctionId(1), 600).unwrap();
        assert!(matches!(
            g.load(FunctionId(2), 401),
            Err(AccountingError::OutOfMemory { free: 400, .. })
        ));
        g.load(FunctionId(2), 400).unwrap();
        assert_eq!(g.used_mib(), 1000);
        assert_eq!(g.release(FunctionId(1)), Ok(600));
        assert!(g.release(FunctionId(1)).is_err());
        assert_eq!(g.used_mib(), 400);
        assert_eq!(g.copy_us(1000), 2_000_000);
    }
}
