//! Messages from the region to a node agent.

use super::{Assignment, InvokeRequest, TokenDigests};
use serde::{Deserialize, Serialize};

/// The [`RegionMessageV1::Refused`] code of a heartbeat to a replica cut
/// off from the region's leader: the agent moves to another replica if one
/// takes its registration, and stays otherwise.
pub const CUT_OFF: &str = "cut_off";

/// A message from the region, versioned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RegionMessage {
    /// Protocol version 1.
    V1(RegionMessageV1),
}

/// The messages of protocol version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RegionMessageV1 {
    /// The registration was committed.
    Registered {
        /// The next usage sequence number the region expects.
        next_seq: u64,
        /// Replica id of the leader that committed the registration, as the
        /// answering replica knows it; 0 when it knows none (a region older
        /// than this field's use always sent 0).
        leader: u64,
    },
    /// The region refused the message; `retry` says whether to try again
    /// (e.g. on another replica) or give up.
    Refused {
        /// Stable error code.
        code: String,
        /// Human-readable reason.
        message: String,
        /// Worth retrying (no leader, not the leader, overloaded).
        retry: bool,
    },
    /// The complete set of instances the node must host now.
    Assignment(Assignment),
    /// The digests of every tenant's tokens.
    Tokens(TokenDigests),
    /// Usage records applied (or already applied) up to and including these.
    UsageAck {
        /// Sequence numbers the region has applied.
        seqs: Vec<u64>,
    },
    /// An invocation forwarded by a replica; the agent answers with
    /// [`super::AgentMessageV1::InvokeReply`].
    Invoke(InvokeRequest),
    /// Nothing to report (answer to heartbeats and swap reports).
    Ack,
    /// An invocation forwarded under an idempotency key: the agent runs it
    /// at most once per key (a second request joins the first while it
    /// runs, and gets the stored answer after); the agent answers with
    /// [`super::AgentMessageV1::InvokeReply`].
    InvokeKeyed {
        /// The key (printable ASCII, at most 128 bytes).
        key: String,
        /// The invocation.
        request: InvokeRequest,
    },
    /// What became of the invocation under `key` (asked after a forward
    /// lost its answer); the agent answers with
    /// [`super::AgentMessageV1::InvokeLookupReply`], waiting while it runs.
    InvokeLookup {
        /// Correlation id chosen by the replica.
        id: u64,
        /// The tenant.
        tenant: crate::model::TenantId,
        /// The key.
        key: String,
    },
    /// A transparent invocation forwarded under an idempotency key (as
    /// [`RegionMessageV1::InvokeKeyed`]): the agent passes `call` with the
    /// request's body to the function and answers on the same stream with
    /// [`super::AgentMessageV1::InvokeHead`] and then either the whole
    /// outcome ([`super::AgentMessageV1::InvokeReply`]) or, for a reply
    /// that streams, [`super::AgentMessageV1::InvokeChunk`]s closed by
    /// [`super::AgentMessageV1::InvokeStreamEnd`]; an answer that is not
    /// the function's own (an error, a replay, a joined run) is one
    /// `InvokeReply` with no head.
    InvokeHttp {
        /// The key (printable ASCII, at most 128 bytes).
        key: String,
        /// The invocation (its body is the request's).
        request: InvokeRequest,
        /// Method, path, query and headers for the function.
        call: super::HttpCall,
    },
    // Appended after every older variant: bincode numbers variants in
    // order, so the frames above decode as they always did.
    /// An invocation forwarded under an idempotency key whose request body
    /// streams (as [`RegionMessageV1::InvokeKeyed`] when `call` is `None`,
    /// as [`RegionMessageV1::InvokeHttp`] otherwise, answered the same
    /// ways): `request.body` is the body's first bytes (possibly none), and
    /// the rest follows on the same stream in
    /// [`RegionMessageV1::InvokeBodyChunk`]s closed by
    /// [`RegionMessageV1::InvokeBodyEnd`]. The agent passes the body to the
    /// function as it arrives. A stream that ends (or is reset) before
    /// `InvokeBodyEnd` cuts the body: the call is aborted. Any other frame
    /// there, a chunk over [`super::MAX_BODY_CHUNK`] or another id stops
    /// that stream (a frame that does not decode closes the connection).
    InvokeStreamed {
        /// The key (printable ASCII, at most 128 bytes).
        key: String,
        /// The invocation (its body: the request body's first bytes).
        request: InvokeRequest,
        /// Method, path, query and headers for the function on the
        /// transparent route; `None`: the plain route.
        call: Option<super::HttpCall>,
        /// The body's whole length when the client announced it (the
        /// function gets it as `Content-Length`; `None`: chunked).
        len: Option<u64>,
    },
    /// The next bytes of an [`RegionMessageV1::InvokeStreamed`] body (at
    /// most [`super::MAX_BODY_CHUNK`]).
    InvokeBodyChunk {
        /// The invocation's id (`request.id`).
        id: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// The end of an [`RegionMessageV1::InvokeStreamed`] body; the stream's
    /// last frame from the replica.
    InvokeBodyEnd {
        /// The invocation's id (`request.id`).
        id: u64,
    },
    /// A remap half (`SliceReserve`, `SliceRelease`) committed, answered to
    /// agents that registered with [`super::FEATURE_GRANTED_INDEX`] (others
    /// get `Ack`): this replica has applied the state up to
    /// `applied_index`, which includes it (a leader answers once applied, a
    /// follower after a read barrier; one whose barrier failed may answer
    /// an older index), and its next push to the agent is at least that
    /// new. The agent ignores assignments older than it: one read before
    /// the remap was applied (in flight, or from a lagging follower) would
    /// undo the remap.
    Granted {
        /// The replica's applied Raft index when it answered.
        applied_index: u64,
    },
}

impl RegionMessage {
    /// Wraps a version-1 message.
    pub fn v1(msg: RegionMessageV1) -> Self {
        RegionMessage::V1(msg)
    }
}
