//! The one capacity rule: does a set of slices fit on a node's GPUs?
//!
//! The leader's planner calls [`fit`] before it proposes a placement and the
//! state machine calls it again when it applies the proposal (Nomad's
//! `AllocsFit` in `plan_apply.go`), so two leaders planning on stale views
//! can never over-allocate a GPU.
//!
//! What each tier holds on a GPU of `M` MiB (compute is always 1000 milli):
//!
//! ```text
//!   tier            compute                         GPU memory (resident)      other
//!   exclusive       whole GPU (1000, reserved)      whole GPU (M)              GPU must be empty; nothing joins it
//!   guaranteed      reserved:  Σ reserved ≤ 1000    reserved: Σ resident ≤ M
//!   burstable       committed: Σ reserved+burst     reserved: Σ resident ≤ M
//!                              ≤ burst_compute_milli
//!   oversubscribed  not reserved                    not resident (swappable)   count ≤ oversubscribed_per_gpu;
//!                                                                              each ≤ M − resident;
//!                                                                              node: Σ_g max(0, oversub_g − (M_g − resident_g)) ≤ swap_mib
//! ```
//!
//! The node rule says the weights of every oversubscribed instance are, at
//! any moment, either in the GPU memory nobody reserved or in the node's
//! host swap space; so the edge can always swap them out somewhere.
//!
//! Every sum here is checked: a demand whose sum would overflow is refused
//! naming the dimension (a sum past `u64` is past every GPU), never
//! wrapped into a small number that fits.
//!
//! [`fit`] checks the GPUs a demand touches and the node's swap need; like
//! Nomad's `AllocsFit` it takes the rest of the node as valid (apply never
//! lets it be otherwise; [`check_node`] checks a whole node from scratch).

use crate::model::{Mib, MilliGpu, Tier, WHOLE_GPU};
use serde::{Deserialize, Serialize};
use std::fmt;

use super::instance::InstanceId;

/// The region's oversubscription caps (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharingCaps {
    /// Most compute that guaranteed plus burstable instances may claim on one
    /// GPU, in milli-GPU (≥ 1000; 2000 = burstable compute overcommitted up
    /// to twice the GPU).
    pub burst_compute_milli: MilliGpu,
    /// Most oversubscribed instances mapped onto one GPU.
    pub oversubscribed_per_gpu: u32,
}

impl Default for SharingCaps {
    fn default() -> Self {
        Self {
            burst_compute_milli: 2 * WHOLE_GPU,
            oversubscribed_per_gpu: 8,
        }
    }
}

/// What one slice of an instance asks of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Demand {
    /// The instance's tier.
    pub tier: Tier,
    /// Compute of the slice, milli-GPU.
    pub compute_milli: MilliGpu,
    /// GPU memory of the slice, MiB.
    pub memory_mib: Mib,
}

/// What a GPU holds, summed over the instances placed on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct GpuLoad {
    /// Held whole by an exclusive instance.
    pub exclusive: bool,
    /// Reserved compute (exclusive and guaranteed), milli-GPU.
    pub reserved_compute: u32,
    /// Compute of burstable instances (may be overcommitted), milli-GPU.
    pub burst_compute: u32,
    /// Reserved resident memory (exclusive, guaranteed, burstable), MiB.
    pub resident_mib: Mib,
    /// Memory of oversubscribed instances (resident or swapped out), MiB.
    pub oversub_mib: Mib,
    /// The largest oversubscribed instance, MiB.
    pub oversub_largest_mib: Mib,
    /// Number of oversubscribed instances.
    pub oversub_count: u32,
    /// Number of instances of any tier.
    pub instances: u32,
}

impl GpuLoad {
    /// A load past every capacity (what [`GpuLoad::with`] gives when a sum
    /// would overflow): every check of [`check_gpu`] refuses it.
    pub const SATURATED: GpuLoad = GpuLoad {
        exclusive: true,
        reserved_compute: u32::MAX,
        burst_compute: u32::MAX,
        resident_mib: Mib::MAX,
        oversub_mib: Mib::MAX,
        oversub_largest_mib: Mib::MAX,
        oversub_count: u32::MAX,
        instances: u32::MAX,
    };

