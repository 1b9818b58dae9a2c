//! An invocation's request body on a replica: read whole, or streamed to
//! the agent (or the peer replica) as the client sends it.
//!
//! ```text
//!   client ─▶ actix payload ─▶ pass_on task (running count ≤ max_request_bytes,
//!                                  no pause over body_idle_timeout_ms)
//!                                  │ channel of BodyPart (BODY_PARTS held)
//!                                  ▼
//!        BodyStream::take ─▶ QUIC: InvokeStreamed, InvokeBodyChunk…, InvokeBodyEnd
//!                        └─▶ HTTP to a peer: the body chunked (or with its length)
//! ```
//!
//! A body whose `Content-Length` is at most [`WHOLE_BODY`] (core's, the
//! agent's ingress reads such a body whole too) is read whole
//! first, as before: it can go to another node after a try that ran
//! nothing. Any other (chunked, or longer) streams, and can be sent once:
//! once it left for an agent or a peer, the invocation is not tried on
//! another node ([`RequestBodySource::left`]).

use actix_web::web;
use gshare_core::net::http_client::{stream_body, BodyCut, RequestBody};
pub(crate) use gshare_core::net::http_client::{BodyLimits, BodyStop, Upload, WHOLE_BODY};
use gshare_core::net::write_frame_more;
use gshare_core::protocol::{RegionMessage, RegionMessageV1, MAX_BODY_CHUNK};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// QUIC reset code of a streamed body that was cut (the agent then aborts
/// the call).
pub(crate) const BODY_CUT: u32 = 0x11;

/// The request body of one invocation on this replica.
pub(crate) struct RequestBodySource {
    /// Read whole (sent again as often as needed).
    whole: Option<web::Bytes>,
    /// Streamed: here until it is sent.
    streamed: RefCell<Option<RequestBody>>,
    /// How reading the streamed body goes.
    upload: Rc<Cell<Upload>>,
}

impl RequestBodySource {
    /// A body read whole.
    pub(crate) fn whole(body: web::Bytes) -> Self {
        Self {
            whole: Some(body),
            streamed: RefCell::new(None),
            upload: Rc::new(Cell::new(Upload::Whole)),
        }
    }

    /// The body as it arrives (`len`: its announced length), taken
    /// within `limits` by a task on this worker.
    pub(crate) fn streamed(payload: web::Payload, len: Option<u64>, limits: BodyLimits) -> Self {
        let (body, upload) = stream_body(payload, len, limits);
        Self {
            whole: None,
            streamed: RefCell::new(Some(body)),
            upload,
        }
    }

    /// The body to send; `None` once a streamed one left.
    pub(crate) fn take(&self) -> Option<RequestBody> {
        match &self.whole {
            Some(b) => Some(RequestBody::whole(b.clone())),
            None => self.streamed.borrow_mut().take(),
        }
    }

    /// A streamed body that did not leave (its request was never sent).
    pub(crate) fn give_back(&self, body: RequestBody) {
        if self.whole.is_none() {
            *self.streamed.borrow_mut() = Some(body);
        }
    }

    /// The whole body's bytes (`None`: it streams).
    pub(crate) fn bytes(&self) -> Option<&web::Bytes> {
        self.whole.as_ref()
    }

    /// A streamed body that left: it cannot go to another node.
    pub(crate) fn left(&self) -> bool {
        self.whole.is_none() && self.streamed.borrow().is_none()
    }

    /// How reading it went.
    pub(crate) fn upload(&self) -> Upload {
        self.upload.get()
    }
}

/// Sends a streamed body on a forward's QUIC stream (after its
/// `InvokeStreamed`): [`RegionMessageV1::InvokeBodyChunk`]s of at most
/// [`MAX_BODY_CHUNK`], then [`RegionMessageV1::InvokeBodyEnd`] (which
/// finishes the stream). A cut body resets the stream ([`BODY_CUT`]); an
/// agent that stops reading (its call ended) ends it.
pub(crate) async fn send_body(mut send: quinn::SendStream, id: u64, mut body: RequestBody) {
    let stopped = send.stopped();
    tokio::pin!(stopped);
    loop {
        let next = tokio::select! {
            n = body.next() => n,
            _ = &mut stopped => return,
        };
        match next {
            Some(Ok(data)) => {
                for part in data.chunks(MAX_BODY_CHUNK) {
                    let chunk = RegionMessageV1::InvokeBodyChunk {
                        id,
                        data: part.to_vec(),
                    };
                    if write_frame_more(&mut send, &RegionMessage::v1(chunk))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
            Some(Err(BodyCut)) => {
                let _ = send.reset(quinn::VarInt::from_u32(BODY_CUT));
                return;
            }
            None => {
                let end = RegionMessage::v1(RegionMessageV1::InvokeBodyEnd { id });
                let _ = gshare_core::net::write_frame(&mut send, &end).await;
                return;
            }
        }
    }
}
