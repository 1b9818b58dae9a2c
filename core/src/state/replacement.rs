//! The roll of a reshaping update, one outgoing instance at a time:
//! [`plan_replacement`] decides, on a read-only view, how the instance is
//! replaced by one of its function's current version. [`plan_evacuation`]
//! decides the same for an instance on a node that is not ready or
//! drained (a drain makes first as a migration, [`Replacement::Migrate`]).
//!
//! ```text
//!   outgoing instance ─▶ plan_replacement ─▶ Migrate(slices)    InstanceMigrate (cause roll): the
//!                            │                                  migration tick releases the old
//!                            │                                  one once the new one is ready
//!                            ├─────────────▶ Move(slices)       no room for both (capacity or
//!                            │                                  quota): InstanceReplace, one step
//!                            ├─────────────▶ Release            max_instances current ones exist
//!                            └─────────────▶ Nothing            gone, not outgoing any more, or
//!                                                               a side of a migration already
//! ```

use super::command::DomainCommand;
use super::instance::InstanceId;
use super::migration::MigrationCause;
use super::placement_plan::{plan_placements, PlacementPolicy};
use super::plan_rejection::{PlanRejection, RejectReason};
use super::region_state::{RegionState, UnixMillis};
use crate::model::{Quota, Slice};
use serde::{Deserialize, Serialize};

/// How one outgoing instance is replaced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Replacement {
    /// Capacity or the tenant's quota has no room for both: move the old
    /// one to these slices in one step (`InstanceReplace`), so the function
    /// has one instance fewer while the new one loads (break-before-make
    /// for this instance).
    Move(Vec<Slice>),
    /// The function already has `max_instances` current ones: release the
    /// old one.
    Release,
    /// The instance is gone, runs the current version, or is a side of a
    /// migration already (which the migration tick ends): nothing to do.
    Nothing,
    /// Make-before-break: a new instance on these slices as a migration
    /// of this cause (`InstanceMigrate`: `drain`, or `roll`, whose new
    /// instance runs the current version), which the leader's migration
    /// tick ends (the old one released once the new one is ready).
    /// Recorded in the replicated state, so a new leader ends it instead
    /// of placing a second replacement.
    Migrate(Vec<Slice>, MigrationCause),
}

impl Replacement {
    /// The domain command that carries it out for `instance` (`None` for
    /// [`Replacement::Nothing`], or an instance `view` no longer has).
    pub fn command(&self, view: &RegionState, instance: InstanceId) -> Option<DomainCommand> {
        view.instance(instance)?;
        match self {
            Replacement::Move(slices) => Some(DomainCommand::InstanceReplace {
                instance,
                slices: slices.clone(),
            }),
            Replacement::Release => Some(DomainCommand::InstanceRelease { instance }),
            Replacement::Migrate(slices, cause) => Some(DomainCommand::InstanceMigrate {
                instance,
                slices: slices.clone(),
                cause: *cause,
            }),
            Replacement::Nothing => None,
        }
    }
}

/// Decides how outgoing `instance` is replaced on `view` (see the module
/// docs). A make-first plan is tried first, with the policy's pending
/// plans; where it finds no room, a move is planned on a copy of the view
/// without the old instance (its slices and quota free), without the
/// pending plans (apply re-checks the move with the same `fit`). The
/// rejection is the move's: what keeps even a one-step replacement out.
pub fn plan_replacement(
    view: &RegionState,
    instance: InstanceId,
    policy: &PlacementPolicy<'_>,
    now: UnixMillis,
) -> Result<Replacement, Box<PlanRejection>> {
    let Some((inst, f)) = with_function(view, instance) else {
        return Ok(Replacement::Nothing);
    };
    // Current, or being replaced already (a new leader finds the roll's
    // migration in the state and lets the migration tick end it).
    if inst.version == f.version || view.migration_of(instance).is_some() {
        return Ok(Replacement::Nothing);
    }
    // Released only on what the view holds: pending plans count moves of
    // current instances too, which keep the count, and a release cannot
    // be undone (a replacement refused on a pending scale-out is planned
    // again and released then).
    if view.instance_count(&inst.tenant, &inst.function) >= f.spec.max_instances {
        return Ok(Replacement::Release);
    }
    if let Ok(plan) = plan_placements(view, &f.spec, 1, policy, now) {
        if let Some(slices) = plan.placements().pop() {
            return Ok(Replacement::Migrate(slices, MigrationCause::Roll));
        }
    }
    let alone = PlacementPolicy {
        pending: None,
        prefer: &[],
        ..*policy
    };
    move_without(view, instance, &f.spec, &alone, now)
}

