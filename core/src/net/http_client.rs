//! The one pooled HTTP/1.1 client (feature `http-client`): hyper 1 over
//! hyper-util's pooled client (keep-alive), plain or over rustls. The
//! node agent uses it to call its functions' servers, a replica to forward
//! an invocation to a peer replica, and `gsharectl up`'s demo load.
//!
//! ```text
//!   HttpClient::new(host, port, tls?) ── one pool per client (clones share it)
//!     │ open(method, path?query, headers, body)
//!     │   a pooled connection (opened on demand: TCP, then TLS when built
//!     │   with a rustls config; kept idle 30 s)
//!     ▼
//!   (ReplyHead, Incoming) ─▶ read_body(body, max_body): the whole body, at most max_body
//!   send(.., max_body) = open + read_body
//! ```
//!
//! The peer is untrusted (a function's server, or a replica passing on
//! one): the response head (status line, headers) is bounded by hyper's
//! read buffer ([`MAX_HEAD`]), a `Content-Length` over the caller's limit
//! is refused before any body byte is read, and every body frame is
//! compared with what is left of the limit before it is kept, so what the
//! caller holds for one response stays under `max_body` plus one read
//! buffer whatever the peer announces (a chunk size is hyper's to parse:
//! a size the peer never sends ends with the caller's deadline, having
//! cost nothing). hyper bounds the trailers of a chunked body itself.
//! Time limits are the caller's (`tokio::time`), but for the connect
//! timeout ([`CONNECT_TIMEOUT`]).
//!
//! Why hyper-util and not awc: awc's connections belong to one actix
//! arbiter (`!Send` futures), while the agent's process driver and a
//! replica's forwards run on multi-threaded tokio tasks; hyper's client is
//! `Send`, pools per `scheme://authority`, and is already the agent's.
//!
//! [`HttpError::Connect`] means nothing was sent (TCP or the TLS handshake
//! failed: a retry elsewhere cannot run the request twice); every other
//! error may come after the request left.

mod connect;
mod request_body;

pub use connect::ConnectError;
pub use hyper::body::{Bytes, Incoming};
pub use request_body::{
    announced_len, pass_body_on, read_whole, stream_body, BodyCut, BodyLimits, BodyPart, BodyStop,
    CollectError, RequestBody, Upload, BODY_PARTS, WHOLE_BODY,
};

use connect::Connector;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::sync::Arc;
use std::time::Duration;

/// Largest response head accepted (hyper's read buffer: status line and
/// headers must fit in it).
pub const MAX_HEAD: usize = 64 * 1024;

/// How long an idle pooled connection is kept by default.
pub const POOL_IDLE: Duration = Duration::from_secs(30);

/// How long an idle pooled connection to an actix-web server (a replica's
/// API, an agent's ingress) is kept: under actix-web's 5 s keep-alive, so
/// the server never closes a connection just as a request goes out on it
/// (which would leave that request's outcome unknown).
pub const ACTIX_POOL_IDLE: Duration = Duration::from_secs(4);

/// Longest wait for a TCP connection (the TLS handshake after it is under
/// the caller's deadline).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

use crate::protocol::{Headers, ReplyHead};

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
    /// The request's streamed body was cut ([`BodyCut`]): the request was
    /// aborted part-way (the server never got a complete body).
    #[error("request aborted: {0}")]
    BodyCut(BodyCut),
}

impl From<hyper::Error> for HttpError {
    /// A body frame's or a connection's error.
    fn from(e: hyper::Error) -> Self {
        Self::of_hyper(&e)
    }
}

impl HttpError {
    fn of_hyper(e: &hyper::Error) -> Self {
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            if let Some(cut) = s.downcast_ref::<BodyCut>() {
                return HttpError::BodyCut(*cut);
            }
            source = s.source();
        }
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

/// A pooled HTTP/1.1 client to one server (`host:port`), plain or over
/// TLS. Cloning shares the pool. Its connections' tasks run on the tokio
/// runtime of the call that opened them.
#[derive(Clone)]
pub struct HttpClient {
    client: Client<Connector, RequestBody>,
    /// `http://host:port` or `https://host:port`.
    base: String,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("base", &self.base)
            .finish()
    }
}

