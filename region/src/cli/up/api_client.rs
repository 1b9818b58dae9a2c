//! Requests to the local region's HTTP API, on any replica that answers.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http_client::request;

const TIMEOUT: Duration = Duration::from_secs(10);

/// A refused or failed API request.
#[derive(Debug, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct CallError {
    /// HTTP status (0: no answer from any replica).
    pub status: u16,
    /// The error code of the answer.
    pub code: String,
    /// Its message.
    pub message: String,
    /// Worth retrying (no answer, no leader yet, not applied yet).
    pub retryable: bool,
}

/// The replicas' HTTP addresses; requests rotate over them.
#[derive(Debug)]
pub struct ApiClient {
    replicas: Vec<SocketAddr>,
    next: AtomicUsize,
}

impl ApiClient {
    /// A client of `replicas`.
    pub fn new(replicas: Vec<SocketAddr>) -> Self {
        Self {
            replicas,
            next: AtomicUsize::new(0),
        }
    }

    /// The replicas.
    pub fn replicas(&self) -> &[SocketAddr] {
        &self.replicas
    }

    /// One request to `addr`.
    pub fn call_at(
        addr: SocketAddr,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&Value>,
    ) -> Result<Value, CallError> {
        Self::call_at_within(addr, method, path, token, body, TIMEOUT)
    }

    /// One request to `addr` whose answer may take up to `timeout` (a
    /// move answers once its migrations end).
    pub fn call_at_within(
        addr: SocketAddr,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<Value, CallError> {
        let body = body.map(Value::to_string);
        let token = (!token.is_empty()).then_some(token);
        let r = request(addr, method, path, token, body.as_deref(), timeout).map_err(|e| {
            CallError {
                status: 0,
                code: "unreachable".into(),
                message: e.to_string(),
                retryable: true,
            }
        })?;
        let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::String(r.body.clone()));
        if (200..300).contains(&r.status) {
            return Ok(v);
        }
        let e = &v["error"];
        Err(CallError {
            status: r.status,
            code: e["code"].as_str().unwrap_or("error").to_string(),
            message: e["message"].as_str().unwrap_or(&r.body).to_string(),
            retryable: r.status == 503
                || r.status == 502
                || e["retryable"].as_bool().unwrap_or(false),
        })
    }

    /// One request, to the first replica (in rotation) that answers at all.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&Value>,
    ) -> Result<Value, CallError> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut last = None;
        for k in 0..self.replicas.len() {
            let addr = self.replicas[(start + k) % self.replicas.len()];
            match Self::call_at(addr, method, path, token, body) {
                Err(e) if e.status == 0 => last = Some(e),
                other => return other,
            }
        }
        Err(last.unwrap_or(CallError {
            status: 0,
            code: "unreachable".into(),
            message: "no replica".into(),
            retryable: true,
        }))
    }

    /// [`ApiClient::call`], retried for up to 30 s while the error is
    /// retryable.
    pub fn call_retrying(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&Value>,
    ) -> Result<Value, CallError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.call(method, path, token, body) {
                Err(e) if e.retryable && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200))
                }
                other => return other,
            }
        }
    }
}
