//! Messages from a node agent to the region.

use super::{
    AgentCounters, FunctionLoad, GpuStatus, InstanceStatus, InvokeReply, NodeGpu, SwapEvent,
};
use crate::model::NodeId;
use crate::state::{AgentId, UsageRecord};
use serde::{Deserialize, Serialize};

/// A message from an agent, versioned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentMessage {
    /// Protocol version 1.
    V1(AgentMessageV1),
}

/// The messages of protocol version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentMessageV1 {
    /// First message on a link: who the agent is and what it has.
    Register(Register),
    /// Periodic state.
    Heartbeat(Heartbeat),
    /// Swaps and remaps the agent carried out.
    Swaps {
        /// The agent.
        agent: AgentId,
        /// What happened, oldest first.
        events: Vec<SwapEvent>,
    },
    /// Metered usage, journaled by the agent before it is sent.
    Usage {
        /// The agent.
        agent: AgentId,
        /// Records with the agent's sequence numbers.
        records: Vec<UsageRecord>,
    },
    /// The answer to a forwarded [`super::InvokeRequest`].
    InvokeReply(InvokeReply),
    /// The answer to [`super::RegionMessageV1::InvokeLookup`]: the
    /// invocation's outcome, or `None` when the agent knows nothing of the
    /// key (it never ran to completion here, or its record expired).
    InvokeLookupReply {
        /// The lookup's correlation id.
        id: u64,
        /// What became of it.
        outcome: Option<super::InvokeOutcome>,
    },
    /// First message on a link from agents that state their GPU policy:
    /// [`AgentMessageV1::Register`] plus the agent's `allow_fewer_gpus`
    /// (a plain `Register`, from an older agent, counts as `false`).
    RegisterGpus {
        /// Who the agent is and what it has.
        register: Register,
        /// Accept fewer GPUs than the topology gives the node.
        allow_fewer_gpus: bool,
    },
    /// Phase one of a remap: reserve `slice` (another GPU of the agent's
    /// node) for `instance`, beside the slice it holds. The region answers
    /// `Ack` once `InstanceSliceReserve` committed, `Refused` otherwise (then
    /// nothing moves).
    SliceReserve {
        /// The agent.
        agent: AgentId,
        /// The instance.
        instance: crate::state::InstanceId,
        /// The target slice.
        slice: crate::model::Slice,
    },
    /// Phase two of a remap: `instance` left `gpu`; release its slice
    /// there. `Ack` once `InstanceSliceRelease` committed, `Refused` otherwise.
    SliceRelease {
        /// The agent.
        agent: AgentId,
        /// The instance.
        instance: crate::state::InstanceId,
        /// The GPU left.
        gpu: crate::model::GpuId,
    },
    /// Per-function load since the agent's previous `Loads`, sent after
    /// each heartbeat (the autoscaler's signal). A variant of its own, last
    /// in the enum, so that `Heartbeat`'s encoding is unchanged; a region
    /// older than this variant refuses the frame as malformed, so regions
    /// upgrade before agents.
    Loads {
        /// The agent.
        agent: AgentId,
        /// Agent's wall clock, Unix ms: the region takes the interval a
        /// report covers as the difference to the agent's previous one.
        at_ms: u64,
        /// At most [`super::MAX_FUNCTION_LOADS`] entries, the busiest
        /// (see [`super::cap_loads`]); every function hosted otherwise.
        loads: Vec<FunctionLoad>,
        /// Entries left out by the cap.
        dropped: u64,
    },
    /// Every function whose weights the agent keeps in host memory without
    /// hosting it (parked), the whole set, sent after a heartbeat when it
    /// changed since the last one sent on the link (and once on each new
    /// link): the scheduler prefers these nodes when it places such a
    /// function again. Last in the enum, like `Loads`: a region older than
    /// this variant refuses the frame, so regions upgrade before agents.
    HostCopies {
        /// The agent.
        agent: AgentId,
        /// At most [`super::MAX_HOST_COPIES`], in (tenant, function,
        /// version) order.
        copies: Vec<super::HostCopy>,
    },
    /// On the stream of a [`super::RegionMessageV1::InvokeHttp`]: the
    /// function's status and headers, sent as soon as its reply started
    /// (after the usage of the run so far is journaled, with metering).
    /// `streamed`: the body follows as [`AgentMessageV1::InvokeChunk`]s and
    /// one [`AgentMessageV1::InvokeStreamEnd`]; else one
    /// [`AgentMessageV1::InvokeReply`] with the whole body follows.
    InvokeHead {
        /// The request's correlation id.
        id: u64,
        /// The function's status and headers.
        head: super::ReplyHead,
        /// The body streams.
        streamed: bool,
    },
    /// Bytes of a streamed reply's body, as the function sent them.
    InvokeChunk {
        /// The request's correlation id.
        id: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// A streamed reply ended: `complete` when the function ended it,
    /// else it was cut (deadline, crash, over the reply cap); the stream
    /// closes after it either way.
    InvokeStreamEnd {
        /// The request's correlation id.
        id: u64,
        /// The function ended it.
        complete: bool,
    },
    /// First message on a link from agents that name the protocol
    /// behaviours they understand: [`AgentMessageV1::RegisterGpus`] plus
    /// `features` (e.g. [`FEATURE_CUT_OFF`]). A replica that does not know
    /// this message closes the link: upgrade replicas before agents.
    RegisterWith {
        /// Who the agent is and what it has.
        register: Register,
        /// Accept fewer GPUs than the topology gives the node.
        allow_fewer_gpus: bool,
        /// What the agent understands beyond the messages themselves.
        features: Vec<String>,
    },
    /// The agent registered with another replica and leaves this link:
    /// the replica stops sending it new invocations (those in flight
    /// finish, then the connection closes). Answered `Ack`.
    Leaving {
        /// The agent.
        agent: AgentId,
    },
}

