//! The agent's HTTP client to a function's server: hyper 1 over
//! hyper-util's pooled client (HTTP/1.1, keep-alive), one per instance.
//!
//! ```text
//!   HttpClient::send(method, path?query, headers, body)
//!     │ a pooled connection to 127.0.0.1:<port> (opened on demand, kept idle 30 s)
//!     ▼
//!   (ReplyHead, body) ─▶ read_body(body, max_body): the whole body, at most max_body
//! ```
//!
//! The function's server is untrusted: the response head (status line,
//! headers) is bounded by hyper's read buffer ([`MAX_HEAD`]), a
//! `Content-Length` over the limit is refused before any body byte is read,
//! and every body frame is compared with what is left of the limit before
//! it is kept, so what the agent holds for one response stays under
//! `max_body` plus one read buffer whatever the server announces (a chunk
//! size is hyper's to parse: a size the server never sends ends with the
//! caller's deadline, having cost nothing). hyper bounds the trailers of a
//! chunked body itself. Time limits are the caller's (`tokio::time`).
//!
//! Only plain HTTP: the server is on the agent's own loopback (or a
//! microVM's forwarded loopback port), so there is no TLS to speak.

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::time::Duration;

/// Largest response head accepted (hyper's read buffer: status line and
/// headers must fit in it).
pub const MAX_HEAD: usize = 64 * 1024;

/// How long an idle pooled connection is kept.
const POOL_IDLE: Duration = Duration::from_secs(30);

pub use gshare_core::protocol::{Headers, ReplyHead};

/// An HTTP response, body read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased, in order.
    pub headers: Headers,
    /// The body.
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The first header named `name` (lower-case), if it is text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }
}

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The connection could not be opened.
    #[error("connect: {0}")]
    Connect(String),
    /// Reading or writing failed, or the peer closed early.
    #[error("i/o: {0}")]
    Io(String),
    /// The response was not valid HTTP/1.x.
    #[error("malformed response: {0}")]
    Malformed(String),
    /// The response head or body was over the limit.
    #[error("response over {0} bytes")]
    TooLarge(usize),
    /// The request could not be formed (a method, path or header hyper refuses).
    #[error("invalid request: {0}")]
    Request(String),
}

impl HttpError {
    fn of_hyper(e: &hyper::Error) -> Self {
        // hyper keeps its "too large" kind private; its message says it.
        if e.is_parse() && e.to_string().contains("too large") {
            HttpError::TooLarge(MAX_HEAD)
        } else if e.is_parse() {
            HttpError::Malformed(chain(e))
        } else {
            HttpError::Io(chain(e))
        }
    }

    fn of_client(e: &hyper_util::client::legacy::Error) -> Self {
        if e.is_connect() {
            return HttpError::Connect(chain(e));
        }
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            if let Some(h) = s.downcast_ref::<hyper::Error>() {
                return Self::of_hyper(h);
            }
            source = s.source();
        }
        HttpError::Io(chain(e))
    }
}

/// `e` and its sources, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !out.ends_with(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        source = s.source();
    }
    out
}

/// A pooled HTTP/1.1 client to one server (`host:port`). Cloning shares
/// the pool. Its connections' tasks run on the tokio runtime of the call
/// that opened them.
#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Full<Bytes>>,
    authority: String,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("authority", &self.authority)
            .finish()
    }
}

