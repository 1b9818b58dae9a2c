//! Replica-to-replica messages and their frames on QUIC streams.
//!
//! One request and one reply per bidirectional stream, each a frame of
//! core's codec ([`gshare_core::protocol::codec`]) at the peer wire's
//! limit, [`PEER_FRAME_BYTES`] (Raft batches and snapshot chunks are bigger
//! than any agent message). The functions here are that wire's; agent
//! messages go through `gshare_core::net::{read_frame, write_frame}` at
//! the agent wire's limit, the same one the agent uses.
//!
//! ```text
//!   ┌──────────────┬──────────────────────────────────┐
//!   │ length: u32  │ bincode 2 (serde) of the message │   length ≤ PEER_FRAME_BYTES
//!   │ big endian   │                                  │
//!   └──────────────┴──────────────────────────────────┘
//! ```
//!
//! A frame that is oversized or does not decode is a [`WireError::Frame`];
//! the receiver closes that connection (code [`BAD_FRAME`]) and nothing else.

use gshare_raft_store::{BatchOutcome, CommandBatch, TypeConfig};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Largest frame accepted, in bytes (snapshot chunks are kept well below).
pub const MAX_FRAME_BYTES: usize = 16 << 20;

/// A request from one replica to another.
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerRequest {
    /// Raft AppendEntries (also heartbeats).
    Append(AppendEntriesRequest<TypeConfig>),
    /// Raft RequestVote.
    Vote(VoteRequest<u64>),
    /// One chunk of a snapshot.
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    /// Client commands forwarded from a follower to the leader.
    Write(CommandBatch),
    /// A follower asks the leader for its read index (Raft §6.4): the log
    /// index every write acknowledged so far is at or below.
    ReadIndex,
    /// An evaluation for the leader's scheduler (`crate::scheduler`).
    Evaluate(crate::scheduler::Evaluation),
    /// Which instances the replica last pushed to `node`'s agent (`None`
    /// in the reply: the agent is not linked there).
    Delivered(gshare_core::model::NodeId),
    /// The reports of the agents linked to the replica
    /// (`crate::agents::region_agents`).
    AgentReports,
    /// How long ago the replica last heard each node's agent (node
    /// liveness, gathered by the leader).
    Heard,
    /// The leader's latest autoscaling decision for a function
    /// (`crate::scheduler::DecisionLookup`; a new last variant: replicas
    /// upgrade together).
    Decision {
        /// The function's tenant.
        tenant: gshare_core::model::TenantId,
        /// Its name.
        function: String,
    },
}

/// Why a forwarded write was not committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum WriteRefusal {
    /// The receiver is not the leader; `leader` is the one it knows of.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader {
        /// The leader's id, if known.
        leader: Option<u64>,
    },
    /// Raft could not commit the write.
    #[error("write failed: {0}")]
    Failed(String),
}

/// The reply to a [`PeerRequest`], same variant.
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerReply {
    /// Reply to [`PeerRequest::Append`].
    Append(Result<AppendEntriesResponse<u64>, RaftError<u64>>),
    /// Reply to [`PeerRequest::Vote`].
    Vote(Result<VoteResponse<u64>, RaftError<u64>>),
    /// Reply to [`PeerRequest::Snapshot`].
    Snapshot(Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>),
    /// Reply to [`PeerRequest::Write`].
    Write(Result<BatchOutcome, WriteRefusal>),
    /// Reply to [`PeerRequest::ReadIndex`]: the index (`None`: empty log).
    ReadIndex(Result<Option<u64>, WriteRefusal>),
    /// Reply to [`PeerRequest::Evaluate`].
    Evaluate(crate::scheduler::EvalResult),
    /// Reply to [`PeerRequest::Delivered`].
    Delivered(Option<Vec<gshare_core::state::InstanceId>>),
    /// Reply to [`PeerRequest::AgentReports`].
    AgentReports(crate::agents::ReplicaAgents),
    /// Reply to [`PeerRequest::Heard`]: (node, ms since last heard).
    Heard(Vec<(gshare_core::model::NodeId, u64)>),
    /// Reply to [`PeerRequest::Decision`].
    Decision(crate::scheduler::DecisionLookup),
}

pub use gshare_core::net::{WireError, BAD_FRAME};
pub use gshare_core::protocol::{FrameError, PeerFrames, PEER_FRAME_BYTES};

/// Encodes `msg` as one peer-wire frame (length prefix included).
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    PeerFrames::encode(msg)
}

/// Decodes a peer-wire frame's payload (without the length prefix);
/// trailing bytes are malformed.
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    PeerFrames::decode_payload(payload)
}

/// Writes one peer-wire frame and finishes the sending side of the stream.
pub async fn write_frame<T: Serialize>(
    send: &mut quinn::SendStream,
    msg: &T,
) -> Result<(), WireError> {
    PeerFrames::write(send, msg).await
}

/// Reads one peer-wire frame, refusing lengths over [`PEER_FRAME_BYTES`]
/// before reading the payload.
pub async fn read_frame<T: DeserializeOwned>(recv: &mut quinn::RecvStream) -> Result<T, WireError> {
    PeerFrames::read(recv).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use gshare_core::command::RegionCommand;

    #[test]
    fn frames_round_trip_and_garbage_is_malformed() {
        let req = PeerRequest::Write(CommandBatch(vec![RegionCommand::V1(
            gshare_core::command::CommandV1::Noop,
        )]));
        let frame = encode_frame(&req).unwrap();
        let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 4);
        match decode_payload::<PeerRequest>(&frame[4..]).unwrap() {
            PeerRequest::Write(b) => assert_eq!(b.0.len(), 1),
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            decode_payload::<PeerRequest>(&[0xff, 0xff, 0xff]),
            Err(FrameError::Malformed { .. })
        ));
        let mut trailing = frame[4..].to_vec();
        trailing.push(0);
        assert!(matches!(
            decode_payload::<PeerRequest>(&trailing),
            Err(FrameError::Malformed { .. })
        ));
    }
}
