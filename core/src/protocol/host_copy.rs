//! The weights an agent keeps in host memory for functions it no longer
//! hosts (parked: the executor's `Event::InstanceParked`), reported to the
//! region so that the scheduler places such a function on that node again
//! when it comes back (a warm resume: a swap-in, not a cold start).
//!
//! ```text
//!  agent: parked (tenant, function, version) ─HostCopies─▶ replica holding its link
//!  leader, every autoscale tick: every replica's reports ─▶ (tenant, function, version) → nodes
//!  ScaleOut / Underplaced of that function ─▶ PlacementPolicy::prefer = those nodes
//! ```

use serde::{Deserialize, Serialize};

use crate::model::{Mib, TenantId};

/// Most entries in one report: the agent keeps at most this many parked
/// functions. With tenant and function names of at most 63 bytes an entry
/// encodes in under 150 bytes (bincode), so a full report is under
/// 150 KiB, well under the agent frame limit.
pub const MAX_HOST_COPIES: usize = 1024;

/// One function's weights kept in an agent's host memory.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HostCopy {
    /// The tenant.
    pub tenant: TenantId,
    /// The function's name.
    pub function: String,
    /// The function version whose weights they are (an assignment of
    /// another version cold-starts).
    pub version: u64,
    /// Host memory they hold, MiB.
    pub memory_mib: Mib,
}
