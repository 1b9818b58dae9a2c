//! The domain model: units, GPUs, nodes, pools, slices, tiers, tenants,
//! quotas and function specs.
//!
//! Units are fixed across the whole code base:
//! - compute in milli-GPU ([`MilliGpu`]; `1000` = one whole GPU, as the
//!   Alibaba trace's `gpu_milli`),
//! - memory in MiB ([`Mib`]),
//! - simulated time in integer microseconds ([`Micros`]).
//!
//! Sums over quantities ([`Quota::admits`]) are checked: a sum past `u64`
//! exceeds every quota. The ranges a spec's fields must lie in are in
//! [`crate::bounds`].

#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Compute share of one GPU, in thousandths (`1000` = a whole GPU).
pub type MilliGpu = u32;
/// Memory in mebibytes.
pub type Mib = u64;
/// Simulated or measured time, in microseconds.
pub type Micros = u64;

/// One whole GPU in milli-GPU.
pub const WHOLE_GPU: MilliGpu = 1000;

/// Kind of a pool: a big datacenter pool or a small, scattered edge site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolKind {
    /// A large central GPU pool.
    Center,
    /// A small edge site, possibly cut off from the region at times.
    Edge,
}

impl PoolKind {
    /// The lower-case name used in configs and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolKind::Center => "center",
            PoolKind::Edge => "edge",
        }
    }
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PoolKind {
    type Err = ParseEnumError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "center" => Ok(PoolKind::Center),
            "edge" => Ok(PoolKind::Edge),
            _ => Err(ParseEnumError::new("pool kind", s, &["center", "edge"])),
        }
    }
}

/// The region's placement ranking, named by the topology file's
/// `[placement] policy` (replicated with the topology): which of the
/// placement policies the live planner ranks candidates by. `fgd` and
/// `gshare` are the trace simulator's policies of those names
/// (`gsharectl sim placement --policy`), on the same measures; `bestfit`
/// is the region's own (one GPU's leftover compute and memory), not the
/// simulator's node-level best fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RegionPolicy {
    /// Best fit: the GPU left with the least unreserved compute and memory.
    #[serde(rename = "bestfit")]
    BestFit,
    /// FGD: the least growth of expected fragmentation (the FGD paper's
    /// measure and integer sigmoid buckets).
    Fgd,
    /// gshare: the least loss of hole quality, then FGD.
    #[default]
    Gshare,
}

impl RegionPolicy {
    /// Every policy, in the order `--help` lists them.
    pub const ALL: [RegionPolicy; 3] = [
        RegionPolicy::BestFit,
        RegionPolicy::Fgd,
        RegionPolicy::Gshare,
    ];

    /// The name used in the topology file (and in `/v1/cluster/state`).
    pub fn as_str(self) -> &'static str {
        match self {
            RegionPolicy::BestFit => "bestfit",
            RegionPolicy::Fgd => "fgd",
            RegionPolicy::Gshare => "gshare",
        }
    }
}

impl fmt::Display for RegionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RegionPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RegionPolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = RegionPolicy::ALL.iter().map(|p| p.as_str()).collect();
                format!(
                    "unknown placement policy (expected one of: {})",
                    known.join(", ")
                )
            })
    }
}

/// The sharing tier a tenant buys for a function: coarser guarantees, deeper discount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// Whole GPUs; never shared, swapped or delayed. Full price.
    Exclusive,
    /// A fixed, reserved slice sharing a GPU spatially; never swapped.
    Guaranteed,
    /// Memory reserved, compute may be overcommitted; may be delayed within its deadline.
    Burstable,
    /// May be swapped out when idle and delayed within its deadline. Deepest discount.
    Oversubscribed,
}

impl Tier {
    /// All tiers, from the strongest guarantee to the weakest.
    pub const ALL: [Tier; 4] = [
        Tier::Exclusive,
        Tier::Guaranteed,
        Tier::Burstable,
        Tier::Oversubscribed,
    ];

