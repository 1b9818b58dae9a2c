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

/// What a refused `X-Gshare-Deadline-Ms` is told (`400 bad_deadline`).
pub const BAD_DEADLINE: &str =
    "X-Gshare-Deadline-Ms must be a whole number of milliseconds from 1 to 86400000 (one day)";

/// The deadline an `X-Gshare-Deadline-Ms` value asks for, in ms: a whole
/// number from 1 to [`crate::bounds::MAX_DEADLINE_MS`] (a function's own
/// `deadline_ms` has the same bound), surrounding whitespace ignored.
/// `None` for anything else, which both servers refuse `400 bad_deadline`
/// ([`BAD_DEADLINE`]): a request that could wait for ever would hold its
/// body and its place in the queue for ever.
pub fn deadline_ms(value: &str) -> Option<u64> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|ms| (1..=crate::bounds::MAX_DEADLINE_MS).contains(ms))
}

/// Whether a request refused with `status` may succeed if sent again
/// unchanged (too busy, no leader, shutting down, …).
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 429 | 503)
}

/// Hop-by-hop headers (RFC 9110 7.6.1): never passed through the
/// transparent route, either way.
pub const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Which way a header travels through the transparent route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client → function.
    Request,
    /// Function → client.
    Reply,
}

/// Whether header `name` (lower-case) passes through the transparent route:
/// not hop-by-hop (nor named by `Connection`, see [`connection_names`]),
/// not a framing header the next hop recomputes (`content-length`, `host`,
/// `expect`), and not gshare's own (`x-gshare-*` either way, so a function
/// cannot forge a gshare error; on requests also `authorization` and
/// `idempotency-key`, which gshare consumes).
pub fn passes_through(name: &str, connection: &[String], way: Direction) -> bool {
    let gshare_own = name.starts_with("x-gshare-")
        || (way == Direction::Request && matches!(name, "authorization" | "idempotency-key"));
    !(HOP_BY_HOP.contains(&name)
        || connection.iter().any(|c| c == name)
        || matches!(name, "content-length" | "host" | "expect")
        || gshare_own)
}

/// The header names that `Connection` header values list (hop-by-hop too),
/// lower-cased.
pub fn connection_names<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<String> {
    values
        .filter_map(|v| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect()
}

/// The headers of `headers` (lower-case names) that pass through the
/// transparent route going `way`.
pub fn pass_through(headers: &[(&str, &[u8])], way: Direction) -> Vec<(String, Vec<u8>)> {
    let connection = connection_names(
        headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("connection"))
            .map(|(_, v)| *v),
    );
    headers
        .iter()
        .filter(|(k, _)| passes_through(k, &connection, way))
        .map(|(k, v)| (k.to_string(), v.to_vec()))
        .collect()
}

/// The path and query at the function for a transparent request to
/// `/v1/invoke/{tenant}/{name}/{*rest}`: `/{rest}` as sent (not decoded),
/// and `?{query}` when there is one.
pub fn function_target(path: &str, query: Option<&str>) -> String {
    let rest = path.splitn(6, '/').nth(5).unwrap_or_default();
    match query {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    }
}

/// On a forward between replicas: the proof that a replica of the region
/// sent it ([`ForwardSecret::prove`], lower-case hex HMAC-SHA256).
pub const FORWARD_PROOF_HEADER: &str = "x-gshare-forward-proof";

/// What a replica vouches for when it hands an invocation to a peer: the
/// request line, the caller's token (its digest) and the forward headers
/// it sets. A proof binds all of them, so it cannot be moved to another
/// request, tenant, key or node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardClaim<'a> {
    /// The method sent to the peer.
    pub method: &'a str,
    /// The path and query sent to the peer.
    pub target: &'a str,
    /// The digest of the caller's bearer token
    /// ([`crate::protocol::token_digest`]).
    pub token_digest: &'a str,
    /// The idempotency key.
    pub key: &'a str,
    /// The node whose agent is to run it; `None`: the key is one the first
    /// replica assigned (the peer picks the node).
    pub node: Option<&'a str>,
    /// The deadline header's value, if sent.
    pub deadline: Option<&'a str>,
}

impl ForwardClaim<'_> {
    /// The claim as bytes, each field length-prefixed (no two claims share
    /// an encoding).
    fn encode(&self) -> Vec<u8> {
        let mut out = b"gshare forward v1".to_vec();
        let fields = [
            Some(self.method),
            Some(self.target),
            Some(self.token_digest),
            Some(self.key),
            self.node,
            self.deadline,
        ];
        for f in fields {
            match f {
                None => out.push(0),
                Some(v) => {
                    out.push(1);
                    out.extend_from_slice(&(v.len() as u64).to_be_bytes());
                    out.extend_from_slice(v.as_bytes());
                }
            }
        }
        out
    }
}

