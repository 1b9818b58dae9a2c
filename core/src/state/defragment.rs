//! Defragmentation across nodes: when an instance fits no GPU although
//! its pools have the room in sum, move at most [`DEFRAG_MOVES_MAX`] small
//! burstable or oversubscribed instances off one GPU (make-before-break,
//! `InstanceMigrate` with cause `defragment`) so that it fits there — the
//! region's analogue of the agent's remap inside a node.
//!
//! ```text
//!   a placement rejected gpu_full (scale-out, shed, below min_instances)
//!      plan_defragment(view, spec, policy, now)            (pure)
//!        some GPU fits once the migrations leaving it end ─▶ Waiting (nothing more moves)
//!        per GPU of the allowed pools (first preference group first):
//!           the fewest movable instances whose leaving makes it fit (≤ 2, counting
//!           the defragmentation moves already leaving it), smallest first
//!        for the best DEFRAG_PLANS of those: each victim planned in its own pool,
//!        off the GPU's node, around the ones before it
//!      ─▶ Move(DefragPlan)   the scheduler starts its first move; the next
//!                            evaluation sees it leaving and plans the rest
//!      ─▶ Nothing(why)
//! ```
//!
//! Movable: burstable and oversubscribed instances of the current version
//! of another function that is not migrating, not placed by an operator,
//! on one GPU, placed at least [`DEFRAG_VICTIM_MIN_AGE_MS`] ago, in a pool
//! with another node; never two of one function in one plan, and never
//! onto a node another defragmentation is clearing a GPU of. Guaranteed and exclusive instances never move for another
//! function's room. Only guaranteed and burstable instances are made room
//! for (an oversubscribed one needs no resident room; an exclusive one
//! needs whole GPUs).

use super::fit::{fit, Demand, GpuLoad};
use super::instance::{held_of, Instance, InstanceId};
use super::migration::MigrationCause;
use super::migration_plan::{plan_into, MoveTarget};
use super::placement_plan::PlacementPolicy;
use super::plan::group;
use super::region_state::{RegionState, UnixMillis};
use crate::model::{FunctionSpec, GpuId, Mib, MilliGpu, NodeId, PoolKind, Slice, TenantId, Tier};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Most instances moved to make room for one placement.
pub const DEFRAG_MOVES_MAX: usize = 2;
/// Most ways of making room that are planned (each plans its moves).
pub const DEFRAG_PLANS: usize = 8;
/// An instance placed (or moved) more recently than this does not move
/// to make room (a victim does not bounce from plan to plan).
pub const DEFRAG_VICTIM_MIN_AGE_MS: u64 = 10_000;
/// The smallest movable instances of one GPU that are looked at.
pub const DEFRAG_VICTIMS_PER_GPU: usize = 24;

/// One instance moved to make room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefragMove {
    /// The instance that moves.
    pub instance: InstanceId,
    /// Its owner.
    pub tenant: TenantId,
    /// Its function.
    pub function: String,
    /// Its tier.
    pub tier: Tier,
    /// Its compute and memory on the GPU it leaves.
    pub compute_milli: MilliGpu,
    /// See `compute_milli`.
    pub memory_mib: Mib,
    /// Where it goes (its own pool, another node).
    pub slices: Vec<Slice>,
}

/// How room is made for one more instance of a function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefragPlan {
    /// The function room is made for.
    pub tenant: TenantId,
    /// See `tenant`.
    pub function: String,
    /// Its tier, compute and memory.
    pub tier: Tier,
    /// See `tier`.
    pub compute_milli: MilliGpu,
    /// See `tier`.
    pub memory_mib: Mib,
    /// The GPU room is made on.
    pub gpu: GpuId,
    /// Its pool.
    pub pool: String,
    /// Unreserved GPU memory over the GPUs of the pools looked at, MiB.
    pub free_mib: Mib,
    /// Unreserved compute over those GPUs, milli-GPU.
    pub free_compute_milli: u64,
    /// The most unreserved memory on one of those GPUs, MiB.
    pub largest_free_mib: Mib,
    /// The moves, in order (the first is started first).
    pub moves: Vec<DefragMove>,
}

