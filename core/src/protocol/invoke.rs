//! Invocations forwarded from a replica to an agent, and their outcome.

use crate::model::{Micros, NodeId, TenantId};
use serde::{Deserialize, Serialize};

/// Default of `max_request_bytes` (the agent's and the replica's config):
/// the largest invocation request body their ingress accepts, in bytes;
/// `413 body_too_large` beyond, answered after the token check.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 4 << 20;
/// The range of `max_request_bytes`: 1 KiB to 7 MiB (a request's body
/// goes from a replica to its agent in one frame,
/// [`super::AGENT_FRAME_BYTES`], with its headers).
pub const MAX_REQUEST_BYTES_RANGE: (usize, usize) = (1 << 10, super::AGENT_FRAME_BYTES - (1 << 20));
/// Default of `body_idle_timeout_ms` (the agent's and the replica's
/// config): the longest a request body may pause (no bytes arriving)
/// before the upload is cut (`408 body_timeout`), in ms.
pub const DEFAULT_BODY_IDLE_TIMEOUT_MS: u64 = 10_000;
/// The range of `body_idle_timeout_ms`: 100 ms to 10 minutes.
pub const BODY_IDLE_TIMEOUT_MS_RANGE: (u64, u64) = (100, 600_000);

/// Most bytes of a streamed request body in one
/// [`super::RegionMessageV1::InvokeBodyChunk`] frame; an agent closes a
/// stream whose chunk is larger.
pub const MAX_BODY_CHUNK: usize = 256 << 10;

/// An invocation a replica forwards to a hosting agent (the replica has
/// already checked the tenant's token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvokeRequest {
    /// Correlation id chosen by the replica.
    pub id: u64,
    /// The tenant.
    pub tenant: TenantId,
    /// The function's name.
    pub function: String,
    /// Relative deadline, ms; `None`: the function's default.
    pub deadline_ms: Option<u64>,
    /// Request body.
    pub body: Vec<u8>,
}

/// Headers as they travel through gshare: lower-case names, raw values,
/// in order.
pub type Headers = Vec<(String, Vec<u8>)>;

/// The status and headers of a function's HTTP reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyHead {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased, in order.
    pub headers: Headers,
}

/// A request on the transparent route (`/v1/invoke/{tenant}/{name}/{*path}`)
/// as the function gets it (the body travels beside it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpCall {
    /// The method.
    pub method: String,
    /// Path and query at the function (`/v1/chat/completions?x=1`).
    pub target: String,
    /// Headers to pass on (lower-case names; hop-by-hop headers and
    /// gshare's own already removed, see
    /// [`crate::http_surface::passes_through`]).
    pub headers: Headers,
}

/// Why an accepted invocation produced no result. Every invocation ends in
/// an [`InvokeOutcome`]; none vanish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum InvokeError {
    /// The deadline cannot be met (on arrival or while queued).
    DeadlineUnreachable {
        /// Earliest predicted finish, µs after arrival.
        predicted_us: Micros,
        /// Deadline, µs after arrival.
        deadline_us: Micros,
    },
    /// No GPU of the node can hold an instance now.
    OverCapacity,
    /// The instance failed while serving it.
    InstanceFailed {
        /// What happened.
        detail: String,
    },
    /// No such function on this node (or for this tenant).
    UnknownFunction,
    /// The agent is shutting down.
    ShuttingDown,
    /// The function's process crashed (exited) while serving it; the agent
    /// restarts the process, so a retry may succeed.
    FunctionCrashed {
        /// What happened (instance, which start of the process).
        detail: String,
    },
    /// The invocation ran but its usage could not be journaled, so its
    /// result is withheld (metering fails closed).
    UsageNotRecorded {
        /// What the journal said.
        detail: String,
    },
    // The variants below were appended (bincode numbers variants in
    // order): only an agent that took an `InvokeStreamed` sends
    // `BodyTooLarge` to a replica, and a replica that sends that is new
    // enough to decode it. The other two are answered by the server that
    // reads the client's body and never go on the wire.
    /// The request body passed the reading side's `max_request_bytes`
    /// while it streamed: the call was aborted.
    BodyTooLarge {
        /// The cap, bytes.
        cap: u64,
        /// Bytes of the body passed on to the function before it went
        /// over (0: refused before anything was passed on).
        passed: u64,
    },
    /// No bytes of the request body arrived for `body_idle_timeout_ms`:
    /// the upload was cut (and the call, if it had started, aborted).
    BodyTimeout {
        /// The idle timeout, ms.
        idle_ms: u64,
        /// Bytes of the body that had arrived.
        passed: u64,
    },
    /// The client's request body broke off (its connection, a malformed
    /// chunk): the call was aborted.
    BodyBroken,
    /// The idempotency key was used, within the key window, for another
    /// function of the tenant: nothing ran (a key names one call; before,
    /// the other function's stored answer was replayed as this one's).
    /// Appended: an agent sends it to a replica, and a replica older than
    /// it cannot decode it (it ends that one stream; upgrade the replicas
    /// first, as for every addition to the agent's answers).
    KeyReused {
        /// The function the key was used for.
        function: String,
    },
}

