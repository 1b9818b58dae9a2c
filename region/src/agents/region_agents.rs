//! What every replica knows of the agents: each replica holds the reports
//! of the agents linked to it ([`super::AgentReports`]); a read that needs
//! all of them asks the other replicas over the peer wire
//! (`PeerRequest::AgentReports`, mutual TLS between replicas, so a tenant's
//! request can use it without the operator's token) and merges the parts.
//!
//! ```text
//!  GET /v1/cluster/agents ─┐
//!  GET /v1/cluster/view ───┤                 ┌─ this replica's part (local)
//!  GET /v1/functions/{f} ──┼─▶ gather() ─────┼─ peer 2: PeerRequest::AgentReports ─▶ ReplicaAgents
//!  ?wait=ready ────────────┘   (concurrent)  └─ peer 3: …            (≤ PEER_TIMEOUT each)
//!                                   ▼
//!                  RegionAgents { replicas (who answered), agents (newest report per agent) }
//! ```
//!
//! Staleness: a report read anywhere is its holder's latest heartbeat; the
//! holder states its age (`age_ms`, on its own clock) when it answers, and
//! its answer arrives within [`PEER_TIMEOUT`]. An agent heartbeats every
//! `heartbeat_ms` (default 1 s), so while it is linked a report read on
//! any replica is at most `heartbeat_ms` + [`PEER_TIMEOUT`] old. A replica
//! that does not answer in time is named in `replicas` with its error, and
//! the agents linked to it are missing from that answer.

use super::{AgentHub, AgentReport};
use crate::dashboard::activity::ReplicaPart;
use crate::wire::{PeerReply, PeerRequest};
use gshare_core::model::{NodeId, TenantId};
use gshare_core::protocol::{sum_loads, RegionLoad};
use gshare_core::state::{NodeState, RegionState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A function version whose weights an agent keeps: (tenant, function, version).
pub type HostCopyKey = (TenantId, String, u64);

/// Longest wait for one peer's part.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// One replica's part: the agents linked to it, and how far it has applied
/// the log (so a reader can tell whether it knows of a recent deploy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaAgents {
    /// The replica.
    pub replica: u64,
    /// Its last applied log index.
    pub applied_index: u64,
    /// The agents linked to it, with `replica`, `age_ms` and `delivered` set.
    pub agents: Vec<AgentReport>,
}

/// Every replica's agents, merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegionAgents {
    /// Each replica asked (this one first), whether its part came and its
    /// applied index when it did.
    pub replicas: Vec<(ReplicaPart, Option<u64>)>,
    /// One report per agent: the one with the newest heartbeat when two
    /// replicas hold one (an agent that moved and an old link not closed yet).
    pub agents: Vec<AgentReport>,
}

impl RegionAgents {
    /// Merges `parts`; the ones that did not come are listed with their error.
    pub fn merge(parts: Vec<(ReplicaPart, Option<ReplicaAgents>)>) -> Self {
        let mut agents = BTreeMap::<String, AgentReport>::new();
        let mut replicas = Vec::new();
        for (part, got) in parts {
            let applied = got.as_ref().map(|g| g.applied_index);
            replicas.push((part, applied));
            for a in got.into_iter().flat_map(|g| g.agents) {
                // Newer: a heartbeat received more recently (no heartbeat is oldest).
                let newer = |old: &AgentReport| match (a.age_ms, old.age_ms) {
                    (Some(new), Some(old)) => new < old,
                    (Some(_), None) => true,
                    _ => false,
                };
                match agents.get(&a.agent) {
                    Some(old) if !newer(old) => {}
                    _ => {
                        agents.insert(a.agent.clone(), a);
                    }
                }
            }
        }
        Self {
            replicas,
            agents: agents.into_values().collect(),
        }
    }

    /// The report of `node`'s agent, if some replica holds its link.
    pub fn of_node(&self, node: &str) -> Option<&AgentReport> {
        self.agents.iter().find(|a| a.node == node)
    }

