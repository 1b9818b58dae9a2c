//! What an agent tells the region about each instance it hosts: where its
//! weights are, so that the region can tell "committed" from "ready".

use crate::state::InstanceId;
use serde::{Deserialize, Serialize};

/// Where an instance's weights are, as its agent reports them.
///
/// ```text
///   (assignment received) ─▶ Cold ─load─▶ Loading ─done─▶ Resident
///                                                 ◀─swap in─ SwappedOut ◀─swap out─┘
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum InstanceState {
    /// The agent hosts it (it takes invocations) but holds no copy of its
    /// weights: the first request loads them (an `oversubscribed` instance
    /// whose GPU has no free memory stays here until then).
    Cold,
    /// A copy is being loaded onto a GPU (cold start, swap-in or move).
    Loading,
    /// A copy is on a GPU, ready to run.
    Resident,
    /// No copy on a GPU; the weights are in the node's host memory.
    SwappedOut,
}

impl InstanceState {
    /// The name the API shows: `cold`, `loading`, `resident`, `swapped_out`.
    pub fn name(self) -> &'static str {
        match self {
            InstanceState::Cold => "cold",
            InstanceState::Loading => "loading",
            InstanceState::Resident => "resident",
            InstanceState::SwappedOut => "swapped_out",
        }
    }
}

/// One hosted instance, in a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceStatus {
    /// The instance.
    pub instance: InstanceId,
    /// Where its weights are.
    pub state: InstanceState,
    /// The GPUs holding (or loading) a copy.
    pub gpus: Vec<u32>,
}
