//! Runtime drivers: what actually serves a function's requests.
//!
//! An [`crate::agent::InstanceActor`] owns one driver and calls it; the
//! driver knows nothing about queues or deadlines (the executor decided
//! when, where and on how much compute a request runs). Drivers:
//!
//! - [`SimDriver`] (`sim`): takes exactly the service time the executor
//!   predicted from the function's latency profile and slice, so a node of
//!   simulated GPUs behaves like the serving simulator;
//! - [`ProcessDriver`] (`process`): starts the function's server per
//!   instance with its slice's CUDA MPS limits ([`process::ProcessInstance`]),
//!   proxies requests over HTTP, restarts it on crash, stops it (and its
//!   children) on release and on swap-out, and starts it again on the new
//!   GPU on swap-in or move ([`RuntimeDriver::place`]);
//! - `microvm`: the same [`ProcessDriver`] with [`ProcessOptions::vm`] set:
//!   the process is QEMU, and the function's server runs in its own VM
//!   ([`microvm`], docs/microvm.md).
//!
//! [`Drivers`] picks the driver of each runtime from the agent config's
//! `[runtimes]` section and reads the `process` command templates.

mod drivers;
pub mod microvm;
pub mod process;
mod process_counters;
mod process_driver;
mod sim;

pub use drivers::Drivers;
pub use process::{BodyPart, ReplyHead, RequestBody, StreamItem};
pub use process_counters::{ProcessCounters, VmFigures};
pub use process_driver::{ProcessDriver, ProcessOptions};
pub use sim::SimDriver;

use gshare_core::executor::RequestId;
use gshare_core::model::{FunctionSpec, Micros, MilliGpu, Slice};
use std::future::Future;
use std::pin::Pin;

/// A driver's future; runs on the instance actor's (single-threaded) arbiter.
pub type RuntimeFuture<T> = Pin<Box<dyn Future<Output = T>>>;

/// One request to run, as the executor decided it.
#[derive(Debug)]
pub struct Invocation {
    /// The request.
    pub request: RequestId,
    /// GPU index on the node.
    pub gpu: u32,
    /// Compute share it runs on.
    pub compute_milli: MilliGpu,
    /// Service time the executor predicted for it on that share, µs.
    pub service_us: Micros,
    /// When the request's deadline passes (`None`: unknown; a driver then
    /// uses the function's default).
    pub deadline: Option<std::time::Instant>,
    /// Request body: whole, or streamed as the client sends it (the
    /// ingress's or the region's; cut when the client left or went over
    /// `max_request_bytes`: the call must then not complete).
    pub body: RequestBody,
    /// The HTTP request as the client sent it to the transparent route
    /// (`/v1/invoke/{tenant}/{function}/{*path}`): any status of the
    /// function is its answer. `None`: a plain invocation (`POST` of the
    /// body to the template's invoke path; a non-2xx answer fails it).
    pub http: Option<HttpCall>,
    /// Set when the reply may stream (the transparent route): a driver
    /// that streams it sends the head and the body's channel here as soon
    /// as the head arrived, and answers the invocation when the stream
    /// ended (with the body's first bytes and [`FunctionReply::streamed`]).
    pub stream_to: Option<tokio::sync::oneshot::Sender<StreamOpen>>,
}

/// A reply whose body streams: its head and where its chunks arrive.
#[derive(Debug)]
pub struct StreamOpen {
    /// The function's status and headers.
    pub head: ReplyHead,
    /// The body, chunk by chunk; closed without [`StreamItem::End`]: cut.
    pub chunks: tokio::sync::mpsc::Receiver<StreamItem>,
}

pub use gshare_core::protocol::HttpCall;

/// A function's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionReply {
    /// Its status and headers (`200` and none from drivers without HTTP).
    pub head: ReplyHead,
    /// Its body (of a streamed reply: its first
    /// [`gshare_core::protocol::MAX_REPLAY_BODY`] bytes, what an
    /// idempotency key stores).
    pub body: Vec<u8>,
    /// Set when the body streamed.
    pub streamed: Option<Streamed>,
}

/// How a streamed reply's body went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streamed {
    /// Bytes passed on.
    pub len: u64,
    /// The function ended it ([`StreamItem::End`] was passed on); `false`:
    /// the receiver went away first.
    pub complete: bool,
}

impl FunctionReply {
    /// A `200` with `body` and no headers.
    pub fn ok(body: Vec<u8>) -> Self {
        Self {
            head: ReplyHead {
                status: 200,
                headers: Vec::new(),
            },
            body,
            streamed: None,
        }
    }
}

/// Why a driver could not serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The instance is not running (never started, or stopped).
    #[error("instance not running")]
    NotRunning,
    /// The function's runtime failed.
    #[error("runtime failed: {0}")]
    Failed(String),
    /// The function's process crashed while serving the request (it is
    /// being restarted).
    #[error("{0}")]
    Crashed(String),
    /// The request's deadline passed before the function answered.
    #[error("{0}")]
    DeadlineExceeded(String),
}

/// A way to run a function's instance (sim, process, microVM …).
pub trait RuntimeDriver {
    /// Brings the instance up on its slices (called once, before any invoke).
    fn start(
        &mut self,
        spec: &FunctionSpec,
        slices: &[Slice],
    ) -> RuntimeFuture<Result<(), RuntimeError>>;
    /// Serves one request; the answer is the function's reply.
    fn invoke(
        &mut self,
        invocation: Invocation,
    ) -> RuntimeFuture<Result<FunctionReply, RuntimeError>>;
    /// Stops the instance (and everything it started).
    fn stop(&mut self) -> RuntimeFuture<()>;
    /// A copy of the function's weights was loaded on a node GPU (swap-in,
    /// cold start, the target of a move) or left one (swap-out, unload, the
    /// source of a move). The executor may hold copies on several GPUs at
    /// once. Called only between `start` and `stop`; requests wait for it.
    /// The sim driver has nothing to do (the GPU actor models the copy).
    fn place(&mut self, change: Placement) -> RuntimeFuture<Result<(), RuntimeError>> {
        let _ = change;
        Box::pin(async { Ok(()) })
    }
}

/// Where a function's weights went (see [`RuntimeDriver::place`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// A copy was loaded on this node GPU.
    Joined(u32),
    /// The copy on this node GPU is gone.
    Left(u32),
}
