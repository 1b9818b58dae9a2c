//! `POST /v1/invoke/{tenant}/{name}` on a replica: check the tenant's
//! token, find the nodes hosting the function, and forward over QUIC to a
//! hosting agent connected to this replica; if none is connected here,
//! ask the other replicas over HTTP (once: the hop is marked with
//! `X-Gshare-Forwarded`). The answer is the agent's (same statuses as its
//! ingress).
//!
//! A request for a function with no instance (or whose instance's agent,
//! linked here, has not been sent its assignment yet) is held while one is
//! placed: the first such request on this replica wakes the function
//! (`Evaluation::ScaleOut { desired: 1 }`, see [`super::wake`]), and every
//! held request polls the applied state until it can be forwarded, for at
//! most its deadline and [`MAX_HOLD`]; past that, `503 no_instance`
//! (retryable) and nothing ran.
//!
//! Every invocation runs under an idempotency key (the client's
//! `Idempotency-Key`, or one this replica assigns; every answer names it in
//! that header), which the agent keeps with the usage record that bills it.
//! A definite error means nothing ran and nothing was billed: a forward
//! that failed before the request left (no stream) moves on to the next
//! hosting agent, but one that lost its answer after sending re-asks the
//! same agent under the key (waiting while it still runs), and if that
//! agent cannot tell, answers `502 outcome_unknown` with `retryable` and the
//! key; a retry with the key gets the stored answer if it ran.
//!
//! A forward carries the tenant's token, so it goes over TLS when this
//! replica's API does (`[http_tls]`: the peers' certificates must chain to
//! its `ca_cert` and name their IP address; the replicas of a region serve
//! alike), and relays the peer's answer as it comes, both routes: its size
//! is bounded where the function's reply is read (the agent's runtime
//! template's `max_reply_bytes`), its time by the request's deadline.
//!
//! Every error is [`ApiError`]'s one shape; a peer's answer is passed on
//! with its `Content-Type`, `X-Gshare-Error` and timing headers. The token
//! is checked before the body is read (`413 body_too_large` beyond the
//! replica's `max_request_bytes`).

use super::forward::ForwardError;
use super::request_body::{send_body, BodyLimits, BodyStop, RequestBodySource, Upload, WHOLE_BODY};
use super::wake::Begin;
use crate::api::ApiError;
use crate::http::HttpContext;
use crate::scheduler::Evaluation;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::http_surface::{
    connection_names, function_target, outcome_answer, pass_through, passes_through, Direction,
    ForwardClaim, ForwardSecret, ERROR_HEADER, FORWARD_PROOF_HEADER,
};
use gshare_core::model::{NodeId, TenantId};
use gshare_core::net::http_client::{announced_len, next_data, read_whole, Incoming};
use gshare_core::net::{read_frame, write_frame, write_frame_more};
use gshare_core::protocol::{
    key_order, token_digest, AgentMessage, AgentMessageV1, HttpCall, InvokeError, InvokeOutcome,
    InvokeRequest, RegionMessage, RegionMessageV1, ReplyHead,
};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Longest wait for a peer replica's whole answer to a forward.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);

const FORWARDED: &str = "x-gshare-forwarded";
const DEADLINE: &str = "x-gshare-deadline-ms";
const KEY: &str = crate::api::idempotency::HEADER;
/// On a forward between replicas: the node whose agent is to run it.
const NODE: &str = "x-gshare-node";
/// On a forward between replicas: the key is one the first replica
/// assigned (new: the peer picks the node and pins the key to it).
const ASSIGNED: &str = "x-gshare-key-assigned";
/// How long a replica whose forward lost its answer keeps trying to reach
/// the agent again to ask what became of the key.
const RELEARN: Duration = Duration::from_secs(3);
/// Longest wait for an invocation still running when asked about its key.
const LOOKUP_WAIT: Duration = Duration::from_secs(60);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn error(status: StatusCode, code: &'static str, message: &str) -> HttpResponse {
    answer(ApiError::new(status, code, message))
}

fn answer(e: ApiError) -> HttpResponse {
    actix_web::ResponseError::error_response(&e)
}

fn outcome_unknown(key: &str, detail: &str) -> HttpResponse {
    answer(
        ApiError::outcome_unknown(format!(
            "the invocation may or may not have run ({detail}); retry with {KEY}: {key}"
        ))
        .with_key(key),
    )
}

/// The answer to an agent's outcome (core's [`outcome_answer`], the
/// agents' ingress too).
fn outcome_response(outcome: InvokeOutcome) -> HttpResponse {
    match outcome_answer(outcome) {
        Ok(a) => {
            let status = StatusCode::from_u16(a.status).unwrap_or(StatusCode::BAD_GATEWAY);
            let mut reply = HttpResponse::build(status);
            for h in a.headers {
                reply.append_header(h);
            }
            reply.body(a.body)
        }
        Err(e) => answer(ApiError::from_invoke(&e)),
    }
}

