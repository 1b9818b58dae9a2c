//! The blocking HTTP client of `gsharectl` (its requests to the API, the
//! dashboard's reads) and the tests: a thin wrapper over the one pooled
//! client, [`gshare_core::net::http_client`] (hyper 1 over hyper-util),
//! which the invoke path (a replica's forwards, the agent's calls to its
//! functions, the demo load) uses directly.
//!
//! ```text
//!   caller thread                     "http-client" runtime (1 worker)
//!   send(target, ..) ── spawn ──▶  pool_of(target).send(..) within `timeout`
//!        │ blocks on a channel          │ one pooled HttpClient per target
//!        ◀────────── the answer ────────┘ (TCP, TLS with the target's CA)
//! ```
//!
//! The requests run on a process-wide tokio runtime of their own, so a
//! caller may be any thread, one inside another runtime included (it
//! blocks that thread, as any blocking call does, but never nests
//! `block_on`). Clients are kept per target (address, TLS trust and name),
//! so a caller polling one replica reuses its keep-alive connection.
//!
//! JSON bodies, bearer token, plain or over TLS ([`HttpTarget`]:
//! `http://`, `https://` with a CA, or a bare `host:port` meaning http).
//! The answer's head is bounded by the core client
//! ([`gshare_core::net::http_client::MAX_HEAD`]), its body by a cap
//! ([`MAX_REPLY_BYTES`] by default): a server that sends more (or never
//! stops, or announces a chunk it never sends) gets
//! [`HttpClientError::TooLarge`] or the request's timeout, not all our
//! memory. [`HttpClientError::Connect`] means nothing was sent; every
//! other error may come after the request reached the server.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use gshare_core::net::http_client::{HttpClient, HttpError};
use rustls::pki_types::ServerName;

/// Largest answer body read (a `GET /v1/cluster/state` of a 1,000-node
/// region is a few MiB).
pub const MAX_REPLY_BYTES: usize = 64 << 20;

/// A request that got no HTTP answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
    /// Sending or receiving failed after the connection was made, or no
    /// answer came within the request's timeout (the request may have
    /// reached the server).
    #[error("{addr}: {source}")]
    Io {
        /// The server.
        addr: SocketAddr,
        /// What failed.
        source: std::io::Error,
    },
    /// The answer's body is longer than the limit (or its head longer
    /// than [`gshare_core::net::http_client::MAX_HEAD`]).
    #[error("{addr}: answer over {limit} bytes")]
    TooLarge {
        /// The server.
        addr: SocketAddr,
        /// The limit, bytes.
        limit: usize,
    },
    /// The answer is not HTTP/1.x.
    #[error("{addr}: malformed response: {detail}")]
    Malformed {
        /// The server.
        addr: SocketAddr,
        /// What is wrong.
        detail: String,
    },
    /// The connection or the TLS handshake could not be made: nothing was
    /// sent (a refused handshake shows here, e.g. "invalid peer
    /// certificate: UnknownIssuer").
    #[error("{addr}: connect: {source}")]
    Connect {
        /// The server.
        addr: SocketAddr,
        /// What failed.
        source: std::io::Error,
    },
    /// The request could not be formed (a method, path or header that is
    /// not HTTP): nothing was sent.
    #[error("{addr}: invalid request: {detail}")]
    Request {
        /// The server.
        addr: SocketAddr,
        /// What is wrong.
        detail: String,
    },
}

impl HttpClientError {
    fn of(addr: SocketAddr, e: HttpError) -> Self {
        match e {
            HttpError::Connect(m) => Self::Connect {
                addr,
                source: std::io::Error::other(m),
            },
            HttpError::Io(m) => Self::Io {
                addr,
                source: std::io::Error::other(m),
            },
            HttpError::Malformed(detail) => Self::Malformed { addr, detail },
            HttpError::TooLarge(limit) => Self::TooLarge { addr, limit },
            HttpError::Request(detail) => Self::Request { addr, detail },
            // (This client sends whole bodies; were one cut, part of the
            // request may have reached the server.)
            e @ HttpError::BodyCut(_) => Self::Io {
                addr,
                source: std::io::Error::other(e.to_string()),
            },
        }
    }
}

