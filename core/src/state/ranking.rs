//! How the planner ranks the candidates that fit: a small trait and the
//! region's rankings, best fit, FGD and gshare, the last two on the trace
//! simulator's own measures (`placement::frag`: FGD's fragmentation and
//! sigmoid buckets, gshare's hole quality), GPU by GPU. Which one the
//! region uses is its topology's `[placement] policy` ([`RegionRanking`]).

use super::fit::{Demand, GpuCapacity, GpuLoad, NodeLoad, SharingCaps};
use super::region_state::RegionState;
use crate::model::{Mib, MilliGpu, RegionPolicy, Tier, WHOLE_GPU};
use crate::placement::{fgd_bucket, FragModel, HoleQuality};
use std::collections::BTreeMap;

/// Ranks feasible candidates; lower scores win.
///
/// The planner only asks for scores of candidates that already fit; a
/// placement policy from `placement/` can be plugged in here.
pub trait Ranking {
    /// The ranking's name (for logs and metrics).
    fn name(&self) -> &'static str;

    /// Score of adding `demand` to a GPU of `capacity` loaded with `before`.
    fn score_slice(&self, capacity: &GpuCapacity, before: &GpuLoad, demand: &Demand) -> i64;

    /// Score of an exclusive instance taking the empty GPUs `taken` of
    /// `node`. By default: the node's empty GPUs left over (best fit, so
    /// whole free nodes stay whole).
    fn score_whole(&self, node: &NodeLoad, taken: &[u32]) -> i64 {
        let empty = node.gpus.iter().filter(|g| g.load.instances == 0).count();
        empty.saturating_sub(taken.len()) as i64
    }
}

/// Unreserved compute plus unreserved memory after the placement, each in
/// per-mille of the GPU (0..=2000): smaller is tighter.
fn leftover(capacity: &GpuCapacity, after: &GpuLoad) -> i64 {
    let mem = per_mille(after.free_memory(capacity), capacity.memory_mib);
    i64::from(after.free_compute()).saturating_add(mem)
}

/// `part` in per-mille of `whole` (0 for an empty whole), saturating.
fn per_mille(part: Mib, whole: Mib) -> i64 {
    let pm = part.saturating_mul(1000).checked_div(whole).unwrap_or(0);
    i64::try_from(pm).unwrap_or(i64::MAX)
}

/// Oversubscribed instances go where their weights most likely stay
/// resident (least swap need), then where fewer others are mapped.
fn oversubscribed_score(capacity: &GpuCapacity, after: &GpuLoad) -> i64 {
    let swap = per_mille(after.swap_need(capacity), capacity.memory_mib);
    swap.saturating_mul(4096)
        .saturating_add(i64::from(after.oversub_count))
}

/// Best fit: the GPU left with the least unreserved compute and memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct BestFit;

impl Ranking for BestFit {
    fn name(&self) -> &'static str {
        "bestfit"
    }

    fn score_slice(&self, capacity: &GpuCapacity, before: &GpuLoad, demand: &Demand) -> i64 {
        let after = before.with(demand);
        if demand.tier == Tier::Oversubscribed {
            return oversubscribed_score(capacity, &after);
        }
        leftover(capacity, &after)
    }
}

/// The deployed GPU-sharing functions' shapes `(compute, memory,
/// weight)`, each weighted by one plus its instances: the region's typical
/// pods (the trace simulator takes them from the pod list).
///
/// Guaranteed functions only: their compute is reserved, so it is what a
/// hole of free compute must hold. A burstable function's compute is a
/// claim on the overcommitted budget, not on the reserved compute the
/// measures read, so a burstable shape would count holes it never needs.
/// Where no guaranteed function is deployed the burstable shapes stand in
/// (their memory still fragments).
pub fn deployed_shapes(state: &RegionState) -> Vec<(MilliGpu, Mib, u64)> {
    let shapes_of = |tier: Tier| {
        let mut w: BTreeMap<(MilliGpu, Mib), u64> = BTreeMap::new();
        for f in state.functions() {
            let s = &f.spec;
            if s.tier == tier {
                let n = w.entry((s.compute_milli, s.memory_mib)).or_default();
                *n = n
                    .saturating_add(1)
                    .saturating_add(u64::from(state.instance_count(&s.tenant, &s.name)));
            }
        }
        w
    };
    let mut w = shapes_of(Tier::Guaranteed);
    if w.is_empty() {
        w = shapes_of(Tier::Burstable);
    }
    w.into_iter().map(|((c, m), n)| (c, m, n)).collect()
}

