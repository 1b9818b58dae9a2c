//! The agent-facing side of a replica: node agents connect to the same
//! QUIC endpoint as peers, with ALPN `gshare-agent/1` (mutual TLS with the
//! operator CA, like replicas).
//!
//! ```text
//!   agent ── bi: Register ──▶ AgentRegister through Raft ─▶ Registered{next_seq} | Refused
//!         ── bi: Heartbeat / Loads / HostCopies / Swaps ─▶ Ack
//!            (a Heartbeat: Refused{cut_off, retry} from a replica cut off
//!            from the leader, see [`cut_off`]: the agent moves to another
//!            replica if one takes its registration, else stays)
//!         ── bi: Usage{records} ─▶ UsageBatch through Raft ─▶ UsageAck{seqs} | Refused
//!         ── bi: SliceReserve / SliceRelease ─▶ InstanceSliceReserve / InstanceSliceRelease
//!            through Raft ─▶ Ack (committed) | Refused
//!         ◀─ uni: Assignment (the node's instances) / Tokens (all digests), when they
//!            change, and in full every 5 s
//! ```
//!
//! An agent is the node its certificate names: a registration whose node
//! differs from the subject common name of the connection's client
//! certificate is `Refused{code: "identity_mismatch", retry: false}`, and
//! one whose GPUs disagree with the topology's node is refused by the state
//! machine (`gpu_mismatch`, see `DomainCommand::AgentRegisterGpus`).
//!
//! Usage is accepted only from the agent registered on this connection
//! (the mutual-TLS connection is its credential): anything else is
//! `Refused{retry: false}`. A batch is proposed as one `UsageBatch`; the
//! state machine applies each `(agent, seq)` once, so the answer to a
//! batch applied before (duplicates) is the same `UsageAck` with every
//! sequence number. No leader yet: `Refused{retry: true}`, the agent keeps
//! its records and resends. Each usage stream is served by its own task,
//! so heartbeats and registrations are answered while a proposal waits.
//!
//! Every replica serves agents: a follower's proposer forwards the
//! registration to the leader. Assignments and tokens come from this
//! replica's applied state, polled every 200 ms and pushed when changed.
//! `POST /v1/invoke/{tenant}/{name}` on any replica is forwarded to a
//! hosting agent ([`invoke`]). Heartbeats, load reports and swap reports are kept in
//! memory on this replica ([`AgentReports`]) for `/metrics` (each replica
//! exports the agents linked to it); `GET /v1/cluster/agents`,
//! `/v1/cluster/view`, `GET /v1/functions/{name}` and `?wait=ready` read
//! every replica's ([`region_agents`]).

pub mod cut_off;
pub(crate) mod forward;
mod invoke;
pub mod region_agents;
mod reports;
mod request_body;
pub mod wake;

pub use invoke::{invoke_route, invoke_transparent_route};
pub use region_agents::{HostCopyKey, RegionAgents, ReplicaAgents};
pub use reports::{AgentReport, AgentReports, SwapCounts};

use crate::proposer::{Proposer, WriteError};
use gshare_core::clock::SharedClock;
use gshare_core::command::{CommandOutcome, RegionCommand};
use gshare_core::model::NodeId;
use gshare_core::net::{read_frame, write_encoded, write_frame, WireError, BAD_FRAME};
use gshare_core::protocol::{
    AgentFrames, AgentMessage, AgentMessageV1, Assignment, RegionMessage, RegionMessageV1,
    TenantTokens, TokenDigests,
};
use gshare_core::state::{AgentId, Applied, DomainCommand, UsageRecord};
use gshare_raft_store::{ReplicaNode, StateReader};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PUSH_EVERY: Duration = Duration::from_millis(200);
/// The full assignment and tokens are pushed again this often even when
/// unchanged, so an agent that ignored an older view (from a replica that
/// was behind) converges.
const REFRESH_EVERY: Duration = Duration::from_secs(5);