    /// The kebab-case name used in configs and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Exclusive => "exclusive",
            Tier::Guaranteed => "guaranteed",
            Tier::Burstable => "burstable",
            Tier::Oversubscribed => "oversubscribed",
        }
    }

    /// Whether its node's agent may move an instance of this tier to
    /// another GPU of the node (through a reserved target slice):
    /// `burstable` and `oversubscribed`; `exclusive` and `guaranteed`
    /// instances stay on the slices the region placed.
    pub fn remappable(self) -> bool {
        matches!(self, Tier::Burstable | Tier::Oversubscribed)
    }

    /// Whether an idle instance of this tier may be swapped out to host memory.
    pub fn swappable(self) -> bool {
        matches!(self, Tier::Oversubscribed)
    }

    /// Whether a request of this tier may be held back while its deadline still holds.
    pub fn delayable(self) -> bool {
        matches!(self, Tier::Burstable | Tier::Oversubscribed)
    }

    /// Whether the instance's compute share is reserved (not overcommitted).
    pub fn compute_reserved(self) -> bool {
        matches!(self, Tier::Exclusive | Tier::Guaranteed)
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Tier {
    type Err = ParseEnumError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Tier::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                ParseEnumError::new(
                    "tier",
                    s,
                    &["exclusive", "guaranteed", "burstable", "oversubscribed"],
                )
            })
    }
}

/// The serving runtime a function's instances run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runtime {
    /// vLLM OpenAI-compatible server.
    Vllm,
    /// SGLang server.
    Sglang,
    /// A PyTorch script serving HTTP.
    Pytorch,
    /// TensorFlow Serving.
    TfServing,
    /// Any other HTTP server command.
    Custom,
}

impl Runtime {
    /// The kebab-case name used in configs and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Vllm => "vllm",
            Runtime::Sglang => "sglang",
            Runtime::Pytorch => "pytorch",
            Runtime::TfServing => "tf-serving",
            Runtime::Custom => "custom",
        }
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Runtime {
    type Err = ParseEnumError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            Runtime::Vllm,
            Runtime::Sglang,
            Runtime::Pytorch,
            Runtime::TfServing,
            Runtime::Custom,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
        .ok_or_else(|| {
            ParseEnumError::new(
                "runtime",
                s,
                &["vllm", "sglang", "pytorch", "tf-serving", "custom"],
            )
        })
    }
}

/// Where a function would like its instances: an edge pool by name, the
/// center, or anywhere. Written `edge:<pool>`, `center` or `any`: a
/// preference, which spills to the other pools when its first choice is
/// full. The strict forms (a function file's or deploy body's
/// `strict_pool = true`) never leave their pools; they are written
/// `strict:edge:<pool>` and `strict:center` in the state and its logs
/// (the string form keeps older logs, which never hold them, decoding).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PoolPreference {
    /// The named edge pool first (latency), spilling to others.
    Edge(String),
    /// A center pool first.
    Center,
    /// No preference.
    Any,
    /// The named edge pool only (`strict:edge:<pool>`).
    EdgeOnly(String),
    /// Center pools only (`strict:center`).
    CenterOnly,
}

/// Why a pool preference has no strict form.
pub const ANY_NAMES_NO_POOL: &str = "any names no pool";

impl PoolPreference {
    /// Whether the function never leaves its pool (the strict forms).
    pub fn is_strict(&self) -> bool {
        matches!(
            self,
            PoolPreference::EdgeOnly(_) | PoolPreference::CenterOnly
        )
    }

    /// The preference without its strictness (`strict:edge:p` is `edge:p`):
    /// the order in which the allowed pools are tried.
    pub fn preferred(&self) -> PoolPreference {
        match self {
            PoolPreference::EdgeOnly(p) => PoolPreference::Edge(p.clone()),
            PoolPreference::CenterOnly => PoolPreference::Center,
            other => other.clone(),
        }
    }