impl fmt::Display for DefragPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} ({}, {} milli, {} MiB) fits no GPU although its pools have {} MiB and {} milli free in sum (at most {} MiB on one GPU); moving ",
            self.tenant,
            self.function,
            self.tier,
            self.compute_milli,
            self.memory_mib,
            self.free_mib,
            self.free_compute_milli,
            self.largest_free_mib
        )?;
        for (k, m) in self.moves.iter().enumerate() {
            if k > 0 {
                f.write_str(" and ")?;
            }
            let to = m
                .slices
                .first()
                .map_or_else(|| "?".to_string(), |s| s.gpu.to_string());
            write!(
                f,
                "{}/{} {} ({}, {} milli, {} MiB) to {}",
                m.tenant, m.function, m.instance, m.tier, m.compute_milli, m.memory_mib, to
            )?;
        }
        write!(f, " makes room on {} (pool {})", self.gpu, self.pool)
    }
}

/// Why no room is made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum NoDefrag {
    /// The function is gone, or its tenant, or the topology.
    #[error("the function, its tenant or the topology is gone")]
    Gone,
    /// Room is made only for guaranteed and burstable instances.
    #[error("room is made only for guaranteed and burstable instances, not {0}")]
    Tier(Tier),
    /// The tenant's quota would not admit it even with the room.
    #[error("the {0} quota would not admit it")]
    Quota(PoolKind),
    /// The free room in sum is too small: the pools are full, not
    /// fragmented.
    #[error("its pools have {free_mib} MiB and {free_compute_milli} milli free in sum: full, not fragmented")]
    Full {
        /// Unreserved memory in sum, MiB.
        free_mib: Mib,
        /// Unreserved compute in sum, milli-GPU.
        free_compute_milli: u64,
    },
    /// No GPU fits it after at most [`DEFRAG_MOVES_MAX`] movable instances
    /// leave, or none of those can go elsewhere in its pool.
    #[error("no GPU fits it after moving at most {DEFRAG_MOVES_MAX} burstable or oversubscribed instances that have room elsewhere in their pool")]
    NoMoves,
}

/// What to do to make room for one more instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Defragment {
    /// Start these moves (the scheduler starts the first).
    Move(DefragPlan),
    /// A GPU fits it once the migrations leaving it end (or fits it now):
    /// move nothing more.
    Waiting {
        /// That GPU.
        gpu: GpuId,
    },
    /// Nothing to do.
    Nothing(NoDefrag),
}

/// The migrations in progress, read once per plan.
struct Moving<'v> {
    /// Old sides, with why they move.
    leaving: BTreeMap<InstanceId, MigrationCause>,
    /// Functions with a migration in progress.
    functions: BTreeSet<(&'v TenantId, &'v str)>,
    /// Nodes a defragmentation is clearing a GPU of (victims never go
    /// there: they would fill what another plan empties).
    clearing: Vec<NodeId>,
}

impl<'v> Moving<'v> {
    fn of(view: &'v RegionState) -> Self {
        let mut m = Moving {
            leaving: BTreeMap::new(),
            functions: BTreeSet::new(),
            clearing: Vec::new(),
        };
        for g in view.migrations() {
            m.leaving.insert(g.from, g.cause);
            if let Some(i) = view.instance(g.to) {
                m.functions.insert((&i.tenant, i.function.as_str()));
            }
            if g.cause == MigrationCause::Defragment {
                for s in view.instance(g.from).iter().flat_map(|i| i.slices.iter()) {
                    if !m.clearing.contains(&s.gpu.node) {
                        m.clearing.push(s.gpu.node.clone());
                    }
                }
            }
        }
        m
    }
}

