//! Frames on QUIC streams (cargo feature `net`): the one transport of
//! [`crate::protocol::codec`], used by the region and the node agent alike.
//!
//! ```text
//!   write: Frames::<W>::encode ──▶ SendStream (then finish)
//!   read:  RecvStream ──4 bytes──▶ length ≤ W::MAX_FRAME_BYTES? ──payload──▶ decode
//! ```
//!
//! The length is checked before the payload is read, so a peer announcing
//! a huge frame costs nothing. This module is the only I/O in `core`, and
//! only with the feature; the default build stays pure.
//!
//! The submodule `tls` holds the TLS helpers both binaries share (certificate names,
//! HTTPS configs); its items are re-exported here. With the feature
//! `http-client`, [`http_client`] is the one pooled HTTP/1.1 client (plain
//! or TLS) the binaries share.

mod tls;
pub use tls::*;

#[cfg(feature = "http-client")]
pub mod http_client;

use crate::protocol::codec::{AgentFrames, FrameError, Frames, Wire};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Application close code for a bad frame (both binaries use it).
pub const BAD_FRAME: u32 = 0x10;

/// A frame could not be sent or received.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Oversized or malformed: close the connection.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The stream or connection failed.
    #[error("stream: {0}")]
    Stream(String),
}

impl<W: Wire> Frames<W> {
    /// Writes one frame and finishes the sending side of the stream.
    pub async fn write<T: Serialize>(
        send: &mut quinn::SendStream,
        msg: &T,
    ) -> Result<(), WireError> {
        let bytes = Self::encode(msg)?;
        write_encoded(send, &bytes).await
    }

    /// Writes one frame and leaves the stream open for more (a streamed
    /// reply's frames; its last one is sent with [`Frames::write`]).
    pub async fn write_more<T: Serialize>(
        send: &mut quinn::SendStream,
        msg: &T,
    ) -> Result<(), WireError> {
        let bytes = Self::encode(msg)?;
        send.write_all(&bytes)
            .await
            .map_err(|e| WireError::Stream(e.to_string()))
    }

    /// Reads one frame; an oversized length is refused before the payload is read.
    pub async fn read<T: DeserializeOwned>(recv: &mut quinn::RecvStream) -> Result<T, WireError> {
        let mut head = [0u8; 4];
        recv.read_exact(&mut head)
            .await
            .map_err(|e| WireError::Stream(e.to_string()))?;
        let len = Self::frame_len(&head)?.unwrap_or(0);
        let mut payload = vec![0u8; len];
        recv.read_exact(&mut payload)
            .await
            .map_err(|e| WireError::Stream(e.to_string()))?;
        Ok(Self::decode_payload(&payload)?)
    }
}

/// Writes a frame already encoded (by [`Frames::encode`], which checked
/// its limit) and finishes the stream: encode first to refuse an oversized
/// message before opening a stream for it.
pub async fn write_encoded(send: &mut quinn::SendStream, frame: &[u8]) -> Result<(), WireError> {
    send.write_all(frame)
        .await
        .map_err(|e| WireError::Stream(e.to_string()))?;
    send.finish().map_err(|e| WireError::Stream(e.to_string()))
}

/// Writes one agent-wire frame ([`crate::protocol::AGENT_FRAME_BYTES`]) and finishes the stream.
pub async fn write_frame<T: Serialize>(
    send: &mut quinn::SendStream,
    msg: &T,
) -> Result<(), WireError> {
    AgentFrames::write(send, msg).await
}

/// Writes one agent-wire frame and leaves the stream open for more.
pub async fn write_frame_more<T: Serialize>(
    send: &mut quinn::SendStream,
    msg: &T,
) -> Result<(), WireError> {
    AgentFrames::write_more(send, msg).await
}

/// Reads one agent-wire frame ([`crate::protocol::AGENT_FRAME_BYTES`]).
pub async fn read_frame<T: DeserializeOwned>(recv: &mut quinn::RecvStream) -> Result<T, WireError> {
    AgentFrames::read(recv).await
}
