//! The leader's planner: where one more instance of a function goes.
//!
//! Nomad's shape over a read-only view (`&RegionState`): feasibility with
//! the very [`fit`] that apply re-checks, then quota, then a rank behind the
//! small [`Ranking`] trait, and a record of why candidates were rejected
//! ([`PlanRejection`], after Nomad's `AllocMetric`).
//!
//! ```text
//!   pools in preference order:  edge:<p> → p, other edge pools, center pools
//!                               center   → center pools, edge pools
//!                               any      → all pools together
//!   for each group, for each node, for each GPU (or set of empty GPUs):
//!       fit ──no──▶ count the dimension, remember the furthest failure
//!        │yes
//!       quota ──no──▶ remember the pool kind and dimension
//!        │yes
//!       score (Ranking; lower wins, ties: earlier node and GPU)
//!   first group with a winner ─▶ Proposal ─▶ DomainCommand::InstancePlace
//!   none anywhere ─▶ PlanRejection { reason, counts }
//! ```
//!
//! The reason of a rejection names what ran out on the best candidate:
//! the quota if some GPU had room but the tenant's quota of that pool kind
//! did not; else the GPU whose failure came latest in fit's order of checks
//! (the one nearest to fitting; ties: earliest in preference order).

use super::command::DomainCommand;
use super::fit::{fit, Demand, FitFailure, GpuCapacity, GpuDimension, GpuLoad, NodeLoad};
use super::region_state::RegionState;
use crate::model::{
    FunctionSpec, GpuId, Mib, MilliGpu, PoolKind, PoolPreference, Quota, QuotaDimension, Slice,
    TenantId, Tier, WHOLE_GPU,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

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
        (empty - taken.len()) as i64
    }
}

/// Unreserved compute plus unreserved memory after the placement, each in
/// per-mille of the GPU (0..=2000): smaller is tighter.
fn leftover(capacity: &GpuCapacity, after: &GpuLoad) -> i64 {
    let mem = after.free_memory(capacity) * 1000 / capacity.memory_mib.max(1);
    i64::from(after.free_compute()) + mem as i64
}

/// Oversubscribed instances go where their weights most likely stay
/// resident (least swap need), then where fewer others are mapped.
fn oversubscribed_score(capacity: &GpuCapacity, after: &GpuLoad) -> i64 {
    let swap = after.swap_need(capacity) * 1000 / capacity.memory_mib.max(1);
    swap as i64 * 4096 + i64::from(after.oversub_count)
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
                *w.entry((s.compute_milli, s.memory_mib)).or_default() +=
                    1 + u64::from(state.instance_count(&s.tenant, &s.name));
            }
        }
        Self::from_shapes(w.into_iter().map(|((c, m), n)| (c, m, n)))
    }

    /// Shapes given directly as `(compute, memory, weight)`.
    pub fn from_shapes(shapes: impl IntoIterator<Item = (MilliGpu, Mib, u64)>) -> Self {
        let mut shapes: Vec<_> = shapes.into_iter().filter(|s| s.2 > 0).collect();
        shapes.sort_by(|a, b| b.2.cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
        shapes.truncate(MAX_SHAPES);
        let total_weight = shapes.iter().map(|s| s.2).sum();
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
        let stuck: u64 = self
            .shapes
            .iter()
            .filter(|(c, m, _)| *c > fc || *m > fm)
            .map(|(_, _, w)| w * u64::from(fc))
            .sum();
        (stuck / self.total_weight) as i64
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
        let grow = self.fragmentation(capacity, &after) - self.fragmentation(capacity, before);
        grow * 4096 + leftover(capacity, &after)
    }
}

/// Where the planner would put one more instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// Owner.
    pub tenant: TenantId,
    /// Function name.
    pub function: String,
    /// Pool of the chosen node.
    pub pool: String,
    /// Its kind.
    pub pool_kind: PoolKind,
    /// The slices.
    pub slices: Vec<Slice>,
    /// The ranking's score (lower is better).
    pub score: i64,
}