/// The start of a function's own answer on the transparent route: its
/// status and the headers that [`pass_through`].
fn function_head(head: &ReplyHead) -> actix_web::HttpResponseBuilder {
    let status = StatusCode::from_u16(head.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let all: Vec<(&str, &[u8])> = head
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    let mut reply = HttpResponse::build(status);
    for h in pass_through(&all, Direction::Reply) {
        reply.append_header(h);
    }
    reply
}

/// A peer replica's answer to a transparent call, for the client: its
/// status and headers but the hop-by-hop and framing ones (the peer's own
/// `X-Gshare-*` pass: it is a replica of this region, and it already kept
/// a function's from passing).
fn peer_head(head: &ReplyHead) -> actix_web::HttpResponseBuilder {
    let status = StatusCode::from_u16(head.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let connection = connection_names(
        head.headers
            .iter()
            .filter(|(k, _)| k == "connection")
            .map(|(_, v)| v.as_slice()),
    );
    let mut reply = HttpResponse::build(status);
    for (k, v) in &head.headers {
        if k.starts_with("x-gshare-") || passes_through(k, &connection, Direction::Reply) {
            reply.append_header((k.as_str(), v.as_slice()));
        }
    }
    reply
}

/// What an agent answered a forwarded invocation.
enum Reply {
    /// The whole answer: the function's status and headers when it is a
    /// transparent invocation's own run, and the outcome.
    Whole(Option<ReplyHead>, InvokeOutcome),
    /// A transparent reply that streams: the function's status and
    /// headers, and the stream its body comes on.
    Stream(ReplyHead, quinn::RecvStream),
}

impl Reply {
    /// `Whole(None, outcome)`: the agent's answer had no head.
    fn outcome(&self) -> Option<&InvokeOutcome> {
        match self {
            Reply::Whole(None, o) => Some(o),
            _ => None,
        }
    }

    /// The answer for the client; a streamed body is passed on as it comes
    /// for at most `limit` (the request's deadline, with room for the
    /// agent to cut it first).
    fn into_response(self, limit: Duration) -> HttpResponse {
        match self {
            Reply::Whole(
                Some(head),
                InvokeOutcome::Done {
                    body,
                    queued_us,
                    service_us,
                },
            ) => function_head(&head)
                .insert_header(("x-gshare-queued-us", queued_us.to_string()))
                .insert_header(("x-gshare-service-us", service_us.to_string()))
                .body(body),
            Reply::Whole(_, outcome) => outcome_response(outcome),
            Reply::Stream(head, recv) => {
                function_head(&head).body(RelayedBody::from_agent(recv, limit))
            }
        }
    }
}

/// How many chunks of a streamed reply a replica holds for a slow client
/// before it stops reading the agent's stream (QUIC's flow control then
/// holds the agent, which holds the function).
const RELAY_CHUNKS: usize = 16;
/// Beyond a streamed reply's deadline, how long a replica waits for the
/// agent to cut it before cutting it itself.
const RELAY_GRACE: Duration = Duration::from_secs(5);

/// A streamed reply's body relayed from the agent's QUIC stream: the
/// chunks as they come; ended by the agent's `InvokeStreamEnd { complete:
/// true }`, else cut (an error: the client's connection is closed without
/// the last chunk, so it sees an incomplete reply): the agent cut it
/// (deadline, crash, reply cap), the stream failed, or `limit` passed.
struct RelayedBody {
    chunks: tokio::sync::mpsc::Receiver<Result<web::Bytes, String>>,
    ended: bool,
    /// The body's length when the sender gave one (the client then gets a
    /// `Content-Length`, not a chunked reply).
    size: Option<u64>,
}

impl RelayedBody {
    /// Relays a reply a peer replica streams (its body as hyper reads it),
    /// for at most `limit`; `size` is its `Content-Length`, if it had one.
    fn from_peer(mut body: Incoming, size: Option<u64>, limit: Duration) -> Self {
        let (tx, chunks) = tokio::sync::mpsc::channel(RELAY_CHUNKS);
        tokio::spawn(async move {
            let relay = async {
                while let Some(data) = next_data(&mut body).await {
                    let data = data.map_err(|e| format!("the peer replica's reply failed: {e}"))?;
                    if tx.send(Ok(data)).await.is_err() {
                        return Ok(());
                    }
                }
                Ok(())
            };
            Self::ended(&tx, tokio::time::timeout(limit, relay).await).await;
        });
        Self {
            chunks,
            ended: false,
            size,
        }
    }

    /// Passes on how a relay ended: a cut becomes the body's error.
    async fn ended(
        tx: &tokio::sync::mpsc::Sender<Result<web::Bytes, String>>,
        end: Result<Result<(), String>, tokio::time::error::Elapsed>,
    ) {
        let end = match end {
            Ok(end) => end,
            Err(_) => Err("the reply ran past its deadline".to_string()),
        };
        if let Err(why) = end {
            tracing::debug!("a relayed reply was cut: {why}");
            let _ = tx.send(Err(why)).await;
        }
    }

    /// Relays a reply an agent streams on a forward's QUIC stream, for at
    /// most `limit`.
    fn from_agent(mut recv: quinn::RecvStream, limit: Duration) -> Self {
        let (tx, chunks) = tokio::sync::mpsc::channel(RELAY_CHUNKS);
        tokio::spawn(async move {
            let relay = async {
                loop {
                    match read_frame::<AgentMessage>(&mut recv).await {
                        Ok(AgentMessage::V1(AgentMessageV1::InvokeChunk { data, .. })) => {
                            if tx.send(Ok(web::Bytes::from(data))).await.is_err() {
                                // The client left: dropping the stream stops the agent's.
                                return Ok(());
                            }
                        }
                        Ok(AgentMessage::V1(AgentMessageV1::InvokeStreamEnd {
                            complete: true,
                            ..
                        })) => return Ok(()),
                        Ok(AgentMessage::V1(AgentMessageV1::InvokeStreamEnd { .. })) => {
                            return Err("the agent cut the function's reply \
                                        (deadline, crash or reply cap)"
                                .to_string())
                        }
                        Ok(other) => return Err(format!("unexpected frame {other:?}")),
                        Err(e) => return Err(format!("the agent's stream failed: {e}")),
                    }
                }
            };
            Self::ended(&tx, tokio::time::timeout(limit, relay).await).await;
        });
        Self {
            chunks,
            ended: false,
            size: None,
        }
    }
}

impl actix_web::body::MessageBody for RelayedBody {
    type Error = std::io::Error;

    fn size(&self) -> actix_web::body::BodySize {
        match self.size {
            Some(n) => actix_web::body::BodySize::Sized(n),
            None => actix_web::body::BodySize::Stream,
        }
    }

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<web::Bytes, Self::Error>>> {
        use std::task::Poll;
        if self.ended {
            return Poll::Ready(None);
        }
        match self.chunks.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(b))) => Poll::Ready(Some(Ok(b))),
            Poll::Ready(Some(Err(why))) => {
                self.ended = true;
                Poll::Ready(Some(Err(std::io::Error::other(why))))
            }
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(None)
            }
        }
    }
}

/// Why a forward to an agent got no answer.
enum Lost {
    /// No stream could be opened: the request never left.
    NotSent(String),
    /// The request may have reached the agent.
    AfterSend(String),
}

/// The agent's next frame on a forward's stream.
async fn next_frame(recv: &mut quinn::RecvStream) -> Result<AgentMessage, Lost> {
    read_frame::<AgentMessage>(recv)
        .await
        .map_err(|e| Lost::AfterSend(e.to_string()))
}

