//! Look-up tables derived from the replicated data: never serialized,
//! rebuilt from it after a snapshot is installed, and kept in step on
//! every apply. Its sums are of amounts `fit` and `Quota::admits` have
//! already admitted, so they saturate rather than check (a saturated load
//! or holding fails every later check and `check_invariants`).

use super::fit::{GpuCapacity, GpuLoad, GpuSlot, NodeLoad};
use super::free_index::{FreeIndex, GpuClass};
use super::function_record::FunctionRecord;
use super::instance::{Instance, InstanceId};
use super::tenant_record::TenantRecord;
use crate::config::Topology;
use crate::model::{NodeId, PoolKind, Quota, TenantId};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The derived tables.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Index {
    /// Every node of the topology with its GPUs' loads, in topology order
    /// (pool by pool, as `Topology::nodes` yields them).
    pub nodes: Vec<NodeLoad>,
    /// Node name → position in `nodes`.
    pub node_pos: HashMap<NodeId, usize>,
    /// Position of each node's pool in the topology (by position in `nodes`).
    pub pool_of: Vec<u32>,
    /// Each node's name (by position in `nodes`).
    pub names: Vec<NodeId>,
    /// Every GPU by class (size and load), for the planner.
    pub free: FreeIndex,
    /// What each tenant holds per pool kind.
    pub held: HashMap<(TenantId, PoolKind), Quota>,
    /// Token digest → (tenant, token id).
    pub digests: HashMap<String, (TenantId, String)>,
    /// Instances of each function.
    pub by_function: HashMap<(TenantId, String), BTreeSet<InstanceId>>,
    /// Bytes of function specs each tenant with functions keeps
    /// ([`FunctionRecord::stored_bytes`], summed).
    pub stored: HashMap<TenantId, u64>,
}

impl Index {
    /// Empty loads for every GPU of `topology`; the GPUs in `unavailable`
    /// (by node) take no placement.
    pub fn for_topology(
        topology: Option<&Topology>,
        unavailable: &BTreeMap<NodeId, BTreeSet<u32>>,
    ) -> Index {
        let mut nodes = Vec::new();
        let mut node_pos = HashMap::new();
        let mut pool_of = Vec::new();
        let mut names = Vec::new();
        let mut free = FreeIndex::default();
        let pools = topology.into_iter().flat_map(|t| t.pools().iter());
        for (p, pool) in pools.enumerate() {
            let p = u32::try_from(p).unwrap_or(u32::MAX);
            for node in &pool.nodes {
                let off = unavailable.get(&node.name);
                let gpus: Vec<GpuSlot> = node
                    .gpus()
                    .map(|(id, g)| GpuSlot {
                        capacity: GpuCapacity {
                            memory_mib: g.memory_mib,
                            available: !off.is_some_and(|o| o.contains(&id.index)),
                        },
                        load: GpuLoad::default(),
                        instances: Vec::new(),
                    })
                    .collect();
                let pos = u32::try_from(nodes.len()).unwrap_or(u32::MAX);
                for (i, slot) in gpus.iter().enumerate() {
                    free.insert(
                        GpuClass::of(p, slot),
                        (pos, u32::try_from(i).unwrap_or(u32::MAX)),
                    );
                }
                node_pos.insert(node.name.clone(), nodes.len());
                pool_of.push(p);
                names.push(node.name.clone());
                nodes.push(NodeLoad {
                    swap_mib: node.swap_mib,
                    gpus,
                    swap_need_mib: 0,
                });
            }
        }
        Index {
            nodes,
            node_pos,
            pool_of,
            names,
            free,
            ..Index::default()
        }
    }

    /// Refiles GPU `gpu` of the node at `pos` after its load changed from `old`.
    fn refile(&mut self, pos: usize, gpu: u32, old: GpuLoad) {
        let (Some(&pool), Some(slot)) = (
            self.pool_of.get(pos),
            self.nodes.get(pos).and_then(|n| n.gpus.get(gpu as usize)),
        ) else {
            return;
        };
        let at = (u32::try_from(pos).unwrap_or(u32::MAX), gpu);
        let before = GpuClass {
            load: old,
            ..GpuClass::of(pool, slot)
        };
        self.free.set(&before, GpuClass::of(pool, slot), at);
    }

