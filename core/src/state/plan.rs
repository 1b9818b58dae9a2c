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
//!                               strict:edge:<p> → p only
//!                               strict:center   → center pools only
//!   for each group, for each node, for each GPU (or set of empty GPUs):
//!       fit ──no──▶ count the dimension, remember the furthest failure
//!        │yes
//!       quota ──no──▶ remember the pool kind and dimension
//!        │yes
//!       key (lower wins): not on a preferred node (one holding the weights),
//!                         on a GPU that holds an instance of the function already,
//!                         score (Ranking; ties: earlier node and GPU)
//!   first group with a winner ─▶ Proposal ─▶ DomainCommand::InstancePlace
//!   none anywhere ─▶ PlanRejection { reason, counts }
//! ```
//!
//! The reason of a rejection names what ran out on the best candidate:
//! the quota if some GPU had room but the tenant's quota of that pool kind
//! did not; else the GPU whose failure came latest in fit's order of checks
//! (the one nearest to fitting; ties: earliest in preference order).

use super::command::DomainCommand;
use super::fit::{fit, fit_gpu, Demand, FitFailure, GpuDimension, NodeLoad};
use super::free_index::{FreeIndex, GpuAt, GpuClass};
use super::instance::held_of;
use super::pending::PendingPlans;
use super::plan_metric::PlanMetric;
use super::plan_rejection::{PlanRejection, RejectReason};
use super::ranking::Ranking;
use super::region_state::RegionState;
use crate::config::Topology;
use crate::model::{
    FunctionSpec, GpuId, Mib, NodeId, PoolKind, PoolPreference, QuotaDimension, Slice, TenantId,
    Tier, WHOLE_GPU,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

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

/// How far through fit's checks a failure got (higher: nearer to fitting).
fn progress(d: GpuDimension) -> u8 {
    match d {
        GpuDimension::NoSuchGpu | GpuDimension::Unavailable => 0,
        GpuDimension::HeldExclusive | GpuDimension::NotEmpty => 1,
        GpuDimension::Compute => 2,
        GpuDimension::BurstCompute => 3,
        GpuDimension::Memory => 4,
        GpuDimension::OversubscribedSlots => 5,
        GpuDimension::SwapSpace => 6,
    }
}

/// The preference group of a pool for `pref` (0 is tried first; `None`:
/// never, a pool outside a strict preference's).
pub(crate) fn group(pref: &PoolPreference, name: &str, kind: PoolKind) -> Option<u8> {
    if !pref.allows(name, kind) {
        return None;
    }
    Some(match pref.preferred() {
        PoolPreference::Center => u8::from(kind != PoolKind::Center),
        PoolPreference::Edge(p) if p == name => 0,
        PoolPreference::Edge(_) if kind == PoolKind::Edge => 1,
        PoolPreference::Edge(_) => 2,
        // (`preferred` is never strict)
        PoolPreference::Any | PoolPreference::EdgeOnly(_) | PoolPreference::CenterOnly => 0,
    })
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
        nodes_not_ready: 0,
        reason,
    })
}

/// How much of the region a plan looks at.
///
/// The default scans every node of the first pool group that has room and
/// returns the best candidate, with exact rejection counts. A
/// `feasible_limit` stops after that many feasible candidates (checked
/// node by node), like Nomad's `LimitIterator`, which ranks only about
/// log2(nodes) feasible nodes; `start` rotates where each group's scan
/// begins (e.g. a counter or a random number), so limited plans spread
/// over the region. Apply re-checks either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanOptions {
    /// Stop after this many feasible candidates (`None`: look at all).
    pub feasible_limit: Option<u32>,
    /// Offset of the first node scanned in each pool group.
    pub start: usize,
    /// Plan a one-GPU instance through the index over free capacity
    /// ([`super::free_index`]): each class of GPUs (size and load) is
    /// checked and scored once and its earliest GPU taken, which picks what
    /// the full scan (from start 0) picks. Exclusive instances, a pool group
    /// where the tenant's quota refuses, a plan that finds no place, and a
    /// pick on a GPU that already holds an instance of the function (the
    /// scan looks for one apart) fall back to the scan (so a rejection says
    /// exactly what the scan says).
    /// `feasible_limit` and `start` apply only to the scan.
    pub indexed: bool,
}