/// What an agent connection needs from the replica.
#[derive(Clone)]
pub struct AgentHub {
    /// Proposes registrations.
    pub proposer: Proposer,
    /// Reads the applied state.
    pub state: StateReader,
    /// Agents connected to this replica, by node.
    pub links: Arc<Mutex<HashMap<NodeId, quinn::Connection>>>,
    /// What the agents connected here report.
    pub reports: Arc<AgentReports>,
    /// Per node whose agent is linked here: the instances of the last
    /// assignment pushed to it (on a reliable stream; the agent takes it on
    /// receipt). What `POST /v1/functions?wait=ready` waits for.
    pub delivered: Arc<Mutex<HashMap<NodeId, Vec<gshare_core::state::InstanceId>>>>,
    /// Invocations forwarded and swaps reported here (for `/v1/activity`).
    pub activity: Arc<crate::dashboard::Activity>,
    /// This replica's Raft metrics (who leads), once wired.
    pub metrics: Option<tokio::sync::watch::Receiver<openraft::RaftMetrics<u64, ReplicaNode>>>,
    /// This replica's id (0 until wired with [`AgentHub::with_peers`]).
    pub id: u64,
    /// Connections to the other replicas, to read their agents' reports.
    pub peers: Option<crate::peer_link::PeerLinks>,
    /// When this replica last heard each node's agent (a registration or
    /// a heartbeat on its link): what the leader's liveness gathers.
    pub heard: Arc<Mutex<HashMap<NodeId, std::time::Instant>>>,
    /// Where this replica reads the time (heartbeat ages, liveness).
    pub clock: SharedClock,
    /// Functions being woken from zero by requests held here.
    pub wakes: Arc<wake::Wakes>,
    /// Since when this replica is cut off from a leader ([`cut_off`]).
    pub cut_off: Arc<Mutex<cut_off::CutOff>>,
    /// The index of the last remap granted here, per node (`Granted`):
    /// the next push to that node's agent is at least as new.
    pub granted: Arc<Mutex<HashMap<NodeId, u64>>>,
}

impl AgentHub {
    /// A hub with no agent connected yet, reading the time from `clock`.
    pub fn new(proposer: Proposer, state: StateReader, clock: SharedClock) -> Self {
        Self {
            proposer,
            state,
            links: Arc::default(),
            reports: Arc::new(AgentReports::new(clock.clone())),
            delivered: Arc::default(),
            activity: Arc::default(),
            metrics: None,
            id: 0,
            peers: None,
            heard: Arc::default(),
            clock,
            wakes: Arc::default(),
            cut_off: Arc::default(),
            granted: Arc::default(),
        }
    }

    /// This replica is `id`; it reads the other replicas' agent reports
    /// through `links` (their members come from the Raft metrics).
    pub fn with_peers(mut self, id: u64, links: crate::peer_link::PeerLinks) -> Self {
        self.id = id;
        self.peers = Some(links);
        self
    }

