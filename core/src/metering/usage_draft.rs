//! A usage record before the journal numbers it.

use super::UsageKey;
use crate::state::UsageRecord;

/// Usage of one key within one billing hour, not yet numbered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageDraft {
    /// What the usage is about.
    pub key: UsageKey,
    /// Busy compute: milli-GPU × ms.
    pub compute_milli_gpu_ms: u64,
    /// Resident GPU memory: MiB × ms.
    pub memory_mib_ms: u64,
    /// Invocations completed.
    pub invocations: u64,
    /// End of the metered interval (Unix ms), inside the draft's hour.
    pub end_ms: u64,
}

impl UsageDraft {
    /// The record to journal (`seq` 0: the journal assigns it).
    pub fn into_record(self) -> UsageRecord {
        UsageRecord {
            seq: 0,
            tenant: self.key.tenant,
            function: self.key.function,
            tier: self.key.tier,
            gpu_model: self.key.gpu_model,
            pool_kind: self.key.pool_kind,
            compute_milli_gpu_ms: self.compute_milli_gpu_ms,
            memory_mib_ms: self.memory_mib_ms,
            invocations: self.invocations,
            end_ms: self.end_ms,
        }
    }
}