/// Sends `req` under `key` to the agent on `conn` (`http`: a transparent
/// invocation's request) and reads its answer: the outcome, or the
/// function's head and then its outcome or its streamed body.
async fn forward_quic(
    conn: &quinn::Connection,
    mut req: InvokeRequest,
    key: &str,
    http: Option<&HttpCall>,
    open_within: Duration,
    body: &RequestBodySource,
) -> Result<Reply, Lost> {
    // Every stream the agent allows busy (long streamed replies): nothing
    // was sent, so giving up at the deadline is safe.
    let (mut send, mut recv) = match tokio::time::timeout(open_within, conn.open_bi()).await {
        Ok(opened) => opened.map_err(|e| Lost::NotSent(e.to_string()))?,
        Err(_) => {
            return Err(Lost::NotSent(
                "no stream to the agent opened within the deadline".into(),
            ))
        }
    };
    let key = key.to_string();
    let lost = |e: String| Lost::AfterSend(e);
    match body.bytes() {
        Some(whole) => {
            req.body = whole.to_vec();
            let msg = match http {
                None => RegionMessageV1::InvokeKeyed { key, request: req },
                Some(call) => RegionMessageV1::InvokeHttp {
                    key,
                    request: req,
                    call: call.clone(),
                },
            };
            write_frame(&mut send, &RegionMessage::v1(msg))
                .await
                .map_err(|e| lost(e.to_string()))?;
        }
        None => {
            // The body follows the request on the same stream, as it comes.
            let Some(streamed) = body.take() else {
                return Err(Lost::NotSent(
                    "the streamed request body already left".into(),
                ));
            };
            let id = req.id;
            let msg = RegionMessageV1::InvokeStreamed {
                key,
                len: streamed.known_len(),
                request: req,
                call: http.cloned(),
            };
            write_frame_more(&mut send, &RegionMessage::v1(msg))
                .await
                .map_err(|e| lost(e.to_string()))?;
            tokio::spawn(send_body(send, id, streamed));
        }
    }
    match next_frame(&mut recv).await? {
        AgentMessage::V1(AgentMessageV1::InvokeReply(r)) => Ok(Reply::Whole(None, r.outcome)),
        AgentMessage::V1(AgentMessageV1::InvokeHead {
            head,
            streamed: false,
            ..
        }) => match next_frame(&mut recv).await? {
            AgentMessage::V1(AgentMessageV1::InvokeReply(r)) => {
                Ok(Reply::Whole(Some(head), r.outcome))
            }
            other => Err(lost(format!("unexpected answer {other:?}"))),
        },
        AgentMessage::V1(AgentMessageV1::InvokeHead {
            head,
            streamed: true,
            ..
        }) => Ok(Reply::Stream(head, recv)),
        other => Err(lost(format!("unexpected answer {other:?}"))),
    }
}