impl HttpClient {
    /// A client of `host:port`.
    pub fn new(host: &str, port: u16) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .pool_timer(TokioTimer::new())
            .http1_max_buf_size(MAX_HEAD)
            .build(connector);
        Self {
            client,
            authority: format!("{host}:{port}"),
        }
    }

    /// Sends one request (`target`: path and query, starting with `/`) and
    /// returns the response head and its body, unread.
    pub async fn open(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &[u8])],
        body: Vec<u8>,
    ) -> Result<(ReplyHead, Incoming), HttpError> {
        let bad = |what: String| HttpError::Request(what);
        if !target.starts_with('/') {
            return Err(bad(format!("target {target:?} does not start with `/`")));
        }
        let uri: hyper::Uri = format!("http://{}{target}", self.authority)
            .parse()
            .map_err(|e| bad(format!("target {target:?}: {e}")))?;
        let method = hyper::Method::from_bytes(method.as_bytes())
            .map_err(|e| bad(format!("method {method:?}: {e}")))?;
        let mut req = hyper::Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| bad(e.to_string()))?;
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| HttpError::of_client(&e))?;
        let (parts, body) = resp.into_parts();
        let headers = parts
            .headers
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
            .collect();
        Ok((
            ReplyHead {
                status: parts.status.as_u16(),
                headers,
            },
            body,
        ))
    }

    /// Sends one request and reads the whole response (body at most
    /// `max_body` bytes).
    pub async fn send(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &[u8])],
        body: Vec<u8>,
        max_body: usize,
    ) -> Result<HttpResponse, HttpError> {
        let (head, body) = self.open(method, target, headers, body).await?;
        let body = read_body(body, max_body).await?;
        Ok(HttpResponse {
            status: head.status,
            headers: head.headers,
            body,
        })
    }
}

/// Sends a bodiless `method` request on `io` (a connection whose peer
/// answers it) and reads the response with the parser and limits of
/// [`HttpClient`] (head within [`MAX_HEAD`], body at most `max_body`): the
/// entry for fuzzing the agent's response parsing (tests/tests/fuzz.rs).
/// Runs the connection on a tokio task of the current runtime.
pub async fn read_response<IO>(
    io: IO,
    method: &str,
    max_body: usize,
) -> Result<HttpResponse, HttpError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD)
        .handshake(hyper_util::rt::TokioIo::new(io))
        .await
        .map_err(|e| HttpError::of_hyper(&e))?;
    let conn = tokio::spawn(conn);
    let method = hyper::Method::from_bytes(method.as_bytes())
        .map_err(|e| HttpError::Request(format!("method {method:?}: {e}")))?;
    let req = hyper::Request::builder()
        .method(method)
        .uri("/")
        .header("host", "function")
        .body(Full::new(Bytes::new()))
        .map_err(|e| HttpError::Request(e.to_string()))?;
    let answer = async {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| HttpError::of_hyper(&e))?;
        let (parts, body) = resp.into_parts();
        let body = read_body(body, max_body).await?;
        Ok(HttpResponse {
            status: parts.status.as_u16(),
            headers: parts
                .headers
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
                .collect(),
            body,
        })
    }
    .await;
    conn.abort();
    answer
}

