//! Replica-to-replica messages and their frames on QUIC streams.
//!
//! One request and one reply per bidirectional stream, each a frame:
//!
//! ```text
//!   ┌──────────────┬──────────────────────────────────┐
//!   │ length: u32  │ bincode 2 (serde) of the message │   length ≤ MAX_FRAME_BYTES
//!   │ big endian   │                                  │
//!   └──────────────┴──────────────────────────────────┘
//! ```
//!
//! A frame that is oversized or does not decode is a [`FrameError`]; the
//! receiver closes that connection and nothing else.

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
}

/// A frame that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The announced length is over [`MAX_FRAME_BYTES`].
    #[error("frame of {len} bytes is over the {MAX_FRAME_BYTES}-byte limit")]
    Oversized {
        /// The announced length.
        len: usize,
    },
    /// The payload does not decode as the expected message.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// The stream ended or failed.
    #[error("stream: {0}")]
    Stream(String),
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

/// Encodes `msg` as one frame (length prefix included).
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let mut out = vec![0u8; 4];
    bincode::serde::encode_into_std_write(msg, &mut out, config())
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    let len = out.len() - 4;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::Oversized { len });
    }
    out[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(out)
}

/// Decodes a frame's payload (without the length prefix); trailing bytes are malformed.
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    let (msg, used) = bincode::serde::decode_from_slice(payload, config())
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    if used != payload.len() {
        return Err(FrameError::Malformed(format!(
            "{} trailing bytes",
            payload.len() - used
        )));
    }
    Ok(msg)
}

/// Writes one frame and finishes the sending side of the stream.
pub async fn write_frame<T: Serialize>(
    send: &mut quinn::SendStream,
    msg: &T,
) -> Result<(), FrameError> {
    let bytes = encode_frame(msg)?;
    send.write_all(&bytes)
        .await
        .map_err(|e| FrameError::Stream(e.to_string()))?;
    send.finish()
        .map_err(|e| FrameError::Stream(e.to_string()))?;
    Ok(())
}

/// Reads one frame, refusing lengths over the cap before reading the payload.
pub async fn read_frame<T: DeserializeOwned>(
    recv: &mut quinn::RecvStream,
) -> Result<T, FrameError> {
    let mut len = [0u8; 4];
    recv.read_exact(&mut len)
        .await
        .map_err(|e| FrameError::Stream(e.to_string()))?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::Oversized { len });
    }
    let mut payload = vec![0u8; len];
    recv.read_exact(&mut payload)
        .await
        .map_err(|e| FrameError::Stream(e.to_string()))?;
    decode_payload(&payload)
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
            Err(FrameError::Malformed(_))
        ));
        let mut trailing = frame[4..].to_vec();
        trailing.push(0);
        assert!(matches!(
            decode_payload::<PeerRequest>(&trailing),
            Err(FrameError::Malformed(_))
        ));
    }
}