    /// The load with `d` added, or the dimension whose sum would overflow
    /// (the instance count counts as compute).
    pub fn checked_with(&self, d: &Demand) -> Result<GpuLoad, GpuDimension> {
        let add32 = |a: u32, b: u32, dim| a.checked_add(b).ok_or(dim);
        let add64 = |a: Mib, b: Mib, dim| a.checked_add(b).ok_or(dim);
        let mut l = *self;
        l.instances = add32(l.instances, 1, GpuDimension::Compute)?;
        match d.tier {
            Tier::Exclusive | Tier::Guaranteed => {
                l.exclusive |= d.tier == Tier::Exclusive;
                l.reserved_compute =
                    add32(l.reserved_compute, d.compute_milli, GpuDimension::Compute)?;
                l.resident_mib = add64(l.resident_mib, d.memory_mib, GpuDimension::Memory)?;
            }
            Tier::Burstable => {
                l.burst_compute =
                    add32(l.burst_compute, d.compute_milli, GpuDimension::BurstCompute)?;
                l.resident_mib = add64(l.resident_mib, d.memory_mib, GpuDimension::Memory)?;
            }
            Tier::Oversubscribed => {
                l.oversub_mib = add64(l.oversub_mib, d.memory_mib, GpuDimension::SwapSpace)?;
                l.oversub_largest_mib = l.oversub_largest_mib.max(d.memory_mib);
                l.oversub_count = add32(l.oversub_count, 1, GpuDimension::OversubscribedSlots)?;
            }
        }
        Ok(l)
    }

    /// The load with `d` added, for a demand [`fit`] has admitted; a sum
    /// that would overflow gives [`GpuLoad::SATURATED`] instead of wrapping
    /// (so it can never pass a check).
    pub fn with(&self, d: &Demand) -> GpuLoad {
        self.checked_with(d).unwrap_or(GpuLoad::SATURATED)
    }

    /// The load of a GPU holding exactly `demands`.
    pub fn of<'a>(demands: impl IntoIterator<Item = &'a Demand>) -> GpuLoad {
        demands
            .into_iter()
            .fold(GpuLoad::default(), |l, d| l.with(d))
    }

    /// Compute nobody reserved, milli-GPU.
    pub fn free_compute(&self) -> MilliGpu {
        WHOLE_GPU.saturating_sub(self.reserved_compute)
    }

    /// GPU memory nobody reserved, MiB.
    pub fn free_memory(&self, capacity: &GpuCapacity) -> Mib {
        capacity.memory_mib.saturating_sub(self.resident_mib)
    }

    /// Oversubscribed memory that cannot sit in the free GPU memory and so
    /// needs host swap space, MiB.
    pub fn swap_need(&self, capacity: &GpuCapacity) -> Mib {
        self.oversub_mib.saturating_sub(self.free_memory(capacity))
    }
}

/// The size of one GPU (its compute is always [`WHOLE_GPU`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuCapacity {
    /// GPU memory, MiB.
    pub memory_mib: Mib,
    /// `false` for a GPU of the topology its node's agent did not find
    /// (registered with `allow_fewer_gpus`): nothing may be placed on it.
    pub available: bool,
}

/// One GPU of a node: its size, its load and the instances behind the load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSlot {
    /// The GPU's size.
    pub capacity: GpuCapacity,
    /// What is placed on it.
    pub load: GpuLoad,
    /// The instances placed on it, in id order.
    pub instances: Vec<InstanceId>,
}

/// One node's GPUs as [`fit`] sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLoad {
    /// Host memory usable for swapped-out weights, MiB.
    pub swap_mib: Mib,
    /// The GPUs, by index.
    pub gpus: Vec<GpuSlot>,
    /// [`NodeLoad::swap_need`] as of the last [`NodeLoad::refresh`].
    pub swap_need_mib: Mib,
}

impl NodeLoad {
    /// Host swap space the node's oversubscribed instances need, MiB
    /// (saturating: a need past `u64` is past every swap space).
    pub fn swap_need(&self) -> Mib {
        self.gpus.iter().fold(0, |sum: Mib, g| {
            sum.saturating_add(g.load.swap_need(&g.capacity))
        })
    }

    /// Recomputes the cached [`NodeLoad::swap_need_mib`] after GPU loads changed.
    pub fn refresh(&mut self) {
        self.swap_need_mib = self.swap_need();
    }
}

