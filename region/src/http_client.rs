//! A tiny blocking HTTP/1.1 client for `gsharectl` (its requests to the
//! API, the dashboard's reads) and the tests. The invoke path (a replica's
//! forwards, the agent's calls to its functions, the demo load) uses the
//! pooled client of `gshare_core::net::http_client` instead.
//!
//! One request per connection (`Connection: close`), JSON bodies, bearer
//! token, plain or over TLS ([`HttpTarget`]: `http://`, `https://` with a
//! CA, or a bare `host:port` meaning http). Enough to talk to a replica
//! without pulling in a client stack. An answer is read up to a cap
//! ([`MAX_REPLY_BYTES`] by default); a server that sends more (or never
//! stops) gets [`HttpClientError::TooLarge`], not all our memory.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;

/// Largest answer read, head and body (a `GET /v1/cluster/state` of a
/// 1,000-node region is a few MiB).
pub const MAX_REPLY_BYTES: usize = 64 << 20;

/// Longest wait for a TCP connection (at most the request's timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A request that got no HTTP answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
    /// Sending or receiving failed after the connection was made (the
    /// request may have reached the server).
    #[error("{addr}: {source}")]
    Io {
        /// The server.
        addr: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// The answer is longer than the limit.
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
        /// The socket error.
        source: std::io::Error,
    },
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

/// Sends one request and reads the whole answer; `timeout` bounds each socket operation.
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
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut all: Vec<(&str, &str)> = Vec::new();
    if let Some(a) = &auth {
        all.push(("Authorization", a));
    }
    all.extend_from_slice(headers);
    if json_body.is_some() {
        all.push(("Content-Type", "application/json"));
    }
    let body = json_body.unwrap_or("").as_bytes();
    let a = send(
        &HttpTarget::plain(addr),
        method,
        path,
        &all,
        body,
        timeout,
        MAX_REPLY_BYTES,
    )?;
    Ok((
        HttpReply {
            status: a.status,
            body: String::from_utf8_lossy(&a.body).into_owned(),
            headers: a.headers.clone(),
        },
        a.headers,
    ))
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
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers: Vec<(&str, &str)> = Vec::new();
    if let Some(a) = &auth {
        headers.push(("Authorization", a));
    }
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
/// [`HttpClientError::TooLarge`] past `max_reply` bytes (headers included).
/// `timeout` bounds each socket operation. [`HttpClientError::Connect`]
/// means nothing was sent.
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
    let io = |source| HttpClientError::Io { addr, source };
    let connect = |source| HttpClientError::Connect { addr, source };
    // A dead peer is told apart quickly; the exchange itself gets `timeout`.
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout.min(CONNECT_TIMEOUT)).map_err(connect)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let raw = match &target.tls {
        None => exchange(stream, head.as_bytes(), body, max_reply),
        Some((config, name)) => {
            let mut conn = rustls::ClientConnection::new(config.clone(), name.clone())
                .map_err(|e| connect(std::io::Error::other(e)))?;
            // Finish the handshake before anything of the request is
            // written: a refused handshake means nothing was sent.
            while conn.is_handshaking() {
                conn.complete_io(&mut stream).map_err(connect)?;
            }
            exchange(
                rustls::StreamOwned::new(conn, stream),
                head.as_bytes(),
                body,
                max_reply,
            )
        }
    };
    let raw = match raw {
        Ok(r) => r,
        Err(None) => {
            return Err(HttpClientError::TooLarge {
                addr,
                limit: max_reply,
            })
        }
        Err(Some(e)) => return Err(io(e)),
    };
    parse_bytes(addr, &raw)
}

/// Writes the request and reads the answer to its end, at most `max`
/// bytes (`Err(None)` past it). A TLS peer that closes without
/// `close_notify` after its answer is not an error: the framing checks in
/// [`parse_bytes`] catch a cut answer.
fn exchange(
    mut s: impl Read + Write,
    head: &[u8],
    body: &[u8],
    max: usize,
) -> Result<Vec<u8>, Option<std::io::Error>> {
    s.write_all(head).map_err(Some)?;
    s.write_all(body).map_err(Some)?;
    s.flush().map_err(Some)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if raw.len() + n > max {
                    return Err(None);
                }
                raw.extend_from_slice(&buf[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => break,
            Err(e) => return Err(Some(e)),
        }
    }
    Ok(raw)
}

#[cfg(test)]
fn parse(addr: SocketAddr, raw: &[u8]) -> Result<HttpReply, HttpClientError> {
    let a = parse_bytes(addr, raw)?;
    Ok(HttpReply {
        status: a.status,
        body: String::from_utf8_lossy(&a.body).into_owned(),
        headers: a.headers,
    })
}

fn parse_bytes(addr: SocketAddr, raw: &[u8]) -> Result<HttpAnswer, HttpClientError> {
    let bad = |detail: &str| HttpClientError::Malformed {
        addr,
        detail: detail.to_string(),
    };
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("empty"))?;
    let mut parts = status_line.split_whitespace();
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err(bad("not HTTP/1.x"));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status code"))?;
    let mut chunked = false;
    let mut length: Option<usize> = None;
    let mut headers = Vec::new();
    for line in lines {
        if let Some((n, v)) = line.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let l = line.to_ascii_lowercase();
        if l.starts_with("transfer-encoding:") && l.contains("chunked") {
            chunked = true;
        }
        if let Some(v) = l.strip_prefix("content-length:") {
            length = Some(v.trim().parse().map_err(|_| bad("bad content-length"))?);
        }
    }
    let mut body = raw[split + 4..].to_vec();
    if chunked {
        body = dechunk(&body).ok_or_else(|| bad("bad chunked body"))?;
    } else if let Some(n) = length {
        if body.len() < n {
            return Err(bad("answer cut short"));
        }
        body.truncate(n);
    }
    Ok(HttpAnswer {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..eol]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = data.get(eol.checked_add(2)?..)?;
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size..)?.strip_prefix(b"\r\n")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let r = parse(a, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi").unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "hi"));
        assert_eq!(r.header("Content-Length"), Some("2"));
        let r = parse(a, b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap();
        assert_eq!((r.status, r.body.as_str()), (404, "abcde"));
        assert!(parse(a, b"garbage").is_err());
        assert!(parse(a, b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhi").is_err());
        // Sizes that would wrap an end offset, and a chunk without its CRLF.
        for bad in [
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffff\r\nx\r\n0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffe\r\nx\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nxyz0\r\n\r\n",
        ] {
            assert!(parse(a, bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn an_answer_that_never_ends_is_cut_at_the_limit() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut head = [0u8; 1024];
            let _ = s.read(&mut head);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\n");
            let chunk = vec![b'x'; 64 * 1024];
            while s.write_all(&chunk).is_ok() {}
        });
        // A hang guard, not a timing assert.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(request(
                addr,
                "GET",
                "/",
                None,
                None,
                Duration::from_secs(30),
            ));
        });
        let got = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the client kept reading an endless answer");
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

    #[test]
    fn answers_past_the_cap_are_refused() {
        use std::io::Write as _;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut req = [0u8; 1024];
            let _ = s.read(&mut req);
            let body = vec![b'x'; 10_000];
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(&body);
        });
        let t = HttpTarget::plain(addr);
        let e = send(&t, "GET", "/", &[], b"", Duration::from_secs(5), 4096).unwrap_err();
        assert!(
            matches!(e, HttpClientError::TooLarge { limit: 4096, .. }),
            "{e}"
        );
        server.join().unwrap();
    }
}