/// Asks `node`'s agent what became of `tenant`'s invocation under `key`,
/// reconnecting for up to [`RELEARN`]; `None` when that cannot be learned.
async fn relearn(
    ctx: &HttpContext,
    node: &NodeId,
    tenant: &TenantId,
    key: &str,
) -> Option<InvokeOutcome> {
    let until = tokio::time::Instant::now() + RELEARN;
    loop {
        if let Some(conn) = ctx.replica.agents.link(node) {
            let ask = async {
                let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
                let msg = RegionMessageV1::InvokeLookup {
                    id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                    tenant: tenant.clone(),
                    key: key.to_string(),
                };
                write_frame(&mut send, &RegionMessage::v1(msg))
                    .await
                    .map_err(|e| e.to_string())?;
                match read_frame::<AgentMessage>(&mut recv)
                    .await
                    .map_err(|e| e.to_string())?
                {
                    AgentMessage::V1(AgentMessageV1::InvokeLookupReply { outcome, .. }) => {
                        Ok(outcome)
                    }
                    other => Err(format!("unexpected answer {other:?}")),
                }
            };
            match tokio::time::timeout(LOOKUP_WAIT, ask).await {
                // The agent answered: it knows the outcome, or nothing of the key.
                Ok(Ok(outcome)) => return outcome,
                Ok(Err(e)) => tracing::debug!(node = %node.0, "asking about {key}: {e}"),
                Err(_) => return None,
            }
        }
        if tokio::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What a forward to a peer replica gave.
enum Forwarded {
    /// Its answer: status and headers, the body as it comes.
    Streaming(ReplyHead, Incoming),
    /// Nothing was sent: the peer could not be reached.
    NotSent,
    /// Sent, but no usable answer came back (it may have run): why.
    Lost(String),
}

/// Where a forward to a peer replica asks it to send the invocation.
struct Pin<'a> {
    /// The one node whose agent is to run it (`None`: an assigned key,
    /// whose node the peer picks).
    node: Option<&'a str>,
    /// The idempotency key it runs under.
    key: &'a str,
    /// The request's deadline left, ms, if it has one.
    deadline: Option<&'a str>,
    /// How long the peer's answer (or a streamed one's start) may take.
    within: Duration,
    /// The key the forward is proven with ([`FORWARD_PROOF_HEADER`]).
    secret: &'a ForwardSecret,
    /// The digest of the caller's token (part of the proof).
    token_digest: &'a str,
}

/// One HTTP/1.1 request to a peer replica on the pooled client
/// ([`super::forward`]: over TLS when `tls` is set), under the
/// invocation's idempotency key, for one node's agent: a POST of the plain
/// route, or (`http`) the transparent call; its answer's start read within
/// `within` (at least [`FORWARD_TIMEOUT`], the request's deadline and
/// [`RELAY_GRACE`] when longer) and its body left to stream.
async fn forward_http(
    addr: &str,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    path: &str,
    auth: &str,
    to: &Pin<'_>,
    body: &RequestBodySource,
    http: Option<&HttpCall>,
) -> Forwarded {
    let within = to.within;
    let (method, path) = match http {
        None => ("POST", path.to_string()),
        Some(call) => (call.method.as_str(), format!("{path}{}", call.target)),
    };
    let mut headers: Vec<(&str, &[u8])> = http
        .map(|c| {
            c.headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .collect()
        })
        .unwrap_or_default();
    headers.extend([
        ("authorization", auth.as_bytes()),
        (FORWARDED, b"1"),
        (KEY, to.key.as_bytes()),
    ]);
    match to.node {
        Some(n) => headers.push((NODE, n.as_bytes())),
        None => headers.push((ASSIGNED, b"1")),
    }
    if let Some(d) = to.deadline {
        headers.push((DEADLINE, d.as_bytes()));
    }
    let proof = to.secret.prove(&ForwardClaim {
        method,
        target: &path,
        token_digest: to.token_digest,
        key: to.key,
        node: to.node,
        deadline: to.deadline,
    });
    headers.push((FORWARD_PROOF_HEADER, proof.as_bytes()));
    let Some(sent) = body.take() else {
        return Forwarded::NotSent;
    };
    // A streamed body comes back when the request never left.
    let (sent, mut back) = sent.returnable();
    let answer = super::forward::open(addr, tls, method, &path, &headers, sent);
    match tokio::time::timeout(within, answer).await {
        Ok(Ok((head, reply))) => Forwarded::Streaming(head, reply),
        Ok(Err(e @ ForwardError::NotSent { .. })) => {
            tracing::warn!("forward: {e}");
            if let Ok(unsent) = back.try_recv() {
                body.give_back(unsent);
            }
            Forwarded::NotSent
        }
        Ok(Err(e @ ForwardError::Lost { .. })) => {
            tracing::warn!("forward lost its answer: {e}");
            Forwarded::Lost(e.to_string())
        }
        Err(_) => {
            tracing::warn!("forward to replica {addr}: no answer within {within:?}");
            Forwarded::Lost(format!("no answer within {} s", within.as_secs()))
        }
    }
}

/// The order in which an invocation tries the nodes holding the
/// function's instances: first the nodes whose agent (linked here) reports
/// one of them resident, then the rest (still loading, or their agent is
/// linked to another replica), each group round-robin from `start`. So
/// while a reshaping update's new instance loads, calls go to the old one.
fn preferred_order(
    nodes: BTreeSet<NodeId>,
    resident: &BTreeSet<String>,
    start: usize,
) -> Vec<NodeId> {
    let (mut warm, mut rest): (Vec<NodeId>, Vec<NodeId>) =
        nodes.into_iter().partition(|n| resident.contains(&n.0));
    for group in [&mut warm, &mut rest] {
        if !group.is_empty() {
            let k = start % group.len();
            group.rotate_left(k);
        }
    }
    warm.extend(rest);
    warm
}

/// Longest a request is held while its function is woken from zero,
/// whatever its deadline (a cold start on the simulated GPUs takes 1–3 s).
pub const MAX_HOLD: Duration = Duration::from_secs(30);
/// How long a request that found no hosting agent reachable waits before
/// it looks again (while its deadline allows).
const NO_AGENT_RETRY: Duration = Duration::from_millis(200);
/// How often a held request looks at the replicated state again.
const HOLD_POLL: Duration = Duration::from_millis(20);

/// Where an invocation can go now, read from the applied state.
struct Route {
    /// The nodes holding the function's instances, in the order tried.
    nodes: Vec<NodeId>,
    /// The function's own deadline.
    function_deadline_ms: u64,
    /// Whether to forward now: some instance's node has its agent linked
    /// here and that agent was sent the assignment with it, or no node's
    /// agent is linked here (the peers holding those links hold in turn).
    ready: bool,
}

/// `None`: the function is unknown.
fn route(ctx: &HttpContext, tenant: &TenantId, name: &str, start: usize) -> Option<Route> {
    let st = ctx.replica.state.read();
    let d = st.region.domain();
    let f = d.function(tenant, name).ok()?;
    let mut ids = Vec::new();
    let mut nodes: BTreeSet<NodeId> = BTreeSet::new();
    for i in d.instances_of(tenant, name) {
        ids.push(i.id);
        nodes.extend(i.slices.iter().map(|s| s.gpu.node.clone()));
    }
    let hub = &ctx.replica.agents;
    let mut linked_here = false;
    let mut delivered = false;
    for n in &nodes {
        if let Some(sent) = hub.delivered_to(n) {
            linked_here = true;
            delivered |= sent.iter().any(|i| ids.contains(i));
        }
    }
    Some(Route {
        ready: !nodes.is_empty() && (delivered || !linked_here),
        nodes: preferred_order(nodes, &hub.reports.resident_nodes(&ids), start),
        function_deadline_ms: f.spec.deadline_ms,
    })
}

/// Holds an invocation until its function has an instance whose agent
/// can take it: a function with none is woken (one
/// `Evaluation::ScaleOut { desired: 1 }` per function at a time on this
/// replica, see [`super::wake`]; not by a request a peer forwarded here,
/// whose first replica woke it already). Bounded by the request's deadline
/// (else the function's) and [`MAX_HOLD`]. Gives the nodes to try, the
/// function's deadline and the request's deadline left after the hold
/// (`None`: no hold and none given); `Err`: the answer (nothing ran).
async fn hold(
    ctx: &HttpContext,
    tenant: &TenantId,
    name: &str,
    start: usize,
    deadline_ms: Option<u64>,
    forwarded: bool,
) -> Result<(Vec<NodeId>, u64, Option<u64>), HttpResponse> {
    let arrived = tokio::time::Instant::now();
    let hub = &ctx.replica.agents;
    let mut waited = false;
    loop {
        let Some(r) = route(ctx, tenant, name, start) else {
            return Err(error(
                StatusCode::NOT_FOUND,
                "unknown_function",
                "unknown function",
            ));
        };
        let budget = Duration::from_millis(deadline_ms.unwrap_or(r.function_deadline_ms));
        let bound = budget.min(MAX_HOLD);
        let held = arrived.elapsed();
        let left_ms = u64::try_from(budget.saturating_sub(held).as_millis()).unwrap_or(u64::MAX);
        if r.ready && !waited {
            return Ok((r.nodes, r.function_deadline_ms, deadline_ms));
        }
        if r.ready && left_ms > 0 {
            return Ok((r.nodes, r.function_deadline_ms, Some(left_ms)));
        }
        if r.nodes.is_empty() && !forwarded {
            match hub.wakes.begin(tenant, name, std::time::Instant::now()) {
                Begin::Start => {
                    let (scheduler, wakes) = (ctx.replica.scheduler.clone(), hub.wakes.clone());
                    let (tenant, function) = (tenant.clone(), name.to_string());
                    tokio::spawn(async move {
                        let eval = Evaluation::ScaleOut {
                            tenant: tenant.clone(),
                            function: function.clone(),
                            desired: 1,
                        };
                        let result = scheduler.submit(eval).await;
                        tracing::info!("waking {}/{function} from zero: {result:?}", tenant.0);
                        wakes.ended(&tenant, &function, &result, std::time::Instant::now());
                    });
                }
                Begin::InFlight => {}
                Begin::Failed(why) => {
                    return Err(no_instance(&format!(
                        "the function has no instance and none could be placed: {why}; nothing ran"
                    )))
                }
            }
        }
        if held >= bound {
            if !r.nodes.is_empty() && left_ms > 0 {
                // Past the cap, within the deadline: try the instance's agent
                // (it may answer that it does not host it yet).
                return Ok((r.nodes, r.function_deadline_ms, Some(left_ms)));
            }
            return Err(no_instance(&format!(
                "the function has no instance ready within the deadline (held {} ms); nothing ran",
                held.as_millis()
            )));
        }
        tokio::time::sleep(HOLD_POLL.min(bound.saturating_sub(held))).await;
        waited = true;
    }
}

/// The answer when a streamed request body already left for a node that
/// did not run the invocation: it cannot be sent twice.
fn body_left() -> HttpResponse {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "body_not_resent",
        "the request body streamed and part of it had already left for a node that did not \
         run the invocation (its function is moving); a body cannot be sent twice, so no other \
         node was tried; nothing ran",
    )
}