/// A [`AgentMessageV1::RegisterWith`] feature: the agent takes a heartbeat
/// refused with [`super::CUT_OFF`] as a cue to register with another
/// replica, moving only once one takes it. An agent without it ends its
/// session on any refusal, so a replica does not refuse its heartbeats.
pub const FEATURE_CUT_OFF: &str = "cut_off";
/// A [`AgentMessageV1::RegisterWith`] feature: the agent takes
/// [`super::RegionMessageV1::Granted`] as the answer to a committed remap
/// half (an agent without it gets `Ack`).
pub const FEATURE_GRANTED_INDEX: &str = "granted_index";

/// An agent registers its node and GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Register {
    /// The agent's stable id.
    pub agent: AgentId,
    /// The node it runs on.
    pub node: NodeId,
    /// The pool the node belongs to (from the agent's config).
    pub pool: String,
    /// The agent's version.
    pub version: String,
    /// The node's GPUs.
    pub gpus: Vec<NodeGpu>,
    /// Where the agent's HTTP ingress listens (`ip:port`).
    pub ingress: String,
}

/// Periodic state of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The agent.
    pub agent: AgentId,
    /// Agent's wall clock, Unix ms (for display only).
    pub at_ms: u64,
    /// One entry per GPU.
    pub gpus: Vec<GpuStatus>,
    /// Invocations accepted and not yet answered.
    pub in_flight: u32,
    /// Swap-ins (moves included) carried out since start.
    pub swaps: u64,
    /// Function processes and the usage journal.
    pub counters: AgentCounters,
    /// Every instance the agent hosts, with where its weights are (what
    /// `POST /v1/functions?wait=ready` waits for).
    pub instances: Vec<InstanceStatus>,
}

impl AgentMessage {
    /// Wraps a version-1 message.
    pub fn v1(msg: AgentMessageV1) -> Self {
        AgentMessage::V1(msg)
    }
}
