//! The leader's autoscaling tick: every replica's agent load reports,
//! summed per function, fed to one autoscaler per function (core's
//! [`Autoscalers`], pure), whose decisions become scale evaluations.
//!
//! ```text
//!  agents ─Loads─▶ the replica holding each link   leader, every AUTOSCALE_TICK:
//!                                                   lock: any function with min < max? (else done)
//!                                                   hub.gather() (every replica's reports)
//!                                                   lock: the agents' nodes that are not_ready
//!                                                   sum loads, nodes with requests waiting,
//!                                                   host copies (kept for the planner's preference;
//!                                                   a wake from zero reads them afresh)
//!                                                   lock: Autoscalers::snapshot(view, waiting)
//!                                                   Autoscalers::decide(snapshot, loads, now)
//!                                                      Out ─▶ Evaluation::ScaleOut (one placement),
//!                                                             or Shed (planned in the center) for an
//!                                                             edge:<p> function missing deadlines in p
//!                                                      In  ─▶ Evaluation::ScaleIn (one release)
//! ```
//!
//! The state's read lock is held only to check and copy (apply waits for
//! it); the gather, the sums and the decisions run outside it. A region
//! where every function has a fixed count gathers nothing.
//!
//! One evaluation per function is in flight at a time, so two ticks never
//! release two instances on the same count. A replica that stops leading
//! forgets its windows; the next leader starts afresh.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use gshare_core::autoscale::{Autoscalers, FunctionKey, Params, ScaleAction};
use gshare_core::model::{NodeId, PoolPreference};
use openraft::ServerState;

use super::{Evaluation, Inner, Scheduler};
use crate::agents::{AgentHub, RegionAgents};

/// How often the leader's autoscalers observe and decide.
pub const AUTOSCALE_TICK: Duration = Duration::from_secs(1);

impl Scheduler {
    /// Starts the leader's autoscaling tick with `params` (it acts only
    /// while this replica leads).
    pub fn watch_load(&self, hub: AgentHub, params: Params) {
        // A second call keeps the first hub (there is one per replica).
        let _ = self.inner.hub.set(hub.clone());
        tokio::spawn(tick(Arc::downgrade(&self.inner), hub, params));
    }
}

/// How long a wake from zero waits for the agents' freshest host copies
/// before it plans on those of the latest tick (a peer that does not
/// answer must not hold a held request for its whole `PEER_TIMEOUT`).
const WAKE_GATHER: Duration = Duration::from_millis(300);

/// The nodes of `agents` the replicated state says are `not_ready` (their
/// reports are stale: left out of the sums and the host copies).
fn not_ready_nodes(inner: &Inner, agents: &RegionAgents) -> BTreeSet<String> {
    agents.not_ready_nodes(inner.state.read().region.domain())
}

/// Keeps the host copies of `agents` off `not_ready` nodes as what the
/// planner prefers.
fn keep_host_copies(inner: &Inner, agents: &RegionAgents, not_ready: &BTreeSet<String>) {
    *inner.host_copies.lock().unwrap_or_else(|p| p.into_inner()) =
        agents.host_copies(|a| !not_ready.contains(&a.node));
}

/// Reads the host copies afresh from every replica's agent reports, for a
/// placement of a function that has no instance (a wake from zero): the
/// tick's are up to [`AUTOSCALE_TICK`] old, and a function woken right
/// after its host copy was first reported would miss it. Keeps the tick's
/// when the gather takes longer than [`WAKE_GATHER`].
pub(super) async fn refresh_host_copies(inner: &Inner) {
    let Some(hub) = inner.hub.get() else {
        return;
    };
    if let Ok(agents) = tokio::time::timeout(WAKE_GATHER, hub.gather()).await {
        let not_ready = not_ready_nodes(inner, &agents);
        keep_host_copies(inner, &agents, &not_ready);
    }
}