    /// The strict form (`edge:p` and `strict:edge:p` are `strict:edge:p`),
    /// or [`ANY_NAMES_NO_POOL`] for `any`.
    pub fn strict(&self) -> Result<PoolPreference, &'static str> {
        match self {
            PoolPreference::Edge(p) | PoolPreference::EdgeOnly(p) => {
                Ok(PoolPreference::EdgeOnly(p.clone()))
            }
            PoolPreference::Center | PoolPreference::CenterOnly => Ok(PoolPreference::CenterOnly),
            PoolPreference::Any => Err(ANY_NAMES_NO_POOL),
        }
    }

    /// The edge pool named (strict or not).
    pub fn edge_pool(&self) -> Option<&str> {
        match self {
            PoolPreference::Edge(p) | PoolPreference::EdgeOnly(p) => Some(p),
            _ => None,
        }
    }

    /// Whether any pool of `kind` may ever take the function (a strict
    /// preference allows one kind only).
    pub fn allows_kind(&self, kind: PoolKind) -> bool {
        match self {
            PoolPreference::EdgeOnly(_) => kind == PoolKind::Edge,
            PoolPreference::CenterOnly => kind == PoolKind::Center,
            _ => true,
        }
    }

    /// Whether pool `name` of `kind` may ever take the function: every pool
    /// for a preference, only the named edge pool or the center pools for
    /// a strict one.
    pub fn allows(&self, name: &str, kind: PoolKind) -> bool {
        match self {
            PoolPreference::EdgeOnly(p) => p == name && kind == PoolKind::Edge,
            _ => self.allows_kind(kind),
        }
    }
}

impl fmt::Display for PoolPreference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolPreference::Edge(p) => write!(f, "edge:{p}"),
            PoolPreference::Center => f.write_str("center"),
            PoolPreference::Any => f.write_str("any"),
            PoolPreference::EdgeOnly(p) => write!(f, "strict:edge:{p}"),
            PoolPreference::CenterOnly => f.write_str("strict:center"),
        }
    }
}

impl FromStr for PoolPreference {
    type Err = ParseEnumError;
    /// `edge:<pool>`, `center`, `any`, and the strict forms of the state
    /// (`strict:edge:<pool>`, `strict:center`). The accepted spellings an
    /// error names are the first three: a person writes `strict_pool`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let loose = |s: &str| match s {
            "center" => Some(PoolPreference::Center),
            "any" => Some(PoolPreference::Any),
            _ => match s.strip_prefix("edge:") {
                Some(p) if !p.is_empty() => Some(PoolPreference::Edge(p.to_string())),
                _ => None,
            },
        };
        let parsed = match s.strip_prefix("strict:") {
            Some(rest) => loose(rest).and_then(|p| p.strict().ok()),
            None => loose(s),
        };
        parsed.ok_or_else(|| {
            ParseEnumError::new("pool preference", s, &["edge:<pool>", "center", "any"])
        })
    }
}

impl Serialize for PoolPreference {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PoolPreference {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A word that is not one of an enum's names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?} (expected one of: {})", expected.join(", "))]
pub struct ParseEnumError {
    /// What was being parsed ("tier", "pool kind", ...).
    pub what: &'static str,
    /// The offending input.
    pub value: String,
    /// The accepted spellings.
    pub expected: Vec<&'static str>,
}

impl ParseEnumError {
    fn new(what: &'static str, value: &str, expected: &[&'static str]) -> Self {
        Self {
            what,
            value: value.to_string(),
            expected: expected.to_vec(),
        }
    }
}

/// A node's name, unique in a region.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub String);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One physical GPU: its node and its index on that node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GpuId {
    /// The node holding the GPU.
    pub node: NodeId,
    /// The GPU's index on its node (as `CUDA_VISIBLE_DEVICES` counts).
    pub index: u32,
}

impl fmt::Display for GpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/gpu{}", self.node, self.index)
    }
}

/// A fine-grained share of one physical GPU: compute and memory, any size.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Slice {
    /// The GPU the slice is cut from.
    pub gpu: GpuId,
    /// Compute share in milli-GPU (1..=1000).
    pub compute_milli: MilliGpu,
    /// GPU memory in MiB.
    pub memory_mib: Mib,
}

