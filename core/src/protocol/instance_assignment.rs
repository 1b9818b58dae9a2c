//! The instances the region assigns to a node.

use crate::model::{FunctionSpec, NodeId, Slice, TenantId};
use crate::state::InstanceId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// One instance a node must host: its function and its slices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignedInstance {
    /// Instance id (region-wide).
    pub instance: InstanceId,
    /// The function it serves (tenant, name, tier, memory, latency profile …).
    pub spec: FunctionSpec,
    /// Function version the spec belongs to.
    pub version: u64,
    /// Its slices on this node's GPUs.
    pub slices: Vec<Slice>,
}

/// The full set of instances for one node, from the replicated state.
///
/// Sent whole (not as a diff) so a reconnecting agent needs no history:
/// instances it hosts and that are missing here are released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Raft index of the state this was read from; an agent ignores an
    /// assignment older than one it has applied.
    pub applied_index: u64,
    /// The instances.
    pub instances: Vec<AssignedInstance>,
}

impl Assignment {
    /// The assignment of `node` in `state`, read at Raft index `index`: every
    /// instance with a slice on the node, with the spec of the version it
    /// runs (an outgoing instance runs its own, earlier version's spec until
    /// the roll of a reshaping update releases it). The region pushes it to
    /// the node's agent; the simulation reads it the same way.
    pub fn of_node(state: &crate::state::RegionState, node: &NodeId, index: u64) -> Assignment {
        let instances = state
            .instances()
            .filter(|i| i.slices.iter().any(|sl| &sl.gpu.node == node))
            .filter_map(|i| {
                let (spec, version) = state.instance_spec(i.id)?;
                Some(AssignedInstance {
                    instance: i.id,
                    spec: spec.clone(),
                    version,
                    slices: i.slices.clone(),
                })
            })
            .collect();
        Assignment {
            applied_index: index,
            instances,
        }
    }
}

/// A hosted function: (tenant, name, version). During a reshaping update's
/// roll a node may host two versions of one function at once.
pub type HostedKey = (TenantId, String, u64);

/// One function an assignment wants hosted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedFunction {
    /// Its spec (of this version).
    pub spec: FunctionSpec,
    /// Its version.
    pub version: u64,
    /// Its instances on this node.
    pub instances: Vec<InstanceId>,
    /// Each instance's slices on this node.
    pub slices: Vec<(InstanceId, Vec<Slice>)>,
}

/// What an agent's hosted functions must become to match an assignment:
/// computed without I/O ([`plan_assignment`]) and carried out by the agent's
/// actor, or by the deterministic simulation (`tests/src/sim`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignmentPlan {
    /// The assignment's index (the agent remembers it).
    pub index: u64,
    /// The functions to host, with their instances and slices: add the
    /// ones not hosted, update the instances and slices of the others.
    pub wanted: BTreeMap<HostedKey, WantedFunction>,
    /// Every (instance, GPU) slice the assignment holds: a slice release
    /// asked earlier is done once its slice is no longer here.
    pub held: BTreeSet<(InstanceId, u32)>,
    /// Hosted functions to remove: no longer assigned, or assigned with
    /// another spec (removed, then added again as wanted).
    pub stale: Vec<HostedKey>,
    /// Instances with a slice on another node (ignored; the agent warns).
    pub foreign: Vec<InstanceId>,
}

/// Plans the reconciliation of the functions `hosted` (key and spec) with
/// assignment `a` for `node`; `None` when `a` is older than the assignment
/// last applied (`applied`): it is ignored.
pub fn plan_assignment<'a>(
    applied: Option<u64>,
    node: &NodeId,
    a: Assignment,
    hosted: impl IntoIterator<Item = (&'a HostedKey, &'a FunctionSpec)>,
) -> Option<AssignmentPlan> {
    if applied.is_some_and(|i| a.applied_index < i) {
        return None;
    }
    let mut wanted: BTreeMap<HostedKey, WantedFunction> = BTreeMap::new();
    let mut foreign = Vec::new();
    for i in a.instances {
        if i.slices.iter().any(|s| &s.gpu.node != node) {
            foreign.push(i.instance);
            continue;
        }
        let key = (i.spec.tenant.clone(), i.spec.name.clone(), i.version);
        let w = wanted.entry(key).or_insert_with(|| WantedFunction {
            spec: i.spec.clone(),
            version: i.version,
            instances: Vec::new(),
            slices: Vec::new(),
        });
        w.instances.push(i.instance);
        w.slices.push((i.instance, i.slices));
    }
    let held = wanted
        .values()
        .flat_map(|w| {
            w.slices
                .iter()
                .flat_map(|(id, s)| s.iter().map(move |s| (*id, s.gpu.index)))
        })
        .collect();
    let stale = hosted
        .into_iter()
        .filter(|(key, spec)| wanted.get(*key).is_none_or(|w| w.spec != **spec))
        .map(|(key, _)| key.clone())
        .collect();
    Some(AssignmentPlan {
        index: a.applied_index,
        wanted,
        held,
        stale,
        foreign,
    })
}
