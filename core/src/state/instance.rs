//! A placed instance of a function: its slices on one node's GPUs.

use super::fit::Demand;
use crate::model::{PoolKind, Quota, Slice, TenantId, Tier};
use serde::{Deserialize, Serialize};
use std::fmt;

/// An instance's id, assigned by the state machine in apply order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InstanceId(pub u64);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "i-{}", self.0)
    }
}

/// One running instance of a function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    /// Its id.
    pub id: InstanceId,
    /// Owning tenant.
    pub tenant: TenantId,
    /// Function name (per tenant).
    pub function: String,
    /// The function's tier when the instance was placed.
    pub tier: Tier,
    /// Name of the pool of its node.
    pub pool: String,
    /// Kind of that pool (selects the quota it counts against).
    pub pool_kind: PoolKind,
    /// Its slices: one, or several whole GPUs of one node (exclusive).
    pub slices: Vec<Slice>,
    /// When it was placed (Unix ms, from the command's `now`).
    pub placed_at: u64,
}

impl Instance {
    /// What the instance holds against its tenant's quota: the sum of its
    /// slices and one instance.
    pub fn held(&self) -> Quota {
        held(&self.slices)
    }

    /// What slice `i` asks of its GPU.
    pub fn demand(&self, slice: &Slice) -> Demand {
        Demand {
            tier: self.tier,
            compute_milli: slice.compute_milli,
            memory_mib: slice.memory_mib,
        }
    }
}

/// What an instance made of `slices` holds against a quota.
pub fn held(slices: &[Slice]) -> Quota {
    Quota {
        compute_milli: slices.iter().map(|s| u64::from(s.compute_milli)).sum(),
        memory_mib: slices.iter().map(|s| s.memory_mib).sum(),
        instances: 1,
    }
}
