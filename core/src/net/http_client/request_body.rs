//! A request's body for [`super::HttpClient`]: whole, or streamed from a
//! channel as it arrives (a client's upload passed on while it is sent).
//!
//! ```text
//!   sender ──BodyPart::Data──▶ channel ──▶ RequestBody::poll_frame ──▶ hyper (chunked)
//!          ──BodyPart::End───▶            end of the body
//!   sender dropped without End            BodyCut: hyper aborts the request
//! ```
//!
//! A server reads a client's body into it with [`pass_body_on`] (or
//! whole, when it is small, with [`read_whole`]) within [`BodyLimits`]:
//! a body over the cap, one that pauses longer than the idle timeout and
//! one that breaks off stop there ([`BodyStop`]), and the call answers
//! with [`BodyStop::refusal`].
//!
//! A streamed body can be sent once. [`RequestBody::returnable`] gives it
//! back when it is dropped before its first byte was taken (a connect
//! that failed), so a caller may try elsewhere; once a byte was taken it
//! cannot.

use super::Bytes;
use crate::protocol::{InvokeError, DEFAULT_BODY_IDLE_TIMEOUT_MS, DEFAULT_MAX_REQUEST_BYTES};
use hyper::body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// One piece of a streamed request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyPart {
    /// Bytes of the body, in order.
    Data(Bytes),
    /// The body is complete.
    End,
}

/// A streamed body's sender went away without [`BodyPart::End`]: the body
/// is incomplete (the client left, or it was over a limit), and the
/// request carrying it must not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request body was cut before its end")]
pub struct BodyCut;

/// Why [`RequestBody::collect`] gave no body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CollectError {
    /// The body was cut.
    #[error(transparent)]
    Cut(#[from] BodyCut),
    /// The body was over the limit.
    #[error("request body over {0} bytes")]
    TooLarge(usize),
}

/// A request body: whole, or a channel of [`BodyPart`]s.
pub struct RequestBody {
    inner: Inner,
}

enum Inner {
    Whole(Option<Bytes>),
    Streamed(Streamed),
}

struct Streamed {
    rx: Option<mpsc::Receiver<BodyPart>>,
    /// Its length when the sender announced one (sent as the request's
    /// `Content-Length`: a server that reads no chunked body still gets it).
    len: Option<u64>,
    /// Bytes taken from the channel.
    taken: u64,
    ended: bool,
    /// Where the body goes back when dropped before its first byte.
    give_back: Option<oneshot::Sender<RequestBody>>,
}

impl Drop for Streamed {
    fn drop(&mut self) {
        if self.taken == 0 && !self.ended {
            if let (Some(rx), Some(back)) = (self.rx.take(), self.give_back.take()) {
                let _ = back.send(RequestBody::streamed(rx, self.len));
            }
        }
    }
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Inner::Whole(b) => write!(
                f,
                "RequestBody::Whole({} bytes)",
                b.as_ref().map_or(0, Bytes::len)
            ),
            Inner::Streamed(s) => write!(f, "RequestBody::Streamed({} bytes taken)", s.taken),
        }
    }
}

impl Default for RequestBody {
    /// An empty whole body.
    fn default() -> Self {
        Self::whole(Bytes::new())
    }
}

impl From<Vec<u8>> for RequestBody {
    fn from(body: Vec<u8>) -> Self {
        Self::whole(body)
    }
}

/// The largest body, announced by its `Content-Length`, that a server
/// reads whole before it passes the request on ([`read_whole`]); a longer
/// or chunked one streams ([`pass_body_on`]). Whole, it skips the channel
/// and the task that pass a body on, and a replica can send it to another
/// node after a try that ran nothing.
pub const WHOLE_BODY: usize = 64 << 10;

/// What a server takes of a client's request body: at most `max_bytes`,
/// and no pause longer than `idle` between its bytes (the config's
/// `max_request_bytes` and `body_idle_timeout_ms`, the agent's and the
/// replica's alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// Most bytes in all.
    pub max_bytes: usize,
    /// Longest wait for the body's next bytes.
    pub idle: Duration,
}

impl Default for BodyLimits {
    /// [`DEFAULT_MAX_REQUEST_BYTES`] and [`DEFAULT_BODY_IDLE_TIMEOUT_MS`].
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_REQUEST_BYTES,
            idle: Duration::from_millis(DEFAULT_BODY_IDLE_TIMEOUT_MS),
        }
    }
}

