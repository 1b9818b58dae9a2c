//! The domain commands the region's state machine applies.
//!
//! Plain serde types (no `flatten`, `untagged`, `skip_serializing_if`), so
//! they encode with bincode 2 as well as JSON. Secrets never appear here:
//! a token is carried as the SHA-256 digest the API layer computed.
//!
//! ```text
//!   operator ─▶ TenantCreate/Update/Delete, TokenIssue/Revoke, QuotaSet, PriceListSet, TopologyLoad
//!   tenant   ─▶ FunctionDeploy/Update/Delete
//!   leader   ─▶ InstancePlace (from plan()), InstanceRelease, InstanceReplace,
//!               InstanceScaleIn (autoscaler), NodeReadySet (liveness),
//!               InstanceMigrate, MigrationEnd (make-before-break moves)
//!   operator ─▶ NodeDrainSet
//!   agent    ─▶ AgentRegister, UsageBatch,
//!               InstanceSliceReserve / InstanceSliceRelease (a remap, two phases)
//! ```

use super::agent::AgentId;
use super::instance::InstanceId;
use crate::config::{LegacyTopology, PriceList, Topology};
use crate::model::{FunctionSpec, NodeId, PoolKind, Quota, Slice, TenantId, Tier};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most records one usage batch may carry.
pub const MAX_USAGE_BATCH: usize = 10_000;