impl InvokeError {
    /// Stable code for JSON error bodies.
    pub fn code(&self) -> &'static str {
        match self {
            InvokeError::DeadlineUnreachable { .. } => "deadline_unreachable",
            InvokeError::OverCapacity => "over_capacity",
            InvokeError::InstanceFailed { .. } => "instance_failed",
            InvokeError::UnknownFunction => "unknown_function",
            InvokeError::ShuttingDown => "shutting_down",
            InvokeError::FunctionCrashed { .. } => "function_crashed",
            InvokeError::UsageNotRecorded { .. } => "usage_not_recorded",
            InvokeError::BodyTooLarge { .. } => "body_too_large",
            InvokeError::BodyTimeout { .. } => "body_timeout",
            InvokeError::BodyBroken => "bad_request",
            InvokeError::KeyReused { .. } => "idempotency_key_reused",
        }
    }

    /// Whether the same invocation may succeed if sent again (the
    /// `retryable` of the error body): over capacity, shutting down, a
    /// crashed process (restarted), or its usage not journaled (no result
    /// was delivered).
    pub fn retryable(&self) -> bool {
        match self {
            InvokeError::OverCapacity
            | InvokeError::ShuttingDown
            | InvokeError::FunctionCrashed { .. }
            | InvokeError::UsageNotRecorded { .. } => true,
            InvokeError::DeadlineUnreachable { .. }
            | InvokeError::InstanceFailed { .. }
            | InvokeError::UnknownFunction
            | InvokeError::BodyTooLarge { .. }
            | InvokeError::BodyTimeout { .. }
            | InvokeError::BodyBroken
            | InvokeError::KeyReused { .. } => false,
        }
    }

    /// The HTTP status an ingress answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            InvokeError::DeadlineUnreachable { .. } => 504,
            InvokeError::OverCapacity => 429,
            InvokeError::InstanceFailed { .. } => 502,
            InvokeError::UnknownFunction => 404,
            InvokeError::FunctionCrashed { .. } => 502,
            InvokeError::ShuttingDown | InvokeError::UsageNotRecorded { .. } => 503,
            InvokeError::BodyTooLarge { .. } => 413,
            InvokeError::BodyTimeout { .. } => 408,
            InvokeError::BodyBroken => 400,
            InvokeError::KeyReused { .. } => 409,
        }
    }
}

impl std::fmt::Display for InvokeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InvokeError::DeadlineUnreachable {
                predicted_us,
                deadline_us,
            } => write!(
                f,
                "deadline cannot be met: predicted finish {predicted_us} µs > deadline {deadline_us} µs"
            ),
            InvokeError::OverCapacity => f.write_str("over capacity: no GPU can hold an instance"),
            InvokeError::InstanceFailed { detail } => write!(f, "instance failed: {detail}"),
            InvokeError::UnknownFunction => f.write_str("unknown function"),
            InvokeError::ShuttingDown => f.write_str("agent shutting down"),
            InvokeError::FunctionCrashed { detail } => {
                write!(f, "function process crashed: {detail}")
            }
            InvokeError::UsageNotRecorded { detail } => {
                write!(f, "usage could not be journaled: {detail}")
            }
            InvokeError::BodyTooLarge { cap, passed: 0 } => {
                write!(f, "request body over {cap} bytes (max_request_bytes)")
            }
            InvokeError::BodyTooLarge { cap, passed } => write!(
                f,
                "request body over {cap} bytes (max_request_bytes): the call was aborted \
                 after {passed} bytes of it had been passed on to the function"
            ),
            InvokeError::BodyTimeout { idle_ms, passed } => write!(
                f,
                "no request body bytes arrived for {idle_ms} ms (body_idle_timeout_ms) after \
                 {passed} bytes of it: the upload was cut and the call aborted"
            ),
            InvokeError::BodyBroken => {
                f.write_str("the request body broke off before its end; the call was aborted")
            }
            InvokeError::KeyReused { function } => write!(
                f,
                "the idempotency key was used for function {function:?} of this tenant within \
                 the key window: nothing ran; use a new key for another call"
            ),
        }
    }
}

