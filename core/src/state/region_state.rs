//! The region's replicated domain state and its `apply`.
//!
//! Every replica holds one [`RegionState`] and applies the same
//! [`DomainCommand`]s in log order with the `now` the leader stamped on
//! each entry, so every replica reaches the same state. `apply` validates a
//! command completely before it changes anything: a refused command leaves
//! the state exactly as it was.

use super::agent::{AgentId, AgentRecord};
use super::applied::{Applied, PlacedInstance};
use super::bill::Bill;
use super::command::{DomainCommand, UsageRecord, MAX_USAGE_BATCH};
use super::drained_node::DrainedNode;
use super::error::{ApplyError, ObjectKind};
use super::fit::{check_node, fit, Demand, NodeLoad, SharingCaps};
use super::function_record::FunctionRecord;
use super::idempotency::{is_valid_key, IdempotencyTable, KeyLookup, MAX_FINGERPRINT_LEN};
use super::index::Index;
use super::instance::{held, Instance, InstanceId};
use super::meter::{Meter, MeterKey, MeterLine, HOUR_MS};
use super::migration::{Migration, MigrationCause};
use super::node_status::{NodeState, NodeStatus};
use super::price_history::PriceHistory;
use super::query_error::QueryError;
use super::sequence::SequenceCursor;
use super::tenant_record::{TenantRecord, TokenRecord};
use crate::bounds;
use crate::config::{is_valid_name, LegacyTopology, PriceList, Topology, Usage};
use crate::model::{
    FunctionSpec, GpuId, NodeId, PoolKind, Quota, RegionPolicy, Slice, TenantId, Tier, WHOLE_GPU,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Wall-clock time as the leader stamped it on a log entry: Unix milliseconds.
pub type UnixMillis = u64;

pub use crate::bounds::MAX_GPUS_PER_INSTANCE;

/// Longest display name or agent version string accepted, in bytes.
pub const MAX_LABEL_LEN: usize = 256;

fn check_label(field: &str, value: Option<&str>) -> Result<(), ApplyError> {
    match value {
        Some(v) if v.len() > MAX_LABEL_LEN || v.chars().any(char::is_control) => {
            Err(ApplyError::InvalidSpec {
                field: field.to_string(),
                reason: format!("at most {MAX_LABEL_LEN} bytes, no control characters"),
            })
        }
        _ => Ok(()),
    }
}

/// The range checks of a tenant's quotas, naming `quotas.<kind>.<field>`.
fn check_quotas(quotas: &BTreeMap<PoolKind, Quota>) -> Result<(), ApplyError> {
    for (kind, q) in quotas {
        bounds::check_quota(&format!("quotas.{kind}"), q)?;
    }
    Ok(())
}

/// The replicated domain state of a region.
///
/// Serializes (for Raft snapshots, JSON or bincode 2) as its data only; the
/// look-up tables are rebuilt on deserialize.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(from = "StateData", into = "StateData")]
pub struct RegionState {
    data: StateData,
    index: Index,
}

/// What a [`RegionState`] is made of on the wire.
type StateData = StateDataOf<Topology>;

/// [`StateData`] with the topology in form `T` (the current [`Topology`],
/// or the [`LegacyTopology`] of snapshots written before `[placement]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StateDataOf<T> {
    topology: Option<T>,
    caps: SharingCaps,
    tenants: BTreeMap<TenantId, TenantRecord>,
    functions: BTreeMap<TenantId, BTreeMap<String, FunctionRecord>>,
    instances: BTreeMap<InstanceId, Instance>,
    next_instance: u64,
    drained: BTreeMap<NodeId, DrainedNode>,
    /// GPUs of the topology their node's agent registered without.
    unavailable_gpus: BTreeMap<NodeId, BTreeSet<u32>>,
    agents: BTreeMap<AgentId, AgentRecord>,
    prices: PriceHistory,
    meter: Meter,
    idempotency: IdempotencyTable,
    /// Every node's committed liveness and drain (see [`NodeStatus`]).
    node_status: BTreeMap<NodeId, NodeStatus>,
    /// Migrations in progress, by the new instance (see [`Migration`]).
    migrations: BTreeMap<InstanceId, Migration>,
    /// Instances an operator moved where they are: the leader does not
    /// move them back to their function's pool preference.
    operator_placed: BTreeSet<InstanceId>,
}

impl Default for StateData {
    fn default() -> Self {
        StateData {
            topology: None,
            caps: SharingCaps::default(),
            tenants: BTreeMap::new(),
            functions: BTreeMap::new(),
            instances: BTreeMap::new(),
            next_instance: 0,
            drained: BTreeMap::new(),
            unavailable_gpus: BTreeMap::new(),
            agents: BTreeMap::new(),
            prices: PriceHistory::default(),
            meter: Meter::default(),
            idempotency: IdempotencyTable::default(),
            node_status: BTreeMap::new(),
            migrations: BTreeMap::new(),
            operator_placed: BTreeSet::new(),
        }
    }
}

/// The look-up tables of `data`, built afresh.
fn index_of(data: &StateData) -> Index {
    Index::build(
        data.topology.as_ref(),
        &data.unavailable_gpus,
        &data.tenants,
        &data.functions,
        &data.instances,
    )
}

impl From<StateData> for RegionState {
    fn from(data: StateData) -> Self {
        let index = index_of(&data);
        Self { data, index }
    }
}

impl From<RegionState> for StateData {
    fn from(s: RegionState) -> Self {
        s.data
    }
}

/// A [`RegionState`] decoded from a snapshot written before topologies had
/// a `[placement]` policy (it reads as the default). Try it where decoding
/// a snapshot as a [`RegionState`] fails.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "StateDataOf<LegacyTopology>")]
pub struct RegionStateV1(pub RegionState);

impl From<StateDataOf<LegacyTopology>> for RegionStateV1 {
    fn from(d: StateDataOf<LegacyTopology>) -> Self {
        RegionStateV1(RegionState::from(StateData {
            topology: d.topology.map(|LegacyTopology(t)| t),
            caps: d.caps,
            tenants: d.tenants,
            functions: d.functions,
            instances: d.instances,
            next_instance: d.next_instance,
            drained: d.drained,
            unavailable_gpus: d.unavailable_gpus,
            agents: d.agents,
            prices: d.prices,
            meter: d.meter,
            idempotency: d.idempotency,
            node_status: d.node_status,
            migrations: d.migrations,
            operator_placed: d.operator_placed,
        }))
    }
}

impl PartialEq for RegionState {
    fn eq(&self, other: &Self) -> bool {
        self.data == other.data
    }
}

impl Eq for RegionState {}

impl Default for RegionState {
    fn default() -> Self {
        RegionState::new(SharingCaps::default())
    }
}

impl RegionState {
    /// An empty state with these oversubscription caps.
    pub fn new(caps: SharingCaps) -> Self {
        StateData {
            caps,
            next_instance: 1,
            ..StateData::default()
        }
        .into()
    }

    // ----- reads -----

    /// The region's placement ranking: its topology's `[placement]
    /// policy (the default, `gshare`, before a topology is loaded).
    pub fn placement_policy(&self) -> RegionPolicy {
        self.data
            .topology
            .as_ref()
            .map(Topology::placement_policy)
            .unwrap_or_default()
    }

    /// The topology, once loaded.
    pub fn topology(&self) -> Option<&Topology> {
        self.data.topology.as_ref()
    }

    /// The oversubscription caps.
    pub fn caps(&self) -> &SharingCaps {
        &self.data.caps
    }

