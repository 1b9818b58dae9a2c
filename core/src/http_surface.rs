//! Rules the replicas' API and the agents' ingress share: who the caller
//! claims to be (the bearer token) and how every error gshare produces looks.
//!
//! ```text
//!   Authorization: Bearer <token>      ──▶ bearer_token() ──▶ token | BearerError (401)
//!   any refusal by gshare itself       ──▶ ErrorBody       ──▶ {"error": {"code", "message", "retryable", …}}
//!                                                               + header X-Gshare-Error: <code>
//! ```
//!
//! The header tells a client an answer came from gshare, not from a
//! function whose own status passes through. Both servers build their
//! answers from these types, so the shape cannot drift between them.

use serde::{Deserialize, Serialize};

/// The header naming the code of an error gshare produced (lower-case, as
/// HTTP/1 header names compare case-insensitively).
pub const ERROR_HEADER: &str = "x-gshare-error";

/// Why an `Authorization` header carries no usable bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BearerError {
    /// The header does not start with `Bearer ` (one space, that spelling).
    #[error("expected Authorization: Bearer <token>")]
    NotBearer,
    /// Nothing follows `Bearer `.
    #[error("the bearer token is empty")]
    Empty,
    /// The token holds whitespace or a control character (nothing is trimmed).
    #[error("the bearer token holds whitespace or a control character")]
    Malformed,
}

/// The token of an `Authorization` header value: exactly `Bearer ` then a
/// non-empty token without whitespace or control characters.
///
/// Strict on purpose: nothing inside the value is trimmed, so the token a
/// replica accepts is byte for byte the token an agent accepts (the HTTP
/// parser has already removed whitespace around the whole value).
pub fn bearer_token(header: &str) -> Result<&str, BearerError> {
    let token = header
        .strip_prefix("Bearer ")
        .ok_or(BearerError::NotBearer)?;
    if token.is_empty() {
        return Err(BearerError::Empty);
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(BearerError::Malformed);
    }
    Ok(token)
}

/// Whether a request refused with `status` may succeed if sent again
/// unchanged (too busy, no leader, shutting down, …).
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 429 | 503)
}

/// The body of every error answer: `{"error": {…}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The inside of an [`ErrorBody`].
///
/// JSON only (never bincode): the optional fields are left out when absent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Stable machine-readable code (also in the `X-Gshare-Error` header).
    pub code: String,
    /// For humans.
    pub message: String,
    /// Whether the same request may succeed later.
    pub retryable: bool,
    /// The leader's id, on a `not_leader` refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<u64>,
    /// The leader's HTTP address, on a `not_leader` refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_http: Option<String>,
    /// The idempotency key the request ran under (retry with it), where it
    /// carries one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

impl ErrorBody {
    /// An error with this code and message.
    pub fn new(code: impl Into<String>, message: impl Into<String>, retryable: bool) -> Self {
        ErrorBody {
            error: ErrorDetail {
                code: code.into(),
                message: message.into(),
                retryable,
                leader: None,
                leader_http: None,
                idempotency_key: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_rule_is_strict() {
        assert_eq!(bearer_token("Bearer gst_abc"), Ok("gst_abc"));
        assert_eq!(bearer_token("bearer gst_abc"), Err(BearerError::NotBearer));
        assert_eq!(bearer_token("Basic eHl6"), Err(BearerError::NotBearer));
        assert_eq!(bearer_token("Bearer"), Err(BearerError::NotBearer));
        assert_eq!(bearer_token("Bearer "), Err(BearerError::Empty));
        for bad in [
            "Bearer  gst_abc",
            "Bearer gst_abc ",
            "Bearer gst _abc",
            "Bearer gst_abc\t",
            "Bearer gst\u{7f}abc",
        ] {
            assert_eq!(bearer_token(bad), Err(BearerError::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn the_error_body_has_one_shape() {
        let v = serde_json::to_value(ErrorBody::new("no_leader", "no leader yet", true)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {"code": "no_leader", "message": "no leader yet", "retryable": true}})
        );
        let mut b = ErrorBody::new("not_leader", "not the leader", true);
        b.error.leader = Some(2);
        b.error.leader_http = Some("127.0.0.1:8102".into());
        let text = serde_json::to_string(&b).unwrap();
        assert!(
            text.contains("\"leader_http\":\"127.0.0.1:8102\""),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<ErrorBody>(&text).unwrap(), b);
        assert!(retryable_status(503) && retryable_status(429));
        assert!(!retryable_status(400) && !retryable_status(404) && !retryable_status(504));
    }
}
