//! How the planner ranks the candidates that fit: a small trait and two
//! rankings (best fit, and an FGD-flavoured fragmentation-aware one).
//! Placement policies from `placement/` can be plugged in behind the trait.

use super::fit::{Demand, GpuCapacity, GpuLoad, NodeLoad};
use super::region_state::RegionState;
use crate::model::{Mib, MilliGpu, Tier};
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

/// FGD-flavoured: minimise the growth of fragmentation, measured against
/// the shapes of the functions deployed in the region, then best fit.
///
/// A GPU's fragmentation for a shape `(c, m)` is its unreserved compute if
/// the shape no longer fits in its unreserved compute and memory, else 0;
/// the GPU's fragmentation is the average over shapes weighted by how many
/// functions and instances have each shape (the 16 most common).
#[derive(Debug, Clone, Default)]
pub struct FragmentationAware {
    shapes: Vec<(MilliGpu, Mib, u64)>,
    total_weight: u64,
}

/// How many function shapes [`FragmentationAware`] weighs.
pub const MAX_SHAPES: usize = 16;

impl FragmentationAware {
    /// Shapes from the region's deployed, GPU-sharing functions.
    pub fn from_state(state: &RegionState) -> Self {
        let mut w: BTreeMap<(MilliGpu, Mib), u64> = BTreeMap::new();
        for f in state.functions() {
            let s = &f.spec;
            if matches!(s.tier, Tier::Guaranteed | Tier::Burstable) {
                let n = w.entry((s.compute_milli, s.memory_mib)).or_default();
                *n = n
                    .saturating_add(1)
                    .saturating_add(u64::from(state.instance_count(&s.tenant, &s.name)));
            }
        }
        Self::from_shapes(w.into_iter().map(|((c, m), n)| (c, m, n)))
    }

    /// Shapes given directly as `(compute, memory, weight)`.
    pub fn from_shapes(shapes: impl IntoIterator<Item = (MilliGpu, Mib, u64)>) -> Self {
        let mut shapes: Vec<_> = shapes.into_iter().filter(|s| s.2 > 0).collect();
        shapes.sort_by(|a, b| b.2.cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
        shapes.truncate(MAX_SHAPES);
        let total_weight = shapes.iter().fold(0, |t: u64, s| t.saturating_add(s.2));
        Self {
            shapes,
            total_weight,
        }
    }

    /// Fragmentation of a GPU in milli-GPU (weighted average over shapes).
    pub fn fragmentation(&self, capacity: &GpuCapacity, load: &GpuLoad) -> i64 {
        if self.total_weight == 0 {
            return 0;
        }
        let fc = load.free_compute();
        let fm = load.free_memory(capacity);
        let stuck = self
            .shapes
            .iter()
            .filter(|(c, m, _)| *c > fc || *m > fm)
            .fold(0, |sum: u64, (_, _, w)| {
                sum.saturating_add(w.saturating_mul(u64::from(fc)))
            });
        let avg = stuck.checked_div(self.total_weight).unwrap_or(0);
        i64::try_from(avg).unwrap_or(i64::MAX)
    }
}

impl Ranking for FragmentationAware {
    fn name(&self) -> &'static str {
        "fragmentation-aware"
    }

    fn score_slice(&self, capacity: &GpuCapacity, before: &GpuLoad, demand: &Demand) -> i64 {
        let after = before.with(demand);
        if demand.tier == Tier::Oversubscribed {
            return oversubscribed_score(capacity, &after);
        }
        let grow = self
            .fragmentation(capacity, &after)
            .saturating_sub(self.fragmentation(capacity, before));
        grow.saturating_mul(4096)
            .saturating_add(leftover(capacity, &after))
    }
}
