//! Finding the node's GPUs: from the config (`simulated`) or NVML.

use super::GpuInfo;
use gshare_core::config::{GpuSource, NvmlFallback, SimulatedGpus};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::sync::Arc;

/// GPUs could not be found.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// NVML is not usable here and the config says `nvml_fallback = "error"`.
    #[error(
        "NVML unavailable ({0}); set gpus.nvml_fallback = \"simulated\" to run on simulated GPUs"
    )]
    NvmlUnavailable(String),
    /// NVML answered, but with an error.
    #[error("NVML: {0}")]
    Nvml(#[from] NvmlError),
    /// NVML found no GPU.
    #[error("NVML found no GPU")]
    NoGpus,
}

/// What discovery found.
pub struct Discovered {
    /// The GPUs, index order.
    pub gpus: Vec<GpuInfo>,
    /// The NVML handle, when the GPUs are real (for utilization readings).
    pub nvml: Option<Arc<Nvml>>,
    /// Set when NVML was unavailable and the simulated fallback was taken.
    pub fallback_warning: Option<String>,
}

impl std::fmt::Debug for Discovered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovered")
            .field("gpus", &self.gpus)
            .field("nvml", &self.nvml.is_some())
            .field("fallback_warning", &self.fallback_warning)
            .finish()
    }
}

fn simulated(groups: &[SimulatedGpus]) -> Vec<GpuInfo> {
    let mut out = Vec::new();
    for g in groups {
        for _ in 0..g.count {
            out.push(GpuInfo {
                index: out.len() as u32,
                model: g.model.clone(),
                memory_mib: g.memory_mib,
                h2d_mib_per_s: g.h2d_mib_per_s,
            });
        }
    }
    out
}

/// NVML errors that mean "no NVML on this machine" rather than a fault.
pub fn is_unavailable(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::LibloadingError(_)
            | NvmlError::DriverNotLoaded
            | NvmlError::NoPermission
            | NvmlError::LibraryNotFound
            | NvmlError::FailedToLoadSymbol(_)
    )
}

fn nvml_gpus(nvml: &Nvml, h2d_mib_per_s: u64) -> Result<Vec<GpuInfo>, NvmlError> {
    let mut out = Vec::new();
    for index in 0..nvml.device_count()? {
        let d = nvml.device_by_index(index)?;
        out.push(GpuInfo {
            index,
            model: d.name()?,
            memory_mib: d.memory_info()?.total >> 20,
            h2d_mib_per_s,
        });
    }
    Ok(out)
}

/// Finds the GPUs `source` describes.
pub fn discover(source: &GpuSource) -> Result<Discovered, GpuError> {
    match source {
        GpuSource::Simulated(groups) => Ok(Discovered {
            gpus: simulated(groups),
            nvml: None,
            fallback_warning: None,
        }),
        GpuSource::Nvml {
            fallback,
            simulated: groups,
            h2d_mib_per_s,
        } => {
            let unavailable = match Nvml::init() {
                Ok(nvml) => {
                    let gpus = nvml_gpus(&nvml, *h2d_mib_per_s)?;
                    if gpus.is_empty() {
                        return Err(GpuError::NoGpus);
                    }
                    return Ok(Discovered {
                        gpus,
                        nvml: Some(Arc::new(nvml)),
                        fallback_warning: None,
                    });
                }
                Err(e) if is_unavailable(&e) => e.to_string(),
                Err(e) => return Err(GpuError::Nvml(e)),
            };
            match fallback {
                NvmlFallback::Error => Err(GpuError::NvmlUnavailable(unavailable)),
                NvmlFallback::Simulated => Ok(Discovered {
                    gpus: simulated(groups),
                    nvml: None,
                    fallback_warning: Some(format!(
                        "NVML unavailable ({unavailable}); running on simulated GPUs"
                    )),
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups() -> Vec<SimulatedGpus> {
        vec![SimulatedGpus {
            model: "g".into(),
            memory_mib: 100,
            h2d_mib_per_s: 10,
            count: 3,
        }]
    }

    #[test]
    fn simulated_gpus_are_numbered_in_order() {
        let d = discover(&GpuSource::Simulated(groups())).unwrap();
        assert_eq!(
            d.gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert!(d.fallback_warning.is_none());
    }

    /// On a machine without an NVIDIA driver (like CI), NVML fails cleanly
    /// and the config decides; with a driver, real GPUs are found.
    #[test]
    fn nvml_without_a_driver_follows_the_fallback() {
        let err = discover(&GpuSource::Nvml {
            fallback: NvmlFallback::Error,
            simulated: vec![],
            h2d_mib_per_s: 1,
        });
        let fb = discover(&GpuSource::Nvml {
            fallback: NvmlFallback::Simulated,
            simulated: groups(),
            h2d_mib_per_s: 1,
        })
        .unwrap();
        match err {
            Ok(real) => {
                assert!(real.nvml.is_some() && !real.gpus.is_empty());
                assert!(fb.nvml.is_some());
            }
            Err(e) => {
                assert!(matches!(e, GpuError::NvmlUnavailable(_)), "{e}");
                assert_eq!(fb.gpus.len(), 3);
                assert!(fb.fallback_warning.unwrap().contains("NVML unavailable"));
            }
        }
    }
}
