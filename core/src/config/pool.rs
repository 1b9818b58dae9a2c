//! A pool: a group of nodes of one kind (a datacenter or an edge site).

use super::node::Node;
use crate::model::PoolKind;
use serde::{Deserialize, Serialize};

/// One pool, with its nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    /// Name, unique in the region (what `edge:<pool>` preferences name).
    pub name: String,
    /// Center or edge.
    pub kind: PoolKind,
    /// The pool's nodes (at least one).
    pub nodes: Vec<Node>,
}

impl Pool {
    /// Number of GPUs in the pool.
    pub fn gpu_count(&self) -> u32 {
        self.nodes.iter().map(Node::gpu_count).sum()
    }
}
