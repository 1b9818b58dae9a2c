//! The leader's node liveness: heartbeats heard by any replica, gathered
//! by the leader, turned into committed node states and evaluations.
//!
//! ```text
//!  agent ─heartbeat─▶ the replica holding its link: AgentHub::heard_from(node)
//!  leader, every LIVENESS_TICK:
//!     heard = own links ∪ PeerRequest::Heard to every peer (ages, not clocks),
//!             merged into the newest times heard since it took office
//!     liveness_changes(view, heard, watching_since, now, rules)   (core, pure)
//!        Ready / NotReady ─▶ NodeReadySet entries (only on a change)
//!        Replace(node)    ─▶ Evaluation::NodeNotReady per instance on it
//!     draining nodes with instances ─▶ Evaluation::Drain per instance
//!        a new one placed as a migration (cause drain, in the replicated
//!        state) ─▶ the migration tick releases the old one once the new one
//!        is ready, or after MUST_FINISH_AFTER_MS (scheduler/migrate.rs)
//!     outgoing instances (a reshaping update) ─▶ Evaluation::Replace, the
//!        oldest of each function (one at a time)
//!        a new-version one placed as a migration (cause roll) ─▶ ended by the
//!        migration tick, as a drain's
//! ```
//!
//! Liveness is forwarded to the leader, not committed per heartbeat: only
//! the transitions are Raft entries, so the log grows with changes, not
//! with time. A new leader has heard nothing yet: it starts watching with
//! a fresh grace for every node (`watching_since`), as Nomad's leader
//! resets its heartbeat timers on election; committed `not_ready` nodes
//! keep their `since`, so a replacement already due is not delayed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use gshare_core::command::RegionCommand;
use gshare_core::model::NodeId;
use gshare_core::state::{
    liveness_changes, Applied, DomainCommand, InstanceId, LivenessChange, LivenessRules,
    RegionState,
};
use openraft::ServerState;

use super::{EvalDone, Evaluation, Inner, Scheduler};
use crate::agents::AgentHub;
use crate::wire::{PeerReply, PeerRequest};

/// How often the leader looks at its nodes' liveness.
pub const LIVENESS_TICK: Duration = Duration::from_millis(500);
/// Longest wait for a peer's answer to [`PeerRequest::Heard`].
const HEARD_TTL: Duration = Duration::from_secs(1);

impl Scheduler {
    /// When each node's agent was last heard (Unix ms) by this replica or
    /// any peer that answers within a second (peers report ages, so their
    /// clocks do not matter).
    pub async fn heard(&self, hub: &AgentHub) -> BTreeMap<NodeId, u64> {
        let now = hub.clock.unix_ms();
        let mut out: BTreeMap<NodeId, u64> = BTreeMap::new();
        let mut add = |ages: Vec<(NodeId, u64)>| {
            for (node, age) in ages {
                let at = now.saturating_sub(age);
                let e = out.entry(node).or_insert(at);
                *e = (*e).max(at);
            }
        };
        add(hub.heard_ages());
        let peers: Vec<String> = {
            let m = self.inner.raft.metrics().borrow().clone();
            m.membership_config
                .membership()
                .nodes()
                .filter(|(id, _)| **id != self.inner.id)
                .map(|(_, n)| n.raft_addr.clone())
                .collect()
        };
        let mut calls = tokio::task::JoinSet::new();
        for addr in peers {
            let links = self.inner.links.clone();
            calls.spawn(async move { links.call(&addr, &PeerRequest::Heard, HEARD_TTL).await });
        }
        while let Some(r) = calls.join_next().await {
            if let Ok(Ok(PeerReply::Heard(ages))) = r {
                add(ages);
            }
        }
        out
    }

    /// Starts the leader's liveness watch with `rules` (it acts only while
    /// this replica leads).
    pub fn watch_liveness(&self, hub: AgentHub, rules: LivenessRules) {
        tokio::spawn(watch(Arc::downgrade(&self.inner), hub, rules));
    }
}

