//! An operator's move of a function, as `gsharectl up` makes it: `POST
//! /v1/tenants/{t}/functions/{name}/move` with `{"to": <target>}` on one
//! replica, timed by the client from send to the answer (the answer comes
//! once every move it started has ended: make-before-break, the new
//! instance resident before the old one is released).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::json;

use super::api_client::{ApiClient, CallError};
use crate::api::function_move::MoveAnswer;
use crate::scheduler::MIGRATION_WAIT;

/// How long the move's answer may take: each of its moves waits for the
/// leader's longest wait, and a margin.
const MOVE_TIMEOUT: Duration = Duration::from_secs(MIGRATION_WAIT.as_secs() + 30);

/// What one move call gave.
#[derive(Debug)]
pub struct Moved {
    /// From send to the answer.
    pub took: Duration,
    /// The answer, or why there was none.
    pub answer: Result<MoveAnswer, CallError>,
}

impl Moved {
    /// The moves that completed (the old instance released).
    pub fn completed(&self) -> usize {
        self.answer.as_ref().map_or(0, |a| {
            a.moves.iter().filter(|m| m.outcome == "completed").count()
        })
    }

    /// The answer in a few words (`2 moves: completed, completed`).
    pub fn describe(&self) -> String {
        match &self.answer {
            Ok(a) => {
                let outcomes: Vec<String> = a
                    .moves
                    .iter()
                    .map(|m| format!("{} → {} on {}: {}", m.from, m.to, m.node.0, m.outcome))
                    .collect();
                format!(
                    "target {}, {} move{}{}{}, {} already there",
                    a.target,
                    a.moves.len(),
                    if a.moves.len() == 1 { "" } else { "s" },
                    if outcomes.is_empty() { "" } else { ": " },
                    outcomes.join(", "),
                    a.already_there
                )
            }
            Err(e) => format!("refused: {e}"),
        }
    }
}

/// Moves `tenant/name` to `to` through the replica at `replica` with the
/// `operator` token; blocks until the answer.
pub fn move_function(
    replica: SocketAddr,
    operator: &str,
    tenant: &str,
    name: &str,
    to: &str,
) -> Moved {
    let began = Instant::now();
    let body = json!({ "to": to });
    let answer = ApiClient::call_at_within(
        replica,
        "POST",
        &format!("/v1/tenants/{tenant}/functions/{name}/move"),
        operator,
        Some(&body),
        MOVE_TIMEOUT,
    )
    .and_then(|v| {
        serde_json::from_value::<MoveAnswer>(v.clone()).map_err(|e| CallError {
            status: 200,
            code: "bad_answer".into(),
            message: format!("{e}: {v}"),
            retryable: false,
        })
    });
    Moved {
        took: began.elapsed(),
        answer,
    }
}

/// The demo's move: one function moved by the operator API while the load
/// runs, in a thread (off the load's path).
pub struct DemoMove {
    /// `tenant/name`.
    pub function: String,
    /// Its node before, and the node it is moved to.
    pub from: String,
    /// The target node.
    pub to: String,
    thread: Option<JoinHandle<Option<(Instant, Moved)>>>,
    /// When the move call was sent and answered.
    window: Option<(Instant, Instant)>,
}

impl DemoMove {
    /// After `delay` (unless `stop` is set first), moves `tenant/name`
    /// from `from` to the node `to` through `replica`.
    pub fn start(
        replica: SocketAddr,
        operator: String,
        (tenant, name): (&str, &str),
        from: String,
        to: String,
        delay: Duration,
        stop: Arc<AtomicBool>,
    ) -> Self {
        let (t, n, target) = (tenant.to_string(), name.to_string(), to.clone());
        let thread = std::thread::Builder::new()
            .name("up-demo-move".into())
            .spawn(move || {
                let at = Instant::now() + delay;
                while Instant::now() < at {
                    if stop.load(Ordering::Relaxed) {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                let sent = Instant::now();
                let m = move_function(replica, &operator, &t, &n, &format!("node:{target}"));
                Some((sent, m))
            })
            .ok();
        Self {
            function: format!("{tenant}/{name}"),
            from,
            to,
            thread,
            window: None,
        }
    }

    /// Waits for the move; `None` if it was not made (a signal came first).
    pub fn finish(&mut self) -> Option<Moved> {
        let (sent, m) = self.thread.take().and_then(|h| h.join().ok().flatten())?;
        self.window = Some((sent, sent + m.took));
        Some(m)
    }

    /// When the move call was sent and answered (after [`DemoMove::finish`]).
    pub fn window(&self) -> Option<(Instant, Instant)> {
        self.window
    }
}
