//! The history of one nemesis run: every client operation and every fault,
//! with its start and end (ms since the run began) and what the client can
//! honestly say about it.
//!
//! ```text
//!   attempt ─▶ HTTP answer ─▶ Attempt::{Ok, Definite{code, retry}, Unknown}
//!   attempts of one op (same idempotency key) ─▶ Outcome:
//!       any Ok ─▶ Ok · else any Unknown ─▶ Unknown · else Fail(last code)
//! ```
//!
//! How an answer is classified, from the API's documented shapes
//! (`region/src/api/error.rs`, docs/edge.md "Idempotency keys"):
//!
//! | answer | attempt |
//! |---|---|
//! | 2xx | ok |
//! | no connection (`HttpClientError::Connect`: nothing was sent) | definite, retried |
//! | a request that is not HTTP (`HttpClientError::Request`: nothing was sent) | definite, not retried |
//! | timeout, reset or malformed answer after the request was sent | unknown |
//! | `502 outcome_unknown` | unknown (retried with the same key) |
//! | `500`, or any 5xx without the error shape (`X-Gshare-Error`) | unknown |
//! | any other error with the shape (`421 not_leader`, `503 no_leader`, `409 quota_exceeded`, `404`, `503 no_agent`, `504 deadline_unreachable` …) | definite; retried when `retryable` |
//!
//! A later definite refusal does not resolve an earlier unknown attempt (an
//! invocation refused `503 no_agent` now may have run on the first try), so
//! an op with an unknown attempt and no success stays unknown.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gshare_region::http_client::{HttpClientError, HttpReply};
use serde_json::Value;

/// What one operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OpKind {
    /// `POST /v1/tenants` (operator).
    CreateTenant,
    /// `POST /v1/tenants/{t}/tokens` (operator).
    IssueToken,
    /// `POST /v1/functions` under an idempotency key.
    Deploy,
    /// `PUT /v1/functions/{name}` under an idempotency key.
    Update,
    /// `DELETE /v1/functions/{name}` under an idempotency key.
    Delete,
    /// `POST /v1/invoke/{t}/{name}` under an idempotency key, through a
    /// replica or an agent's ingress.
    Invoke,
    /// `GET /v1/cluster/state` of one replica, checked against quotas and
    /// capacity while the run goes on.
    Sample,
    /// A fault of the nemesis (start: applied, end: healed).
    Fault,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            OpKind::CreateTenant => "create-tenant",
            OpKind::IssueToken => "issue-token",
            OpKind::Deploy => "deploy",
            OpKind::Update => "update",
            OpKind::Delete => "delete",
            OpKind::Invoke => "invoke",
            OpKind::Sample => "sample",
            OpKind::Fault => "fault",
        };
        f.write_str(s)
    }
}

/// What a client finally knows of one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It took effect; the value it answered (e.g. a token).
    Ok(String),
    /// It did not take effect: why (the error code).
    Fail(String),
    /// It may or may not have taken effect: the last thing heard.
    Unknown(String),
}

impl Outcome {
    /// Whether it is [`Outcome::Ok`].
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok(_))
    }

    /// Whether it is [`Outcome::Unknown`].
    pub fn is_unknown(&self) -> bool {
        matches!(self, Outcome::Unknown(_))
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Ok(v) if v.is_empty() => f.write_str("ok"),
            Outcome::Ok(v) => write!(f, "ok {}", short(v)),
            Outcome::Fail(why) => write!(f, "FAIL {}", short(why)),
            Outcome::Unknown(why) => write!(f, "UNKNOWN {}", short(why)),
        }
    }
}

fn short(s: &str) -> String {
    let s = s.replace('\n', " ");
    if s.chars().count() > 120 {
        format!("{}…", s.chars().take(120).collect::<String>())
    } else {
        s
    }
}

/// One recorded operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Who ran it (`deployer-0`, `invoker-1`, `nemesis`, `probe` …).
    pub client: String,
    /// What it is.
    pub kind: OpKind,
    /// What it acts on (`acme/d0-3`, a tenant name, an idempotency key …).
    pub target: String,
    /// Its arguments, for humans (e.g. `deadline_ms=300`).
    pub args: String,
    /// When the first attempt was sent, ms since the run began.
    pub start_ms: u64,
    /// When the outcome was settled, ms since the run began.
    pub end_ms: u64,
    /// How many attempts were sent.
    pub attempts: u32,
    /// Each attempt: where it went and what it heard (`r2 unknown …`).
    pub trail: Vec<String>,
    /// What the client knows.
    pub outcome: Outcome,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{:>7}..{:>7} ms] {:<11} {:<13} {} {}{} -> {}",
            self.start_ms,
            self.end_ms,
            self.client,
            self.kind.to_string(),
            self.target,
            self.args,
            if self.attempts > 1 {
                format!(" [{}]", self.trail.join(" | "))
            } else {
                String::new()
            },
            self.outcome
        )
    }
}