/// A tenant's name, unique in a region.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TenantId(pub String);

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Limits on what one tenant may hold in one pool kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Quota {
    /// Total compute of all instances, in milli-GPU.
    pub compute_milli: u64,
    /// Total GPU memory of all instances, in MiB.
    pub memory_mib: Mib,
    /// Number of instances.
    pub instances: u32,
}

impl Quota {
    /// Whether `used + extra` stays within this quota; names the first
    /// dimension that does not. A sum that overflows its integer type is
    /// past every quota.
    pub fn admits(&self, used: &Quota, extra: &Quota) -> Result<(), QuotaDimension> {
        let within = |used: Option<u64>, limit: u64| used.is_some_and(|u| u <= limit);
        if !within(
            used.compute_milli.checked_add(extra.compute_milli),
            self.compute_milli,
        ) {
            return Err(QuotaDimension::Compute);
        }
        if !within(
            used.memory_mib.checked_add(extra.memory_mib),
            self.memory_mib,
        ) {
            return Err(QuotaDimension::Memory);
        }
        if !within(
            used.instances.checked_add(extra.instances).map(u64::from),
            u64::from(self.instances),
        ) {
            return Err(QuotaDimension::Instances);
        }
        Ok(())
    }

    /// How many more of `each` fit beside `used` (the largest `k` with
    /// `used + k × each` admitted, as [`Quota::admits`] checks it; a
    /// dimension `each` does not use does not limit it; `u32::MAX` when
    /// none does). Nothing fits where `used` is already past a limit.
    pub fn room(&self, used: &Quota, each: &Quota) -> u32 {
        let fits = |limit: u64, used: u64, each: u64| {
            if used > limit {
                return 0;
            }
            limit
                .saturating_sub(used)
                .checked_div(each)
                .unwrap_or(u64::MAX)
        };
        let n = fits(self.compute_milli, used.compute_milli, each.compute_milli)
            .min(fits(self.memory_mib, used.memory_mib, each.memory_mib))
            .min(fits(
                u64::from(self.instances),
                u64::from(used.instances),
                u64::from(each.instances),
            ));
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// `self + other` per dimension, saturating: for bookkeeping of
    /// amounts [`Quota::admits`] has already admitted (a saturated sum is
    /// past every quota, so it can never pass a check).
    pub fn saturating_add(&self, other: &Quota) -> Quota {
        Quota {
            compute_milli: self.compute_milli.saturating_add(other.compute_milli),
            memory_mib: self.memory_mib.saturating_add(other.memory_mib),
            instances: self.instances.saturating_add(other.instances),
        }
    }

    /// `self - other` per dimension, stopping at zero.
    pub fn saturating_sub(&self, other: &Quota) -> Quota {
        Quota {
            compute_milli: self.compute_milli.saturating_sub(other.compute_milli),
            memory_mib: self.memory_mib.saturating_sub(other.memory_mib),
            instances: self.instances.saturating_sub(other.instances),
        }
    }
}

/// The dimension of a quota that ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QuotaDimension {
    /// Compute milli-GPU.
    Compute,
    /// GPU memory.
    Memory,
    /// Instance count.
    Instances,
}

impl fmt::Display for QuotaDimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QuotaDimension::Compute => "compute",
            QuotaDimension::Memory => "memory",
            QuotaDimension::Instances => "instances",
        })
    }
}

/// How a function's service time depends on the compute share it runs on.
///
/// The model: a request takes `full_gpu_us` on a whole GPU. Below
/// `saturation_milli` the time grows in inverse proportion to the share
/// (work-conserving: half the compute, twice the time); at or above it the
/// request gets no faster (the model cannot use more compute).
///
/// ```text
/// service(c) = full_gpu_us * max(1, saturation_milli / c)      for c in 1..=1000
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyProfile {
    /// Service time of one request on a whole GPU, in microseconds.
    pub full_gpu_us: Micros,
    /// The compute share beyond which a request gets no faster (1..=1000).
    pub saturation_milli: MilliGpu,
}

