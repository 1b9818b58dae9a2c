//! A small HTTP/1.1 client on tokio: one request per connection.
//!
//! Enough to talk to a function server on loopback: `Content-Length`,
//! `Transfer-Encoding: chunked` or read-to-close bodies, bounded header and
//! body sizes. Time limits are the caller's (`tokio::time::timeout`).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;

/// An HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The first header named `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The connection could not be opened.
    #[error("connect: {0}")]
    Connect(std::io::Error),
    /// Reading or writing failed, or the peer closed early.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The response was not valid HTTP/1.x.
    #[error("malformed response: {0}")]
    Malformed(String),
    /// The response head or body was over the limit.
    #[error("response over {0} bytes")]
    TooLarge(usize),
}

struct Reader {
    stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
    eof: bool,
}

impl Reader {
    async fn fill(&mut self) -> Result<usize, HttpError> {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            self.eof = true;
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    fn available(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// A line ending in CRLF (returned without it).
    async fn line(&mut self, limit: usize) -> Result<Vec<u8>, HttpError> {
        loop {
            if let Some(i) = self.available().windows(2).position(|w| w == b"\r\n") {
                let line = self.available()[..i].to_vec();
                self.pos += i + 2;
                return Ok(line);
            }
            if self.available().len() > limit {
                return Err(HttpError::TooLarge(limit));
            }
            if self.fill().await? == 0 {
                return Err(early_eof());
            }
        }
    }

    async fn exact(&mut self, n: usize, out: &mut Vec<u8>) -> Result<(), HttpError> {
        while self.available().len() < n {
            if self.fill().await? == 0 {
                return Err(early_eof());
            }
        }
        out.extend_from_slice(&self.available()[..n]);
        self.pos += n;
        Ok(())
    }
}

fn early_eof() -> HttpError {
    HttpError::Io(std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "connection closed before the response was complete",
    ))
}

/// Sends one request to `host:port` and reads the whole response (body at
/// most `max_body` bytes). `Connection: close` is sent.
pub async fn request(
    host: &str,
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    max_body: usize,
) -> Result<HttpResponse, HttpError> {
    let mut stream = TcpStream::connect((host, port))
        .await
        .map_err(HttpError::Connect)?;
    let _ = stream.set_nodelay(true);
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(k);
        head.push_str(": ");
        head.push_str(v);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    stream.write_all(&out).await?;

    let mut r = Reader {
        stream,
        buf: Vec::new(),
        pos: 0,
        eof: false,
    };
    let status_line = r.line(MAX_HEAD).await?;
    let status_line = String::from_utf8_lossy(&status_line).into_owned();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(HttpError::Malformed(format!("status line {status_line:?}")));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| HttpError::Malformed(format!("status line {status_line:?}")))?;
    let mut headers = Vec::new();
    let mut head_len = status_line.len();
    loop {
        let line = r.line(MAX_HEAD).await?;
        head_len += line.len() + 2;
        if head_len > MAX_HEAD {
            return Err(HttpError::TooLarge(MAX_HEAD));
        }
        if line.is_empty() {
            break;
        }
        let line = String::from_utf8_lossy(&line);
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| HttpError::Malformed(format!("header {line:?}")))?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let mut resp = HttpResponse {
        status,
        headers,
        body: Vec::new(),
    };
    let no_body = method == "HEAD" || status == 204 || status == 304 || status / 100 == 1;
    if no_body {
        return Ok(resp);
    }
    let chunked = resp
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        loop {
            let line = r.line(1024).await?;
            let line = String::from_utf8_lossy(&line);
            let size_hex = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size_hex, 16)
                .map_err(|_| HttpError::Malformed(format!("chunk size {line:?}")))?;
            if size == 0 {
                // Trailers, until an empty line.
                while !r.line(MAX_HEAD).await?.is_empty() {}
                break;
            }
            if resp.body.len() + size > max_body {
                return Err(HttpError::TooLarge(max_body));
            }
            r.exact(size, &mut resp.body).await?;
            if !r.line(2).await?.is_empty() {
                return Err(HttpError::Malformed("chunk not followed by CRLF".into()));
            }
        }
    } else if let Some(len) = resp.header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| HttpError::Malformed(format!("content-length {len:?}")))?;
        if len > max_body {
            return Err(HttpError::TooLarge(max_body));
        }
        r.exact(len, &mut resp.body).await?;
    } else {
        // Read to close.
        loop {
            let avail = r.available().len();
            if resp.body.len() + avail > max_body {
                return Err(HttpError::TooLarge(max_body));
            }
            resp.body.extend_from_slice(r.available());
            r.pos += avail;
            if r.eof || r.fill().await? == 0 {
                break;
            }
        }
    }
    Ok(resp)
}
