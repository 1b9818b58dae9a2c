//! What the executor decides: its output, carried out by the node agent
//! (live) or the simulator.

use super::{FunctionId, RejectReason, RequestId};
use crate::model::{Micros, MilliGpu};

/// One decision of [`super::NodeExecutor`], in the order it must be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Run the request on its function's instance on `gpu`, with `compute_milli`.
    Run {
        /// The request.
        request: RequestId,
        /// Its function.
        function: FunctionId,
        /// GPU index on the node.
        gpu: u32,
        /// Compute share it runs on.
        compute_milli: MilliGpu,
        /// Predicted finish (the latency model's service time from now), µs.
        finish_at: Micros,
    },
    /// Drop an idle instance's GPU copy; its weights stay in host memory (or,
    /// when host memory dropped its copy to make room and no other GPU holds
    /// one, are copied back there first: the executor counts that copy on
    /// the GPU's link before its next load).
    SwapOut {
        /// The function.
        function: FunctionId,
        /// GPU index.
        gpu: u32,
    },
    /// Drop an instance from the GPU without keeping its weights (scale to
    /// zero); the next load is a cold start.
    Unload {
        /// The function.
        function: FunctionId,
        /// GPU index.
        gpu: u32,
    },
    /// Copy the function's weights from host memory onto `gpu`.
    SwapIn {
        /// The function.
        function: FunctionId,
        /// GPU index.
        gpu: u32,
        /// When the copy completes, µs.
        ready_at: Micros,
    },
    /// Fetch the weights from storage into host memory, then onto `gpu`.
    ColdStart {
        /// The function.
        function: FunctionId,
        /// GPU index.
        gpu: u32,
        /// When it is ready, µs.
        ready_at: Micros,
    },
    /// Remap: move the idle instance from GPU `from` to GPU `to` (its GPU
    /// memory on `from` is released now; the copy comes from host memory).
    Move {
        /// The function.
        function: FunctionId,
        /// Source GPU index.
        from: u32,
        /// Target GPU index.
        to: u32,
        /// When it is ready on `to`, µs.
        ready_at: Micros,
    },
    /// Turn the request away.
    Reject {
        /// The request.
        request: RequestId,
        /// Why.
        reason: RejectReason,
    },
    /// Phase one of a remap of a pinned `burstable` or `oversubscribed`
    /// function: ask the region to reserve a slice on GPU `to` for its
    /// instance on GPU `from`. Nothing moves until the answer comes back
    /// as [`super::Event::Reserved`]; a refusal means no move.
    Reserve {
        /// The function.
        function: FunctionId,
        /// The GPU its instance holds now.
        from: u32,
        /// The GPU asked for.
        to: u32,
    },
    /// Phase two of a remap: the function holds nothing on GPU `gpu` any
    /// more (moved away, swapped out, or never loaded there); the slice
    /// there may be released.
    Release {
        /// The function.
        function: FunctionId,
        /// The GPU left.
        gpu: u32,
    },
}

/// A change to which GPU holds a copy of a function's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightsChange {
    /// A copy starts loading onto `gpu` (it holds the memory from now on).
    Joined {
        /// The function.
        function: FunctionId,
        /// The GPU.
        gpu: u32,
    },
    /// The copy on `gpu` is dropped.
    Left {
        /// The function.
        function: FunctionId,
        /// The GPU.
        gpu: u32,
    },
}

impl Command {
    /// The changes this command makes to where weights are resident, in
    /// order (a move leaves its source first): what the meter bills as
    /// resident memory. The live agent and the deterministic simulation
    /// both feed their meters from it.
    pub fn weights_changes(&self) -> impl Iterator<Item = WeightsChange> {
        let (first, second) = match *self {
            Command::SwapIn { function, gpu, .. } | Command::ColdStart { function, gpu, .. } => {
                (Some(WeightsChange::Joined { function, gpu }), None)
            }
            Command::Move {
                function, from, to, ..
            } => (
                Some(WeightsChange::Left {
                    function,
                    gpu: from,
                }),
                Some(WeightsChange::Joined { function, gpu: to }),
            ),
            Command::SwapOut { function, gpu } | Command::Unload { function, gpu } => {
                (Some(WeightsChange::Left { function, gpu }), None)
            }
            Command::Run { .. }
            | Command::Reject { .. }
            | Command::Reserve { .. }
            | Command::Release { .. } => (None, None),
        };
        first.into_iter().chain(second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_follow_loads_moves_and_drops() {
        let f = FunctionId(3);
        let changes = |c: Command| c.weights_changes().collect::<Vec<_>>();
        let joined = |gpu| WeightsChange::Joined { function: f, gpu };
        let left = |gpu| WeightsChange::Left { function: f, gpu };
        assert_eq!(
            changes(Command::ColdStart {
                function: f,
                gpu: 1,
                ready_at: 9
            }),
            [joined(1)]
        );
        assert_eq!(
            changes(Command::SwapIn {
                function: f,
                gpu: 0,
                ready_at: 9
            }),
            [joined(0)]
        );
        assert_eq!(
            changes(Command::Move {
                function: f,
                from: 0,
                to: 1,
                ready_at: 9
            }),
            [left(0), joined(1)]
        );
        assert_eq!(
            changes(Command::SwapOut {
                function: f,
                gpu: 1
            }),
            [left(1)]
        );
        assert_eq!(
            changes(Command::Unload {
                function: f,
                gpu: 0
            }),
            [left(0)]
        );
        assert!(changes(Command::Reject {
            request: RequestId(1),
            reason: RejectReason::DeadlineUnreachable {
                predicted_finish: 2,
                deadline: 1,
            },
        })
        .is_empty());
    }
}