/// `reply`, unless it is an error and `body` was cut: then why (`413
/// body_too_large` over the cap, saying how much had been passed on, `408
/// body_timeout` when it paused past the idle timeout, or `400
/// bad_request` when the client's body broke off).
fn body_cut(reply: HttpResponse, upload: Upload, limits: &BodyLimits) -> HttpResponse {
    // Only gshare's own definite refusals: a function's own answer passes
    // as it is, and an unknown outcome stays unknown (the client retries
    // with its key).
    let definite = reply.status().as_u16() >= 400
        && reply
            .headers()
            .get("x-gshare-error")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|code| code != "outcome_unknown");
    if !definite {
        return reply;
    }
    match upload {
        Upload::Stopped(stop) => refused(stop, limits),
        Upload::Reading | Upload::Whole => reply,
    }
}

/// The answer to a request whose body stopped so (core's
/// [`BodyStop::refusal`], the agent's ingress too), closing the
/// connection: the rest of the client's body was not read, so its framing
/// is lost (actix still discards the rest of a chunked one as it comes).
fn refused(stop: BodyStop, limits: &BodyLimits) -> HttpResponse {
    let mut r = answer(ApiError::from_invoke(&stop.refusal(limits)));
    r.head_mut()
        .set_connection_type(actix_web::http::ConnectionType::Close);
    r
}

fn no_instance(message: &str) -> HttpResponse {
    answer(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "no_instance",
        message,
    ))
}

/// The invocation's idempotency key.
enum Key {
    /// The client's `Idempotency-Key` (or the one a peer replica
    /// forwarded): sent as it is, to the node [`key_order`] ranks first.
    Given(String),
    /// Assigned here (`r<replica>-<secret>`): sent to a node as
    /// `<key>@<node>`, so that a retry under the key this answer names goes
    /// to the node that keeps its outcome.
    Assigned(String),
}

impl Key {
    /// The key sent to `node`'s agent.
    fn for_node(&self, node: &NodeId) -> String {
        match self {
            Key::Given(k) => k.clone(),
            Key::Assigned(base) => {
                let pinned = format!("{base}@{}", node.0);
                if gshare_core::state::is_valid_key(&pinned) {
                    pinned
                } else {
                    base.clone()
                }
            }
        }
    }

    /// The key named by an answer that sent nothing to any agent.
    fn base(&self) -> &str {
        match self {
            Key::Given(k) | Key::Assigned(k) => k,
        }
    }
}

/// What asking one node's agent (directly, or through a peer replica
/// linked to it) gave.
enum Step {
    /// An answer for the client (from the agent, or an unknown outcome).
    Done(HttpResponse),
    /// The agent answered that it does not host the function, and knew
    /// nothing of the key: nothing ran there.
    NotHosted,
    /// The agent could not be reached: nothing was sent to it.
    Unreachable,
}

/// Everything a forward needs besides the node.
struct Call<'a> {
    ctx: &'a HttpContext,
    tenant: &'a TenantId,
    name: &'a str,
    body: &'a RequestBodySource,
    auth: &'a str,
    /// The digest of the caller's token.
    token_digest: &'a str,
    /// The request's deadline left, ms (`None`: the function's).
    deadline_ms: Option<u64>,
    function_deadline_ms: u64,
    /// A peer forwarded it here: ask only agents linked here.
    forwarded: bool,
    /// The transparent route's request (method, path, query, headers).
    http: Option<&'a HttpCall>,
}

/// Sends the invocation to `node`'s agent under `key`: over its QUIC link
/// when it is linked here, else (on the first replica only) through each
/// peer replica in turn, pinned to that node (`X-Gshare-Node`).
async fn ask_node(call: &Call<'_>, node: &NodeId, key: &str, pinned: bool) -> Step {
    let hub = &call.ctx.replica.agents;
    if call.body.left() {
        return Step::Done(body_left());
    }
    let Some(conn) = hub.link(node) else {
        if call.forwarded || !pinned {
            return Step::Unreachable;
        }
        return via_peers(call, Some(node), key).await;
    };
    let request = InvokeRequest {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        tenant: call.tenant.clone(),
        function: call.name.to_string(),
        deadline_ms: call.deadline_ms,
        body: Vec::new(),
    };
    let sent = std::time::Instant::now();
    let deadline_ms = call.deadline_ms.unwrap_or(call.function_deadline_ms);
    let deadline = Duration::from_millis(deadline_ms);
    match forward_quic(&conn, request, key, call.http, deadline, call.body).await {
        // The agent no longer (or not yet) hosts it, and ran nothing under
        // the key (it looks the key up first): an instance just released or
        // just placed (a roll, a drain or a migration moved it).
        Ok(reply)
            if reply.outcome() == Some(&InvokeOutcome::Failed(InvokeError::UnknownFunction)) =>
        {
            tracing::debug!(node = %node.0, "the agent does not host {}/{}", call.tenant.0, call.name);
            Step::NotHosted
        }
        Ok(reply) => {
            // A streamed reply counts as answered when its head arrived.
            let streamed = InvokeOutcome::Done {
                body: Vec::new(),
                queued_us: 0,
                service_us: 0,
            };
            let outcome = match &reply {
                Reply::Whole(_, o) => o,
                Reply::Stream(..) => &streamed,
            };
            let (tenant, elapsed) = (&call.tenant.0, sent.elapsed());
            hub.activity
                .invoked(tenant, call.name, deadline_ms, elapsed, outcome);
            // The relay's bound counts from when the request left, not
            // from the reply's start.
            let limit = deadline
                .saturating_add(RELAY_GRACE)
                .saturating_sub(sent.elapsed());
            Step::Done(reply.into_response(limit))
        }
        Err(Lost::NotSent(e)) => {
            tracing::warn!(node = %node.0, "forwarding to agent failed: {e}");
            Step::Unreachable
        }
        Err(Lost::AfterSend(e)) => {
            tracing::warn!(node = %node.0, "forward to agent lost its answer: {e}");
            Step::Done(match relearn(call.ctx, node, call.tenant, key).await {
                Some(outcome) => outcome_response(outcome),
                None => outcome_unknown(key, &e),
            })
        }
    }
}