    /// Every tenant, by name.
    pub fn tenants(&self) -> impl Iterator<Item = &TenantRecord> + '_ {
        self.data.tenants.values()
    }

    /// A tenant by name.
    pub fn tenant(&self, tenant: &TenantId) -> Option<&TenantRecord> {
        self.data.tenants.get(tenant)
    }

    /// The tenant and token id a token digest belongs to.
    pub fn token_owner(&self, digest: &str) -> Option<(&TenantId, &str)> {
        self.index
            .digests
            .get(digest)
            .map(|(t, id)| (t, id.as_str()))
    }

    /// `tenant`'s function `name`. Another tenant's function of that name
    /// is invisible: the answer is `NotFound`, as for a name nobody uses.
    pub fn function(&self, tenant: &TenantId, name: &str) -> Result<&FunctionRecord, QueryError> {
        self.data
            .functions
            .get(tenant)
            .and_then(|f| f.get(name))
            .ok_or_else(|| QueryError::NotFound {
                kind: ObjectKind::Function,
                name: name.to_string(),
            })
    }

    /// `tenant`'s functions, by name.
    pub fn functions_of<'a>(
        &'a self,
        tenant: &TenantId,
    ) -> impl Iterator<Item = &'a FunctionRecord> + 'a {
        self.data
            .functions
            .get(tenant)
            .into_iter()
            .flat_map(|f| f.values())
    }

    /// Every function of every tenant.
    pub fn functions(&self) -> impl Iterator<Item = &FunctionRecord> + '_ {
        self.data.functions.values().flat_map(|f| f.values())
    }

    /// Every placed instance, by id.
    pub fn instances(&self) -> impl Iterator<Item = &Instance> + '_ {
        self.data.instances.values()
    }

    /// An instance by id.
    pub fn instance(&self, id: InstanceId) -> Option<&Instance> {
        self.data.instances.get(&id)
    }

    /// The instances of `tenant`'s function `name` (empty for another tenant's).
    pub fn instances_of<'a>(
        &'a self,
        tenant: &TenantId,
        name: &str,
    ) -> impl Iterator<Item = &'a Instance> + 'a {
        self.index
            .by_function
            .get(&(tenant.clone(), name.to_string()))
            .into_iter()
            .flatten()
            .filter_map(|id| self.data.instances.get(id))
    }

    /// Number of instances of `tenant`'s function `name` that run its
    /// current version: what `max_instances` bounds and placements count.
    /// Outgoing instances (see [`RegionState::outgoing`]) are not counted:
    /// the roll places their replacements beside them.
    ///
    /// The new side of a migration is not counted either: it stands in for
    /// the old one, which is released once it is ready; except a roll's,
    /// whose old one is outgoing (not counted).
    pub fn instance_count(&self, tenant: &TenantId, name: &str) -> u32 {
        let current = self.function(tenant, name).ok().map(|f| f.version);
        let n = self
            .instances_of(tenant, name)
            .filter(|i| current.is_none_or(|v| i.version == v) && !self.stands_in(i.id))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Whether `id` is the new side of a migration whose old side runs
    /// the same version (so the two count once): every migration's but a
    /// roll's, whose old side is outgoing and not counted.
    fn stands_in(&self, id: InstanceId) -> bool {
        self.data.migrations.get(&id).is_some_and(|m| {
            let version = |i: InstanceId| self.data.instances.get(&i).map(|i| i.version);
            version(m.from) == version(id)
        })
    }

    /// The outgoing instances of `tenant`'s function `name`, oldest first:
    /// placed for an earlier version than the function's (a reshaping
    /// update), serving until the roll replaces them.
    pub fn outgoing<'a>(
        &'a self,
        tenant: &TenantId,
        name: &str,
    ) -> impl Iterator<Item = &'a Instance> + 'a {
        let current = self.function(tenant, name).ok().map(|f| f.version);
        self.instances_of(tenant, name)
            .filter(move |i| current.is_some_and(|v| i.version != v))
    }

    /// The migrations in progress, by the new instance's id.
    pub fn migrations(&self) -> impl Iterator<Item = &Migration> + '_ {
        self.data.migrations.values()
    }

    /// The migration instance `id` is a side of (the new one or the old).
    pub fn migration_of(&self, id: InstanceId) -> Option<&Migration> {
        self.data
            .migrations
            .get(&id)
            .or_else(|| self.data.migrations.values().find(|m| m.from == id))
    }

    /// Whether `tenant`'s function `name` has a migration in progress.
    pub fn migrating(&self, tenant: &TenantId, name: &str) -> bool {
        self.data.migrations.keys().any(|id| {
            self.data
                .instances
                .get(id)
                .is_some_and(|i| &i.tenant == tenant && i.function == name)
        })
    }

    /// Whether an operator moved instance `id` where it is.
    pub fn operator_placed(&self, id: InstanceId) -> bool {
        self.data.operator_placed.contains(&id)
    }

    /// Every outgoing instance of every function, oldest first per function.
    pub fn all_outgoing(&self) -> impl Iterator<Item = &Instance> + '_ {
        // An outgoing instance runs a version its function keeps in
        // `older` (every instance's spec is kept: `check_invariants`), so
        // only the functions keeping one are looked at, not every instance
        // (the leader asks this twice a second, under the state's lock).
        let mut out: Vec<&Instance> = self
            .functions()
            .filter(|f| !f.older.is_empty())
            .flat_map(|f| self.outgoing(&f.spec.tenant, &f.spec.name))
            .collect();
        out.sort_unstable_by_key(|i| i.id);
        out.into_iter()
    }

    /// The spec instance `id` runs (its version's; see
    /// [`FunctionRecord::spec_for`]), with that version.
    pub fn instance_spec(&self, id: InstanceId) -> Option<(&FunctionSpec, u64)> {
        let i = self.data.instances.get(&id)?;
        let f = self.function(&i.tenant, &i.function).ok()?;
        Some((f.spec_for(i.version)?, i.version))
    }

    /// Every node's GPUs and loads, in the order of `Topology::nodes`.
    pub fn node_loads(&self) -> &[NodeLoad] {
        &self.index.nodes
    }

    /// A node's position in [`RegionState::node_loads`].
    pub fn node_position(&self, node: &NodeId) -> Option<usize> {
        self.index.node_pos.get(node).copied()
    }

    /// The position in the topology of the pool of the node at `pos`.
    pub(crate) fn pool_index_of(&self, pos: usize) -> Option<u32> {
        self.index.pool_of.get(pos).copied()
    }

    /// The name of the node at `pos`.
    pub fn node_name_at(&self, pos: usize) -> Option<&NodeId> {
        self.index.names.get(pos)
    }

    /// The pool of the node at `pos`.
    pub fn pool_of_position(&self, pos: usize) -> Option<&crate::config::Pool> {
        let p = self.pool_index_of(pos)?;
        self.topology()?.pools().get(p as usize)
    }

    /// Every GPU by class, for the planner.
    pub(crate) fn free_index(&self) -> &super::free_index::FreeIndex {
        &self.index.free
    }

    /// A node's GPUs and their loads (`None` for a node not in the topology).
    pub fn node_load(&self, node: &NodeId) -> Option<&NodeLoad> {
        self.index.node(node)
    }

    /// What `tenant` holds in pools of `kind`.
    pub fn held(&self, tenant: &TenantId, kind: PoolKind) -> Quota {
        self.index
            .held
            .get(&(tenant.clone(), kind))
            .copied()
            .unwrap_or_default()
    }

    /// How many more instances of `spec` its tenant's quota leaves room
    /// for: the sum over the pool kinds its preference allows (each kind
    /// has its own quota, and a placement goes to whichever has room),
    /// each instance holding the spec's compute and memory (an exclusive
    /// one may hold more: its GPUs' whole memory, so this is an upper
    /// bound; apply checks each placement). 0 for an unknown tenant.
    pub fn quota_room(&self, spec: &FunctionSpec) -> u32 {
        let Some(tenant) = self.tenant(&spec.tenant) else {
            return 0;
        };
        let each = super::instance::held_of([(spec.compute_milli, spec.memory_mib)]);
        [PoolKind::Center, PoolKind::Edge]
            .into_iter()
            .filter(|&kind| spec.pool.allows_kind(kind))
            .map(|kind| {
                tenant
                    .quota(kind)
                    .room(&self.held(&spec.tenant, kind), &each)
            })
            .fold(0u32, u32::saturating_add)
    }

    /// GPUs of the topology that their node's agent registered without
    /// (`allow_fewer_gpus`): they take no placement.
    pub fn unavailable_gpus(&self) -> &BTreeMap<NodeId, BTreeSet<u32>> {
        &self.data.unavailable_gpus
    }

    /// Nodes removed by topology reloads, still remembered.
    pub fn drained(&self) -> &BTreeMap<NodeId, DrainedNode> {
        &self.data.drained
    }

    /// A node's committed status (`None`: not in the topology, or a state
    /// from before node liveness: the leader treats it as pending).
    pub fn node_status(&self, node: &NodeId) -> Option<NodeStatus> {
        self.data.node_status.get(node).copied()
    }

    /// A node's committed liveness (`pending` when none was committed).
    pub fn node_state(&self, node: &NodeId) -> NodeState {
        self.node_status(node)
            .map_or(NodeState::Pending, |s| s.state)
    }

    /// Whether a new instance may be placed on `node` now: not `not_ready`
    /// and not drained by the operator.
    pub fn takes_placements(&self, node: &NodeId) -> bool {
        self.data
            .node_status
            .get(node)
            .is_none_or(NodeStatus::takes_placements)
    }

    /// The instances holding a slice of `node`.
    pub fn instances_on<'a>(&'a self, node: &'a NodeId) -> impl Iterator<Item = &'a Instance> + 'a {
        let ids: Vec<InstanceId> = self
            .index
            .node(node)
            .into_iter()
            .flat_map(|l| l.gpus.iter().flat_map(|g| g.instances.iter().copied()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        ids.into_iter()
            .filter_map(|id| self.data.instances.get(&id))
    }

    /// Registered agents.
    pub fn agents(&self) -> impl Iterator<Item = &AgentRecord> + '_ {
        self.data.agents.values()
    }

    /// An agent by id.
    pub fn agent(&self, id: &AgentId) -> Option<&AgentRecord> {
        self.data.agents.get(id)
    }

    /// Every price list used so far, with when each took effect.
    pub fn price_history(&self) -> &PriceHistory {
        &self.data.prices
    }

    /// The price list in force now.
    pub fn price_list(&self) -> Option<&PriceList> {
        self.data.prices.current()
    }

    /// The metered usage.
    pub fn meter(&self) -> &Meter {
        &self.data.meter
    }

    /// `tenant`'s bill for the hours that start in `[from_ms, to_ms)`.
    /// A deleted tenant's bill stays readable.
    pub fn bill(&self, tenant: &TenantId, from_ms: u64, to_ms: u64) -> Result<Bill, QueryError> {
        self.billed_tenant(tenant)?;
        Bill::compute(&self.data.meter, &self.data.prices, tenant, from_ms, to_ms)
    }

    /// `tenant`'s meter lines of the hours that start in `[from_ms,
    /// to_ms)`; like [`Self::bill`], readable after the tenant was deleted,
    /// and `NotFound` for a tenant the region never had (not an empty list).
    pub fn usage(
        &self,
        tenant: &TenantId,
        from_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<MeterLine>, QueryError> {
        self.billed_tenant(tenant)?;
        Ok(self
            .data
            .meter
            .lines(tenant, from_ms, to_ms)
            .cloned()
            .collect())
    }

    /// `NotFound` unless `tenant` exists or was deleted with usage kept.
    fn billed_tenant(&self, tenant: &TenantId) -> Result<(), QueryError> {
        if !self.data.tenants.contains_key(tenant) && !self.data.meter.has(tenant) {
            return Err(QueryError::NotFound {
                kind: ObjectKind::Tenant,
                name: tenant.0.clone(),
            });
        }
        Ok(())
    }

    /// Bytes of function specs `tenant` keeps, counted against
    /// [`bounds::MAX_TENANT_SPEC_BYTES`] ([`FunctionRecord::stored_bytes`]).
    pub fn stored_spec_bytes(&self, tenant: &TenantId) -> u64 {
        self.index.stored.get(tenant).copied().unwrap_or(0)
    }

    /// Functions with fewer instances than their `min_instances`, with how
    /// many are missing: what the leader should plan next (after deploys,
    /// drains and GPUs an agent no longer has). Outgoing instances count
    /// here (they still serve): the roll replaces each of them one for one,
    /// so a reshaping update is not placed twice.
    pub fn underplaced(&self) -> Vec<(TenantId, String, u32)> {
        self.functions()
            .filter_map(|f| {
                let have = self.instances_of(&f.spec.tenant, &f.spec.name).count();
                let have = u32::try_from(have).unwrap_or(u32::MAX);
                (have < f.spec.min_instances).then(|| {
                    (
                        f.spec.tenant.clone(),
                        f.spec.name.clone(),
                        f.spec.min_instances.saturating_sub(have),
                    )
                })
            })
            .collect()
    }

    /// Checks what must hold after every apply: every node within the fit
    /// rules, every tenant within its quota, every function within
    /// `max_instances`, and the look-up tables equal to a rebuild.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (node, &i) in &self.index.node_pos {
            check_node(&self.data.caps, &self.index.nodes[i])
                .map_err(|f| format!("node {node} GPU {}: {}", f.gpu_index, f.dimension))?;
        }
        for ((tenant, kind), h) in &self.index.held {
            let quota = self
                .data
                .tenants
                .get(tenant)
                .map(|t| t.quota(*kind))
                .unwrap_or_default();
            if let Err(d) = quota.admits(h, &Quota::default()) {
                return Err(format!(
                    "tenant {tenant} holds {h:?} in {kind} pools, past its quota {quota:?} ({d})"
                ));
            }
        }
        for f in self.functions() {
            let n = self.instance_count(&f.spec.tenant, &f.spec.name);
            if n > f.spec.max_instances {
                return Err(format!(
                    "function {}/{} has {n} instances, max {}",
                    f.spec.tenant, f.spec.name, f.spec.max_instances
                ));
            }
            for v in f.older.keys() {
                if *v >= f.version
                    || !self
                        .outgoing(&f.spec.tenant, &f.spec.name)
                        .any(|i| i.version == *v)
                {
                    return Err(format!(
                        "function {}/{} keeps the spec of version {v} with no instance of it",
                        f.spec.tenant, f.spec.name
                    ));
                }
            }
        }
        for i in self.data.instances.values() {
            if self.instance_spec(i.id).is_none() {
                return Err(format!(
                    "instance {} of {}/{} runs version {}, whose spec is not kept",
                    i.id, i.tenant, i.function, i.version
                ));
            }
        }
        let mut moving: BTreeSet<InstanceId> = BTreeSet::new();
        for (to, m) in &self.data.migrations {
            let (Some(a), Some(b)) = (
                self.data.instances.get(&m.from),
                self.data.instances.get(to),
            ) else {
                return Err(format!("migration {} -> {to} lacks a side", m.from));
            };
            if *to != m.to || a.tenant != b.tenant || a.function != b.function {
                return Err(format!("migration {} -> {to} joins two functions", m.from));
            }
            if !moving.insert(m.from) || !moving.insert(*to) {
                return Err(format!("instance {} or {to} is in two migrations", m.from));
            }
        }
        if let Some(id) = self
            .data
            .operator_placed
            .iter()
            .find(|id| !self.data.instances.contains_key(id))
        {
            return Err(format!("operator-placed instance {id} is gone"));
        }
        self.data.idempotency.check()?;
        let rebuilt = index_of(&self.data);
        if rebuilt != self.index {
            return Err("look-up tables differ from a rebuild".into());
        }
        Ok(())
    }

    // ----- apply -----

    /// Applies one command at `now` (Unix ms stamped by the leader).
    /// On `Err` nothing changed.
    pub fn apply(&mut self, cmd: DomainCommand, now: UnixMillis) -> Result<Applied, ApplyError> {
        let applied = self.apply_one(cmd, now);
        self.forget_gone_moves();
        applied
    }

    /// Ends the migrations one of whose sides is gone (the old one
    /// released: completed; the new one: given up, or lost with its node's
    /// GPUs), and forgets operator moves of instances that are gone,
    /// whichever command released them.
    fn forget_gone_moves(&mut self) {
        if self.data.migrations.is_empty() && self.data.operator_placed.is_empty() {
            return;
        }
        let instances = &self.data.instances;
        self.data
            .migrations
            .retain(|to, m| instances.contains_key(to) && instances.contains_key(&m.from));
        self.data
            .operator_placed
            .retain(|id| instances.contains_key(id));
    }

    fn apply_one(&mut self, cmd: DomainCommand, now: UnixMillis) -> Result<Applied, ApplyError> {
        match cmd {
            DomainCommand::TenantCreate {
                tenant,
                display_name,
                quotas,
            } => self.tenant_create(tenant, display_name, quotas, now),
            DomainCommand::TenantUpdate {
                tenant,
                display_name,
                quotas,
            } => self.tenant_update(tenant, display_name, quotas),
            DomainCommand::TokenIssue {
                tenant,
                token_id,
                digest,
            } => self.token_issue(tenant, token_id, digest, now),
            DomainCommand::TokenRevoke { tenant, token_id } => self.token_revoke(tenant, token_id),
            DomainCommand::QuotaSet {
                tenant,
                pool_kind,
                quota,
            } => self.quota_set(tenant, pool_kind, quota),
            DomainCommand::PriceListSet { list } => self.price_list_set(list, now),
            DomainCommand::TopologyLoad { topology }
            | DomainCommand::TopologyLoadV1 {
                topology: LegacyTopology(topology),
            } => Ok(self.topology_load(topology, now)),
            DomainCommand::FunctionDeploy { spec } => self.function_deploy(spec, now),
            DomainCommand::FunctionUpdate { spec } => self.function_update(spec, now),
            DomainCommand::FunctionDelete { tenant, name } => self.function_delete(tenant, name),
            DomainCommand::InstancePlace {
                tenant,
                function,
                slices,
            } => self.instance_place(tenant, function, slices, now),
            DomainCommand::InstanceRelease { instance } => self.instance_release(instance),
            DomainCommand::InstanceScaleIn { instance } => self.instance_scale_in(instance),
            DomainCommand::AgentRegister {
                agent,
                node,
                version,
            } => self.agent_register(agent, node, version, now),
            DomainCommand::UsageBatch { agent, records } => self.usage_batch(agent, records),
            DomainCommand::FunctionCreate { spec, placements } => {
                self.function_create(spec, placements, now)
            }
            DomainCommand::Keyed {
                tenant,
                key,
                fingerprint,
                command,
            } => self.keyed(tenant, key, fingerprint, *command, now),
            DomainCommand::AgentRegisterGpus {
                agent,
                node,
                version,
                gpus,
                allow_fewer_gpus,
            } => self.agent_register_gpus(agent, node, version, &gpus, allow_fewer_gpus, now),
            DomainCommand::InstanceSliceReserve { instance, slice } => {
                self.instance_slice_reserve(instance, slice)
            }
            DomainCommand::InstanceSliceRelease { instance, gpu } => {
                self.instance_slice_release(instance, gpu)
            }
            DomainCommand::TenantDelete { tenant, force } => self.tenant_delete(tenant, force),
            DomainCommand::NodeReadySet { node, ready } => self.node_ready_set(node, ready, now),
            DomainCommand::NodeDrainSet { node, drain } => self.node_drain_set(node, drain),
            DomainCommand::InstanceReplace { instance, slices } => {
                self.instance_replace(instance, slices, now)
            }
            DomainCommand::InstanceMigrate {
                instance,
                slices,
                cause,
            } => self.instance_migrate(instance, slices, cause, now),
            DomainCommand::MigrationEnd { from, to, complete } => {
                self.migration_end(from, to, complete)
            }
        }
    }

    /// Ends a migration in progress (see [`DomainCommand::MigrationEnd`]).
    fn migration_end(
        &mut self,
        from: InstanceId,
        to: InstanceId,
        complete: bool,
    ) -> Result<Applied, ApplyError> {
        let live = self
            .data
            .migrations
            .get(&to)
            .is_some_and(|m| m.from == from)
            && self.data.instances.contains_key(&from)
            && self.data.instances.contains_key(&to);
        if !live {
            return Err(ApplyError::Migration {
                instance: to,
                reason: format!("no migration {from} -> {to} in progress (it ended meanwhile)"),
            });
        }
        self.instance_release(if complete { from } else { to })
    }

    /// Starts a migration (see [`DomainCommand::InstanceMigrate`]); a
    /// refusal changes nothing.
    fn instance_migrate(
        &mut self,
        instance: InstanceId,
        slices: Vec<Slice>,
        cause: MigrationCause,
        now: UnixMillis,
    ) -> Result<Applied, ApplyError> {
        let old = self
            .data
            .instances
            .get(&instance)
            .ok_or(ApplyError::UnknownInstance { instance })?;
        let refuse = |reason: &str| {
            Err(ApplyError::Migration {
                instance,
                reason: reason.to_string(),
            })
        };
        let f =
            self.function(&old.tenant, &old.function)
                .map_err(|_| ApplyError::UnknownFunction {
                    tenant: old.tenant.clone(),
                    name: old.function.clone(),
                })?;
        // A roll replaces an outgoing instance by one of the current
        // version, on any node; every other move keeps the version and
        // leaves the node.
        let roll = cause == MigrationCause::Roll;
        if roll && old.version == f.version {
            return refuse("it runs the current version (a roll replaces outgoing instances)");
        }
        if !roll && old.version != f.version {
            return refuse("it is outgoing (a reshaping update replaces it)");
        }
        if self.migration_of(instance).is_some() {
            return refuse("it is migrating already");
        }
        if !roll
            && slices
                .iter()
                .any(|s| old.slices.iter().any(|o| o.gpu.node == s.gpu.node))
        {
            return refuse("the target is on a node it holds (a move on one node is a remap)");
        }
        // The new one stands in for the old: counted once. A roll's counts
        // (the outgoing one it replaces does not).
        let mut spec = f.spec.clone();
        if !roll {
            spec.max_instances = spec.max_instances.saturating_add(1);
        }
        let (tenant, function, version, tier) = (
            old.tenant.clone(),
            old.function.clone(),
            f.version,
            f.spec.tier,
        );
        let (pool, pool_kind) = self.check_placement(&spec, &slices)?;
        let id = self.insert_new(Instance {
            id: InstanceId(0),
            tenant,
            function,
            tier,
            pool,
            pool_kind,
            slices: slices.clone(),
            placed_at: now,
            version,
        })?;
        self.data.migrations.insert(
            id,
            Migration {
                from: instance,
                to: id,
                cause,
                started_at: now,
            },
        );
        if cause == MigrationCause::Operator {
            self.data.operator_placed.insert(id);
        }
        Ok(Applied::InstanceMigrating {
            from: instance,
            instance: id,
            slices,
        })
    }

    fn known_node(&self, node: &NodeId) -> Result<(), ApplyError> {
        let topology = self.data.topology.as_ref().ok_or(ApplyError::NoTopology)?;
        topology
            .node(&node.0)
            .map(|_| ())
            .ok_or_else(|| ApplyError::UnknownNode { node: node.clone() })
    }

    fn node_ready_set(
        &mut self,
        node: NodeId,
        ready: bool,
        now: UnixMillis,
    ) -> Result<Applied, ApplyError> {
        self.known_node(&node)?;
        let state = if ready {
            NodeState::Ready
        } else {
            NodeState::NotReady
        };
        let s = self
            .data
            .node_status
            .entry(node.clone())
            .or_insert(NodeStatus::pending(now));
        let changed = s.state != state;
        if changed {
            s.state = state;
            s.since = now;
        }
        Ok(Applied::NodeStateSet {
            node,
            state,
            changed,
        })
    }

    fn node_drain_set(&mut self, node: NodeId, drain: bool) -> Result<Applied, ApplyError> {
        self.known_node(&node)?;
        let s = self
            .data
            .node_status
            .entry(node.clone())
            .or_insert(NodeStatus::pending(0));
        let changed = s.draining != drain;
        s.draining = drain;
        Ok(Applied::NodeDrainSet {
            node,
            draining: drain,
            changed,
        })
    }

    /// Moves an instance to `slices` (another node's, usually) in one step:
    /// the old one is released and a new one placed with the same checks as
    /// [`DomainCommand::InstancePlace`], counted without the old one; a
    /// refusal changes nothing.
    fn instance_replace(
        &mut self,
        instance: InstanceId,
        slices: Vec<Slice>,
        now: UnixMillis,
    ) -> Result<Applied, ApplyError> {
        let old = self
            .data
            .instances
            .get(&instance)
            .cloned()
            .ok_or(ApplyError::UnknownInstance { instance })?;
        if self.migration_of(instance).is_some() {
            // Its migration's end releases one side; a replacement beside
            // it would leave one instance too many.
            return Err(ApplyError::Migration {
                instance,
                reason: "it is migrating (the migration's end releases one side)".into(),
            });
        }
        let next_instance = self.data.next_instance;
        let record = self.function(&old.tenant, &old.function).ok().cloned();
        self.release(instance);
        match self.instance_place(old.tenant.clone(), old.function.clone(), slices, now) {
            Ok(Applied::InstancePlaced {
                instance: placed,
                slices,
            }) => Ok(Applied::InstanceReplaced {
                released: instance,
                instance: placed,
                slices,
            }),
            other => {
                if let Some(r) = record {
                    if let Some(f) = self.data.functions.get_mut(&old.tenant) {
                        f.insert(old.function.clone(), r);
                    }
                }
                self.data.instances.insert(old.id, old);
                self.data.next_instance = next_instance;
                self.index = index_of(&self.data);
                match other {
                    Err(e) => Err(e),
                    Ok(a) => Err(ApplyError::InvalidSpec {
                        field: "slices".into(),
                        reason: format!("unexpected outcome {a:?}"),
                    }),
                }
            }
        }
    }

    /// The tenants' recorded idempotency keys.
    pub fn idempotency(&self) -> &IdempotencyTable {
        &self.data.idempotency
    }

    fn keyed(
        &mut self,
        tenant: TenantId,
        key: String,
        fingerprint: String,
        command: DomainCommand,
        now: UnixMillis,
    ) -> Result<Applied, ApplyError> {
        let bad = |reason: String| Err(ApplyError::InvalidIdempotencyKey { reason });
        if !is_valid_key(&key) {
            return bad(format!(
                "1 to {} printable ASCII characters",
                super::idempotency::MAX_KEY_LEN
            ));
        }
        if fingerprint.len() > MAX_FINGERPRINT_LEN {
            return bad(format!("fingerprint over {MAX_FINGERPRINT_LEN} bytes"));
        }
        let owner = match &command {
            DomainCommand::FunctionCreate { spec, .. }
            | DomainCommand::FunctionDeploy { spec }
            | DomainCommand::FunctionUpdate { spec } => &spec.tenant,
            DomainCommand::FunctionDelete { tenant, .. } => tenant,
            other => return bad(format!("{} takes no idempotency key", other.kind())),
        };
        if *owner != tenant {
            return bad(format!("the command is not tenant {tenant}'s"));
        }
        match self
            .data
            .idempotency
            .lookup(&tenant, &key, &fingerprint, now)
        {
            KeyLookup::Replay(outcome) => return Ok(outcome),
            KeyLookup::Reused => return Err(ApplyError::IdempotencyKeyReused { key }),
            KeyLookup::New => {}
        }
        let outcome = self.apply(command, now)?;
        self.data
            .idempotency
            .record(&tenant, key, fingerprint, outcome.clone(), now);
        Ok(outcome)
    }

    /// Deploy and placements as one: on the first refusal everything the
    /// command did is undone (the function deleted, its instances released,
    /// the instance counter restored), so a refused create changes nothing.
    fn function_create(
        &mut self,
        spec: FunctionSpec,
        placements: Vec<Vec<Slice>>,
        now: UnixMillis,
    ) -> Result<Applied, ApplyError> {
        let (tenant, name) = (spec.tenant.clone(), spec.name.clone());
        let version = match self.function_deploy(spec, now)? {
            Applied::FunctionDeployed { version, .. } => version,
            _ => 1,
        };
        let next_instance = self.data.next_instance;
        let mut instances = Vec::with_capacity(placements.len().min(64));
        for slices in placements {
            match self.instance_place(tenant.clone(), name.clone(), slices, now) {
                Ok(Applied::InstancePlaced { instance, slices }) => {
                    instances.push(PlacedInstance { instance, slices })
                }
                Ok(_) => {}
                Err(e) => {
                    // Just deployed above, so the delete cannot be refused.
                    let _ = self.function_delete(tenant, name);
                    self.data.next_instance = next_instance;
                    return Err(e);
                }
            }
        }
        Ok(Applied::FunctionCreated {
            tenant,
            name,
            version,
            instances,
        })
    }

    fn known_tenant(&self, tenant: &TenantId) -> Result<&TenantRecord, ApplyError> {
        self.data
            .tenants
            .get(tenant)
            .ok_or_else(|| ApplyError::UnknownTenant {
                tenant: tenant.clone(),
            })
    }

    fn tenant_create(
        &mut self,
        tenant: TenantId,
        display_name: Option<String>,
        quotas: BTreeMap<PoolKind, Quota>,
        now: UnixMillis,
    ) -> Result<Applied, ApplyError> {
        if !is_valid_name(&tenant.0) {
            return Err(ApplyError::InvalidName {
                kind: ObjectKind::Tenant,
                name: tenant.0,
            });
        }
        check_label("display_name", display_name.as_deref())?;
        check_quotas(&quotas)?;
        // A deleted tenant's usage is kept under its name: a new tenant of
        // that name would see it.
        if self.data.tenants.contains_key(&tenant) || self.data.meter.has(&tenant) {
            return Err(ApplyError::DuplicateName {
                kind: ObjectKind::Tenant,
                name: tenant.0,
            });
        }
        self.data.tenants.insert(
            tenant.clone(),
            TenantRecord {
                id: tenant.clone(),
                display_name,
                quotas,
                tokens: BTreeMap::new(),
                created_at: now,
            },
        );
        Ok(Applied::TenantCreated { tenant })
    }

    /// Refuses quotas below what `tenant` holds now: a quota is never
    /// passed, not even by lowering it (release instances first).
    fn check_not_below_held(
        &self,
        tenant: &TenantId,
        quotas: &[(PoolKind, Quota)],
    ) -> Result<(), ApplyError> {
        for (kind, q) in quotas {
            q.admits(&self.held(tenant, *kind), &Quota::default())
                .map_err(|dimension| ApplyError::QuotaBelowHeld {
                    tenant: tenant.clone(),
                    pool_kind: *kind,
                    dimension,
                })?;
        }
        Ok(())
    }

    fn tenant_update(
        &mut self,
        tenant: TenantId,
        display_name: Option<String>,
        quotas: Option<BTreeMap<PoolKind, Quota>>,
    ) -> Result<Applied, ApplyError> {
        self.known_tenant(&tenant)?;
        check_label("display_name", display_name.as_deref())?;
        if let Some(q) = &quotas {
            check_quotas(q)?;
            let all: Vec<(PoolKind, Quota)> = [PoolKind::Center, PoolKind::Edge]
                .into_iter()
                .map(|k| (k, q.get(&k).copied().unwrap_or_default()))
                .collect();
            self.check_not_below_held(&tenant, &all)?;
        }
        let rec = self.data.tenants.get_mut(&tenant).expect("checked above");
        rec.display_name = display_name;
        if let Some(q) = quotas {
            rec.quotas = q;
        }
        Ok(Applied::TenantUpdated { tenant })
    }

    fn token_issue(
        &mut self,
        tenant: TenantId,
        token_id: String,
        digest: String,
        now: UnixMillis,
    ) -> Result<Applied, ApplyError> {
        let rec = self.known_tenant(&tenant)?;
        if !is_valid_name(&token_id) {
            return Err(ApplyError::InvalidName {
                kind: ObjectKind::Token,
                name: token_id,
            });
        }
        if digest.len() != 64
            || !digest
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(ApplyError::InvalidDigest);
        }
        if rec.tokens.contains_key(&token_id) {
            return Err(ApplyError::DuplicateName {
                kind: ObjectKind::Token,
                name: token_id,
            });
        }
        if self.index.digests.contains_key(&digest) {
            return Err(ApplyError::DuplicateName {
                kind: ObjectKind::Token,
                name: "<digest>".into(),
            });
        }
        self.index
            .digests
            .insert(digest.clone(), (tenant.clone(), token_id.clone()));
        self.data
            .tenants
            .get_mut(&tenant)
            .expect("checked above")
            .tokens
            .insert(
                token_id.clone(),
                TokenRecord {
                    digest,
                    issued_at: now,
                },
            );
        Ok(Applied::TokenIssued { tenant, token_id })
    }

    fn token_revoke(&mut self, tenant: TenantId, token_id: String) -> Result<Applied, ApplyError> {
        self.known_tenant(&tenant)?;
        let rec = self.data.tenants.get_mut(&tenant).expect("checked above");
        let Some(tok) = rec.tokens.remove(&token_id) else {
            return Err(ApplyError::UnknownToken { tenant, token_id });
        };
        self.index.digests.remove(&tok.digest);
        Ok(Applied::TokenRevoked { tenant, token_id })
    }

    fn quota_set(
        &mut self,
        tenant: TenantId,
        pool_kind: PoolKind,
        quota: Quota,
    ) -> Result<Applied, ApplyError> {
        self.known_tenant(&tenant)?;
        bounds::check_quota(&format!("quotas.{pool_kind}"), &quota)?;
        self.check_not_below_held(&tenant, &[(pool_kind, quota)])?;
        self.data
            .tenants
            .get_mut(&tenant)
            .expect("checked above")
            .quotas
            .insert(pool_kind, quota);
        Ok(Applied::QuotaSet { tenant, pool_kind })
    }

    fn price_list_set(&mut self, list: PriceList, now: UnixMillis) -> Result<Applied, ApplyError> {
        bounds::check_price_list(&list)?;
        if let Some(t) = &self.data.topology {
            let missing = t.unpriced(&list);
            if !missing.is_empty() {
                return Err(ApplyError::Unpriced { missing });
            }
        }
        let (epoch, effective_from_ms) = self.data.prices.push(now, list);
        Ok(Applied::PriceListSet {
            epoch,
            effective_from_ms,
        })
    }

    /// Loads or reloads the topology. The rule for what changes:
    /// - a node of the old topology missing from the new one is drained:
    ///   remembered in [`RegionState::drained`] with its old definition, and
    ///   its instances are released (their functions show up in
    ///   [`RegionState::underplaced`] for the leader to place again);
    /// - an instance also goes when its node moved to another pool, one of
    ///   its GPUs is gone, an exclusive slice no longer matches its GPU's
    ///   memory, or the re-fit of the surviving instances (oldest first)
    ///   finds no room for it on a GPU that shrank;
    /// - a drained node that comes back is active again (and empty);
    /// - the file's `[pricing]` becomes the price list if it differs from
    ///   the one in force (the file wins over an API-set list).
    fn topology_load(&mut self, topology: Topology, now: UnixMillis) -> Applied {
        let mut drained_now: Vec<NodeId> = Vec::new();
        if let Some(old) = &self.data.topology {
            for n in old.nodes() {
                if topology.node(&n.name.0).is_none() {
                    drained_now.push(n.name.clone());
                    self.data.drained.insert(
                        n.name.clone(),
                        DrainedNode {
                            node: n.clone(),
                            since: now,
                            released: Vec::new(),
                        },
                    );
                }
            }
        }
        let restored: Vec<NodeId> = self
            .data
            .drained
            .keys()
            .filter(|k| topology.node(&k.0).is_some())
            .cloned()
            .collect();
        for k in &restored {
            self.data.drained.remove(k);
        }
        // Re-fit the surviving instances, oldest first, on the new topology.
        let mut index = Index::for_topology(Some(&topology), &self.data.unavailable_gpus);
        let mut released = Vec::new();
        for inst in self.data.instances.values() {
            let still_fits = Self::slices_on(&topology, inst)
                .and_then(|(node, demands)| {
                    let load = index.node(&node)?;
                    fit(&self.data.caps, load, &demands).ok()
                })
                .is_some();
            if still_fits {
                index.add_instance(inst);
            } else {
                released.push(inst.id);
            }
        }
        for id in &released {
            if let Some(inst) = self.data.instances.remove(id) {
                if let Some(d) = inst
                    .slices
                    .first()
                    .and_then(|s| self.data.drained.get_mut(&s.gpu.node))
                {
                    d.released.push(*id);
                }
            }
        }
        if self.data.prices.current() != Some(topology.pricing()) {
            self.data.prices.push(now, topology.pricing().clone());
        }
        self.data
            .node_status
            .retain(|n, _| topology.node(&n.0).is_some());
        for n in topology.nodes() {
            self.data
                .node_status
                .entry(n.name.clone())
                .or_insert(NodeStatus::pending(now));
        }
        let nodes = topology.nodes().count() as u32;
        self.data.topology = Some(topology);
        self.index = index_of(&self.data);
        self.forget_all_unused_versions();
        Applied::TopologyLoaded {
            nodes,
            drained: drained_now,
            restored,
            released,
            price_epoch: self.data.prices.epochs().len().saturating_sub(1) as u32,
        }
    }

    /// The node and per-GPU demands of `inst` on `topology`, if its node is
    /// still in the same pool and its GPUs still exist (and, for exclusive
    /// instances, still have the memory its whole-GPU slices claim).
    fn slices_on(topology: &Topology, inst: &Instance) -> Option<(NodeId, Vec<(u32, Demand)>)> {
        let node_id = &inst.slices.first()?.gpu.node;
        let node = topology.node(&node_id.0)?;
        if node.pool != inst.pool || node.kind != inst.pool_kind {
            return None;
        }
        let mut demands = Vec::with_capacity(inst.slices.len());
        for s in &inst.slices {
            let g = node.gpu(s.gpu.index)?;
            if s.gpu.node != *node_id
                || (inst.tier == Tier::Exclusive && g.memory_mib != s.memory_mib)
            {
                return None;
            }
            demands.push((s.gpu.index, inst.demand(s)));
        }
        Some((node_id.clone(), demands))
    }

    /// The checks a deploy's apply makes of `spec` alone (its fields,
    /// bounds and pool), without planning: the scheduler refuses an
    /// invalid spec before planning it, as apply would.
    pub fn check_function_spec(&self, spec: &FunctionSpec) -> Result<(), ApplyError> {
        self.validate_spec(spec)
    }

    /// Whether a deploy of `spec` has room in its tenant's stored specs
    /// ([`bounds::MAX_TENANT_SPEC_BYTES`]), as apply checks it after the
    /// name: the scheduler and a dry run refuse it before planning.
    pub fn check_spec_room(&self, spec: &FunctionSpec) -> Result<(), ApplyError> {
        self.check_stored(&spec.tenant, 0, bounds::spec_bytes(spec))
    }

    fn validate_spec(&self, spec: &FunctionSpec) -> Result<(), ApplyError> {
        let bad = |field: &str, reason: String| ApplyError::InvalidSpec {
            field: field.to_string(),
            reason,
        };
        if !is_valid_name(&spec.name) {
            return Err(ApplyError::InvalidName {
                kind: ObjectKind::Function,
                name: spec.name.clone(),
            });
        }
        if spec.tier == Tier::Exclusive {
            let gpus = spec.compute_milli / WHOLE_GPU;
            if spec.compute_milli % WHOLE_GPU != 0 || gpus == 0 || gpus > MAX_GPUS_PER_INSTANCE {
                return Err(bad(
                    "compute_milli",
                    format!(
                        "an exclusive function takes 1 to {MAX_GPUS_PER_INSTANCE} whole GPUs (a multiple of 1000), got {}",
                        spec.compute_milli
                    ),
                ));
            }
        } else if !(1..=WHOLE_GPU).contains(&spec.compute_milli) {
            return Err(bad(
                "compute_milli",
                format!(
                    "a {} function takes 1 to 1000 milli-GPU of one GPU, got {}",
                    spec.tier, spec.compute_milli
                ),
            ));
        }
        bounds::check_spec(spec)?;
        crate::serving::check_serving(spec)?;
        if spec.min_instances > spec.max_instances {
            return Err(bad(
                "max_instances",
                format!(
                    "must be at least 1 and at least min_instances ({}), got {}",
                    spec.min_instances, spec.max_instances
                ),
            ));
        }
        if let Some(pool) = spec.pool.edge_pool() {
            let ok = self
                .data
                .topology
                .as_ref()
                .and_then(|t| t.pool(pool))
                .is_some_and(|p| p.kind == PoolKind::Edge);
            if !ok {
                return Err(ApplyError::UnknownPool {
                    pool: pool.to_string(),
                });
            }
        }
        Ok(())
    }

    fn function_deploy(
        &mut self,
        spec: FunctionSpec,
        now: UnixMillis,
    ) -> Result<Applied, ApplyError> {
        self.known_tenant(&spec.tenant)?;
        self.validate_spec(&spec)?;
        if self.function(&spec.tenant, &spec.name).is_ok() {
            return Err(ApplyError::DuplicateName {
                kind: ObjectKind::Function,
                name: spec.name,
            });
        }
        let bytes = bounds::spec_bytes(&spec);
        self.check_stored(&spec.tenant, 0, bytes)?;
        let (tenant, name) = (spec.tenant.clone(), spec.name.clone());
        self.data
            .functions
            .entry(tenant.clone())
            .or_default()
            .insert(
                name.clone(),
                FunctionRecord {
                    spec,
                    version: 1,
                    deployed_at: now,
                    updated_at: now,
                    older: BTreeMap::new(),
                },
            );
        self.index.change_stored(&tenant, 0, bytes);
        Ok(Applied::FunctionDeployed {
            tenant,
            name,
            version: 1,
        })
    }

    /// An update that changes what an instance holds or runs (runtime,
    /// memory, compute, tier, pool preference, model, args, env) makes the function's
    /// instances outgoing: they keep their version (and its spec, kept in
    /// [`FunctionRecord::older`]) and their slices, so they serve on and
    /// count against capacity and quota, but not against `max_instances`;
    /// the leader's roll replaces each by a new-version instance, a `roll`
    /// migration ended once the new one is ready (make-before-break).
    /// Other changes keep the instances and move the current ones to the
    /// new version (instances over a lowered `max_instances` go, newest
    /// first).
    fn function_update(
        &mut self,
        spec: FunctionSpec,
        now: UnixMillis,
    ) -> Result<Applied, ApplyError> {
        self.known_tenant(&spec.tenant)?;
        let old = self
            .function(&spec.tenant, &spec.name)
            .map_err(|_| ApplyError::UnknownFunction {
                tenant: spec.tenant.clone(),
                name: spec.name.clone(),
            })?
            .clone();
        self.validate_spec(&spec)?;
        let version = old.version.checked_add(1).ok_or(ApplyError::Overflow)?;
        let o = &old.spec;
        // What the process runs (model, args, env) is fixed when it
        // starts: a change of it is a reshape too.
        let reshaped = (o.runtime, o.memory_mib, o.compute_milli, o.tier, &o.pool)
            != (
                spec.runtime,
                spec.memory_mib,
                spec.compute_milli,
                spec.tier,
                &spec.pool,
            )
            || (&o.model, &o.args, &o.env) != (&spec.model, &spec.args, &spec.env);
        let (tenant, name) = (spec.tenant.clone(), spec.name.clone());
        let mut released = Vec::new();
        let current: Vec<InstanceId> = self
            .instances_of(&tenant, &name)
            .filter(|i| i.version == old.version)
            .map(|i| i.id)
            .collect();
        // What the record will keep: the new spec, the kept ones, and the
        // old one while a reshape's outgoing instances run it (counted
        // before any instance goes).
        let keeps_old = if reshaped && !current.is_empty() {
            bounds::spec_bytes(&old.spec)
        } else {
            0
        };
        let after = old
            .older
            .values()
            .map(bounds::spec_bytes)
            .fold(bounds::spec_bytes(&spec), u64::saturating_add)
            .saturating_add(keeps_old);
        self.check_stored(&tenant, old.stored_bytes(), after)?;
        let mut replacing = Vec::new();
        if reshaped {
            replacing = current;
        } else {
            // Instances over a lowered max_instances go, newest first, those
            // not migrating before migrating ones (a migration's two sides
            // count once, so both go together); the others run the new
            // version from now on.
            let counted: Vec<InstanceId> = current
                .iter()
                .copied()
                .filter(|id| !self.stands_in(*id))
                .collect();
            let excess = counted.len().saturating_sub(spec.max_instances as usize);
            // (A roll's new side is counted and goes alone: its old side
            // is outgoing.)
            let moving = |id: &InstanceId| {
                self.data
                    .migrations
                    .values()
                    .find(|m| m.from == *id)
                    .map(|m| m.to)
            };
            let going: Vec<InstanceId> = counted
                .iter()
                .rev()
                .filter(|id| moving(id).is_none())
                .map(|id| vec![*id])
                .chain(
                    counted
                        .iter()
                        .rev()
                        .filter_map(|id| moving(id).map(|to| vec![*id, to])),
                )
                .take(excess)
                .flatten()
                .collect();
            for id in &going {
                self.release(*id);
                released.push(*id);
            }
            for id in current.iter().filter(|id| !going.contains(id)) {
                if let Some(i) = self.data.instances.get_mut(id) {
                    i.version = version;
                }
            }
        }
        self.edit_function(&tenant, &name, |rec| {
            if !replacing.is_empty() {
                rec.older.insert(old.version, old.spec);
            }
            rec.spec = spec;
            rec.version = version;
            rec.updated_at = now;
        })
        .expect("checked above");
        Ok(Applied::FunctionUpdated {
            tenant,
            name,
            version,
            released,
            replacing,
        })
    }

    /// Deletes `tenant`: its tokens stop working at once; its functions
    /// (only with `force`) go with their instances; its usage stays.
    fn tenant_delete(&mut self, tenant: TenantId, force: bool) -> Result<Applied, ApplyError> {
        self.known_tenant(&tenant)?;
        let functions: Vec<String> = self
            .functions_of(&tenant)
            .map(|f| f.spec.name.clone())
            .collect();
        if !functions.is_empty() && !force {
            return Err(ApplyError::TenantHasFunctions {
                tenant,
                functions: u32::try_from(functions.len()).unwrap_or(u32::MAX),
            });
        }
        let mut released = Vec::new();
        for name in &functions {
            if let Ok(Applied::FunctionDeleted { released: r, .. }) =
                self.function_delete(tenant.clone(), name.clone())
            {
                released.extend(r);
            }
        }
        if let Some(rec) = self.data.tenants.remove(&tenant) {
            for tok in rec.tokens.values() {
                self.index.digests.remove(&tok.digest);
            }
        }
        self.data.meter.keep(&tenant);
        Ok(Applied::TenantDeleted {
            tenant,
            functions,
            released,
        })
    }

    fn function_delete(&mut self, tenant: TenantId, name: String) -> Result<Applied, ApplyError> {
        if self.function(&tenant, &name).is_err() {
            return Err(ApplyError::UnknownFunction { tenant, name });
        }
        let released: Vec<InstanceId> = self.instances_of(&tenant, &name).map(|i| i.id).collect();
        for id in &released {
            self.release(*id);
        }
        if let Some(f) = self.data.functions.get_mut(&tenant) {
            if let Some(rec) = f.remove(&name) {
                self.index.change_stored(&tenant, rec.stored_bytes(), 0);
            }
            if f.is_empty() {
                self.data.functions.remove(&tenant);
            }
        }
        Ok(Applied::FunctionDeleted {
            tenant,
            name,
            released,
        })
    }

    /// Checks that `slices` are a valid placement of `spec` and fit now;
    /// returns the node's pool name and kind. The same checks as the
    /// planner's, in the same order: shape, node, count, fit, quota.
    pub(crate) fn check_placement(
        &self,
        spec: &FunctionSpec,
        slices: &[Slice],
    ) -> Result<(String, PoolKind), ApplyError> {
        let topology = self.data.topology.as_ref().ok_or(ApplyError::NoTopology)?;
        let mismatch = |reason: String| ApplyError::SliceMismatch {
            function: spec.name.clone(),
            reason,
        };
        let first = slices.first().ok_or_else(|| mismatch("no slices".into()))?;
        let node_id = &first.gpu.node;
        if self.data.drained.contains_key(node_id) {
            return Err(ApplyError::NodeDraining {
                node: node_id.clone(),
            });
        }
        if let Some(s) = self.data.node_status.get(node_id) {
            if !s.takes_placements() {
                return Err(ApplyError::NodeNotReady {
                    node: node_id.clone(),
                    why: if s.draining {
                        "drained by the operator".into()
                    } else {
                        format!("{} since {}", s.state, s.since)
                    },
                });
            }
        }
        let node = topology
            .node(&node_id.0)
            .ok_or_else(|| ApplyError::UnknownNode {
                node: node_id.clone(),
            })?;
        if !spec.pool.allows(&node.pool, node.kind) {
            // A strict pool preference never leaves its pools, whoever
            // planned the slices (old logs hold no strict preference).
            return Err(mismatch(format!(
                "strict pool {}: node {node_id} is in {} pool {}",
                spec.pool.preferred(),
                node.kind,
                node.pool
            )));
        }
        let mut seen: BTreeSet<u32> = BTreeSet::new();
        for s in slices {
            if s.gpu.node != *node_id {
                return Err(mismatch("all slices must be on one node".into()));
            }
            let g = node
                .gpu(s.gpu.index)
                .ok_or_else(|| ApplyError::UnknownGpu { gpu: s.gpu.clone() })?;
            if !seen.insert(s.gpu.index) {
                return Err(mismatch(format!("GPU {} appears twice", s.gpu)));
            }
            if spec.tier == Tier::Exclusive
                && (s.compute_milli != WHOLE_GPU || s.memory_mib != g.memory_mib)
            {
                return Err(mismatch(format!(
                    "an exclusive slice is a whole GPU (1000 milli-GPU, {} MiB on {})",
                    g.memory_mib, s.gpu
                )));
            }
        }
        if spec.tier == Tier::Exclusive {
            let gpus = spec.compute_milli / WHOLE_GPU;
            if slices.len() as u32 != gpus {
                return Err(mismatch(format!(
                    "takes {gpus} whole GPUs, got {} slices",
                    slices.len()
                )));
            }
            let mem = held(slices).memory_mib;
            if mem < spec.memory_mib {
                return Err(mismatch(format!(
                    "needs {} MiB of GPU memory, the GPUs have {mem}",
                    spec.memory_mib
                )));
            }
        } else if slices.len() != 1
            || slices[0].compute_milli != spec.compute_milli
            || slices[0].memory_mib != spec.memory_mib
        {
            return Err(mismatch(format!(
                "takes one slice of {} milli-GPU and {} MiB",
                spec.compute_milli, spec.memory_mib
            )));
        }
        if self.instance_count(&spec.tenant, &spec.name) >= spec.max_instances {
            return Err(ApplyError::MaxInstances {
                function: spec.name.clone(),
                max: spec.max_instances,
            });
        }
        let load = self
            .index
            .node(node_id)
            .ok_or_else(|| ApplyError::UnknownNode {
                node: node_id.clone(),
            })?;
        let demands: Vec<(u32, Demand)> = slices
            .iter()
            .map(|s| {
                (
                    s.gpu.index,
                    Demand {
                        tier: spec.tier,
                        compute_milli: s.compute_milli,
                        memory_mib: s.memory_mib,
                    },
                )
            })
            .collect();
        fit(&self.data.caps, load, &demands).map_err(|f| ApplyError::GpuFull {
            gpu: GpuId {
                node: node_id.clone(),
                index: f.gpu_index,
            },
            dimension: f.dimension,
        })?;
        let tenant = self.known_tenant(&spec.tenant)?;
        tenant
            .quota(node.kind)
            .admits(&self.held(&spec.tenant, node.kind), &held(slices))
            .map_err(|dimension| ApplyError::QuotaExceeded {
                tenant: spec.tenant.clone(),
                pool_kind: node.kind,
                dimension,
            })?;
        Ok((node.pool.clone(), node.kind))
    }

    fn instance_place(
        &mut self,
        tenant: TenantId,
        function: String,
        slices: Vec<Slice>,
        now: UnixMillis,
    ) -> Result<Applied, ApplyError> {
        self.known_tenant(&tenant)?;
        let spec = &self
            .function(&tenant, &function)
            .map_err(|_| ApplyError::UnknownFunction {
                tenant: tenant.clone(),
                name: function.clone(),
            })?
            .spec;
        let tier = spec.tier;
        let (pool, pool_kind) = self.check_placement(spec, &slices)?;
        let version = self.function(&tenant, &function).map_or(0, |f| f.version);
        let id = self.insert_new(Instance {
            id: InstanceId(0),
            tenant,
            function,
            tier,
            pool,
            pool_kind,
            slices: slices.clone(),
            placed_at: now,
            version,
        })?;
        Ok(Applied::InstancePlaced {
            instance: id,
            slices,
        })
    }

    /// Adds `inst` under the next instance id (its own `id` is replaced);
    /// refused, changing nothing, when the ids ran out.
    fn insert_new(&mut self, mut inst: Instance) -> Result<InstanceId, ApplyError> {
        let id = InstanceId(self.data.next_instance);
        self.data.next_instance = id.0.checked_add(1).ok_or(ApplyError::Overflow)?;
        inst.id = id;
        self.index.add_instance(&inst);
        self.data.instances.insert(id, inst);
        Ok(id)
    }

    fn release(&mut self, id: InstanceId) {
        if let Some(inst) = self.data.instances.remove(&id) {
            self.index.remove_instance(&inst, &self.data.instances);
            self.forget_unused_versions(&inst.tenant, &inst.function);
        }
    }

    /// Drops the kept specs of `tenant`'s function `name` that no instance
    /// runs any more (its outgoing ones are all gone).
    fn forget_unused_versions(&mut self, tenant: &TenantId, name: &str) {
        let keeps = self
            .function(tenant, name)
            .is_ok_and(|rec| !rec.older.is_empty());
        if keeps {
            let used: BTreeSet<u64> = self.instances_of(tenant, name).map(|i| i.version).collect();
            self.edit_function(tenant, name, |rec| {
                rec.older.retain(|v, _| used.contains(v))
            });
        }
    }

    /// Edits `tenant`'s function `name` (`None`: there is none), keeping
    /// the count of the tenant's stored spec bytes in step.
    fn edit_function<R>(
        &mut self,
        tenant: &TenantId,
        name: &str,
        edit: impl FnOnce(&mut FunctionRecord) -> R,
    ) -> Option<R> {
        let rec = self.data.functions.get_mut(tenant)?.get_mut(name)?;
        let before = rec.stored_bytes();
        let r = edit(rec);
        let after = rec.stored_bytes();
        self.index.change_stored(tenant, before, after);
        Some(r)
    }

    /// Refuses a change of one of `tenant`'s functions from `before` to
    /// `after` stored spec bytes that grows the tenant's past
    /// [`bounds::MAX_TENANT_SPEC_BYTES`] (a change that does not grow them
    /// passes, even for a tenant above the limit).
    fn check_stored(&self, tenant: &TenantId, before: u64, after: u64) -> Result<(), ApplyError> {
        let Some(adding) = after.checked_sub(before).filter(|a| *a > 0) else {
            return Ok(());
        };
        let stored = self.stored_spec_bytes(tenant);
        if stored.saturating_add(adding) > bounds::MAX_TENANT_SPEC_BYTES {
            return Err(ApplyError::SpecStorageExceeded {
                tenant: tenant.clone(),
                stored,
                adding,
                limit: bounds::MAX_TENANT_SPEC_BYTES,
            });
        }
        Ok(())
    }

    /// [`RegionState::forget_unused_versions`] for every function that
    /// keeps an earlier version (after instances went in bulk).
    fn forget_all_unused_versions(&mut self) {
        let keys: Vec<(TenantId, String)> = self
            .functions()
            .filter(|f| !f.older.is_empty())
            .map(|f| (f.spec.tenant.clone(), f.spec.name.clone()))
            .collect();
        for (t, n) in keys {
            self.forget_unused_versions(&t, &n);
        }
    }

    fn instance_release(&mut self, instance: InstanceId) -> Result<Applied, ApplyError> {
        if !self.data.instances.contains_key(&instance) {
            return Err(ApplyError::UnknownInstance { instance });
        }
        self.release(instance);
        Ok(Applied::InstanceReleased { instance })
    }

    /// A scale-in's release: an instance of the function's current version
    /// goes only while more than its `min_instances` run that version
    /// (outgoing ones go freely: the roll replaces them). The scheduler
    /// checks the same before it proposes; this keeps two scale-ins decided
    /// on one view, or one decided before `min_instances` was raised, from
    /// both landing.
    fn instance_scale_in(&mut self, instance: InstanceId) -> Result<Applied, ApplyError> {
        let Some(inst) = self.data.instances.get(&instance) else {
            return Err(ApplyError::UnknownInstance { instance });
        };
        if self.migration_of(instance).is_some() {
            // Either side: the old one would go before the new one is
            // ready, the new one would end the migration unannounced.
            return Err(ApplyError::Migration {
                instance,
                reason: "it is migrating (a scale-in waits for the migration's end)".into(),
            });
        }
        if let Ok(f) = self.function(&inst.tenant, &inst.function) {
            if inst.version == f.version
                && self.instance_count(&inst.tenant, &inst.function) <= f.spec.min_instances
            {
                return Err(ApplyError::MinInstances {
                    function: inst.function.clone(),
                    min: f.spec.min_instances,
                });
            }
        }
        self.instance_release(instance)
    }

    /// Phase one of a remap (see [`DomainCommand::InstanceSliceReserve`]):
    /// the target slice is checked like a placement's (node not draining,
    /// GPU known and available, the same [`fit`], the tenant's quota) and
    /// added after the instance's slice.
    fn instance_slice_reserve(
        &mut self,
        instance: InstanceId,
        slice: Slice,
    ) -> Result<Applied, ApplyError> {
        let inst = self
            .data
            .instances
            .get(&instance)
            .ok_or(ApplyError::UnknownInstance { instance })?;
        if !inst.tier.remappable() {
            return Err(ApplyError::Pinned {
                instance,
                tier: inst.tier,
            });
        }
        let bad = |reason: String| Err(ApplyError::BadRemap { instance, reason });
        let [source] = inst.slices.as_slice() else {
            return bad(format!(
                "it holds {} slices; one move at a time",
                inst.slices.len()
            ));
        };
        if slice.gpu.node != source.gpu.node {
            return bad(format!(
                "the target {} is not on its node {}",
                slice.gpu, source.gpu.node
            ));
        }
        if slice.gpu.index == source.gpu.index {
            return bad(format!("it already holds a slice of {}", slice.gpu));
        }
        if (slice.compute_milli, slice.memory_mib) != (source.compute_milli, source.memory_mib) {
            return bad(format!(
                "the target is {} milli-GPU and {} MiB, its slice {} milli-GPU and {} MiB",
                slice.compute_milli, slice.memory_mib, source.compute_milli, source.memory_mib
            ));
        }
        let node_id = &slice.gpu.node;
        if self.data.drained.contains_key(node_id) {
            return Err(ApplyError::NodeDraining {
                node: node_id.clone(),
            });
        }
        let topology = self.data.topology.as_ref().ok_or(ApplyError::NoTopology)?;
        let node = topology
            .node(&node_id.0)
            .ok_or_else(|| ApplyError::UnknownNode {
                node: node_id.clone(),
            })?;
        if node.gpu(slice.gpu.index).is_none() {
            return Err(ApplyError::UnknownGpu {
                gpu: slice.gpu.clone(),
            });
        }
        let load = self
            .index
            .node(node_id)
            .ok_or_else(|| ApplyError::UnknownNode {
                node: node_id.clone(),
            })?;
        fit(
            &self.data.caps,
            load,
            &[(slice.gpu.index, inst.demand(&slice))],
        )
        .map_err(|f| ApplyError::GpuFull {
            gpu: GpuId {
                node: node_id.clone(),
                index: f.gpu_index,
            },
            dimension: f.dimension,
        })?;
        let extra = Quota {
            compute_milli: u64::from(slice.compute_milli),
            memory_mib: slice.memory_mib,
            instances: 0,
        };
        self.known_tenant(&inst.tenant)?
            .quota(inst.pool_kind)
            .admits(&self.held(&inst.tenant, inst.pool_kind), &extra)
            .map_err(|dimension| ApplyError::QuotaExceeded {
                tenant: inst.tenant.clone(),
                pool_kind: inst.pool_kind,
                dimension,
            })?;
        let mut moved = inst.clone();
        moved.slices.push(slice);
        let slices = moved.slices.clone();
        self.replace_instance(moved);
        Ok(Applied::SliceReserved { instance, slices })
    }

    /// Phase two of a remap, or its abort (see
    /// [`DomainCommand::InstanceSliceRelease`]).
    fn instance_slice_release(
        &mut self,
        instance: InstanceId,
        gpu: GpuId,
    ) -> Result<Applied, ApplyError> {
        let inst = self
            .data
            .instances
            .get(&instance)
            .ok_or(ApplyError::UnknownInstance { instance })?;
        if !inst.slices.iter().any(|s| s.gpu == gpu) {
            return Err(ApplyError::BadRemap {
                instance,
                reason: format!("it holds no slice of {gpu}"),
            });
        }
        if inst.slices.len() < 2 || !inst.tier.remappable() {
            return Err(ApplyError::BadRemap {
                instance,
                reason: format!(
                    "its slice of {gpu} is its placement, not a move's (release the instance instead)"
                ),
            });
        }
        let mut moved = inst.clone();
        moved.slices.retain(|s| s.gpu != gpu);
        let slices = moved.slices.clone();
        self.replace_instance(moved);
        Ok(Applied::SliceReleased { instance, slices })
    }

    /// Replaces a placed instance (same id) and its look-up entries.
    fn replace_instance(&mut self, inst: Instance) {
        if let Some(old) = self.data.instances.remove(&inst.id) {
            self.index.remove_instance(&old, &self.data.instances);
        }
        self.index.add_instance(&inst);
        self.data.instances.insert(inst.id, inst);
    }

    /// The checks of a registration that do not look at GPUs; the node.
    fn registrable(
        &self,
        agent: &AgentId,
        node: &NodeId,
        version: &str,
    ) -> Result<&crate::config::Node, ApplyError> {
        if !is_valid_name(&agent.0) {
            return Err(ApplyError::InvalidName {
                kind: ObjectKind::Agent,
                name: agent.0.clone(),
            });
        }
        check_label("version", Some(version))?;
        let topology = self.data.topology.as_ref().ok_or(ApplyError::NoTopology)?;
        if self.data.drained.contains_key(node) {
            return Err(ApplyError::NodeDraining { node: node.clone() });
        }
        topology
            .node(&node.0)
            .ok_or_else(|| ApplyError::UnknownNode { node: node.clone() })
    }

    fn agent_register_gpus(
        &mut self,
        agent: AgentId,
        node: NodeId,
        version: String,
        gpus: &[crate::protocol::NodeGpu],
        allow_fewer_gpus: bool,
        now: UnixMillis,
    ) -> Result<Applied, ApplyError> {
        let topo_node = self.registrable(&agent, &node, &version)?;
        let missing = super::node_gpus::check_reported_gpus(topo_node, gpus, allow_fewer_gpus)
            .map_err(|reason| ApplyError::GpuMismatch {
                node: node.clone(),
                reason,
            })?;
        if self
            .data
            .unavailable_gpus
            .get(&node)
            .unwrap_or(&BTreeSet::new())
            != &missing
        {
            let on_missing: Vec<InstanceId> = self
                .data
                .instances
                .values()
                .filter(|i| {
                    i.slices
                        .iter()
                        .any(|s| s.gpu.node == node && missing.contains(&s.gpu.index))
                })
                .map(|i| i.id)
                .collect();
            for id in on_missing {
                self.data.instances.remove(&id);
            }
            if missing.is_empty() {
                self.data.unavailable_gpus.remove(&node);
            } else {
                self.data.unavailable_gpus.insert(node.clone(), missing);
            }
            self.index = index_of(&self.data);
            self.forget_all_unused_versions();
        }
        self.agent_register(agent, node, version, now)
    }

    fn agent_register(
        &mut self,
        agent: AgentId,
        node: NodeId,
        version: String,
        now: UnixMillis,
    ) -> Result<Applied, ApplyError> {
        self.registrable(&agent, &node, &version)?;
        let first_time = !self.data.agents.contains_key(&agent);
        let rec = self
            .data
            .agents
            .entry(agent.clone())
            .or_insert_with(|| AgentRecord {
                id: agent,
                node: node.clone(),
                version: version.clone(),
                first_registered_at: now,
                registered_at: now,
                cursor: SequenceCursor::default(),
            });
        rec.node = node;
        rec.version = version;
        rec.registered_at = now;
        Ok(Applied::AgentRegistered {
            first_time,
            next_seq: rec.cursor.contiguous.saturating_add(1),
        })
    }

    /// Applies the records not applied before; the whole batch is refused
    /// (and nothing applied) if any new record is invalid.
    fn usage_batch(
        &mut self,
        agent: AgentId,
        records: Vec<UsageRecord>,
    ) -> Result<Applied, ApplyError> {
        let cursor = &self
            .data
            .agents
            .get(&agent)
            .ok_or_else(|| ApplyError::UnknownAgent {
                agent: agent.clone(),
            })?
            .cursor;
        if records.len() > MAX_USAGE_BATCH {
            return Err(ApplyError::InvalidUsage {
                reason: format!(
                    "{} records, at most {MAX_USAGE_BATCH} per batch",
                    records.len()
                ),
            });
        }
        let mut fresh: BTreeSet<u64> = BTreeSet::new();
        let mut sums: BTreeMap<(TenantId, MeterKey), Usage> = BTreeMap::new();
        let mut duplicates = 0u32;
        for r in &records {
            if !cursor.in_window(r.seq) {
                return Err(ApplyError::SequenceOutOfWindow {
                    agent,
                    seq: r.seq,
                    limit: cursor
                        .contiguous
                        .saturating_add(super::sequence::MAX_SEQUENCE_AHEAD),
                });
            }
            if cursor.seen(r.seq) || !fresh.insert(r.seq) {
                duplicates = duplicates.saturating_add(1);
                continue;
            }
            // A deleted tenant's late records still count (its meter entry is kept).
            if !self.data.meter.has(&r.tenant) {
                self.known_tenant(&r.tenant)?;
            }
            if !is_valid_name(&r.function) {
                return Err(ApplyError::InvalidUsage {
                    reason: format!("record {}: invalid function name {:?}", r.seq, r.function),
                });
            }
            let epoch = self
                .data
                .prices
                .epoch_at(r.end_ms)
                .ok_or(ApplyError::NoTopology)?;
            let priced = self
                .data
                .prices
                .list(epoch)
                .and_then(|l| l.price(&r.gpu_model, r.pool_kind))
                .is_some();
            if !priced {
                return Err(ApplyError::NoPrice {
                    gpu_model: r.gpu_model.clone(),
                    pool_kind: r.pool_kind,
                });
            }
            let key = MeterKey {
                hour: r.end_ms / HOUR_MS,
                function: r.function.clone(),
                gpu_model: r.gpu_model.clone(),
                pool_kind: r.pool_kind,
                tier: r.tier,
                price_epoch: epoch,
            };
            let add = Usage {
                compute_milli_gpu_ms: r.compute_milli_gpu_ms,
                memory_mib_ms: r.memory_mib_ms,
                invocations: r.invocations,
            };
            let k = (r.tenant.clone(), key);
            let sum = match sums.get(&k) {
                Some(s) => *s,
                None => self.data.meter.get(&k.0, &k.1),
            };
            sums.insert(k, sum.checked_add(&add).ok_or(ApplyError::Overflow)?);
        }
        let applied = fresh.len() as u32;
        let rec = self.data.agents.get_mut(&agent).expect("checked above");
        for seq in fresh {
            rec.cursor.record(seq);
        }
        for ((tenant, key), usage) in sums {
            self.data.meter.set(&tenant, key, usage);
        }
        Ok(Applied::UsageApplied {
            applied,
            duplicates,
        })
    }
}