/// How many typical shapes the region's FGD keeps (the most popular of
/// FGD's 95 %): each plan scores every class of GPUs against each.
pub const MAX_SHAPES: usize = 16;

/// `milli` as the placement measures' milli-GPU of one GPU (at most 1000).
fn gpu_milli(milli: MilliGpu) -> u16 {
    u16::try_from(milli.min(WHOLE_GPU)).unwrap_or(1000)
}

/// A GPU's free compute as the placement measures read it: what one more
/// guaranteed slice may still take, the unreserved compute unless the
/// burstable slices already spent more of the overcommit budget
/// (`caps.burst_compute_milli`, which guaranteed and burstable compute
/// share; see `fit`).
fn free_milli(caps: &SharingCaps, load: &GpuLoad) -> u16 {
    let committed = load.reserved_compute.saturating_add(load.burst_compute);
    let budget = caps
        .burst_compute_milli
        .max(WHOLE_GPU)
        .saturating_sub(committed);
    gpu_milli(load.free_compute().min(budget))
}

/// FGD (the FGD paper's, the trace simulator's `fgd`): the GPU whose
/// expected fragmentation, against the typical pods, grows least, scored
/// in FGD's integer sigmoid buckets ([`fgd_bucket`]); equal scores go to
/// the earliest GPU. The typical pods are the deployed functions' shapes
/// ([`deployed_shapes`]), with their GPU memory: a shape that does not fit
/// a GPU's free memory cannot use its free compute either.
#[derive(Debug, Clone, Default)]
pub struct FgdRanking {
    model: FragModel,
    caps: SharingCaps,
}

impl FgdRanking {
    /// FGD over the state's deployed shapes.
    pub fn from_state(state: &RegionState) -> Self {
        Self::from_shapes(deployed_shapes(state)).with_caps(*state.caps())
    }

    /// FGD over shapes given as `(compute, memory, weight)`, under the
    /// default caps.
    pub fn from_shapes(shapes: impl IntoIterator<Item = (MilliGpu, Mib, u64)>) -> Self {
        let shapes = shapes
            .into_iter()
            .filter(|s| s.2 > 0)
            .map(|(c, m, w)| (u16::try_from(c.min(WHOLE_GPU)).unwrap_or(1000), m, w));
        Self {
            model: FragModel::from_shapes(shapes, MAX_SHAPES),
            caps: SharingCaps::default(),
        }
    }

    /// The same ranking under the region's caps `caps`.
    pub fn with_caps(mut self, caps: SharingCaps) -> Self {
        self.caps = caps;
        self
    }

    /// The typical pods.
    pub fn model(&self) -> &FragModel {
        &self.model
    }

    /// Expected fragmented milli-GPU of a GPU of `capacity` under `load`.
    pub fn fragmentation(&self, capacity: &GpuCapacity, load: &GpuLoad) -> f64 {
        self.model
            .gpu_frag(free_milli(&self.caps, load), load.free_memory(capacity))
    }

    /// FGD's bucket (0..=100, higher is better) of `demand` on a GPU.
    fn bucket(&self, capacity: &GpuCapacity, before: &GpuLoad, after: &GpuLoad) -> i64 {
        fgd_bucket(
            self.fragmentation(capacity, before),
            self.fragmentation(capacity, after),
        )
    }
}