/// Whether `i` may move to make room for `spec` (see the module docs).
fn movable(
    view: &RegionState,
    moving: &Moving<'_>,
    i: &Instance,
    spec: &FunctionSpec,
    now: UnixMillis,
) -> bool {
    let pool_has_another_node = view
        .topology()
        .and_then(|t| t.pool(&i.pool))
        .is_some_and(|p| p.nodes.len() >= 2);
    i.tier.remappable()
        && i.slices.len() == 1
        && pool_has_another_node
        && now.saturating_sub(i.placed_at) >= DEFRAG_VICTIM_MIN_AGE_MS
        && !(i.tenant == spec.tenant && i.function == spec.name)
        && !view.operator_placed(i.id)
        && !moving.leaving.contains_key(&i.id)
        && !moving.functions.contains(&(&i.tenant, i.function.as_str()))
        && view
            .function(&i.tenant, &i.function)
            .is_ok_and(|f| f.version == i.version)
}

/// One way of making room: the victims leaving a GPU.
struct Room<'v> {
    /// (moves, already being defragmented: false first, memory, compute, position, GPU).
    key: (usize, bool, Mib, u64, usize, u32),
    pos: usize,
    gpu: u32,
    victims: Vec<&'v Instance>,
}

/// The memory and compute of a single-GPU instance.
fn size(i: &Instance) -> (Mib, u64) {
    i.slices
        .first()
        .map_or((0, 0), |s| (s.memory_mib, u64::from(s.compute_milli)))
}

impl<'v> Room<'v> {
    fn new(victims: Vec<&'v Instance>, fresh: bool, pos: usize, gpu: u32) -> Self {
        let (m, c) = victims.iter().fold((0, 0), |(m, c): (Mib, u64), i| {
            let (im, ic) = size(i);
            (m.saturating_add(im), c.saturating_add(ic))
        });
        Room {
            key: (victims.len(), fresh, m, c, pos, gpu),
            pos,
            gpu,
            victims,
        }
    }
}

