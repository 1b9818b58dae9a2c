//! Messages between the agent's actors.

use super::NodeStatus;
use crate::gpu::AccountingError;
use crate::runtime::{
    FunctionReply, HttpCall, Invocation, ReplyHead, RuntimeError, StreamItem, StreamOpen,
};
use actix::Message;
use gshare_core::executor::{FunctionId, RequestId};
use gshare_core::model::{Mib, Micros, TenantId};
use gshare_core::protocol::{Assignment, InvokeOutcome, SwapEvent, TokenDigests};
use tokio::sync::oneshot;

/// An invocation, from the ingress or forwarded by a replica.
#[derive(Debug, Message)]
#[rtype(result = "Admission")]
pub struct Invoke {
    /// The tenant (from the path).
    pub tenant: TenantId,
    /// The function's name.
    pub function: String,
    /// SHA-256 hex of the bearer token; `None` when a replica already
    /// checked it (forwarded over mutual TLS).
    pub token_digest: Option<String>,
    /// Relative deadline, ms; `None`: the function's default.
    pub deadline_ms: Option<u64>,
    /// Body: whole, or streamed as it arrives (see
    /// [`crate::runtime::Invocation::body`]); a run under a key that is
    /// already running or stored does not read it.
    pub body: crate::runtime::RequestBody,
    /// Idempotency key: the invocation runs at most once per key within the
    /// journal's key window (a repeat joins the running one, or gets the
    /// stored answer).
    pub idempotency_key: Option<String>,
    /// Set on the transparent route: the request to pass on, and where the
    /// function's status and headers go (sent when its reply arrives,
    /// before the outcome, which may wait for the usage journal).
    pub http: Option<Transparent>,
}

/// The transparent route's part of an [`Invoke`].
#[derive(Debug)]
pub struct Transparent {
    /// The method, path, query and headers to pass on.
    pub call: HttpCall,
    /// Receives the function's status and headers (and, for a streamed
    /// reply, its body's chunks: then the outcome only settles the run).
    pub head: oneshot::Sender<ReplyStart>,
}

/// The start of a transparent invocation's answer.
#[derive(Debug)]
pub struct ReplyStart {
    /// The function's status and headers.
    pub head: ReplyHead,
    /// A streamed body's chunks (released once the usage of the run so far
    /// is journaled); `None`: the body comes whole in the outcome.
    pub chunks: Option<tokio::sync::mpsc::Receiver<StreamItem>>,
}

/// A driver's reply started streaming (a task → NodeAgent).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct StreamOpened {
    /// The request.
    pub request: RequestId,
    /// Its head and chunks.
    pub open: StreamOpen,
}

/// What became of the invocation under a key (asked by a replica whose
/// forward lost its answer).
#[derive(Debug, Message)]
#[rtype(result = "KeyAnswer")]
pub struct LookupKey {
    /// The tenant.
    pub tenant: TenantId,
    /// The key.
    pub key: String,
}

/// The answer to [`LookupKey`].
#[derive(Debug, actix::MessageResponse)]
pub enum KeyAnswer {
    /// It completed: its stored answer.
    Known(InvokeOutcome),
    /// It is running: its outcome arrives on this channel.
    Running(oneshot::Receiver<InvokeOutcome>),
    /// Nothing is known of the key here.
    Unknown,
}

/// Whether an invocation was accepted.
#[derive(Debug, actix::MessageResponse)]
pub enum Admission {
    /// Accepted: the outcome arrives on this channel (always: a result or
    /// an explicit error).
    Accepted(oneshot::Receiver<InvokeOutcome>),
    /// The token is not one of the tenant's.
    Unauthorized,
}

/// The region's instances for this node (a full replacement).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ApplyAssignment(pub Assignment);

/// The tenants' token digests (a full replacement).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ApplyTokens(pub TokenDigests);

/// Run one request (NodeAgent → InstanceActor).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct RunRequest(pub Invocation);

/// A request ended (InstanceActor → NodeAgent).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct RequestDone {
    /// The request.
    pub request: RequestId,
    /// The GPU it ran on.
    pub gpu: u32,
    /// The function's reply or the runtime's error.
    pub result: Result<FunctionReply, RuntimeError>,
}

/// Bring a function's weights onto the GPU (NodeAgent → GpuActor).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct LoadWeights {
    /// The function.
    pub function: FunctionId,
    /// Its GPU memory.
    pub memory_mib: Mib,
    /// How long the copy takes (the executor's swap-in / cold-start / move time), µs.
    pub duration_us: Micros,
}

/// Drop a function's weights from the GPU (NodeAgent → GpuActor).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ReleaseWeights {
    /// The function.
    pub function: FunctionId,
}

/// A load completed (GpuActor → NodeAgent).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct LoadDone {
    /// The function.
    pub function: FunctionId,
    /// The GPU.
    pub gpu: u32,
    /// Set if the backend's accounting refused the load (a bug: the
    /// executor and the backend disagree).
    pub error: Option<AccountingError>,
}

/// A copy of the function's weights joined or left a node GPU (NodeAgent →
/// InstanceActor): joined after a swap-in, cold start or move, left after a
/// swap-out, unload or move. The instance's driver follows (a process
/// runtime keeps one process on a GPU that holds a copy: it starts on the
/// first, moves when its GPU's copy leaves and others remain, stops with
/// the last).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Residency(pub crate::runtime::Placement);

