//! Where a migration goes: an operator's move to a pool or a node
//! ([`plan_move`]), and the instances that spilled out of their preferred
//! pool and can go back now ([`plan_returns`]). Both plan on a read-only
//! view with the placement policy of every other plan; apply re-checks
//! the `InstanceMigrate` with the same `fit`.
//!
//! ```text
//!   move <fn> --to edge-a | center | node:c2
//!      MoveTarget::parse(topology, word)
//!      per instance not in the target: plan_move ─▶ slices in the target | MoveError
//!   every migration tick (leader):
//!      plan_returns(view, policy, calm) ─▶ (instance, slices) for at most one
//!      instance per function whose preferred pool has room again
//! ```

use super::instance::{Instance, InstanceId};
use super::placement_plan::{plan_placements, PlacementPolicy};
use super::plan_rejection::PlanRejection;
use super::region_state::{RegionState, UnixMillis};
use crate::config::Topology;
use crate::model::{FunctionSpec, NodeId, PoolKind, PoolPreference, Slice, TenantId};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Where an operator moves a function's instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveTarget {
    /// Any node of this pool.
    Pool(String),
    /// Any node of a center pool.
    Center,
    /// This node.
    Node(NodeId),
}

impl fmt::Display for MoveTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MoveTarget::Pool(p) => write!(f, "pool {p}"),
            MoveTarget::Center => f.write_str("the center pools"),
            MoveTarget::Node(n) => write!(f, "node {n}"),
        }
    }
}

impl MoveTarget {
    /// Reads `word`: `center`, `pool:<name>`, `node:<name>`, or a bare
    /// name of a pool or a node of `topology` (one that names both must
    /// say which).
    pub fn parse(topology: &Topology, word: &str) -> Result<Self, String> {
        let pool = |p: &str| {
            topology
                .pool(p)
                .map(|_| MoveTarget::Pool(p.to_string()))
                .ok_or_else(|| format!("no pool {p:?} in the topology"))
        };
        let node = |n: &str| {
            topology
                .node(n)
                .map(|_| MoveTarget::Node(NodeId(n.to_string())))
                .ok_or_else(|| format!("no node {n:?} in the topology"))
        };
        if word == "center" {
            return Ok(MoveTarget::Center);
        }
        if let Some(p) = word.strip_prefix("pool:") {
            return pool(p);
        }
        if let Some(n) = word.strip_prefix("node:") {
            return node(n);
        }
        match (pool(word), node(word)) {
            (Ok(_), Ok(_)) => Err(format!(
                "{word:?} names a pool and a node: write pool:{word} or node:{word}"
            )),
            (Ok(p), Err(_)) | (Err(_), Ok(p)) => Ok(p),
            (Err(_), Err(_)) => Err(format!(
                "{word:?} is no pool or node of the topology (write center, a pool, node:<name> or pool:<name>)"
            )),
        }
    }

    /// Whether `instance` is in the target already.
    pub fn holds(&self, instance: &Instance) -> bool {
        match self {
            MoveTarget::Pool(p) => instance.pool == *p,
            MoveTarget::Center => instance.pool_kind == PoolKind::Center,
            MoveTarget::Node(n) => instance.slices.iter().all(|s| s.gpu.node == *n),
        }
    }

    /// The pool preference that plans inside the target (the pool of a
    /// node, a center pool first), and the nodes preferred in it.
    fn preference(&self, topology: &Topology) -> (PoolPreference, Vec<NodeId>) {
        let of_pool = |p: &crate::config::Pool| match p.kind {
            PoolKind::Edge => (PoolPreference::Edge(p.name.clone()), Vec::new()),
            PoolKind::Center => (
                PoolPreference::Center,
                p.nodes.iter().map(|n| n.name.clone()).collect(),
            ),
        };
        match self {
            MoveTarget::Center => (PoolPreference::Center, Vec::new()),
            MoveTarget::Pool(p) => topology
                .pool(p)
                .map_or((PoolPreference::Edge(p.clone()), Vec::new()), of_pool),
            MoveTarget::Node(n) => {
                let pref = topology
                    .pool_of(&n.0)
                    .map_or(PoolPreference::Any, |p| of_pool(p).0);
                (pref, vec![n.clone()])
            }
        }
    }
}

/// Why an instance cannot move to a target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MoveError {
    /// No such instance (or its function is gone).
    #[error("instance {0} is gone")]
    Gone(InstanceId),
    /// It is in the target already.
    #[error("instance {instance} is on {target} already")]
    AlreadyThere {
        /// The instance.
        instance: InstanceId,
        /// The target, in words.
        target: String,
    },
    /// No place anywhere (the planner's rejection).
    #[error(transparent)]
    Rejected(Box<PlanRejection>),
    /// There is room, but not in the target.
    #[error(
        "{target} has no room for another instance of {function} (the best place is {elsewhere})"
    )]
    NoRoom {
        /// The function.
        function: String,
        /// The target, in words.
        target: String,
        /// Where the planner would put one instead.
        elsewhere: String,
    },
}