    /// A node's load by name.
    pub fn node(&self, name: &NodeId) -> Option<&NodeLoad> {
        self.node_pos.get(name).map(|&i| &self.nodes[i])
    }

    /// All tables for the given data.
    pub fn build(
        topology: Option<&Topology>,
        unavailable: &BTreeMap<NodeId, BTreeSet<u32>>,
        tenants: &BTreeMap<TenantId, TenantRecord>,
        functions: &BTreeMap<TenantId, BTreeMap<String, FunctionRecord>>,
        instances: &BTreeMap<InstanceId, Instance>,
    ) -> Index {
        let mut index = Index::for_topology(topology, unavailable);
        for (tenant, fs) in functions {
            for f in fs.values() {
                index.change_stored(tenant, 0, f.stored_bytes());
            }
        }
        for t in tenants.values() {
            for (token_id, rec) in &t.tokens {
                index
                    .digests
                    .insert(rec.digest.clone(), (t.id.clone(), token_id.clone()));
            }
        }
        for inst in instances.values() {
            index.add_instance(inst);
        }
        index
    }

    /// Counts a function record of `tenant` whose stored bytes went from
    /// `before` to `after` (0: absent).
    pub fn change_stored(&mut self, tenant: &TenantId, before: u64, after: u64) {
        match self.stored.get_mut(tenant) {
            Some(total) => {
                *total = total.saturating_sub(before).saturating_add(after);
                if *total == 0 {
                    self.stored.remove(tenant);
                }
            }
            None if after > before => {
                self.stored
                    .insert(tenant.clone(), after.saturating_sub(before));
            }
            None => {}
        }
    }

    /// Counts a newly placed instance.
    pub fn add_instance(&mut self, inst: &Instance) {
        for s in &inst.slices {
            let Some(&pos) = self.node_pos.get(&s.gpu.node) else {
                continue;
            };
            let node = &mut self.nodes[pos];
            let mut old = None;
            if let Some(slot) = node.gpus.get_mut(s.gpu.index as usize) {
                old = Some(slot.load);
                slot.load = slot.load.with(&inst.demand(s));
                // In id order, as a rebuild lists them (a new instance has
                // the highest id; one re-added by a remap may not).
                let at = slot.instances.partition_point(|id| *id < inst.id);
                slot.instances.insert(at, inst.id);
            }
            node.refresh();
            if let Some(old) = old {
                self.refile(pos, s.gpu.index, old);
            }
        }
        let held = self
            .held
            .entry((inst.tenant.clone(), inst.pool_kind))
            .or_default();
        // Admitted by `Quota::admits` before apply got here: the sum fits.
        *held = held.saturating_add(&inst.held());
        self.by_function
            .entry((inst.tenant.clone(), inst.function.clone()))
            .or_default()
            .insert(inst.id);
    }

    /// Forgets a released instance; `remaining` are the instances still
    /// placed (the GPUs' loads are recomputed from them).
    pub fn remove_instance(&mut self, inst: &Instance, remaining: &BTreeMap<InstanceId, Instance>) {
        for s in &inst.slices {
            let Some(&pos) = self.node_pos.get(&s.gpu.node) else {
                continue;
            };
            let node = &mut self.nodes[pos];
            let mut old = None;
            if let Some(slot) = node.gpus.get_mut(s.gpu.index as usize) {
                old = Some(slot.load);
                slot.instances.retain(|id| *id != inst.id);
                let mut load = GpuLoad::default();
                for id in &slot.instances {
                    if let Some(other) = remaining.get(id) {
                        for os in other.slices.iter().filter(|os| os.gpu == s.gpu) {
                            load = load.with(&other.demand(os));
                        }
                    }
                }
                slot.load = load;
            }
            node.refresh();
            if let Some(old) = old {
                self.refile(pos, s.gpu.index, old);
            }
        }
        let key = (inst.tenant.clone(), inst.pool_kind);
        if let Some(held) = self.held.get_mut(&key) {
            *held = held.saturating_sub(&inst.held());
            if *held == Quota::default() {
                self.held.remove(&key);
            }
        }
        let fkey = (inst.tenant.clone(), inst.function.clone());
        if let Some(set) = self.by_function.get_mut(&fkey) {
            set.remove(&inst.id);
            if set.is_empty() {
                self.by_function.remove(&fkey);
            }
        }
    }
}
