//! What the leader committed about each node: whether its agent is heard
//! (`ready` / `not_ready`, or `pending` before either), and whether the
//! operator drains it. The leader's rule that turns heartbeats into these
//! entries is [`liveness_changes`]: pure, with `now` passed in.
//!
//! ```text
//!   topology load ─▶ pending ──heard──▶ ready ──silent node_ready_grace_ms──▶ not_ready
//!        │                                 ▲                                   │
//!        └─silent agent_join_grace_s──▶ not_ready ◀──────────heard─────────────┘ (▶ ready)
//!   not_ready for node_replace_grace_ms ─▶ its instances are placed elsewhere
//!   drain (operator) ─▶ no new placements, everything re-placed; undrain ─▶ back
//! ```

use super::region_state::RegionState;
use crate::model::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// A node's liveness as the leader last committed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Its agent was never heard; it takes placements during the join grace.
    Pending,
    /// Its agent heartbeats within the ready grace.
    Ready,
    /// Its agent is silent (or never came): no new placements.
    NotReady,
}

impl NodeState {
    /// Every state, in the order of `/metrics`.
    pub const ALL: [NodeState; 3] = [NodeState::Pending, NodeState::Ready, NodeState::NotReady];

    /// Its name in the API and `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Pending => "pending",
            NodeState::Ready => "ready",
            NodeState::NotReady => "not_ready",
        }
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The committed status of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Its liveness.
    pub state: NodeState,
    /// When `state` last changed (Unix ms, the entry's time); for a
    /// pending node, when it entered the topology.
    pub since: u64,
    /// Whether the operator drains it.
    pub draining: bool,
}

impl NodeStatus {
    /// A node that just entered the topology.
    pub fn pending(since: u64) -> Self {
        NodeStatus {
            state: NodeState::Pending,
            since,
            draining: false,
        }
    }

    /// Whether a new instance may be placed on it (pending past its join
    /// grace is committed `not_ready` by the leader, so it needs no clock here).
    pub fn takes_placements(&self) -> bool {
        !self.draining && self.state != NodeState::NotReady
    }
}

/// The leader's graces (`agent_join_grace_s`, `node_ready_grace_ms`,
/// `node_replace_grace_ms` of the replica config), in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessRules {
    /// How long a never-seen node takes placements.
    pub join_grace_ms: u64,
    /// Silence after which a ready node is not ready.
    pub ready_grace_ms: u64,
    /// Time not ready after which its instances are placed elsewhere.
    pub replace_grace_ms: u64,
}

/// Default of `agent_join_grace_s`.
pub const DEFAULT_AGENT_JOIN_GRACE_S: u64 = 60;
/// Default of `node_ready_grace_ms`.
pub const DEFAULT_NODE_READY_GRACE_MS: u64 = 3_000;
/// Default of `node_replace_grace_ms`.
pub const DEFAULT_NODE_REPLACE_GRACE_MS: u64 = 2_000;

impl Default for LivenessRules {
    fn default() -> Self {
        LivenessRules {
            join_grace_ms: DEFAULT_AGENT_JOIN_GRACE_S.saturating_mul(1000),
            ready_grace_ms: DEFAULT_NODE_READY_GRACE_MS,
            replace_grace_ms: DEFAULT_NODE_REPLACE_GRACE_MS,
        }
    }
}

/// What the leader should do about one node now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LivenessChange {
    /// Commit `ready` (its agent is heard).
    Ready(NodeId),
    /// Commit `not_ready` (silent past its grace, or never came).
    NotReady(NodeId),
    /// Not ready past the replace grace and still holding instances:
    /// place them elsewhere.
    Replace(NodeId),
}

/// The changes the leader should make at `now`, given when it last heard
/// each node's agent (`heard`, Unix ms, from any replica's link) and when
/// it began watching (`watching_since`: a new leader gives every node a
/// fresh grace, as it cannot know what it did not hear). A registration
/// committed in the state counts as heard at its time.
pub fn liveness_changes(
    state: &RegionState,
    heard: &BTreeMap<NodeId, u64>,
    watching_since: u64,
    now: u64,
    rules: &LivenessRules,
) -> Vec<LivenessChange> {
    let Some(topology) = state.topology() else {
        return Vec::new();
    };
    let mut registered: BTreeMap<&NodeId, u64> = BTreeMap::new();
    for a in state.agents() {
        let t = registered.entry(&a.node).or_default();
        *t = (*t).max(a.registered_at);
    }
    let mut out = Vec::new();
    for node in topology.nodes() {
        let id = &node.name;
        let status = state
            .node_status(id)
            .unwrap_or(NodeStatus::pending(watching_since));
        let last = heard
            .get(id)
            .copied()
            .max(registered.get(id).copied())
            .filter(|&t| t > 0);
        let fresh = last.is_some_and(|t| now.saturating_sub(t) <= rules.ready_grace_ms);
        match status.state {
            _ if fresh && status.state != NodeState::Ready => {
                out.push(LivenessChange::Ready(id.clone()))
            }
            NodeState::Ready if !fresh => {
                let silent_since = last.unwrap_or(0).max(watching_since).max(status.since);
                if now.saturating_sub(silent_since) > rules.ready_grace_ms {
                    out.push(LivenessChange::NotReady(id.clone()));
                }
            }
            NodeState::Pending if !fresh => {
                let since = status.since.max(watching_since);
                if now.saturating_sub(since) > rules.join_grace_ms {
                    out.push(LivenessChange::NotReady(id.clone()));
                }
            }
            NodeState::NotReady
                if now.saturating_sub(status.since) >= rules.replace_grace_ms
                    && state.instances_on(id).next().is_some() =>
            {
                out.push(LivenessChange::Replace(id.clone()))
            }
            _ => {}
        }
    }
    out
}
