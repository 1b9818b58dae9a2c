//! Why a task could not be placed, Nomad `AllocMetric` style: how many nodes
//! were looked at and how many each resource dimension filtered out.

use std::fmt;

/// A resource dimension a node can lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceDimension {
    /// The node's GPU model is not in the task's `gpu_spec` (or it has no GPU).
    GpuModel,
    /// Not enough CPU left.
    Cpu,
    /// Not enough memory left.
    Memory,
    /// Not enough GPUs with the milli-GPU asked for (whole-GPU tasks).
    GpuCount,
    /// No single GPU with enough milli-GPU left (fractional tasks).
    GpuMilli,
}

impl ResourceDimension {
    /// All dimensions, in the order they are checked.
    pub const ALL: [ResourceDimension; 5] = [
        ResourceDimension::GpuModel,
        ResourceDimension::Cpu,
        ResourceDimension::Memory,
        ResourceDimension::GpuCount,
        ResourceDimension::GpuMilli,
    ];

    /// Short name.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceDimension::GpuModel => "gpu model",
            ResourceDimension::Cpu => "cpu",
            ResourceDimension::Memory => "memory",
            ResourceDimension::GpuCount => "gpu count",
            ResourceDimension::GpuMilli => "gpu milli",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Counts of nodes evaluated and filtered, per dimension (first failing
/// dimension of each node).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocMetric {
    /// Nodes evaluated.
    pub nodes_evaluated: u32,
    /// Nodes that fit.
    pub nodes_fit: u32,
    /// Nodes filtered, indexed like [`ResourceDimension::ALL`].
    pub filtered: [u32; 5],
}

impl AllocMetric {
    /// Records one node filtered by `dim`.
    pub fn filter(&mut self, dim: ResourceDimension) {
        self.filtered[dim.index()] += 1;
    }

    /// Nodes filtered by `dim`.
    pub fn filtered_by(&self, dim: ResourceDimension) -> u32 {
        self.filtered[dim.index()]
    }

    /// The dimension that filtered most nodes (the one "exhausted").
    pub fn exhausted(&self) -> Option<ResourceDimension> {
        ResourceDimension::ALL
            .into_iter()
            .filter(|d| self.filtered_by(*d) > 0)
            .max_by_key(|d| (self.filtered_by(*d), std::cmp::Reverse(d.index())))
    }
}

/// A task that fits on no node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no node fits: {metric}")]
pub struct PlacementFailure {
    /// What was filtered, and why.
    pub metric: AllocMetric,
}

impl fmt::Display for AllocMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} nodes evaluated", self.nodes_evaluated)?;
        for d in ResourceDimension::ALL {
            let n = self.filtered_by(d);
            if n > 0 {
                write!(f, ", {} lacked {}", n, d.as_str())?;
            }
        }
        if let Some(d) = self.exhausted() {
            write!(f, " (exhausted: {})", d.as_str())?;
        }
        Ok(())
    }
}