/// A target URL could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// Not `http://host:port`, `https://host:port` or `host:port`.
    #[error("{0:?}: expected http://host:port, https://host:port or host:port")]
    Syntax(String),
    /// The host did not resolve.
    #[error("{url:?}: {detail}")]
    Resolve {
        /// As given.
        url: String,
        /// Why.
        detail: String,
    },
    /// `https://` without a CA to trust.
    #[error("{0:?}: https needs the operator CA (--ca <file> or GSHARE_CA)")]
    NoCa(String),
    /// The CA file is unusable.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsFileError),
}

/// Where a request goes: a server address, spoken to in plain HTTP or over
/// TLS (trusting only the configured CA, verifying the server's name).
#[derive(Clone)]
pub struct HttpTarget {
    /// The server.
    pub addr: SocketAddr,
    /// TLS client config and the name the certificate must carry; `None`: plain HTTP.
    pub tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
}

impl std::fmt::Debug for HttpTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        write!(f, "{scheme}://{}", self.addr)
    }
}

impl HttpTarget {
    /// Plain HTTP to `addr`.
    pub fn plain(addr: SocketAddr) -> Self {
        Self { addr, tls: None }
    }

    /// TLS to `addr`, whose certificate must be valid for its IP address.
    pub fn tls(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> Self {
        let name = ServerName::IpAddress(addr.ip().into());
        Self {
            addr,
            tls: Some((config, name)),
        }
    }

    /// Parses `http://host:port`, `https://host:port` or `host:port`
    /// (http); `https` trusts only the CA certificates in `ca` (PEM).
    pub fn parse(url: &str, ca: Option<&Path>) -> Result<Self, TargetError> {
        let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else if url.contains("://") {
            return Err(TargetError::Syntax(url.into()));
        } else {
            (false, url)
        };
        let hostport = rest.trim_end_matches('/');
        if hostport.is_empty() || hostport.contains('/') {
            return Err(TargetError::Syntax(url.into()));
        }
        let addr = hostport
            .to_socket_addrs()
            .map_err(|e| TargetError::Resolve {
                url: url.into(),
                detail: e.to_string(),
            })?
            .next()
            .ok_or_else(|| TargetError::Resolve {
                url: url.into(),
                detail: "no address".into(),
            })?;
        if !https {
            return Ok(Self::plain(addr));
        }
        let ca = ca.ok_or_else(|| TargetError::NoCa(url.into()))?;
        let config = Arc::new(crate::tls::http_client_config(ca)?);
        let host = hostport
            .rsplit_once(':')
            .map_or(hostport, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name =
            ServerName::try_from(host.to_string()).map_err(|_| TargetError::Syntax(url.into()))?;
        Ok(Self {
            addr,
            tls: Some((config, name)),
        })
    }

    /// Whether requests go over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// This target's server at another address (same scheme and trust; a
    /// TLS name becomes the new address).
    pub fn at(&self, addr: SocketAddr) -> Self {
        match &self.tls {
            None => Self::plain(addr),
            Some((c, _)) => Self::tls(addr, c.clone()),
        }
    }
}

/// An HTTP answer: status, headers and body text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpReply {
    /// Status code.
    pub status: u16,
    /// Body as text (lossy UTF-8).
    pub body: String,
    /// Headers in order, names in lower case.
    pub headers: Vec<(String, String)>,
}

impl HttpReply {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request and reads the whole answer; `timeout` bounds the
/// whole exchange.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    json_body: Option<&str>,
    timeout: Duration,
) -> Result<HttpReply, HttpClientError> {
    request_to(
        &HttpTarget::plain(addr),
        method,
        path,
        token,
        json_body,
        timeout,
    )
}

/// [`request`] with extra request headers; also returns the answer's
/// headers (names in lower case).
pub fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    json_body: Option<&str>,
    timeout: Duration,
) -> Result<(HttpReply, Vec<(String, String)>), HttpClientError> {
    let r = json_request(
        &HttpTarget::plain(addr),
        method,
        path,
        token,
        headers,
        json_body,
        timeout,
    )?;
    let headers = r.headers.clone();
    Ok((r, headers))
}

/// [`request`] to a plain or TLS target.
pub fn request_to(
    target: &HttpTarget,
    method: &str,
    path: &str,
    token: Option<&str>,
    json_body: Option<&str>,
    timeout: Duration,
) -> Result<HttpReply, HttpClientError> {
    json_request(target, method, path, token, &[], json_body, timeout)
}

