//! Plans made but not yet applied, as the planner sees them on top of the
//! applied view: the leader's scheduler plans the next batch against the
//! applied state plus the batches still being committed, so it can
//! propose one batch while another commits.
//!
//! ```text
//!   applied view (RegionState) ──┐
//!                                ├─▶ planner sees: node loads, held quota, instance counts
//!   PendingPlans (reserved) ─────┘        (a node with a pending plan: its applied load + the plans)
//!   reserve(plan) after planning; release(ticket) once its command applied or was refused
//! ```
//!
//! It is an overlay, not a second truth: a node with a pending plan is a
//! copy of its applied load (as of the last reserve or release that
//! touched it) plus the pending demands, so a change that another writer
//! applied meanwhile (a delete, a topology reload) shows only after the
//! next release on that node. Apply re-checks every placement with the same
//! `fit`; a plan made on a stale overlay is refused and planned again. A
//! node's GPUs stay filed under the pool they were overlaid with until
//! that release takes them out (a reload may hand the position to another
//! pool meanwhile; the indexed planner leaves such an overlay to the scan).

use super::command::DomainCommand;
use super::fit::{Demand, NodeLoad};
use super::free_index::{FreeIndex, GpuClass};
use super::instance::held;
use super::region_state::RegionState;
use crate::model::{FunctionSpec, PoolKind, Quota, Slice, TenantId};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One reserved plan (see [`PendingPlans::reserve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PlanTicket(u64);

#[derive(Debug, Clone)]
struct PendingPlan {
    tenant: TenantId,
    function: String,
    pool_kind: PoolKind,
    held: Quota,
    /// (node position, GPU index, demand).
    slices: Vec<(usize, u32, Demand)>,
}

/// A node with a pending plan.
#[derive(Debug, Clone)]
struct Overlaid {
    /// The pool its GPUs are filed under in [`PendingPlans::free`], as of
    /// the reserve or release that overlaid it. Kept because a topology
    /// reload (another writer) may give its position to a node of another
    /// pool meanwhile: every later move or removal of its GPUs in the
    /// index must name the class they were filed under, or they stay.
    pool: u32,
    /// Applied load plus the pending demands.
    load: NodeLoad,
}

/// The plans reserved and not yet released.
#[derive(Debug, Clone, Default)]
pub struct PendingPlans {
    /// Nodes with a pending plan, by position.
    nodes: HashMap<usize, Overlaid>,
    /// The GPUs of `nodes` by class (each under its node's `pool`).
    free: FreeIndex,
    plans: BTreeMap<PlanTicket, PendingPlan>,
    by_node: HashMap<usize, BTreeSet<PlanTicket>>,
    held: HashMap<(TenantId, PoolKind), Quota>,
    counts: HashMap<(TenantId, String), u32>,
    next: u64,
}

impl PendingPlans {
    /// Number of plans reserved.
    pub fn len(&self) -> usize {
        self.plans.len()
    }

    /// Whether none is reserved.
    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }

    /// Number of nodes whose load the overlay replaces.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// The overlaid load of the node at `pos` (topology order), if a
    /// pending plan touches it.
    pub fn node(&self, pos: usize) -> Option<&NodeLoad> {
        self.nodes.get(&pos).map(|n| &n.load)
    }

    /// The pool (topology index) the overlaid node at `pos` is filed
    /// under in [`PendingPlans::free`].
    pub(crate) fn pool_filed(&self, pos: usize) -> Option<u32> {
        self.nodes.get(&pos).map(|n| n.pool)
    }

    /// The GPUs of the overlaid nodes by class.
    pub(crate) fn free(&self) -> &FreeIndex {
        &self.free
    }

    /// What `tenant`'s pending plans hold in pools of `kind`.
    pub fn held(&self, tenant: &TenantId, kind: PoolKind) -> Quota {
        self.held
            .get(&(tenant.clone(), kind))
            .copied()
            .unwrap_or_default()
    }

    /// Pending instances of `tenant`'s function `function`.
    pub fn count(&self, tenant: &TenantId, function: &str) -> u32 {
        self.counts
            .get(&(tenant.clone(), function.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// The GPUs (node position, GPU index) that `tenant`'s pending plans
    /// of `function` take, in no particular order.
    pub fn gpus_of<'a>(
        &'a self,
        tenant: &'a TenantId,
        function: &'a str,
    ) -> impl Iterator<Item = (usize, u32)> + 'a {
        self.plans
            .values()
            .filter(move |p| &p.tenant == tenant && p.function == function)
            .flat_map(|p| p.slices.iter().map(|(pos, gpu, _)| (*pos, *gpu)))
    }

    /// Reserves one instance of `spec` on `slices` (planned on `view`
    /// plus these pending plans). Slices on nodes `view` does not know
    /// are left out (apply refuses them anyway).
    pub fn reserve(
        &mut self,
        view: &RegionState,
        spec: &FunctionSpec,
        slices: &[Slice],
    ) -> PlanTicket {
        let ticket = PlanTicket(self.next);
        self.next = self.next.saturating_add(1);
        let mut at = Vec::with_capacity(slices.len());
        for s in slices {
            if let Some(pos) = view.node_position(&s.gpu.node) {
                let d = Demand {
                    tier: spec.tier,
                    compute_milli: s.compute_milli,
                    memory_mib: s.memory_mib,
                };
                at.push((pos, s.gpu.index, d));
            }
        }
        let pool_kind = at
            .first()
            .and_then(|(pos, _, _)| view.pool_of_position(*pos))
            .map_or(PoolKind::Center, |p| p.kind);
        let plan = PendingPlan {
            tenant: spec.tenant.clone(),
            function: spec.name.clone(),
            pool_kind,
            held: held(slices),
            slices: at,
        };
        let h = self
            .held
            .entry((plan.tenant.clone(), plan.pool_kind))
            .or_default();
        *h = h.saturating_add(&plan.held);
        let c = self
            .counts
            .entry((plan.tenant.clone(), plan.function.clone()))
            .or_default();
        *c = c.saturating_add(1);
        for &(pos, gpu, d) in &plan.slices {
            self.by_node.entry(pos).or_default().insert(ticket);
            if !self.nodes.contains_key(&pos) {
                self.overlay(view, pos);
            }
            self.add_demand(pos, gpu, &d);
        }
        self.plans.insert(ticket, plan);
        ticket
    }

    /// Reserves every instance a planned command places (an
    /// `InstancePlace`, or a `FunctionCreate`, keyed or not).
    pub fn reserve_command(&mut self, view: &RegionState, cmd: &DomainCommand) -> Vec<PlanTicket> {
        match cmd {
            DomainCommand::Keyed { command, .. } => self.reserve_command(view, command),
            DomainCommand::FunctionCreate { spec, placements } => placements
                .iter()
                .map(|slices| self.reserve(view, spec, slices))
                .collect(),
            DomainCommand::InstancePlace {
                tenant,
                function,
                slices,
            } => match view.function(tenant, function) {
                Ok(f) => vec![self.reserve(view, &f.spec.clone(), slices)],
                Err(_) => Vec::new(),
            },
            // A move: its new slices are held like a placement's until it
            // applies (the old instance's stay counted until then too, as
            // they are in the view).
            // A migration's new side, likewise (counted once more here
            // until it applies: conservative for the plans around it).
            DomainCommand::InstanceReplace { instance, slices }
            | DomainCommand::InstanceMigrate {
                instance, slices, ..
            } => {
                let spec = view
                    .instance(*instance)
                    .and_then(|i| view.function(&i.tenant, &i.function).ok())
                    .map(|f| f.spec.clone());
                match spec {
                    Some(spec) => vec![self.reserve(view, &spec, slices)],
                    None => Vec::new(),
                }
            }
            _ => Vec::new(),
        }
    }

    /// Forgets a reserved plan, once `view` holds its outcome (applied or
    /// refused): the nodes it touched are rebuilt from `view` plus the
    /// plans still pending on them.
    pub fn release(&mut self, view: &RegionState, ticket: PlanTicket) {
        let Some(plan) = self.plans.remove(&ticket) else {
            return;
        };
        let key = (plan.tenant.clone(), plan.pool_kind);
        if let Some(h) = self.held.get_mut(&key) {
            *h = h.saturating_sub(&plan.held);
            if *h == Quota::default() {
                self.held.remove(&key);
            }
        }
        let fkey = (plan.tenant, plan.function);
        if let Some(c) = self.counts.get_mut(&fkey) {
            *c = c.saturating_sub(1);
            if *c == 0 {
                self.counts.remove(&fkey);
            }
        }
        let touched: BTreeSet<usize> = plan.slices.iter().map(|(pos, _, _)| *pos).collect();
        for pos in touched {
            let rest = self.by_node.get_mut(&pos).map(|set| {
                set.remove(&ticket);
                set.clone()
            });
            self.drop_overlay(pos);
            match rest {
                Some(rest) if !rest.is_empty() => {
                    self.overlay(view, pos);
                    for t in rest {
                        let demands: Vec<(u32, Demand)> = self.plans[&t]
                            .slices
                            .iter()
                            .filter(|(p, _, _)| *p == pos)
                            .map(|(_, g, d)| (*g, *d))
                            .collect();
                        for (g, d) in demands {
                            self.add_demand(pos, g, &d);
                        }
                    }
                }
                _ => {
                    self.by_node.remove(&pos);
                }
            }
        }
    }

    /// Copies the applied load of the node at `pos` into the overlay.
    fn overlay(&mut self, view: &RegionState, pos: usize) {
        let (Some(node), Some(pool)) = (view.node_loads().get(pos), view.pool_index_of(pos)) else {
            return;
        };
        let at = u32::try_from(pos).unwrap_or(u32::MAX);
        for (i, slot) in node.gpus.iter().enumerate() {
            self.free.insert(
                GpuClass::of(pool, slot),
                (at, u32::try_from(i).unwrap_or(u32::MAX)),
            );
        }
        self.nodes.insert(
            pos,
            Overlaid {
                pool,
                load: node.clone(),
            },
        );
    }

    /// Takes the node at `pos` out of the overlay: each GPU out of the
    /// class it was filed under (not the class of whatever pool `pos`
    /// belongs to now).
    fn drop_overlay(&mut self, pos: usize) {
        let Some(Overlaid { pool, load }) = self.nodes.remove(&pos) else {
            return;
        };
        let at = u32::try_from(pos).unwrap_or(u32::MAX);
        for (i, slot) in load.gpus.iter().enumerate() {
            self.free.remove(
                &GpuClass::of(pool, slot),
                (at, u32::try_from(i).unwrap_or(u32::MAX)),
            );
        }
    }

    /// Adds `d` to GPU `gpu` of the overlaid node at `pos`, moving the GPU
    /// between classes of the pool it was filed under.
    fn add_demand(&mut self, pos: usize, gpu: u32, d: &Demand) {
        let Some(Overlaid { pool, load: node }) = self.nodes.get_mut(&pos) else {
            return;
        };
        let pool = *pool;
        let Some(slot) = node.gpus.get_mut(gpu as usize) else {
            return;
        };
        let before = GpuClass::of(pool, slot);
        slot.load = slot.load.with(d);
        let after = GpuClass::of(pool, slot);
        node.refresh();
        let at = (u32::try_from(pos).unwrap_or(u32::MAX), gpu);
        self.free.set(&before, after, at);
    }
}
