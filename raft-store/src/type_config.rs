//! openraft's type configuration for the region.

use gshare_core::command::{CommandOutcome, RegionCommand};
use serde::{Deserialize, Serialize};
use std::io::Cursor;

use crate::ReplicaNode;

/// The application data of one log entry: commands applied in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandBatch(pub Vec<RegionCommand>);

impl CommandBatch {
    /// Stamps every domain command with the leader's proposal time (Unix ms).
    pub fn stamp(&mut self, now_ms: u64) {
        for c in &mut self.0 {
            c.stamp(now_ms);
        }
    }
}

/// What applying a [`CommandBatch`] produced, one outcome per command.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchOutcome(pub Vec<CommandOutcome>);

openraft::declare_raft_types!(
    /// The region's Raft types: u64 replica ids, [`ReplicaNode`] cards,
    /// [`CommandBatch`] entries, in-memory snapshot bytes, tokio with a
    /// seedable random source ([`crate::GshareRuntime`]).
    pub TypeConfig:
        D = CommandBatch,
        R = BatchOutcome,
        NodeId = u64,
        Node = ReplicaNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = crate::GshareRuntime,
);
