//! Frames: `u32` big-endian length ‖ bincode 2 payload, with a size cap.
//!
//! ```text
//!   ┌──────────────┬──────────────────────────────────┐
//!   │ length: u32  │ bincode 2 (serde) of the message │   length ≤ the wire's limit
//!   └──────────────┴──────────────────────────────────┘
//! ```
//!
//! One codec, two named wires: [`AgentWire`] ([`AGENT_FRAME_BYTES`]) between
//! the region and its agents (both sides encode and decode with it, so
//! whatever one side may send the other accepts), and [`PeerWire`]
//! ([`PEER_FRAME_BYTES`]) between replicas (Raft entries and snapshot
//! chunks are bigger than any agent message). [`Frames`] is the codec of
//! one wire: [`AgentFrames`], [`PeerFrames`]; the free functions are the
//! agent wire's.
//!
//! Pure: [`encode_frame`] turns a message into bytes, [`FrameDecoder`]
//! takes bytes as they arrive and yields messages. An oversized length is
//! refused before any payload is buffered; a payload that does not decode
//! (or leaves trailing bytes) is malformed. Either error means: close that
//! connection, and nothing else. Decoding is bounded too: a length inside
//! the payload (a `Vec`, a `String`) that claims more than
//! [`CLAIM_FACTOR`] × the limit is malformed before anything is allocated
//! for it.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::marker::PhantomData;

/// Largest frame payload on the region ↔ agent wire, in bytes. A full
/// usage batch (10,000 records) is well under 2 MiB.
pub const AGENT_FRAME_BYTES: usize = 8 << 20;

/// Largest frame payload between replicas (Raft RPCs), in bytes: twice the
/// agent wire's, for batches of log entries and snapshot chunks.
pub const PEER_FRAME_BYTES: usize = 16 << 20;

/// A frame that cannot be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length is over the wire's limit.
    #[error("frame of {len} bytes is over the {limit}-byte limit")]
    Oversized {
        /// The announced (or encoded) length.
        len: usize,
        /// The wire's limit.
        limit: usize,
    },
    /// The payload does not decode as the expected message.
    #[error("malformed frame: {detail}")]
    Malformed {
        /// What bincode said.
        detail: String,
    },
}

/// How far bincode's claims may exceed a frame's length: it counts an
/// integer at its full width (8 bytes for a `u64` written as one varint
/// byte), so a frame at the limit claims a little more than its length.
/// What a claim may make the decoder allocate before the bytes behind it
/// are read (a `String`'s length) stays within this multiple of the limit.
pub const CLAIM_FACTOR: usize = 2;

/// A wire: its frame limit and the bincode configuration that decodes it.
pub trait Wire {
    /// Largest frame payload accepted, in bytes.
    const MAX_FRAME_BYTES: usize;
    /// The bincode configuration (standard, claims bounded by
    /// [`CLAIM_FACTOR`] × [`Wire::MAX_FRAME_BYTES`]).
    fn bincode() -> impl bincode::config::Config;
}

/// The region ↔ agent wire ([`AGENT_FRAME_BYTES`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentWire;

impl Wire for AgentWire {
    const MAX_FRAME_BYTES: usize = AGENT_FRAME_BYTES;
    fn bincode() -> impl bincode::config::Config {
        bincode::config::standard().with_limit::<{ CLAIM_FACTOR * AGENT_FRAME_BYTES }>()
    }
}

/// The replica ↔ replica wire ([`PEER_FRAME_BYTES`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerWire;

impl Wire for PeerWire {
    const MAX_FRAME_BYTES: usize = PEER_FRAME_BYTES;
    fn bincode() -> impl bincode::config::Config {
        bincode::config::standard().with_limit::<{ CLAIM_FACTOR * PEER_FRAME_BYTES }>()
    }
}

/// The codec of wire `W`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Frames<W: Wire>(PhantomData<W>);

/// The region ↔ agent wire's codec.
pub type AgentFrames = Frames<AgentWire>;

/// The replica ↔ replica wire's codec.
pub type PeerFrames = Frames<PeerWire>;

impl<W: Wire> Frames<W> {
    /// Largest payload accepted, in bytes.
    pub const MAX_BYTES: usize = W::MAX_FRAME_BYTES;

