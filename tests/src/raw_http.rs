//! Hand-made HTTP/1.1 requests for the tests of gshare's HTTP surfaces: any
//! `Authorization` value, extra headers, a declared length other than the
//! body's, and the answer's headers; and the check of the one error shape.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use gshare_core::http_surface::ERROR_HEADER;
use gshare_region::http_client::HttpReply;

/// Sends `method path` with `headers` (e.g. `("Authorization", "Bearer x")`),
/// declaring `content_length` bytes but sending only `body` (so a large
/// declared body can be refused without being sent), and reads the answer.
/// Status 0 when no HTTP answer came.
pub fn raw_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    content_length: usize,
) -> HttpReply {
    let answer = || -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!("Content-Length: {content_length}\r\n\r\n"));
        s.write_all(head.as_bytes())?;
        s.write_all(body)?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        Ok(raw)
    };
    reply_of(&answer().unwrap_or_default())
}

/// Sends `parts` to `addr` one after the other with `pause` between them
/// (a request, head and body, that comes in pieces; a client that sends
/// part of its body and then stalls when the last part is not its end)
/// and reads the answer until the server closes the connection (or 30 s
/// pass). Status 0 when no HTTP answer came.
pub fn paced(addr: SocketAddr, parts: &[&[u8]], pause: Duration) -> HttpReply {
    let answer = || -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                std::thread::sleep(pause);
            }
            // The server may answer (and close) before the last part.
            if s.write_all(part).is_err() {
                break;
            }
        }
        let mut raw = Vec::new();
        let mut chunk = [0u8; 4096];
        // Until an answer with a length is complete (a server may keep
        // reading, to discard it, the rest of a body it refused), or the
        // server closes.
        while !complete(&raw) {
            match s.read(&mut chunk) {
                Ok(n @ 1..) => raw.extend_from_slice(&chunk[..n]),
                _ => break,
            }
        }
        Ok(raw)
    };
    reply_of(&answer().unwrap_or_default())
}

/// Whether `raw` holds a whole answer whose head gives its length.
fn complete(raw: &[u8]) -> bool {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    head.lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .is_some_and(|len| raw.len() >= end + 4 + len)
}

/// An HTTP/1.1 answer as read off the wire (status 0 when none; header
/// names lower-cased; the body as sent, chunk sizes included).
pub fn reply_of(raw: &[u8]) -> HttpReply {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    HttpReply {
        status,
        body: body.to_string(),
        headers: lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect(),
    }
}

/// Asserts `r` is an error gshare produced: `status`, the body
/// `{"error": {"code": code, "message": <non-empty>, "retryable"}}` and the
/// header `X-Gshare-Error: <code>`.
pub fn assert_error(r: &HttpReply, status: u16, code: &str, retryable: bool) {
    assert_eq!(r.status, status, "{r:?}");
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
    let e = &v["error"];
    assert_eq!(e["code"], code, "{r:?}");
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{r:?}"
    );
    assert_eq!(e["retryable"], retryable, "{r:?}");
    assert_eq!(r.header(ERROR_HEADER), Some(code), "{r:?}");
}

/// Reads from `s` into `buf` until it holds `want` (or the stream ends or
/// times out); whether it does.
fn read_until(s: &mut TcpStream, buf: &mut Vec<u8>, want: &str) -> bool {
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(buf).contains(want) {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

/// A chunked upload to `addr`'s `path`: part 1, then (once the function's
/// streamed reply acknowledged it: `got <len>`) part 2 and the body's end;
/// everything the server sent back, and whether the acknowledgement came
/// before part 2 was sent.
pub fn upload_in_two_parts(
    addr: SocketAddr,
    path: &str,
    token: &str,
    part1: &[u8],
    part2: &[u8],
) -> (bool, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n",
        part1.len()
    )
    .unwrap();
    s.write_all(part1).unwrap();
    s.write_all(b"\r\n").unwrap();
    let mut got = Vec::new();
    let acked = read_until(&mut s, &mut got, &format!("got {}\n", part1.len()));
    // Part 2 goes whatever came back (a body that does not stream is then
    // read whole and the acknowledgement comes late).
    let _ = write!(s, "{:x}\r\n", part2.len());
    let _ = s.write_all(part2);
    let _ = s.write_all(b"\r\n0\r\n\r\n");
    let mut chunk = [0u8; 4096];
    while let Ok(n @ 1..) = s.read(&mut chunk) {
        got.extend_from_slice(&chunk[..n]);
    }
    (acked, String::from_utf8_lossy(&got).into_owned())
}