/// The shared, append-only history of one run.
#[derive(Debug, Clone)]
pub struct History {
    t0: Instant,
    ops: Arc<Mutex<Vec<Op>>>,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> History {
        History {
            t0: Instant::now(),
            ops: Arc::default(),
        }
    }

    /// Milliseconds since the run began.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.t0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Appends one settled operation.
    pub fn record(&self, op: Op) {
        self.ops.lock().unwrap_or_else(|p| p.into_inner()).push(op);
    }

    /// Every operation so far, by start time.
    pub fn ops(&self) -> Vec<Op> {
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner()).clone();
        ops.sort_by_key(|o| (o.start_ms, o.end_ms));
        ops
    }
}

/// The shortest excerpt of `ops` that shows a violation about `involved`:
/// those ops, and the faults that overlap the time they span.
pub fn excerpt(ops: &[Op], involved: impl Fn(&Op) -> bool) -> String {
    let mine: Vec<&Op> = ops.iter().filter(|o| involved(o)).collect();
    let (Some(from), Some(to)) = (
        mine.iter().map(|o| o.start_ms).min(),
        mine.iter().map(|o| o.end_ms).max(),
    ) else {
        return "  (no operation in the history)\n".to_string();
    };
    ops.iter()
        .filter(|o| {
            involved(o) || (o.kind == OpKind::Fault && o.start_ms <= to && o.end_ms >= from)
        })
        .map(|o| format!("  {o}\n"))
        .collect()
}

/// What one attempt's answer tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// 2xx (or an answer the op counts as success): the body.
    Ok(String),
    /// A definite refusal: nothing took effect in this attempt.
    Definite {
        /// The error code (or `not_sent`, `http-<status>`).
        code: String,
        /// Whether the same request may succeed later.
        retry: bool,
    },
    /// It may have taken effect.
    Unknown(String),
}

/// The error code of an answer: `X-Gshare-Error`, else the body's
/// `error.code` (the one error shape of replicas and agents).
pub fn error_code(r: &HttpReply) -> Option<String> {
    if let Some(h) = r.header("x-gshare-error") {
        return Some(h.to_string());
    }
    serde_json::from_str::<Value>(&r.body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(String::from))
}

/// Classifies one attempt's answer (see the module's table).
pub fn classify(answer: &Result<HttpReply, HttpClientError>) -> Attempt {
    let r = match answer {
        Err(HttpClientError::Connect { .. }) => {
            return Attempt::Definite {
                code: "not_sent".into(),
                retry: true,
            }
        }
        Err(HttpClientError::Request { .. }) => {
            return Attempt::Definite {
                code: "invalid_request".into(),
                retry: false,
            }
        }
        Err(e) => return Attempt::Unknown(e.to_string()),
        Ok(r) => r,
    };
    if (200..300).contains(&r.status) {
        return Attempt::Ok(r.body.clone());
    }
    let Some(code) = error_code(r) else {
        return if r.status >= 500 {
            Attempt::Unknown(format!("HTTP {} without an error code", r.status))
        } else {
            Attempt::Definite {
                code: format!("http-{}", r.status),
                retry: false,
            }
        };
    };
    if code == "outcome_unknown" || r.status == 500 {
        return Attempt::Unknown(format!("{} {code}", r.status));
    }
    let retry = serde_json::from_str::<Value>(&r.body)
        .ok()
        .and_then(|v| v["error"]["retryable"].as_bool())
        .unwrap_or(matches!(r.status, 421 | 429 | 503));
    Attempt::Definite { code, retry }
}

/// Folds the attempts of one op into its [`Outcome`].
#[derive(Debug, Default)]
pub struct Resolution {
    ok: Option<String>,
    unknown: Option<String>,
    last_definite: Option<String>,
    /// Attempts sent.
    pub attempts: u32,
    /// Each attempt, for the history.
    pub trail: Vec<String>,
}