impl Proposal {
    /// The command that places it (re-checked on apply).
    pub fn command(&self) -> DomainCommand {
        DomainCommand::InstancePlace {
            tenant: self.tenant.clone(),
            function: self.function.clone(),
            slices: self.slices.clone(),
        }
    }
}

/// Why no instance can be placed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RejectReason {
    /// No such tenant.
    #[error("unknown tenant")]
    UnknownTenant,
    /// The tenant has no such function.
    #[error("unknown function")]
    UnknownFunction,
    /// No topology is loaded.
    #[error("no topology loaded")]
    NoTopology,
    /// The function has its most instances.
    #[error("already at max_instances ({max})")]
    MaxInstances {
        /// Its `max_instances`.
        max: u32,
    },
    /// A GPU had room but the tenant's quota did not.
    #[error("{pool_kind} quota of {dimension} exhausted")]
    Quota {
        /// The pool kind.
        pool_kind: PoolKind,
        /// What ran out.
        dimension: QuotaDimension,
    },
    /// No GPU has room; the best candidate ran out of `dimension`.
    #[error("no GPU has room; best candidate {gpu} ran out of {dimension}")]
    Gpu {
        /// The best candidate.
        gpu: GpuId,
        /// What ran out there.
        dimension: GpuDimension,
    },
    /// The topology has no node to try.
    #[error("no nodes")]
    NoNodes,
}

/// A plan that found no place, with what was tried (Nomad's `AllocMetric`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("cannot place {tenant}/{function}: {reason} ({nodes_evaluated} nodes, {gpus_evaluated} GPUs evaluated)")]
pub struct PlanRejection {
    /// Owner.
    pub tenant: TenantId,
    /// Function name.
    pub function: String,
    /// Nodes looked at.
    pub nodes_evaluated: u32,
    /// GPUs looked at.
    pub gpus_evaluated: u32,
    /// How many candidates failed on each GPU dimension.
    pub exhausted: BTreeMap<GpuDimension, u32>,
    /// Pool kinds whose quota refused a candidate that had room.
    pub quota_exhausted: BTreeMap<PoolKind, QuotaDimension>,
    /// The reason (see the module docs).
    pub reason: RejectReason,
}

impl PlanRejection {
    /// The stable code (for API errors and the rejections-by-reason metric).
    pub fn code(&self) -> &'static str {
        match self.reason {
            RejectReason::UnknownTenant => "unknown_tenant",
            RejectReason::UnknownFunction => "unknown_function",
            RejectReason::NoTopology => "no_topology",
            RejectReason::MaxInstances { .. } => "max_instances",
            RejectReason::Quota { .. } => "quota_exceeded",
            RejectReason::Gpu { .. } => "gpu_full",
            RejectReason::NoNodes => "no_nodes",
        }
    }
}

/// How far through fit's checks a failure got (higher: nearer to fitting).
fn progress(d: GpuDimension) -> u8 {
    match d {
        GpuDimension::NoSuchGpu => 0,
        GpuDimension::HeldExclusive | GpuDimension::NotEmpty => 1,
        GpuDimension::Compute => 2,
        GpuDimension::BurstCompute => 3,
        GpuDimension::Memory => 4,
        GpuDimension::OversubscribedSlots => 5,
        GpuDimension::SwapSpace => 6,
    }
}

/// The preference group of a pool for `pref` (0 is tried first).
fn group(pref: &PoolPreference, name: &str, kind: PoolKind) -> u8 {
    match pref {
        PoolPreference::Any => 0,
        PoolPreference::Center => u8::from(kind != PoolKind::Center),
        PoolPreference::Edge(p) if p == name => 0,
        PoolPreference::Edge(_) if kind == PoolKind::Edge => 1,
        PoolPreference::Edge(_) => 2,
    }
}

