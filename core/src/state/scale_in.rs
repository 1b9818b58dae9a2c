//! Which instances of a function a scale-in may release, as the pure
//! autoscaler ([`crate::autoscale::pick_scale_in`]) ranks them.

#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]

use std::collections::BTreeSet;

use crate::autoscale::ScaleInCandidate;
use crate::model::{NodeId, TenantId};

use super::{InstanceId, RegionState};

impl RegionState {
    /// Every current-version instance of `tenant`'s `function` (an
    /// outgoing one is the roll's to release) as a scale-in candidate:
    /// its tier, how full (reserved resident + oversubscribed memory over
    /// capacity, ppm) its fullest GPU is, and whether it is the function's
    /// only instance on a node in `waiting` (nodes whose agent reports
    /// requests of the function waiting).
    pub fn scale_in_candidates(
        &self,
        tenant: &TenantId,
        function: &str,
        waiting: &BTreeSet<NodeId>,
    ) -> Vec<ScaleInCandidate<InstanceId>> {
        let current = self.function(tenant, function).ok().map(|f| f.version);
        let instances: Vec<_> = self
            .instances_of(tenant, function)
            .filter(|i| current == Some(i.version))
            .collect();
        instances
            .iter()
            .map(|i| {
                let gpu_used_ppm = i
                    .slices
                    .iter()
                    .filter_map(|s| {
                        let pos = self.node_position(&s.gpu.node)?;
                        let g = self.node_loads().get(pos)?.gpus.get(s.gpu.index as usize)?;
                        let used = u128::from(g.load.resident_mib)
                            .saturating_add(u128::from(g.load.oversub_mib))
                            .saturating_mul(1_000_000);
                        let ppm = used
                            .checked_div(u128::from(g.capacity.memory_mib))
                            .unwrap_or(0);
                        Some(u32::try_from(ppm.min(1_000_000)).unwrap_or(1_000_000))
                    })
                    .max()
                    .unwrap_or(0);
                let node = i.slices.first().map(|s| &s.gpu.node);
                let last_on_node_with_waiting = node.is_some_and(|n| {
                    waiting.contains(n)
                        && !instances.iter().any(|o| {
                            o.id != i.id && o.slices.first().map(|s| &s.gpu.node) == Some(n)
                        })
                });
                ScaleInCandidate {
                    id: i.id,
                    tier: i.tier,
                    gpu_used_ppm,
                    last_on_node_with_waiting,
                }
            })
            .collect()
    }
}