impl PlanOptions {
    /// Indexed plans (see [`PlanOptions::indexed`]), full scan as fallback.
    pub fn indexed() -> Self {
        PlanOptions {
            indexed: true,
            ..PlanOptions::default()
        }
    }
}

/// Plans one more instance of `spec` (deployed or not; a deployed one's
/// instances count toward `max_instances`), looking at every node.
pub fn plan_spec(
    state: &RegionState,
    spec: &FunctionSpec,
    ranking: &dyn Ranking,
) -> Result<Proposal, Box<PlanRejection>> {
    plan_spec_with(state, spec, ranking, &PlanOptions::default())
}

/// [`plan_spec`] with [`PlanOptions`].
pub fn plan_spec_with(
    state: &RegionState,
    spec: &FunctionSpec,
    ranking: &dyn Ranking,
    options: &PlanOptions,
) -> Result<Proposal, Box<PlanRejection>> {
    plan_spec_explained(state, spec, ranking, options).map(|(p, _)| p)
}

/// The largest GPU of `topology` (most memory; ties: first in topology
/// order) if `spec` is larger than every GPU, so that no load could ever
/// take it: `(gpu, its model, its memory)`. Every pool preference spills
/// to every pool, so every GPU of the region counts; a strict one
/// (`strict_pool`) never leaves its pools, so only their GPUs count (the
/// largest GPU named is theirs). An `exclusive` spec of `k` GPUs compares
/// with the `k` largest GPUs of one node. `None` too when the allowed
/// pools hold no GPU at all ([`no_allowed_pool`] names a missing pool).
pub fn unsatisfiable(topology: &Topology, spec: &FunctionSpec) -> Option<(GpuId, String, Mib)> {
    // Per pool, from the topology's summary of its largest GPUs (a step
    // per pool, not per node: this runs before every plan).
    let exclusive = spec.tier == Tier::Exclusive;
    let k = (spec.compute_milli / WHOLE_GPU) as usize;
    // (pool, node index in it, GPU index on the node, group index) of the
    // largest GPU, the first in file order.
    let mut largest: Option<(&crate::config::Pool, usize, u32, usize)> = None;
    let mut fits = false;
    for (pool, capacity) in topology.pools().iter().zip(topology.pool_capacity()) {
        if !spec.pool.allows(&pool.name, pool.kind) {
            continue;
        }
        if let Some((n, index, g)) = capacity.largest {
            let memory = pool.nodes[n].gpus[g].memory_mib;
            if largest.is_none_or(|(p, n, _, g)| memory > p.nodes[n].gpus[g].memory_mib) {
                largest = Some((pool, n, index, g));
            }
        }
        if exclusive {
            fits |= capacity.whole.get(k).is_some_and(|m| *m >= spec.memory_mib);
        }
    }
    let (pool, n, index, g) = largest?;
    let (node, group) = (&pool.nodes[n], &pool.nodes[n].gpus[g]);
    if !exclusive {
        fits = spec.memory_mib <= group.memory_mib;
    }
    (!fits).then(|| {
        (
            GpuId {
                node: node.name.clone(),
                index,
            },
            group.model.clone(),
            group.memory_mib,
        )
    })
}

/// The pool a strict preference names when the topology has none of it
/// (`strict:edge:<p>` without an edge pool p, `strict:center` without a
/// center pool): no load could ever take the function. `None` for a
/// preference (it spills to every pool) and a strict one whose pool exists.
pub fn no_allowed_pool(topology: &Topology, pref: &PoolPreference) -> Option<String> {
    let any = topology
        .pools()
        .iter()
        .any(|p| pref.allows(&p.name, p.kind));
    (pref.is_strict() && !any).then(|| pref.preferred().to_string())
}

