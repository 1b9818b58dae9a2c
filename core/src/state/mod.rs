//! The region's replicated domain state: what the Raft state machine
//! applies, as pure data in and result out (no openraft here).
//!
//! ```text
//!   API / leader services ──DomainCommand──▶ Raft log ──▶ RegionState::apply(cmd, now)
//!        ▲                                                   │  re-checks fit + quota
//!        │ plan::plan(&state, ..) ─▶ Proposal ─▶ InstancePlace│  (same `fit` as the planner)
//!        │                                                   ▼
//!        └──────────── reads: function(tenant, name), bill(..), underplaced() ◀── Applied | ApplyError
//! ```
//!
//! - [`fit`]: the one capacity rule per tier (exclusive, guaranteed,
//!   burstable, oversubscribed) with the oversubscription caps.
//! - [`RegionState`]: tenants and token digests, quotas, price history,
//!   topology and drained nodes, functions, instances, agents, usage
//!   dedupe, the tenants' idempotency keys and the meter. Serializable for
//!   snapshots.
//! - [`plan()`]: the leader's placement proposal, or why there is none.
//! - [`Bill`]: metered usage × price, integers only.
//!
//! The rules are written out in `docs/domain.md`.
//!
//! Arithmetic here is checked (`clippy::arithmetic_side_effects` is denied
//! in every non-test file of this module): a sum over quantities that would
//! overflow is refused with a typed error, and `apply` never panics.

#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]

mod agent;
mod applied;
mod bill;
mod command;
mod defragment;
mod drained_node;
mod error;
mod fit;
mod free_index;
mod function_record;
mod idempotency;
mod index;
mod instance;
mod meter;
mod migration;
mod migration_plan;
mod node_gpus;
mod node_status;
mod pending;
mod placement_plan;
mod plan;
mod plan_metric;
mod plan_rejection;
mod price_history;
mod query_error;
mod ranking;
mod region_state;
mod replacement;
mod scale_in;
mod sequence;
mod tenant_record;

#[cfg(test)]
mod arith_tests;
#[cfg(test)]
mod tests;

pub use agent::{AgentId, AgentRecord};
pub use applied::{Applied, PlacedInstance};
pub use bill::{Bill, BillLine, FunctionUsage};
pub use command::{DomainCommand, UsageRecord, MAX_USAGE_BATCH};
pub use defragment::{
    plan_defragment, DefragMove, DefragPlan, Defragment, NoDefrag, DEFRAG_MOVES_MAX, DEFRAG_PLANS,
    DEFRAG_VICTIMS_PER_GPU, DEFRAG_VICTIM_MIN_AGE_MS,
};
pub use drained_node::DrainedNode;
pub use error::{ApplyError, ErrorClass, ObjectKind};
pub use fit::{
    check_gpu, check_node, fit, fit_gpu, Demand, FitFailure, GpuCapacity, GpuDimension, GpuLoad,
    GpuSlot, NodeLoad, SharingCaps,
};
pub use function_record::FunctionRecord;
pub use idempotency::{
    is_valid_key, IdempotencyTable, KeyLookup, KeyRecord, TenantKeys, KEY_WINDOW_MS,
    MAX_FINGERPRINT_LEN, MAX_KEYS_PER_TENANT, MAX_KEY_LEN,
};
pub use instance::{Instance, InstanceId};
pub use meter::{Meter, MeterKey, MeterLine, HOUR_MS};
pub use migration::{
    give_up_after, migration_steps, note_migrations_seen, Migration, MigrationCause, MigrationStep,
    MUST_FINISH_AFTER_MS,
};
pub use migration_plan::{plan_move, plan_returns, return_target, spilled, MoveError, MoveTarget};
pub use node_gpus::{
    check_reported_gpus, same_memory, same_model, usage_as_configured, MEMORY_TOLERANCE_PCT,
};
pub use node_status::{
    liveness_changes, LivenessChange, LivenessRules, NodeState, NodeStatus,
    DEFAULT_AGENT_JOIN_GRACE_S, DEFAULT_NODE_READY_GRACE_MS, DEFAULT_NODE_REPLACE_GRACE_MS,
};
pub use pending::{PendingPlans, PlanTicket};
pub use placement_plan::{plan_placements, PlacementPlan, PlacementPolicy, PlannedInstance};
pub use plan::{
    no_allowed_pool, plan, plan_on, plan_spec, plan_spec_explained, plan_spec_with, unsatisfiable,
    PlanOptions, Proposal,
};
pub use plan_metric::PlanMetric;
pub use plan_rejection::{PlanRejection, RejectReason};
pub use price_history::{PriceEpoch, PriceHistory};
pub use query_error::QueryError;
pub use ranking::{
    deployed_shapes, BestFit, FgdRanking, GshareRanking, Ranking, RegionRanking, MAX_SHAPES,
};
pub use region_state::{
    RegionState, RegionStateV1, UnixMillis, MAX_GPUS_PER_INSTANCE, MAX_LABEL_LEN,
};
pub use replacement::{plan_evacuation, plan_replacement, Replacement};
pub use sequence::{SequenceCursor, MAX_SEQUENCE_AHEAD};
pub use tenant_record::{TenantRecord, TokenRecord};
