//! Why the state machine refused a command. A refused command changes
//! nothing; every replica refuses it the same way.

use super::agent::AgentId;
use super::fit::GpuDimension;
use super::instance::InstanceId;
use crate::model::{GpuId, NodeId, PoolKind, QuotaDimension, TenantId};
use serde::{Deserialize, Serialize};

/// What kind of object a name belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ObjectKind {
    /// A tenant.
    Tenant,
    /// A function (per tenant).
    Function,
    /// A token id (per tenant) or a token digest (region-wide).
    Token,
    /// A node agent.
    Agent,
}

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ObjectKind::Tenant => "tenant",
            ObjectKind::Function => "function",
            ObjectKind::Token => "token",
            ObjectKind::Agent => "agent",
        })
    }
}

/// How an API should answer an [`ApplyError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The object does not exist (or is not the caller's): 404.
    NotFound,
    /// The name is taken or the state forbids it now: 409.
    Conflict,
    /// The command is malformed: 400 / 422.
    Invalid,
    /// Capacity or quota ran out: 409 with the dimension (or 429).
    Exhausted,
}

/// A command the state machine refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ApplyError {
    /// No such tenant.
    #[error("unknown tenant {tenant}")]
    UnknownTenant {
        /// The tenant named.
        tenant: TenantId,
    },
    /// No such function for this tenant (also what another tenant's function looks like).
    #[error("unknown function {name:?} of tenant {tenant}")]
    UnknownFunction {
        /// The tenant asking.
        tenant: TenantId,
        /// The function named.
        name: String,
    },
    /// No such token id for this tenant.
    #[error("unknown token {token_id:?} of tenant {tenant}")]
    UnknownToken {
        /// The tenant.
        tenant: TenantId,
        /// The token id named.
        token_id: String,
    },
    /// No such instance.
    #[error("unknown instance {instance}")]
    UnknownInstance {
        /// The instance named.
        instance: InstanceId,
    },
    /// No such agent (it must register first).
    #[error("unknown agent {agent}")]
    UnknownAgent {
        /// The agent named.
        agent: AgentId,
    },
    /// No such node in the topology.
    #[error("unknown node {node}")]
    UnknownNode {
        /// The node named.
        node: NodeId,
    },
    /// No such GPU in the topology.
    #[error("unknown GPU {gpu}")]
    UnknownGpu {
        /// The GPU named.
        gpu: GpuId,
    },
    /// No such pool (or not an edge pool) for an `edge:<pool>` preference.
    #[error("unknown edge pool {pool:?}")]
    UnknownPool {
        /// The pool named.
        pool: String,
    },
    /// The name is taken.
    #[error("{kind} {name:?} already exists")]
    DuplicateName {
        /// What kind of object.
        kind: ObjectKind,
        /// The name.
        name: String,
    },
    /// A name breaks the naming rule.
    #[error("invalid {kind} name {name:?}: 1 to 63 ASCII letters, digits, '-', '_' or '.', starting with a letter or digit")]
    InvalidName {
        /// What kind of object.
        kind: ObjectKind,
        /// The name.
        name: String,
    },
    /// A token digest is not 64 lower-case hex digits.
    #[error("a token digest is 64 lower-case hex digits (SHA-256)")]
    InvalidDigest,
    /// A function spec is invalid.
    #[error("invalid function spec: {field}: {reason}")]
    InvalidSpec {
        /// The offending field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The slices of a placement do not match the function's spec.
    #[error("slices do not match function {function:?}: {reason}")]
    SliceMismatch {
        /// The function.
        function: String,
        /// What does not match.
        reason: String,
    },
    /// No topology has been loaded yet.
    #[error("no topology loaded")]
    NoTopology,
    /// A tenant with functions cannot be deleted without `force`.
    #[error("tenant {tenant} has {functions} function(s): delete them first, or delete the tenant with force")]
    TenantHasFunctions {
        /// The tenant.
        tenant: TenantId,
        /// How many functions it has.
        functions: u32,
    },
    /// The node was removed from the topology and is draining.
    #[error("node {node} is draining")]
    NodeDraining {
        /// The node.
        node: NodeId,
    },
    /// A GPU has no room for the slice.
    #[error("GPU {gpu} is full: {dimension}")]
    GpuFull {
        /// The GPU.
        gpu: GpuId,
        /// What ran out.
        dimension: GpuDimension,
    },
    /// The tenant's quota in that pool kind would be exceeded.
    #[error("tenant {tenant} would exceed its {pool_kind} quota of {dimension}")]
    QuotaExceeded {
        /// The tenant.
        tenant: TenantId,
        /// The pool kind of the node.
        pool_kind: PoolKind,
        /// What ran out.
        dimension: QuotaDimension,
    },
    /// A quota lower than what the tenant already holds (release first).
    #[error("tenant {tenant} already holds more {dimension} in {pool_kind} pools than the new quota allows")]
    QuotaBelowHeld {
        /// The tenant.
        tenant: TenantId,
        /// The pool kind.
        pool_kind: PoolKind,
        /// The dimension the tenant holds too much of.
        dimension: QuotaDimension,
    },
    /// The function already has its most instances.
    #[error("function {function:?} already has its maximum of {max} instances")]
    MaxInstances {
        /// The function.
        function: String,
        /// Its `max_instances`.
        max: u32,
    },
    /// A price list lacks prices the topology needs.
    #[error("no price for: {}", missing.iter().map(|(m, k)| format!("{m} in {k} pools")).collect::<Vec<_>>().join(", "))]
    Unpriced {
        /// The (GPU model, pool kind) pairs without a price.
        missing: Vec<(String, PoolKind)>,
    },
    /// A usage record names a GPU model the price list has no price for.
    #[error("no price for GPU model {gpu_model:?} in {pool_kind} pools")]
    NoPrice {
        /// The GPU model.
        gpu_model: String,
        /// The pool kind.
        pool_kind: PoolKind,
    },
    /// A usage batch is malformed.
    #[error("invalid usage batch: {reason}")]
    InvalidUsage {
        /// What is wrong.
        reason: String,
    },
    /// A usage sequence number runs too far ahead of the applied prefix.
    #[error("usage sequence {seq} of agent {agent} is outside the window ending at {limit}")]
    SequenceOutOfWindow {
        /// The agent.
        agent: AgentId,
        /// The sequence number.
        seq: u64,
        /// The largest acceptable now.
        limit: u64,
    },
    /// A sum over quantities (metered usage, a counter) would overflow.
    #[error("a sum of quantities overflows")]
    Overflow,
    /// An agent's discovered GPUs disagree with the topology's node.
    #[error("node {node}: the agent's GPUs disagree with the topology: {reason}")]
    GpuMismatch {
        /// The node.
        node: NodeId,
        /// What differs.
        reason: String,
    },
    /// The idempotency key was already used for another request.
    #[error("idempotency key {key:?} was used for another request")]
    IdempotencyKeyReused {
        /// The key.
        key: String,
    },
    /// An idempotency key (or the command it is attached to) is not acceptable.
    #[error("invalid idempotency key: {reason}")]
    InvalidIdempotencyKey {
        /// What is wrong.
        reason: String,
    },
    /// An `exclusive` or `guaranteed` instance stays on the slices the
    /// region placed: it cannot be remapped by its agent.
    #[error("instance {instance} is {tier}: it stays on the slices the region placed")]
    Pinned {
        /// The instance.
        instance: InstanceId,
        /// Its tier.
        tier: crate::model::Tier,
    },
    /// A remap request does not fit the instance it names.
    #[error("instance {instance} cannot be remapped so: {reason}")]
    BadRemap {
        /// The instance.
        instance: InstanceId,
        /// What is wrong.
        reason: String,
    },
    /// The node takes no new placements: its agent is not ready, or the
    /// operator drains it.
    #[error("node {node} takes no placements: {why}")]
    NodeNotReady {
        /// The node.
        node: NodeId,
        /// Its state.
        why: String,
    },
    /// A scale-in would leave the function below its `min_instances` (one
    /// decided on an older view, or two decided on the same one). Last,
    /// to keep the encoding of the variants before it.
    #[error("function {function:?} keeps at least {min} instances of its current version")]
    MinInstances {
        /// The function.
        function: String,
        /// Its `min_instances`.
        min: u32,
    },
    /// A migration cannot start: the instance is outgoing, already
    /// migrating, or the target is on a node it holds. Last, to keep the
    /// encoding of the variants before it.
    #[error("instance {instance} cannot migrate: {reason}")]
    Migration {
        /// The instance.
        instance: InstanceId,
        /// Why.
        reason: String,
    },
    /// The tenant's kept function specs would pass
    /// [`crate::bounds::MAX_TENANT_SPEC_BYTES`]. Last, to keep the
    /// encoding of the variants before it.
    #[error("tenant {tenant} keeps {stored} bytes of function specs; {adding} more would pass the limit of {limit} (delete functions to make room)")]
    SpecStorageExceeded {
        /// The tenant.
        tenant: TenantId,
        /// Bytes it keeps now.
        stored: u64,
        /// Bytes the command would add.
        adding: u64,
        /// The limit.
        limit: u64,
    },
}

