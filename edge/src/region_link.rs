//! The agent's link to the region: QUIC + mutual TLS to one replica at a
//! time.
//!
//! ```text
//!   agent ── bi stream: Register ─────────────▶ replica   ◀─ Registered | Refused{retry}
//!         ── bi stream: Heartbeat / Loads / Swaps ▶          ◀─ Ack
//!         ◀─ uni stream: Assignment | Tokens ──            (pushed whenever they change)
//!         ◀─ bi stream: Invoke ───────────────             ─▶ InvokeReply
//!         ◀─ bi stream: InvokeStreamed, InvokeBodyChunk…, InvokeBodyEnd
//!                       (the body passed to the function as it comes) ─▶ InvokeReply | InvokeHead…
//!         ── bi stream: Usage{records} ───────▶           ◀─ UsageAck{seqs} | Refused
//!         ── bi stream: SliceReserve / SliceRelease ▶     ◀─ Granted{applied_index} | Ack (committed) | Refused
//! ```
//!
//! Remaps: the executor's reservations and releases are taken from the
//! [`NodeAgent`] every [`SLICE_POLL`] and sent one at a time; the answer
//! goes back as [`SliceAnswer`] (granted only on `Granted` or `Ack`; a
//! refusal or a lost connection counts as refused, so nothing moves;
//! without a link they wait in the agent, the oldest beyond 1,000
//! refused).
//!
//! Usage: after `Registered{next_seq}` the journal is reconciled with the
//! region (records below `next_seq` were applied: dropped), then a sender
//! drains it oldest first in batches of at most [`USAGE_BATCH`] records,
//! removing a batch only when the region acknowledged it; it wakes on new
//! appends or every second. A `Refused` keeps the records (they are never
//! dropped) and retries after a backoff; a lost connection ends the session
//! and the next one resends whatever was not acknowledged (the region
//! applies each `(agent, seq)` once).
//!
//! The agent tries the replicas of its config in turn; a `Refused` with
//! `retry` (not the leader, no leader yet) or a lost connection moves it to
//! the next one after a backoff (100 ms doubling to 5 s, reset by a
//! successful registration); a replica gets 2 s for the handshake and 3 s
//! for the registration's answer. A heartbeat refused by a replica cut off
//! from the region's leader (code `cut_off`) starts a move attempt beside
//! the heartbeats: after a random wait of up to 1 s, the agent tries to
//! register with the other replicas in turn (2 s each) while its replica
//! still refuses. Once one took it, a last heartbeat checks that its
//! replica is still cut off (only an Ack keeps the agent); then the agent
//! serves the new registration and, beside it, tells the old replica
//! `Leaving` (it stops sending new invocations; those in flight finish).
//! It stays where it is if no replica takes it (its
//! invocations and assignments still come through that replica, where
//! none would serve them) or its replica found a leader meanwhile. Remap
//! requests a session ends without answering are answered not granted
//! (`AbandonSliceRequests`, after the session's own answers). A
//! malformed or oversized frame from the
//! replica closes that connection (code 0x10) and the link reconnects;
//! serving goes on throughout, with the last instances and tokens.

use crate::agent::{
    AbandonSliceRequests, ApplyAssignment, ApplyTokens, HostCopiesQuery, Invoke, KeyAnswer,
    LookupKey, Metering, NodeAgent, SliceAnswer, SliceRequest, StatusQuery, TakeLoads,
    TakeSliceRequests, TakeSwapEvents,
};
use crate::gpu::{Discovered, GpuMeter};
use crate::ingress::Answered;
use crate::journal::{JournalBatch, UsageJournal};
use crate::runtime::{BodyPart, RequestBody, StreamItem};
use crate::tls::client_config;
use crate::wire::{read_frame, write_frame, write_frame_more, WireError, BAD_FRAME};
use actix::{Actor, Addr, AsyncContext, Context, WrapFuture};
use gshare_core::config::AgentConfig;
use gshare_core::net::http_client::{BodyLimits, BodyStop};
use gshare_core::protocol::{
    AgentCounters, AgentMessage, AgentMessageV1, Heartbeat, HostCopy, InvokeError, InvokeOutcome,
    InvokeReply, NodeGpu, RegionMessage, RegionMessageV1, Register, ReplyHead, MAX_BODY_CHUNK,
};
use gshare_core::state::AgentId;
use std::cell::Cell;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// The longest the QUIC handshake with one replica may take before the
/// agent tries the next (one round trip and TLS: well under it even over
/// a slow edge link).
const CONNECT_WITHIN: Duration = Duration::from_secs(2);
/// The longest the answer to a registration may take (a Raft write through
/// the leader: milliseconds; a replica cut off from the leader refuses at
/// once). Handshake and answer together stay within the region's node
/// grace (3 s to not ready, 2 s more to replacement).
const REGISTER_WITHIN: Duration = Duration::from_secs(3);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Most records per usage message (≈100 bytes each, well inside a frame).
pub const USAGE_BATCH: usize = 2_000;
/// How often the usage sender looks at the journal without being woken.
const USAGE_POLL: Duration = Duration::from_secs(1);
/// How often the executor's remap requests are collected for the region.
const SLICE_POLL: Duration = Duration::from_millis(20);

/// Largest answer body sent back to a replica whole, in one
/// `InvokeReply` (the agent wire's frame limit, less room for the reply's
/// other fields); a larger one goes as a stream of chunks
/// ([`Back::Chunked`]), so a replica passes on every answer up to the
/// runtime template's `max_reply_bytes`, the one reply cap.
pub const MAX_WHOLE_BODY: usize = gshare_core::protocol::AGENT_FRAME_BYTES - 1024;