impl LatencyProfile {
    /// Service time of one request on a slice of `compute_milli` (past
    /// `u64::MAX` µs it saturates: a request that never finishes).
    pub fn service_us(&self, compute_milli: MilliGpu) -> Micros {
        let c = u64::from(compute_milli.clamp(1, WHOLE_GPU));
        let sat = u64::from(self.saturation_milli.clamp(1, WHOLE_GPU));
        if c >= sat {
            self.full_gpu_us
        } else {
            // Round up: a slice never makes a request faster than the model says.
            self.full_gpu_us.saturating_mul(sat).div_ceil(c)
        }
    }
}

/// What a tenant deploys: one serverless function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionSpec {
    /// Owning tenant.
    pub tenant: TenantId,
    /// Name, unique per tenant.
    pub name: String,
    /// Serving runtime.
    pub runtime: Runtime,
    /// GPU memory footprint of one instance (weights + working set), MiB.
    pub memory_mib: Mib,
    /// Compute slice of one instance, milli-GPU (a multiple of 1000 for multi-GPU).
    pub compute_milli: MilliGpu,
    /// Sharing tier.
    pub tier: Tier,
    /// Default per-request deadline (SLO), relative, in milliseconds.
    pub deadline_ms: u64,
    /// Where instances should go.
    pub pool: PoolPreference,
    /// Instances kept even when idle.
    pub min_instances: u32,
    /// Upper bound on instances.
    pub max_instances: u32,
    /// Idle time after which an extra instance may be released, in seconds.
    pub idle_timeout_s: u64,
    /// Service time as a function of compute share.
    pub latency: LatencyProfile,
    /// The model its runtime serves (`org/model`): what `{model}` in the
    /// runtime's template stands for; `None`: the function's name (as
    /// before this field). Checked by [`crate::serving::check_model`].
    #[serde(default)]
    pub model: Option<String>,
    /// Arguments appended to the runtime's command; the agent refuses
    /// any its runtime's template does not allow (`allow_args`).
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables set for the runtime; the agent refuses any
    /// its runtime's template does not allow (`allow_env`).
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
}

