//! A request's body for [`super::HttpClient`]: whole, or streamed from a
//! channel as it arrives (a client's upload passed on while it is sent).
//!
//! ```text
//!   sender ──BodyPart::Data──▶ channel ──▶ RequestBody::poll_frame ──▶ hyper (chunked)
//!          ──BodyPart::End───▶            end of the body
//!   sender dropped without End            BodyCut: hyper aborts the request
//! ```
//!
//! A streamed body can be sent once. [`RequestBody::returnable`] gives it
//! back when it is dropped before its first byte was taken (a connect
//! that failed), so a caller may try elsewhere; once a byte was taken it
//! cannot.

use super::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
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

/// How passing a request body on as it arrives went ([`pass_body_on`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upload {
    /// Still reading (or nobody takes it any more).
    Reading,
    /// Passed on whole.
    Whole,
    /// Over the cap after `passed` bytes were passed on: cut there.
    OverCap {
        /// Bytes passed on before.
        passed: u64,
    },
    /// The client's body broke off (its connection, a malformed chunk): cut.
    Broken,
}

/// Passes the chunks of a server's request body (`incoming`, e.g. actix's
/// payload) on to `tx` as they come, at most `cap` bytes in all, keeping
/// `upload` up to date; stops when nobody takes them any more (`tx`
/// closed). A body over `cap` or one that broke off is cut: `tx` is dropped
/// without [`BodyPart::End`]. Returns the error a broken body ended with.
pub async fn pass_body_on<S, E>(
    mut incoming: S,
    tx: mpsc::Sender<BodyPart>,
    cap: usize,
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
        };
        match item {
            None => {
                upload.set(Upload::Whole);
                let _ = tx.send(BodyPart::End).await;
                return None;
            }
            Some(Err(e)) => {
                upload.set(Upload::Broken);
                return Some(e);
            }
            Some(Ok(chunk)) => {
                if chunk.len() > cap.saturating_sub(passed) {
                    upload.set(Upload::OverCap {
                        passed: passed as u64,
                    });
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