/// The GPU resource that ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuDimension {
    /// The node has no GPU with that index.
    NoSuchGpu,
    /// The GPU is held whole by an exclusive instance.
    HeldExclusive,
    /// An exclusive instance needs an empty GPU.
    NotEmpty,
    /// Reserved compute would pass the whole GPU.
    Compute,
    /// Guaranteed plus burstable compute would pass the burst cap.
    BurstCompute,
    /// Reserved GPU memory would pass the GPU's memory.
    Memory,
    /// The GPU already carries its most oversubscribed instances.
    OversubscribedSlots,
    /// Oversubscribed weights would not fit in free GPU memory plus host swap.
    SwapSpace,
    /// The node's agent registered without this GPU (it is unavailable).
    Unavailable,
}

impl GpuDimension {
    /// Every dimension, in declaration order (`d as usize` indexes it).
    pub const ALL: [GpuDimension; 9] = [
        GpuDimension::NoSuchGpu,
        GpuDimension::HeldExclusive,
        GpuDimension::NotEmpty,
        GpuDimension::Compute,
        GpuDimension::BurstCompute,
        GpuDimension::Memory,
        GpuDimension::OversubscribedSlots,
        GpuDimension::SwapSpace,
        GpuDimension::Unavailable,
    ];

    /// The stable name used in errors and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuDimension::NoSuchGpu => "no-such-gpu",
            GpuDimension::HeldExclusive => "held-exclusive",
            GpuDimension::NotEmpty => "not-empty",
            GpuDimension::Compute => "compute",
            GpuDimension::BurstCompute => "burst-compute",
            GpuDimension::Memory => "memory",
            GpuDimension::OversubscribedSlots => "oversubscribed-slots",
            GpuDimension::SwapSpace => "swap-space",
            GpuDimension::Unavailable => "unavailable",
        }
    }
}

impl fmt::Display for GpuDimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why slices do not fit: the GPU (index on its node) and the dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FitFailure {
    /// Index of the GPU on its node.
    pub gpu_index: u32,
    /// What ran out there.
    pub dimension: GpuDimension,
}

/// Whether a GPU's load obeys the tier rules (module docs), without the
/// node-wide swap rule.
pub fn check_gpu(
    caps: &SharingCaps,
    capacity: &GpuCapacity,
    load: &GpuLoad,
) -> Result<(), GpuDimension> {
    if !capacity.available && load.instances > 0 {
        return Err(GpuDimension::Unavailable);
    }
    if load.exclusive && load.instances > 1 {
        return Err(GpuDimension::HeldExclusive);
    }
    if load.reserved_compute > WHOLE_GPU {
        return Err(GpuDimension::Compute);
    }
    let committed = load.reserved_compute.checked_add(load.burst_compute);
    if committed.is_none_or(|c| c > caps.burst_compute_milli.max(WHOLE_GPU)) {
        return Err(GpuDimension::BurstCompute);
    }
    if load.resident_mib > capacity.memory_mib {
        return Err(GpuDimension::Memory);
    }
    if load.oversub_count > caps.oversubscribed_per_gpu {
        return Err(GpuDimension::OversubscribedSlots);
    }
    if load.oversub_largest_mib > load.free_memory(capacity) {
        return Err(GpuDimension::Memory);
    }
    Ok(())
}

/// Whether a whole node obeys the rules: every GPU, and the swap rule.
/// The cached swap need must equal a recomputation.
pub fn check_node(caps: &SharingCaps, node: &NodeLoad) -> Result<(), FitFailure> {
    for (i, g) in node.gpus.iter().enumerate() {
        check_gpu(caps, &g.capacity, &g.load).map_err(|dimension| FitFailure {
            gpu_index: i as u32,
            dimension,
        })?;
    }
    if node.swap_need() > node.swap_mib || node.swap_need() != node.swap_need_mib {
        let worst = (0..node.gpus.len())
            .max_by_key(|&i| node.gpus[i].load.swap_need(&node.gpus[i].capacity))
            .unwrap_or(0);
        return Err(FitFailure {
            gpu_index: worst as u32,
            dimension: GpuDimension::SwapSpace,
        });
    }
    Ok(())
}