/// Why a client's request body was cut before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyStop {
    /// Over [`BodyLimits::max_bytes`] after `passed` bytes were passed on.
    OverCap {
        /// Bytes passed on before.
        passed: u64,
    },
    /// No bytes for [`BodyLimits::idle`] after `passed` bytes.
    Stalled {
        /// Bytes passed on before.
        passed: u64,
    },
    /// The client's body broke off (its connection, a malformed chunk).
    Broken,
}

impl BodyStop {
    /// The error a call answers with when its body stopped so: `413
    /// body_too_large`, `408 body_timeout` or `400 bad_request`.
    pub fn refusal(self, limits: &BodyLimits) -> InvokeError {
        match self {
            BodyStop::OverCap { passed } => InvokeError::BodyTooLarge {
                cap: limits.max_bytes as u64,
                passed,
            },
            BodyStop::Stalled { passed } => InvokeError::BodyTimeout {
                idle_ms: u64::try_from(limits.idle.as_millis()).unwrap_or(u64::MAX),
                passed,
            },
            BodyStop::Broken => InvokeError::BodyBroken,
        }
    }
}

/// How passing a request body on as it arrives went ([`pass_body_on`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upload {
    /// Still reading (or nobody takes it any more).
    Reading,
    /// Passed on whole.
    Whole,
    /// Cut before its end.
    Stopped(BodyStop),
}

/// Parts of a request body held between its sender and the function (the
/// sender is read only as fast as the function takes them).
pub const BODY_PARTS: usize = 16;

/// A server's request body (`incoming`; `len`: its announced length) as a
/// [`RequestBody`] channel, passed on by [`pass_body_on`] in a task of
/// the current thread's local set (an actix worker's), with the upload's
/// state. Nothing is buffered beyond [`BODY_PARTS`] chunks.
pub fn stream_body<S, E>(
    incoming: S,
    len: Option<u64>,
    limits: BodyLimits,
) -> (RequestBody, std::rc::Rc<std::cell::Cell<Upload>>)
where
    S: futures_core::Stream<Item = Result<Bytes, E>> + Unpin + 'static,
    E: std::fmt::Display + 'static,
{
    let (tx, body) = RequestBody::channel(BODY_PARTS, len);
    let upload = std::rc::Rc::new(std::cell::Cell::new(Upload::Reading));
    let passing = pass_body_on(incoming, tx, limits, upload.clone());
    tokio::task::spawn_local(async move {
        if let Some(e) = passing.await {
            tracing::debug!("request body broke off: {e}");
        }
    });
    (body, upload)
}

/// Passes the chunks of a server's request body (`incoming`, e.g. actix's
/// payload) on to `tx` as they come, within `limits`, keeping `upload` up
/// to date; stops when nobody takes them any more (`tx` closed). A body
/// over the cap, one whose next bytes do not come within `limits.idle`
/// (the time `tx` takes to accept a chunk is not counted: a slow function
/// is not the client's pause) or one that broke off is cut: `tx` is
/// dropped without [`BodyPart::End`]. Returns the error a broken body
/// ended with.
pub async fn pass_body_on<S, E>(
    mut incoming: S,
    tx: mpsc::Sender<BodyPart>,
    limits: BodyLimits,
    upload: std::rc::Rc<std::cell::Cell<Upload>>,
) -> Option<E>
where
    S: futures_core::Stream<Item = Result<Bytes, E>> + Unpin,
{
    let mut passed = 0usize;
    loop {
        let next = std::future::poll_fn(|cx| Pin::new(&mut incoming).poll_next(cx));
        let item = tokio::select! {
            item = next => item,
            // The call ended: nobody reads the rest.
            () = tx.closed() => return None,
            () = tokio::time::sleep(limits.idle) => {
                upload.set(Upload::Stopped(BodyStop::Stalled { passed: passed as u64 }));
                return None;
            }
        };
        match item {
            None => {
                upload.set(Upload::Whole);
                let _ = tx.send(BodyPart::End).await;
                return None;
            }
            Some(Err(e)) => {
                upload.set(Upload::Stopped(BodyStop::Broken));
                return Some(e);
            }
            Some(Ok(chunk)) => {
                if chunk.len() > limits.max_bytes.saturating_sub(passed) {
                    upload.set(Upload::Stopped(BodyStop::OverCap {
                        passed: passed as u64,
                    }));
                    return None;
                }
                passed = passed.saturating_add(chunk.len());
                if tx.send(BodyPart::Data(chunk)).await.is_err() {
                    return None;
                }
            }
        }
    }
}

