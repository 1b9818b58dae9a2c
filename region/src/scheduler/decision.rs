//! The leader's latest autoscaling decision for one function, read on any
//! replica: the leader answers from its tick's record; a follower asks the
//! leader over the peer wire (`PeerRequest::Decision`).
//!
//! ```text
//!  GET /v1/functions/{f} ─▶ Scheduler::leader_decision ─┬─ leader: Counters::decision (local)
//!                                                        └─ follower: PeerRequest::Decision ─▶ leader
//!                                                             (≤ DECISION_TTL; none: unknown)
//! ```
//!
//! The decisions are not replicated: a replica that stops leading drops
//! them, and a new leader has none until its first tick.

use std::time::Duration;

use gshare_core::autoscale::Decision;
use gshare_core::model::TenantId;
use serde::{Deserialize, Serialize};

use super::Scheduler;
use crate::wire::{PeerReply, PeerRequest};

/// Longest wait for the leader's answer.
const DECISION_TTL: Duration = Duration::from_secs(2);

/// A decision and when it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatestDecision {
    /// The decision.
    pub decision: Decision,
    /// When the leader made it (its clock, Unix ms).
    pub at_ms: u64,
    /// How long before the leader answered it was made, ms (the leader's
    /// clock on both ends, so no skew between replicas enters it).
    pub age_ms: u64,
    /// The leader that made it.
    pub leader: u64,
}

/// What the leader says of a function's latest decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DecisionLookup {
    /// The latest tick decided this.
    Decided(LatestDecision),
    /// The leader has no decision for it (its first tick since it took
    /// over has not run, or the function cannot scale).
    Undecided {
        /// The leader.
        leader: u64,
    },
    /// The replica asked is not the leader (the answer of a forwarded
    /// request that reached a replica that just lost leadership).
    NotLeader,
}

impl Scheduler {
    /// The latest decision of this replica's tick for `tenant`'s
    /// `function`, if it leads.
    pub fn local_decision(&self, tenant: &TenantId, function: &str) -> DecisionLookup {
        if !self.inner.leads() {
            return DecisionLookup::NotLeader;
        }
        let key = (tenant.clone(), function.to_string());
        let leader = self.inner.id;
        match self.inner.counters.decision(&key) {
            Some((decision, at_ms)) => DecisionLookup::Decided(LatestDecision {
                decision,
                at_ms,
                age_ms: self.inner.proposer.now_ms().saturating_sub(at_ms),
                leader,
            }),
            None => DecisionLookup::Undecided { leader },
        }
    }

    /// The leader's latest decision for `tenant`'s `function`: asked here
    /// if this replica leads, else over the peer wire. `Err` says why it
    /// is unknown (no leader, or it did not answer in time).
    pub async fn leader_decision(
        &self,
        tenant: &TenantId,
        function: &str,
    ) -> Result<DecisionLookup, String> {
        let (leader, node) = {
            let m = self.inner.raft.metrics().borrow().clone();
            let node = m
                .current_leader
                .and_then(|l| m.membership_config.membership().get_node(&l).cloned());
            (m.current_leader, node)
        };
        match (leader, node) {
            (Some(l), _) if l == self.inner.id => Ok(self.local_decision(tenant, function)),
            (Some(l), Some(node)) => {
                let req = PeerRequest::Decision {
                    tenant: tenant.clone(),
                    function: function.to_string(),
                };
                match self
                    .inner
                    .links
                    .call(&node.raft_addr, &req, DECISION_TTL)
                    .await
                {
                    Ok(PeerReply::Decision(d)) => Ok(d),
                    Ok(other) => Err(format!("leader {l} answered {other:?}")),
                    Err(e) => Err(format!("leader {l}: {e}")),
                }
            }
            _ => Err("no leader".to_string()),
        }
    }
}