/// How an invocation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum InvokeOutcome {
    /// The function's answer.
    Done {
        /// Response body.
        body: Vec<u8>,
        /// Time spent queued (waiting for a GPU or a load), µs.
        queued_us: Micros,
        /// Time spent running, µs.
        service_us: Micros,
    },
    /// An explicit error.
    Failed(InvokeError),
    /// The stored answer of an invocation already completed under the same
    /// idempotency key (it ran once and was billed once).
    Replayed {
        /// The stored body: the first [`MAX_REPLAY_BODY`] bytes.
        body: Vec<u8>,
        /// The length of the original body.
        body_len: u64,
        /// Whether the original body was longer than what was stored.
        truncated: bool,
    },
    /// The stored answer of a transparent invocation (an [`HttpCall`])
    /// completed, or started streaming, under the same idempotency key:
    /// the function's status and headers, and its body as
    /// [`InvokeOutcome::Replayed`] keeps it; a reply that streamed and
    /// never ended (cut by its deadline, a crash or the client leaving)
    /// is `truncated`.
    ReplayedHttp {
        /// The function's status and headers.
        head: ReplyHead,
        /// The stored body (empty when `truncated`).
        body: Vec<u8>,
        /// The length of the body as far as it was sent.
        body_len: u64,
        /// The body was longer than [`MAX_REPLAY_BODY`], or never ended.
        truncated: bool,
    },
}

/// Most body bytes stored per invocation idempotency key (64 KiB); a longer
/// answer is replayed as its status and a `replayed_truncated` marker.
pub const MAX_REPLAY_BODY: usize = 64 * 1024;

/// The agent's answer to an [`InvokeRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvokeReply {
    /// The request's correlation id.
    pub id: u64,
    /// How it ended.
    pub outcome: InvokeOutcome,
}

/// The nodes an invocation under idempotency `key` tries, in order:
/// a key that ends in `@<node>` with `<node>` among `nodes` (the pin a
/// replica gives the keys it assigns, see `region/src/agents/invoke.rs`)
/// goes to that node first; every other key ranks the nodes by rendezvous
/// hashing (a hash of key and node name, highest first). So every replica
/// sends one key to the same agent, the one that keeps its outcome, and a
/// node joining or leaving the set moves only the keys it ranks first.
pub fn key_order(key: &str, nodes: impl IntoIterator<Item = NodeId>) -> Vec<NodeId> {
    let pin = key.rsplit_once('@').map(|(_, n)| n);
    let mut ranked: Vec<(bool, u64, NodeId)> = nodes
        .into_iter()
        .map(|n| (pin == Some(n.0.as_str()), rendezvous(key, &n.0), n))
        .collect();
    ranked.sort_by(|a, b| (b.0, b.1, &a.2).cmp(&(a.0, a.1, &b.2)));
    ranked.dedup_by(|a, b| a.2 == b.2);
    ranked.into_iter().map(|(_, _, n)| n).collect()
}