#[cfg(test)]
mod v1_tests {
    use super::*;

    /// A state with a topology whose policy is `fgd`.
    fn state() -> RegionState {
        let text = "[placement]\npolicy = \"fgd\"\n\
            [[gpu_models]]\nname = \"g\"\nmemory_mib = 16_384\nh2d_mib_per_s = 1\n\
            [cold_start]\nsetup_us = 1\nstorage_mib_per_s = 1\n[swap]\nsetup_us = 1\n\
            [[pools]]\nname = \"p\"\nkind = \"center\"\n\
            [[pools.nodes]]\nname = \"n\"\ncpu_milli = 1\nmemory_mib = 1\nswap_mib = 0\n\
            gpus = [{ model = \"g\", count = 1 }]\n\
            [pricing]\ncurrency = \"USD\"\nunit = \"u\"\nunits_per_currency = 1\n\
            [pricing.tiers]\nexclusive = { discount_bp = 0 }\nguaranteed = { discount_bp = 0 }\n\
            burstable = { discount_bp = 0 }\noversubscribed = { discount_bp = 0 }\n\
            [[pricing.prices]]\ngpu_model = \"g\"\npool_kind = \"center\"\ngpu_hour = 1\nmemory_gib_hour = 1\n";
        let topology = Topology::from_toml("t.toml", text).unwrap_or_else(|e| panic!("{e}"));
        let mut s = RegionState::default();
        s.apply(DomainCommand::TopologyLoad { topology }, 0)
            .unwrap();
        s
    }