impl HttpClient {
    /// A client of `host:port` (a name, or an IP address, IPv6 with or
    /// without brackets): plain HTTP when `tls` is `None`, else HTTPS with
    /// that config, the peer's certificate checked against `host` (an IP
    /// address is checked as one).
    pub fn new(host: &str, port: u16, tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        Self::with_pool_idle(host, port, tls, POOL_IDLE)
    }

    /// [`HttpClient::new`], keeping idle connections `idle` (keep it under
    /// the server's keep-alive: [`ACTIX_POOL_IDLE`] for gshare's servers).
    pub fn with_pool_idle(
        host: &str,
        port: u16,
        tls: Option<Arc<rustls::ClientConfig>>,
        idle: Duration,
    ) -> Self {
        Self::build(host, port, tls, None, idle)
    }

    fn build(
        host: &str,
        port: u16,
        tls: Option<Arc<rustls::ClientConfig>>,
        name: Option<rustls::pki_types::ServerName<'static>>,
        idle: Duration,
    ) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
        tcp.enforce_http(tls.is_none());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let connector = Connector::new(tcp, tls.map(tokio_rustls::TlsConnector::from), name);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(idle)
            .pool_timer(TokioTimer::new())
            .http1_max_buf_size(MAX_HEAD)
            .build(connector);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let base = if host.contains(':') {
            format!("{scheme}://[{host}]:{port}")
        } else {
            format!("{scheme}://{host}:{port}")
        };
        Self { client, base }
    }

    /// A client of one of gshare's own servers at `addr` (a replica's API,
    /// an agent's ingress), over TLS with `tls` (the certificate must name
    /// `addr`'s IP address) or plain; idle connections are kept
    /// [`ACTIX_POOL_IDLE`].
    pub fn for_addr(addr: std::net::SocketAddr, tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        Self::with_pool_idle(&addr.ip().to_string(), addr.port(), tls, ACTIX_POOL_IDLE)
    }

    /// A client of one of gshare's own servers at `addr` over TLS, whose
    /// certificate must carry `name` (a host name the caller resolved to
    /// `addr` itself, e.g. `gsharectl --region https://localhost:8101`);
    /// idle connections are kept [`ACTIX_POOL_IDLE`].
    pub fn for_addr_named(
        addr: std::net::SocketAddr,
        tls: Arc<rustls::ClientConfig>,
        name: rustls::pki_types::ServerName<'static>,
    ) -> Self {
        Self::build(
            &addr.ip().to_string(),
            addr.port(),
            Some(tls),
            Some(name),
            ACTIX_POOL_IDLE,
        )
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
        self.open_body(method, target, headers, RequestBody::from(body))
            .await
    }

    /// [`HttpClient::open`] with a body that may stream
    /// ([`RequestBody::streamed`]: sent chunked as it comes, unless
    /// `headers` give its `Content-Length`). The answer's head may come
    /// before the body is all sent (a server that answers as it reads);
    /// the body keeps going out meanwhile. A streamed body that is cut
    /// ([`BodyCut`]) aborts the request (the connection is closed, so the
    /// server never sees a complete body).
    pub async fn open_body(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &[u8])],
        body: RequestBody,
    ) -> Result<(ReplyHead, Incoming), HttpError> {
        let bad = |what: String| HttpError::Request(what);
        if !target.starts_with('/') {
            return Err(bad(format!("target {target:?} does not start with `/`")));
        }
        let uri: hyper::Uri = format!("{}{target}", self.base)
            .parse()
            .map_err(|e| bad(format!("target {target:?}: {e}")))?;
        let method = hyper::Method::from_bytes(method.as_bytes())
            .map_err(|e| bad(format!("method {method:?}: {e}")))?;
        let mut req = hyper::Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let framed = headers.iter().any(|(k, _)| {
            k.eq_ignore_ascii_case("transfer-encoding") || k.eq_ignore_ascii_case("content-length")
        });
        if body.is_streamed() && body.known_len().is_none() && !framed {
            // hyper sends a GET, HEAD or CONNECT whose body has no known
            // length without it (`Content-Length: 0` framing) unless the
            // request names its framing: a streamed body of unknown length
            // goes chunked whatever the method.
            req = req.header(hyper::header::TRANSFER_ENCODING, "chunked");
        }
        let req = req.body(body).map_err(|e| bad(e.to_string()))?;
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

/// The next bytes of `body` as they arrive (trailers are skipped); `None`
/// at its end.
pub async fn next_data(body: &mut Incoming) -> Option<Result<Bytes, HttpError>> {
    loop {
        match body.frame().await? {
            Err(e) => return Some(Err(HttpError::of_hyper(&e))),
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    return Some(Ok(data));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
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
        let client = HttpClient::new("127.0.0.1", port, None);
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

    /// A server that reads one request's head and then its body as its
    /// framing says (`Content-Length`, chunked, or none) and answers with
    /// the framing and the body it got.
    async fn body_echo() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                    let chunked = head.contains("transfer-encoding: chunked");
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok());
                    let done = |b: &[u8]| {
                        let rest = &b[head_end..];
                        if chunked {
                            rest.ends_with(b"0\r\n\r\n")
                        } else {
                            rest.len() >= length.unwrap_or(0)
                        }
                    };
                    while !done(&buf) {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let framing = if chunked {
                        "chunked"
                    } else if length.is_some() {
                        "length"
                    } else {
                        "none"
                    };
                    let rest = String::from_utf8_lossy(&buf[head_end..]).into_owned();
                    let answer = format!("{framing} {rest}");
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                        answer.len()
                    );
                    let _ = s.write_all(reply.as_bytes()).await;
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn a_streamed_body_of_unknown_length_goes_chunked_whatever_the_method() {
        // hyper alone sends a GET (HEAD, CONNECT) of unknown length with
        // no body at all.
        let port = body_echo().await;
        let client = HttpClient::new("127.0.0.1", port, None);
        for method in ["GET", "POST", "DELETE"] {
            let (tx, body) = RequestBody::channel(4, None);
            tx.send(BodyPart::Data(Bytes::from_static(b"hello")))
                .await
                .unwrap();
            tx.send(BodyPart::End).await.unwrap();
            let (_, reply) = tokio::time::timeout(GUARD, client.open_body(method, "/", &[], body))
                .await
                .unwrap()
                .unwrap();
            let got = read_body(reply, 1024).await.unwrap();
            let got = String::from_utf8_lossy(&got).into_owned();
            assert_eq!(got, "chunked 5\r\nhello\r\n0\r\n\r\n", "{method}");
        }
        // A known length is sent with it; a whole empty body has none.
        let (tx, body) = RequestBody::channel(4, Some(5));
        tx.send(BodyPart::Data(Bytes::from_static(b"hello")))
            .await
            .unwrap();
        tx.send(BodyPart::End).await.unwrap();
        let (_, reply) = client.open_body("GET", "/", &[], body).await.unwrap();
        let got = read_body(reply, 1024).await.unwrap();
        assert_eq!(got, b"length hello");
        let r = client
            .send("GET", "/", &[], Vec::new(), 1024)
            .await
            .unwrap();
        assert_eq!(r.body, b"none ");
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
        let client = HttpClient::new("127.0.0.1", port, None);
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

    /// A self-signed certificate for 127.0.0.1, and a client config
    /// trusting it.
    fn loopback_tls() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        tls_for("127.0.0.1")
    }

    /// A self-signed certificate for `name`, and a client config trusting it.
    fn tls_for(name: &str) -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
        let ck = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        let cert = CertificateDer::from(ck.cert.der().to_vec());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (Arc::new(server), Arc::new(client))
    }

    /// An HTTPS server on loopback answering every request on a
    /// connection with `ok`, counting requests.
    async fn tls_server(config: Arc<rustls::ServerConfig>) -> (u16, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let served = Arc::new(AtomicUsize::new(0));
        let counter = served.clone();
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let (acceptor, counter) = (acceptor.clone(), counter.clone());
                tokio::spawn(async move {
                    let Ok(mut s) = acceptor.accept(s).await else {
                        return;
                    };
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        while let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let end = i + 4 + 2;
                            while buf.len() < end {
                                match s.read(&mut chunk).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                                }
                            }
                            buf.drain(..end);
                            counter.fetch_add(1, Ordering::SeqCst);
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
        (port, served)
    }

    #[tokio::test]
    async fn a_peer_speaking_tls_is_spoken_to_over_tls() {
        let (server, client_config) = loopback_tls();
        let (port, served) = tls_server(server).await;
        let client = HttpClient::new("127.0.0.1", port, Some(client_config));
        for _ in 0..3 {
            let r = tokio::time::timeout(GUARD, client.send("POST", "/", &[], b"{}".to_vec(), 16))
                .await
                .unwrap()
                .unwrap();
            assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
        }
        assert_eq!(served.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_name_given_with_the_address_is_the_one_checked() {
        let (server, client_config) = tls_for("localhost");
        let (port, served) = tls_server(server).await;
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let named = HttpClient::for_addr_named(addr, client_config.clone(), name);
        let r = tokio::time::timeout(GUARD, named.send("POST", "/", &[], b"{}".to_vec(), 16))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
        // The address alone is not a name the certificate carries.
        let by_ip = HttpClient::for_addr(addr, Some(client_config));
        let got = tokio::time::timeout(GUARD, by_ip.send("POST", "/", &[], b"{}".to_vec(), 16))
            .await
            .unwrap();
        assert!(matches!(got, Err(HttpError::Connect(_))), "{got:?}");
        assert_eq!(served.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_certificate_not_trusted_is_a_connect_error_and_nothing_is_sent() {
        let (server, _) = loopback_tls();
        let (_, other_ca) = loopback_tls();
        let (port, served) = tls_server(server).await;
        let client = HttpClient::new("127.0.0.1", port, Some(other_ca));
        let got = tokio::time::timeout(GUARD, client.send("POST", "/", &[], b"{}".to_vec(), 16))
            .await
            .unwrap();
        match got {
            Err(HttpError::Connect(m)) => assert!(m.contains("certificate"), "{m}"),
            other => panic!("expected a connect error, got {other:?}"),
        }
        // Plain HTTP to a TLS peer gets no answer either.
        let plain = HttpClient::new("127.0.0.1", port, None);
        let got = tokio::time::timeout(GUARD, plain.send("POST", "/", &[], b"{}".to_vec(), 16))
            .await
            .unwrap();
        assert!(got.is_err(), "{got:?}");
        assert_eq!(served.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn nothing_listening_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let client = HttpClient::new("127.0.0.1", port, None);
        let got = client.send("GET", "/", &[], Vec::new(), 16).await;
        assert!(matches!(got, Err(HttpError::Connect(_))), "{got:?}");
    }

    #[test]
    fn hosts_are_written_as_uris_take_them() {
        let c = |h: &str| HttpClient::new(h, 8080, None).base;
        assert_eq!(c("127.0.0.1"), "http://127.0.0.1:8080");
        assert_eq!(c("::1"), "http://[::1]:8080");
        assert_eq!(c("[::1]"), "http://[::1]:8080");
        assert_eq!(c("localhost"), "http://localhost:8080");
        let (_, tls) = loopback_tls();
        let addr: std::net::SocketAddr = "10.0.0.1:443".parse().unwrap();
        assert_eq!(
            HttpClient::for_addr(addr, Some(tls)).base,
            "https://10.0.0.1:443"
        );
    }
}