/// How an answer goes back to the replica that forwarded the invocation.
#[derive(Debug, PartialEq)]
enum Back {
    /// In one frame: the outcome, after an `InvokeHead` when it is a
    /// transparent call's own answer (`head`).
    Whole(Option<ReplyHead>, InvokeOutcome),
    /// A completed answer too large for a frame: its head (the function's,
    /// or `200` without headers on the plain route), then its body in
    /// chunks, as a streamed reply (the timing headers are not sent).
    Chunked(ReplyHead, Vec<u8>),
}

impl Back {
    fn of(head: Option<ReplyHead>, outcome: InvokeOutcome) -> Back {
        match outcome {
            InvokeOutcome::Done { body, .. } if body.len() > MAX_WHOLE_BODY => Back::Chunked(
                head.unwrap_or(ReplyHead {
                    status: 200,
                    headers: Vec::new(),
                }),
                body,
            ),
            InvokeOutcome::Done { .. } => Back::Whole(head, outcome),
            // Only a completed run has the function's head.
            other => Back::Whole(None, other),
        }
    }
}

/// Most bytes of a streamed reply sent in one frame.
const STREAM_FRAME_DATA: usize = 256 << 10;

/// Sends a streamed reply on a forwarded invocation's stream: its head,
/// its body's chunks as they come (each within [`STREAM_FRAME_DATA`]),
/// then [`AgentMessageV1::InvokeStreamEnd`] (`complete` unless the chunks
/// stopped without [`StreamItem::End`]: deadline, crash, reply cap). A
/// replica that stops reading ends it (the function's reply is then cut,
/// as when a client of the ingress goes away).
async fn stream_reply(
    send: &mut quinn::SendStream,
    id: u64,
    head: ReplyHead,
    mut chunks: tokio::sync::mpsc::Receiver<StreamItem>,
) -> Result<(), WireError> {
    stream_head(send, id, head).await?;
    let mut complete = false;
    while let Some(item) = chunks.recv().await {
        match item {
            StreamItem::Data(b) => stream_data(send, id, &b).await?,
            StreamItem::End => {
                complete = true;
                break;
            }
        }
    }
    stream_end(send, id, complete).await
}

/// A streamed reply's head frame.
async fn stream_head(
    send: &mut quinn::SendStream,
    id: u64,
    head: ReplyHead,
) -> Result<(), WireError> {
    let m = AgentMessageV1::InvokeHead {
        id,
        head,
        streamed: true,
    };
    write_frame_more(send, &AgentMessage::v1(m)).await
}

/// `data` as chunk frames of at most [`STREAM_FRAME_DATA`].
async fn stream_data(send: &mut quinn::SendStream, id: u64, data: &[u8]) -> Result<(), WireError> {
    for part in data.chunks(STREAM_FRAME_DATA) {
        let data = part.to_vec();
        let chunk = AgentMessage::v1(AgentMessageV1::InvokeChunk { id, data });
        write_frame_more(send, &chunk).await?;
    }
    Ok(())
}

/// A streamed reply's last frame.
async fn stream_end(
    send: &mut quinn::SendStream,
    id: u64,
    complete: bool,
) -> Result<(), WireError> {
    write_frame(
        send,
        &AgentMessage::v1(AgentMessageV1::InvokeStreamEnd { id, complete }),
    )
    .await
}

/// What the link knows about its TLS handshakes, shared with the ingress
/// (`/healthz`, `/metrics`): a handshake that fails (the replica's
/// certificate is not from this agent's CA, or the replica refused the
/// agent's) is a configuration mistake that retrying will not fix, so it
/// is shown rather than only logged. A registration clears it.
#[derive(Debug, Clone, Default)]
pub struct LinkHealth(Arc<LinkHealthInner>);

#[derive(Debug, Default)]
struct LinkHealthInner {
    last_tls_failure: std::sync::Mutex<Option<String>>,
}

impl LinkHealth {
    /// The last TLS handshake failure, while no registration followed it.
    pub fn tls_failure(&self) -> Option<String> {
        self.0
            .last_tls_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set(&self, failure: Option<String>) {
        *self
            .0
            .last_tls_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = failure;
    }
}

/// Whether `e` ended the connection in its TLS handshake (a crypto error
/// code, sent by either side).
fn is_tls_failure(e: &quinn::ConnectionError) -> bool {
    let crypto = |code: u64| (0x100..0x200).contains(&code);
    match e {
        quinn::ConnectionError::TransportError(t) => crypto(u64::from(t.code)),
        quinn::ConnectionError::ConnectionClosed(c) => crypto(u64::from(c.error_code)),
        _ => false,
    }
}

/// Why a session with one replica ended.
#[derive(Debug, thiserror::Error)]
enum SessionEnd {
    #[error("refused: {0}")]
    Refused(String),
    /// The replica was cut off from the leader, and another one took the
    /// agent's registration: the link goes on there.
    #[error("moved to {0}: the replica was cut off from the region's leader")]
    Moved(SocketAddr, Registered),
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("connect: {0}")]
    Connect(String),
    #[error(
        "TLS handshake failed: {0} (is tls.ca_cert the region's CA, and tls.cert issued by it?)"
    )]
    Tls(String),
}

#[derive(Clone)]
struct LinkSetup {
    endpoint: quinn::Endpoint,
    replicas: Vec<SocketAddr>,
    register: Register,
    allow_fewer_gpus: bool,
    heartbeat: Duration,
    agent: Addr<NodeAgent>,
    meter: GpuMeter,
    usage: Option<(Arc<UsageJournal>, Arc<Notify>)>,
    health: LinkHealth,
    /// The agent's `max_request_bytes`: a streamed body over it is cut.
    max_request_bytes: usize,
}

/// The actor holding the link (dropping its address does not stop it; it
/// ends with the actix system).
pub struct RegionLink {
    setup: LinkSetup,
}