/// How to make room for one more instance of `spec` (see the module
/// docs). Plans on `view` plus `policy.pending`; nodes with pending plans
/// are left out (their load is about to change).
pub fn plan_defragment(
    view: &RegionState,
    spec: &FunctionSpec,
    policy: &PlacementPolicy<'_>,
    now: UnixMillis,
) -> Defragment {
    if !matches!(spec.tier, Tier::Guaranteed | Tier::Burstable) {
        return Defragment::Nothing(NoDefrag::Tier(spec.tier));
    }
    let (Some(_), Some(tenant)) = (view.topology(), view.tenant(&spec.tenant)) else {
        return Defragment::Nothing(NoDefrag::Gone);
    };
    let demand = Demand {
        tier: spec.tier,
        compute_milli: spec.compute_milli,
        memory_mib: spec.memory_mib,
    };
    let caps = view.caps();
    let admits = |kind: PoolKind| {
        let mut used = view.held(&spec.tenant, kind);
        if let Some(p) = policy.pending {
            used = used.saturating_add(&p.held(&spec.tenant, kind));
        }
        tenant
            .quota(kind)
            .admits(&used, &held_of([(spec.compute_milli, spec.memory_mib)]))
            .is_ok()
    };
    let admitted = [admits(PoolKind::Center), admits(PoolKind::Edge)];
    let kind_index = |k: PoolKind| usize::from(k == PoolKind::Edge);
    let loads = view.node_loads();
    let moving = Moving::of(view);

    // The nodes it may use (preference group, position), and their free
    // room in sum: a pool that is full, not fragmented, ends here.
    let mut quota_blocked = None;
    let mut nodes: Vec<(u8, usize)> = Vec::new();
    let (mut free_mib, mut free_compute, mut largest): (Mib, u64, Mib) = (0, 0, 0);
    for (pos, load) in loads.iter().enumerate() {
        let (Some(pool), Some(node)) = (view.pool_of_position(pos), view.node_name_at(pos)) else {
            continue;
        };
        let Some(g) = group(&spec.pool, &pool.name, pool.kind) else {
            continue;
        };
        if !view.takes_placements(node)
            || policy.avoid.contains(node)
            || policy.pending.is_some_and(|p| p.node(pos).is_some())
        {
            continue;
        }
        if !admitted[kind_index(pool.kind)] {
            quota_blocked.get_or_insert(pool.kind);
            continue;
        }
        for slot in &load.gpus {
            if slot.capacity.available && !slot.load.exclusive {
                let free = slot.load.free_memory(&slot.capacity);
                free_mib = free_mib.saturating_add(free);
                free_compute = free_compute.saturating_add(u64::from(slot.load.free_compute()));
                largest = largest.max(free);
            }
        }
        nodes.push((g, pos));
    }
    if nodes.is_empty() {
        if let Some(kind) = quota_blocked {
            return Defragment::Nothing(NoDefrag::Quota(kind));
        }
    }
    let short_memory = free_mib < spec.memory_mib;
    let short_compute =
        spec.tier == Tier::Guaranteed && free_compute < u64::from(spec.compute_milli);
    if short_memory || short_compute {
        return Defragment::Nothing(NoDefrag::Full {
            free_mib,
            free_compute_milli: free_compute,
        });
    }

    for g in 0..=2u8 {
        let mut options: Vec<Room<'_>> = Vec::new();
        for &(_, pos) in nodes.iter().filter(|(ng, _)| *ng == g) {
            let (Some(load), Some(node)) = (loads.get(pos), view.node_name_at(pos)) else {
                continue;
            };
            let mut scratch = load.clone();
            for (gi, slot) in load.gpus.iter().enumerate() {
                let Ok(index) = u32::try_from(gi) else {
                    continue;
                };
                if !slot.capacity.available || slot.load.exclusive {
                    continue;
                }
                // The instances on this GPU with what each asks of it.
                let on: Vec<(&Instance, Demand)> = slot
                    .instances
                    .iter()
                    .filter_map(|id| view.instance(*id))
                    .filter_map(|i| {
                        let s = i
                            .slices
                            .iter()
                            .find(|s| s.gpu.node == *node && s.gpu.index == index)?;
                        Some((i, i.demand(s)))
                    })
                    .collect();
                let mut fits_without = |gone: &[InstanceId]| {
                    let rest = GpuLoad::of(
                        on.iter()
                            .filter(|(i, _)| {
                                !gone.contains(&i.id) && !moving.leaving.contains_key(&i.id)
                            })
                            .map(|(_, d)| d),
                    );
                    scratch.gpus[gi].load = rest;
                    scratch.refresh();
                    let ok = fit(caps, &scratch, &[(index, demand)]).is_ok();
                    scratch.gpus[gi].load = slot.load;
                    scratch.refresh();
                    ok
                };
                if fits_without(&[]) {
                    return Defragment::Waiting {
                        gpu: GpuId {
                            node: node.clone(),
                            index,
                        },
                    };
                }
                let defragmenting = on
                    .iter()
                    .filter(|(i, _)| moving.leaving.get(&i.id) == Some(&MigrationCause::Defragment))
                    .count();
                let allowed = DEFRAG_MOVES_MAX.saturating_sub(defragmenting);
                let mut victims: Vec<&Instance> = on
                    .iter()
                    .map(|(i, _)| *i)
                    .filter(|i| movable(view, &moving, i, spec, now))
                    .collect();
                victims.sort_by_key(|i| (size(i), i.id));
                victims.truncate(DEFRAG_VICTIMS_PER_GPU);
                // Removing more never hurts a fit: if even every victim
                // leaving is not enough, no subset is.
                let all: Vec<InstanceId> = victims.iter().map(|i| i.id).collect();
                if allowed == 0 || all.is_empty() || !fits_without(&all) {
                    continue;
                }
                let mut alone = Vec::with_capacity(victims.len());
                for v in &victims {
                    let ok = fits_without(&[v.id]);
                    alone.push(ok);
                    if ok {
                        options.push(Room::new(vec![*v], defragmenting == 0, pos, index));
                    }
                }
                if allowed >= 2 {
                    for a in 0..victims.len() {
                        for b in a.saturating_add(1)..victims.len() {
                            let (va, vb) = (victims[a], victims[b]);
                            // Two of one function would be two migrations
                            // of it at once (one at a time is the rule).
                            if alone[a]
                                || alone[b]
                                || (va.tenant == vb.tenant && va.function == vb.function)
                            {
                                continue;
                            }
                            if fits_without(&[va.id, vb.id]) {
                                options.push(Room::new(
                                    vec![va, vb],
                                    defragmenting == 0,
                                    pos,
                                    index,
                                ));
                            }
                        }
                    }
                }
            }
        }
        options.sort_by_key(|o| o.key);
        // Victims that found no place elsewhere in their pool (by function
        // and pool: the others of it would not either) are not tried again.
        let mut stuck: BTreeSet<(&TenantId, &str, &str)> = BTreeSet::new();
        let mut planned = 0usize;
        for o in &options {
            if planned >= DEFRAG_PLANS {
                break;
            }
            if o.victims
                .iter()
                .any(|v| stuck.contains(&(&v.tenant, v.function.as_str(), v.pool.as_str())))
            {
                continue;
            }
            planned = planned.saturating_add(1);
            match plan_moves(view, &moving, spec, policy, o, now) {
                Ok(plan) => {
                    return Defragment::Move(DefragPlan {
                        free_mib,
                        free_compute_milli: free_compute,
                        largest_free_mib: largest,
                        ..plan
                    })
                }
                Err(Some(v)) => {
                    stuck.insert((&v.tenant, v.function.as_str(), v.pool.as_str()));
                }
                Err(None) => {}
            }
        }
    }
    Defragment::Nothing(NoDefrag::NoMoves)
}

