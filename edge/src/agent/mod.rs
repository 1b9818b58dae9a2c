//! The agent's actors.
//!
//! ```text
//!   ingress (HTTP) ──Invoke──▶ NodeAgent ◀──Assignment / Tokens── RegionLink (QUIC)
//!                                │  NodeExecutor (core): every decision
//!              Run ┌─────────────┼──────────────┐ SwapIn / ColdStart / Move / SwapOut
//!                  ▼             ▼              ▼
//!          InstanceActor …   GpuActor 0 …   GpuActor n-1   (carry out; report back)
//!          (runtime driver)  (backend accounting, load timing)
//! ```
//!
//! The executor is one per node (it routes requests and remaps instances
//! across the node's GPUs), so it lives in [`NodeAgent`]; each
//! [`GpuActor`] carries out the loads and releases of its GPU and each
//! [`InstanceActor`] runs the requests of one hosted function through its
//! runtime driver. The actors decide nothing.

mod gpu_actor;
mod group_commit;
mod instance_actor;
mod messages;
pub mod metering;
mod node_agent;
mod node_status;

pub use gpu_actor::GpuActor;
pub use instance_actor::InstanceActor;
pub use messages::{
    AbandonSliceRequests, Admission, AgentPlacement, ApplyAssignment, ApplyTokens, CheckToken,
    FlushUsage, FunctionPlacement, HostCopiesQuery, Invoke, KeyAnswer, LoadDone, LoadWeights,
    LookupKey, MetricsQuery, MetricsSnapshot, PlacementQuery, ReleaseInstance, ReleaseWeights,
    ReplyStart, RequestDone, Residency, RunRequest, SliceAnswer, SliceRequest, StatusQuery,
    StopNow, StopRuntimes, StreamOpened, TakeLoads, TakeSliceRequests, TakeSwapEvents, Transparent,
};
pub use metering::Metering;
pub use node_agent::{DriverFactory, NodeAgent, NodeSetup};
pub use node_status::NodeStatus;
