//! Errors of the process runtime: starting an instance, and invoking it.

use super::Phase;
use gshare_core::net::http_client::HttpError;
use std::time::Duration;

/// A process instance could not be started (or stopped cleanly).
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The spec is unusable (e.g. empty argv).
    #[error("instance {instance}: invalid spec: {reason}")]
    InvalidSpec {
        /// The instance.
        instance: String,
        /// What is wrong.
        reason: String,
    },
    /// The program could not be executed.
    #[error("instance {instance}: cannot start {program:?}: {source}")]
    Spawn {
        /// The instance.
        instance: String,
        /// argv[0].
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The process exited before its health check passed.
    #[error("instance {instance}: exited during start-up ({status})")]
    ExitedDuringStart {
        /// The instance.
        instance: String,
        /// Its exit status, printed.
        status: String,
    },
    /// The health check did not pass in time (the process was killed).
    #[error("instance {instance}: not healthy after {after:?}")]
    Unhealthy {
        /// The instance.
        instance: String,
        /// The start-up timeout.
        after: Duration,
    },
    /// The instance was stopped while starting.
    #[error("instance {instance}: stopped during start-up")]
    StoppedDuringStart {
        /// The instance.
        instance: String,
    },
}

/// An invocation that got no response from the function. Every invocation
/// ends in a response or one of these; none hangs past its deadline.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    /// The deadline passed (waiting for a restart, or for the response).
    #[error("instance {instance}: deadline of {deadline:?} exceeded ({while_})")]
    DeadlineExceeded {
        /// The instance.
        instance: String,
        /// The deadline given.
        deadline: Duration,
        /// What it was doing: `waiting for restart` or `waiting for response`.
        while_: &'static str,
    },
    /// The request's streamed body was cut (the client left, or went over
    /// `max_request_bytes`): the call to the function was aborted.
    #[error("instance {instance}: the call was aborted: the request body was cut before its end")]
    RequestCut {
        /// The instance.
        instance: String,
    },
    /// The process died (or was restarted) while the invocation was in flight.
    #[error("instance {instance}: process crashed during the invocation (start #{generation})")]
    Crashed {
        /// The instance.
        instance: String,
        /// Which start of the process it was sent to (1 = the first).
        generation: u64,
    },
    /// The instance takes no invocations: stopped, or failed for good.
    #[error("instance {instance}: unavailable ({phase:?})")]
    Unavailable {
        /// The instance.
        instance: String,
        /// Its phase.
        phase: Phase,
    },
    /// The request failed while the process stayed up (bad response, reset).
    #[error("instance {instance}: {source}")]
    Transport {
        /// The instance.
        instance: String,
        /// What went wrong.
        source: HttpError,
    },
}

impl InvokeError {
    /// A stable short code for metrics and error bodies.
    pub fn code(&self) -> &'static str {
        match self {
            InvokeError::DeadlineExceeded { .. } => "deadline_exceeded",
            InvokeError::Crashed { .. } => "function_crashed",
            InvokeError::RequestCut { .. } => "request_cut",
            InvokeError::Unavailable { .. } => "instance_unavailable",
            InvokeError::Transport { .. } => "instance_error",
        }
    }
}