fn json_request(
    target: &HttpTarget,
    method: &str,
    path: &str,
    token: Option<&str>,
    extra: &[(&str, &str)],
    json_body: Option<&str>,
    timeout: Duration,
) -> Result<HttpReply, HttpClientError> {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers: Vec<(&str, &str)> = Vec::new();
    if let Some(a) = &auth {
        headers.push(("Authorization", a));
    }
    headers.extend_from_slice(extra);
    if json_body.is_some() {
        headers.push(("Content-Type", "application/json"));
    }
    let body = json_body.unwrap_or("").as_bytes();
    let a = send(
        target,
        method,
        path,
        &headers,
        body,
        timeout,
        MAX_REPLY_BYTES,
    )?;
    Ok(HttpReply {
        status: a.status,
        body: String::from_utf8_lossy(&a.body).into_owned(),
        headers: a.headers,
    })
}

/// An HTTP answer as bytes: status, headers (names in lower case), body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAnswer {
    /// Status code.
    pub status: u16,
    /// Headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// Body (de-chunked).
    pub body: Vec<u8>,
}

/// Sends one request with `headers` and `body`; the answer, refused as
/// [`HttpClientError::TooLarge`] past `max_reply` body bytes. `timeout`
/// bounds the whole exchange (the TCP connect alone gives up after
/// [`gshare_core::net::http_client::CONNECT_TIMEOUT`]); an exchange cut by
/// it is [`HttpClientError::Io`], as the request may have gone out.
/// [`HttpClientError::Connect`] and [`HttpClientError::Request`] mean
/// nothing was sent.
pub fn send(
    target: &HttpTarget,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
    max_reply: usize,
) -> Result<HttpAnswer, HttpClientError> {
    let addr = target.addr;
    let runtime = RUNTIME.as_ref().map_err(|e| HttpClientError::Connect {
        addr,
        source: std::io::Error::other(format!("no client runtime: {e}")),
    })?;
    let client = pool_of(target);
    let method = method.to_string();
    let path = path.to_string();
    let headers: Vec<(String, Vec<u8>)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect();
    let body = body.to_vec();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let headers: Vec<(&str, &[u8])> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let exchange = client.send(&method, &path, &headers, body, max_reply);
        let got = match tokio::time::timeout(timeout, exchange).await {
            Ok(got) => got.map_err(|e| HttpClientError::of(addr, e)),
            Err(_) => Err(HttpClientError::Io {
                addr,
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {timeout:?}"),
                ),
            }),
        };
        let _ = tx.send(got);
    });
    let r = rx.recv().map_err(|_| HttpClientError::Io {
        addr,
        source: std::io::Error::other("the client's task ended without an answer"),
    })??;
    Ok(HttpAnswer {
        status: r.status,
        headers: r
            .headers
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect(),
        body: r.body,
    })
}

/// The runtime the requests run on (its connections' tasks too): one
/// worker thread, built on first use.
static RUNTIME: LazyLock<Result<tokio::runtime::Runtime, String>> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("http-client")
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
});

/// Most targets whose pools are kept; past it they are all dropped (a
/// request under way keeps its own).
const MAX_POOLS: usize = 64;

