//! Swaps and remaps an agent carried out, reported to the region.

use crate::model::Micros;
use crate::state::InstanceId;
use serde::{Deserialize, Serialize};

/// What happened to an instance's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SwapKind {
    /// Host memory → GPU.
    SwapIn,
    /// GPU → host memory.
    SwapOut,
    /// Storage → host → GPU.
    ColdStart,
    /// Moved to another GPU of the node (remap).
    Move,
    /// Dropped from the GPU without keeping a host copy.
    Unload,
}

/// One swap or remap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwapEvent {
    /// The instance.
    pub instance: InstanceId,
    /// What happened.
    pub kind: SwapKind,
    /// GPU it left (for `SwapOut`, `Move`, `Unload`).
    pub from_gpu: Option<u32>,
    /// GPU it reached (for `SwapIn`, `ColdStart`, `Move`).
    pub to_gpu: Option<u32>,
    /// When it started, agent wall clock, Unix ms.
    pub at_ms: u64,
    /// How long the copy takes, µs (0 for `SwapOut` and `Unload`).
    pub duration_us: Micros,
}