/// One change to the region's domain state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DomainCommand {
    /// Creates a tenant (operator).
    TenantCreate {
        /// Its name.
        tenant: TenantId,
        /// Name for humans.
        display_name: Option<String>,
        /// Quota per pool kind (absent kinds: zero).
        quotas: BTreeMap<PoolKind, Quota>,
    },
    /// Changes a tenant's display name and, if given, replaces all its quotas.
    TenantUpdate {
        /// The tenant.
        tenant: TenantId,
        /// New display name (`None` clears it).
        display_name: Option<String>,
        /// New quotas for every pool kind, or `None` to keep them.
        quotas: Option<BTreeMap<PoolKind, Quota>>,
    },
    /// Records a new token for a tenant by its digest.
    TokenIssue {
        /// The tenant.
        tenant: TenantId,
        /// The token's public id (a name, shown in listings).
        token_id: String,
        /// SHA-256 of the secret, 64 lower-case hex digits.
        digest: String,
    },
    /// Forgets a token.
    TokenRevoke {
        /// The tenant.
        tenant: TenantId,
        /// The token's public id.
        token_id: String,
    },
    /// Sets a tenant's quota in one pool kind.
    QuotaSet {
        /// The tenant.
        tenant: TenantId,
        /// The pool kind.
        pool_kind: PoolKind,
        /// The new quota.
        quota: Quota,
    },
    /// Replaces the price list from now on (usage already metered keeps
    /// the prices in force when it ended).
    PriceListSet {
        /// The new list; it must price every GPU model of the topology in
        /// every pool kind where it runs.
        list: PriceList,
    },
    /// [`DomainCommand::TopologyLoad`] as written before topologies had a
    /// `[placement]` policy (older logs; it loads the default policy).
    TopologyLoadV1 {
        /// The validated topology, in the older serialized form.
        topology: LegacyTopology,
    },
    /// Deploys a new function (names are per tenant).
    FunctionDeploy {
        /// The spec; `spec.tenant` is the owner.
        spec: FunctionSpec,
    },
    /// Updates a deployed function.
    FunctionUpdate {
        /// The new spec; `spec.tenant` and `spec.name` select the function.
        spec: FunctionSpec,
    },
    /// Deletes a function and releases its instances.
    FunctionDelete {
        /// The owner.
        tenant: TenantId,
        /// The function's name.
        name: String,
    },
    /// Places one instance (a proposal from [`super::plan()`]); re-checked on apply.
    InstancePlace {
        /// The owner.
        tenant: TenantId,
        /// The function's name.
        function: String,
        /// The slices: one, or whole GPUs of one node for `exclusive`.
        slices: Vec<Slice>,
    },
    /// Releases one instance (a drain's or replacement's old one, an
    /// outgoing one): no `min_instances` check, its replacement is placed.
    InstanceRelease {
        /// The instance.
        instance: InstanceId,
    },
    /// Registers (or re-registers) a node agent.
    AgentRegister {
        /// The agent's stable id.
        agent: AgentId,
        /// The node it runs on (must be in the topology, not drained).
        node: NodeId,
        /// The agent's version.
        version: String,
    },
    /// Applies metered usage from one agent, exactly once per sequence number.
    UsageBatch {
        /// The sending agent.
        agent: AgentId,
        /// The records (at most [`MAX_USAGE_BATCH`]).
        records: Vec<UsageRecord>,
    },
    /// Deploys a function and places its first instances in one step: the
    /// deploy and every placement take effect, or none does (each placement
    /// is re-checked like an [`DomainCommand::InstancePlace`]).
    FunctionCreate {
        /// The spec; `spec.tenant` is the owner.
        spec: FunctionSpec,
        /// The slices of each instance to place.
        placements: Vec<Vec<Slice>>,
    },
    /// Applies `command` at most once per `(tenant, key)`: under a key
    /// already recorded it returns the recorded outcome and changes nothing
    /// (see [`super::IdempotencyTable`]). Only a tenant's function commands
    /// (`FunctionCreate`, `FunctionDeploy`, `FunctionUpdate`,
    /// `FunctionDelete`) of that tenant take a key.
    Keyed {
        /// The tenant the key belongs to.
        tenant: TenantId,
        /// The idempotency key (see [`super::is_valid_key`]).
        key: String,
        /// What the request was (same key, other fingerprint: refused).
        fingerprint: String,
        /// The command.
        command: Box<DomainCommand>,
    },
    /// Registers (or re-registers) a node agent with the GPUs it found:
    /// refused when they disagree with the topology's node
    /// ([`super::check_reported_gpus`]); with `allow_fewer_gpus`, the node's
    /// GPUs the agent lacks become unavailable (their instances released)
    /// until a registration reports them again. What replicas propose now;
    /// [`DomainCommand::AgentRegister`] stays so that older logs apply.
    AgentRegisterGpus {
        /// The agent's stable id.
        agent: AgentId,
        /// The node it runs on (must be in the topology, not drained).
        node: NodeId,
        /// The agent's version.
        version: String,
        /// The GPUs the agent discovered.
        gpus: Vec<crate::protocol::NodeGpu>,
        /// The agent's `allow_fewer_gpus`.
        allow_fewer_gpus: bool,
    },
    /// Phase one of a remap: the node's agent asks to move a `burstable` or
    /// `oversubscribed` instance to another GPU of its node, and the target
    /// slice is reserved beside the one the instance holds (re-checked by
    /// the same [`super::fit()`] and quota as a placement). Until
    /// [`DomainCommand::InstanceSliceRelease`] the instance holds both.
    /// Refused for `exclusive` and `guaranteed` instances (they stay on the
    /// slices the region placed), for an instance already holding two
    /// slices (one move at a time), and for a target of another node, of
    /// the GPU it holds, or of another size than its slice.
    InstanceSliceReserve {
        /// The instance.
        instance: InstanceId,
        /// The target slice: same node, another GPU, the same compute and memory.
        slice: Slice,
    },
    /// Phase two of a remap (or its abort): the instance gives up its
    /// slice on `gpu` and keeps the other one. Refused when it would leave
    /// the instance without a slice.
    InstanceSliceRelease {
        /// The instance.
        instance: InstanceId,
        /// The GPU of the slice to release.
        gpu: crate::model::GpuId,
    },
    /// Deletes a tenant (operator): its tokens, quotas and, with `force`,
    /// its functions (their instances released). Refused while it has
    /// functions unless `force`. Its metered usage stays, readable by the
    /// operator (`bill`), and the name is not given to a new tenant.
    TenantDelete {
        /// The tenant.
        tenant: TenantId,
        /// Delete its functions too.
        force: bool,
    },
    /// The leader's liveness verdict on a node's agent (from heartbeats
    /// heard by any replica): `ready`, or `not_ready` (no new placements).
    /// Committed only when it changes.
    NodeReadySet {
        /// The node (in the topology).
        node: NodeId,
        /// Heard within the grace.
        ready: bool,
    },
    /// The operator drains a node (no new placements; the leader places
    /// its instances elsewhere) or undrains it.
    NodeDrainSet {
        /// The node (in the topology).
        node: NodeId,
        /// `true`: drain; `false`: undrain.
        drain: bool,
    },
    /// Moves an instance in one step: releases it and places a new one of
    /// its function on `slices` (re-checked like an
    /// [`DomainCommand::InstancePlace`], counted without the old one). The
    /// leader's answer to a node that is not ready or drained.
    InstanceReplace {
        /// The instance to release.
        instance: InstanceId,
        /// The new instance's slices.
        slices: Vec<Slice>,
    },
    /// Releases one instance for a scale-in (the autoscaler's, to zero
    /// included): as [`DomainCommand::InstanceRelease`], but refused
    /// (`min_instances`) where the function's current version would be left
    /// below `min_instances`. A command of its own, not a new rule for
    /// `InstanceRelease`, so that logs written before it replay as they
    /// applied.
    InstanceScaleIn {
        /// The instance.
        instance: InstanceId,
    },
    /// Starts a make-before-break migration of `instance` (of its
    /// function's current version) to `slices` on another node: a new
    /// instance is placed there with the checks of an
    /// [`DomainCommand::InstancePlace`] (the quota counts both; the
    /// function's `max_instances` counts them once) and recorded as its
    /// [`super::Migration`]; the old one serves until the leader releases
    /// it (`InstanceRelease`) once the new one is ready, or releases the
    /// new one if it never is. Refused for an outgoing instance, one
    /// already migrating (either side), and a target on a node it holds;
    /// except with cause `roll`, which takes only an outgoing instance,
    /// places one of the current version on any node (its own included)
    /// and counts it against `max_instances` at once.
    InstanceMigrate {
        /// The instance that moves.
        instance: InstanceId,
        /// The new instance's slices (another node's).
        slices: Vec<Slice>,
        /// Why it moves.
        cause: super::MigrationCause,
    },
    /// Ends the migration `from` → `to`: `complete` releases `from` (the
    /// new side is ready), else `to` (given up). Refused, changing
    /// nothing, unless that migration is still in progress with both
    /// sides (another command may have ended it, or released a side,
    /// since the leader decided): a plain `InstanceRelease` decided on a
    /// stale view could release the only side left.
    MigrationEnd {
        /// The old side.
        from: InstanceId,
        /// The new side.
        to: InstanceId,
        /// Release the old side (completed), or the new one (given up).
        complete: bool,
    },
    /// Loads the topology, or reloads it: nodes that disappear are drained;
    /// its `[placement] policy` becomes the region's ranking.
    TopologyLoad {
        /// The validated topology (its `[pricing]` becomes the price list).
        topology: Topology,
    },
}