/// The key every replica of a region proves its forwards with, derived
/// from a secret they all hold (the operator token: a replica's calls to
/// its peers for the dashboard present it too, so it is the same on every
/// replica).
pub struct ForwardSecret(ring::hmac::Key);

impl std::fmt::Debug for ForwardSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForwardSecret(..)")
    }
}

impl ForwardSecret {
    /// The key derived from `secret` (a domain-separated SHA-256 of it,
    /// so the HMAC key is never the token itself).
    pub fn derive(secret: &str) -> Self {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"gshare forward proof key v1\0");
        ctx.update(secret.as_bytes());
        let k = ctx.finish();
        Self(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, k.as_ref()))
    }

    /// The proof of `claim` (64 lower-case hex digits).
    pub fn prove(&self, claim: &ForwardClaim<'_>) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let tag = ring::hmac::sign(&self.0, &claim.encode());
        let mut out = String::with_capacity(64);
        for b in tag.as_ref() {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
        out
    }

    /// Whether `proof` proves `claim` (compared in constant time).
    pub fn verify(&self, claim: &ForwardClaim<'_>, proof: &[u8]) -> bool {
        if proof.len() != 64 {
            return false;
        }
        let mut tag = [0u8; 32];
        for (i, pair) in proof.chunks(2).enumerate() {
            let digit = |c: u8| match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            };
            match (digit(pair[0]), digit(pair[1])) {
                (Some(h), Some(l)) => tag[i] = (h << 4) | l,
                _ => return false,
            }
        }
        ring::hmac::verify(&self.0, &claim.encode(), &tag).is_ok()
    }
}

/// Header marking the stored answer of a repeated idempotency key (`1`,
/// or `truncated`).
pub const REPLAYED_HEADER: &str = "x-gshare-replayed";

/// An answer as both servers send it: status, headers, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The status.
    pub status: u16,
    /// The headers (lower-case names).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
}

