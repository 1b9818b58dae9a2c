//! The instances the region assigns to a node.

use crate::model::{FunctionSpec, Slice};
use crate::state::InstanceId;
use serde::{Deserialize, Serialize};

/// One instance a node must host: its function and its slices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignedInstance {
    /// Instance id (region-wide).
    pub instance: InstanceId,
    /// The function it serves (tenant, name, tier, memory, latency profile …).
    pub spec: FunctionSpec,
    /// Function version the spec belongs to.
    pub version: u64,
    /// Its slices on this node's GPUs.
    pub slices: Vec<Slice>,
}

/// The full set of instances for one node, from the replicated state.
///
/// Sent whole (not as a diff) so a reconnecting agent needs no history:
/// instances it hosts and that are missing here are released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Raft index of the state this was read from; an agent ignores an
    /// assignment older than one it has applied.
    pub applied_index: u64,
    /// The instances.
    pub instances: Vec<AssignedInstance>,
}