/// Reads a server's request body (`incoming`) whole within `limits`, for a
/// body announced at most [`WHOLE_BODY`] long: no channel, no task. Over
/// the cap is [`BodyStop::OverCap`] with nothing passed on (the call never
/// started); a pause over `limits.idle` and a body that broke off stop it
/// as in [`pass_body_on`] (the error of a broken body is logged by the
/// caller's reading of [`BodyStop::Broken`]: it is not kept).
pub async fn read_whole<S, E>(mut incoming: S, limits: BodyLimits) -> Result<Bytes, BodyStop>
where
    S: futures_core::Stream<Item = Result<Bytes, E>> + Unpin,
{
    let mut first: Option<Bytes> = None;
    let mut more: Vec<u8> = Vec::new();
    loop {
        let next = std::future::poll_fn(|cx| Pin::new(&mut incoming).poll_next(cx));
        let had = first.as_ref().map_or(0, Bytes::len) + more.len();
        let item = match tokio::time::timeout(limits.idle, next).await {
            Ok(item) => item,
            Err(_) => return Err(BodyStop::Stalled { passed: had as u64 }),
        };
        match item {
            None => {
                return Ok(match first {
                    None => Bytes::new(),
                    Some(b) if more.is_empty() => b,
                    Some(b) => {
                        let mut all = b.to_vec();
                        all.extend_from_slice(&more);
                        Bytes::from(all)
                    }
                })
            }
            Some(Err(_)) => return Err(BodyStop::Broken),
            Some(Ok(chunk)) => {
                if chunk.len() > limits.max_bytes.saturating_sub(had) {
                    return Err(BodyStop::OverCap { passed: 0 });
                }
                // The common body comes in one chunk: kept without a copy.
                match &first {
                    None => first = Some(chunk),
                    Some(_) => more.extend_from_slice(&chunk),
                }
            }
        }
    }
}

/// The length of a request's body as its head announces it: its
/// `Content-Length`; 0 where an HTTP/1 request has neither that nor a
/// `Transfer-Encoding` (RFC 9112 §6.3: it has no body, e.g. most GETs);
/// else unknown (`None`: chunked, or HTTP/2 without a length). A bodyless
/// request is then sent on whole (and may be retried elsewhere), not as a
/// stream of nothing.
pub fn announced_len(
    content_length: Option<&str>,
    transfer_encoding: bool,
    http1: bool,
) -> Option<u64> {
    match content_length.map(str::trim) {
        Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => v.parse().ok(),
        Some(_) => None,
        None if http1 && !transfer_encoding => Some(0),
        None => None,
    }
}

impl RequestBody {
    /// A body known whole.
    pub fn whole(body: impl Into<Bytes>) -> Self {
        Self {
            inner: Inner::Whole(Some(body.into())),
        }
    }

    /// A body that comes on `rx` ([`BodyPart::End`] ends it; a channel
    /// closed without it cuts it), `len` bytes long when known (then sent
    /// with that `Content-Length`, else chunked).
    pub fn streamed(rx: mpsc::Receiver<BodyPart>, len: Option<u64>) -> Self {
        Self {
            inner: Inner::Streamed(Streamed {
                rx: Some(rx),
                len,
                taken: 0,
                ended: false,
                give_back: None,
            }),
        }
    }

