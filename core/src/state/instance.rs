//! A placed instance of a function: its slices on one node's GPUs.

use super::fit::Demand;
use crate::model::{Mib, MilliGpu, PoolKind, Quota, Slice, TenantId, Tier};
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
    /// The function version it runs: the function's version when it was
    /// placed, moved on by updates that keep its shape. An instance of an
    /// earlier version than its function's is *outgoing*: a reshaping
    /// update left it serving until its replacement is resident (see
    /// [`super::FunctionRecord::spec_for`]).
    #[serde(default)]
    pub version: u64,
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

/// What an instance made of `slices` holds against a quota. The sums
/// saturate: a sum past `u64` is past every quota (quotas are at most
/// [`crate::bounds::MAX_QUOTA`]), so [`Quota::admits`] refuses it.
pub fn held(slices: &[Slice]) -> Quota {
    held_of(slices.iter().map(|s| (s.compute_milli, s.memory_mib)))
}

/// What an instance of these `(compute, memory)` slices holds against a
/// quota (saturating, as [`held`]).
pub fn held_of(slices: impl IntoIterator<Item = (MilliGpu, Mib)>) -> Quota {
    slices.into_iter().fold(
        Quota {
            compute_milli: 0,
            memory_mib: 0,
            instances: 1,
        },
        |q, (c, m)| Quota {
            compute_milli: q.compute_milli.saturating_add(u64::from(c)),
            memory_mib: q.memory_mib.saturating_add(m),
            instances: 1,
        },
    )
}