impl From<crate::serving::ServingError> for ApplyError {
    /// A bad model id, argument or environment entry is an invalid spec.
    fn from(e: crate::serving::ServingError) -> Self {
        ApplyError::InvalidSpec {
            field: e.field,
            reason: e.reason,
        }
    }
}

impl From<crate::bounds::OutOfBounds> for ApplyError {
    /// A value out of its range is an invalid spec naming the field and the bound.
    fn from(e: crate::bounds::OutOfBounds) -> Self {
        ApplyError::InvalidSpec {
            field: e.field,
            reason: format!("must be {} to {}, got {}", e.min, e.max, e.value),
        }
    }
}

impl ApplyError {
    /// The stable code an API puts in `{"error": {"code": ..}}`.
    pub fn code(&self) -> &'static str {
        match self {
            ApplyError::UnknownTenant { .. } => "unknown_tenant",
            ApplyError::UnknownFunction { .. } => "unknown_function",
            ApplyError::UnknownToken { .. } => "unknown_token",
            ApplyError::UnknownInstance { .. } => "unknown_instance",
            ApplyError::UnknownAgent { .. } => "unknown_agent",
            ApplyError::UnknownNode { .. } => "unknown_node",
            ApplyError::UnknownGpu { .. } => "unknown_gpu",
            ApplyError::UnknownPool { .. } => "unknown_pool",
            ApplyError::DuplicateName { .. } => "duplicate_name",
            ApplyError::InvalidName { .. } => "invalid_name",
            ApplyError::InvalidDigest => "invalid_token_digest",
            ApplyError::InvalidSpec { .. } => "invalid_spec",
            ApplyError::SliceMismatch { .. } => "slice_mismatch",
            ApplyError::NoTopology => "no_topology",
            ApplyError::TenantHasFunctions { .. } => "tenant_has_functions",
            ApplyError::SpecStorageExceeded { .. } => "spec_storage_exceeded",
            ApplyError::NodeDraining { .. } => "node_draining",
            ApplyError::NodeNotReady { .. } => "node_not_ready",
            ApplyError::GpuFull { .. } => "gpu_full",
            ApplyError::QuotaExceeded { .. } => "quota_exceeded",
            ApplyError::QuotaBelowHeld { .. } => "quota_below_held",
            ApplyError::MaxInstances { .. } => "max_instances",
            ApplyError::MinInstances { .. } => "min_instances",
            ApplyError::Migration { .. } => "migration_conflict",
            ApplyError::Unpriced { .. } => "unpriced",
            ApplyError::NoPrice { .. } => "no_price",
            ApplyError::InvalidUsage { .. } => "invalid_usage",
            ApplyError::SequenceOutOfWindow { .. } => "sequence_out_of_window",
            ApplyError::Overflow => "overflow",
            ApplyError::IdempotencyKeyReused { .. } => "idempotency_key_reused",
            ApplyError::InvalidIdempotencyKey { .. } => "invalid_idempotency_key",
            ApplyError::GpuMismatch { .. } => "gpu_mismatch",
            ApplyError::Pinned { .. } => "pinned",
            ApplyError::BadRemap { .. } => "bad_remap",
        }
    }

    /// Whether a plan refused with this error may succeed when planned
    /// again on a newer view: capacity, quota or `max_instances` ran out
    /// because another write landed between the plan and its apply.
    pub fn may_succeed_on_replan(&self) -> bool {
        self.class() == ErrorClass::Exhausted
    }

    /// How an API should answer it.
    pub fn class(&self) -> ErrorClass {
        match self {
            ApplyError::UnknownTenant { .. }
            | ApplyError::UnknownFunction { .. }
            | ApplyError::UnknownToken { .. }
            | ApplyError::UnknownInstance { .. }
            | ApplyError::UnknownAgent { .. }
            | ApplyError::UnknownNode { .. }
            | ApplyError::UnknownGpu { .. } => ErrorClass::NotFound,
            ApplyError::DuplicateName { .. }
            | ApplyError::NoTopology
            | ApplyError::TenantHasFunctions { .. }
            | ApplyError::SpecStorageExceeded { .. }
            | ApplyError::QuotaBelowHeld { .. }
            | ApplyError::NodeDraining { .. }
            | ApplyError::GpuMismatch { .. }
            | ApplyError::Pinned { .. }
            | ApplyError::MinInstances { .. }
            | ApplyError::Migration { .. } => ErrorClass::Conflict,
            ApplyError::GpuFull { .. }
            | ApplyError::NodeNotReady { .. }
            | ApplyError::QuotaExceeded { .. }
            | ApplyError::MaxInstances { .. } => ErrorClass::Exhausted,
            ApplyError::UnknownPool { .. }
            | ApplyError::InvalidName { .. }
            | ApplyError::InvalidDigest
            | ApplyError::InvalidSpec { .. }
            | ApplyError::SliceMismatch { .. }
            | ApplyError::Unpriced { .. }
            | ApplyError::NoPrice { .. }
            | ApplyError::InvalidUsage { .. }
            | ApplyError::SequenceOutOfWindow { .. }
            | ApplyError::Overflow
            | ApplyError::IdempotencyKeyReused { .. }
            | ApplyError::InvalidIdempotencyKey { .. }
            | ApplyError::BadRemap { .. } => ErrorClass::Invalid,
        }
    }
}