/// Plans where each victim of `o` goes: in its own pool, off the GPU's
/// node and off the nodes other defragmentations clear, each around the
/// ones before it. Fails naming the victim that found no place (`None`:
/// the view changed under it).
fn plan_moves<'v>(
    view: &RegionState,
    moving: &Moving<'_>,
    spec: &FunctionSpec,
    policy: &PlacementPolicy<'_>,
    o: &Room<'v>,
    now: UnixMillis,
) -> Result<DefragPlan, Option<&'v Instance>> {
    let node: NodeId = view.node_name_at(o.pos).ok_or(None)?.clone();
    let pool = view.pool_of_position(o.pos).ok_or(None)?.name.clone();
    let mut avoid: Vec<NodeId> = policy.avoid.to_vec();
    avoid.push(node.clone());
    avoid.extend(moving.clearing.iter().cloned());
    let mut overlay = policy.pending.cloned().unwrap_or_default();
    let mut moves = Vec::with_capacity(o.victims.len());
    for v in &o.victims {
        let p = PlacementPolicy {
            pending: Some(&overlay),
            avoid: &avoid,
            ..*policy
        };
        let slices =
            plan_into(view, v, &MoveTarget::Pool(v.pool.clone()), &p, now).map_err(|_| Some(*v))?;
        let (vspec, _) = view.instance_spec(v.id).ok_or(None)?;
        overlay.reserve(view, vspec, &slices);
        let here = v.slices.first().ok_or(None)?;
        moves.push(DefragMove {
            instance: v.id,
            tenant: v.tenant.clone(),
            function: v.function.clone(),
            tier: v.tier,
            compute_milli: here.compute_milli,
            memory_mib: here.memory_mib,
            slices,
        });
    }
    Ok(DefragPlan {
        tenant: spec.tenant.clone(),
        function: spec.name.clone(),
        tier: spec.tier,
        compute_milli: spec.compute_milli,
        memory_mib: spec.memory_mib,
        gpu: GpuId { node, index: o.gpu },
        pool,
        free_mib: 0,
        free_compute_milli: 0,
        largest_free_mib: 0,
        moves,
    })
}
