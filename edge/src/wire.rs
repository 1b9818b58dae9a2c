//! Frames of core's protocol codec on QUIC streams.

use gshare_core::protocol::codec::{decode_payload, encode_frame, frame_len, FrameError};
use serde::de::DeserializeOwned;
use serde::Serialize;

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

/// Application close code for a bad frame (the same as the region's).
pub const BAD_FRAME: u32 = 0x10;

/// Writes one frame and finishes the stream.
pub async fn write_frame<T: Serialize>(
    send: &mut quinn::SendStream,
    msg: &T,
) -> Result<(), WireError> {
    let bytes = encode_frame(msg)?;
    send.write_all(&bytes)
        .await
        .map_err(|e| WireError::Stream(e.to_string()))?;
    send.finish().map_err(|e| WireError::Stream(e.to_string()))
}

/// Reads one frame; an oversized length is refused before the payload is read.
pub async fn read_frame<T: DeserializeOwned>(recv: &mut quinn::RecvStream) -> Result<T, WireError> {
    let mut head = [0u8; 4];
    recv.read_exact(&mut head)
        .await
        .map_err(|e| WireError::Stream(e.to_string()))?;
    let len = frame_len(&head)?.unwrap_or(0);
    let mut payload = vec![0u8; len];
    recv.read_exact(&mut payload)
        .await
        .map_err(|e| WireError::Stream(e.to_string()))?;
    Ok(decode_payload(&payload)?)
}
