//! The one error answer of the replica: `{"error": {"code", "message",
//! "retryable", …}}` with the header `X-Gshare-Error: <code>`, for the API,
//! the invoke route, unknown routes and methods, and forwarded answers
//! (the shape itself is core's [`ErrorBody`], shared with the agents).
//! The answers of writes that carry an idempotency key add
//! `"idempotency_key"` (and the `Idempotency-Key` header).

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use gshare_core::http_surface::{retryable_status, ErrorBody, ERROR_HEADER};
use gshare_core::protocol::InvokeError;
use gshare_core::state::{ApplyError, ErrorClass, PlanRejection, QueryError, RejectReason};

use crate::proposer::WriteError;

/// An API refusal with a stable code.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code (e.g. `quota_exceeded`).
    pub code: &'static str,
    /// For humans.
    pub message: String,
    /// The leader (id, HTTP address) where a `not_leader` refusal names one.
    leader: Option<(Option<u64>, Option<String>)>,
    /// Set where the code, not the status, decides (invocations).
    retry: Option<bool>,
    /// The idempotency key the write ran under (retry with it).
    pub idempotency_key: Option<String>,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            leader: None,
            retry: None,
            idempotency_key: None,
        }
    }

    /// The same error, naming the idempotency key of the write.
    pub fn with_key(mut self, key: &str) -> Self {
        self.idempotency_key = Some(key.to_string());
        self
    }

    /// 502 `outcome_unknown`: whether the write took effect is not known
    /// (the replica tried to learn it); retry with the same key.
    pub fn outcome_unknown(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::BAD_GATEWAY, "outcome_unknown", message);
        e.retry = Some(true);
        e
    }

    /// The answer to a value out of its range (`invalid_spec`, 422, naming
    /// the field and the bound), exactly as apply would refuse it.
    pub fn from_bounds(e: gshare_core::bounds::OutOfBounds) -> Self {
        Self::from_apply(&ApplyError::from(e))
    }

    /// 404 `unknown_route`: no route for this path and method.
    pub fn unknown_route(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "unknown_route",
            format!("no route for {method} {path}"),
        )
    }

    /// 421 `not_leader`, naming the leader if known (clients follow it).
    pub fn not_leader(leader: Option<u64>, leader_http: Option<String>) -> Self {
        let mut e = Self::new(
            StatusCode::MISDIRECTED_REQUEST,
            "not_leader",
            "not the leader",
        );
        e.leader = Some((leader, leader_http));
        e.retry = Some(true);
        e
    }

    /// The answer to an invocation that ended in an error (the agent's
    /// status, code and retryability).
    pub fn from_invoke(e: &InvokeError) -> Self {
        let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_GATEWAY);
        let mut out = Self::new(status, e.code(), e.to_string());
        out.retry = Some(e.retryable());
        out
    }

    /// 400 `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 500 `internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// The answer to a command the state machine refused.
    pub fn from_apply(e: &ApplyError) -> Self {
        let status = match e.class() {
            ErrorClass::NotFound => StatusCode::NOT_FOUND,
            ErrorClass::Conflict | ErrorClass::Exhausted => StatusCode::CONFLICT,
            ErrorClass::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
        };
        Self::new(status, e.code(), e.to_string())
    }

    /// The answer to a plan that found no place.
    pub fn from_rejection(r: &PlanRejection) -> Self {
        let status = match r.reason {
            RejectReason::UnknownTenant | RejectReason::UnknownFunction => StatusCode::NOT_FOUND,
            // No load could ever take it: the request itself is unsatisfiable.
            RejectReason::Unsatisfiable { .. } | RejectReason::NoSuchPool { .. } => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            _ => StatusCode::CONFLICT,
        };
        Self::new(status, r.code(), r.to_string())
    }

    /// The answer to a failed read.
    pub fn from_query(e: &QueryError) -> Self {
        let status = match e {
            QueryError::NotFound { .. } => StatusCode::NOT_FOUND,
            _ => StatusCode::UNPROCESSABLE_ENTITY,
        };
        Self::new(status, e.code(), e.to_string())
    }

    /// The answer to a write that was not acknowledged.
    pub fn from_write(e: &WriteError) -> Self {
        match e {
            WriteError::Invalid(_) | WriteError::TooMany { .. } => {
                Self::new(StatusCode::BAD_REQUEST, "invalid_command", e.to_string())
            }
            WriteError::TooLarge { .. } => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "command_too_large",
                e.to_string(),
            ),
            WriteError::NoLeader => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "no_leader", e.to_string())
            }
            WriteError::Unknown(_) => Self::outcome_unknown(e.to_string()),
            WriteError::Stopped => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "stopping", e.to_string())
            }
        }
    }

    /// Whether the same request may succeed later (for `outcome_unknown`:
    /// with the same idempotency key).
    pub fn retryable(&self) -> bool {
        self.retry
            .unwrap_or_else(|| retryable_status(self.status.as_u16()))
    }

    /// The error body of this refusal.
    pub fn body(&self) -> ErrorBody {
        let mut b = ErrorBody::new(self.code, self.message.clone(), self.retryable());
        if let Some((leader, leader_http)) = &self.leader {
            b.error.leader = *leader;
            b.error.leader_http = leader_http.clone();
        }
        b.error.idempotency_key = self.idempotency_key.clone();
        b
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut answer = HttpResponse::build(self.status);
        answer.insert_header((ERROR_HEADER, self.code));
        if let Some(key) = &self.idempotency_key {
            answer.insert_header((super::idempotency::HEADER, key.as_str()));
        }
        answer.json(self.body())
    }
}