/// Stop every hosted function's runtime now (the agent is exiting): each
/// process driver stops its process group gracefully (NodeAgent).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct StopRuntimes;

/// Stop the runtime now, running requests or not (InstanceActor).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct StopNow;

/// Stop the instance once its running requests are done.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ReleaseInstance;

/// Whether `digest` is one of `tenant`'s tokens (per the region's last push).
#[derive(Debug, Message)]
#[rtype(result = "bool")]
pub struct CheckToken {
    /// The tenant.
    pub tenant: TenantId,
    /// SHA-256 hex of the bearer token.
    pub digest: String,
}

/// Journal everything metered so far, now (on graceful shutdown, once the
/// ingress has drained and the function processes are stopped; the append
/// runs on the agent's thread). From then on the interval tick journals no
/// more residency.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct FlushUsage;

/// The node's state now.
#[derive(Debug, Message)]
#[rtype(result = "NodeStatus")]
pub struct StatusQuery;

/// The node's state now and the agent's metrics (for `/metrics`).
#[derive(Debug, Message)]
#[rtype(result = "MetricsSnapshot")]
pub struct MetricsQuery;

/// The answer to [`MetricsQuery`].
#[derive(Debug, Clone, actix::MessageResponse)]
pub struct MetricsSnapshot {
    /// As [`StatusQuery`] answers.
    pub status: NodeStatus,
    /// The agent's registry and histograms.
    pub metrics: std::sync::Arc<crate::metrics::AgentMetrics>,
}

/// Each hosted function's load since the last call (for the region's
/// autoscaler): at most `MAX_FUNCTION_LOADS` entries, the busiest, and
/// how many were left out.
#[derive(Debug, Message)]
#[rtype(result = "(Vec<gshare_core::protocol::FunctionLoad>, u64)")]
pub struct TakeLoads;

/// The functions whose weights the agent keeps in host memory without
/// hosting them (parked), in (tenant, function, version) order, at most
/// `MAX_HOST_COPIES` (for the region's placement preference).
#[derive(Debug, Message)]
#[rtype(result = "Vec<gshare_core::protocol::HostCopy>")]
pub struct HostCopiesQuery;

/// Swap and remap events since the last call (for the region).
#[derive(Debug, Message)]
#[rtype(result = "Vec<SwapEvent>")]
pub struct TakeSwapEvents;

/// One half of a remap the executor asked for, for the region (see
/// `DomainCommand::InstanceSliceReserve` / `InstanceSliceRelease`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceRequest {
    /// Phase one: reserve `slice` for `instance` (it holds a slice of GPU `from`).
    Reserve {
        /// The executor's function.
        function: FunctionId,
        /// The instance.
        instance: gshare_core::state::InstanceId,
        /// The GPU it holds now.
        from: u32,
        /// The target slice.
        slice: gshare_core::model::Slice,
    },
    /// Phase two: the instance left `gpu`; release its slice there.
    Release {
        /// The instance.
        instance: gshare_core::state::InstanceId,
        /// The GPU left.
        gpu: gshare_core::model::GpuId,
    },
}

/// The slice requests not yet sent to the region (RegionLink → NodeAgent).
/// The agent keeps each taken one until its [`SliceAnswer`] (or
/// [`AbandonSliceRequests`]).
#[derive(Debug, Message)]
#[rtype(result = "Vec<SliceRequest>")]
pub struct TakeSliceRequests;

/// A link session ended (RegionLink → NodeAgent): every slice request it
/// took and did not answer is answered not granted (nothing moves; one
/// that committed meanwhile shows in the next assignment). Sent after
/// the session's own answers, so none is answered twice.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct AbandonSliceRequests;

/// The region's answer to a [`SliceRequest`] (RegionLink → NodeAgent):
/// `granted` only when the command committed; anything else (refused, no
/// answer) counts as refused, so nothing moves.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SliceAnswer {
    /// What was asked.
    pub request: SliceRequest,
    /// Whether it committed.
    pub granted: bool,
    /// Granted: the replica's applied index, which includes the remap
    /// (`RegionMessageV1::Granted`); older assignments are then ignored.
    pub applied_index: Option<u64>,
}

/// Where the node's instances are (the agent's placement), for
/// `GET /v1/agent/placement`.
#[derive(Debug, Message)]
#[rtype(result = "AgentPlacement")]
pub struct PlacementQuery;

/// The agent's placement: what the executor holds where, against the
/// assignment it applied.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, actix::MessageResponse)]
pub struct AgentPlacement {
    /// Raft index of the last assignment applied.
    pub assignment_index: Option<u64>,
    /// Remaps completed (a granted reservation, then the source released).
    pub remaps: u64,
    /// Reservations the region refused (nothing moved).
    pub remaps_refused: u64,
    /// Swap-outs to host memory.
    pub swap_outs: u64,
    /// Swap-ins from host memory.
    pub swap_ins: u64,
    /// One entry per hosted function.
    pub functions: Vec<FunctionPlacement>,
}

/// One hosted function in [`AgentPlacement`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FunctionPlacement {
    /// Its instances and the GPUs of their slices as the agent holds them
    /// (a slice being released is left out).
    pub instances: Vec<(gshare_core::state::InstanceId, Vec<u32>)>,
    /// GPUs where a copy of its weights is loaded or loading.
    pub copies: Vec<u32>,
    /// The remap asked of the region and not answered, `(from, to)`.
    pub reserving: Option<(u32, u32)>,
}
