//! What happens to a node: the executor's input.

use super::{FunctionId, FunctionProfile, RequestId};
use crate::model::Micros;

/// One input to [`super::NodeExecutor::handle`], stamped by the caller with `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The region placed a function on this node (its weights are in neither
    /// GPU nor host memory yet).
    InstanceAdded {
        /// The function.
        function: FunctionId,
        /// How to serve it.
        profile: FunctionProfile,
    },
    /// The function leaves this node: queued requests are rejected, idle
    /// copies unloaded, busy ones unloaded when their requests finish.
    InstanceRemoved {
        /// The function.
        function: FunctionId,
    },
    /// Like [`Event::InstanceRemoved`], but the function's weights stay in
    /// host memory (with a host cache, if they are there): it is *parked*,
    /// takes no request, and its host copy is dropped, least recently
    /// invoked first, like any host copy without a GPU copy, when host
    /// memory is needed (then the function is forgotten). An
    /// [`Event::InstanceAdded`] on the same id revives it: its first load
    /// is a swap-in, not a cold start (the agent revives under a fresh id,
    /// after [`super::NodeExecutor::move_host_copy`]). [`Event::InstanceRemoved`]
    /// on a parked id forgets it. See [`super::NodeExecutor::parked`].
    InstanceParked {
        /// The function.
        function: FunctionId,
    },
    /// A request arrived.
    RequestArrived {
        /// Its id.
        request: RequestId,
        /// The function it invokes.
        function: FunctionId,
        /// Its service time on a whole GPU, µs (measured or predicted).
        full_gpu_us: Micros,
        /// Absolute deadline, µs.
        deadline: Micros,
    },
    /// A request started by [`super::Command::Run`] finished.
    RequestFinished {
        /// Its id.
        request: RequestId,
        /// The GPU it ran on.
        gpu: u32,
    },
    /// The caller gave up on a request that has not started (its client
    /// went away): it leaves its GPU's queue, or the requests waiting for
    /// memory, and no command names it. A request that started (its run
    /// ends with [`Event::RequestFinished`]), was answered or is unknown is
    /// left as it is.
    RequestCancelled {
        /// Its id.
        request: RequestId,
    },
    /// A swap-in, cold start or move onto `gpu` completed.
    LoadFinished {
        /// The function loaded.
        function: FunctionId,
        /// The GPU it is now ready on.
        gpu: u32,
    },
    /// Load the function ahead of predicted requests, onto the GPU that
    /// has free memory for it soonest, without evicting anything; nothing
    /// happens if a copy is already on the node or no GPU has room.
    Prefetch {
        /// The function.
        function: FunctionId,
    },
    /// The function's runtime restarts on every load and measured how long
    /// that takes (a microVM's boot-to-ready, see docs/microvm.md): from
    /// now on each of its loads — cold start, swap-in or move — is timed
    /// `start_us` instead of by the bandwidth model of
    /// [`super::LoadCosts`]. Ignored for an unknown function.
    StartMeasured {
        /// The function.
        function: FunctionId,
        /// What one load of it takes, µs.
        start_us: Micros,
    },
    /// A tick, due at [`super::NodeExecutor::next_timeout`]: queued
    /// requests that can no longer meet their deadline are rejected early,
    /// and queues are dispatched again.
    Timer,
    /// The region's answer to a [`super::Command::Reserve`]: with
    /// `granted`, GPU `to` is reserved for the function beside `from`, and
    /// the executor moves off `from` (then emits [`super::Command::Release`]);
    /// otherwise nothing moves.
    Reserved {
        /// The function.
        function: FunctionId,
        /// The GPU its instance held.
        from: u32,
        /// The GPU asked for.
        to: u32,
        /// Whether the region reserved it.
        granted: bool,
    },
}