    /// `node`'s agent was heard now.
    pub fn heard_from(&self, node: &NodeId) {
        self.heard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node.clone(), self.clock.now());
    }

    /// How long ago this replica last heard each node's agent, in ms.
    pub fn heard_ages(&self) -> Vec<(NodeId, u64)> {
        let now = self.clock.now();
        self.heard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, at)| {
                let age = now.saturating_duration_since(*at).as_millis();
                (n.clone(), u64::try_from(age).unwrap_or(u64::MAX))
            })
            .collect()
    }

    /// Reads the leader's id from `metrics` (for the `Registered` reply).
    pub fn with_metrics(
        mut self,
        metrics: tokio::sync::watch::Receiver<openraft::RaftMetrics<u64, ReplicaNode>>,
    ) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// What the Raft metrics say now (`None` without them).
    fn raft_view(&self) -> Option<cut_off::RaftView> {
        let m = self.metrics.as_ref()?.borrow();
        Some(cut_off::RaftView {
            leader: m.current_leader,
            leads: m.state == openraft::ServerState::Leader && m.current_leader == Some(m.id),
            since_quorum_ack_ms: m.millis_since_quorum_ack,
            member: m.membership_config.membership().get_node(&m.id).is_some(),
        })
    }

    /// Why the agents linked here should link to another replica: this
    /// replica has been cut off from a leader for [`cut_off::GRACE`], and
    /// still is (`None` without Raft metrics).
    pub fn cut_off(&self) -> Option<String> {
        let view = self.raft_view()?;
        self.cut_off
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .refusing(&view, self.clock.now())
    }

    /// Why a registration here would not hold, if it would not
    /// ([`cut_off::RaftView::registration_futile`]).
    pub fn registration_futile(&self) -> Option<String> {
        self.raft_view()?.registration_futile()
    }

    /// Observes the Raft metrics every [`cut_off::OBSERVE_EVERY`] for
    /// [`AgentHub::cut_off`], until Raft stops.
    pub fn watch_cut_off(&self) {
        let hub = self.clone();
        tokio::spawn(async move {
            loop {
                let Some(view) = hub.raft_view() else {
                    return;
                };
                hub.cut_off
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .observe(&view, hub.clock.now());
                tokio::time::sleep(cut_off::OBSERVE_EVERY).await;
                if hub
                    .metrics
                    .as_ref()
                    .is_none_or(|m| m.has_changed().is_err())
                {
                    return;
                }
            }
        });
    }

    /// The replica id of the leader this replica knows of; 0 when none.
    pub fn leader(&self) -> u64 {
        self.metrics
            .as_ref()
            .and_then(|m| m.borrow().current_leader)
            .unwrap_or(0)
    }

    /// The instances last pushed to `node`'s agent, if it is linked here.
    pub fn delivered_to(&self, node: &NodeId) -> Option<Vec<gshare_core::state::InstanceId>> {
        self.link(node)?;
        self.delivered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
            .cloned()
    }

    /// The connection of `node`'s agent, if it is connected here.
    pub fn link(&self, node: &NodeId) -> Option<quinn::Connection> {
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let conn = links.get(node)?;
        if let Some(why) = conn.close_reason() {
            tracing::debug!(node = %node.0, "the agent's link here is closed: {why}");
            return None;
        }
        Some(conn.clone())
    }
}

fn refused(code: &str, message: String, retry: bool) -> RegionMessage {
    RegionMessage::v1(RegionMessageV1::Refused {
        code: code.into(),
        message,
        retry,
    })
}

async fn register(
    hub: &AgentHub,
    conn: &quinn::Connection,
    r: &gshare_core::protocol::Register,
    allow_fewer_gpus: bool,
) -> RegionMessage {
    match crate::tls::peer_name(conn) {
        Ok(name) if name == r.node.0 && name == r.agent.0 => {}
        Ok(name) => {
            return refused(
                "identity_mismatch",
                format!(
                    "the agent's certificate is issued for {name:?}, but it registers as node {:?} \
                     (agent {:?}); an agent is the node its certificate names",
                    r.node.0, r.agent.0
                ),
                false,
            )
        }
        Err(e) => {
            return refused(
                "identity_mismatch",
                format!("the agent's certificate names no node: {e}"),
                false,
            )
        }
    }
    // Not a member (it would not hold), or a leader without quorum (the
    // write would hang): the agent is better served trying another
    // replica at once.
    if let Some(why) = hub.registration_futile() {
        return refused("retry", format!("{why}; try another replica"), true);
    }
    let cmd = DomainCommand::AgentRegisterGpus {
        agent: r.agent.clone(),
        node: r.node.clone(),
        version: r.version.clone(),
        gpus: r.gpus.clone(),
        allow_fewer_gpus,
    };
    match hub.proposer.propose(RegionCommand::domain(cmd)).await {
        Ok(CommandOutcome::Domain(Ok(Applied::AgentRegistered { next_seq, .. }))) => {
            RegionMessage::v1(RegionMessageV1::Registered {
                next_seq,
                leader: hub.leader(),
            })
        }
        Ok(CommandOutcome::Domain(Err(e))) => refused(e.code(), e.to_string(), false),
        Ok(other) => refused("internal", format!("unexpected outcome {other:?}"), true),
        Err(e @ (WriteError::NoLeader | WriteError::Unknown(_) | WriteError::Stopped)) => {
            refused("retry", e.to_string(), true)
        }
        Err(e) => refused("invalid", e.to_string(), false),
    }
}