    /// Encodes `msg` as one frame, length prefix included.
    pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
        let limit = W::MAX_FRAME_BYTES;
        let mut out = vec![0u8; 4];
        bincode::serde::encode_into_std_write(msg, &mut out, W::bincode()).map_err(|e| {
            FrameError::Malformed {
                detail: e.to_string(),
            }
        })?;
        let len = out.len().saturating_sub(4);
        let prefix = u32::try_from(len)
            .ok()
            .filter(|_| len <= limit)
            .ok_or(FrameError::Oversized { len, limit })?;
        out[..4].copy_from_slice(&prefix.to_be_bytes());
        Ok(out)
    }

    /// Decodes one payload (without its length prefix); trailing bytes are malformed.
    pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
        if payload.len() > W::MAX_FRAME_BYTES {
            return Err(FrameError::Oversized {
                len: payload.len(),
                limit: W::MAX_FRAME_BYTES,
            });
        }
        let (msg, used) =
            bincode::serde::decode_from_slice(payload, W::bincode()).map_err(|e| {
                FrameError::Malformed {
                    detail: e.to_string(),
                }
            })?;
        if used != payload.len() {
            return Err(FrameError::Malformed {
                detail: format!("{} trailing bytes", payload.len().saturating_sub(used)),
            });
        }
        Ok(msg)
    }

    /// Reads the length prefix of a frame: `Ok(None)` if fewer than 4 bytes.
    pub fn frame_len(bytes: &[u8]) -> Result<Option<usize>, FrameError> {
        let Some(head) = bytes.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len > W::MAX_FRAME_BYTES {
            return Err(FrameError::Oversized {
                len,
                limit: W::MAX_FRAME_BYTES,
            });
        }
        Ok(Some(len))
    }
}

/// Encodes `msg` as one agent-wire frame, length prefix included.
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    AgentFrames::encode(msg)
}

/// Decodes one agent-wire payload (without its length prefix).
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    AgentFrames::decode_payload(payload)
}

/// Reads the length prefix of an agent-wire frame: `Ok(None)` if fewer than 4 bytes.
pub fn frame_len(bytes: &[u8]) -> Result<Option<usize>, FrameError> {
    AgentFrames::frame_len(bytes)
}

/// Incremental decoder of wire `W`'s frames: push bytes as they arrive,
/// pop whole messages ([`FrameDecoder::new`] is the agent wire's,
/// `FrameDecoder::<PeerWire>::default()` the peer wire's).
///
/// After an error the decoder stays failed (the connection must close).
#[derive(Debug)]
pub struct FrameDecoder<W: Wire = AgentWire> {
    buf: Vec<u8>,
    failed: Option<FrameError>,
    wire: PhantomData<W>,
}

impl<W: Wire> Default for FrameDecoder<W> {
    fn default() -> Self {
        Self {
            buf: Vec::new(),
            failed: None,
            wire: PhantomData,
        }
    }
}

impl FrameDecoder<AgentWire> {
    /// An empty decoder of agent-wire frames.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<W: Wire> FrameDecoder<W> {
    /// Appends received bytes. An oversized length is refused here, before
    /// its payload is buffered.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.buf.extend_from_slice(bytes);
        if let Err(e) = Frames::<W>::frame_len(&self.buf) {
            self.buf.clear();
            self.failed = Some(e.clone());
            return Err(e);
        }
        Ok(())
    }

    /// The next whole message, if one is buffered.
    pub fn next_message<T: DeserializeOwned>(&mut self) -> Result<Option<T>, FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let result = match Frames::<W>::frame_len(&self.buf) {
            Ok(Some(len)) if self.buf.len().saturating_sub(4) >= len => {
                let end = 4 + len;
                let msg = Frames::<W>::decode_payload(&self.buf[4..end]);
                self.buf.drain(..end);
                msg.map(Some)
            }
            Ok(_) => return Ok(None),
            Err(e) => Err(e),
        };
        if let Err(e) = &result {
            self.buf.clear();
            self.failed = Some(e.clone());
            return Err(e.clone());
        }
        // A following frame's header may already be oversized.
        if let Err(e) = Frames::<W>::frame_len(&self.buf) {
            self.failed = Some(e.clone());
            self.buf.clear();
        }
        result
    }

    /// Bytes buffered and not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}
