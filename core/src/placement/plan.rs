//! A placement plan: the node, the GPUs inside it, and (for `gshare`) the
//! fractional tasks to move first.

use super::cluster::{TaskId, MAX_GPUS_PER_NODE};

/// A set of GPU indices inside one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GpuSet(u32);

impl GpuSet {
    /// The empty set (CPU-only tasks).
    pub const EMPTY: GpuSet = GpuSet(0);

    /// The set holding only GPU `g`.
    pub fn one(g: usize) -> Self {
        GpuSet(1 << g)
    }

    /// This set plus GPU `g`.
    pub fn with(self, g: usize) -> Self {
        GpuSet(self.0 | (1 << g))
    }

    /// Number of GPUs in the set.
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// True when empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether GPU `g` is in the set.
    pub fn contains(self, g: usize) -> bool {
        self.0 & (1 << g) != 0
    }

    /// GPU indices in increasing order.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        (0..MAX_GPUS_PER_NODE).filter(move |&g| self.0 & (1 << g) != 0)
    }
}

/// Move fractional task `task` from GPU `from` to GPU `to` of the same node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remap {
    /// The task moved.
    pub task: TaskId,
    /// Its GPU before.
    pub from: u8,
    /// Its GPU after.
    pub to: u8,
}

/// Where a task goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Node index.
    pub node: usize,
    /// GPUs inside the node (empty for CPU-only tasks).
    pub gpus: GpuSet,
    /// Fractional tasks on the same node to move before binding (only
    /// `gshare`, only when the task would otherwise not fit).
    pub remaps: Vec<Remap>,
}