async fn usage(
    hub: &AgentHub,
    agent: AgentId,
    node: Option<NodeId>,
    mut records: Vec<UsageRecord>,
) -> RegionMessage {
    // Priced by the topology's model names and the node's pool kind, not
    // the agent's (`usage_as_configured`).
    if let Some(node) = &node {
        let st = hub.state.read();
        if let Some(n) = st.region.domain().topology().and_then(|t| t.node(&node.0)) {
            gshare_core::state::usage_as_configured(n, &mut records);
        }
    }
    let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    let n = records.len();
    let cmd = DomainCommand::UsageBatch {
        agent: agent.clone(),
        records,
    };
    match hub.proposer.propose(RegionCommand::domain(cmd)).await {
        Ok(CommandOutcome::Domain(Ok(Applied::UsageApplied {
            applied,
            duplicates,
        }))) => {
            tracing::debug!(agent = %agent.0, n, applied, duplicates, "usage applied");
            RegionMessage::v1(RegionMessageV1::UsageAck { seqs })
        }
        Ok(CommandOutcome::Domain(Err(e))) => {
            tracing::warn!(agent = %agent.0, code = e.code(), "usage refused: {e}");
            refused(e.code(), e.to_string(), false)
        }
        Ok(other) => refused("internal", format!("unexpected outcome {other:?}"), true),
        Err(e @ (WriteError::NoLeader | WriteError::Unknown(_) | WriteError::Stopped)) => {
            refused("retry", e.to_string(), true)
        }
        Err(e) => refused("invalid", e.to_string(), false),
    }
}

/// A remap half from the agent registered on this connection, for an
/// instance of its own node (and, for a reservation, a slice of its own
/// node): proposed; once committed, `Granted` with the index this replica
/// has applied (a leader's includes the remap; a follower's after a read
/// barrier) to an agent with `indexed` (see [`RegionMessageV1::Granted`]),
/// or `Ack`; `Refused` otherwise (nothing changed, so the agent does not
/// move).
async fn remap(
    hub: &AgentHub,
    (registered, indexed): (Option<&AgentId>, bool),
    agent: &AgentId,
    instance: gshare_core::state::InstanceId,
    cmd: DomainCommand,
) -> RegionMessage {
    if registered != Some(agent) {
        return refused(
            "not_registered",
            format!(
                "a remap of agent {:?} on a connection not registered as it",
                agent.0
            ),
            false,
        );
    }
    let own = {
        let s = hub.state.read();
        let domain = s.region.domain();
        let node = domain.agent(agent).map(|a| a.node.clone());
        let on_node = |n: &NodeId| node.as_ref() == Some(n);
        let target_ok = match &cmd {
            DomainCommand::InstanceSliceReserve { slice, .. } => on_node(&slice.gpu.node),
            DomainCommand::InstanceSliceRelease { gpu, .. } => on_node(&gpu.node),
            _ => false,
        };
        target_ok
            && domain
                .instance(instance)
                .is_some_and(|i| i.slices.iter().all(|s| on_node(&s.gpu.node)))
    };
    if !own {
        return refused(
            "not_your_node",
            format!(
                "instance {instance} is not (wholly) on agent {:?}'s node",
                agent.0
            ),
            false,
        );
    }
    let led = hub.leader() == hub.id;
    match hub.proposer.propose(RegionCommand::domain(cmd)).await {
        Ok(CommandOutcome::Domain(Ok(
            Applied::SliceReserved { .. } | Applied::SliceReleased { .. },
        ))) if indexed => {
            // A leader answers once it applied the entry; a follower may
            // not have yet: after a read barrier it has, and what its
            // pushes say from now on includes the remap. (Without the
            // barrier, failed, the index may be older than the remap,
            // which only weakens the agent's guard.)
            // (Leading both when it proposed and now: it applied the
            // entry itself. One elected meanwhile may not have yet.)
            if !(led && hub.leader() == hub.id) {
                if let Err(e) = hub.proposer.read_barrier().await {
                    tracing::debug!(agent = %agent.0, "remap granted; read barrier: {e}");
                }
            }
            let (applied_index, node) = {
                let st = hub.state.read();
                let node = st.region.domain().agent(agent).map(|a| a.node.clone());
                (st.last_applied.map_or(0, |l| l.index), node)
            };
            if let Some(node) = node {
                let mut granted = hub.granted.lock().unwrap_or_else(|p| p.into_inner());
                let g = granted.entry(node).or_insert(0);
                *g = (*g).max(applied_index);
            }
            RegionMessage::v1(RegionMessageV1::Granted { applied_index })
        }
        Ok(CommandOutcome::Domain(Ok(
            Applied::SliceReserved { .. } | Applied::SliceReleased { .. },
        ))) => RegionMessage::v1(RegionMessageV1::Ack),
        Ok(CommandOutcome::Domain(Err(e))) => refused(e.code(), e.to_string(), false),
        Ok(other) => refused("internal", format!("unexpected outcome {other:?}"), true),
        Err(e @ (WriteError::NoLeader | WriteError::Unknown(_) | WriteError::Stopped)) => {
            refused("retry", e.to_string(), true)
        }
        Err(e) => refused("invalid", e.to_string(), false),
    }
}

