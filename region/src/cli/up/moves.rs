//! An operator's move of a function, as `gsharectl up` makes it: `POST
//! /v1/tenants/{t}/functions/{name}/move` with `{"to": <target>}` on one
//! replica, timed by the client from send to the answer (the answer comes
//! once every move it started has ended: make-before-break, the new
//! instance resident before the old one is released).

use std::net::SocketAddr;
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

