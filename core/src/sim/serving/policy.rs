//! The policies `gsharectl sim serving` compares, as executor rules.

use crate::executor::ExecutorRules;
use crate::model::{ParseEnumError, Tier};
use std::fmt;
use std::str::FromStr;

/// A serving policy: gshare or one of the baselines, each at its strongest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServingPolicy {
    /// Each instance owns a whole GPU and stays until its GPU is needed for
    /// another model (LRU); a miss pays a cold start.
    Exclusive,
    /// Fixed fractional slices (MIG/MPS-like) with the same LRU rule; no
    /// swap to host, no remap, no oversubscription. The simulator tries
    /// every slice count of [`super::ServingParams::static_slices`].
    Static,
    /// Slices + oversubscription + swap to host + remap + deadline-aware waiting.
    Gshare,
    /// Every model resident on every GPU at no load or swap cost, whole GPUs,
    /// deadline-aware order: the physical limit of any policy.
    Oracle,
}

impl ServingPolicy {
    /// All policies, in report order.
    pub const ALL: [ServingPolicy; 4] = [
        ServingPolicy::Exclusive,
        ServingPolicy::Static,
        ServingPolicy::Gshare,
        ServingPolicy::Oracle,
    ];

    /// The name used on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ServingPolicy::Exclusive => "exclusive",
            ServingPolicy::Static => "static",
            ServingPolicy::Gshare => "gshare",
            ServingPolicy::Oracle => "oracle",
        }
    }

    /// The executor rules of this policy (`slices` is used by `static` only).
    pub fn rules(self, slices: u32) -> ExecutorRules {
        match self {
            ServingPolicy::Exclusive => ExecutorRules::exclusive(),
            ServingPolicy::Static => ExecutorRules::static_slices(slices),
            ServingPolicy::Gshare => ExecutorRules::gshare(),
            ServingPolicy::Oracle => ExecutorRules::oracle(),
        }
    }

    /// The tier tenants are billed at: whole GPUs are `exclusive`, fixed
    /// slices `guaranteed`, gshare bills each function's own tier.
    pub fn billed_tier(self, function_tier: Tier) -> Tier {
        match self {
            ServingPolicy::Exclusive | ServingPolicy::Oracle => Tier::Exclusive,
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
                expected: vec!["exclusive", "static", "gshare", "oracle"],
            })
    }
}
