//! The static description of one node as its executor sees it.

use super::{ExecutorRules, LoadCosts};
use crate::model::Mib;

/// GPUs, memories and rules of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeConfig {
    /// Number of GPUs on the node (all of one model).
    pub gpus: u32,
    /// Memory of each GPU, MiB.
    pub gpu_memory_mib: Mib,
    /// Host memory available for swapped-out weights, MiB.
    pub host_memory_mib: Mib,
    /// Swap-in and cold-start costs.
    pub load: LoadCosts,
    /// Sharing rules (gshare or a baseline).
    pub rules: ExecutorRules,
}