/// The answer to an invocation's outcome, unless it failed (`Err`: each
/// server renders the error in [`ErrorBody`]'s shape):
/// - `Done`: `200`, the body, `X-Gshare-Queued-Us` and `X-Gshare-Service-Us`;
/// - `Replayed`: `200` and the stored body with `X-Gshare-Replayed: 1`,
///   or past [`crate::protocol::MAX_REPLAY_BODY`] the marker
///   `{"replayed_truncated": true, "body_len": n}` with `X-Gshare-Replayed: truncated`;
/// - `ReplayedHttp`: the same, with the function's own status and headers
///   (as [`pass_through`] lets them through; a truncated one's
///   `Content-Type` is the marker's).
pub fn outcome_answer(
    outcome: crate::protocol::InvokeOutcome,
) -> Result<Answer, crate::protocol::InvokeError> {
    use crate::protocol::InvokeOutcome as O;
    let marker = |body_len: u64| {
        format!("{{\"replayed_truncated\":true,\"body_len\":{body_len}}}").into_bytes()
    };
    let header = |k: &str, v: &str| (k.to_string(), v.as_bytes().to_vec());
    match outcome {
        O::Done {
            body,
            queued_us,
            service_us,
        } => Ok(Answer {
            status: 200,
            headers: vec![
                header("x-gshare-queued-us", &queued_us.to_string()),
                header("x-gshare-service-us", &service_us.to_string()),
            ],
            body,
        }),
        O::Replayed {
            body,
            body_len,
            truncated,
        } => Ok(if truncated {
            Answer {
                status: 200,
                headers: vec![
                    header(REPLAYED_HEADER, "truncated"),
                    header("content-type", "application/json"),
                ],
                body: marker(body_len),
            }
        } else {
            Answer {
                status: 200,
                headers: vec![header(REPLAYED_HEADER, "1")],
                body,
            }
        }),
        O::ReplayedHttp {
            head,
            body,
            body_len,
            truncated,
        } => {
            let own: Vec<(&str, &[u8])> = head
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .collect();
            let mut headers = pass_through(&own, Direction::Reply);
            if truncated {
                headers.retain(|(k, _)| k != "content-type" && k != "content-encoding");
                headers.push(header("content-type", "application/json"));
            }
            headers.push(header(
                REPLAYED_HEADER,
                if truncated { "truncated" } else { "1" },
            ));
            Ok(Answer {
                status: head.status,
                headers,
                body: if truncated { marker(body_len) } else { body },
            })
        }
        O::Failed(e) => Err(e),
    }
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
    fn a_deadline_is_a_whole_number_of_ms_up_to_a_day() {
        assert_eq!(deadline_ms("1"), Some(1));
        assert_eq!(deadline_ms(" 30000 "), Some(30_000));
        assert_eq!(deadline_ms("86400000"), Some(86_400_000));
        for bad in [
            "0",
            "86400001",
            "999999999999",
            "18446744073709551616",
            "-5",
            "1.5",
            "",
            "1e3",
        ] {
            assert_eq!(deadline_ms(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_forward_proof_verifies_only_for_its_claim_and_secret() {
        let claim = ForwardClaim {
            method: "POST",
            target: "/v1/invoke/acme/chat/v1/chat/completions?x=1",
            token_digest: "d1",
            key: "k-1",
            node: Some("n1"),
            deadline: Some("1000"),
        };
        let secret = ForwardSecret::derive("op");
        let proof = secret.prove(&claim);
        assert_eq!(proof.len(), 64);
        assert!(secret.verify(&claim, proof.as_bytes()));
        assert!(!ForwardSecret::derive("other").verify(&claim, proof.as_bytes()));
        let changed = [
            ForwardClaim {
                method: "GET",
                ..claim
            },
            ForwardClaim {
                target: "/v1/invoke/acme/chat",
                ..claim
            },
            ForwardClaim {
                token_digest: "d2",
                ..claim
            },
            ForwardClaim {
                key: "k-2",
                ..claim
            },
            ForwardClaim {
                node: None,
                ..claim
            },
            ForwardClaim {
                node: Some("n2"),
                ..claim
            },
            ForwardClaim {
                deadline: None,
                ..claim
            },
            // Moving bytes between fields changes the claim too.
            ForwardClaim {
                key: "k-1n1",
                node: Some(""),
                ..claim
            },
        ];
        for c in changed {
            assert!(!secret.verify(&c, proof.as_bytes()), "{c:?}");
        }
        assert!(!secret.verify(&claim, b""));
        assert!(!secret.verify(&claim, proof.to_uppercase().as_bytes()));
        assert!(!secret.verify(&claim, &proof.as_bytes()[..63]));
    }

    #[test]
    fn hop_by_hop_framing_and_gshare_headers_do_not_pass_through() {
        let h = |k: &'static str, v: &'static str| (k, v.as_bytes());
        let request = [
            h("content-type", "application/json"),
            h("connection", "keep-alive, x-private"),
            h("x-private", "1"),
            h("keep-alive", "timeout=5"),
            h("transfer-encoding", "chunked"),
            h("host", "replica"),
            h("content-length", "3"),
            h("authorization", "Bearer t"),
            h("idempotency-key", "k"),
            h("x-gshare-deadline-ms", "10"),
            h("openai-organization", "org"),
        ];
        let names = |v: Vec<(String, Vec<u8>)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(
            names(pass_through(&request, Direction::Request)),
            ["content-type", "openai-organization"]
        );
        // A function's reply: its own x-gshare-* never passes (it cannot
        // forge a gshare error), its authorization header does.
        let reply = [
            h("x-gshare-error", "forged"),
            h("authorization", "x"),
            h("cache-control", "no-cache"),
            h("connection", "close"),
        ];
        assert_eq!(
            names(pass_through(&reply, Direction::Reply)),
            ["authorization", "cache-control"]
        );
    }

    #[test]
    fn the_function_target_is_what_follows_the_name_as_sent() {
        assert_eq!(
            function_target("/v1/invoke/acme/chat/v1/chat/completions", Some("a=1")),
            "/v1/chat/completions?a=1"
        );
        assert_eq!(function_target("/v1/invoke/acme/chat/", None), "/");
        assert_eq!(
            function_target("/v1/invoke/acme/chat/a%2Fb", None),
            "/a%2Fb"
        );
    }

    #[test]
    fn a_transparent_replay_keeps_the_functions_status_and_headers() {
        use crate::protocol::{InvokeError, InvokeOutcome, ReplyHead};
        let head = ReplyHead {
            status: 400,
            headers: vec![
                ("content-type".into(), b"text/plain".to_vec()),
                ("x-gshare-error".into(), b"forged".to_vec()),
                ("content-length".into(), b"3".to_vec()),
            ],
        };
        let whole = outcome_answer(InvokeOutcome::ReplayedHttp {
            head: head.clone(),
            body: b"bad".to_vec(),
            body_len: 3,
            truncated: false,
        })
        .unwrap();
        assert_eq!(whole.status, 400);
        assert_eq!(whole.body, b"bad");
        let names: Vec<&str> = whole.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["content-type", REPLAYED_HEADER]);
        let cut = outcome_answer(InvokeOutcome::ReplayedHttp {
            head,
            body: Vec::new(),
            body_len: 70_000,
            truncated: true,
        })
        .unwrap();
        assert_eq!(cut.status, 400);
        assert_eq!(
            cut.headers,
            [
                ("content-type".to_string(), b"application/json".to_vec()),
                (REPLAYED_HEADER.to_string(), b"truncated".to_vec()),
            ]
        );
        let marker: serde_json::Value = serde_json::from_slice(&cut.body).unwrap();
        assert_eq!(
            marker,
            serde_json::json!({"replayed_truncated": true, "body_len": 70_000})
        );
        let failed = InvokeOutcome::Failed(InvokeError::OverCapacity);
        assert_eq!(outcome_answer(failed), Err(InvokeError::OverCapacity));
    }

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