/// Whether `demands` — `(GPU index on the node, demand)` pairs, one per
/// slice of one instance — fit on `node` as it is now loaded. Names the
/// first GPU and dimension that does not.
///
/// This is the function both the planner and the state machine's apply use.
pub fn fit(
    caps: &SharingCaps,
    node: &NodeLoad,
    demands: &[(u32, Demand)],
) -> Result<(), FitFailure> {
    // Loads after the demands, for the GPUs they touch.
    let mut touched: Vec<(u32, GpuLoad)> = Vec::new();
    let single;
    let after: &[(u32, GpuLoad)] = match demands {
        [(index, d)] => {
            single = [(*index, add_checked(caps, node, *index, None, d)?)];
            &single
        }
        _ => {
            touched.reserve(demands.len());
            for (index, d) in demands {
                let pos = touched.iter().position(|(i, _)| i == index);
                let load = add_checked(caps, node, *index, pos.map(|p| touched[p].1), d)?;
                match pos {
                    Some(p) => touched[p].1 = load,
                    None => touched.push((*index, load)),
                }
            }
            &touched
        }
    };
    // The node's swap need changes only on the touched GPUs. (Like
    // Nomad's AllocsFit, this trusts that the node obeyed the rules before:
    // apply never lets it do otherwise.)
    let mut need = node.swap_need_mib;
    let mut grew = false;
    for (i, load) in after {
        let g = &node.gpus[*i as usize];
        let (old, new) = (g.load.swap_need(&g.capacity), load.swap_need(&g.capacity));
        grew |= new > old;
        // `need` includes `old`; past `u64` it is past every swap space.
        need = need.saturating_sub(old).saturating_add(new);
    }
    if grew && need > node.swap_mib {
        return Err(FitFailure {
            gpu_index: demands.first().map_or(0, |(i, _)| *i),
            dimension: GpuDimension::SwapSpace,
        });
    }
    Ok(())
}

/// GPU `index`'s load (`before`, or its current one) plus `d`, if the
/// tier rules allow it.
fn add_checked(
    caps: &SharingCaps,
    node: &NodeLoad,
    index: u32,
    before: Option<GpuLoad>,
    d: &Demand,
) -> Result<GpuLoad, FitFailure> {
    let fail = |dimension| FitFailure {
        gpu_index: index,
        dimension,
    };
    let slot = node
        .gpus
        .get(index as usize)
        .ok_or(fail(GpuDimension::NoSuchGpu))?;
    fit_gpu(caps, &slot.capacity, &before.unwrap_or(slot.load), d).map_err(fail)
}

