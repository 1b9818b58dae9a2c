//! A small HTTP/1.1 client on tokio: one request per connection.
//!
//! Enough to talk to a function server on loopback: `Content-Length`,
//! `Transfer-Encoding: chunked` or read-to-close bodies, bounded header and
//! body sizes. Time limits are the caller's (`tokio::time::timeout`).
//!
//! The function server is untrusted: every length it announces (a
//! `Content-Length`, a chunk size) is compared with what is left of the
//! body limit before anything is read, bytes already parsed are dropped
//! from the buffer, and the head, a chunk-size line and the trailers are
//! each bounded, so what the agent holds for one response stays under
//! `max_body` plus [`MAX_HEAD`] plus one read, whatever the server sends.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response head accepted (status line and headers; also the
/// trailers of a chunked body).
pub const MAX_HEAD: usize = 64 * 1024;

/// Longest chunk-size line (size and extensions) accepted.
const MAX_CHUNK_LINE: usize = 1024;

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

struct Reader<S> {
    stream: S,
    buf: Vec<u8>,
    pos: usize,
    eof: bool,
}

impl<S: AsyncRead + Unpin> Reader<S> {
    async fn fill(&mut self) -> Result<usize, HttpError> {
        // Drop what was parsed: the buffer holds only unread bytes.
        if self.pos > 0 {
            self.buf.drain(..self.pos);
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
    read_response(stream, method, max_body).await
}

/// Reads one response to a `method` request from `stream` (body at most
/// `max_body` bytes).
pub async fn read_response<S: AsyncRead + Unpin>(
    stream: S,
    method: &str,
    max_body: usize,
) -> Result<HttpResponse, HttpError> {
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
            let line = r.line(MAX_CHUNK_LINE).await?;
            let line = String::from_utf8_lossy(&line);
            let size_hex = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size_hex, 16)
                .map_err(|_| HttpError::Malformed(format!("chunk size {line:?}")))?;
            if size == 0 {
                // Trailers, until an empty line; all of them within MAX_HEAD.
                let mut trailers = 0usize;
                loop {
                    let line = r.line(MAX_HEAD).await?;
                    if line.is_empty() {
                        break;
                    }
                    trailers = trailers.saturating_add(line.len().saturating_add(2));
                    if trailers > MAX_HEAD {
                        return Err(HttpError::TooLarge(MAX_HEAD));
                    }
                }
                break;
            }
            // What is left of the limit, not `len + size` (a size near
            // usize::MAX would wrap that sum and pass).
            if size > max_body.saturating_sub(resp.body.len()) {
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
            if avail > max_body.saturating_sub(resp.body.len()) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::net::TcpListener;

    /// A hang guard, not a timing assert: on failure the request would
    /// otherwise wait for the caller's deadline.
    const GUARD: Duration = Duration::from_secs(30);

    /// A function server on loopback that answers one request with
    /// `answer`, then keeps sending `flood` (if any) and holds the
    /// connection open until the client goes away.
    async fn server(answer: &'static [u8], flood: Option<&'static [u8]>) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).await.unwrap_or(0) == 1 {
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
        port
    }

    async fn ask(port: u16, max_body: usize) -> Result<HttpResponse, HttpError> {
        tokio::time::timeout(
            GUARD,
            request("127.0.0.1", port, "POST", "/", &[], b"{}", max_body),
        )
        .await
        .expect("the client waited on the server instead of refusing the response")
    }

    #[tokio::test]
    async fn a_chunk_size_that_would_wrap_the_limit_is_refused_at_once() {
        let port = server(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\nffffffffffffffff\r\n",
            None,
        )
        .await;
        match ask(port, 1024).await {
            Err(HttpError::TooLarge(1024)) => {}
            other => panic!("expected TooLarge(1024), got {other:?}"),
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
        let port = server(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabcdef", None).await;
        assert!(matches!(ask(port, 5).await, Err(HttpError::TooLarge(5))));
    }

    #[tokio::test]
    async fn the_buffer_keeps_only_unparsed_bytes() {
        // 1-byte chunks with long extensions: parsed lines must not pile up.
        let mut text = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        let ext = "e".repeat(900);
        for _ in 0..200 {
            text.extend_from_slice(format!("1;{ext}\r\nz\r\n").as_bytes());
        }
        text.extend_from_slice(b"0\r\n\r\n");
        let mut r = Reader {
            stream: &text[..],
            buf: Vec::new(),
            pos: 0,
            eof: false,
        };
        let mut most = 0;
        while r.fill().await.unwrap() > 0 {
            most = most.max(r.buf.len());
            // Consume everything but the last partial line, as the parser does.
            let keep = r.available().len() % 1000;
            r.pos = r.buf.len() - keep;
        }
        assert!(most <= 16 * 1024 + 1000, "buffer grew to {most} bytes");
        let resp = read_response(&text[..], "POST", 1 << 20).await.unwrap();
        assert_eq!(resp.body, vec![b'z'; 200]);
    }
}
