//! A registered node agent and the usage sequence numbers it has sent.

use super::sequence::SequenceCursor;
use crate::model::NodeId;
use serde::{Deserialize, Serialize};
use std::fmt;

/// An agent's id (stable across its restarts: usage dedupe is keyed by it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AgentId(pub String);

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One registered agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRecord {
    /// Its id.
    pub id: AgentId,
    /// The node it runs on.
    pub node: NodeId,
    /// The agent's version string.
    pub version: String,
    /// When it first registered (Unix ms).
    pub first_registered_at: u64,
    /// When it last registered (Unix ms).
    pub registered_at: u64,
    /// The usage sequence numbers already applied.
    pub cursor: SequenceCursor,
}
