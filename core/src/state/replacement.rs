//! The roll of a reshaping update, one outgoing instance at a time:
//! [`plan_replacement`] decides, on a read-only view, how the instance is
//! replaced by one of its function's current version.
//!
//! ```text
//!   outgoing instance ─▶ plan_replacement ─▶ MakeFirst(slices)  InstancePlace; the leader waits
//!                            │                                  until it is resident, then
//!                            │                                  InstanceRelease of the old one
//!                            ├─────────────▶ Move(slices)       no room for both (capacity or
//!                            │                                  quota): InstanceReplace, one step
//!                            ├─────────────▶ Release            max_instances current ones exist
//!                            └─────────────▶ Nothing            gone, or not outgoing any more
//! ```

use super::command::DomainCommand;
use super::instance::InstanceId;
use super::placement_plan::{plan_placements, PlacementPolicy};
use super::plan_rejection::PlanRejection;
use super::region_state::{RegionState, UnixMillis};
use crate::model::Slice;
use serde::{Deserialize, Serialize};

/// How one outgoing instance is replaced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Replacement {
    /// Place a current-version instance on these slices beside the old one
    /// (make-before-break): the old one is released once the new one is
    /// resident.
    MakeFirst(Vec<Slice>),
    /// Capacity or the tenant's quota has no room for both: move the old
    /// one to these slices in one step (`InstanceReplace`), so the function
    /// has one instance fewer while the new one loads (break-before-make
    /// for this instance).
    Move(Vec<Slice>),
    /// The function already has `max_instances` current ones: release the
    /// old one.
    Release,
    /// The instance is gone or runs the current version: nothing to do.
    Nothing,
}

impl Replacement {
    /// The domain command that carries it out for `instance` (`None` for
    /// [`Replacement::Nothing`]).
    pub fn command(&self, view: &RegionState, instance: InstanceId) -> Option<DomainCommand> {
        let inst = view.instance(instance)?;
        match self {
            Replacement::MakeFirst(slices) => Some(DomainCommand::InstancePlace {
                tenant: inst.tenant.clone(),
                function: inst.function.clone(),
                slices: slices.clone(),
            }),
            Replacement::Move(slices) => Some(DomainCommand::InstanceReplace {
                instance,
                slices: slices.clone(),
            }),
            Replacement::Release => Some(DomainCommand::InstanceRelease { instance }),
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
    let Some(inst) = view.instance(instance) else {
        return Ok(Replacement::Nothing);
    };
    let Ok(f) = view.function(&inst.tenant, &inst.function) else {
        return Ok(Replacement::Nothing);
    };
    if inst.version == f.version {
        return Ok(Replacement::Nothing);
    }
    let pending = policy
        .pending
        .map_or(0, |p| p.count(&inst.tenant, &inst.function));
    let current = view
        .instance_count(&inst.tenant, &inst.function)
        .saturating_add(pending);
    if current >= f.spec.max_instances {
        return Ok(Replacement::Release);
    }
    if let Ok(plan) = plan_placements(view, &f.spec, 1, policy, now) {
        if let Some(slices) = plan.placements().pop() {
            return Ok(Replacement::MakeFirst(slices));
        }
    }
    let mut without = view.clone();
    if without
        .apply(DomainCommand::InstanceRelease { instance }, now)
        .is_err()
    {
        return Ok(Replacement::Nothing);
    }
    let alone = PlacementPolicy {
        pending: None,
        prefer: &[],
        ..*policy
    };
    let plan = plan_placements(&without, &f.spec, 1, &alone, now)?;
    Ok(plan
        .placements()
        .pop()
        .map_or(Replacement::Nothing, Replacement::Move))
}