/// Asks the peer replicas, one after the other, to send the invocation to
/// `node`'s agent (`None`: an assigned key, to the node each peer picks
/// among the agents linked to it, resident copies first: it knows their
/// residency, this replica does not): the first that can answers; a peer
/// that cannot (`503 no_agent`, `503 no_instance`) or cannot be reached
/// passes it on.
async fn via_peers(call: &Call<'_>, node: Option<&NodeId>, key: &str) -> Step {
    let ctx = call.ctx;
    let peers: Vec<String> = {
        let m = ctx.replica.raft.metrics().borrow().clone();
        m.membership_config
            .membership()
            .nodes()
            .filter(|(id, _)| **id != ctx.replica.id)
            .map(|(_, n)| n.http_addr.clone())
            .collect()
    };
    let path = format!("/v1/invoke/{}/{}", call.tenant.0, call.name);
    let deadline = call.deadline_ms.map(|ms| ms.to_string());
    let secret = ForwardSecret::derive(&ctx.operator_token);
    for peer in peers {
        if call.body.left() {
            return Step::Done(body_left());
        }
        let tls = ctx.forward_tls.clone();
        // A whole answer (or a streamed one's start) may take the
        // function's whole deadline; the relay after it counts from here.
        let asked = std::time::Instant::now();
        let left = Duration::from_millis(call.deadline_ms.unwrap_or(call.function_deadline_ms));
        let to = Pin {
            node: node.map(|n| n.0.as_str()),
            key,
            deadline: deadline.as_deref(),
            within: FORWARD_TIMEOUT.max(left.saturating_add(RELAY_GRACE)),
            secret: &secret,
            token_digest: call.token_digest,
        };
        let sent = forward_http(&peer, tls, &path, call.auth, &to, call.body, call.http);
        match sent.await {
            Forwarded::Streaming(head, body) => {
                let code = head
                    .headers
                    .iter()
                    .find(|(k, _)| k == ERROR_HEADER)
                    .map(|(_, v)| v.as_slice());
                match (head.status, code) {
                    (404, Some(b"unknown_function")) => return Step::NotHosted,
                    // An older peer without the transparent route: nothing ran there.
                    (404, Some(b"unknown_route")) => continue,
                    (503, Some(b"no_agent" | b"no_instance")) => continue,
                    _ => {}
                }
                let limit = left
                    .saturating_add(RELAY_GRACE)
                    .saturating_sub(asked.elapsed());
                let size = head
                    .headers
                    .iter()
                    .find(|(k, _)| k == "content-length")
                    .and_then(|(_, v)| std::str::from_utf8(v).ok()?.trim().parse().ok());
                let body = RelayedBody::from_peer(body, size, limit);
                return Step::Done(peer_head(&head).body(body));
            }
            Forwarded::NotSent => {}
            // The peer may have run it: asking another peer could run it twice.
            Forwarded::Lost(why) => {
                return Step::Done(outcome_unknown(key, &format!("replica {peer}: {why}")))
            }
        }
    }
    Step::Unreachable
}

/// Whether the request is a forward from a peer replica: it carries the
/// forward headers ([`FORWARDED`], [`NODE`] or [`ASSIGNED`], and the key)
/// with a [`FORWARD_PROOF_HEADER`] that verifies under the region's
/// forward secret (derived from the operator token, the same on every
/// replica) for this request line, caller's token, key, node and
/// deadline. Without a proof the forward headers are ignored: the call is
/// a new one (a client's, or a forward from a replica older than the
/// proof, which then works as a first hop during an upgrade), so a client
/// cannot have its key treated as one a replica assigned or pick the
/// node. A proof that does not verify, or comes with incomplete forward
/// headers, is refused (`403 forged_forward`, nothing ran): a region whose
/// replicas do not share the operator token says so at once.
fn proven_forward(
    req: &HttpRequest,
    ctx: &HttpContext,
    token_digest: &str,
    key: Option<&str>,
) -> Result<bool, ApiError> {
    let h = req.headers();
    let Some(proof) = h.get(FORWARD_PROOF_HEADER) else {
        return Ok(false);
    };
    let forged = |why: &str| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "forged_forward",
            format!(
                "X-Gshare-Forward-Proof is set by the region's replicas only \
                 (a region's replicas must share the operator token): {why}"
            ),
        )
    };
    let text = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
    let Some(key) = key else {
        return Err(forged("a forward names its Idempotency-Key"));
    };
    let node = text(NODE);
    if !h.contains_key(FORWARDED) || node.is_some() == h.contains_key(ASSIGNED) {
        return Err(forged("the forward headers are incomplete"));
    }
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or_else(|| req.uri().path());
    let claim = ForwardClaim {
        method: req.method().as_str(),
        target,
        token_digest,
        key,
        node,
        deadline: text(DEADLINE),
    };
    if ForwardSecret::derive(&ctx.operator_token).verify(&claim, proof.as_bytes()) {
        Ok(true)
    } else {
        Err(forged("the forward proof does not verify"))
    }
}

/// `POST /v1/invoke/{tenant}/{name}`: the body to the function's invoke
/// path, its 2xx body back.
pub async fn invoke_route(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
    ctx: web::Data<HttpContext>,
) -> HttpResponse {
    let (tenant, name) = path.into_inner();
    invoke(req, tenant, name, payload, ctx, None).await
}

/// `/v1/invoke/{tenant}/{name}/{*path}`, any method: the request passed
/// on to the function (method, `/{path}`, query, the headers that
/// [`pass_through`], body) and its reply back as it is (status, headers,
/// body; a body without a length streams as it comes).
pub async fn invoke_transparent_route(
    req: HttpRequest,
    path: web::Path<(String, String, String)>,
    payload: web::Payload,
    ctx: web::Data<HttpContext>,
) -> HttpResponse {
    let (tenant, name, _) = path.into_inner();
    let all: Vec<(&str, &[u8])> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_bytes()))
        .collect();
    let call = HttpCall {
        method: req.method().as_str().to_string(),
        target: function_target(req.uri().path(), req.uri().query()),
        headers: pass_through(&all, Direction::Request),
    };
    invoke(req, tenant, name, payload, ctx, Some(call)).await
}

