//! A node of a pool: host resources, its GPUs, and what loading weights
//! onto them costs.

use super::loading::{ColdStart, SwapCost};
use crate::model::{GpuId, Mib, Micros, NodeId, PoolKind};
use serde::{Deserialize, Serialize};

/// Identical GPUs of one node. A node's GPUs are numbered in file order:
/// the first group holds indices `0..count`, the next continues from there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuGroup {
    /// GPU model name (from the topology's `gpu_models`).
    pub model: String,
    /// Number of GPUs in the group (≥ 1).
    pub count: u32,
    /// GPU memory of each, MiB (the model's unless the node overrides it).
    pub memory_mib: Mib,
    /// Host-to-device bandwidth of each, MiB/s (the model's unless overridden).
    pub h2d_mib_per_s: u64,
}

/// One node, with every default resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// Name, unique in the region.
    pub name: NodeId,
    /// Name of the pool the node belongs to.
    pub pool: String,
    /// Kind of that pool.
    pub kind: PoolKind,
    /// CPU of the node, milli-cores.
    pub cpu_milli: u64,
    /// Host RAM of the node, MiB.
    pub memory_mib: Mib,
    /// Host RAM usable for swapped-out weights, MiB (≤ `memory_mib`).
    pub swap_mib: Mib,
    /// GPUs, in index order.
    pub gpus: Vec<GpuGroup>,
    /// Cost of loading weights from storage on this node.
    pub cold_start: ColdStart,
    /// Fixed cost of a swap on this node.
    pub swap: SwapCost,
}

impl Node {
    /// Number of GPUs of the node.
    pub fn gpu_count(&self) -> u32 {
        self.gpus.iter().map(|g| g.count).sum()
    }

    /// Every GPU of the node with its id, in index order.
    pub fn gpus(&self) -> impl Iterator<Item = (GpuId, &GpuGroup)> + '_ {
        self.gpus
            .iter()
            .flat_map(|g| std::iter::repeat_n(g, g.count as usize))
            .enumerate()
            .map(|(i, g)| {
                (
                    GpuId {
                        node: self.name.clone(),
                        index: i as u32,
                    },
                    g,
                )
            })
    }

    /// The group of GPU `index` of this node, if the node has that GPU.
    pub fn gpu(&self, index: u32) -> Option<&GpuGroup> {
        let mut first = 0u32;
        for g in &self.gpus {
            if index < first + g.count {
                return Some(g);
            }
            first += g.count;
        }
        None
    }

    /// Time to cold-start `weights_mib` of weights on this node.
    pub fn cold_start_us(&self, weights_mib: Mib) -> Micros {
        self.cold_start.time_us(weights_mib)
    }

    /// Time to swap `weights_mib` of weights into (or out of) GPU `index`;
    /// `None` if the node has no such GPU.
    pub fn swap_us(&self, index: u32, weights_mib: Mib) -> Option<Micros> {
        self.gpu(index)
            .map(|g| self.swap.time_us(weights_mib, g.h2d_mib_per_s))
    }
}