/// Decides where `instance`, on a node that is not ready or drained, goes
/// (the leader's answer to such a node). With `make_first` (a drain) a
/// new instance is placed beside it first as a migration
/// ([`Replacement::Migrate`], counted once against `max_instances`) where
/// capacity and the tenant's quota have room for both; otherwise it moves
/// in one step ([`Replacement::Move`]). An outgoing instance (a reshaping
/// update's roll has not reached it) is replaced by the current version
/// (a `roll` migration, or a move), or released where the function has
/// `max_instances` current instances already, as the roll does. The view still
/// counts the old instance against the tenant's quota while apply's
/// `InstanceReplace` releases it first, so a move that the quota (or
/// `max_instances`) refuses on the view is planned again on a copy of the
/// view without it: a tenant at its quota still has its instances moved
/// off a lost node. On a drained node it does so only while none of the
/// tenant's other instances there is making its replacement first (a
/// migration in progress) and no plan of the batches being committed holds
/// the tenant's quota of the refused pool kind (or a place of the function
/// under `max_instances`); otherwise it gets the refusal and is planned
/// again on the next tick, when their quota may be free for it to make
/// first too. Any other
/// rejection (no GPU has room) is the answer.
pub fn plan_evacuation(
    view: &RegionState,
    instance: InstanceId,
    make_first: bool,
    policy: &PlacementPolicy<'_>,
    now: UnixMillis,
) -> Result<Replacement, Box<PlanRejection>> {
    let Some((inst, f)) = with_function(view, instance) else {
        return Ok(Replacement::Nothing);
    };
    // An outgoing instance is not counted; what replaces it (the current
    // version) is: like the roll, it just goes where `max_instances`
    // current ones exist. A current one's move or migration keeps the
    // count.
    let outgoing = inst.version != f.version;
    let mut spec = f.spec.clone();
    if outgoing {
        // (On the view alone, as `plan_replacement` releases.)
        if view.instance_count(&inst.tenant, &inst.function) >= f.spec.max_instances {
            return Ok(Replacement::Release);
        }
    } else {
        spec.max_instances = spec.max_instances.saturating_add(1);
    }
    match plan_placements(view, &spec, 1, policy, now) {
        Ok(plan) => Ok(plan
            .placements()
            .pop()
            .map_or(Replacement::Nothing, |slices| {
                if make_first {
                    // An outgoing instance (a reshaping update's roll has
                    // not reached it) is replaced by one of the current
                    // version: a roll's migration.
                    let cause = if outgoing {
                        MigrationCause::Roll
                    } else {
                        MigrationCause::Drain
                    };
                    Replacement::Migrate(slices, cause)
                } else {
                    Replacement::Move(slices)
                }
            })),
        Err(r)
            if matches!(
                r.reason,
                RejectReason::Quota { .. } | RejectReason::MaxInstances { .. }
            ) =>
        {
            // The tenant's other instances on the drained node may be
            // making their replacement first right now, holding quota (or
            // a place under `max_instances`) until their migration ends
            // (within MUST_FINISH_AFTER_MS), or have a plan of this batch
            // still pending: this one waits for that (a refusal, planned
            // again on the next tick) and may then make first too. With
            // none of them in flight, nothing will free the room soon: it
            // moves in one step now. (It waited for any lower-numbered
            // sibling before, forever where that one could not move.)
            if make_first && sibling_in_flight(view, inst, &r.reason, policy) {
                return Err(r);
            }
            move_without(view, instance, &f.spec, policy, now)
        }
        Err(r) => Err(r),
    }
}

/// Whether another instance of `inst`'s tenant on a node of `inst`'s is
/// the old side of a migration in progress (making its replacement
/// first), or a plan pending in `policy` (of the batches being committed)
/// holds what refused `inst`'s: quota of the tenant in the refused pool
/// kind, or a place of the function under `max_instances`.
fn sibling_in_flight(
    view: &RegionState,
    inst: &super::instance::Instance,
    refused: &RejectReason,
    policy: &PlacementPolicy<'_>,
) -> bool {
    let pending = policy.pending.is_some_and(|p| match refused {
        RejectReason::Quota { pool_kind, .. } => {
            p.held(&inst.tenant, *pool_kind) != Quota::default()
        }
        _ => p.count(&inst.tenant, &inst.function) > 0,
    });
    pending
        || inst.slices.iter().any(|s| {
            view.instances_on(&s.gpu.node).any(|o| {
                o.tenant == inst.tenant
                    && o.id != inst.id
                    && view.migration_of(o.id).is_some_and(|m| m.from == o.id)
            })
        })
}

/// Instance `instance` of `view` and its function's record (`None`: gone).
fn with_function(
    view: &RegionState,
    instance: InstanceId,
) -> Option<(
    &super::instance::Instance,
    &super::function_record::FunctionRecord,
)> {
    let inst = view.instance(instance)?;
    Some((inst, view.function(&inst.tenant, &inst.function).ok()?))
}

/// A one-step move of `instance` planned on a copy of `view` without it
/// (its slices and its share of the quota free), as apply checks an
/// `InstanceReplace`.
fn move_without(
    view: &RegionState,
    instance: InstanceId,
    spec: &crate::model::FunctionSpec,
    policy: &PlacementPolicy<'_>,
    now: UnixMillis,
) -> Result<Replacement, Box<PlanRejection>> {
    let mut without = view.clone();
    if without
        .apply(DomainCommand::InstanceRelease { instance }, now)
        .is_err()
    {
        return Ok(Replacement::Nothing);
    }
    let plan = plan_placements(&without, spec, 1, policy, now)?;
    Ok(plan
        .placements()
        .pop()
        .map_or(Replacement::Nothing, Replacement::Move))
}