impl DomainCommand {
    /// A short stable name of the command's kind (for logs and metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            DomainCommand::TenantCreate { .. } => "tenant_create",
            DomainCommand::TenantUpdate { .. } => "tenant_update",
            DomainCommand::TokenIssue { .. } => "token_issue",
            DomainCommand::TokenRevoke { .. } => "token_revoke",
            DomainCommand::QuotaSet { .. } => "quota_set",
            DomainCommand::PriceListSet { .. } => "price_list_set",
            DomainCommand::TopologyLoad { .. } | DomainCommand::TopologyLoadV1 { .. } => {
                "topology_load"
            }
            DomainCommand::FunctionDeploy { .. } => "function_deploy",
            DomainCommand::FunctionUpdate { .. } => "function_update",
            DomainCommand::FunctionDelete { .. } => "function_delete",
            DomainCommand::InstancePlace { .. } => "instance_place",
            DomainCommand::InstanceRelease { .. } => "instance_release",
            DomainCommand::AgentRegister { .. } => "agent_register",
            DomainCommand::UsageBatch { .. } => "usage_batch",
            DomainCommand::FunctionCreate { .. } => "function_create",
            DomainCommand::Keyed { .. } => "keyed",
            DomainCommand::AgentRegisterGpus { .. } => "agent_register_gpus",
            DomainCommand::InstanceSliceReserve { .. } => "instance_slice_reserve",
            DomainCommand::InstanceSliceRelease { .. } => "instance_slice_release",
            DomainCommand::TenantDelete { .. } => "tenant_delete",
            DomainCommand::NodeReadySet { .. } => "node_ready_set",
            DomainCommand::NodeDrainSet { .. } => "node_drain_set",
            DomainCommand::InstanceReplace { .. } => "instance_replace",
            DomainCommand::InstanceScaleIn { .. } => "instance_scale_in",
            DomainCommand::InstanceMigrate { .. } => "instance_migrate",
            DomainCommand::MigrationEnd { .. } => "migration_end",
        }
    }

    /// The commands that bring an empty state to the operators' files:
    /// the topology, then every tenant of the tenants file.
    pub fn initial(topology: &Topology, tenants: &crate::config::Tenants) -> Vec<DomainCommand> {
        let mut out = vec![DomainCommand::TopologyLoad {
            topology: topology.clone(),
        }];
        out.extend(tenants.all().iter().map(|t| DomainCommand::TenantCreate {
            tenant: t.id.clone(),
            display_name: t.display_name.clone(),
            quotas: t.quotas.clone(),
        }));
        out
    }
}

/// One metered usage record from an agent.
///
/// The agent meters each instance and journals records before sending;
/// `(agent, seq)` identifies a record, so a record sent twice is applied
/// once. A record belongs to the billing hour its `end_ms` falls in and is
/// priced with the price list in force at `end_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// Sequence number per agent, from 1.
    pub seq: u64,
    /// The tenant billed.
    pub tenant: TenantId,
    /// The function metered.
    pub function: String,
    /// Its tier.
    pub tier: Tier,
    /// The GPU model it ran on.
    pub gpu_model: String,
    /// The kind of pool it ran in.
    pub pool_kind: PoolKind,
    /// Busy compute: milli-GPU of the slice × milliseconds busy.
    pub compute_milli_gpu_ms: u64,
    /// Resident GPU memory: MiB × milliseconds resident.
    pub memory_mib_ms: u64,
    /// Invocations completed in the interval (not priced; shown to tenants).
    pub invocations: u64,
    /// End of the metered interval (Unix ms).
    pub end_ms: u64,
}