impl FunctionSpec {
    /// What `{model}` stands for: [`FunctionSpec::model`], else the name.
    pub fn model_or_name(&self) -> &str {
        self.model.as_deref().unwrap_or(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `room` is exactly what `admits` lets through: `room` more fit, one
    /// more does not (unless the room is unbounded).
    fn room_agrees_with_admits(limit: Quota, used: Quota, each: Quota) {
        let k = limit.room(&used, &each);
        let times = |n: u32| Quota {
            compute_milli: each.compute_milli.saturating_mul(u64::from(n)),
            memory_mib: each.memory_mib.saturating_mul(u64::from(n)),
            instances: each.instances.saturating_mul(n),
        };
        if k > 0 {
            assert!(
                limit.admits(&used, &times(k)).is_ok(),
                "{limit:?} {used:?} {each:?} {k}"
            );
        }
        if k < u32::MAX {
            assert!(
                limit.admits(&used, &times(k + 1)).is_err(),
                "{limit:?} {used:?} {each:?} {k}"
            );
        }
    }

    #[test]
    fn quota_room_counts_the_instances_that_still_fit() {
        let q = |compute_milli, memory_mib, instances| Quota {
            compute_milli,
            memory_mib,
            instances,
        };
        let limit = q(2_000, 16_384, 8);
        // Compute limits first: 1750 / 250 = 7.
        assert_eq!(limit.room(&q(250, 1_024, 1), &q(250, 1_024, 1)), 7);
        // Memory: 15360 / 4096 = 3.
        assert_eq!(limit.room(&q(250, 1_024, 1), &q(100, 4_096, 1)), 3);
        // Instances: 8 − 7 = 1.
        assert_eq!(limit.room(&q(700, 7_000, 7), &q(10, 10, 1)), 1);
        // Already past a limit: none, not a wrapped count.
        assert_eq!(limit.room(&q(3_000, 0, 0), &q(1, 1, 1)), 0);
        // A zero quota has no room.
        assert_eq!(Quota::default().room(&Quota::default(), &q(1, 1, 1)), 0);
        // Nothing asked in any dimension: unbounded.
        assert_eq!(limit.room(&q(0, 0, 0), &q(0, 0, 0)), u32::MAX);
        for (l, u, e) in [
            (limit, q(250, 1_024, 1), q(250, 1_024, 1)),
            (limit, q(3_000, 0, 0), q(1, 1, 1)),
            (q(u64::MAX, u64::MAX, u32::MAX), q(0, 0, 0), q(1, 1, 1)),
            (
                q(u64::MAX, u64::MAX, u32::MAX),
                q(u64::MAX, 0, 0),
                q(0, 0, 1),
            ),
        ] {
            room_agrees_with_admits(l, u, e);
        }
    }

    proptest::proptest! {
        #[test]
        fn quota_room_matches_admits(
            limit in (0u64..10_000, 0u64..100_000, 0u32..64),
            used in (0u64..12_000, 0u64..120_000, 0u32..70),
            each in (0u64..2_000, 0u64..20_000, 0u32..2),
        ) {
            let q = |(c, m, i): (u64, u64, u32)| Quota { compute_milli: c, memory_mib: m, instances: i };
            room_agrees_with_admits(q(limit), q(used), q(each));
        }
    }

    #[test]
    fn enums_round_trip_their_names() {
        for t in Tier::ALL {
            assert_eq!(t.as_str().parse::<Tier>().unwrap(), t);
        }
        assert_eq!("edge".parse::<PoolKind>().unwrap(), PoolKind::Edge);
        assert_eq!(
            "edge:hk-1".parse::<PoolPreference>().unwrap(),
            PoolPreference::Edge("hk-1".into())
        );
        assert_eq!("tf-serving".parse::<Runtime>().unwrap(), Runtime::TfServing);
    }

    #[test]
    fn pool_preferences_keep_their_old_strings_and_round_trip_the_strict_ones() {
        // Old strings (in every log and snapshot written so far) parse to
        // the old variants.
        for (s, p) in [
            ("edge:hk-1", PoolPreference::Edge("hk-1".into())),
            ("center", PoolPreference::Center),
            ("any", PoolPreference::Any),
        ] {
            assert_eq!(s.parse::<PoolPreference>().unwrap(), p);
            assert!(!p.is_strict());
        }
        let strict = [
            ("strict:edge:hk-1", PoolPreference::EdgeOnly("hk-1".into())),
            ("strict:center", PoolPreference::CenterOnly),
        ];
        for (s, p) in &strict {
            assert_eq!(s.parse::<PoolPreference>().unwrap(), *p);
            assert_eq!(p.to_string(), *s);
            assert!(p.is_strict());
            assert_eq!(p.preferred().strict(), Ok(p.clone()));
        }
        for bad in [
            "strict:any",
            "strict:",
            "strict:edge:",
            "strict:strict:center",
        ] {
            assert!(bad.parse::<PoolPreference>().is_err(), "{bad}");
        }
        assert_eq!(PoolPreference::Any.strict(), Err(ANY_NAMES_NO_POOL));
        let config = bincode::config::standard();
        let all = [
            PoolPreference::Edge("hk-1".into()),
            PoolPreference::Center,
            PoolPreference::Any,
            PoolPreference::EdgeOnly("hk-1".into()),
            PoolPreference::CenterOnly,
        ];
        for p in all {
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{p}\""));
            assert_eq!(serde_json::from_str::<PoolPreference>(&json).unwrap(), p);
            let bytes = bincode::serde::encode_to_vec(&p, config).unwrap();
            // The bytes are the string's: what old logs hold for old variants.
            let as_string = bincode::serde::encode_to_vec(p.to_string(), config).unwrap();
            assert_eq!(bytes, as_string);
            let (back, _): (PoolPreference, usize) =
                bincode::serde::decode_from_slice(&bytes, config).unwrap();
            assert_eq!(back, p);
        }
    }