    /// The nodes of these agents that `view` (the replicated state) says are
    /// `not_ready`: their reports are stale, and the sums and host copies
    /// leave them out.
    pub fn not_ready_nodes(&self, view: &RegionState) -> BTreeSet<String> {
        self.agents
            .iter()
            .filter(|a| view.node_state(&NodeId(a.node.clone())) == NodeState::NotReady)
            .map(|a| a.node.clone())
            .collect()
    }

    /// Each function's load: the latest load report of every agent summed
    /// per (tenant, function) (`sum_loads`), leaving out agents that have
    /// not heartbeated yet and those `counts` refuses (the caller passes
    /// the node's committed liveness: a `not_ready` node's load is stale).
    /// An agent that is gone has no report, so its load is gone with it.
    pub fn function_loads(
        &self,
        counts: impl Fn(&AgentReport) -> bool,
    ) -> BTreeMap<(TenantId, String), RegionLoad> {
        sum_loads(
            self.agents
                .iter()
                .filter(|a| a.heartbeat.is_some() && counts(a))
                .map(|a| (a.loads.as_slice(), a.loads_interval_ms)),
        )
    }

    /// Where each function's weights wait in host memory: the nodes whose
    /// agent reported a host copy of (tenant, function, version), in node
    /// order, leaving out agents that have not heartbeated yet and those
    /// `counts` refuses (as [`RegionAgents::function_loads`]). What the
    /// scheduler prefers when it places such a function again.
    pub fn host_copies(
        &self,
        counts: impl Fn(&AgentReport) -> bool,
    ) -> BTreeMap<HostCopyKey, Vec<NodeId>> {
        let mut out: BTreeMap<HostCopyKey, Vec<NodeId>> = BTreeMap::new();
        for a in self
            .agents
            .iter()
            .filter(|a| a.heartbeat.is_some() && counts(a))
        {
            for c in &a.host_copies {
                out.entry((c.tenant.clone(), c.function.clone(), c.version))
                    .or_default()
                    .push(NodeId(a.node.clone()));
            }
        }
        for nodes in out.values_mut() {
            nodes.sort();
            nodes.dedup();
        }
        out
    }

    /// The replicas whose part did not come.
    pub fn missing(&self) -> Vec<u64> {
        self.replicas
            .iter()
            .filter(|(p, _)| !p.ok)
            .map(|(p, _)| p.id)
            .collect()
    }
}

impl AgentHub {
    /// This replica's part.
    pub fn local_part(&self) -> ReplicaAgents {
        let applied_index = self.state.read().last_applied.map_or(0, |l| l.index);
        let delivered = self
            .delivered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let agents = self
            .reports
            .list()
            .into_iter()
            .map(|mut r| {
                r.replica = self.id;
                r.delivered = delivered
                    .get(&gshare_core::model::NodeId(r.node.clone()))
                    .cloned()
                    .unwrap_or_default();
                r
            })
            .collect();
        ReplicaAgents {
            replica: self.id,
            applied_index,
            agents,
        }
    }