/// [`plan_spec_with`] that also says what the plan looked at when it found
/// a place ([`PlanMetric`]: candidates evaluated before the winner, and why
/// the ones passed over were rejected).
pub fn plan_spec_explained(
    state: &RegionState,
    spec: &FunctionSpec,
    ranking: &dyn Ranking,
    options: &PlanOptions,
) -> Result<(Proposal, PlanMetric), Box<PlanRejection>> {
    plan_on(state, None, spec, ranking, options)
}

/// [`plan_spec_explained`] on `state` plus the `pending` plans not yet
/// applied (their loads, held quota and instance counts).
pub fn plan_on(
    state: &RegionState,
    pending: Option<&PendingPlans>,
    spec: &FunctionSpec,
    ranking: &dyn Ranking,
    options: &PlanOptions,
) -> Result<(Proposal, PlanMetric), Box<PlanRejection>> {
    plan_preferring(state, pending, spec, ranking, options, &[], &[])
}

/// [`plan_on`], where a feasible candidate on a node of `prefer` wins over
/// every candidate elsewhere in its pool group (the ranking orders each
/// side). A preference scans (the index does not know nodes by name).
/// Within each side a GPU that holds no instance of the function yet wins
/// over one that does (a function's instances spread over GPUs), so every
/// plan, with a preference or not, spreads. Nodes in `avoid` are never
/// used (nor counted as evaluated).
pub(crate) fn plan_preferring(
    state: &RegionState,
    pending: Option<&PendingPlans>,
    spec: &FunctionSpec,
    ranking: &dyn Ranking,
    options: &PlanOptions,
    prefer: &[NodeId],
    avoid: &[NodeId],
) -> Result<(Proposal, PlanMetric), Box<PlanRejection>> {
    let reject = |reason| rejection(&spec.tenant, &spec.name, reason);
    let topology = state
        .topology()
        .ok_or_else(|| reject(RejectReason::NoTopology))?;
    if let Some(pool) = no_allowed_pool(topology, &spec.pool) {
        return Err(reject(RejectReason::NoSuchPool { pool }));
    }
    if let Some((gpu, model, memory_mib)) = unsatisfiable(topology, spec) {
        return Err(reject(RejectReason::Unsatisfiable {
            gpu,
            model,
            memory_mib,
        }));
    }
    let pending_count = pending.map_or(0, |p| p.count(&spec.tenant, &spec.name));
    if state
        .instance_count(&spec.tenant, &spec.name)
        .saturating_add(pending_count)
        >= spec.max_instances
    {
        return Err(reject(RejectReason::MaxInstances {
            max: spec.max_instances,
        }));
    }
    let Some(tenant) = state.tenant(&spec.tenant) else {
        return Err(reject(RejectReason::UnknownTenant));
    };
    let quota = |kind: PoolKind| {
        let mut used = state.held(&spec.tenant, kind);
        if let Some(p) = pending {
            used = used.saturating_add(&p.held(&spec.tenant, kind));
        }
        (tenant.quota(kind), used)
    };
    let quotas = [quota(PoolKind::Center), quota(PoolKind::Edge)];
    let kind_index = |k: PoolKind| usize::from(k == PoolKind::Edge);
    let loads = state.node_loads();
    let load_at = |i: usize| pending.and_then(|p| p.node(i)).or_else(|| loads.get(i));
    // The GPUs (node position, GPU index) that already hold an instance of
    // the function, applied or pending. A candidate on another GPU wins
    // over them (the pool group and a preferred node still come first):
    // the agent pins a function's copies to its slices' GPUs and keeps one
    // copy per GPU, so a second instance on the same GPU adds no copy that
    // serves, and a scale-out would add no capacity.
    let mut siblings: BTreeSet<(usize, u32)> = state
        .instances_of(&spec.tenant, &spec.name)
        .flat_map(|i| i.slices.iter())
        .filter_map(|s| {
            state
                .node_position(&s.gpu.node)
                .map(|pos| (pos, s.gpu.index))
        })
        .collect();
    if let Some(p) = pending {
        siblings.extend(p.gpus_of(&spec.tenant, &spec.name));
    }
    let on_sibling = |slices: &[Slice]| {
        slices.iter().any(|s| {
            state
                .node_position(&s.gpu.node)
                .is_some_and(|pos| siblings.contains(&(pos, s.gpu.index)))
        })
    };
    if options.indexed && spec.tier != Tier::Exclusive && prefer.is_empty() && avoid.is_empty() {
        let d = Demand {
            tier: spec.tier,
            compute_milli: spec.compute_milli,
            memory_mib: spec.memory_mib,
        };
        let admitted = |kind: PoolKind| {
            let (q, used) = &quotas[kind_index(kind)];
            q.admits(used, &held_of([(d.compute_milli, d.memory_mib)]))
                .is_ok()
        };
        // The index's pick is the best GPU overall: on a GPU apart from the
        // siblings it is also the scan's pick (the best among those apart,
        // the earliest of equal scores); on a sibling's GPU the scan decides.
        if let Some(found) = plan_indexed(state, pending, spec, ranking, &d, &load_at, &admitted) {
            if !on_sibling(&found.0.slices) {
                return Ok(found);
            }
        }
    }

    let mut out = reject(RejectReason::NoNodes);
    let mut furthest: Option<(u8, GpuId, GpuDimension)> = None;
    let mut quota_blocked: Option<(PoolKind, QuotaDimension)> = None;
    let caps = state.caps();
    // Where each pool's nodes start in `loads` (topology order).
    let mut first_node = Vec::with_capacity(topology.pools().len());
    let mut total = 0usize;
    for p in topology.pools() {
        first_node.push(total);
        total = total.saturating_add(p.nodes.len());
    }
    let mut counts = [0u32; GpuDimension::ALL.len()];
    let mut members: Vec<(usize, usize)> = Vec::new();
    for g in 0..=2u8 {
        // (not preferred, on a sibling's GPU, score): lower wins.
        let mut best: Option<((bool, bool, i64), Proposal)> = None;
        let mut feasible = 0u32;
        members.clear();
        for (p, pool) in topology.pools().iter().enumerate() {
            if group(&spec.pool, &pool.name, pool.kind) == Some(g) {
                members.extend((0..pool.nodes.len()).map(|j| (p, j)));
            }
        }
        let m = members.len();
        for k in 0..m {
            // A limited scan goes on past its limit to a preferred node, and
            // to a GPU apart from the siblings.
            let found_preferred = prefer.is_empty() || best.as_ref().is_some_and(|b| !b.0 .0);
            let found_apart = siblings.is_empty() || best.as_ref().is_some_and(|b| !b.0 .1);
            if options.feasible_limit.is_some_and(|l| feasible >= l)
                && found_preferred
                && found_apart
            {
                break;
            }
            // The scan's k-th node from a rotating start: (start + k) mod m.
            let at = options
                .start
                .checked_rem(m)
                .and_then(|s| s.checked_add(k))
                .and_then(|i| i.checked_rem(m))
                .unwrap_or(k);
            let (p, j) = members[at];
            let pool = &topology.pools()[p];
            let node = &pool.nodes[j];
            if avoid.contains(&node.name) {
                continue;
            }
            let preferred = prefer.contains(&node.name);
            let (q, used) = &quotas[kind_index(pool.kind)];
            if !state.takes_placements(&node.name) {
                // Not ready or drained: apply would refuse it (no GPU counted).
                out.nodes_not_ready = out.nodes_not_ready.saturating_add(1);
                continue;
            }
            {
                let Some(pos) = first_node[p].checked_add(j) else {
                    continue;
                };
                let Some(load) = load_at(pos) else {
                    continue;
                };
                out.nodes_evaluated = out.nodes_evaluated.saturating_add(1);
                let mut try_slices = |demands: &[(u32, Demand)], score: &dyn Fn() -> i64| {
                    if let Err(FitFailure {
                        gpu_index,
                        dimension,
                    }) = fit(caps, load, demands)
                    {
                        let n = &mut counts[dimension as usize];
                        *n = n.saturating_add(1);
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
                    let extra =
                        held_of(demands.iter().map(|(_, d)| (d.compute_milli, d.memory_mib)));
                    if let Err(dim) = q.admits(used, &extra) {
                        out.quota_exhausted.entry(pool.kind).or_insert(dim);
                        quota_blocked.get_or_insert((pool.kind, dim));
                        return;
                    }
                    feasible = feasible.saturating_add(1);
                    let s = score();
                    let shared = demands.iter().any(|(i, _)| siblings.contains(&(pos, *i)));
                    let key = (!preferred, shared, s);
                    if best.as_ref().is_none_or(|b| key < b.0) {
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
                            key,
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
                    out.gpus_evaluated = out.gpus_evaluated.saturating_add(load.gpus.len() as u32);
                    let taken: Vec<u32> = (0..load.gpus.len() as u32)
                        .filter(|&i| {
                            let g = &load.gpus[i as usize];
                            g.load.instances == 0 && g.capacity.available
                        })
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
                    } else if demands
                        .iter()
                        .fold(0, |m: Mib, (_, d)| m.saturating_add(d.memory_mib))
                        < spec.memory_mib
                    {
                        let n = &mut counts[GpuDimension::Memory as usize];
                        *n = n.saturating_add(1);
                        if furthest.is_none() {
                            furthest = Some((
                                progress(GpuDimension::Memory),
                                GpuId {
                                    node: node.name.clone(),
                                    // (none taken: a spec of zero GPUs)
                                    index: taken.first().copied().unwrap_or(0),
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
                        out.gpus_evaluated = out.gpus_evaluated.saturating_add(1);
                        try_slices(&[(i as u32, d)], &|| {
                            ranking.score_slice(&slot.capacity, &slot.load, &d)
                        });
                    }
                }
            }
        }
        if let Some((_, p)) = best {
            fill_exhausted(&mut out, &counts);
            return Ok((p, PlanMetric::from(&*out)));
        }
    }
    fill_exhausted(&mut out, &counts);
    out.reason = match (quota_blocked, furthest) {
        (Some((pool_kind, dimension)), _) => RejectReason::Quota {
            pool_kind,
            dimension,
        },
        (None, Some((_, gpu, dimension))) => RejectReason::Gpu { gpu, dimension },
        (None, None) if out.nodes_not_ready > 0 => RejectReason::NoReadyNodes {
            not_ready: out.nodes_not_ready,
        },
        (None, None) => RejectReason::NoNodes,
    };
    Err(out)
}

/// The indexed plan of one single-GPU instance of demand `d` (see
/// [`PlanOptions::indexed`]): in the first pool group with a GPU that takes
/// it, the lowest score and, among equal scores, the earliest GPU (node
/// position, then GPU index), as the full scan from start 0 would pick.
/// `None` when the scan must decide: a group whose quota refuses (in one
/// of its pool kinds), or no GPU in any group.
fn plan_indexed<'a>(
    state: &'a RegionState,
    pending: Option<&'a PendingPlans>,
    spec: &FunctionSpec,
    ranking: &dyn Ranking,
    d: &Demand,
    load_at: &dyn Fn(usize) -> Option<&'a NodeLoad>,
    admitted: &dyn Fn(PoolKind) -> bool,
) -> Option<(Proposal, PlanMetric)> {
    let topology = state.topology()?;
    let caps = state.caps();
    let pools = topology.pools();
    let empty = FreeIndex::default();
    let sources: [(&FreeIndex, bool); 2] = [
        (state.free_index(), false),
        (pending.map_or(&empty, |p| p.free()), true),
    ];
    let overlaid = |pos: u32| pending.is_some_and(|p| p.node(pos as usize).is_some());
    // An overlay made before a topology reload (another writer, which the
    // scheduler does not see) may sit at a position that a node of another
    // pool holds now: its GPUs are filed under their old pool, so the index
    // would count them in the wrong pool group and name the node now at
    // that position. The scan reads pools from the topology, so it decides
    // until the release that rebuilds the overlay (the overlay is only the
    // nodes of the batches in flight: this check is small).
    if let Some(p) = pending {
        let moved = p.free().classes().any(|(class, members)| {
            members
                .iter()
                .any(|&(pos, _)| state.pool_index_of(pos as usize) != Some(class.pool))
        });
        if moved {
            return None;
        }
    }
    let takes = |pos: u32| {
        state
            .node_name_at(pos as usize)
            .is_some_and(|n| state.takes_placements(n))
    };
    for g in 0..=2u8 {
        let in_group: Vec<bool> = pools
            .iter()
            .map(|p| group(&spec.pool, &p.name, p.kind) == Some(g))
            .collect();
        if !in_group.iter().any(|b| *b) {
            continue;
        }
        if pools
            .iter()
            .zip(&in_group)
            .any(|(p, inside)| *inside && !admitted(p.kind))
        {
            return None;
        }
        // (score, class, its GPUs, from the overlay, whether the node's swap rule decides)
        let mut candidates: Vec<(
            i64,
            &GpuClass,
            &std::collections::BTreeSet<GpuAt>,
            bool,
            bool,
        )> = Vec::new();
        let mut evaluated = 0u32;
        for (index, from_overlay) in sources {
            for (class, members) in index.classes() {
                if !in_group.get(class.pool as usize).copied().unwrap_or(false) {
                    continue;
                }
                evaluated = evaluated.saturating_add(1);
                let Ok(after) = fit_gpu(caps, &class.capacity, &class.load, d) else {
                    continue;
                };
                let node_rule =
                    after.swap_need(&class.capacity) > class.load.swap_need(&class.capacity);
                let score = ranking.score_slice(&class.capacity, &class.load, d);
                candidates.push((score, class, members, from_overlay, node_rule));
            }
        }
        candidates.sort_by_key(|c| c.0);
        let mut i = 0;
        while i < candidates.len() {
            let score = candidates[i].0;
            let mut best: Option<GpuAt> = None;
            while i < candidates.len() && candidates[i].0 == score {
                let (_, class, members, from_overlay, node_rule) = candidates[i];
                i = i.saturating_add(1);
                let first = members.iter().copied().find(|&(pos, gpu)| {
                    if best.is_some_and(|b| b < (pos, gpu)) {
                        return true; // no later member can win: stop here
                    }
                    if !from_overlay && overlaid(pos) {
                        return false; // its load is the overlay's
                    }
                    if from_overlay
                        && pending.and_then(|p| p.pool_filed(pos as usize)) != Some(class.pool)
                    {
                        // Not (or no longer) overlaid, or filed under
                        // another pool: a leftover, never a place.
                        return false;
                    }
                    if !takes(pos) {
                        return false; // not ready or drained: apply would refuse it
                    }
                    !node_rule
                        || load_at(pos as usize).is_some_and(|n| fit(caps, n, &[(gpu, *d)]).is_ok())
                });
                if let Some(at) = first {
                    if best.is_none_or(|b| at < b) {
                        best = Some(at);
                    }
                }
            }
            let Some((pos, gpu)) = best else {
                continue;
            };
            let pool = state.pool_of_position(pos as usize)?;
            let node = state.node_name_at(pos as usize)?;
            let slice = Slice {
                gpu: GpuId {
                    node: node.clone(),
                    index: gpu,
                },
                compute_milli: d.compute_milli,
                memory_mib: d.memory_mib,
            };
            let metric = PlanMetric {
                nodes_evaluated: 1,
                gpus_evaluated: evaluated,
                ..PlanMetric::default()
            };
            return Some((
                Proposal {
                    tenant: spec.tenant.clone(),
                    function: spec.name.clone(),
                    pool: pool.name.clone(),
                    pool_kind: pool.kind,
                    slices: vec![slice],
                    score,
                },
                metric,
            ));
        }
    }
    None
}

fn fill_exhausted(out: &mut PlanRejection, counts: &[u32; GpuDimension::ALL.len()]) {
    for (d, n) in GpuDimension::ALL.into_iter().zip(counts.iter().copied()) {
        if n > 0 {
            out.exhausted.insert(d, n);
        }
    }
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