/// Plans one more instance of `tenant`'s deployed function `function`.
pub fn plan(
    state: &RegionState,
    tenant: &TenantId,
    function: &str,
    ranking: &dyn Ranking,
) -> Result<Proposal, Box<PlanRejection>> {
    match state.function(tenant, function) {
        Ok(f) => plan_spec(state, &f.spec, ranking),
        Err(_) => Err(rejection(tenant, function, RejectReason::UnknownFunction)),
    }
}

fn rejection(tenant: &TenantId, function: &str, reason: RejectReason) -> Box<PlanRejection> {
    Box::new(PlanRejection {
        tenant: tenant.clone(),
        function: function.to_string(),
        nodes_evaluated: 0,
        gpus_evaluated: 0,
        exhausted: BTreeMap::new(),
        quota_exhausted: BTreeMap::new(),
        reason,
    })
}

/// Plans one more instance of `spec` (deployed or not; a deployed one's
/// instances count toward `max_instances`).
pub fn plan_spec(
    state: &RegionState,
    spec: &FunctionSpec,
    ranking: &dyn Ranking,
) -> Result<Proposal, Box<PlanRejection>> {
    let reject = |reason| rejection(&spec.tenant, &spec.name, reason);
    let topology = state
        .topology()
        .ok_or_else(|| reject(RejectReason::NoTopology))?;
    if state.instance_count(&spec.tenant, &spec.name) >= spec.max_instances {
        return Err(reject(RejectReason::MaxInstances {
            max: spec.max_instances,
        }));
    }
    let Some(tenant) = state.tenant(&spec.tenant) else {
        return Err(reject(RejectReason::UnknownTenant));
    };
    let quota = |kind: PoolKind| (tenant.quota(kind), state.held(&spec.tenant, kind));
    let quotas = [quota(PoolKind::Center), quota(PoolKind::Edge)];
    let kind_index = |k: PoolKind| usize::from(k == PoolKind::Edge);

    let mut out = reject(RejectReason::NoNodes);
    let mut furthest: Option<(u8, GpuId, GpuDimension)> = None;
    let mut quota_blocked: Option<(PoolKind, QuotaDimension)> = None;
    let caps = state.caps();
    let loads = state.node_loads();
    // Where each pool's nodes start in `loads` (topology order).
    let mut first_node = Vec::with_capacity(topology.pools().len());
    let mut total = 0usize;
    for p in topology.pools() {
        first_node.push(total);
        total += p.nodes.len();
    }
    let mut counts = [0u32; GpuDimension::ALL.len()];
    for g in 0..=2u8 {
        let mut best: Option<(i64, Proposal)> = None;
        for (p, pool) in topology
            .pools()
            .iter()
            .enumerate()
            .filter(|(_, p)| group(&spec.pool, &p.name, p.kind) == g)
        {
            let (q, used) = &quotas[kind_index(pool.kind)];
            for (j, node) in pool.nodes.iter().enumerate() {
                let Some(load) = loads.get(first_node[p] + j) else {
                    continue;
                };
                out.nodes_evaluated += 1;
                let mut try_slices = |demands: &[(u32, Demand)], score: &dyn Fn() -> i64| {
                    if let Err(FitFailure {
                        gpu_index,
                        dimension,
                    }) = fit(caps, load, demands)
                    {
                        counts[dimension as usize] += 1;
                        let p = progress(dimension);
                        if furthest.as_ref().is_none_or(|f| p > f.0) {
                            let gpu = GpuId {
                                node: node.name.clone(),
                                index: gpu_index,
                            };
                            furthest = Some((p, gpu, dimension));
                        }
                        return;
                    }
                    let extra = Quota {
                        compute_milli: demands
                            .iter()
                            .map(|(_, d)| u64::from(d.compute_milli))
                            .sum(),
                        memory_mib: demands.iter().map(|(_, d)| d.memory_mib).sum(),
                        instances: 1,
                    };
                    if let Err(dim) = q.admits(used, &extra) {
                        out.quota_exhausted.entry(pool.kind).or_insert(dim);
                        quota_blocked.get_or_insert((pool.kind, dim));
                        return;
                    }
                    let s = score();
                    if best.as_ref().is_none_or(|b| s < b.0) {
                        let slices = demands
                            .iter()
                            .map(|(i, d)| Slice {
                                gpu: GpuId {
                                    node: node.name.clone(),
                                    index: *i,
                                },
                                compute_milli: d.compute_milli,
                                memory_mib: d.memory_mib,
                            })
                            .collect();
                        best = Some((
                            s,
                            Proposal {
                                tenant: spec.tenant.clone(),
                                function: spec.name.clone(),
                                pool: pool.name.clone(),
                                pool_kind: pool.kind,
                                slices,
                                score: s,
                            },
                        ));
                    }
                };
                if spec.tier == Tier::Exclusive {
                    let k = (spec.compute_milli / WHOLE_GPU) as usize;
                    out.gpus_evaluated += load.gpus.len() as u32;
                    let taken: Vec<u32> = (0..load.gpus.len() as u32)
                        .filter(|&i| load.gpus[i as usize].load.instances == 0)
                        .take(k)
                        .collect();
                    let mut demands: Vec<(u32, Demand)> = taken
                        .iter()
                        .map(|&i| {
                            (
                                i,
                                Demand {
                                    tier: Tier::Exclusive,
                                    compute_milli: WHOLE_GPU,
                                    memory_mib: load.gpus[i as usize].capacity.memory_mib,
                                },
                            )
                        })
                        .collect();
                    if taken.len() < k {
                        // Not enough empty GPUs: fit names the first busy one.
                        let busy = (0..load.gpus.len() as u32).find(|i| !taken.contains(i));
                        demands.push((
                            busy.unwrap_or(load.gpus.len() as u32),
                            Demand {
                                tier: Tier::Exclusive,
                                compute_milli: WHOLE_GPU,
                                memory_mib: 0,
                            },
                        ));
                    } else if demands.iter().map(|(_, d)| d.memory_mib).sum::<Mib>()
                        < spec.memory_mib
                    {
                        counts[GpuDimension::Memory as usize] += 1;
                        if furthest.is_none() {
                            furthest = Some((
                                progress(GpuDimension::Memory),
                                GpuId {
                                    node: node.name.clone(),
                                    index: taken[0],
                                },
                                GpuDimension::Memory,
                            ));
                        }
                        continue;
                    }
                    try_slices(&demands, &|| ranking.score_whole(load, &taken));
                } else {
                    let d = Demand {
                        tier: spec.tier,
                        compute_milli: spec.compute_milli,
                        memory_mib: spec.memory_mib,
                    };
                    for (i, slot) in load.gpus.iter().enumerate() {
                        out.gpus_evaluated += 1;
                        try_slices(&[(i as u32, d)], &|| {
                            ranking.score_slice(&slot.capacity, &slot.load, &d)
                        });
                    }
                }
            }
        }
        if let Some((_, p)) = best {
            return Ok(p);
        }
    }
    for (d, n) in GpuDimension::ALL.into_iter().zip(counts) {
        if n > 0 {
            out.exhausted.insert(d, n);
        }
    }
    out.reason = match (quota_blocked, furthest) {
        (Some((pool_kind, dimension)), _) => RejectReason::Quota {
            pool_kind,
            dimension,
        },
        (None, Some((_, gpu, dimension))) => RejectReason::Gpu { gpu, dimension },
        (None, None) => RejectReason::NoNodes,
    };
    Err(out)
}

impl fmt::Display for Proposal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} on", self.tenant, self.function)?;
        for s in &self.slices {
            write!(
                f,
                " {} ({} milli, {} MiB)",
                s.gpu, s.compute_milli, s.memory_mib
            )?;
        }
        Ok(())
    }
}
