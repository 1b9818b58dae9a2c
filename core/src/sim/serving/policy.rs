//! The policies `gsharectl sim serving` compares, as executor rules.

use crate::executor::ExecutorRules;
use crate::model::{ParseEnumError, Tier};
use std::fmt;
use std::str::FromStr;

/// A serving policy: gshare or one of the baselines, each at its strongest,
/// or the lower bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServingPolicy {
    /// Each instance owns a whole GPU and stays until its GPU is needed for
    /// another model (the least recently used across GPUs); a miss pays a
    /// cold start.
    Exclusive,
    /// Whole GPUs, one model each at a time, with a host-memory weight
    /// cache: an evicted model comes back by a swap-in over the
    /// host-to-device link (Torpor/FaaSwap-like dedicated serving).
    ExclusiveSwap,
    /// Fixed fractional slices (MIG/MPS-like) with the same LRU rule; no
    /// swap to host, no remap, no oversubscription. The simulator tries
    /// every slice count of [`super::ServingParams::static_slices`].
    Static,
    /// Slices + oversubscription + swap to host + remap + deadline-aware
    /// waiting + right-sized and squeezed shares.
    Gshare,
    /// The proven lower bound on GPUs (the largest of four, see
    /// [`super::proven_min_gpus`]); its runs are the central-queue EDF
    /// estimate with every model resident at no cost, which is not a bound.
    Bound,
}

impl ServingPolicy {
    /// All policies, in report order.
    pub const ALL: [ServingPolicy; 5] = [
        ServingPolicy::Exclusive,
        ServingPolicy::ExclusiveSwap,
        ServingPolicy::Static,
        ServingPolicy::Gshare,
        ServingPolicy::Bound,
    ];

    /// The name used on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ServingPolicy::Exclusive => "exclusive",
            ServingPolicy::ExclusiveSwap => "exclusive-swap",
            ServingPolicy::Static => "static",
            ServingPolicy::Gshare => "gshare",
            ServingPolicy::Bound => "bound",
        }
    }

    /// The executor rules of this policy (`slices` is used by `static`
    /// only); `None` for `bound`, which has its own simulation.
    pub fn rules(self, slices: u32) -> Option<ExecutorRules> {
        match self {
            ServingPolicy::Exclusive => Some(ExecutorRules::exclusive()),
            ServingPolicy::ExclusiveSwap => Some(ExecutorRules::exclusive_swap()),
            ServingPolicy::Static => Some(ExecutorRules::static_slices(slices)),
            ServingPolicy::Gshare => Some(ExecutorRules::gshare()),
            ServingPolicy::Bound => None,
        }
    }

    /// The tier tenants are billed at: whole GPUs are `exclusive`, fixed
    /// slices `guaranteed`, gshare bills each function's own tier.
    pub fn billed_tier(self, function_tier: Tier) -> Tier {
        match self {
            ServingPolicy::Exclusive | ServingPolicy::ExclusiveSwap | ServingPolicy::Bound => {
                Tier::Exclusive
            }
            ServingPolicy::Static => Tier::Guaranteed,
            ServingPolicy::Gshare => function_tier,
        }
    }
}

impl fmt::Display for ServingPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ServingPolicy {
    type Err = ParseEnumError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| ParseEnumError {
                what: "serving policy",
                value: s.to_string(),
                expected: Self::ALL.iter().map(|p| p.as_str()).collect(),
            })
    }
}