    /// Every replica's part, merged: this one's, and each peer's asked
    /// concurrently over the peer wire (at most [`PEER_TIMEOUT`] each).
    pub async fn gather(&self) -> RegionAgents {
        let me = ReplicaPart {
            id: self.id,
            http_addr: String::new(),
            ok: true,
            error: None,
        };
        let mut parts = vec![(me, Some(self.local_part()))];
        let peers: Vec<(u64, gshare_raft_store::ReplicaNode)> = match &self.metrics {
            Some(m) => m
                .borrow()
                .membership_config
                .membership()
                .nodes()
                .filter(|(id, _)| **id != self.id)
                .map(|(id, n)| (*id, n.clone()))
                .collect(),
            None => Vec::new(),
        };
        let asks: Vec<_> = peers
            .into_iter()
            .map(|(id, node)| {
                let links = self.peers.clone();
                tokio::spawn(async move {
                    let part = |ok: bool, error: Option<String>| ReplicaPart {
                        id,
                        http_addr: node.http_addr.clone(),
                        ok,
                        error,
                    };
                    let Some(links) = links else {
                        return (part(false, Some("no peer links".into())), None);
                    };
                    match links
                        .call(&node.raft_addr, &PeerRequest::AgentReports, PEER_TIMEOUT)
                        .await
                    {
                        Ok(PeerReply::AgentReports(p)) => (part(true, None), Some(p)),
                        Ok(other) => (
                            part(false, Some(format!("unexpected reply {other:?}"))),
                            None,
                        ),
                        Err(e) => (part(false, Some(e.to_string())), None),
                    }
                })
            })
            .collect();
        for a in asks {
            if let Ok(p) = a.await {
                parts.push(p);
            }
        }
        RegionAgents::merge(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(agent: &str, replica: u64, age_ms: Option<u64>) -> AgentReport {
        let mut r: AgentReport = serde_json::from_value(serde_json::json!({
            "agent": agent, "node": agent, "pool": "center", "version": "v",
            "ingress": "127.0.0.1:1", "gpus": [], "heartbeat": null,
            "heartbeats": 1, "swaps": {"swap_in": 0, "swap_out": 0, "cold_start": 0,
            "moves": 0, "unload": 0},
        }))
        .unwrap();
        r.replica = replica;
        r.age_ms = age_ms;
        r
    }

    fn part(id: u64, ok: bool) -> ReplicaPart {
        ReplicaPart {
            id,
            http_addr: String::new(),
            ok,
            error: (!ok).then(|| "timed out".into()),
        }
    }

    #[test]
    fn merged_parts_keep_the_newest_report_of_each_agent_and_name_the_missing() {
        let p1 = ReplicaAgents {
            replica: 1,
            applied_index: 7,
            agents: vec![report("a", 1, Some(900)), report("b", 1, None)],
        };
        let p2 = ReplicaAgents {
            replica: 2,
            applied_index: 6,
            agents: vec![report("a", 2, Some(100)), report("c", 2, Some(5))],
        };
        let m = RegionAgents::merge(vec![
            (part(1, true), Some(p1)),
            (part(2, true), Some(p2)),
            (part(3, false), None),
        ]);
        let holders: Vec<(&str, u64)> = m
            .agents
            .iter()
            .map(|a| (a.agent.as_str(), a.replica))
            .collect();
        assert_eq!(holders, vec![("a", 2), ("b", 1), ("c", 2)]);
        assert_eq!(m.missing(), vec![3]);
        assert_eq!(m.replicas[0].1, Some(7));
        assert_eq!(m.replicas[2].1, None);
        assert_eq!(m.of_node("c").map(|a| a.replica), Some(2));
    }

    fn load(function: &str, arrivals: u64, in_flight: u32) -> gshare_core::protocol::FunctionLoad {
        gshare_core::protocol::FunctionLoad {
            tenant: TenantId("acme".into()),
            function: function.into(),
            arrivals,
            in_flight,
            waiting: 1,
            queue_wait_us: 0,
            deadline_misses: 0,
            early_rejects: arrivals / 2,
            swaps: 0,
            idle_ms: 10 * arrivals,
        }
    }

    #[test]
    fn function_loads_sum_the_counted_agents_that_heartbeated() {
        let beat: gshare_core::protocol::Heartbeat = gshare_core::protocol::Heartbeat {
            agent: gshare_core::state::AgentId("a".into()),
            at_ms: 0,
            gpus: Vec::new(),
            in_flight: 0,
            swaps: 0,
            counters: Default::default(),
            instances: Vec::new(),
        };
        let mut a = report("a", 1, Some(5));
        a.heartbeat = Some(beat.clone());
        a.loads = vec![load("f", 3, 2), load("g", 1, 0)];
        a.loads_interval_ms = 500;
        let mut b = report("b", 2, Some(5));
        b.heartbeat = Some(beat.clone());
        b.loads = vec![load("f", 4, 1)];
        // Not heartbeated yet: left out.
        let mut c = report("c", 2, None);
        c.loads = vec![load("f", 100, 100)];
        // Refused by the caller (its node is not_ready): left out.
        let mut d = report("d", 2, Some(5));
        d.heartbeat = Some(beat);
        d.loads = vec![load("f", 1000, 1000)];
        let m = RegionAgents {
            replicas: Vec::new(),
            agents: vec![a, b, c, d],
        };
        let sums = m.function_loads(|r| r.node != "d");
        let f = sums[&(TenantId("acme".into()), "f".to_string())];
        assert_eq!((f.arrivals, f.concurrency, f.idle_ms), (7, 5, 30));
        // a's 1 reject of f over its 500 ms: 2/s; b's interval is unknown.
        assert_eq!((f.early_rejects, f.early_rejects_per_s_milli), (3, 2000));
        let g = sums[&(TenantId("acme".into()), "g".to_string())];
        assert_eq!((g.arrivals, g.concurrency), (1, 1));
        assert_eq!(sums.len(), 2);
    }

    fn copy(function: &str, version: u64) -> gshare_core::protocol::HostCopy {
        gshare_core::protocol::HostCopy {
            tenant: TenantId("acme".into()),
            function: function.into(),
            version,
            memory_mib: 4_096,
        }
    }

    #[test]
    fn host_copies_name_the_counted_nodes_that_hold_each_version() {
        let beat = gshare_core::protocol::Heartbeat {
            agent: gshare_core::state::AgentId("a".into()),
            at_ms: 0,
            gpus: Vec::new(),
            in_flight: 0,
            swaps: 0,
            counters: Default::default(),
            instances: Vec::new(),
        };
        let mut b = report("b", 1, Some(5));
        b.heartbeat = Some(beat.clone());
        b.host_copies = vec![copy("f", 2), copy("g", 1)];
        let mut a = report("a", 2, Some(5));
        a.heartbeat = Some(beat.clone());
        a.host_copies = vec![copy("f", 2), copy("f", 1)];
        // Not heartbeated yet, or refused by the caller: left out.
        let mut c = report("c", 2, None);
        c.host_copies = vec![copy("f", 2)];
        let mut d = report("d", 2, Some(5));
        d.heartbeat = Some(beat);
        d.host_copies = vec![copy("f", 2)];
        let m = RegionAgents {
            replicas: Vec::new(),
            agents: vec![b, a, c, d],
        };
        let copies = m.host_copies(|r| r.node != "d");
        let key = |f: &str, v: u64| (TenantId("acme".into()), f.to_string(), v);
        let nodes = |names: &[&str]| -> Vec<NodeId> {
            names.iter().map(|n| NodeId(n.to_string())).collect()
        };
        assert_eq!(copies[&key("f", 2)], nodes(&["a", "b"]));
        assert_eq!(copies[&key("f", 1)], nodes(&["a"]));
        assert_eq!(copies[&key("g", 1)], nodes(&["b"]));
        assert_eq!(copies.len(), 3);
    }

    #[test]
    fn a_part_round_trips_on_the_peer_wire() {
        let mut a = report("a", 2, Some(12));
        a.loads = vec![load("f", 1, 2)];
        a.loads_dropped = 3;
        a.host_copies = vec![copy("f", 2)];
        let p = ReplicaAgents {
            replica: 2,
            applied_index: 40,
            agents: vec![a],
        };
        let frame = crate::wire::encode_frame(&PeerReply::AgentReports(p.clone())).unwrap();
        match crate::wire::decode_payload::<PeerReply>(&frame[4..]).unwrap() {
            PeerReply::AgentReports(back) => assert_eq!(back, p),
            other => panic!("unexpected {other:?}"),
        }
    }
}
