//! Counters an agent reports in every heartbeat: its function processes
//! and its usage journal.

use serde::{Deserialize, Serialize};

/// Totals since the agent started (journal figures: now).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentCounters {
    /// Function processes started by the `process` driver (placements,
    /// swap-ins, moves; not restarts after a crash).
    pub process_starts: u64,
    /// Function processes that exited without being asked to.
    pub process_crashes: u64,
    /// Restarts after a crash that became healthy.
    pub process_restarts: u64,
    /// Restart attempts that failed.
    pub process_failed_starts: u64,
    /// Function processes running now.
    pub process_running: u64,
    /// Usage records journaled and not yet acknowledged by the region.
    pub usage_pending_records: u64,
    /// Results withheld because their usage could not be journaled.
    pub usage_withheld: u64,
}