/// What the leader's watch does at `now`, decided on `view` alone (pure):
/// the node ready states to commit (changes only, from
/// [`liveness_changes`]), and the evaluations to submit: one
/// `NodeNotReady` per instance of a node not ready past its replace grace
/// and one `Drain` per instance of a draining node (a side of a migration is
/// left to the migration tick: a replacement beside it would be one too
/// many), and, per function in the roll of a reshaping update, a `Replace`
/// of its oldest outgoing instance (one at a time). The deterministic
/// simulation (`tests/src/sim`) runs the same plan.
pub fn watch_plan(
    view: &RegionState,
    heard: &BTreeMap<NodeId, u64>,
    since: u64,
    now: u64,
    rules: &LivenessRules,
) -> (Vec<(NodeId, bool)>, Vec<Evaluation>) {
    let mut marks = Vec::new();
    let mut work: Vec<Evaluation> = Vec::new();
    for change in liveness_changes(view, heard, since, now, rules) {
        match change {
            LivenessChange::Ready(node) => marks.push((node, true)),
            LivenessChange::NotReady(node) => marks.push((node, false)),
            LivenessChange::Replace(node) => {
                for i in view
                    .instances_on(&node)
                    .filter(|i| view.migration_of(i.id).is_none())
                {
                    work.push(Evaluation::NodeNotReady {
                        node: node.clone(),
                        instance: i.id,
                    });
                }
            }
        }
    }
    if let Some(t) = view.topology() {
        for n in t.nodes() {
            let draining = view.node_status(&n.name).is_some_and(|s| s.draining);
            if draining {
                for i in view
                    .instances_on(&n.name)
                    .filter(|i| view.migration_of(i.id).is_none())
                {
                    work.push(Evaluation::Drain {
                        node: n.name.clone(),
                        instance: i.id,
                    });
                }
            }
        }
    }
    let mut rolling: BTreeSet<(String, String)> = BTreeSet::new();
    for i in view.all_outgoing() {
        if rolling.insert((i.tenant.0.clone(), i.function.clone())) {
            work.push(Evaluation::Replace { instance: i.id });
        }
    }
    (marks, work)
}

/// Instances a drain or replacement is working on (one task each).
type InFlight = Arc<Mutex<BTreeSet<InstanceId>>>;

/// The newest time each node was heard, kept across the leader's ticks
/// while it leads: a tick's gathering ([`Scheduler::heard`]) misses the
/// nodes of a peer that answers late or not at all, and a node missing
/// from it would fall back to its registration time, hours old, and be
/// marked not ready on that very tick. Merged, such a node keeps its last
/// time and goes not ready only once it is really older than the grace.
#[derive(Debug, Default)]
pub struct HeardTimes(BTreeMap<NodeId, u64>);

impl HeardTimes {
    /// Merges one tick's gathering (the newer time of each node wins) and
    /// forgets nodes `view`'s topology no longer has; returns the times.
    pub fn merge(
        &mut self,
        fresh: BTreeMap<NodeId, u64>,
        view: &RegionState,
    ) -> &BTreeMap<NodeId, u64> {
        for (node, at) in fresh {
            let e = self.0.entry(node).or_insert(at);
            *e = (*e).max(at);
        }
        if let Some(t) = view.topology() {
            self.0.retain(|node, _| t.node(&node.0).is_some());
        }
        &self.0
    }
}

async fn watch(inner: Weak<Inner>, hub: AgentHub, rules: LivenessRules) {
    let mut watching_since: Option<u64> = None;
    let mut heard_times = HeardTimes::default();
    let in_flight: InFlight = Arc::default();
    loop {
        tokio::time::sleep(LIVENESS_TICK).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.raft.metrics().borrow().state == ServerState::Shutdown {
            return;
        }
        if !inner.leads() {
            watching_since = None;
            heard_times = HeardTimes::default();
            continue;
        }
        let now = hub.clock.unix_ms();
        let since = *watching_since.get_or_insert(now);
        let scheduler = Scheduler { inner };
        let heard = scheduler.heard(&hub).await;
        let now = hub.clock.unix_ms();
        let (marks, work) = {
            let st = scheduler.inner.state.read();
            let view = st.region.domain();
            let heard = heard_times.merge(heard, view);
            watch_plan(view, heard, since, now, &rules)
        };
        // In proposals of at most MAX_BATCH commands: more (a whole rack
        // of a large region coming back at once) would be refused whole
        // (`TooMany`) on every tick, and no node marked.
        for marks in marks.chunks(crate::proposer::MAX_BATCH) {
            let commands = marks
                .iter()
                .map(|(node, ready)| {
                    RegionCommand::domain(DomainCommand::NodeReadySet {
                        node: node.clone(),
                        ready: *ready,
                    })
                })
                .collect();
            match scheduler.inner.proposer.propose_all(commands).await {
                Ok(_) => {
                    for (node, ready) in marks {
                        let state = if *ready { "ready" } else { "not_ready" };
                        tracing::info!(node = %node.0, "node {state}");
                    }
                }
                Err(e) => tracing::warn!("node states not committed: {e}"),
            }
        }
        for eval in work {
            let instance = match &eval {
                Evaluation::NodeNotReady { instance, .. }
                | Evaluation::Drain { instance, .. }
                | Evaluation::Replace { instance } => *instance,
                _ => continue,
            };
            let fresh = in_flight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(instance);
            if !fresh {
                continue;
            }
            let (s, hub, in_flight) = (scheduler.clone(), hub.clone(), in_flight.clone());
            tokio::spawn(async move {
                carry_out(&s, &hub, eval, instance).await;
                in_flight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&instance);
            });
        }
    }
}

