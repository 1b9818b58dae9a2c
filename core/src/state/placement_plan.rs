//! The one seam through which the region's scheduler asks where the
//! instances of a function go: [`plan_placements`] over a read-only view,
//! with a [`PlacementPolicy`], to a [`PlacementPlan`] or a
//! [`PlanRejection`]. Today it is [`super::plan_spec_explained`] (feasibility
//! with `fit`, quota, a [`Ranking`]) once per instance; a placement engine
//! that replaces the planner fills this function and nothing else.
//!
//! ```text
//!   view (&RegionState) ─┐
//!   spec, count ─────────┼─▶ plan_placements ─▶ PlacementPlan { instances: [slices, pool, metric] }
//!   PlacementPolicy ─────┘        │     (its `prefer`: nodes with a host copy)
//!                                 └──────────▶ PlanRejection (why, what was evaluated)
//! ```
//!
//! Each instance is planned on the view plus the policy's pending plans
//! (those the scheduler proposed and that are not applied yet); each one
//! after the first also around the ones before it (reserved on a copy of
//! the pending plans), so a plan of `count` instances is one that apply
//! takes whole (it re-checks every placement with the same `fit`).

use super::pending::PendingPlans;
use super::plan::{plan_preferring, PlanOptions};
use super::plan_metric::PlanMetric;
use super::plan_rejection::PlanRejection;
use super::ranking::Ranking;
use super::region_state::{RegionState, UnixMillis};
use crate::model::{FunctionSpec, NodeId, PoolKind, Slice, TenantId};
use serde::{Deserialize, Serialize};

/// How to plan: the ranking, how much of the region to scan, and the
/// plans made but not yet applied that the view does not hold yet.
#[derive(Clone, Copy)]
pub struct PlacementPolicy<'a> {
    /// Scores candidates (lower wins).
    pub ranking: &'a dyn Ranking,
    /// The scan's limit and start, or the index.
    pub options: PlanOptions,
    /// Plans not yet applied, planned around (`None`: the view alone).
    pub pending: Option<&'a PendingPlans>,
    /// Nodes preferred for the first instance (those holding the
    /// function's weights in host memory: a warm resume): one that fits
    /// wins over the others of its pool group, whatever the ranking's
    /// score; the pool preference still comes first. Empty: no preference.
    pub prefer: &'a [NodeId],
    /// Nodes the plan must not use (a defragmentation's moves leave the
    /// node they make room on). Empty: none.
    pub avoid: &'a [NodeId],
}

impl PlacementPolicy<'_> {
    /// The instances of `tenant`'s `function` a plan of more counts: those
    /// applied in `view` plus those reserved in the pending plans (planned
    /// and proposed, not applied yet). A decision whether more are needed
    /// (a scale-out to a desired count, a function below its minimum)
    /// reads this, not the view's count alone: the planner counts the
    /// pending ones toward `max_instances`, so a second ask for what a
    /// pending plan already places would plan again (one too many) or be
    /// refused as at `max_instances` though it is being satisfied.
    pub fn instance_count(&self, view: &RegionState, tenant: &TenantId, function: &str) -> u32 {
        let pending = self.pending.map_or(0, |p| p.count(tenant, function));
        view.instance_count(tenant, function)
            .saturating_add(pending)
    }
}

/// Where one instance goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedInstance {
    /// The pool of its node.
    pub pool: String,
    /// That pool's kind.
    pub pool_kind: PoolKind,
    /// Its slices.
    pub slices: Vec<Slice>,
    /// The ranking's score (lower is better).
    pub score: i64,
    /// What the plan evaluated and passed over.
    pub metric: PlanMetric,
}

/// Where every instance asked for goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementPlan {
    /// One per instance, in order.
    pub instances: Vec<PlannedInstance>,
}

impl PlacementPlan {
    /// The slices of each instance (a `FunctionCreate`'s placements).
    pub fn placements(&self) -> Vec<Vec<Slice>> {
        self.instances.iter().map(|i| i.slices.clone()).collect()
    }
}

/// Plans `count` more instances of `spec` (deployed or not) on `view`.
/// `now` is the scheduler's clock (the planner itself reads no time).
pub fn plan_placements(
    view: &RegionState,
    spec: &FunctionSpec,
    count: u32,
    policy: &PlacementPolicy<'_>,
    _now: UnixMillis,
) -> Result<PlacementPlan, Box<PlanRejection>> {
    let mut instances = Vec::new();
    let one = |pending: Option<&PendingPlans>, k: u32| {
        let options = PlanOptions {
            start: policy.options.start.wrapping_add(k as usize),
            ..policy.options
        };
        let prefer = if k == 0 { policy.prefer } else { &[] };
        plan_preferring(
            view,
            pending,
            spec,
            policy.ranking,
            &options,
            prefer,
            policy.avoid,
        )
    };
    if count <= 1 {
        if count == 1 {
            let (p, metric) = one(policy.pending, 0)?;
            instances.push(PlannedInstance {
                pool: p.pool,
                pool_kind: p.pool_kind,
                slices: p.slices,
                score: p.score,
                metric,
            });
        }
        return Ok(PlacementPlan { instances });
    }
    // Later instances are planned around the earlier ones, reserved on a
    // copy of the pending plans (nothing outside this function sees it).
    let mut pending = policy.pending.cloned().unwrap_or_default();
    for k in 0..count {
        let (p, metric) = one(Some(&pending), k)?;
        pending.reserve(view, spec, &p.slices);
        instances.push(PlannedInstance {
            pool: p.pool,
            pool_kind: p.pool_kind,
            slices: p.slices,
            score: p.score,
            metric,
        });
    }
    Ok(PlacementPlan { instances })
}