/// Reads `body` whole, refusing it (at once for a `Content-Length`, else
/// as soon as the bytes received pass it) when it is over `max_body`.
pub async fn read_body(mut body: Incoming, max_body: usize) -> Result<Vec<u8>, HttpError> {
    use hyper::body::Body as _;
    let announced = body.size_hint().lower();
    if usize::try_from(announced).map_or(true, |n| n > max_body) {
        return Err(HttpError::TooLarge(max_body));
    }
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| HttpError::of_hyper(&e))?;
        if let Ok(data) = frame.into_data() {
            // What is left of the limit, not `len + data`.
            if data.len() > max_body.saturating_sub(out.len()) {
                return Err(HttpError::TooLarge(max_body));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A hang guard, not a timing assert: on failure the request would
    /// otherwise wait for the caller's deadline.
    const GUARD: Duration = Duration::from_secs(30);

    /// A function server on loopback that answers each request it gets
    /// with `answer`, then keeps sending `flood` (if any) and holds the
    /// connection open until the client goes away.
    async fn server(answer: &'static [u8], flood: Option<&'static [u8]>) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).await.unwrap_or(0) == 1
                    {
                        head.push(byte[0]);
                    }
                    if s.write_all(answer).await.is_err() {
                        return;
                    }
                    if let Some(flood) = flood {
                        while s.write_all(flood).await.is_ok() {}
                        return;
                    }
                    let mut sink = [0u8; 1024];
                    while s.read(&mut sink).await.unwrap_or(0) > 0 {}
                });
            }
        });
        port
    }

    async fn ask(port: u16, max_body: usize) -> Result<HttpResponse, HttpError> {
        let client = HttpClient::new("127.0.0.1", port);
        tokio::time::timeout(
            GUARD,
            client.send("POST", "/", &[], b"{}".to_vec(), max_body),
        )
        .await
        .expect("the client waited on the server instead of refusing the response")
    }

    #[tokio::test]
    async fn a_chunk_size_that_would_wrap_the_limit_is_refused() {
        // The largest chunk size there is, then data: refused once what
        // arrived passes the limit, never buffered to the size announced.
        let port = server(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\nffffffffffffffff\r\n",
            Some(b"0123456789abcdef"),
        )
        .await;
        match ask(port, 1024).await {
            Err(HttpError::TooLarge(1024)) => {}
            other => panic!("expected TooLarge(1024), got {other:?}"),
        }
        // One past it does not even parse.
        let port = server(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n",
            None,
        )
        .await;
        match ask(port, 1024).await {
            Err(HttpError::Io(m) | HttpError::Malformed(m)) => {
                assert!(m.contains("chunk size"), "{m}")
            }
            other => panic!("expected a refused chunk size, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn endless_trailers_are_refused() {
        let port = server(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n",
            Some(b"x-trailer: 0123456789abcdef\r\n"),
        )
        .await;
        match ask(port, 1024).await {
            Err(HttpError::Io(m) | HttpError::Malformed(m)) => {
                assert!(m.contains("trailer"), "{m}")
            }
            other => panic!("expected refused trailers, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_endless_head_is_refused() {
        let port = server(b"HTTP/1.1 200 OK\r\n", Some(b"x-h: 0123456789abcdef\r\n")).await;
        match ask(port, 1024).await {
            Err(HttpError::TooLarge(MAX_HEAD)) => {}
            other => panic!("expected TooLarge({MAX_HEAD}), got {other:?}"),
        }
    }

    #[tokio::test]
    async fn bodies_within_the_limit_are_read_whole() {
        let port = server(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nx-t: 1\r\n\r\n",
            None,
        )
        .await;
        let r = ask(port, 5).await.unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"abcde"[..]));
        // A Content-Length over the limit is refused before the body comes.
        let port = server(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n", None).await;
        assert!(matches!(ask(port, 5).await, Err(HttpError::TooLarge(5))));
        // Statuses and headers come back as sent.
        let port = server(
            b"HTTP/1.1 418 I'm a teapot\r\nContent-Length: 2\r\nX-Fn: a\r\nX-Fn: b\r\n\r\nno",
            None,
        )
        .await;
        let r = ask(port, 5).await.unwrap();
        assert_eq!((r.status, r.body.as_slice()), (418, &b"no"[..]));
        let fns: Vec<_> = r.headers.iter().filter(|(k, _)| k == "x-fn").collect();
        assert_eq!(fns.len(), 2, "{:?}", r.headers);
    }

    #[tokio::test]
    async fn one_connection_serves_many_requests() {
        // A keep-alive server that counts its connections.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let _ = tx.send(());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        while let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            // Requests carry `Content-Length: 2` bodies.
                            let end = i + 4 + 2;
                            while buf.len() < end {
                                match s.read(&mut chunk).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                                }
                            }
                            buf.drain(..end);
                            let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                            if s.write_all(ok).await.is_err() {
                                return;
                            }
                        }
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
        });
        let client = HttpClient::new("127.0.0.1", port);
        for _ in 0..20 {
            let r =
                tokio::time::timeout(GUARD, client.send("POST", "/", &[], b"{}".to_vec(), 1024))
                    .await
                    .unwrap()
                    .unwrap();
            assert_eq!(r.body, b"ok");
        }
        let mut connections = 0;
        while rx.try_recv().is_ok() {
            connections += 1;
        }
        assert_eq!(
            connections, 1,
            "20 sequential calls opened {connections} connections"
        );
    }
}