impl Ranking for FgdRanking {
    fn name(&self) -> &'static str {
        "fgd"
    }

    fn score_slice(&self, capacity: &GpuCapacity, before: &GpuLoad, demand: &Demand) -> i64 {
        let after = before.with(demand);
        if demand.tier == Tier::Oversubscribed {
            return oversubscribed_score(capacity, &after);
        }
        100i64.saturating_sub(self.bucket(capacity, before, &after))
    }
}

/// gshare (the trace simulator's `gshare` on a region's functions, which
/// ask for no CPU and any GPU model): the GPU where the slice spoils the
/// least hole quality ([`HoleQuality`]: what the hole left can still be
/// filled with, in the typical pods' common sizes), then FGD's bucket on
/// that GPU; equal scores go to the earliest GPU.
#[derive(Debug, Clone)]
pub struct GshareRanking {
    fgd: FgdRanking,
    holes: HoleQuality,
}

impl GshareRanking {
    /// gshare over the state's deployed shapes.
    pub fn from_state(state: &RegionState) -> Self {
        Self::from_fgd(FgdRanking::from_state(state))
    }

    /// gshare over shapes given as `(compute, memory, weight)`.
    pub fn from_shapes(shapes: impl IntoIterator<Item = (MilliGpu, Mib, u64)>) -> Self {
        Self::from_fgd(FgdRanking::from_shapes(shapes))
    }

    /// The same ranking under the region's caps `caps`.
    pub fn with_caps(self, caps: SharingCaps) -> Self {
        Self::from_fgd(self.fgd.with_caps(caps))
    }

    fn from_fgd(fgd: FgdRanking) -> Self {
        let holes = HoleQuality::new(fgd.model());
        Self { fgd, holes }
    }
}

impl Ranking for GshareRanking {
    fn name(&self) -> &'static str {
        "gshare"
    }

    fn score_slice(&self, capacity: &GpuCapacity, before: &GpuLoad, demand: &Demand) -> i64 {
        let after = before.with(demand);
        if demand.tier == Tier::Oversubscribed {
            return oversubscribed_score(capacity, &after);
        }
        // The loss between the loads, not `HoleQuality::loss(free, compute)`:
        // a burstable slice reserves no compute, so its hole shrinks only
        // where it spends the overcommit budget below the unreserved compute.
        let caps = &self.fgd.caps;
        let loss = i64::from(self.holes.dead(free_milli(caps, &after)))
            .saturating_sub(i64::from(self.holes.dead(free_milli(caps, before))));
        // (loss, bucket) in lexicographic order: the bucket is 0..=100.
        loss.saturating_mul(128)
            .saturating_add(100i64.saturating_sub(self.fgd.bucket(capacity, before, &after)))
    }
}

/// The ranking the region's policy names ([`RegionState::placement_policy`]).
#[derive(Debug, Clone)]
pub enum RegionRanking {
    /// `bestfit`.
    BestFit(BestFit),
    /// `fgd`.
    Fgd(FgdRanking),
    /// `gshare`.
    Gshare(GshareRanking),
}

impl RegionRanking {
    /// The region's ranking over its deployed shapes.
    pub fn from_state(state: &RegionState) -> Self {
        match state.placement_policy() {
            RegionPolicy::BestFit => RegionRanking::BestFit(BestFit),
            RegionPolicy::Fgd => RegionRanking::Fgd(FgdRanking::from_state(state)),
            RegionPolicy::Gshare => RegionRanking::Gshare(GshareRanking::from_state(state)),
        }
    }

    fn inner(&self) -> &dyn Ranking {
        match self {
            RegionRanking::BestFit(r) => r,
            RegionRanking::Fgd(r) => r,
            RegionRanking::Gshare(r) => r,
        }
    }
}

impl Ranking for RegionRanking {
    fn name(&self) -> &'static str {
        self.inner().name()
    }

    fn score_slice(&self, capacity: &GpuCapacity, before: &GpuLoad, demand: &Demand) -> i64 {
        self.inner().score_slice(capacity, before, demand)
    }

    fn score_whole(&self, node: &NodeLoad, taken: &[u32]) -> i64 {
        self.inner().score_whole(node, taken)
    }
}
