//! Helpers for the tests that talk to functions as an HTTP client would:
//! the Python `openai` package (installed by `.ci/run` under
//! `target/pydeps`), the fake OpenAI-compatible server the `process` driver
//! runs, and a raw HTTP/1.1 exchange that shows a cut reply as it is.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `tests/fixtures/openai_server.py`: a tiny OpenAI-compatible chat server.
pub const OPENAI_SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/openai_server.py");

/// Where `.ci/run` installs the Python `openai` package (`pip install
/// --target`, so that the machine's own Python packages stay as they are).
const PYDEPS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/pydeps");

/// `python3` with [`PYDEPS`] on its path.
pub fn python3() -> Command {
    let mut c = Command::new("python3");
    let path = match std::env::var_os("PYTHONPATH") {
        Some(p) => format!("{PYDEPS}:{}", p.to_string_lossy()),
        None => PYDEPS.to_string(),
    };
    c.env("PYTHONPATH", path);
    c
}

/// Whether the Python `openai` package is importable; in CI
/// (`GSHARE_CI=1`; `.ci/run` installs it) its absence fails the test.
pub fn openai_package() -> bool {
    let ok = python3()
        .args(["-c", "import openai"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("GSHARE_CI").is_none(),
            "the Python openai package is missing (pip install --target target/pydeps openai)"
        );
        eprintln!("skipped: the Python openai package is missing (pip install --target target/pydeps openai)");
    }
    ok
}

/// One raw HTTP/1.1 exchange (`Connection: close`): status, headers
/// (lower-case names, in order), body.
pub fn exchange(addr: SocketAddr, request: String) -> (u16, Vec<(String, String)>, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    // Until the server closes (or resets: a cut reply) the connection.
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(n @ 1..) = s.read(&mut chunk) {
        raw.extend_from_slice(&chunk[..n]);
    }
    let out = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

/// The first header named `name` (lower-case).
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}