    /// A streamed body (`len` bytes when known) and its sender, `capacity`
    /// parts in flight.
    pub fn channel(capacity: usize, len: Option<u64>) -> (mpsc::Sender<BodyPart>, Self) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (tx, Self::streamed(rx, len))
    }

    /// The body's length when known (whole, or announced).
    pub fn known_len(&self) -> Option<u64> {
        match &self.inner {
            Inner::Whole(b) => Some(b.as_ref().map_or(0, |b| b.len() as u64)),
            Inner::Streamed(s) => s.len,
        }
    }

    /// Whether the body streams (it can then be sent once).
    pub fn is_streamed(&self) -> bool {
        matches!(self.inner, Inner::Streamed(_))
    }

    /// The body, and where a streamed body comes back if it is dropped
    /// before its first byte was taken (a request that never left); a whole
    /// body is given back at once as a copy.
    pub fn returnable(self) -> (Self, oneshot::Receiver<RequestBody>) {
        let (tx, rx) = oneshot::channel();
        match self.inner {
            Inner::Whole(b) => {
                let b = b.unwrap_or_default();
                let _ = tx.send(Self::whole(b.clone()));
                (Self::whole(b), rx)
            }
            Inner::Streamed(mut s) => {
                s.give_back = Some(tx);
                (
                    Self {
                        inner: Inner::Streamed(s),
                    },
                    rx,
                )
            }
        }
    }

    /// The body's next bytes; `None` at its end.
    pub async fn next(&mut self) -> Option<Result<Bytes, BodyCut>> {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut *self).poll_frame(cx)).await?;
        Some(frame.map(|f| f.into_data().unwrap_or_default()))
    }

    /// The whole body, at most `max` bytes.
    pub async fn collect(mut self, max: usize) -> Result<Vec<u8>, CollectError> {
        let mut out = Vec::new();
        while let Some(data) = self.next().await {
            let data = data?;
            if data.len() > max.saturating_sub(out.len()) {
                return Err(CollectError::TooLarge(max));
            }
            out.extend_from_slice(&data);
        }
        Ok(out)
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyCut;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyCut>>> {
        let this = self.get_mut();
        match &mut this.inner {
            Inner::Whole(b) => Poll::Ready(
                b.take()
                    .filter(|b| !b.is_empty())
                    .map(|b| Ok(Frame::data(b))),
            ),
            Inner::Streamed(s) => loop {
                if s.ended {
                    return Poll::Ready(None);
                }
                let Some(rx) = s.rx.as_mut() else {
                    s.ended = true;
                    return Poll::Ready(Some(Err(BodyCut)));
                };
                match rx.poll_recv(cx) {
                    Poll::Pending => return Poll::Pending,
                    // An empty chunk would read as the end of a chunked body.
                    Poll::Ready(Some(BodyPart::Data(b))) if b.is_empty() => continue,
                    Poll::Ready(Some(BodyPart::Data(b))) => {
                        s.taken = s.taken.saturating_add(b.len() as u64);
                        return Poll::Ready(Some(Ok(Frame::data(b))));
                    }
                    Poll::Ready(Some(BodyPart::End)) => {
                        s.ended = true;
                        return Poll::Ready(None);
                    }
                    Poll::Ready(None) => {
                        s.ended = true;
                        return Poll::Ready(Some(Err(BodyCut)));
                    }
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Whole(b) => b.as_ref().is_none_or(Bytes::is_empty),
            Inner::Streamed(s) => s.ended,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Whole(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Inner::Streamed(s) => s.len.map_or_else(SizeHint::default, SizeHint::with_exact),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_without_length_or_transfer_encoding_has_no_body_in_http1() {
        assert_eq!(announced_len(Some("12"), false, true), Some(12));
        assert_eq!(announced_len(Some(" 7 "), false, false), Some(7));
        assert_eq!(announced_len(None, false, true), Some(0));
        // Chunked, or HTTP/2 (which frames bodies without either header).
        assert_eq!(announced_len(None, true, true), None);
        assert_eq!(announced_len(None, false, false), None);
        // Not a length.
        assert_eq!(announced_len(Some("+5"), false, true), None);
        assert_eq!(announced_len(Some(""), false, true), None);
        assert_eq!(
            announced_len(Some("99999999999999999999999"), false, true),
            None
        );
    }

    #[tokio::test]
    async fn a_streamed_body_ends_with_its_end_or_is_cut() {
        let (tx, body) = RequestBody::channel(4, None);
        tx.send(BodyPart::Data(Bytes::from_static(b"ab")))
            .await
            .unwrap();
        tx.send(BodyPart::Data(Bytes::new())).await.unwrap();
        tx.send(BodyPart::Data(Bytes::from_static(b"c")))
            .await
            .unwrap();
        tx.send(BodyPart::End).await.unwrap();
        assert_eq!(body.collect(3).await.unwrap(), b"abc");
        let (tx, body) = RequestBody::channel(4, None);
        tx.send(BodyPart::Data(Bytes::from_static(b"ab")))
            .await
            .unwrap();
        drop(tx);
        assert_eq!(body.collect(10).await, Err(CollectError::Cut(BodyCut)));
        let (tx, body) = RequestBody::channel(4, None);
        tx.send(BodyPart::Data(Bytes::from_static(b"abcd")))
            .await
            .unwrap();
        assert_eq!(body.collect(3).await, Err(CollectError::TooLarge(3)));
    }

    /// A client's body: `parts` arrive as they are sent on the returned
    /// sender; dropping it ends the body.
    fn incoming() -> (
        mpsc::UnboundedSender<Result<Bytes, &'static str>>,
        impl futures_core::Stream<Item = Result<Bytes, &'static str>> + Unpin,
    ) {
        struct Rx(mpsc::UnboundedReceiver<Result<Bytes, &'static str>>);
        impl futures_core::Stream for Rx {
            type Item = Result<Bytes, &'static str>;
            fn poll_next(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<Option<Self::Item>> {
                self.0.poll_recv(cx)
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, Rx(rx))
    }

    fn limits(max_bytes: usize, idle_ms: u64) -> BodyLimits {
        BodyLimits {
            max_bytes,
            idle: Duration::from_millis(idle_ms),
        }
    }

    #[tokio::test]
    async fn a_body_that_pauses_past_the_idle_timeout_is_cut() {
        use std::cell::Cell;
        use std::rc::Rc;
        let (client, payload) = incoming();
        let (tx, mut body) = RequestBody::channel(4, None);
        let upload = Rc::new(Cell::new(Upload::Reading));
        client.send(Ok(Bytes::from_static(b"abc"))).unwrap();
        let passing = pass_body_on(payload, tx, limits(100, 100), upload.clone());
        let reading = async {
            assert_eq!(body.next().await, Some(Ok(Bytes::from_static(b"abc"))));
            // The client sends nothing more: the body is cut.
            assert_eq!(body.next().await, Some(Err(BodyCut)));
        };
        let (broke, ()) = tokio::join!(passing, reading);
        assert_eq!(broke, None);
        assert_eq!(
            upload.get(),
            Upload::Stopped(BodyStop::Stalled { passed: 3 })
        );
        assert_eq!(
            BodyStop::Stalled { passed: 3 }.refusal(&limits(100, 100)),
            InvokeError::BodyTimeout {
                idle_ms: 100,
                passed: 3
            }
        );
        drop(client);
    }

    #[tokio::test]
    async fn a_function_that_reads_slowly_is_not_the_clients_pause() {
        use std::cell::Cell;
        use std::rc::Rc;
        let (client, payload) = incoming();
        // One part held: the second waits for the function to take the first.
        let (tx, mut body) = RequestBody::channel(1, None);
        let upload = Rc::new(Cell::new(Upload::Reading));
        for part in [&b"a"[..], b"b", b"c"] {
            client.send(Ok(Bytes::from_static(part))).unwrap();
        }
        drop(client);
        let passing = pass_body_on(payload, tx, limits(100, 100), upload.clone());
        let reading = async {
            let mut got = Vec::new();
            while let Some(part) = body.next().await {
                // Three times the idle timeout per part.
                tokio::time::sleep(Duration::from_millis(300)).await;
                got.extend_from_slice(&part.unwrap());
            }
            got
        };
        let (broke, got) = tokio::join!(passing, reading);
        assert_eq!((broke, got.as_slice()), (None, &b"abc"[..]));
        assert_eq!(upload.get(), Upload::Whole);
    }

    #[tokio::test]
    async fn a_small_body_is_read_whole_within_the_limits() {
        let (client, payload) = incoming();
        for part in [&b"ab"[..], b"cd"] {
            client.send(Ok(Bytes::from_static(part))).unwrap();
        }
        drop(client);
        assert_eq!(
            read_whole(payload, limits(4, 100)).await,
            Ok(Bytes::from_static(b"abcd"))
        );
        let (client, payload) = incoming();
        client.send(Ok(Bytes::from_static(b"abcde"))).unwrap();
        assert_eq!(
            read_whole(payload, limits(4, 100)).await,
            Err(BodyStop::OverCap { passed: 0 })
        );
        let (client, payload) = incoming();
        client.send(Ok(Bytes::from_static(b"ab"))).unwrap();
        assert_eq!(
            read_whole(payload, limits(4, 100)).await,
            Err(BodyStop::Stalled { passed: 2 })
        );
        drop(client);
        let (client, payload) = incoming();
        client.send(Err("reset")).unwrap();
        assert_eq!(
            read_whole(payload, limits(4, 100)).await,
            Err(BodyStop::Broken)
        );
    }

    #[tokio::test]
    async fn a_streamed_body_comes_back_only_before_its_first_byte() {
        let (tx, body) = RequestBody::channel(4, None);
        let (body, back) = body.returnable();
        drop(body);
        let body = back.await.expect("an untouched body comes back");
        tx.send(BodyPart::Data(Bytes::from_static(b"x")))
            .await
            .unwrap();
        let (mut body, back) = body.returnable();
        assert_eq!(body.next().await, Some(Ok(Bytes::from_static(b"x"))));
        drop(body);
        assert!(back.await.is_err(), "a body that was read from is gone");
    }
}