/// Submits one replacement, drain or roll evaluation and logs what it did
/// (a drain's or a roll's make-first is a migration, which the migration
/// tick ends).
async fn carry_out(s: &Scheduler, hub: &AgentHub, eval: Evaluation, old: InstanceId) {
    let what = format!("{eval:?}");
    let eval_kind = eval.kind();
    match s.submit_here(eval).await {
        Ok(EvalDone {
            applied:
                Some(Applied::InstanceMigrating {
                    instance, slices, ..
                }),
            ..
        }) => {
            // A drain's or a roll's make-first: the migration tick releases
            // the old one once the new one is ready (a new leader too: it
            // is in the state).
            tracing::info!("{what}: migrating {old} to {instance}");
            let (function, cause) = {
                let st = s.inner.state.read();
                let view = st.region.domain();
                (
                    view.instance(instance)
                        .map(|i| (i.tenant.0.clone(), i.function.clone())),
                    view.migration_of(instance).map(|m| m.cause),
                )
            };
            if let Some(cause) = cause {
                s.inner.counters.migration(cause, "started");
            }
            if let (Some((tenant, function)), Some(sl)) = (function, slices.first()) {
                hub.activity.migrated(
                    hub.clock.unix_ms(),
                    "migrate_start",
                    &sl.gpu.node.0,
                    instance,
                    &tenant,
                    &function,
                );
            }
        }
        Ok(EvalDone {
            applied: Some(Applied::InstanceReplaced { instance, .. }),
            ..
        }) => {
            if matches!(eval_kind, "node_not_ready") {
                // A lost node's instance: nothing serves there to overlap with.
                tracing::info!("{what}: moved {old} in one step to {instance}");
            } else {
                tracing::warn!(
                    "{what}: no room for {old} and a new instance at once (capacity or quota): \
                     moved it in one step to {instance} (break-before-make for this instance)"
                )
            }
        }
        Ok(EvalDone {
            applied: Some(a), ..
        }) => tracing::info!("{what}: {a:?}"),
        Ok(_) => {}
        Err(e) => tracing::debug!("{what}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gshare_core::config::Topology;
    use gshare_core::state::AgentId;

    const RULES: LivenessRules = LivenessRules {
        join_grace_ms: 60_000,
        ready_grace_ms: 3_000,
        replace_grace_ms: 2_000,
    };

    fn n(name: &str) -> NodeId {
        NodeId(name.into())
    }

    /// The local demo's topology, its two center nodes registered an hour
    /// before `t0` and ready.
    fn registered(t0: u64) -> RegionState {
        let topology = Topology::from_toml(
            "topology.toml",
            include_str!("../../../configs/local/topology.toml"),
        )
        .expect("configs/local/topology.toml");
        let mut s = RegionState::default();
        let before = t0 - 3_600_000;
        s.apply(DomainCommand::TopologyLoad { topology }, before)
            .expect("topology");
        for node in ["local-c1", "local-c2"] {
            s.apply(
                DomainCommand::AgentRegister {
                    agent: AgentId(node.into()),
                    node: n(node),
                    version: "0.1.0".into(),
                },
                before,
            )
            .expect("register");
            s.apply(
                DomainCommand::NodeReadySet {
                    node: n(node),
                    ready: true,
                },
                before,
            )
            .expect("ready");
        }
        s
    }

    /// The marks of the two center nodes (the edge nodes were never heard).
    fn centre(marks: Vec<(NodeId, bool)>) -> Vec<(NodeId, bool)> {
        marks
            .into_iter()
            .filter(|(node, _)| node.0.starts_with("local-c"))
            .collect()
    }

    /// A tick whose gathering misses a node (its replica's answer came
    /// late) keeps that node's last time: it is not marked not ready
    /// until it is really silent past the grace.
    #[test]
    fn a_peer_that_answers_late_leaves_its_nodes_ready() {
        let t0: u64 = 1_800_000_000_000;
        let s = registered(t0);
        let watching_since = t0 - 60_000;
        let mut times = HeardTimes::default();
        let tick = |times: &mut HeardTimes, heard: &[&str], at: u64, now: u64| {
            let fresh = heard.iter().map(|node| (n(node), at)).collect();
            let merged = times.merge(fresh, &s).clone();
            centre(watch_plan(&s, &merged, watching_since, now, &RULES).0)
        };
        // Both heard just now.
        assert_eq!(tick(&mut times, &["local-c1", "local-c2"], t0, t0), vec![]);
        // Next tick, local-c2's replica answers late: nothing changes.
        let t1 = t0 + 500;
        assert_eq!(tick(&mut times, &["local-c1"], t1, t1), vec![]);
        // What the tick alone says: local-c2 silent since it registered.
        let alone = BTreeMap::from([(n("local-c1"), t1)]);
        assert_eq!(
            centre(watch_plan(&s, &alone, watching_since, t1, &RULES).0),
            vec![(n("local-c2"), false)]
        );
        // Really silent past the grace: not ready.
        let t2 = t0 + RULES.ready_grace_ms + 1;
        assert_eq!(
            tick(&mut times, &["local-c1"], t2, t2),
            vec![(n("local-c2"), false)]
        );
        // A node the topology no longer has is forgotten.
        times.0.insert(n("gone"), t2);
        times.merge(BTreeMap::new(), &s);
        assert!(!times.0.contains_key(&n("gone")));
    }
}