impl RegionLink {
    /// Builds the QUIC client from `config` (paths relative to `base`) and
    /// starts the link.
    pub fn start_link(
        config: &AgentConfig,
        base: &Path,
        found: &Discovered,
        agent: Addr<NodeAgent>,
    ) -> anyhow::Result<Addr<RegionLink>> {
        Self::start_metered(config, base, found, agent, None)
    }

    /// Like [`RegionLink::start_link`], and sends `metering`'s journal to
    /// the region.
    pub fn start_metered(
        config: &AgentConfig,
        base: &Path,
        found: &Discovered,
        agent: Addr<NodeAgent>,
        metering: Option<&Metering>,
    ) -> anyhow::Result<Addr<RegionLink>> {
        Self::start_with_health(config, base, found, agent, metering, LinkHealth::default())
    }

    /// Like [`RegionLink::start_metered`], and records its TLS handshake
    /// failures in `health` (which the ingress shows).
    pub fn start_with_health(
        config: &AgentConfig,
        base: &Path,
        found: &Discovered,
        agent: Addr<NodeAgent>,
        metering: Option<&Metering>,
        health: LinkHealth,
    ) -> anyhow::Result<Addr<RegionLink>> {
        let client = client_config(
            &base.join(&config.tls.ca_cert),
            &base.join(&config.tls.cert),
            &base.join(&config.tls.key),
        )?;
        let mut endpoint = quinn::Endpoint::client(config.quic_bind)?;
        endpoint.set_default_client_config(client);
        let register = Register {
            agent: AgentId(config.node.0.clone()),
            node: config.node.clone(),
            pool: config.pool.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            gpus: found
                .gpus
                .iter()
                .map(|g| NodeGpu {
                    index: g.index,
                    model: g.model.clone(),
                    memory_mib: g.memory_mib,
                })
                .collect(),
            ingress: config.ingress_addr.to_string(),
        };
        Ok(RegionLink {
            setup: LinkSetup {
                endpoint,
                replicas: config.replicas.clone(),
                register,
                allow_fewer_gpus: config.allow_fewer_gpus,
                heartbeat: Duration::from_millis(config.heartbeat_ms),
                agent,
                meter: GpuMeter::new(found.nvml.clone()),
                usage: metering.map(|m| (m.journal.clone(), m.appended.clone())),
                health,
                max_request_bytes: config.max_request_bytes,
            },
        }
        .start())
    }
}

impl Actor for RegionLink {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.spawn(run(self.setup.clone()).into_actor(self));
    }
}