fn view(hub: &AgentHub, node: &NodeId) -> (Assignment, TokenDigests) {
    let s = hub.state.read();
    let index = s.last_applied.map_or(0, |l| l.index);
    let domain = s.region.domain();
    let assignment = Assignment::of_node(domain, node, index);
    let tenants = domain
        .tenants()
        .map(|t| TenantTokens {
            tenant: t.id.clone(),
            digests: t.tokens.values().map(|k| k.digest.clone()).collect(),
        })
        .collect();
    (
        assignment,
        TokenDigests {
            applied_index: index,
            tenants,
        },
    )
}

/// Pushes one message on its own stream. A message over the agent wire's
/// limit is refused before a stream is opened (the agent would refuse it
/// and close the link).
async fn push(conn: &quinn::Connection, msg: RegionMessageV1) -> Result<(), WireError> {
    let frame = AgentFrames::encode(&RegionMessage::v1(msg))?;
    let mut send = conn
        .open_uni()
        .await
        .map_err(|e| WireError::Stream(e.to_string()))?;
    write_encoded(&mut send, &frame).await
}

/// Whether pushing may go on after `result`: a message that cannot be
/// framed is logged and skipped (it is pushed again when it changes or at
/// the next refresh); a broken stream ends the pushes.
fn pushed(result: Result<(), WireError>, node: &NodeId, what: &str) -> bool {
    match result {
        Ok(()) => true,
        Err(WireError::Frame(e)) => {
            tracing::error!(node = %node.0, "cannot push the {what} to the agent: {e}");
            true
        }
        Err(WireError::Stream(_)) => false,
    }
}

