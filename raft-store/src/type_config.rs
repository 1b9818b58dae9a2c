//! openraft's type configuration for the region.

use gshare_core::command::{CommandOutcome, RegionCommand};
use serde::{Deserialize, Serialize};
use std::io::Cursor;

use crate::ReplicaNode;

/// The application data of one log entry: commands applied in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandBatch(pub Vec<RegionCommand>);

/// What applying a [`CommandBatch`] produced, one outcome per command.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchOutcome(pub Vec<CommandOutcome>);

openraft::declare_raft_types!(
    /// The region's Raft types: u64 replica ids, [`ReplicaNode`] cards,
    /// [`CommandBatch`] entries, in-memory snapshot bytes, tokio.
    pub TypeConfig:
        D = CommandBatch,
        R = BatchOutcome,
        NodeId = u64,
        Node = ReplicaNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);