/// One GPU of `capacity` loaded with `before` plus `d`, if the tier rules
/// allow it: [`fit`]'s check of one GPU, without the node's swap rule
/// (which matters only if the GPU's swap need grows).
pub fn fit_gpu(
    caps: &SharingCaps,
    capacity: &GpuCapacity,
    before: &GpuLoad,
    d: &Demand,
) -> Result<GpuLoad, GpuDimension> {
    if before.exclusive {
        return Err(GpuDimension::HeldExclusive);
    }
    if d.tier == Tier::Exclusive && before.instances > 0 {
        return Err(GpuDimension::NotEmpty);
    }
    let load = before.checked_with(d)?;
    check_gpu(caps, capacity, &load)?;
    Ok(load)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(gpus: &[Mib], swap_mib: Mib) -> NodeLoad {
        NodeLoad {
            swap_mib,
            gpus: gpus
                .iter()
                .map(|&m| GpuSlot {
                    capacity: GpuCapacity {
                        memory_mib: m,
                        available: true,
                    },
                    load: GpuLoad::default(),
                    instances: Vec::new(),
                })
                .collect(),
            swap_need_mib: 0,
        }
    }

    fn put(n: &mut NodeLoad, i: usize, d: Demand) {
        n.gpus[i].load = n.gpus[i].load.with(&d);
        n.refresh();
    }

    fn d(tier: Tier, compute_milli: MilliGpu, memory_mib: Mib) -> Demand {
        Demand {
            tier,
            compute_milli,
            memory_mib,
        }
    }

    #[test]
    fn guaranteed_reserves_compute_and_memory() {
        let caps = SharingCaps::default();
        let mut n = node(&[16_000], 0);
        put(&mut n, 0, d(Tier::Guaranteed, 600, 8_000));
        assert_eq!(
            fit(&caps, &n, &[(0, d(Tier::Guaranteed, 400, 8_000))]),
            Ok(())
        );
        let e = fit(&caps, &n, &[(0, d(Tier::Guaranteed, 401, 1))]).unwrap_err();
        assert_eq!(e.dimension, GpuDimension::Compute);
        let e = fit(&caps, &n, &[(0, d(Tier::Guaranteed, 100, 8_001))]).unwrap_err();
        assert_eq!(e.dimension, GpuDimension::Memory);
    }

    #[test]
    fn burstable_overcommits_compute_up_to_the_cap_but_not_memory() {
        let caps = SharingCaps::default();
        let mut n = node(&[16_000], 0);
        put(&mut n, 0, d(Tier::Guaranteed, 1000, 1_000));
        put(&mut n, 0, d(Tier::Burstable, 900, 1_000));
        assert_eq!(
            fit(&caps, &n, &[(0, d(Tier::Burstable, 100, 1_000))]),
            Ok(())
        );
        let e = fit(&caps, &n, &[(0, d(Tier::Burstable, 101, 1_000))]).unwrap_err();
        assert_eq!(e.dimension, GpuDimension::BurstCompute);
        let e = fit(&caps, &n, &[(0, d(Tier::Burstable, 1, 14_001))]).unwrap_err();
        assert_eq!(e.dimension, GpuDimension::Memory);
    }

    #[test]
    fn exclusive_needs_empty_gpus_and_then_keeps_them() {
        let caps = SharingCaps::default();
        let mut n = node(&[16_000, 16_000], 0);
        put(&mut n, 1, d(Tier::Oversubscribed, 100, 1_000));
        let whole = d(Tier::Exclusive, 1000, 16_000);
        let e = fit(&caps, &n, &[(0, whole), (1, whole)]).unwrap_err();
        assert_eq!((e.gpu_index, e.dimension), (1, GpuDimension::NotEmpty));
        assert_eq!(fit(&caps, &n, &[(0, whole)]), Ok(()));
        put(&mut n, 0, whole);
        let e = fit(&caps, &n, &[(0, d(Tier::Oversubscribed, 1, 1))]).unwrap_err();
        assert_eq!(e.dimension, GpuDimension::HeldExclusive);
        // The same GPU twice in one instance is refused too.
        let n = node(&[16_000], 0);
        let e = fit(&caps, &n, &[(0, whole), (0, whole)]).unwrap_err();
        assert_eq!(e.dimension, GpuDimension::HeldExclusive);
    }

    #[test]
    fn oversubscribed_weights_live_in_free_gpu_memory_or_host_swap() {
        let caps = SharingCaps::default();
        let mut n = node(&[16_000, 16_000], 10_000);
        put(&mut n, 0, d(Tier::Guaranteed, 500, 10_000));
        // GPU 0 has 6_000 free: one 6_000 instance is resident-able.
        assert_eq!(
            fit(&caps, &n, &[(0, d(Tier::Oversubscribed, 100, 6_000))]),
            Ok(())
        );
        let e = fit(&caps, &n, &[(0, d(Tier::Oversubscribed, 100, 6_001))]).unwrap_err();
        assert_eq!(e.dimension, GpuDimension::Memory);
        for _ in 0..4 {
            put(&mut n, 0, d(Tier::Oversubscribed, 100, 4_000));
        }
        // 16_000 oversubscribed on GPU 0: 6_000 in the GPU, 10_000 in swap.
        assert_eq!(n.swap_need(), 10_000);
        let e = fit(&caps, &n, &[(0, d(Tier::Oversubscribed, 100, 1))]).unwrap_err();
        assert_eq!(e.dimension, GpuDimension::SwapSpace);
        // GPU 1's own free memory still takes oversubscribed weights.
        assert_eq!(
            fit(&caps, &n, &[(1, d(Tier::Oversubscribed, 100, 16_000))]),
            Ok(())
        );
        // Reserving memory on GPU 0 would push its oversubscribed weights to swap.
        let e = fit(&caps, &n, &[(0, d(Tier::Burstable, 100, 1))]).unwrap_err();
        assert_eq!(e.dimension, GpuDimension::SwapSpace);
        assert_eq!(check_node(&caps, &n), Ok(()));
    }

    #[test]
    fn oversubscribed_instances_per_gpu_are_capped() {
        let caps = SharingCaps {
            oversubscribed_per_gpu: 2,
            ..SharingCaps::default()
        };
        let mut n = node(&[16_000], 64_000);
        put(&mut n, 0, d(Tier::Oversubscribed, 10, 10));
        put(&mut n, 0, d(Tier::Oversubscribed, 10, 10));
        let e = fit(&caps, &n, &[(0, d(Tier::Oversubscribed, 10, 10))]).unwrap_err();
        assert_eq!(e.dimension, GpuDimension::OversubscribedSlots);
        let e = fit(&caps, &n, &[(3, d(Tier::Guaranteed, 10, 10))]).unwrap_err();
        assert_eq!(e.dimension, GpuDimension::NoSuchGpu);
    }
}
