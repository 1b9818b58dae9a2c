//! What applying a command did (the state machine's answer to the client).

use super::instance::InstanceId;
use crate::model::{NodeId, PoolKind, Slice, TenantId};
use serde::{Deserialize, Serialize};

/// The outcome of one applied [`super::DomainCommand`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Applied {
    /// A tenant was created.
    TenantCreated {
        /// The tenant.
        tenant: TenantId,
    },
    /// A tenant was updated.
    TenantUpdated {
        /// The tenant.
        tenant: TenantId,
    },
    /// A token was recorded.
    TokenIssued {
        /// The tenant.
        tenant: TenantId,
        /// The token id.
        token_id: String,
    },
    /// A token was forgotten.
    TokenRevoked {
        /// The tenant.
        tenant: TenantId,
        /// The token id.
        token_id: String,
    },
    /// A quota was set.
    QuotaSet {
        /// The tenant.
        tenant: TenantId,
        /// The pool kind.
        pool_kind: PoolKind,
    },
    /// A price list took effect.
    PriceListSet {
        /// Its epoch (index in the price history).
        epoch: u32,
        /// When it took effect (Unix ms).
        effective_from_ms: u64,
    },
    /// A topology was loaded or reloaded.
    TopologyLoaded {
        /// Number of nodes now in the topology.
        nodes: u32,
        /// Nodes the reload removed (now draining).
        drained: Vec<NodeId>,
        /// Drained nodes the reload brought back.
        restored: Vec<NodeId>,
        /// Instances released because their GPUs went away or shrank.
        released: Vec<InstanceId>,
        /// The price epoch in force after the load.
        price_epoch: u32,
    },
    /// A function was deployed.
    FunctionDeployed {
        /// Owner.
        tenant: TenantId,
        /// Name.
        name: String,
        /// Its version (1).
        version: u64,
    },
    /// A function was updated.
    FunctionUpdated {
        /// Owner.
        tenant: TenantId,
        /// Name.
        name: String,
        /// Its new version.
        version: u64,
        /// Instances released because the update lowered `max_instances`.
        released: Vec<InstanceId>,
        /// Instances the update made outgoing because it changed their
        /// shape: they keep serving (and holding their slices) until the
        /// leader's roll has replaced each one, make-before-break.
        #[serde(default)]
        replacing: Vec<InstanceId>,
    },
    /// A function was deleted.
    FunctionDeleted {
        /// Owner.
        tenant: TenantId,
        /// Name.
        name: String,
        /// Its instances, released.
        released: Vec<InstanceId>,
    },
    /// An instance was placed.
    InstancePlaced {
        /// Its new id.
        instance: InstanceId,
        /// Its slices.
        slices: Vec<Slice>,
    },
    /// An instance was released.
    InstanceReleased {
        /// The instance.
        instance: InstanceId,
    },
    /// An agent registered.
    AgentRegistered {
        /// Whether this is its first registration.
        first_time: bool,
        /// The next usage sequence number the region expects from it.
        next_seq: u64,
    },
    /// A usage batch was applied.
    UsageApplied {
        /// Records applied now.
        applied: u32,
        /// Records already applied before (ignored).
        duplicates: u32,
    },
    /// A function was deployed with its first instances.
    FunctionCreated {
        /// Owner.
        tenant: TenantId,
        /// Name.
        name: String,
        /// Its version (1).
        version: u64,
        /// The instances placed, in the order of the command's placements.
        instances: Vec<PlacedInstance>,
    },
    /// A remap's target slice was reserved: the instance holds `slices`
    /// (its source first, the target last).
    SliceReserved {
        /// The instance.
        instance: InstanceId,
        /// Its slices now.
        slices: Vec<Slice>,
    },
    /// A slice of a moving instance was released: it holds `slices`.
    SliceReleased {
        /// The instance.
        instance: InstanceId,
        /// Its slices now.
        slices: Vec<Slice>,
    },
    /// A tenant was deleted.
    TenantDeleted {
        /// The tenant.
        tenant: TenantId,
        /// Its functions, deleted with it (`force`).
        functions: Vec<String>,
        /// Their instances, released.
        released: Vec<InstanceId>,
    },
    /// An instance was moved: `released` gave way to `instance`.
    InstanceReplaced {
        /// The instance released.
        released: InstanceId,
        /// The instance placed instead.
        instance: InstanceId,
        /// Its slices.
        slices: Vec<Slice>,
    },
    /// A node's liveness was committed.
    NodeStateSet {
        /// The node.
        node: NodeId,
        /// Its state now.
        state: super::node_status::NodeState,
        /// Whether it differs from the one before.
        changed: bool,
    },
    /// A node's drain was set.
    NodeDrainSet {
        /// The node.
        node: NodeId,
        /// Whether it drains now.
        draining: bool,
        /// Whether that differs from before.
        changed: bool,
    },
    /// A migration started: `instance` was placed for `from`, which serves
    /// until it is released. Last, to keep the encoding of the variants
    /// before it.
    InstanceMigrating {
        /// The instance that moves.
        from: InstanceId,
        /// The instance placed for it.
        instance: InstanceId,
        /// Its slices.
        slices: Vec<Slice>,
    },
}

/// One instance placed by a [`Applied::FunctionCreated`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedInstance {
    /// Its id.
    pub instance: InstanceId,
    /// Its slices.
    pub slices: Vec<Slice>,
}