async fn run(setup: LinkSetup) {
    let mut backoff = BACKOFF_MIN;
    let mut next = 0usize;
    // A registration made on another replica while the last one was cut
    // off from the leader: served next, at once.
    let mut moved: Option<(SocketAddr, Registered)> = None;
    loop {
        let (addr, ended) = match moved.take() {
            Some((addr, registered)) => (addr, serve(&setup, addr, registered).await),
            None => {
                let addr = setup.replicas[next % setup.replicas.len()];
                next += 1;
                let ended = match register(&setup, addr).await {
                    Ok(registered) => {
                        backoff = BACKOFF_MIN;
                        serve(&setup, addr, registered).await
                    }
                    Err(e) => Err(e),
                };
                (addr, ended)
            }
        };
        // What the session took and did not answer is refused: the
        // executor never waits on a remap half (a release left waiting
        // kept its slice reserved until the agent restarted).
        setup.agent.do_send(AbandonSliceRequests);
        match ended {
            Ok(()) => {}
            Err(SessionEnd::Moved(to, registered)) => {
                tracing::warn!(from = %addr, to = %to, "region link moved: the replica was cut off from the region's leader");
                if let Some(i) = setup.replicas.iter().position(|r| *r == to) {
                    next = i + 1;
                }
                moved = Some((to, registered));
                continue;
            }
            Err(e) => {
                if matches!(e, SessionEnd::Tls(_)) {
                    setup.health.set(Some(format!("{addr}: {e}")));
                }
                tracing::warn!(replica = %addr, "region link: {e}")
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

async fn request(conn: &quinn::Connection, msg: AgentMessage) -> Result<RegionMessage, SessionEnd> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| {
        if is_tls_failure(&e) {
            SessionEnd::Tls(e.to_string())
        } else {
            WireError::Stream(e.to_string()).into()
        }
    })?;
    write_frame(&mut send, &msg).await?;
    let read = read_frame(&mut recv).await;
    // In TLS 1.3 a refused client certificate shows after the handshake,
    // as the connection's close with a crypto code.
    if read.is_err() {
        if let Some(e) = conn.close_reason().filter(is_tls_failure) {
            return Err(SessionEnd::Tls(e.to_string()));
        }
    }
    match read {
        Err(WireError::Frame(e)) => {
            conn.close(BAD_FRAME.into(), b"bad frame");
            Err(WireError::Frame(e).into())
        }
        other => Ok(other?),
    }
}

/// A registration the region took: the connection it was made on and
/// the region's next expected usage number.
#[derive(Debug)]
struct Registered {
    conn: quinn::Connection,
    next_seq: u64,
}

/// Connects to the replica at `addr` and registers the agent there.
/// A replica that does not answer (down, or its host unreachable) costs
/// [`CONNECT_WITHIN`] for the handshake, or [`REGISTER_WITHIN`] for the
/// answer, not QUIC's idle timeout (30 s, during which the node, heard by
/// no replica, is declared lost and its instances are placed elsewhere).
/// Registers with [`gshare_core::protocol::FEATURE_CUT_OFF`]: the agent
/// moves when its heartbeats are refused `cut_off` (see `heartbeats`).
async fn register(setup: &LinkSetup, addr: SocketAddr) -> Result<Registered, SessionEnd> {
    let connecting = setup
        .endpoint
        .connect(addr, &addr.ip().to_string())
        .map_err(|e| SessionEnd::Connect(e.to_string()))?;
    let conn = match tokio::time::timeout(CONNECT_WITHIN, connecting).await {
        Ok(connected) => connected.map_err(|e| {
            if is_tls_failure(&e) {
                SessionEnd::Tls(e.to_string())
            } else {
                SessionEnd::Connect(e.to_string())
            }
        })?,
        Err(_) => {
            return Err(SessionEnd::Connect(format!(
                "no handshake within {} ms",
                CONNECT_WITHIN.as_millis()
            )))
        }
    };
    let reg = AgentMessage::v1(AgentMessageV1::RegisterWith {
        register: setup.register.clone(),
        allow_fewer_gpus: setup.allow_fewer_gpus,
        features: vec![
            gshare_core::protocol::FEATURE_CUT_OFF.to_string(),
            gshare_core::protocol::FEATURE_GRANTED_INDEX.to_string(),
        ],
    });
    let answer = match tokio::time::timeout(REGISTER_WITHIN, request(&conn, reg)).await {
        Ok(answer) => answer?,
        Err(_) => {
            conn.close(0u32.into(), b"no registration answer");
            return Err(SessionEnd::Connect(format!(
                "no answer to the registration within {} ms",
                REGISTER_WITHIN.as_millis()
            )));
        }
    };
    match answer {
        RegionMessage::V1(RegionMessageV1::Registered { next_seq, leader }) => {
            // `leader`: the replica id of the region's leader (0: the
            // replica answering did not know it).
            let leader = match leader {
                0 => "unknown".to_string(),
                id => format!("replica {id}"),
            };
            tracing::info!(
                via = %addr,
                region_leader = %leader,
                next_usage_seq = next_seq,
                "registered with the region"
            );
            Ok(Registered { conn, next_seq })
        }
        RegionMessage::V1(RegionMessageV1::Refused { code, message, .. }) => {
            Err(SessionEnd::Refused(format!("{code}: {message}")))
        }
        other => Err(SessionEnd::Refused(format!("unexpected answer {other:?}"))),
    }
}

/// Serves the link on a registration until it ends (the journal is
/// reconciled with the region first: no other session runs meanwhile).
async fn serve(
    setup: &LinkSetup,
    addr: SocketAddr,
    registered: Registered,
) -> Result<(), SessionEnd> {
    let Registered { conn, next_seq } = registered;
    setup.health.set(None);
    if let Some((journal, _)) = &setup.usage {
        let j = journal.clone();
        match blocking(move || j.reconcile(next_seq)).await {
            Ok(r) => tracing::info!(
                removed = r.removed,
                advanced = r.advanced,
                "usage journal reconciled with the region"
            ),
            Err(e) => tracing::error!("usage journal reconcile: {e}"),
        }
    }
    let pushes = pushes(conn.clone(), setup.agent.clone());
    let invokes = invokes(conn.clone(), setup.agent.clone(), setup.max_request_bytes);
    let beats = heartbeats(conn.clone(), setup, addr);
    let usage = usage_sender(conn.clone(), setup);
    let remaps = slice_sender(conn.clone(), setup);
    let ended = tokio::select! {
        r = pushes => r,
        r = invokes => r,
        r = beats => r,
        r = usage => r,
        r = remaps => r,
    };
    if let Err(SessionEnd::Moved(..)) = &ended {
        actix_rt::spawn(leave(
            conn,
            addr,
            setup.register.agent.clone(),
            setup.agent.clone(),
            setup.max_request_bytes,
        ));
    }
    ended
}

/// How long the agent still takes invocations on a replica it left, after
/// the replica took the `Leaving`: streams it opened before arrive late.
const LEAVING_GRACE: Duration = Duration::from_secs(1);

/// Leaves the replica at `addr` after a move, beside the new session:
/// tells it `Leaving` (it sends no new invocations here) while still
/// taking the invocations it sends meanwhile, and for [`LEAVING_GRACE`]
/// after. Those in flight finish on their own tasks; the connection closes
/// once they did and its handles are gone. A replica that does not take
/// the leaving within [`MOVE_TRY`] is closed on at once.
async fn leave(
    conn: quinn::Connection,
    addr: SocketAddr,
    agent: gshare_core::state::AgentId,
    node_agent: Addr<NodeAgent>,
    max_request_bytes: usize,
) {
    let serving = invokes(conn.clone(), node_agent, max_request_bytes);
    tokio::pin!(serving);
    let leaving = AgentMessage::v1(AgentMessageV1::Leaving { agent });
    let leaving = tokio::time::timeout(MOVE_TRY, request(&conn, leaving));
    let taken = tokio::select! {
        answer = leaving => matches!(answer, Ok(Ok(RegionMessage::V1(RegionMessageV1::Ack)))),
        _ = &mut serving => false,
    };
    if taken {
        let _ = tokio::time::timeout(LEAVING_GRACE, &mut serving).await;
    } else {
        tracing::debug!(replica = %addr, "the old replica did not take the leaving");
        conn.close(0u32.into(), b"moved to another replica");
    }
}

/// How long a replica cut off from the leader gets to answer a move's
/// registration attempt, per other replica.
const MOVE_TRY: Duration = Duration::from_secs(2);
/// A move attempt starts after a random wait of up to this.
const MOVE_JITTER: Duration = Duration::from_millis(1_000);

/// A random duration below `max`.
fn jitter(max: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX).max(1);
    Duration::from_millis(r % ms)
}

/// The replica at `from` is cut off from the leader: registers the agent
/// with another replica of the config, if one takes it (in config order
/// after `from`). Until one does, the agent stays on `from`: its
/// invocations and assignments still come through it, where no replica
/// at all would serve them.
async fn move_from(
    setup: &LinkSetup,
    from: SocketAddr,
    refused: &Cell<bool>,
) -> Option<(SocketAddr, Registered)> {
    // Every agent of the replica looks at once: spread them out.
    tokio::time::sleep(jitter(MOVE_JITTER)).await;
    let at = setup.replicas.iter().position(|r| *r == from).unwrap_or(0);
    let n = setup.replicas.len();
    for k in 1..n {
        let to = setup.replicas[(at + k) % n];
        if to == from {
            continue;
        }
        // Its replica answered a heartbeat meanwhile: no move.
        if !refused.get() {
            return None;
        }
        match tokio::time::timeout(MOVE_TRY, register(setup, to)).await {
            Ok(Ok(registered)) => return Some((to, registered)),
            Ok(Err(e)) => tracing::debug!(replica = %to, "no move there: {e}"),
            Err(_) => tracing::debug!(replica = %to, "no move there: no answer"),
        }
    }
    None
}

/// Sends the executor's remap halves to the region, one at a time, and
/// hands each answer back (see the module docs).
async fn slice_sender(conn: quinn::Connection, setup: &LinkSetup) -> Result<(), SessionEnd> {
    let agent = setup.register.agent.clone();
    loop {
        tokio::time::sleep(SLICE_POLL).await;
        let Ok(requests) = setup.agent.send(TakeSliceRequests).await else {
            return Ok(());
        };
        let mut left: std::collections::VecDeque<SliceRequest> = requests.into();
        while let Some(ask) = left.front() {
            let msg = match ask {
                SliceRequest::Reserve {
                    instance, slice, ..
                } => AgentMessageV1::SliceReserve {
                    agent: agent.clone(),
                    instance: *instance,
                    slice: slice.clone(),
                },
                SliceRequest::Release { instance, gpu } => AgentMessageV1::SliceRelease {
                    agent: agent.clone(),
                    instance: *instance,
                    gpu: gpu.clone(),
                },
            };
            let answer = request(&conn, AgentMessage::v1(msg)).await;
            let (granted, applied_index) = match &answer {
                Ok(RegionMessage::V1(RegionMessageV1::Granted { applied_index })) => {
                    (true, Some(*applied_index))
                }
                Ok(RegionMessage::V1(RegionMessageV1::Ack)) => (true, None),
                _ => (false, None),
            };
            if let Ok(RegionMessage::V1(RegionMessageV1::Refused { code, message, .. })) = &answer {
                tracing::debug!(code, "remap refused: {message}");
            }
            if let Some(request) = left.pop_front() {
                setup.agent.do_send(SliceAnswer {
                    request,
                    granted,
                    applied_index,
                });
            }
            // The rest was never sent: answered not granted when the
            // session ends (`AbandonSliceRequests`).
            answer?;
        }
    }
}

/// Runs a journal operation on a blocking thread (it may fsync).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::journal::JournalError> + Send + 'static,
) -> Result<T, String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(format!("journal task: {e}")),
    }
}