    #[test]
    fn a_snapshot_written_before_placement_policies_decodes_as_v1() {
        let config = bincode::config::standard();
        let s = state();
        assert_eq!(s.placement_policy(), RegionPolicy::Fgd);
        // The older form: the same data with the topology in its older form.
        let d = StateData::from(s.clone());
        let old = StateDataOf {
            topology: d.topology.clone().map(LegacyTopology),
            caps: d.caps,
            tenants: d.tenants.clone(),
            functions: d.functions.clone(),
            instances: d.instances.clone(),
            next_instance: d.next_instance,
            drained: d.drained.clone(),
            unavailable_gpus: d.unavailable_gpus.clone(),
            agents: d.agents.clone(),
            prices: d.prices.clone(),
            meter: d.meter.clone(),
            idempotency: d.idempotency.clone(),
            node_status: d.node_status.clone(),
            migrations: d.migrations.clone(),
            operator_placed: d.operator_placed.clone(),
        };
        let bytes = bincode::serde::encode_to_vec(&old, config).unwrap();
        // Not the current form …
        let current: Result<(RegionState, usize), _> =
            bincode::serde::decode_from_slice(&bytes, config);
        assert!(
            current.is_err() || current.as_ref().is_ok_and(|(_, n)| *n != bytes.len()),
            "the older form must not pass for the current one"
        );
        // … but the older one: everything kept, the policy the default.
        let (v1, used): (RegionStateV1, usize) =
            bincode::serde::decode_from_slice(&bytes, config).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(v1.0.placement_policy(), RegionPolicy::Gshare);
        let back = StateData::from(v1.0);
        assert_eq!(
            back.topology.map(|t| t.with_placement(RegionPolicy::Fgd)),
            d.topology
        );
        assert_eq!(back.node_status, d.node_status);
    }
}
