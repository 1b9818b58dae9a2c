//! The region's autoscalers: one [`Autoscaler`] per deployed function,
//! fed the summed load reports and turned into scale actions on the
//! committed view (pure: the leader's tick passes the view, the loads and
//! `now`).
//!
//! The tick holds the state's lock only to copy out what a decision needs
//! ([`Autoscalers::snapshot`]: a few fields per function whose count may
//! change); the windows and rules run on that copy, outside the lock
//! ([`Autoscalers::decide`]). [`Autoscalers::step`] is the two in a row.
//!
//! ```text
//!  lock ─▶ snapshot(view, waiting) ─▶ Vec<Scalable> ─▶ unlock
//!          decide(params, scalables, loads, now) ─▶ Vec<ScaleStep>   (no lock)
//! ```

use std::collections::{BTreeMap, BTreeSet};

use super::{pick_scale_in, Autoscaler, Decision, Params, ScaleInCandidate};
use crate::model::{FunctionSpec, NodeId, TenantId};
use crate::protocol::RegionLoad;
use crate::state::{InstanceId, RegionState};

/// A function's key: (tenant, name).
pub type FunctionKey = (TenantId, String);

/// What one function's decision asks the scheduler to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScaleAction {
    /// Place one more instance (the decision wants more than there are).
    Out {
        /// Instances wanted.
        desired: u32,
    },
    /// Release this instance (the decision wants fewer).
    In {
        /// The instance [`pick_scale_in`] chose.
        instance: InstanceId,
    },
}

/// One function's outcome of a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleStep {
    /// The function.
    pub key: FunctionKey,
    /// The autoscaler's decision.
    pub decision: Decision,
    /// What to do about it (`None`: nothing; a rolling update, a drain or
    /// a replacement is under way; or every candidate for a scale-in is
    /// the last copy where requests wait). A decision to go to zero
    /// releases the last instance too: a request brings it back (held at
    /// the replica while one is placed).
    pub action: Option<ScaleAction>,
}

/// What one function's decision needs from the committed state, copied
/// out under the state's lock ([`Autoscalers::snapshot`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scalable {
    /// The function.
    pub key: FunctionKey,
    /// Its spec (counts, deadline, latency, idle timeout, shape).
    pub spec: FunctionSpec,
    /// Its instances now.
    pub current: u32,
    /// A rolling update (outgoing instances), a drain or a replacement
    /// off a not-ready node (an instance on a node that takes no
    /// placements) is under way: it owns the count.
    pub moving: bool,
    /// How many more instances the tenant's quota leaves room for
    /// ([`RegionState::quota_room`]).
    pub quota_room: u32,
    /// The instances a scale-in may release; filled only where one may
    /// happen (not moving, more than [`fewest_kept`] instances).
    pub candidates: Vec<ScaleInCandidate<InstanceId>>,
    /// When its newest instance was placed (`Instance::placed_at`), if it
    /// has one: a placement counts as activity
    /// ([`Autoscaler::placed`]).
    pub last_placed_ms: Option<u64>,
}

/// The fewest instances a scale-in leaves `spec`: its `min_instances`
/// (zero included: a request for a function with no instance is held at
/// the replica while one is placed).
pub fn fewest_kept(spec: &FunctionSpec) -> u32 {
    spec.min_instances
}

/// Every deployed function's autoscaler.
#[derive(Debug, Clone, Default)]
pub struct Autoscalers {
    by_function: BTreeMap<FunctionKey, Autoscaler>,
}

impl Autoscalers {
    /// Functions with an autoscaler.
    pub fn len(&self) -> usize {
        self.by_function.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.by_function.is_empty()
    }

    /// Forgets everything (a replica that stops leading: a new leader
    /// starts with fresh windows, as its signals are its own).
    pub fn clear(&mut self) {
        self.by_function.clear();
    }