async fn tick(inner: Weak<Inner>, hub: AgentHub, params: Params) {
    let mut scalers = Autoscalers::default();
    let busy: Arc<Mutex<BTreeSet<FunctionKey>>> = Arc::default();
    loop {
        tokio::time::sleep(AUTOSCALE_TICK).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.raft.metrics().borrow().state == ServerState::Shutdown {
            return;
        }
        if !inner.leads() {
            if !scalers.is_empty() {
                scalers.clear();
                inner.counters.decided(&[], inner.proposer.now_ms());
            }
            continue;
        }
        if !Autoscalers::any_scalable(inner.state.read().region.domain()) {
            if !scalers.is_empty() {
                scalers.clear();
                inner.counters.decided(&[], inner.proposer.now_ms());
            }
            continue;
        }
        let agents = hub.gather().await;
        let not_ready = not_ready_nodes(&inner, &agents);
        let counts = |node: &str| !not_ready.contains(node);
        let loads = agents.function_loads(|a| counts(&a.node));
        keep_host_copies(&inner, &agents, &not_ready);
        let mut waiting: BTreeMap<FunctionKey, BTreeSet<NodeId>> = BTreeMap::new();
        for a in agents
            .agents
            .iter()
            .filter(|a| a.heartbeat.is_some() && counts(&a.node))
        {
            for l in a.loads.iter().filter(|l| l.waiting > 0) {
                waiting
                    .entry((l.tenant.clone(), l.function.clone()))
                    .or_default()
                    .insert(NodeId(a.node.clone()));
            }
        }
        // Functions missing deadlines (or rejecting early) on a node of
        // each pool: an `edge:<pool>` function short there sheds to the center.
        let mut short: BTreeSet<(FunctionKey, String)> = BTreeSet::new();
        for a in agents
            .agents
            .iter()
            .filter(|a| a.heartbeat.is_some() && counts(&a.node))
        {
            for l in a
                .loads
                .iter()
                .filter(|l| l.deadline_misses > 0 || l.early_rejects > 0)
            {
                short.insert(((l.tenant.clone(), l.function.clone()), a.pool.clone()));
            }
        }
        let scalables = Autoscalers::snapshot(inner.state.read().region.domain(), &waiting);
        let sheds: BTreeSet<FunctionKey> = {
            let st = inner.state.read();
            let view = st.region.domain();
            short
                .iter()
                .filter(|((t, f), pool)| {
                    view.function(t, f)
                        .is_ok_and(|r| matches!(&r.spec.pool, PoolPreference::Edge(p) if p == pool))
                })
                .map(|(k, _)| k.clone())
                .collect()
        };
        let now = inner.proposer.now_ms();
        let steps = scalers.decide(&params, &scalables, &loads, now);
        inner.counters.decided(&steps, now);
        let work: Vec<(FunctionKey, Evaluation)> = steps
            .into_iter()
            .filter_map(|s| {
                let (tenant, function) = s.key.clone();
                let eval = match s.action? {
                    ScaleAction::Out { desired } if sheds.contains(&s.key) => Evaluation::Shed {
                        tenant,
                        function,
                        desired,
                    },
                    ScaleAction::Out { desired } => Evaluation::ScaleOut {
                        tenant,
                        function,
                        desired,
                    },
                    ScaleAction::In { instance } => Evaluation::ScaleIn {
                        tenant,
                        function,
                        instance,
                    },
                };
                Some((s.key, eval))
            })
            .collect();
        let scheduler = Scheduler { inner };
        for (key, eval) in work {
            let fresh = busy
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.clone());
            if !fresh {
                continue;
            }
            let (s, busy) = (scheduler.clone(), busy.clone());
            tokio::spawn(async move {
                let what = format!("{eval:?}");
                match s.submit_here(eval).await {
                    Ok(done) => {
                        if let Some(a) = done.applied {
                            tracing::info!("{what}: {a:?}");
                        }
                    }
                    Err(e) => tracing::debug!("{what}: {e}"),
                }
                busy.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
            });
        }
    }
}
