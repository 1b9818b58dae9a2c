//! A tiny blocking HTTP/1.1 client for `gsharectl` and the tests.
//!
//! One request per connection (`Connection: close`), JSON bodies, bearer
//! token. Enough to talk to a replica without pulling in a client stack.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

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
    /// The answer is not HTTP/1.x.
    #[error("{addr}: malformed response: {detail}")]
    Malformed {
        /// The server.
        addr: SocketAddr,
        /// What is wrong.
        detail: String,
    },
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
    let io = |source| HttpClientError::Io { addr, source };
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let body = json_body.unwrap_or("");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if json_body.is_some() {
        head.push_str("Content-Type: application/json\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(head.as_bytes()).map_err(io)?;
    stream.write_all(body.as_bytes()).map_err(io)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(io)?;
    parse(addr, &raw)
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
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    let mut body = raw[split + 4..].to_vec();
    if chunked {
        body = dechunk(&body).ok_or_else(|| bad("bad chunked body"))?;
    }
    Ok(HttpReply {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        headers,
    })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..eol]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
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
    }
}
