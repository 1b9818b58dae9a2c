//! What NVML says about each GPU beyond what placement needs: UUID, MIG
//! mode, compute mode, PCIe link, driver versions. The agent logs it at
//! start; `gshare-gpu-probe nvml` prints it (`tests/gpu/check.sh`).
//!
//! Every query can fail on its own (a GPU without MIG answers
//! `NotSupported`): a failed query leaves its field `None` and adds one line
//! to `unreadable`, and the rest is still read.

use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use serde::Serialize;

/// The node's GPUs as NVML describes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvmlInventory {
    /// The kernel driver's version (`580.159.04`).
    pub driver_version: Option<String>,
    /// The CUDA driver API version it implements, as NVML encodes it
    /// (`13000` = CUDA 13.0).
    pub cuda_driver_version: Option<i32>,
    /// One entry per GPU, index order.
    pub gpus: Vec<GpuDetails>,
    /// Queries that failed, `what: error`.
    pub unreadable: Vec<String>,
}

/// One GPU's identity and modes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuDetails {
    /// NVML index (the agent's GPU index).
    pub index: u32,
    /// `GPU-8c1e…`: stable across reboots and index changes.
    pub uuid: Option<String>,
    /// MIG mode now; `None` where the GPU has no MIG (or it is unreadable).
    pub mig_enabled: Option<bool>,
    /// MIG mode after the next GPU reset.
    pub mig_pending: Option<bool>,
    /// `default`, `exclusive-process` or `prohibited`.
    pub compute_mode: Option<String>,
    /// PCIe generation of the link now (it drops when idle).
    pub pcie_gen: Option<u32>,
    /// PCIe lanes now.
    pub pcie_width: Option<u32>,
    /// Highest PCIe generation the GPU and host support together.
    pub pcie_max_gen: Option<u32>,
    /// Most PCIe lanes.
    pub pcie_max_width: Option<u32>,
}

/// Keeps `Ok`, records `Err` as `what: error`.
fn keep<T>(unreadable: &mut Vec<String>, what: String, r: Result<T, NvmlError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            unreadable.push(format!("{what}: {e}"));
            None
        }
    }
}

fn compute_mode_name(m: ComputeMode) -> &'static str {
    match m {
        ComputeMode::Default => "default",
        ComputeMode::ExclusiveThread => "exclusive-thread",
        ComputeMode::Prohibited => "prohibited",
        ComputeMode::ExclusiveProcess => "exclusive-process",
    }
}

/// Reads the inventory of every GPU NVML lists. Only a failed device count
/// is an error; everything else is recorded in `unreadable`.
pub fn inventory(nvml: &Nvml) -> Result<NvmlInventory, NvmlError> {
    let mut unreadable = Vec::new();
    let driver_version = keep(
        &mut unreadable,
        "driver version".into(),
        nvml.sys_driver_version(),
    );
    let cuda_driver_version = keep(
        &mut unreadable,
        "CUDA driver version".into(),
        nvml.sys_cuda_driver_version(),
    );
    let mut gpus = Vec::new();
    for index in 0..nvml.device_count()? {
        let at = |what: &str| format!("gpu {index} {what}");
        let d = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                unreadable.push(format!("{}: {e}", at("handle")));
                continue;
            }
        };
        let uuid = keep(&mut unreadable, at("uuid"), d.uuid());
        let (mig_enabled, mig_pending) = match d.mig_mode() {
            Ok(m) => (Some(m.current != 0), Some(m.pending != 0)),
            // A GPU without MIG: not a failure, just no MIG.
            Err(NvmlError::NotSupported) => (None, None),
            Err(e) => {
                unreadable.push(format!("{}: {e}", at("MIG mode")));
                (None, None)
            }
        };
        let compute_mode = keep(&mut unreadable, at("compute mode"), d.compute_mode())
            .map(|m| compute_mode_name(m).to_string());
        gpus.push(GpuDetails {
            index,
            uuid,
            mig_enabled,
            mig_pending,
            compute_mode,
            pcie_gen: keep(&mut unreadable, at("PCIe gen"), d.current_pcie_link_gen()),
            pcie_width: keep(
                &mut unreadable,
                at("PCIe width"),
                d.current_pcie_link_width(),
            ),
            pcie_max_gen: keep(&mut unreadable, at("PCIe max gen"), d.max_pcie_link_gen()),
            pcie_max_width: keep(
                &mut unreadable,
                at("PCIe max width"),
                d.max_pcie_link_width(),
            ),
        });
    }
    Ok(NvmlInventory {
        driver_version,
        cuda_driver_version,
        gpus,
        unreadable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_query_is_recorded_and_gives_none() {
        let mut unreadable = Vec::new();
        let v: Option<u32> = keep(
            &mut unreadable,
            "gpu 0 uuid".into(),
            Err(NvmlError::GpuLost),
        );
        assert_eq!(v, None);
        assert_eq!(unreadable.len(), 1);
        assert!(unreadable[0].starts_with("gpu 0 uuid: "), "{unreadable:?}");
        assert_eq!(keep(&mut unreadable, "x".into(), Ok(3)), Some(3));
        assert_eq!(unreadable.len(), 1);
    }

    #[test]
    fn compute_modes_have_the_names_operators_know() {
        assert_eq!(compute_mode_name(ComputeMode::Default), "default");
        assert_eq!(
            compute_mode_name(ComputeMode::ExclusiveProcess),
            "exclusive-process"
        );
    }
}