/// FNV-1a over `key`, a separator and `node`, then a SplitMix64 finish:
/// the same on every replica and every build.
fn rendezvous(key: &str, node: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = key.bytes().chain([0xff]).chain(node.bytes());
    for b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crashed_function_has_its_own_code_and_survives_the_codec() {
        let e = InvokeError::FunctionCrashed {
            detail: "acme-echo: start #1".into(),
        };
        assert_eq!((e.code(), e.http_status()), ("function_crashed", 502));
        let other = InvokeError::InstanceFailed { detail: "x".into() };
        assert_ne!(e.code(), other.code());
        let frame = super::super::encode_frame(&InvokeOutcome::Failed(e.clone())).unwrap();
        let back: InvokeOutcome = super::super::decode_payload(&frame[4..]).unwrap();
        assert_eq!(back, InvokeOutcome::Failed(e));
    }

    #[test]
    fn a_key_reused_for_another_function_is_a_conflict_that_survives_the_codec() {
        let e = InvokeError::KeyReused {
            function: "chat".into(),
        };
        assert_eq!((e.code(), e.http_status()), ("idempotency_key_reused", 409));
        assert!(!e.retryable());
        assert!(e.to_string().contains("\"chat\""), "{e}");
        let frame = super::super::encode_frame(&InvokeOutcome::Failed(e.clone())).unwrap();
        let back: InvokeOutcome = super::super::decode_payload(&frame[4..]).unwrap();
        assert_eq!(back, InvokeOutcome::Failed(e));
    }

    #[test]
    fn a_cut_request_body_is_answered_by_its_cause_and_survives_the_codec() {
        let over = InvokeError::BodyTooLarge {
            cap: 4096,
            passed: 3072,
        };
        assert_eq!((over.code(), over.http_status()), ("body_too_large", 413));
        assert!(over.to_string().contains("after 3072 bytes"), "{over}");
        let before = InvokeError::BodyTooLarge {
            cap: 4096,
            passed: 0,
        };
        assert!(!before.to_string().contains("aborted"), "{before}");
        let idle = InvokeError::BodyTimeout {
            idle_ms: 500,
            passed: 3,
        };
        assert_eq!((idle.code(), idle.http_status()), ("body_timeout", 408));
        let broken = InvokeError::BodyBroken;
        assert_eq!((broken.code(), broken.http_status()), ("bad_request", 400));
        for e in [over, idle, broken] {
            assert!(!e.retryable());
            let frame = super::super::encode_frame(&InvokeOutcome::Failed(e.clone())).unwrap();
            let back: InvokeOutcome = super::super::decode_payload(&frame[4..]).unwrap();
            assert_eq!(back, InvokeOutcome::Failed(e));
        }
        // Appended: every older variant keeps its number (`Failed`, then
        // the error's variant).
        let payload = |e: InvokeError| {
            super::super::encode_frame(&InvokeOutcome::Failed(e)).unwrap()[4..].to_vec()
        };
        assert_eq!(payload(InvokeError::ShuttingDown)[..2], [1, 4]);
        assert_eq!(payload(InvokeError::BodyBroken)[..2], [1, 9]);
    }

    fn nodes(names: &[&str]) -> Vec<NodeId> {
        names.iter().map(|n| NodeId((*n).into())).collect()
    }

    #[test]
    fn one_key_goes_to_one_node_whatever_the_order_given() {
        let a = key_order("k-17", nodes(&["a", "b", "c", "d"]));
        let b = key_order("k-17", nodes(&["d", "c", "b", "a"]));
        assert_eq!(a, b);
        assert_eq!(a.len(), 4);
        // Keys spread: over 400 keys every node is first for some.
        let mut first = std::collections::BTreeMap::new();
        for i in 0..400 {
            let k = format!("key-{i}");
            *first
                .entry(key_order(&k, nodes(&["a", "b", "c", "d"]))[0].0.clone())
                .or_insert(0) += 1;
        }
        assert_eq!(first.len(), 4, "{first:?}");
        assert!(first.values().all(|n| *n > 50), "{first:?}");
    }

    #[test]
    fn a_node_joining_moves_only_the_keys_it_ranks_first() {
        for i in 0..200 {
            let k = format!("key-{i}");
            let before = key_order(&k, nodes(&["a", "b", "c"]));
            let after = key_order(&k, nodes(&["a", "b", "c", "e"]));
            if after[0].0 != "e" {
                assert_eq!(after[0], before[0], "{k}");
            }
            // Leaving: the rest keep their order.
            let left: Vec<NodeId> = before.iter().filter(|n| n.0 != "b").cloned().collect();
            assert_eq!(key_order(&k, nodes(&["a", "c"])), left, "{k}");
        }
    }

    #[test]
    fn a_pinned_key_goes_to_its_node_while_it_is_among_them() {
        for n in ["a", "b", "c"] {
            let k = format!("r1-0123456789abcdef@{n}");
            assert_eq!(key_order(&k, nodes(&["a", "b", "c"]))[0].0, n);
        }
        // Pinned to a node that no longer hosts it: the rendezvous order.
        let k = "r1-0123456789abcdef@z";
        assert_eq!(
            key_order(k, nodes(&["a", "b", "c"])),
            key_order(k, nodes(&["c", "a", "b"]))
        );
        assert_eq!(key_order(k, nodes(&["a", "a", "b"])).len(), 2);
    }
}