    #[test]
    fn strict_pools_allow_only_their_pools() {
        let edge = PoolPreference::EdgeOnly("a".into());
        assert!(edge.allows("a", PoolKind::Edge));
        assert!(!edge.allows("b", PoolKind::Edge));
        assert!(!edge.allows("a", PoolKind::Center));
        assert!(PoolPreference::CenterOnly.allows("c", PoolKind::Center));
        assert!(!PoolPreference::CenterOnly.allows("a", PoolKind::Edge));
        for p in [
            PoolPreference::Edge("a".into()),
            PoolPreference::Center,
            PoolPreference::Any,
        ] {
            assert!(p.allows("b", PoolKind::Edge) && p.allows("c", PoolKind::Center));
        }
        assert_eq!(edge.edge_pool(), Some("a"));
        assert_eq!(PoolPreference::Edge("a".into()).edge_pool(), Some("a"));
        assert_eq!(PoolPreference::CenterOnly.edge_pool(), None);
    }

    #[test]
    fn bad_enum_names_say_what_is_accepted() {
        let e = "gold".parse::<Tier>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown tier \"gold\" (expected one of: exclusive, guaranteed, burstable, oversubscribed)"
        );
        assert!("edge:".parse::<PoolPreference>().is_err());
    }

    #[test]
    fn latency_grows_below_saturation_only() {
        let p = LatencyProfile {
            full_gpu_us: 100_000,
            saturation_milli: 500,
        };
        assert_eq!(p.service_us(1000), 100_000);
        assert_eq!(p.service_us(500), 100_000);
        assert_eq!(p.service_us(250), 200_000);
        assert_eq!(p.service_us(0), 50_000_000);
    }

    #[test]
    fn quota_names_the_dimension_that_runs_out() {
        let q = Quota {
            compute_milli: 1000,
            memory_mib: 1024,
            instances: 2,
        };
        let used = Quota {
            compute_milli: 500,
            memory_mib: 512,
            instances: 1,
        };
        let small = Quota {
            compute_milli: 500,
            memory_mib: 512,
            instances: 1,
        };
        assert_eq!(q.admits(&used, &small), Ok(()));
        let big = Quota {
            memory_mib: 513,
            ..small
        };
        assert_eq!(q.admits(&used, &big), Err(QuotaDimension::Memory));
    }

    #[test]
    fn a_sum_past_u64_is_past_every_quota() {
        // The reported bypass: 12 GiB held, u64::MAX more asked, 16 GiB quota.
        let q = Quota {
            compute_milli: 4000,
            memory_mib: 16_384,
            instances: 8,
        };
        let used = Quota {
            compute_milli: 400,
            memory_mib: 12_288,
            instances: 1,
        };
        let huge = Quota {
            compute_milli: 400,
            memory_mib: u64::MAX,
            instances: 1,
        };
        assert_eq!(q.admits(&used, &huge), Err(QuotaDimension::Memory));
        let wide = Quota {
            compute_milli: u64::MAX,
            ..huge
        };
        assert_eq!(q.admits(&used, &wide), Err(QuotaDimension::Compute));
        let unlimited = Quota {
            compute_milli: u64::MAX,
            memory_mib: u64::MAX,
            instances: u32::MAX,
        };
        let many = Quota {
            compute_milli: 0,
            memory_mib: 0,
            instances: u32::MAX,
        };
        assert_eq!(
            unlimited.admits(&used, &many),
            Err(QuotaDimension::Instances)
        );
        assert_eq!(used.saturating_add(&huge).memory_mib, u64::MAX);
        assert_eq!(used.saturating_sub(&huge).memory_mib, 0);
        assert_eq!(used.saturating_add(&used).memory_mib, 24_576);
    }

    #[test]
    fn service_time_saturates_instead_of_wrapping() {
        let p = LatencyProfile {
            full_gpu_us: u64::MAX,
            saturation_milli: 1000,
        };
        assert_eq!(p.service_us(1), u64::MAX);
    }
}
