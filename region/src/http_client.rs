//! A tiny blocking HTTP/1.1 client for `gsharectl` and the tests.
//!
//! One request per connection (`Connection: close`), JSON bodies, bearer
//! token. Enough to talk to a replica without pulling in a client stack.
//! An answer is read up to [`MAX_REPLY_BYTES`]; a server that sends more
//! (or never stops) gets [`HttpClientError::TooLarge`], not all our memory.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Largest answer read, head and body (a `GET /v1/cluster/state` of a
/// 1,000-node region is a few MiB).
pub const MAX_REPLY_BYTES: usize = 64 << 20;

/// A request that got no HTTP answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
    /// Connecting, sending or receiving failed.
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
}

/// An HTTP answer: status and body text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    /// Status code.
    pub status: u16,
    /// Body as text (lossy UTF-8).
    pub body: String,
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
    request_with(addr, method, path, token, &[], json_body, timeout).map(|(r, _)| r)
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
    let io = |source| HttpClientError::Io { addr, source };
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let body = json_body.unwrap_or("");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if json_body.is_some() {
        head.push_str("Content-Type: application/json\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(head.as_bytes()).map_err(io)?;
    stream.write_all(body.as_bytes()).map_err(io)?;
    let raw = match read_bounded(&mut stream, MAX_REPLY_BYTES).map_err(io)? {
        Some(raw) => raw,
        None => {
            return Err(HttpClientError::TooLarge {
                addr,
                limit: MAX_REPLY_BYTES,
            })
        }
    };
    let reply = parse(addr, &raw)?;
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(raw.len());
    let answer_headers = String::from_utf8_lossy(&raw[..end])
        .split("\r\n")
        .skip(1)
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            Some((n.trim().to_ascii_lowercase(), v.trim().to_string()))
        })
        .collect();
    Ok((reply, answer_headers))
}

/// Reads `r` to its end if that is at most `limit` bytes; `None` (after
/// reading `limit + 1` bytes, no more) if it is longer.
pub fn read_bounded(r: &mut impl Read, limit: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut raw = Vec::new();
    r.take(u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut raw)?;
    Ok((raw.len() <= limit).then_some(raw))
}

fn parse(addr: SocketAddr, raw: &[u8]) -> Result<HttpReply, HttpClientError> {
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
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let mut body = raw[split + 4..].to_vec();
    if chunked {
        body = dechunk(&body).ok_or_else(|| bad("bad chunked body"))?;
    }
    Ok(HttpReply {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
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
        let r = parse(a, b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap();
        assert_eq!((r.status, r.body.as_str()), (404, "abcde"));
        assert!(parse(a, b"garbage").is_err());
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
    fn read_bounded_stops_after_the_limit() {
        let data = vec![1u8; 10];
        assert_eq!(
            read_bounded(&mut &data[..], 10).unwrap(),
            Some(data.clone())
        );
        assert_eq!(read_bounded(&mut &data[..], 9).unwrap(), None);
        assert_eq!(read_bounded(&mut &data[..0], 0).unwrap(), Some(Vec::new()));
    }
}
