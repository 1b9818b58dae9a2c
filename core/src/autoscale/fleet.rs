//! The region's autoscalers: one [`Autoscaler`] per deployed function,
//! fed the summed load reports and turned into scale actions on the
//! committed view (pure: the leader's tick passes the view, the loads and
//! `now`).

use std::collections::{BTreeMap, BTreeSet};

use super::{pick_scale_in, Autoscaler, Decision, Params};
use crate::model::{NodeId, TenantId};
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

    /// One tick at `now_ms`: each function of `view` whose count may change
    /// (`min_instances < max_instances`) observes its summed
    /// load (`loads`; a function no agent reports observes nothing) and
    /// decides on its instances; functions gone from `view` are forgotten.
    /// `waiting` names, per function, the nodes whose agent reports
    /// requests of it waiting (a scale-in keeps the last copy there).
    pub fn step(
        &mut self,
        params: &Params,
        view: &RegionState,
        loads: &BTreeMap<FunctionKey, RegionLoad>,
        waiting: &BTreeMap<FunctionKey, BTreeSet<NodeId>>,
        now_ms: u64,
    ) -> Vec<ScaleStep> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        let none = BTreeSet::new();
        for f in view.functions() {
            // A fixed count has nothing to decide (and most functions of a
            // large region may be such: the tick stays proportional to
            // the functions that can scale).
            if f.spec.min_instances >= f.spec.max_instances {
                continue;
            }
            let key = (f.spec.tenant.clone(), f.spec.name.clone());
            seen.insert(key.clone());
            let current = view.instance_count(&key.0, &key.1);
            let scaler = self
                .by_function
                .entry(key.clone())
                .or_insert_with(|| Autoscaler::resume(now_ms, current));
            if let Some(load) = loads.get(&key) {
                scaler.observe(params, load.signal(now_ms));
            }
            // A placement counts as activity: an instance just woken from
            // zero is not released before its agent reports on it.
            if let Some(at) = view.instances_of(&key.0, &key.1).map(|i| i.placed_at).max() {
                scaler.placed(at);
            }
            // Quota is checked where the placement applies: a refused
            // placement changes nothing and the next tick decides again.
            let decision = scaler.decide(params, &f.spec, now_ms, current, u32::MAX);
            // A rolling update owns the count until its roll is done (it
            // replaces the outgoing instances one for one), and so does a
            // drain or a replacement off a not-ready node (its new instance
            // is one more until the old one goes).
            let moving = view.outgoing(&key.0, &key.1).next().is_some()
                || view
                    .instances_of(&key.0, &key.1)
                    .any(|i| i.slices.iter().any(|s| !view.takes_placements(&s.gpu.node)));
            let action = if moving {
                None
            } else if decision.desired > current {
                Some(ScaleAction::Out {
                    desired: decision.desired,
                })
            } else if decision.desired < current {
                let nodes = waiting.get(&key).unwrap_or(&none);
                let candidates = view.scale_in_candidates(&key.0, &key.1, nodes);
                pick_scale_in(&candidates).map(|c| ScaleAction::In { instance: c.id })
            } else {
                None
            };
            out.push(ScaleStep {
                key,
                decision,
                action,
            });
        }
        self.by_function.retain(|k, _| seen.contains(k));
        out
    }
}