async fn pushes(conn: quinn::Connection, hub: AgentHub, node: NodeId) {
    let (mut last_a, mut last_t) = (None, None);
    // The applied index of the last assignment pushed.
    let mut last_index = 0;
    let mut refreshed = tokio::time::Instant::now();
    loop {
        if refreshed.elapsed() >= REFRESH_EVERY {
            refreshed = tokio::time::Instant::now();
            (last_a, last_t) = (None, None);
        }
        let (a, t) = view(&hub, &node);
        // A remap granted here with a newer index than the last push: the
        // agent ignores assignments older than it (the last push may be
        // one), so the current one goes out even if its instances did not
        // change.
        let granted = hub
            .granted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&node)
            .copied();
        if granted.is_some_and(|g| last_index < g && a.applied_index >= g) {
            last_a = None;
        }
        if last_a.as_ref() != Some(&a.instances) {
            last_a = Some(a.instances.clone());
            last_index = a.applied_index;
            let ids: Vec<_> = a.instances.iter().map(|i| i.instance).collect();
            let result = push(&conn, RegionMessageV1::Assignment(a)).await;
            if result.is_ok() {
                hub.delivered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(node.clone(), ids);
            }
            if !pushed(result, &node, "assignment") {
                return;
            }
        }
        if last_t.as_ref() != Some(&t.tenants) {
            last_t = Some(t.tenants.clone());
            if !pushed(
                push(&conn, RegionMessageV1::Tokens(t)).await,
                &node,
                "token digests",
            ) {
                return;
            }
        }
        tokio::time::sleep(PUSH_EVERY).await;
    }
}