/// A target's identity for its pool: the address and, for TLS, which
/// config (by address: the map's client holds the `Arc`, so it cannot be
/// freed and its address reused while the entry lives) and which name.
#[derive(PartialEq, Eq, Hash)]
struct PoolKey {
    addr: SocketAddr,
    tls: Option<(usize, ServerName<'static>)>,
}

static POOLS: LazyLock<Mutex<HashMap<PoolKey, HttpClient>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The pooled client of `target` (made on first use).
fn pool_of(target: &HttpTarget) -> HttpClient {
    let key = PoolKey {
        addr: target.addr,
        tls: target
            .tls
            .as_ref()
            .map(|(c, n)| (Arc::as_ptr(c) as usize, n.clone())),
    };
    let mut pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
    if !pools.contains_key(&key) && pools.len() >= MAX_POOLS {
        pools.clear();
    }
    pools
        .entry(key)
        .or_insert_with(|| match &target.tls {
            None => HttpClient::for_addr(target.addr, None),
            Some((config, name)) => {
                HttpClient::for_addr_named(target.addr, config.clone(), name.clone())
            }
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// What a test server does after its answer.
    #[derive(Clone, Copy)]
    enum Then {
        /// Closes the connection.
        Close,
        /// Sends `x` until the client goes away.
        Flood,
    }

    /// Reads a request's head (the tests' requests have no body).
    fn read_head(s: &mut impl Read) {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && matches!(s.read(&mut byte), Ok(1)) {
            head.push(byte[0]);
        }
    }

    /// A loopback server answering each connection's request with `answer`.
    fn serve(answer: &'static [u8], then: Then) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                std::thread::spawn(move || {
                    read_head(&mut s);
                    let _ = s.write_all(answer);
                    if let Then::Flood = then {
                        let chunk = vec![b'x'; 64 * 1024];
                        while s.write_all(&chunk).is_ok() {}
                    }
                });
            }
        });
        addr
    }

    fn get(addr: SocketAddr, max_reply: usize) -> Result<HttpAnswer, HttpClientError> {
        // A hang guard, not a timing assert.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let t = HttpTarget::plain(addr);
            let _ = tx.send(send(
                &t,
                "GET",
                "/",
                &[],
                b"",
                Duration::from_secs(30),
                max_reply,
            ));
        });
        rx.recv_timeout(Duration::from_secs(120))
            .expect("the client kept reading")
    }

    #[test]
    fn plain_and_chunked_answers_are_read_whole() {
        let a = serve(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nX-Two: a\r\n\r\nhi",
            Then::Close,
        );
        let r = request(a, "GET", "/", None, None, Duration::from_secs(5)).unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "hi"));
        assert_eq!(r.header("Content-Length"), Some("2"));
        assert_eq!(r.header("x-two"), Some("a"));
        let a = serve(
            b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
            Then::Close,
        );
        let r = request(a, "GET", "/", None, None, Duration::from_secs(5)).unwrap();
        assert_eq!((r.status, r.body.as_str()), (404, "abcde"));
    }

    #[test]
    fn broken_and_hostile_framing_is_refused() {
        let a = serve(b"garbage", Then::Close);
        let e = get(a, 1024).unwrap_err();
        assert!(matches!(e, HttpClientError::Malformed { .. }), "{e}");
        for bad in [
            // Cut short.
            &b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhi"[..],
            // Sizes that would wrap an end offset, and a chunk without its CRLF.
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffff\r\nx\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffe\r\nx\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nxyz0\r\n\r\n",
            // A size past u64.
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10000000000000000\r\n",
        ] {
            let a = serve(bad, Then::Close);
            let got = get(a, 1024);
            assert!(got.is_err(), "{}: {got:?}", String::from_utf8_lossy(bad));
        }
        // The largest chunk size there is, then data without end: cut at
        // the cap, never buffered to the size announced.
        let a = serve(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffff\r\n",
            Then::Flood,
        );
        let e = get(a, 4096).unwrap_err();
        assert!(
            matches!(e, HttpClientError::TooLarge { limit: 4096, .. }),
            "{e}"
        );
    }

    #[test]
    fn an_answer_that_never_ends_is_cut_at_the_limit() {
        let a = serve(b"HTTP/1.1 200 OK\r\n\r\n", Then::Flood);
        let got = get(a, MAX_REPLY_BYTES);
        assert!(
            matches!(
                got,
                Err(HttpClientError::TooLarge {
                    limit: MAX_REPLY_BYTES,
                    ..
                })
            ),
            "{got:?}"
        );
    }

    #[test]
    fn answers_past_the_cap_are_refused() {
        let a = serve(
            b"HTTP/1.1 200 OK\r\ncontent-length: 10000\r\n\r\n",
            Then::Flood,
        );
        let e = get(a, 4096).unwrap_err();
        assert!(
            matches!(e, HttpClientError::TooLarge { limit: 4096, .. }),
            "{e}"
        );
    }

    #[test]
    fn nothing_sent_is_told_apart_from_maybe_sent() {
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let e = get(closed, 1024).unwrap_err();
        assert!(matches!(e, HttpClientError::Connect { .. }), "{e}");
        // The server read the request and hung up.
        let a = serve(b"", Then::Close);
        let e = get(a, 1024).unwrap_err();
        assert!(matches!(e, HttpClientError::Io { .. }), "{e}");
        // The server read the request and never answers.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            read_head(&mut s);
            let _ = wait.recv();
        });
        let e = request(a, "GET", "/", None, None, Duration::from_millis(300)).unwrap_err();
        match &e {
            HttpClientError::Io { source, .. } => {
                assert_eq!(source.kind(), std::io::ErrorKind::TimedOut, "{e}")
            }
            other => panic!("expected a timeout, got {other}"),
        }
        drop(done);
        // Not HTTP at all: nothing sent either.
        let e = request(a, "GET", "no slash", None, None, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, HttpClientError::Request { .. }), "{e}");
    }

    #[test]
    fn a_caller_inside_a_runtime_is_served() {
        let a = serve(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi",
            Then::Close,
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let r = rt
            .block_on(async { request(a, "GET", "/", None, None, Duration::from_secs(5)) })
            .unwrap();
        assert_eq!(r.body, "hi");
    }

    #[test]
    fn one_target_reuses_its_connection() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                std::thread::spawn(move || loop {
                    read_head(&mut s);
                    if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .is_err()
                    {
                        return;
                    }
                });
            }
        });
        for _ in 0..5 {
            let r = request(addr, "GET", "/", None, None, Duration::from_secs(5)).unwrap();
            assert_eq!(r.body, "ok");
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn https_targets_trust_only_their_ca_and_check_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        crate::tls::init_ca(&ca_dir).unwrap();
        let (cert, key) = crate::tls::issue(&ca_dir, "srv", &["localhost".into()]).unwrap();
        let server = Arc::new(crate::tls::http_server_config(&cert, &key).unwrap());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { return };
                let conn = rustls::ServerConnection::new(server.clone()).unwrap();
                let mut s: rustls::StreamOwned<_, TcpStream> = rustls::StreamOwned::new(conn, s);
                read_head(&mut s);
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
                let _ = s.flush();
            }
        });
        let trusted = Arc::new(crate::tls::http_client_config(&ca_dir.join("ca.pem")).unwrap());
        let localhost = ServerName::try_from("localhost").unwrap();
        let t = HttpTarget {
            addr,
            tls: Some((trusted.clone(), localhost.clone())),
        };
        let r = request_to(&t, "GET", "/", None, None, Duration::from_secs(5)).unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));
        // Another CA: refused at the handshake, nothing sent.
        let other = dir.path().join("other");
        crate::tls::init_ca(&other).unwrap();
        let untrusted = Arc::new(crate::tls::http_client_config(&other.join("ca.pem")).unwrap());
        let t = HttpTarget {
            addr,
            tls: Some((untrusted, localhost)),
        };
        let e = request_to(&t, "GET", "/", None, None, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, HttpClientError::Connect { .. }), "{e}");
        assert!(e.to_string().contains("invalid peer certificate"), "{e}");
        // The right CA, but the certificate does not name 127.0.0.1.
        let e = request_to(
            &HttpTarget::tls(addr, trusted),
            "GET",
            "/",
            None,
            None,
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert!(matches!(e, HttpClientError::Connect { .. }), "{e}");
    }

    #[test]
    fn targets_parse_schemes_and_need_a_ca_for_https() {
        let t = HttpTarget::parse("127.0.0.1:8101", None).unwrap();
        assert!(!t.is_tls());
        let t = HttpTarget::parse("http://127.0.0.1:8101/", None).unwrap();
        assert_eq!(format!("{t:?}"), "http://127.0.0.1:8101");
        assert!(matches!(
            HttpTarget::parse("https://127.0.0.1:8101", None),
            Err(TargetError::NoCa(_))
        ));
        assert!(HttpTarget::parse("ftp://127.0.0.1:1", None).is_err());
        assert!(HttpTarget::parse("http://127.0.0.1:1/x", None).is_err());
        let dir = tempfile::tempdir().unwrap();
        crate::tls::init_ca(dir.path()).unwrap();
        let t =
            HttpTarget::parse("https://localhost:8101", Some(&dir.path().join("ca.pem"))).unwrap();
        assert!(t.is_tls());
        assert_eq!(t.addr.port(), 8101);
    }
}
