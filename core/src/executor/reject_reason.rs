//! Why a request was turned away.

use crate::model::Micros;
use std::fmt;

/// The reason carried by [`super::Command::Reject`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// On arrival, the best predicted finish over the node's GPUs is after
    /// the deadline.
    DeadlineUnreachable {
        /// Earliest predicted finish, µs.
        predicted_finish: Micros,
        /// The request's deadline, µs.
        deadline: Micros,
    },
    /// While queued or waiting for memory, the earliest possible finish
    /// slipped past the deadline (earlier-deadline work arrived, a load took
    /// the time, or the instances to evict stayed busy longer).
    DeadlineMissedInQueue {
        /// Earliest possible finish when the executor gave up, µs.
        earliest_finish: Micros,
        /// The request's deadline, µs.
        deadline: Micros,
    },
    /// No GPU can hold an instance: the function is larger than a GPU, or
    /// the memory is held by instances that will never be evicted
    /// (`exclusive`/`guaranteed` under gshare rules; busy ones under the
    /// baselines, which do not wait for memory). Under gshare rules a request
    /// whose memory busy or loading evictable instances will free in time
    /// waits instead (see [`super::ExecutorRules::wait_for_memory`]).
    NoCapacity,
    /// The function is not (or no longer) placed on this node.
    UnknownFunction,
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::DeadlineUnreachable {
                predicted_finish,
                deadline,
            } => write!(
                f,
                "deadline unreachable: predicted finish {predicted_finish} µs > deadline {deadline} µs"
            ),
            RejectReason::DeadlineMissedInQueue {
                earliest_finish,
                deadline,
            } => write!(
                f,
                "deadline missed in queue: earliest finish {earliest_finish} µs > deadline {deadline} µs"
            ),
            RejectReason::NoCapacity => f.write_str("no GPU of the node can hold an instance"),
            RejectReason::UnknownFunction => f.write_str("function not placed on this node"),
        }
    }
}