impl Resolution {
    /// Adds one attempt; returns whether to try again (the op is not
    /// settled: no success and no final refusal yet).
    pub fn add(&mut self, a: Attempt) -> bool {
        self.add_at("", a)
    }

    /// [`Resolution::add`], noting that the attempt went to `to`.
    pub fn add_at(&mut self, to: &str, a: Attempt) -> bool {
        self.attempts += 1;
        self.trail.push(match &a {
            Attempt::Ok(_) => format!("{to} ok"),
            Attempt::Definite { code, .. } => format!("{to} {code}"),
            Attempt::Unknown(why) => format!("{to} UNKNOWN {}", short(why)),
        });
        match a {
            Attempt::Ok(body) => {
                self.ok = Some(body);
                false
            }
            Attempt::Unknown(why) => {
                self.unknown = Some(why);
                true
            }
            Attempt::Definite { code, retry } => {
                self.last_definite = Some(code);
                retry
            }
        }
    }

    /// What the client knows after its last attempt.
    pub fn outcome(self) -> Outcome {
        match (self.ok, self.unknown, self.last_definite) {
            (Some(body), _, _) => Outcome::Ok(body),
            (None, Some(why), last) => Outcome::Unknown(match last {
                Some(code) => format!("{why}; last answer {code}"),
                None => why,
            }),
            (None, None, Some(code)) => Outcome::Fail(code),
            (None, None, None) => Outcome::Unknown("no attempt".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, code: Option<&str>, retryable: bool) -> HttpReply {
        let mut headers = Vec::new();
        let body = match code {
            Some(c) => {
                headers.push(("x-gshare-error".to_string(), c.to_string()));
                serde_json::json!({"error": {"code": c, "message": "m", "retryable": retryable}})
                    .to_string()
            }
            None => String::new(),
        };
        HttpReply {
            status,
            body,
            headers,
        }
    }

    #[test]
    fn answers_are_classified_as_the_api_documents() {
        assert!(matches!(
            classify(&Ok(reply(201, None, false))),
            Attempt::Ok(_)
        ));
        assert!(matches!(
            classify(&Ok(reply(502, Some("outcome_unknown"), true))),
            Attempt::Unknown(_)
        ));
        assert!(matches!(
            classify(&Ok(reply(502, None, false))),
            Attempt::Unknown(_)
        ));
        assert!(matches!(
            classify(&Ok(reply(500, Some("internal"), false))),
            Attempt::Unknown(_)
        ));
        assert_eq!(
            classify(&Ok(reply(409, Some("quota_exceeded"), false))),
            Attempt::Definite {
                code: "quota_exceeded".into(),
                retry: false
            }
        );
        assert_eq!(
            classify(&Ok(reply(421, Some("not_leader"), true))),
            Attempt::Definite {
                code: "not_leader".into(),
                retry: true
            }
        );
        let refused = HttpClientError::Connect {
            addr: "127.0.0.1:1".parse().unwrap(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert!(matches!(
            classify(&Err(refused)),
            Attempt::Definite { retry: true, .. }
        ));
        let reset = HttpClientError::Io {
            addr: "127.0.0.1:1".parse().unwrap(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionReset),
        };
        assert!(matches!(classify(&Err(reset)), Attempt::Unknown(_)));
        let not_http = HttpClientError::Request {
            addr: "127.0.0.1:1".parse().unwrap(),
            detail: "target \"x\" does not start with `/`".into(),
        };
        assert!(matches!(
            classify(&Err(not_http)),
            Attempt::Definite { retry: false, .. }
        ));
    }

    #[test]
    fn an_unknown_attempt_is_not_resolved_by_a_later_refusal() {
        let mut r = Resolution::default();
        assert!(r.add(Attempt::Unknown("timeout".into())));
        assert!(!r.add(Attempt::Definite {
            code: "unknown_function".into(),
            retry: false
        }));
        assert!(r.outcome().is_unknown());
        let mut r = Resolution::default();
        r.add(Attempt::Unknown("timeout".into()));
        r.add(Attempt::Ok("replayed".into()));
        assert!(r.outcome().is_ok());
        let mut r = Resolution::default();
        r.add(Attempt::Definite {
            code: "not_sent".into(),
            retry: true,
        });
        r.add(Attempt::Definite {
            code: "quota_exceeded".into(),
            retry: false,
        });
        assert_eq!(r.outcome(), Outcome::Fail("quota_exceeded".into()));
    }
}
