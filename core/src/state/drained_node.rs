//! A node that a topology reload removed: drained, not forgotten.

use crate::config::Node;
use serde::{Deserialize, Serialize};

use super::instance::InstanceId;

/// A node gone from the topology, kept with its last definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainedNode {
    /// The node as the last topology that had it defined it.
    pub node: Node,
    /// When the reload that removed it was applied (Unix ms).
    pub since: u64,
    /// The instances it held, released by that reload.
    pub released: Vec<InstanceId>,
}