/// Checks the token and headers, reads the body, and runs the invocation
/// on an agent hosting the function (`http`: the transparent route's request).
async fn invoke(
    req: HttpRequest,
    tenant: String,
    name: String,
    payload: web::Payload,
    ctx: web::Data<HttpContext>,
    http: Option<HttpCall>,
) -> HttpResponse {
    let tenant = TenantId(tenant);
    let token = match crate::api::auth::bearer(&req) {
        Ok(t) => t.to_string(),
        Err(e) => return answer(e),
    };
    let digest = token_digest(&token);
    let auth = format!("Bearer {token}");
    // As every route: a token issued a moment ago and not applied here yet
    // is checked against the leader's commit index before a definite 401
    // (the agent's replica, or a peer the call is forwarded to, may lag).
    let owned = match crate::api::auth::caller(&req, &ctx).await {
        Ok(crate::api::auth::Caller::Tenant(t)) => t == tenant,
        Ok(crate::api::auth::Caller::Operator) => false,
        Err(e) => return answer(e),
    };
    if !owned {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "token not valid for this tenant",
        );
    }
    let deadline = req
        .headers()
        .get(DEADLINE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let deadline_ms = match &deadline {
        None => None,
        Some(d) => match gshare_core::http_surface::deadline_ms(d) {
            Some(ms) => Some(ms),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "bad_deadline",
                    gshare_core::http_surface::BAD_DEADLINE,
                )
            }
        },
    };
    let given = match req.headers().get(KEY) {
        None => None,
        Some(v) => match v
            .to_str()
            .ok()
            .filter(|k| gshare_core::state::is_valid_key(k))
        {
            Some(k) => Some(k.to_string()),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_idempotency_key",
                    "Idempotency-Key must be 1 to 128 printable ASCII characters",
                )
            }
        },
    };
    let forwarded = match proven_forward(&req, &ctx, &digest, given.as_deref()) {
        Ok(f) => f,
        Err(e) => return answer(e),
    };
    let key = match given {
        // A key the first replica assigned: new, so the node is this
        // replica's pick (honoured on a forward only).
        Some(k) if forwarded && req.headers().contains_key(ASSIGNED) => Key::Assigned(k),
        Some(k) => Key::Given(k),
        None => match crate::api::auth::new_secret() {
            Ok(secret) => Key::Assigned(format!("r{}-{}", ctx.replica.id, &secret[4..36])),
            Err(e) => {
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    &e.to_string(),
                )
            }
        },
    };
    let keyed = |mut r: HttpResponse, key: &str| {
        if let Ok(v) = actix_web::http::header::HeaderValue::from_str(key) {
            r.headers_mut()
                .insert(actix_web::http::header::HeaderName::from_static(KEY), v);
        }
        r
    };
    // A small body announced by its length is read whole (it can go to
    // another node after a try that ran nothing); any other streams to
    // the agent as it arrives, counted against `max_request_bytes`.
    let limits = ctx.body_limits;
    let len = announced_len(
        req.headers()
            .get("content-length")
            .map(|v| v.to_str().unwrap_or("")),
        req.headers().contains_key("transfer-encoding"),
        req.version() < actix_web::http::Version::HTTP_2,
    );
    let body = match len {
        Some(n) if usize::try_from(n).map_or(true, |n| n > limits.max_bytes) => {
            return refused(BodyStop::OverCap { passed: 0 }, &limits);
        }
        Some(n) if n <= WHOLE_BODY as u64 => match read_whole(payload, limits).await {
            Ok(b) => RequestBodySource::whole(b),
            Err(stop) => return refused(stop, &limits),
        },
        _ => RequestBodySource::streamed(payload, len, limits),
    };
    // Every answer: a call aborted because its streamed body was cut says why.
    let keyed = |r: HttpResponse, key: &str| keyed(body_cut(r, body.upload(), &limits), key);
    let start = NEXT_ID.fetch_add(1, Ordering::Relaxed) as usize;
    // The node a peer replica asks this one to send it to (and no other);
    // honoured on a forward only.
    let pin = req
        .headers()
        .get(NODE)
        .filter(|_| forwarded)
        .and_then(|v| v.to_str().ok())
        .map(|n| NodeId(n.to_string()));
    let arrived = tokio::time::Instant::now();
    // The request's deadline (then what is left of it, on a second try).
    let original_ms = deadline_ms;
    let mut asked_ms = deadline_ms;
    loop {
        let (nodes, function_deadline_ms, deadline_ms) =
            match hold(&ctx, &tenant, &name, start, asked_ms, forwarded).await {
                Ok(route) => route,
                Err(reply) => return keyed(reply, key.base()),
            };
        let call = Call {
            ctx: &ctx,
            tenant: &tenant,
            name: &name,
            body: &body,
            auth: &auth,
            token_digest: &digest,
            deadline_ms,
            function_deadline_ms,
            forwarded,
            http: http.as_ref(),
        };
        // The order the nodes are asked in. A key the client gave goes to
        // the node its rank puts first and nowhere else while the state
        // places the function there (that agent may hold the key's outcome
        // from an earlier try): an agent that cannot be reached, or that
        // answers it does not host the function yet (its assignment not
        // delivered after a scale-out) or any more (a release not applied
        // here yet), is waited for within the deadline, never passed over
        // for the next node. A key assigned here is new: any node will do,
        // the preferred first. A pin from a peer names one of the
        // function's nodes, else none.
        let strict = matches!(key, Key::Given(_));
        let order = |nodes: Vec<NodeId>| match (&key, &pin) {
            (_, Some(p)) => nodes.into_iter().filter(|n| n == p).take(1).collect(),
            (Key::Given(k), None) => key_order(k, nodes),
            (Key::Assigned(_), None) => nodes,
        };
        let mut nodes = order(nodes);
        // Nodes already asked; a second round asks the ones a fresh route adds.
        let mut tried: BTreeSet<NodeId> = BTreeSet::new();
        let mut unreachable: Option<NodeId> = None;
        let mut unhosted: Option<NodeId> = None;
        'rounds: for _ in 0..2 {
            for node in &nodes {
                if !tried.insert(node.clone()) {
                    continue;
                }
                let sent_key = key.for_node(node);
                match ask_node(&call, node, &sent_key, strict || pin.is_some()).await {
                    Step::Done(reply) => return keyed(reply, &sent_key),
                    // A peer asked for this node only: it moves on itself.
                    Step::NotHosted if pin.is_some() => {
                        return keyed(
                            outcome_response(InvokeOutcome::Failed(InvokeError::UnknownFunction)),
                            &sent_key,
                        )
                    }
                    Step::NotHosted if strict => {
                        unhosted = Some(node.clone());
                        break 'rounds;
                    }
                    Step::NotHosted => {}
                    Step::Unreachable => {
                        unreachable = Some(node.clone());
                        if strict {
                            break 'rounds;
                        }
                    }
                }
            }
            if pin.is_some() {
                break;
            }
            // Where the function is now, leaving out the nodes asked.
            let fresh: Vec<NodeId> = order(
                route(&ctx, &tenant, &name, start)
                    .map(|r| r.nodes)
                    .unwrap_or_default(),
            )
            .into_iter()
            .filter(|n| !tried.contains(n))
            .collect();
            if fresh.is_empty() {
                break;
            }
            nodes = fresh;
        }
        // An assigned key that no agent linked here took: each peer picks
        // among the agents linked to it (it knows their residency, this
        // replica does not) and names the key's node in its answer.
        if !strict && !forwarded {
            if let Step::Done(reply) = via_peers(&call, None, key.base()).await {
                return if reply.headers().contains_key(KEY) {
                    body_cut(reply, body.upload(), &limits)
                } else {
                    keyed(reply, key.base())
                };
            }
        }
        if route(&ctx, &tenant, &name, start).is_none() {
            // The function was deleted meanwhile; nothing ran.
            return keyed(
                outcome_response(InvokeOutcome::Failed(InvokeError::UnknownFunction)),
                key.base(),
            );
        }
        let why = match (&key, &unreachable, &unhosted) {
            (Key::Given(_), _, Some(home)) => format!(
                "the agent of node {}, which keeps the outcome of this Idempotency-Key, \
                 does not host the function yet (or any more) though the region places it \
                 there; nothing ran on this attempt",
                home.0
            ),
            (Key::Given(_), Some(home), None) => format!(
                "the agent of node {}, which keeps the outcome of this Idempotency-Key, \
                 is not connected to the region; nothing ran on this attempt",
                home.0
            ),
            (_, None, _) => "no node the function is placed on hosts it yet (it is being moved); \
                             nothing ran"
                .to_string(),
            _ => {
                "no agent hosting the function is connected to the region; nothing ran".to_string()
            }
        };
        if forwarded {
            return keyed(
                error(StatusCode::SERVICE_UNAVAILABLE, "no_agent", &why),
                key.base(),
            );
        }
        // No agent it may go to is reachable from any replica: its node was
        // lost (the leader moves its instance after the liveness graces) or
        // the instance is moving. Nothing ran; the request waits while its
        // deadline holds and is then tried again where the function is.
        let budget = Duration::from_millis(original_ms.unwrap_or(function_deadline_ms));
        let left = budget.saturating_sub(arrived.elapsed());
        if left <= NO_AGENT_RETRY {
            return keyed(
                error(StatusCode::SERVICE_UNAVAILABLE, "no_agent", &why),
                key.base(),
            );
        }
        tokio::time::sleep(NO_AGENT_RETRY).await;
        asked_ms = Some(
            u64::try_from(left.saturating_sub(NO_AGENT_RETRY).as_millis()).unwrap_or(u64::MAX),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn a_cut_upload_replaces_only_gshares_definite_refusals() {
        let code = |r: &HttpResponse| {
            (
                r.status().as_u16(),
                r.headers()
                    .get("x-gshare-error")
                    .map(|v| v.to_str().unwrap().to_string()),
            )
        };
        let over = Upload::Stopped(BodyStop::OverCap { passed: 10 });
        let limits = BodyLimits {
            max_bytes: 64,
            idle: Duration::from_millis(500),
        };
        let failed = || error(StatusCode::BAD_GATEWAY, "instance_failed", "gone");
        assert_eq!(
            code(&body_cut(failed(), over, &limits)),
            (413, Some("body_too_large".into()))
        );
        assert_eq!(
            code(&body_cut(
                failed(),
                Upload::Stopped(BodyStop::Broken),
                &limits
            )),
            (400, Some("bad_request".into()))
        );
        assert_eq!(
            code(&body_cut(
                failed(),
                Upload::Stopped(BodyStop::Stalled { passed: 3 }),
                &limits
            )),
            (408, Some("body_timeout".into()))
        );
        assert_eq!(
            code(&body_cut(failed(), Upload::Whole, &limits)),
            (502, Some("instance_failed".into()))
        );
        // An unknown outcome stays unknown: the function may have done the
        // work, and the client retries with its key.
        let unknown = error(StatusCode::BAD_GATEWAY, "outcome_unknown", "lost");
        assert_eq!(
            code(&body_cut(unknown, over, &limits)),
            (502, Some("outcome_unknown".into()))
        );
        // The function's own answer passes as it is.
        let own = HttpResponse::build(StatusCode::UNPROCESSABLE_ENTITY).finish();
        assert_eq!(code(&body_cut(own, over, &limits)), (422, None));
        let ok = HttpResponse::Ok().finish();
        assert_eq!(code(&body_cut(ok, over, &limits)), (200, None));
    }

    #[test]
    fn resident_nodes_go_first_and_each_node_once() {
        let n = |s: &str| NodeId(s.into());
        let nodes: BTreeSet<NodeId> = [n("a"), n("b"), n("c"), n("d")].into();
        let resident: BTreeSet<String> = ["c".to_string(), "a".to_string()].into();
        assert_eq!(
            preferred_order(nodes.clone(), &resident, 0),
            [n("a"), n("c"), n("b"), n("d")]
        );
        assert_eq!(
            preferred_order(nodes.clone(), &resident, 1),
            [n("c"), n("a"), n("d"), n("b")]
        );
        assert_eq!(
            preferred_order(nodes, &BTreeSet::new(), 2),
            [n("c"), n("d"), n("a"), n("b")]
        );
    }

    #[tokio::test]
    async fn an_endless_peer_answer_is_relayed_and_cut_at_the_limit() {
        use actix_web::body::MessageBody;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 1024];
            let _ = s.read(&mut head).await;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await;
            let chunk = vec![b'x'; 64 * 1024];
            while s.write_all(&chunk).await.is_ok() {}
        });
        // A hang guard, not a timing assert (the relay's limit is 1 s).
        let (seen, end) = tokio::time::timeout(Duration::from_secs(30), async {
            let got = forward_http(
                &addr,
                None,
                "/v1/invoke/t/f",
                "Bearer x",
                &Pin {
                    node: Some("n1"),
                    key: "k1",
                    deadline: None,
                    within: FORWARD_TIMEOUT,
                    secret: &ForwardSecret::derive("op"),
                    token_digest: "d",
                },
                &RequestBodySource::whole(web::Bytes::from_static(b"{}")),
                None,
            )
            .await;
            let Forwarded::Streaming(head, reply) = got else {
                panic!("the answer's start must come back");
            };
            assert_eq!(head.status, 200);
            // Relayed as it comes (nothing held whole), until the limit.
            let mut body = RelayedBody::from_peer(reply, None, Duration::from_secs(1));
            let mut seen = 0usize;
            loop {
                let next =
                    std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_next(cx)).await;
                match next {
                    Some(Ok(b)) => seen += b.len(),
                    Some(Err(e)) => break (seen, Some(e)),
                    None => break (seen, None),
                }
            }
        })
        .await
        .expect("the relay kept reading an endless answer");
        assert!(seen > 0, "nothing was relayed before the cut");
        // Cut at the limit: an error, so the client sees an incomplete reply.
        let why = end.expect("an endless answer must end cut, not complete");
        assert!(why.to_string().contains("deadline"), "{why}");
    }
}
