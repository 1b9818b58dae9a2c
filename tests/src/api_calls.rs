//! The steps the multi-process tests share: an HTTP call whose transport
//! error is a reply with status 0, its JSON body, polling until a
//! condition holds, and a simulated agent process killed when dropped.

use gshare_region::http_client::{request, HttpReply};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `method path` at `addr` with `token` (20 s timeout); a transport error
/// comes back as status 0 with the error as its body.
pub fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&str>,
) -> HttpReply {
    request(
        addr,
        method,
        path,
        Some(token),
        body,
        Duration::from_secs(20),
    )
    .unwrap_or_else(|e| HttpReply {
        status: 0,
        body: e.to_string(),
        ..HttpReply::default()
    })
}

/// The reply's body as JSON (`Null` when it is not).
pub fn json_of(r: &HttpReply) -> Value {
    serde_json::from_str(&r.body).unwrap_or(Value::Null)
}

/// Polls `f` every 100 ms until it gives a value; panics naming `what`
/// after `secs`.
pub fn until<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(r) = f() {
            return r;
        }
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A `gshare-edge` process, killed (SIGKILL) and reaped when dropped.
pub struct AgentProcess(Child);

impl AgentProcess {
    /// Starts `gshare-edge --config <config>` with its output discarded.
    pub fn start(config: &Path) -> AgentProcess {
        AgentProcess(
            Command::new(crate::binary("gshare-edge"))
                .arg("--config")
                .arg(config)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start gshare-edge"),
        )
    }

    /// Starts `gshare-edge --config <config>` with its log (stderr)
    /// written to `log`.
    pub fn start_logged(config: &Path, log: &Path) -> anyhow::Result<AgentProcess> {
        let err = std::fs::File::create(log)?;
        Ok(AgentProcess(
            Command::new(crate::binary("gshare-edge"))
                .arg("--config")
                .arg(config)
                .stdout(Stdio::null())
                .stderr(Stdio::from(err))
                .spawn()?,
        ))
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
