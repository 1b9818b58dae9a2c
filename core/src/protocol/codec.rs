//! Frames: `u32` big-endian length ‖ bincode 2 payload, with a size cap.
//!
//! ```text
//!   ┌──────────────┬──────────────────────────────────┐
//!   │ length: u32  │ bincode 2 (serde) of the message │   length ≤ MAX_FRAME_BYTES
//!   └──────────────┴──────────────────────────────────┘
//! ```
//!
//! Pure: [`encode_frame`] turns a message into bytes, [`FrameDecoder`]
//! takes bytes as they arrive and yields messages. An oversized length is
//! refused before any payload is buffered; a payload that does not decode
//! (or leaves trailing bytes) is malformed. Either error means: close that
//! connection, and nothing else.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Largest frame payload accepted, in bytes. A full usage batch (10,000
/// records) is well under 2 MiB.
pub const MAX_FRAME_BYTES: usize = 8 << 20;

/// A frame that cannot be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length is over [`MAX_FRAME_BYTES`].
    #[error("frame of {len} bytes is over the {MAX_FRAME_BYTES}-byte limit")]
    Oversized {
        /// The announced (or encoded) length.
        len: usize,
    },
    /// The payload does not decode as the expected message.
    #[error("malformed frame: {detail}")]
    Malformed {
        /// What bincode said.
        detail: String,
    },
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

/// Encodes `msg` as one frame, length prefix included.
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let mut out = vec![0u8; 4];
    bincode::serde::encode_into_std_write(msg, &mut out, config()).map_err(|e| {
        FrameError::Malformed {
            detail: e.to_string(),
        }
    })?;
    let len = out.len() - 4;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::Oversized { len });
    }
    out[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(out)
}

/// Decodes one payload (without its length prefix); trailing bytes are malformed.
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    if payload.len() > MAX_FRAME_BYTES {
        return Err(FrameError::Oversized { len: payload.len() });
    }
    let (msg, used) = bincode::serde::decode_from_slice(payload, config()).map_err(|e| {
        FrameError::Malformed {
            detail: e.to_string(),
        }
    })?;
    if used != payload.len() {
        return Err(FrameError::Malformed {
            detail: format!("{} trailing bytes", payload.len() - used),
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
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::Oversized { len });
    }
    Ok(Some(len))
}

/// Incremental decoder: push bytes as they arrive, pop whole messages.
///
/// After an error the decoder stays failed (the connection must close).
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    failed: Option<FrameError>,
}

impl FrameDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes. An oversized length is refused here, before
    /// its payload is buffered.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.buf.extend_from_slice(bytes);
        if let Err(e) = frame_len(&self.buf) {
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
        let result = match frame_len(&self.buf) {
            Ok(Some(len)) if self.buf.len() >= 4 + len => {
                let msg = decode_payload(&self.buf[4..4 + len]);
                self.buf.drain(..4 + len);
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
        if let Err(e) = frame_len(&self.buf) {
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