/// Where `instance` would go in `target`: slices on a node of it other
/// than the ones it holds (the function's own spec, counted once).
pub fn plan_move(
    view: &RegionState,
    instance: InstanceId,
    target: &MoveTarget,
    policy: &PlacementPolicy<'_>,
    now: UnixMillis,
) -> Result<Vec<Slice>, MoveError> {
    let inst = view.instance(instance).ok_or(MoveError::Gone(instance))?;
    if target.holds(inst) {
        return Err(MoveError::AlreadyThere {
            instance,
            target: target.to_string(),
        });
    }
    plan_into(view, inst, target, policy, now)
}

/// Slices in `target` for another instance of `inst`'s function, counted
/// once with `inst` (the body of [`plan_move`], which first refuses an
/// instance in the target already; a defragmentation moves instances
/// inside their own pool).
pub(crate) fn plan_into(
    view: &RegionState,
    inst: &Instance,
    target: &MoveTarget,
    policy: &PlacementPolicy<'_>,
    now: UnixMillis,
) -> Result<Vec<Slice>, MoveError> {
    let gone = || MoveError::Gone(inst.id);
    let f = view
        .function(&inst.tenant, &inst.function)
        .map_err(|_| gone())?;
    let topology = view.topology().ok_or_else(gone)?;
    let (pool, prefer) = target.preference(topology);
    let spec = FunctionSpec {
        pool,
        max_instances: f.spec.max_instances.saturating_add(1),
        ..f.spec.clone()
    };
    let policy = PlacementPolicy {
        prefer: &prefer,
        ..*policy
    };
    let plan = plan_placements(view, &spec, 1, &policy, now).map_err(MoveError::Rejected)?;
    let placed = plan.instances.into_iter().next().ok_or_else(gone)?;
    let node = placed.slices.first().map(|s| s.gpu.node.clone());
    let inside = match target {
        MoveTarget::Pool(p) => placed.pool == *p,
        MoveTarget::Center => placed.pool_kind == PoolKind::Center,
        MoveTarget::Node(n) => node.as_ref() == Some(n),
    };
    if !inside {
        return Err(MoveError::NoRoom {
            function: inst.function.clone(),
            target: target.to_string(),
            elsewhere: node.map_or_else(|| placed.pool.clone(), |n| format!("node {n}")),
        });
    }
    Ok(placed.slices)
}

/// Whether `instance` runs outside the first choice of its function's
/// pool preference (`edge:<p>`: outside pool p; `center`: at the edge).
pub fn spilled(pref: &PoolPreference, instance: &Instance) -> bool {
    match pref {
        PoolPreference::Edge(p) => instance.pool != *p,
        PoolPreference::Center => instance.pool_kind != PoolKind::Center,
        _ => false,
    }
}

/// The first choice of `pref` as a move target (`None`: no preference).
pub fn return_target(pref: &PoolPreference) -> Option<MoveTarget> {
    match pref {
        PoolPreference::Edge(p) => Some(MoveTarget::Pool(p.clone())),
        PoolPreference::Center => Some(MoveTarget::Center),
        _ => None,
    }
}

/// Plans [`plan_returns`] makes per return it may start.
pub const RETURN_PLANS_PER_RETURN: usize = 8;

/// The instances that spilled out of their function's preferred pool and
/// can go back now, with the slices there: at most one per function,
/// the oldest spilled, and at most `limit` in all. Left out: functions
/// with a migration in progress, those `calm` says are busy (a spill
/// under load is how a pool sheds), outgoing instances (the roll
/// replaces them), instances an operator placed, and instances placed
/// less than `min_age_ms` ago (a spill under load does not bounce back
/// the moment the load dips).
pub fn plan_returns(
    view: &RegionState,
    policy: &PlacementPolicy<'_>,
    calm: &dyn Fn(&TenantId, &str) -> bool,
    now: UnixMillis,
    min_age_ms: u64,
    limit: usize,
) -> Vec<(InstanceId, Vec<Slice>)> {
    // Candidates first (no planning), then plans for at most
    // RETURN_PLANS_PER_RETURN × `limit` of them, starting at an offset
    // that moves with `now` (seconds), so that functions that cannot
    // return do not keep the others from being looked at.
    let mut candidates: Vec<(&Instance, MoveTarget)> = Vec::new();
    for f in view.functions() {
        let Some(target) = return_target(&f.spec.pool) else {
            continue;
        };
        let (tenant, name) = (&f.spec.tenant, f.spec.name.as_str());
        let oldest = view
            .instances_of(tenant, name)
            .filter(|i| i.version == f.version && !view.operator_placed(i.id))
            .filter(|i| spilled(&f.spec.pool, i))
            .filter(|i| now.saturating_sub(i.placed_at) >= min_age_ms)
            .min_by_key(|i| (i.placed_at, i.id));
        if let Some(i) = oldest {
            if !view.migrating(tenant, name) && calm(tenant, name) {
                candidates.push((i, target));
            }
        }
    }
    let mut out = Vec::new();
    if candidates.is_empty() || limit == 0 {
        return out;
    }
    let offset = now
        .checked_div(1000)
        .and_then(|s| usize::try_from(s).ok())
        .and_then(|s| s.checked_rem(candidates.len()))
        .unwrap_or(0);
    candidates.rotate_left(offset);
    let attempts = limit.saturating_mul(RETURN_PLANS_PER_RETURN);
    for (i, target) in candidates.into_iter().take(attempts) {
        if out.len() >= limit {
            break;
        }
        if let Ok(slices) = plan_move(view, i.id, &target, policy, now) {
            out.push((i.id, slices));
        }
    }
    out
}