/// Serves one agent connection until it closes. A bad frame closes it
/// with code [`BAD_FRAME`].
pub async fn serve_agent(conn: quinn::Connection, hub: AgentHub) {
    let mut pusher: Option<tokio::task::JoinHandle<()>> = None;
    let mut registered: Option<AgentId> = None;
    let mut node: Option<NodeId> = None;
    // The agent moves when its heartbeats are refused `cut_off`.
    let mut moves = false;
    // The agent takes `Granted` for a committed remap.
    let mut indexed = false;
    let link = conn.stable_id();
    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
        let msg: AgentMessage = match read_frame(&mut recv).await {
            Ok(m) => m,
            Err(WireError::Frame(_)) => {
                conn.close(BAD_FRAME.into(), b"bad frame");
                break;
            }
            Err(_) => continue,
        };
        let AgentMessage::V1(msg) = msg;
        // An older agent's plain Register states no GPU policy (exact
        // GPUs), and neither it nor RegisterGpus any feature.
        let msg = match msg {
            AgentMessageV1::Register(register) => AgentMessageV1::RegisterWith {
                register,
                allow_fewer_gpus: false,
                features: Vec::new(),
            },
            AgentMessageV1::RegisterGpus {
                register,
                allow_fewer_gpus,
            } => AgentMessageV1::RegisterWith {
                register,
                allow_fewer_gpus,
                features: Vec::new(),
            },
            other => other,
        };
        let reply = match msg {
            AgentMessageV1::RegisterWith {
                register: r,
                allow_fewer_gpus,
                features,
            } => {
                let reply = register(&hub, &conn, &r, allow_fewer_gpus).await;
                if let RegionMessage::V1(RegionMessageV1::Refused { code, message, .. }) = &reply {
                    tracing::warn!(node = %r.node.0, code = %code, "agent registration refused: {message}");
                }
                if matches!(reply, RegionMessage::V1(RegionMessageV1::Registered { .. })) {
                    tracing::info!(agent = %r.agent.0, node = %r.node.0, "agent registered");
                    if let Some(p) = pusher.take() {
                        p.abort();
                    }
                    hub.links
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(r.node.clone(), conn.clone());
                    hub.reports.registered(link, &r);
                    hub.heard_from(&r.node);
                    registered = Some(r.agent.clone());
                    node = Some(r.node.clone());
                    let has = |feature: &str| features.iter().any(|f| f == feature);
                    moves = has(gshare_core::protocol::FEATURE_CUT_OFF);
                    indexed = has(gshare_core::protocol::FEATURE_GRANTED_INDEX);
                    pusher = Some(tokio::spawn(pushes(conn.clone(), hub.clone(), r.node)));
                }
                reply
            }
            AgentMessageV1::Heartbeat(h) => {
                let agent = h.agent.clone();
                if registered.as_ref() == Some(&h.agent) {
                    if let Some(n) = &node {
                        hub.heard_from(n);
                    }
                    hub.reports.heartbeat(h);
                }
                // What it reports is true either way (the agent may stay
                // here: its invocations come through this replica).
                match hub.cut_off().filter(|_| moves) {
                    Some(why) => {
                        tracing::debug!(agent = %agent.0, "heartbeat refused: {why}");
                        refused(
                            gshare_core::protocol::CUT_OFF,
                            format!("{why}; link to another replica"),
                            true,
                        )
                    }
                    None => RegionMessage::v1(RegionMessageV1::Ack),
                }
            }
            AgentMessageV1::Loads {
                agent,
                at_ms,
                loads,
                dropped,
            } => {
                if registered.as_ref() == Some(&agent) {
                    hub.reports.loads(&agent, at_ms, loads, dropped);
                }
                RegionMessage::v1(RegionMessageV1::Ack)
            }
            AgentMessageV1::HostCopies { agent, copies } => {
                if registered.as_ref() == Some(&agent) {
                    hub.reports.host_copies(&agent, copies);
                }
                RegionMessage::v1(RegionMessageV1::Ack)
            }
            AgentMessageV1::Swaps { agent, events } => {
                if registered.as_ref() == Some(&agent) {
                    hub.reports.swaps(&agent, &events);
                    if let Some(n) = &node {
                        let st = hub.state.read();
                        hub.activity.swapped(&n.0, &events, st.region.domain());
                    }
                }
                RegionMessage::v1(RegionMessageV1::Ack)
            }
            AgentMessageV1::Usage { agent, records } => {
                if registered.as_ref() != Some(&agent) {
                    refused(
                        "not_registered",
                        format!(
                            "usage of agent {:?} on a connection not registered as it",
                            agent.0
                        ),
                        false,
                    )
                } else {
                    let hub = hub.clone();
                    let node = node.clone();
                    tokio::spawn(async move {
                        let reply = usage(&hub, agent, node, records).await;
                        let _ = write_frame(&mut send, &reply).await;
                    });
                    continue;
                }
            }
            AgentMessageV1::Leaving { agent } => {
                if registered.as_ref() == Some(&agent) {
                    tracing::info!(agent = %agent.0, "the agent moved to another replica");
                    if let Some(n) = node.take() {
                        let mut links = hub.links.lock().unwrap_or_else(|p| p.into_inner());
                        if links.get(&n).is_some_and(|c| c.stable_id() == link) {
                            links.remove(&n);
                        }
                    }
                    if let Some(p) = pusher.take() {
                        p.abort();
                    }
                    hub.reports.disconnected(&agent, link);
                    registered = None;
                }
                RegionMessage::v1(RegionMessageV1::Ack)
            }
            AgentMessageV1::SliceReserve {
                agent,
                instance,
                slice,
            } => {
                let cmd = DomainCommand::InstanceSliceReserve { instance, slice };
                let hub = hub.clone();
                let registered = registered.clone();
                tokio::spawn(async move {
                    let reply =
                        remap(&hub, (registered.as_ref(), indexed), &agent, instance, cmd).await;
                    let _ = write_frame(&mut send, &reply).await;
                });
                continue;
            }
            AgentMessageV1::SliceRelease {
                agent,
                instance,
                gpu,
            } => {
                let cmd = DomainCommand::InstanceSliceRelease { instance, gpu };
                let hub = hub.clone();
                let registered = registered.clone();
                tokio::spawn(async move {
                    let reply =
                        remap(&hub, (registered.as_ref(), indexed), &agent, instance, cmd).await;
                    let _ = write_frame(&mut send, &reply).await;
                });
                continue;
            }
            _ => RegionMessage::v1(RegionMessageV1::Ack),
        };
        let _ = write_frame(&mut send, &reply).await;
    }
    if let Some(p) = pusher {
        p.abort();
    }
    if let Some(agent) = registered {
        hub.reports.disconnected(&agent, link);
    }
}