/// Drains the journal to the region (see the module docs).
async fn usage_sender(conn: quinn::Connection, setup: &LinkSetup) -> Result<(), SessionEnd> {
    let Some((journal, appended)) = setup.usage.clone() else {
        return std::future::pending().await;
    };
    let mut backoff = BACKOFF_MIN;
    loop {
        let j = journal.clone();
        let batch: Option<JournalBatch> =
            match blocking(move || j.batch_after(0, USAGE_BATCH)).await {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!("usage journal read: {e}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            };
        let Some(batch) = batch else {
            let _ = tokio::time::timeout(USAGE_POLL, appended.notified()).await;
            continue;
        };
        let msg = AgentMessage::v1(AgentMessageV1::Usage {
            agent: batch.agent.clone(),
            records: batch.records.clone(),
        });
        match request(&conn, msg).await? {
            RegionMessage::V1(RegionMessageV1::UsageAck { seqs }) => {
                let (first, last) = (batch.first_seq(), batch.last_seq());
                let all = batch.records.len() == seqs.len()
                    && batch.records.iter().zip(&seqs).all(|(r, s)| r.seq == *s);
                if !all {
                    tracing::warn!(first, last, "usage ack does not match the batch; resending");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
                let j = journal.clone();
                match blocking(move || j.ack(&batch)).await {
                    Ok(_) => {
                        tracing::debug!(first, last, "usage acknowledged");
                        backoff = BACKOFF_MIN;
                    }
                    Err(e) => tracing::error!("usage journal ack: {e}"),
                }
            }
            RegionMessage::V1(RegionMessageV1::Refused {
                code,
                message,
                retry,
            }) => {
                tracing::warn!(
                    code,
                    retry,
                    first = batch.first_seq(),
                    "usage refused, records kept: {message}"
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            other => {
                return Err(SessionEnd::Refused(format!(
                    "unexpected answer to usage {other:?}"
                )))
            }
        }
    }
}

async fn pushes(conn: quinn::Connection, agent: Addr<NodeAgent>) -> Result<(), SessionEnd> {
    loop {
        let mut recv = conn
            .accept_uni()
            .await
            .map_err(|e| WireError::Stream(e.to_string()))?;
        let msg: RegionMessage = match read_frame(&mut recv).await {
            Err(WireError::Frame(e)) => {
                conn.close(BAD_FRAME.into(), b"bad frame");
                return Err(WireError::Frame(e).into());
            }
            other => other?,
        };
        match msg {
            RegionMessage::V1(RegionMessageV1::Assignment(a)) => agent.do_send(ApplyAssignment(a)),
            RegionMessage::V1(RegionMessageV1::Tokens(t)) => agent.do_send(ApplyTokens(t)),
            other => tracing::warn!("unexpected push {other:?}"),
        }
    }
}

/// Passes a streamed request body's frames ([`RegionMessageV1::InvokeBodyChunk`]
/// then [`RegionMessageV1::InvokeBodyEnd`], for invocation `id`) from
/// `recv` to `tx`, its first bytes `first` before them; at most `cap`
/// bytes in all, and the announced `len` exactly. A frame that does not
/// decode closes the connection (as every other stream does); any other
/// frame, another id, a chunk over [`MAX_BODY_CHUNK`] or a body over
/// `cap` stops this stream; a stream that ends before `InvokeBodyEnd`
/// cuts the body too (`tx` dropped without [`BodyPart::End`]: the call is
/// aborted). A body over `cap` is recorded in `over` (how much had been
/// passed on), so the call's failure is answered `413 body_too_large`.
/// Ends early when the function no longer takes the body.
async fn receive_body(
    conn: quinn::Connection,
    mut recv: quinn::RecvStream,
    id: u64,
    (first, len, cap): (Vec<u8>, Option<u64>, usize),
    (tx, over): (
        tokio::sync::mpsc::Sender<BodyPart>,
        Rc<Cell<Option<BodyStop>>>,
    ),
) {
    let mut total = first.len();
    let refuse = |recv: &mut quinn::RecvStream, why: String| {
        tracing::warn!(id, "streamed request body refused: {why}");
        let _ = recv.stop(BAD_FRAME.into());
    };
    if first.len() > cap {
        over.set(Some(BodyStop::OverCap { passed: 0 }));
        return refuse(&mut recv, format!("over max_request_bytes ({cap})"));
    }
    if !first.is_empty() && tx.send(BodyPart::Data(first.into())).await.is_err() {
        return;
    }
    loop {
        let frame = tokio::select! {
            f = read_frame::<RegionMessage>(&mut recv) => f,
            () = tx.closed() => return,
        };
        match frame {
            Err(WireError::Frame(e)) => {
                tracing::warn!(id, "malformed frame in a streamed request body: {e}");
                conn.close(BAD_FRAME.into(), b"bad frame");
                return;
            }
            Err(e) => {
                tracing::debug!(id, "a streamed request body was cut: {e}");
                return;
            }
            Ok(RegionMessage::V1(RegionMessageV1::InvokeBodyChunk { id: of, data }))
                if of == id =>
            {
                if data.len() > MAX_BODY_CHUNK {
                    return refuse(&mut recv, format!("a chunk of {} bytes", data.len()));
                }
                if data.len() > cap.saturating_sub(total) {
                    over.set(Some(BodyStop::OverCap {
                        passed: total as u64,
                    }));
                    return refuse(&mut recv, format!("over max_request_bytes ({cap})"));
                }
                total = total.saturating_add(data.len());
                if tx.send(BodyPart::Data(data.into())).await.is_err() {
                    return;
                }
            }
            Ok(RegionMessage::V1(RegionMessageV1::InvokeBodyEnd { id: of })) if of == id => {
                if len.is_some_and(|n| n != total as u64) {
                    return refuse(&mut recv, format!("{total} bytes, {len:?} announced"));
                }
                let _ = tx.send(BodyPart::End).await;
                return;
            }
            Ok(other) => return refuse(&mut recv, format!("unexpected frame {other:?}")),
        }
    }
}

async fn invokes(
    conn: quinn::Connection,
    agent: Addr<NodeAgent>,
    max_request_bytes: usize,
) -> Result<(), SessionEnd> {
    loop {
        let (mut send, mut recv) = conn
            .accept_bi()
            .await
            .map_err(|e| WireError::Stream(e.to_string()))?;
        let msg: RegionMessage = match read_frame(&mut recv).await {
            Err(WireError::Frame(e)) => {
                conn.close(BAD_FRAME.into(), b"bad frame");
                return Err(WireError::Frame(e).into());
            }
            other => other?,
        };
        let (mut req, key, call, streamed) = match msg {
            RegionMessage::V1(RegionMessageV1::Invoke(req)) => (req, None, None, None),
            RegionMessage::V1(RegionMessageV1::InvokeKeyed { key, request }) => {
                if !gshare_core::state::is_valid_key(&key) {
                    tracing::warn!("invocation with a malformed idempotency key refused");
                    continue;
                }
                (request, Some(key), None, None)
            }
            RegionMessage::V1(RegionMessageV1::InvokeHttp { key, request, call }) => {
                if !gshare_core::state::is_valid_key(&key) {
                    tracing::warn!("invocation with a malformed idempotency key refused");
                    continue;
                }
                (request, Some(key), Some(call), None)
            }
            RegionMessage::V1(RegionMessageV1::InvokeStreamed {
                key,
                request,
                call,
                len,
            }) => {
                if !gshare_core::state::is_valid_key(&key) {
                    tracing::warn!("invocation with a malformed idempotency key refused");
                    continue;
                }
                (request, Some(key), call, Some(len))
            }
            RegionMessage::V1(RegionMessageV1::InvokeLookup { id, tenant, key }) => {
                let agent = agent.clone();
                actix_rt::spawn(async move {
                    let outcome = match agent.send(LookupKey { tenant, key }).await {
                        Ok(KeyAnswer::Known(o)) => Some(o),
                        Ok(KeyAnswer::Running(rx)) => rx.await.ok(),
                        Ok(KeyAnswer::Unknown) | Err(_) => None,
                    };
                    let reply = AgentMessage::v1(AgentMessageV1::InvokeLookupReply { id, outcome });
                    let _ = write_frame(&mut send, &reply).await;
                    delivered(send).await;
                });
                continue;
            }
            other => {
                tracing::warn!("unexpected request {other:?}");
                continue;
            }
        };
        // Set when a streamed body passes this agent's cap.
        let over: Rc<Cell<Option<BodyStop>>> = Rc::new(Cell::new(None));
        let body = match streamed {
            None => RequestBody::from(std::mem::take(&mut req.body)),
            Some(len) => {
                let (tx, body) =
                    RequestBody::channel(gshare_core::net::http_client::BODY_PARTS, len);
                let first = (std::mem::take(&mut req.body), len, max_request_bytes);
                let over = (tx, over.clone());
                actix_rt::spawn(receive_body(conn.clone(), recv, req.id, first, over));
                body
            }
        };
        let agent = agent.clone();
        actix_rt::spawn(async move {
            let answered = async {
                let id = req.id;
                let msg = Invoke {
                    tenant: req.tenant,
                    function: req.function,
                    token_digest: None,
                    deadline_ms: req.deadline_ms,
                    body,
                    idempotency_key: key,
                    http: None,
                };
                let (head, outcome) = match crate::ingress::ask(&agent, msg, call).await {
                    Answered::Stream(head, chunks) => {
                        let _ = stream_reply(&mut send, id, head, chunks).await;
                        return;
                    }
                    Answered::Whole(head, outcome) => match (outcome, over.get()) {
                        // A call that failed because its body passed this
                        // agent's cap says so: a definite refusal the replica
                        // passes on (its own cap may be higher).
                        (InvokeOutcome::Failed(_), Some(stop)) => {
                            let limits = BodyLimits {
                                max_bytes: max_request_bytes,
                                ..BodyLimits::default()
                            };
                            (None, InvokeOutcome::Failed(stop.refusal(&limits)))
                        }
                        (outcome, _) => (head, outcome),
                    },
                    // Not asked: a forwarded invocation carries no token.
                    Answered::Unauthorized => (
                        None,
                        InvokeOutcome::Failed(InvokeError::InstanceFailed {
                            detail: "refused a token it was not asked to check".into(),
                        }),
                    ),
                };
                let (head, outcome) = match Back::of(head, outcome) {
                    Back::Whole(head, outcome) => (head, outcome),
                    Back::Chunked(head, body) => {
                        let sent = async {
                            stream_head(&mut send, id, head).await?;
                            stream_data(&mut send, id, &body).await?;
                            stream_end(&mut send, id, true).await
                        };
                        if let Err(e) = sent.await {
                            tracing::debug!("a chunked answer to the replica was cut: {e}");
                        }
                        return;
                    }
                };
                if let Some(head) = head {
                    let m = AgentMessageV1::InvokeHead {
                        id,
                        head,
                        streamed: false,
                    };
                    if write_frame_more(&mut send, &AgentMessage::v1(m))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                let reply =
                    AgentMessage::v1(AgentMessageV1::InvokeReply(InvokeReply { id, outcome }));
                let _ = write_frame(&mut send, &reply).await;
            };
            answered.await;
            delivered(send).await;
        });
    }
}

/// Keeps the connection of an answer's stream up until the replica has
/// all of the answer. After a move, the answers in flight on the old
/// connection hold its last handles, and dropping the last one closes a
/// connection at once, losing what it had not yet sent (the replica then
/// answered a call that had run `outcome_unknown`).
async fn delivered(mut send: quinn::SendStream) {
    // Already finished after a whole answer; a cut one may not be.
    let _ = send.finish();
    let _ = send.stopped().await;
}

/// Records in the usage journal not yet acknowledged (0 without metering).
async fn usage_pending(setup: &LinkSetup) -> u64 {
    let Some((journal, _)) = setup.usage.clone() else {
        return 0;
    };
    tokio::task::spawn_blocking(move || journal.pending() as u64)
        .await
        .unwrap_or(0)
}

/// What a replica answered a heartbeat.
enum Beat {
    Ack,
    /// Refused `cut_off`, with the replica's reason.
    CutOff(String),
}

/// Sends one heartbeat: the answer and the status's time (`None`: the
/// agent is gone).
async fn heartbeat(
    conn: &quinn::Connection,
    setup: &LinkSetup,
) -> Result<Option<(Beat, u64)>, SessionEnd> {
    let agent_id = setup.register.agent.clone();
    let Ok(mut s) = setup.agent.send(StatusQuery).await else {
        return Ok(None);
    };
    setup.meter.fill(&mut s.gpus);
    let at_ms = s.at_ms;
    let heartbeat = AgentMessage::v1(AgentMessageV1::Heartbeat(Heartbeat {
        agent: agent_id.clone(),
        at_ms,
        gpus: s.gpus,
        in_flight: s.in_flight,
        swaps: s.swap_ins + s.moves,
        counters: AgentCounters {
            process_starts: s.process_starts,
            process_crashes: s.process_crashes,
            process_restarts: s.process_restarts,
            process_failed_starts: s.process_failed_starts,
            process_running: s.process_running,
            usage_pending_records: usage_pending(setup).await,
            usage_withheld: s.usage_withheld,
        },
        instances: s.instances,
    }));
    let answer = match request(conn, heartbeat).await? {
        RegionMessage::V1(RegionMessageV1::Refused { code, message, .. })
            if code == gshare_core::protocol::CUT_OFF =>
        {
            Beat::CutOff(message)
        }
        RegionMessage::V1(RegionMessageV1::Refused { code, message, .. }) => {
            return Err(SessionEnd::Refused(format!("{code}: {message}")));
        }
        _ => Beat::Ack,
    };
    Ok(Some((answer, at_ms)))
}

/// Sends the reports that go with a heartbeat (loads, host copies, swaps:
/// a replica cut off from the leader still records them).
async fn reports(
    conn: &quinn::Connection,
    setup: &LinkSetup,
    reported: &mut Option<Vec<HostCopy>>,
    at_ms: u64,
) -> Result<(), SessionEnd> {
    let agent_id = setup.register.agent.clone();
    let (loads, dropped) = setup.agent.send(TakeLoads).await.unwrap_or_default();
    if dropped > 0 {
        tracing::debug!(dropped, "load report capped");
    }
    let loads = AgentMessage::v1(AgentMessageV1::Loads {
        agent: agent_id.clone(),
        at_ms,
        loads,
        dropped,
    });
    request(conn, loads).await?;
    if let Ok(copies) = setup.agent.send(HostCopiesQuery).await {
        if reported.as_ref() != Some(&copies) {
            let m = AgentMessage::v1(AgentMessageV1::HostCopies {
                agent: agent_id.clone(),
                copies: copies.clone(),
            });
            request(conn, m).await?;
            *reported = Some(copies);
        }
    }
    let events = setup.agent.send(TakeSwapEvents).await.unwrap_or_default();
    if !events.is_empty() {
        let swaps = AgentMessage::v1(AgentMessageV1::Swaps {
            agent: agent_id.clone(),
            events,
        });
        request(conn, swaps).await?;
    }
    Ok(())
}

/// Heartbeats the replica at `addr` every `setup.heartbeat`. While it
/// refuses them `cut_off`, a move attempt runs beside them (`move_from`);
/// once another replica took the agent's registration, one more heartbeat
/// confirms the replica is still cut off before the session ends
/// ([`SessionEnd::Moved`]): one that found a leader meanwhile keeps the
/// agent, and the new registration's connection is closed.
async fn heartbeats(
    conn: quinn::Connection,
    setup: &LinkSetup,
    addr: SocketAddr,
) -> Result<(), SessionEnd> {
    // The host copies last sent on this link (`None`: none yet, so the
    // first heartbeat of a link sends them, even when there are none).
    let mut reported: Option<Vec<HostCopy>> = None;
    // The last heartbeat was refused `cut_off` (read by the move attempt).
    let refused = Cell::new(false);
    type Move<'a> =
        std::pin::Pin<Box<dyn std::future::Future<Output = Option<(SocketAddr, Registered)>> + 'a>>;
    let mut moving: Option<Move<'_>> = None;
    // No other replica took the agent (said once until an Ack).
    let mut staying = false;
    let mut next = tokio::time::Instant::now() + setup.heartbeat;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            moved = async { moving.as_mut().expect("polled only while set").await },
                if moving.is_some() =>
            {
                moving = None;
                match moved {
                    Some((to, registered)) => {
                        // Only an Ack keeps the agent here: a lost or
                        // silent replica is no reason to drop a
                        // registration another one committed.
                        let confirm = heartbeat(&conn, setup);
                        match tokio::time::timeout(MOVE_TRY, confirm).await {
                            Ok(Ok(Some((Beat::Ack, _)))) => {
                                refused.set(false);
                                registered.conn.close(0u32.into(), b"not needed");
                                tracing::info!(replica = %addr, "the replica found a leader again: no move");
                            }
                            Ok(Ok(None)) => return Ok(()),
                            _ => return Err(SessionEnd::Moved(to, registered)),
                        }
                    }
                    None if refused.get() && !staying => {
                        staying = true;
                        tracing::warn!(
                            replica = %addr,
                            "the replica is cut off from the region's leader, and no other took the agent: staying"
                        );
                    }
                    None => {}
                }
                continue;
            }
        }
        next = tokio::time::Instant::now() + setup.heartbeat;
        let Some((answer, at_ms)) = heartbeat(&conn, setup).await? else {
            return Ok(());
        };
        reports(&conn, setup, &mut reported, at_ms).await?;
        match answer {
            Beat::Ack => {
                refused.set(false);
                staying = false;
            }
            Beat::CutOff(message) => {
                refused.set(true);
                if moving.is_none() {
                    tracing::debug!(replica = %addr, "heartbeat refused ({message}): looking for another replica");
                    moving = Some(Box::pin(move_from(setup, addr, &refused)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gshare_core::protocol::encode_frame;

    fn done(len: usize) -> InvokeOutcome {
        InvokeOutcome::Done {
            body: vec![7; len],
            queued_us: u64::MAX,
            service_us: u64::MAX,
        }
    }

    #[test]
    fn an_answer_goes_whole_while_it_fits_a_frame_and_in_chunks_beyond() {
        // The largest body sent whole, with the widest other fields, encodes.
        let head = ReplyHead {
            status: 201,
            headers: vec![("content-type".into(), b"text/plain".to_vec())],
        };
        let whole = Back::of(Some(head.clone()), done(MAX_WHOLE_BODY));
        assert_eq!(whole, Back::Whole(Some(head.clone()), done(MAX_WHOLE_BODY)));
        let reply = AgentMessage::v1(AgentMessageV1::InvokeReply(InvokeReply {
            id: u64::MAX,
            outcome: done(MAX_WHOLE_BODY),
        }));
        assert!(encode_frame(&reply).is_ok());
        // One byte more goes in chunks under the function's head (the
        // plain route's: 200, no headers), every chunk frame encodable.
        let big = MAX_WHOLE_BODY + 1;
        assert_eq!(
            Back::of(Some(head.clone()), done(big)),
            Back::Chunked(head, vec![7; big])
        );
        let Back::Chunked(plain, body) = Back::of(None, done(big)) else {
            panic!("a body over a frame must go in chunks");
        };
        assert_eq!(
            (plain.status, plain.headers.len(), body.len()),
            (200, 0, big)
        );
        let chunk = AgentMessage::v1(AgentMessageV1::InvokeChunk {
            id: u64::MAX,
            data: vec![7; STREAM_FRAME_DATA],
        });
        assert!(encode_frame(&chunk).is_ok());
        // A failure never carries the head.
        let failed = InvokeOutcome::Failed(InvokeError::FunctionCrashed { detail: "x".into() });
        assert_eq!(
            Back::of(
                Some(ReplyHead {
                    status: 200,
                    headers: vec![]
                }),
                failed.clone()
            ),
            Back::Whole(None, failed)
        );
    }
}
