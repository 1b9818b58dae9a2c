//! What a metered quantity is about.

use crate::model::{PoolKind, TenantId, Tier};
use serde::{Deserialize, Serialize};

/// The bill-line identity of metered usage (all of a usage record but the
/// quantities, the time and the sequence number).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UsageKey {
    /// The tenant billed.
    pub tenant: TenantId,
    /// The function.
    pub function: String,
    /// Its tier.
    pub tier: Tier,
    /// The GPU model it runs on.
    pub gpu_model: String,
    /// The kind of pool the node is in.
    pub pool_kind: PoolKind,
}
