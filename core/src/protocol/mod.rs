//! The region <-> node agent protocol: messages and their frames.
//!
//! Plain serde types (no `flatten`, `untagged`, `skip_serializing_if`), so
//! bincode 2 round-trips every one of them, wrapped in versioned envelopes
//! ([`AgentMessage::V1`], [`RegionMessage::V1`]); a `V2` would sit beside
//! `V1` and old peers would refuse it as malformed instead of misreading it.
//!
//! ```text
//!   agent ──AgentMessage──▶ region            region ──RegionMessage──▶ agent
//!     Register (node, GPUs)                      Registered { next_seq } | Refused
//!     Heartbeat (utilization, residency, queue,  Assignment (instances: spec + slices)
//!       each instance's state)
//!     Swaps (swap / remap reports)               Tokens (tenant token digests)
//!     Usage (usage batch)                        UsageAck
//!     Loads (per-function load)
//!     HostCopies (parked weights in host memory)
//!     InvokeReply                                Invoke (forwarded invocation)
//!     SliceReserve / SliceRelease (remap)        Ack (committed) | Refused
//! ```
//!
//! On the wire every message is one frame ([`codec`]): a big-endian `u32`
//! length, then the bincode payload, refused above [`AGENT_FRAME_BYTES`]
//! before the payload is read, by both sides. The codec is pure (bytes in,
//! messages out); reading and writing frames on QUIC streams is
//! `gshare_core::net` (cargo feature `net`), which both binaries use. The
//! connection's ALPN is [`AGENT_ALPN`]; tenant tokens travel only as
//! [`token_digest`]s.

mod agent_counters;
mod agent_message;
pub mod codec;
mod function_load;
mod gpu_report;
mod host_copy;
mod instance_assignment;
mod instance_report;
mod invoke;
mod region_message;
mod swap_report;
mod token_digests;

pub use agent_counters::AgentCounters;
pub use agent_message::{
    AgentMessage, AgentMessageV1, Heartbeat, Register, FEATURE_CUT_OFF, FEATURE_GRANTED_INDEX,
};
pub use codec::{
    decode_payload, encode_frame, AgentFrames, AgentWire, FrameDecoder, FrameError, Frames,
    PeerFrames, PeerWire, Wire, AGENT_FRAME_BYTES, PEER_FRAME_BYTES,
};
pub use function_load::{cap_loads, sum_loads, FunctionLoad, RegionLoad, MAX_FUNCTION_LOADS};
pub use gpu_report::{GpuStatus, NodeGpu};
pub use host_copy::{HostCopy, MAX_HOST_COPIES};
pub use instance_assignment::{
    plan_assignment, AssignedInstance, Assignment, AssignmentPlan, HostedKey, WantedFunction,
};
pub use instance_report::{InstanceState, InstanceStatus};
pub use invoke::{
    key_order, Headers, HttpCall, InvokeError, InvokeOutcome, InvokeReply, InvokeRequest,
    ReplyHead, BODY_IDLE_TIMEOUT_MS_RANGE, DEFAULT_BODY_IDLE_TIMEOUT_MS, DEFAULT_MAX_REQUEST_BYTES,
    MAX_BODY_CHUNK, MAX_REPLAY_BODY, MAX_REQUEST_BYTES_RANGE,
};
pub use region_message::{RegionMessage, RegionMessageV1, CUT_OFF};
pub use swap_report::{SwapEvent, SwapKind};
pub use token_digests::{token_digest, TenantTokens, TokenDigests};

/// The protocol version this build speaks (the envelope variant it sends).
pub const PROTOCOL_VERSION: u32 = 1;

/// ALPN of the agent protocol (replicas accept it beside their own Raft ALPN).
pub const AGENT_ALPN: &[u8] = b"gshare-agent/1";

#[cfg(test)]
mod tests;