    /// Whether any function of `view` may change its count
    /// (`min_instances < max_instances`): without one a tick has nothing
    /// to gather or decide.
    pub fn any_scalable(view: &RegionState) -> bool {
        view.functions()
            .any(|f| f.spec.min_instances < f.spec.max_instances)
    }

    /// What [`Autoscalers::decide`] needs of each function of `view` whose
    /// count may change (`min_instances < max_instances`; a fixed count
    /// has nothing to decide, and most functions of a large region may be
    /// such). `waiting` names, per function, the nodes whose agent reports
    /// requests of it waiting (a scale-in keeps the last copy there).
    pub fn snapshot(
        view: &RegionState,
        waiting: &BTreeMap<FunctionKey, BTreeSet<NodeId>>,
    ) -> Vec<Scalable> {
        let none = BTreeSet::new();
        view.functions()
            .filter(|f| f.spec.min_instances < f.spec.max_instances)
            .map(|f| {
                let key = (f.spec.tenant.clone(), f.spec.name.clone());
                let current = view.instance_count(&key.0, &key.1);
                let moving = view.outgoing(&key.0, &key.1).next().is_some()
                    || view
                        .instances_of(&key.0, &key.1)
                        .any(|i| i.slices.iter().any(|s| !view.takes_placements(&s.gpu.node)));
                let candidates = if !moving && current > fewest_kept(&f.spec) {
                    let nodes = waiting.get(&key).unwrap_or(&none);
                    view.scale_in_candidates(&key.0, &key.1, nodes)
                } else {
                    Vec::new()
                };
                Scalable {
                    last_placed_ms: view.instances_of(&key.0, &key.1).map(|i| i.placed_at).max(),
                    quota_room: view.quota_room(&f.spec),
                    key,
                    spec: f.spec.clone(),
                    current,
                    moving,
                    candidates,
                }
            })
            .collect()
    }

    /// One tick at `now_ms` on a [`Autoscalers::snapshot`]: each function
    /// observes its summed load (`loads`; a function no agent reports
    /// observes nothing) and decides on its instances; functions not in
    /// `scalables` are forgotten.
    pub fn decide(
        &mut self,
        params: &Params,
        scalables: &[Scalable],
        loads: &BTreeMap<FunctionKey, RegionLoad>,
        now_ms: u64,
    ) -> Vec<ScaleStep> {
        let mut out = Vec::with_capacity(scalables.len());
        let mut seen = BTreeSet::new();
        for f in scalables {
            seen.insert(f.key.clone());
            let current = f.current;
            let scaler = self
                .by_function
                .entry(f.key.clone())
                .or_insert_with(|| Autoscaler::resume(now_ms, current));
            if let Some(load) = loads.get(&f.key) {
                scaler.observe(params, load.signal(now_ms));
            }
            // A placement counts as activity: an instance just woken from
            // zero is not released before its agent reports on it.
            if let Some(at) = f.last_placed_ms {
                scaler.placed(at);
            }
            let decision = scaler.decide(params, &f.spec, now_ms, current, f.quota_room);
            let floor = decision.desired.max(fewest_kept(&f.spec));
            let action = if f.moving {
                None
            } else if decision.desired > current {
                Some(ScaleAction::Out {
                    desired: decision.desired,
                })
            } else if floor < current {
                pick_scale_in(&f.candidates).map(|c| ScaleAction::In { instance: c.id })
            } else {
                None
            };
            out.push(ScaleStep {
                key: f.key.clone(),
                decision,
                action,
            });
        }
        self.by_function.retain(|k, _| seen.contains(k));
        out
    }

    /// [`Autoscalers::snapshot`] of `view` then [`Autoscalers::decide`].
    pub fn step(
        &mut self,
        params: &Params,
        view: &RegionState,
        loads: &BTreeMap<FunctionKey, RegionLoad>,
        waiting: &BTreeMap<FunctionKey, BTreeSet<NodeId>>,
        now_ms: u64,
    ) -> Vec<ScaleStep> {
        let scalables = Self::snapshot(view, waiting);
        self.decide(params, &scalables, loads, now_ms)
    }
}
