//! The agent's HTTP ingress: `POST /v1/invoke/{tenant}/{name}`, the
//! transparent `/v1/invoke/{tenant}/{name}/{*path}` (any method: the request
//! passed on to the function's server, its reply passed back, a reply
//! without a length streamed as it comes; docs/edge.md, "The transparent
//! route" and "Streaming replies"), `/healthz`,
//! `/metrics`, and with metering `GET /v1/agent/usage/{tenant}` (the
//! tenant's durable totals as journaled here; the tenant's bearer token,
//! 401 without one, 403 with another tenant's) and `GET /v1/agent/journal`
//! (where the journal stands; no tenant data, no auth), and
//! `GET /v1/agent/placement` (where the node's instances are: their slices'
//! GPUs as the agent holds them, the GPUs holding a copy, remaps asked; ids
//! and counters only, no auth).
//!
//! The bearer token (core's one strict rule, [`bearer_token`]) is hashed
//! here and checked by the [`NodeAgent`] against the digests the region
//! sent (so it works while the agent is cut off); the body streams to the
//! function as it arrives (docs/edge.md, "Streaming request bodies"). Every accepted invocation is answered: `200` with the
//! function's body (the transparent route: the function's status, headers
//! and body), or an explicit error `{"error": {"code", "message",
//! "retryable"}}` with the header `X-Gshare-Error: <code>` (core's
//! [`ErrorBody`], the replicas' shape too):
//!
//! | status | code |
//! |---|---|
//! | 400 | `bad_deadline` (header `X-Gshare-Deadline-Ms` not a whole number of ms from 1 to 86400000, one day) |
//! | 400 | `invalid_idempotency_key` (header `Idempotency-Key` not 1 to 128 printable ASCII characters) |
//! | 401 | `unauthorized` (missing or unknown token, or another tenant's) |
//! | 404 | `unknown_function` |
//! | 404 | `unknown_route` (no route for this path and method) |
//! | 409 | `idempotency_key_reused` (the key was used for another function of the tenant within the key window; nothing ran) |
//! | 413 | `body_too_large` (over the config's `max_request_bytes`, after the token check: an announced length at once; a chunked body once its running count passes it, when that aborted the call) |
//! | 408 | `body_timeout` (no bytes of the request body for the config's `body_idle_timeout_ms`: the upload was cut, which aborted the call) |
//! | 400 | `bad_request` (the request body broke off, which aborted the call) |
//! | 429 | `over_capacity` |
//! | 499 | `client_closed_request` (the client's connection ended while its call waited: an unkeyed call that had not started is dropped; only a client that half-closed can read this) |
//! | 502 | `instance_failed` (the runtime failed, its reply was over the cap, or on the plain route the function answered non-2xx) |
//! | 502 | `function_crashed` (its process died while serving; it is restarted) |
//! | 503 | `shutting_down` |
//! | 504 | `deadline_unreachable` (on arrival, while queued, or the function ran past it) |

use crate::agent::{
    Admission, CheckToken, Invoke, MetricsQuery, NodeAgent, PlacementQuery, ReplyStart, Transparent,
};
use crate::journal::UsageJournal;
use crate::region_link::LinkHealth;
use crate::runtime::{HttpCall, ReplyHead, RequestBody, StreamItem};
use crate::token::token_digest;
use actix::Addr;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use gshare_core::http_surface::{
    bearer_token, function_target, outcome_answer, pass_through, retryable_status, Direction,
    ErrorBody, ERROR_HEADER,
};
use gshare_core::model::TenantId;
use gshare_core::net::http_client::{
    announced_len, read_whole, stream_body, BodyLimits, BodyStop, Upload, WHOLE_BODY,
};
use gshare_core::protocol::{InvokeError, InvokeOutcome};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Header carrying the relative deadline in milliseconds.
pub const DEADLINE_HEADER: &str = "x-gshare-deadline-ms";
/// Header carrying an invocation's idempotency key.
pub const KEY_HEADER: &str = "idempotency-key";
/// Header marking the stored answer of a repeated key (`1`, or `truncated`).
pub use gshare_core::http_surface::REPLAYED_HEADER;

/// An error answer in the one shape; `retryable` from the status.
fn error(status: u16, code: &str, message: &str) -> HttpResponse {
    error_with(status, code, message, retryable_status(status))
}

fn error_with(status: u16, code: &str, message: &str, retryable: bool) -> HttpResponse {
    HttpResponse::build(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .insert_header((ERROR_HEADER, code))
        .json(ErrorBody::new(code, message, retryable))
}

/// The HTTP answer to an invocation's outcome (core's
/// [`outcome_answer`], the replicas' too).
pub fn outcome_response(outcome: InvokeOutcome) -> HttpResponse {
    match outcome_answer(outcome) {
        Ok(a) => {
            let mut resp = HttpResponse::build(
                StatusCode::from_u16(a.status).unwrap_or(StatusCode::BAD_GATEWAY),
            );
            for (k, v) in a.headers {
                resp.append_header((k, v));
            }
            resp.body(a.body)
        }
        Err(e) => failed(&e),
    }
}

fn failed(e: &InvokeError) -> HttpResponse {
    error_with(e.http_status(), e.code(), &e.to_string(), e.retryable())
}

/// The request's bearer token, or the 401 answer.
fn bearer(req: &HttpRequest) -> Result<&str, Box<HttpResponse>> {
    let unauthorized = |m: &str| Box::new(error(401, "unauthorized", m));
    let header = req
        .headers()
        .get("authorization")
        .ok_or_else(|| unauthorized("missing Authorization: Bearer <token>"))?
        .to_str()
        .map_err(|_| unauthorized("the Authorization header is not visible ASCII"))?;
    bearer_token(header).map_err(|e| unauthorized(&e.to_string()))
}

/// The ingress's request body limits (the config's `max_request_bytes`
/// and `body_idle_timeout_ms`; their defaults when not given).
fn body_limits(req: &HttpRequest) -> BodyLimits {
    req.app_data::<BodyLimits>().copied().unwrap_or_default()
}

/// The length the request's body announces (`Content-Length`; `None`:
/// chunked, or none).
fn announced(req: &HttpRequest) -> Option<u64> {
    announced_len(
        req.headers()
            .get("content-length")
            .map(|v| v.to_str().unwrap_or("")),
        req.headers().contains_key("transfer-encoding"),
        req.version() < actix_web::http::Version::HTTP_2,
    )
}

/// `POST /v1/invoke/{tenant}/{name}`: the body to the function's invoke
/// path; its 2xx body back (any other status: `502 instance_failed`).
async fn invoke(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
    agent: web::Data<Addr<NodeAgent>>,
) -> HttpResponse {
    let (tenant, function) = path.into_inner();
    run(req, tenant, function, payload, agent, None).await
}

/// `/v1/invoke/{tenant}/{name}/{*path}`, any method: the request passed
/// on to the function (method, `/{path}`, query, headers but the
/// hop-by-hop ones and gshare's own, body) and its reply back as it is
/// (status, headers but the hop-by-hop ones and any `x-gshare-*`, body).
async fn invoke_transparent(
    req: HttpRequest,
    path: web::Path<(String, String, String)>,
    payload: web::Payload,
    agent: web::Data<Addr<NodeAgent>>,
) -> HttpResponse {
    let (tenant, function, _) = path.into_inner();
    let call = HttpCall {
        method: req.method().as_str().to_string(),
        target: function_target(req.uri().path(), req.uri().query()),
        headers: pass_on(req.headers()),
    };
    run(req, tenant, function, payload, agent, Some(call)).await
}

/// The request headers the function gets.
fn pass_on(headers: &actix_web::http::header::HeaderMap) -> Vec<(String, Vec<u8>)> {
    let all: Vec<(&str, &[u8])> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_bytes()))
        .collect();
    pass_through(&all, Direction::Request)
}

/// The function's status and headers (those that [`pass_through`]).
fn function_head(head: &ReplyHead) -> actix_web::HttpResponseBuilder {
    let status = StatusCode::from_u16(head.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let all: Vec<(&str, &[u8])> = head
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    let mut resp = HttpResponse::build(status);
    for (k, v) in pass_through(&all, Direction::Reply) {
        let (Ok(k), Ok(v)) = (
            actix_web::http::header::HeaderName::from_bytes(k.as_bytes()),
            actix_web::http::header::HeaderValue::from_bytes(&v),
        ) else {
            continue;
        };
        resp.append_header((k, v));
    }
    resp
}

/// The answer to a transparent invocation: the function's status, headers
/// and body, with gshare's timing headers.
fn transparent_response(
    head: ReplyHead,
    body: Vec<u8>,
    queued_us: u64,
    service_us: u64,
) -> HttpResponse {
    function_head(&head)
        .insert_header(("x-gshare-queued-us", queued_us.to_string()))
        .insert_header(("x-gshare-service-us", service_us.to_string()))
        .body(body)
}

/// The answer to a transparent invocation whose reply streams: the
/// function's status and headers, then its body as it comes (chunked).
fn streamed_response(head: ReplyHead, chunks: mpsc::Receiver<StreamItem>) -> HttpResponse {
    function_head(&head).body(StreamedBody {
        chunks,
        ended: false,
    })
}

/// A streamed reply's body: the chunks as they come; ended by
/// [`StreamItem::End`], or cut (an error: the connection is closed without
/// the last chunk, so the client sees an incomplete reply) when the channel
/// closes without it (deadline, crash, over the cap).
struct StreamedBody {
    chunks: mpsc::Receiver<StreamItem>,
    ended: bool,
}

impl actix_web::body::MessageBody for StreamedBody {
    type Error = std::io::Error;

    fn size(&self) -> actix_web::body::BodySize {
        actix_web::body::BodySize::Stream
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
            Poll::Ready(Some(StreamItem::Data(b))) => Poll::Ready(Some(Ok(b))),
            Poll::Ready(Some(StreamItem::End)) => {
                self.ended = true;
                Poll::Ready(None)
            }
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(Some(Err(std::io::Error::other(
                    "the function's reply was cut (deadline, crash or reply cap)",
                ))))
            }
        }
    }
}

/// The answer to a call whose request body stopped so (core's
/// [`BodyStop::refusal`], a replica's too), closing the connection: the
/// rest of the client's body was not read, so its framing is lost (actix
/// still discards the rest of a chunked one as it comes before it closes).
fn body_stopped(stop: BodyStop, limits: &BodyLimits) -> HttpResponse {
    let mut r = failed(&stop.refusal(limits));
    r.head_mut()
        .set_connection_type(actix_web::http::ConnectionType::Close);
    r
}

/// The answer to a request whose body `stop`ped before any call,
/// once `check` found its token valid: only a caller with a valid token
/// learns more than that its token is refused.
async fn refused(
    agent: &Addr<NodeAgent>,
    check: CheckToken,
    stop: BodyStop,
    limits: BodyLimits,
) -> HttpResponse {
    match agent.send(check).await {
        Ok(true) => body_stopped(stop, &limits),
        Ok(false) => error(401, "unauthorized", "token not valid for this tenant"),
        Err(_) => failed(&InvokeError::ShuttingDown),
    }
}

/// Checks the token and headers, reads the body and runs the invocation
/// (`http`: the transparent route's request).
async fn run(
    req: HttpRequest,
    tenant: String,
    function: String,
    payload: web::Payload,
    agent: web::Data<Addr<NodeAgent>>,
    http: Option<HttpCall>,
) -> HttpResponse {
    let token = match bearer(&req) {
        Ok(t) => t,
        Err(refusal) => return *refusal,
    };
    let deadline_ms = match req.headers().get(DEADLINE_HEADER) {
        None => None,
        Some(v) => match v
            .to_str()
            .ok()
            .and_then(gshare_core::http_surface::deadline_ms)
        {
            Some(ms) => Some(ms),
            None => return error(400, "bad_deadline", gshare_core::http_surface::BAD_DEADLINE),
        },
    };
    let idempotency_key = match req.headers().get(KEY_HEADER) {
        None => None,
        Some(v) => match v
            .to_str()
            .ok()
            .filter(|k| gshare_core::state::is_valid_key(k))
        {
            Some(k) => Some(k.to_string()),
            None => {
                return error(
                    400,
                    "invalid_idempotency_key",
                    "Idempotency-Key must be 1 to 128 printable ASCII characters",
                )
            }
        },
    };
    let (tenant, digest) = (TenantId(tenant), token_digest(token));
    let limits = body_limits(&req);
    let len = announced(&req);
    let refuse = |stop: BodyStop| {
        let check = CheckToken {
            tenant: tenant.clone(),
            digest: digest.clone(),
        };
        refused(&agent, check, stop, limits)
    };
    let (body, upload) = match len {
        Some(n) if usize::try_from(n).map_or(true, |n| n > limits.max_bytes) => {
            return refuse(BodyStop::OverCap { passed: 0 }).await;
        }
        // No body (a GET, or an empty POST): sent whole, not as a stream
        // of nothing.
        Some(0) => (RequestBody::default(), None),
        // A small body is read whole (no channel, no task): the common
        // request.
        Some(n) if n <= WHOLE_BODY as u64 => match read_whole(payload, limits).await {
            Ok(b) => (RequestBody::whole(b), None),
            Err(stop) => return refuse(stop).await,
        },
        // Any other streams to the function as it arrives (the token is
        // checked when the agent admits the call).
        _ => {
            let (body, upload) = stream_body(payload, len, limits);
            (body, Some(upload))
        }
    };
    let msg = Invoke {
        tenant,
        function,
        token_digest: Some(digest),
        deadline_ms,
        body,
        idempotency_key,
        http: None,
    };
    // A client that closes its connection while its call waits drops the
    // call here: the agent then cancels it if it has not started.
    let socket = req.conn_data::<ClientSocket>().cloned();
    let answered = tokio::select! {
        biased;
        answered = ask(&agent, msg, http) => answered,
        () = client_gone(socket) => return error(
            499,
            "client_closed_request",
            "the connection ended while the call waited: a call without an idempotency key that had not started was dropped (it never runs); one that had started, or has a key, runs to its end unanswered",
        ),
    };
    // A call that failed because its body was cut says why.
    if let Answered::Whole(_, InvokeOutcome::Failed(_)) = &answered {
        if let Some(Upload::Stopped(stop)) = upload.map(|u| u.get()) {
            return body_stopped(stop, &limits);
        }
    }
    match answered {
        Answered::Unauthorized => error(401, "unauthorized", "token not valid for this tenant"),
        // A body cut after the reply started cuts the reply too.
        Answered::Stream(head, chunks) => streamed_response(head, chunks),
        Answered::Whole(
            Some(head),
            InvokeOutcome::Done {
                body,
                queued_us,
                service_us,
            },
        ) => transparent_response(head, body, queued_us, service_us),
        Answered::Whole(_, outcome) => outcome_response(outcome),
    }
}

/// How often a waiting call checks whether its client's connection closed.
const CLIENT_CHECK: std::time::Duration = std::time::Duration::from_millis(50);

/// A duplicate of a client connection's socket, taken when it connects
/// ([`on_connect`]): peeked at while a call waits, to find out whether the
/// client went away ([`client_gone`]). (actix-web goes on with a handler
/// whose client closed its connection; only writing its answer fails.)
#[derive(Debug, Clone)]
struct ClientSocket(Arc<std::net::TcpStream>);

/// Keeps a [`ClientSocket`] of each connection, plain or TLS (a
/// connection of another kind is not watched, which is said once).
fn on_connect(conn: &dyn std::any::Any, ext: &mut actix_web::dev::Extensions) {
    use std::os::fd::AsFd;
    static UNWATCHED: std::sync::Once = std::sync::Once::new();
    let tcp = conn
        .downcast_ref::<actix_web::rt::net::TcpStream>()
        .or_else(|| {
            conn.downcast_ref::<actix_tls::accept::rustls_0_23::TlsStream<actix_web::rt::net::TcpStream>>()
                .map(|t| t.get_ref().0)
        });
    match tcp.map(|t| t.as_fd().try_clone_to_owned()) {
        Some(Ok(fd)) => {
            ext.insert(ClientSocket(Arc::new(std::net::TcpStream::from(fd))));
        }
        Some(Err(e)) => tracing::debug!("a connection's socket was not duplicated: {e}"),
        None => UNWATCHED.call_once(|| {
            tracing::warn!(
                "ingress connections of an unknown kind: a call whose client goes away is not dropped"
            )
        }),
    }
}

/// What a peek at a client's socket says.
fn peeked(socket: &std::net::TcpStream) -> Option<bool> {
    // The socket is non-blocking (the duplicate shares the server's file
    // status): a peek never waits. `Some(true)`: the connection ended.
    match socket.peek(&mut [0u8; 1]) {
        Ok(0) => Some(true),
        Ok(_) => Some(false),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ) =>
        {
            None
        }
        Err(_) => Some(true),
    }
}

/// Resolves once the client's connection has ended: its socket reads
/// end-of-file (the client closed it, or shut down its sending side, as
/// Go's server also reads it) or fails (reset). Looked at first after
/// [`CLIENT_CHECK`] (a call answered sooner costs nothing), then on each
/// readiness of the socket (registered with the worker's reactor; every
/// [`CLIENT_CHECK`] while unread bytes wait, or if it cannot be
/// registered). Never resolves without a socket, nor
/// while bytes the server has not read lie before the end (a request body
/// still arriving, a pipelined request not yet read, TLS records).
async fn client_gone(socket: Option<ClientSocket>) {
    let Some(ClientSocket(socket)) = socket else {
        return std::future::pending().await;
    };
    tokio::time::sleep(CLIENT_CHECK).await;
    if peeked(&socket) == Some(true) {
        return;
    }
    // Another duplicate, registered with the worker's reactor (on its
    // own: nothing reads through it), tells when to look again.
    let watch = socket.try_clone().and_then(tokio::net::TcpStream::from_std);
    let Ok(watch) = watch else {
        loop {
            tokio::time::sleep(CLIENT_CHECK).await;
            if peeked(&socket) == Some(true) {
                return;
            }
        }
    };
    loop {
        if watch.readable().await.is_err() {
            return std::future::pending().await;
        }
        let looked = watch.try_io(tokio::io::Interest::READABLE, || match peeked(&socket) {
            Some(ended) => Ok(ended),
            // Nothing to read: the readiness is cleared until the next.
            None => Err(std::io::ErrorKind::WouldBlock.into()),
        });
        match looked {
            Ok(true) => return,
            // Bytes wait (their end may lie behind them): the socket stays
            // ready, so look again after a while instead.
            Ok(false) => tokio::time::sleep(CLIENT_CHECK).await,
            Err(_) => {}
        }
    }
}

/// How the agent answered an invocation.
#[derive(Debug)]
pub enum Answered {
    /// The token is not valid for the tenant (nothing ran).
    Unauthorized,
    /// A transparent invocation's reply, streaming: the function's status
    /// and headers, and its body's chunks (the run's outcome only settles
    /// its usage).
    Stream(ReplyHead, mpsc::Receiver<StreamItem>),
    /// The whole answer: the function's status and headers when it is a
    /// transparent invocation's own run, and the outcome (a replay, a
    /// joined run's answer and every error come without a head).
    Whole(Option<ReplyHead>, InvokeOutcome),
}

/// Runs `msg` on the agent (`http`: the transparent route's request, whose
/// reply may stream) and waits for its answer: used by the ingress and by
/// the region link's forwarded invocations alike.
pub async fn ask(agent: &Addr<NodeAgent>, mut msg: Invoke, http: Option<HttpCall>) -> Answered {
    let head_rx = http.map(|call| {
        let (head, rx) = oneshot::channel();
        msg.http = Some(Transparent { call, head });
        rx
    });
    let mut outcome_rx = match agent.send(msg).await {
        Ok(Admission::Accepted(rx)) => rx,
        Ok(Admission::Unauthorized) => return Answered::Unauthorized,
        Err(_) => return Answered::Whole(None, InvokeOutcome::Failed(InvokeError::ShuttingDown)),
    };
    // The transparent route: the reply's start may come before the outcome
    // (a streamed reply: answered at once, the outcome only settles the
    // run), or with it (the head is sent just before the outcome).
    let (mut start, mut early) = (None, None);
    if let Some(mut head_rx) = head_rx {
        tokio::select! {
            biased;
            s = &mut head_rx => match s {
                Ok(ReplyStart { head, chunks: Some(chunks) }) => {
                    return Answered::Stream(head, chunks);
                }
                Ok(s) => start = Some(s),
                Err(_) => {}
            },
            o = &mut outcome_rx => early = Some(o),
        }
        if start.is_none() {
            start = head_rx.try_recv().ok();
        }
    }
    let outcome = match early {
        Some(o) => o,
        None => outcome_rx.await,
    };
    let outcome = outcome.unwrap_or(InvokeOutcome::Failed(InvokeError::ShuttingDown));
    // No head when the outcome is not this call's own run (it joined a
    // running key, or replays a stored one): that answers as its outcome says.
    match (outcome, start) {
        (done @ InvokeOutcome::Done { .. }, Some(start)) => Answered::Whole(Some(start.head), done),
        (outcome, _) => Answered::Whole(None, outcome),
    }
}

/// The journal the ingress reports on (absent without metering).
#[derive(Clone)]
struct JournalView(Option<Arc<UsageJournal>>);

async fn tenant_usage(
    req: HttpRequest,
    tenant: web::Path<String>,
    agent: web::Data<Addr<NodeAgent>>,
    journal: web::Data<JournalView>,
) -> HttpResponse {
    let token = match bearer(&req) {
        Ok(t) => t,
        Err(refusal) => return *refusal,
    };
    let tenant = TenantId(tenant.into_inner());
    let check = CheckToken {
        tenant: tenant.clone(),
        digest: token_digest(token),
    };
    match agent.send(check).await {
        Ok(true) => {}
        Ok(false) => return error(403, "forbidden", "token not valid for this tenant"),
        Err(_) => return failed(&InvokeError::ShuttingDown),
    }
    let Some(j) = journal.0.clone() else {
        return error(404, "no_metering", "this agent does not meter usage");
    };
    let t = tenant.clone();
    match web::block(move || j.totals(&t)).await {
        Ok(Ok(totals)) => HttpResponse::Ok().json(serde_json::json!({
            "tenant": tenant.0,
            "invocations": totals.invocations,
            "compute_milli_gpu_ms": totals.compute_milli_gpu_ms,
            "memory_mib_ms": totals.memory_mib_ms,
            "records": totals.records,
        })),
        Ok(Err(e)) => error(500, "journal", &e.to_string()),
        Err(e) => error(500, "journal", &e.to_string()),
    }
}

async fn journal_status(journal: web::Data<JournalView>) -> HttpResponse {
    let Some(j) = journal.0.clone() else {
        return error(404, "no_metering", "this agent does not meter usage");
    };
    match web::block(move || j.status()).await {
        Ok(s) => HttpResponse::Ok().json(s),
        Err(e) => error(500, "journal", &e.to_string()),
    }
}

async fn placement(agent: web::Data<Addr<NodeAgent>>) -> HttpResponse {
    match agent.send(PlacementQuery).await {
        Ok(p) => HttpResponse::Ok().json(p),
        Err(_) => failed(&InvokeError::ShuttingDown),
    }
}

/// `/healthz`: `ok`, or 503 with the region link's TLS handshake failure
/// (a mistake in the certificates that retrying does not fix).
async fn healthz(link: web::Data<LinkHealth>) -> HttpResponse {
    match link.tls_failure() {
        None => HttpResponse::Ok().content_type("text/plain").body("ok"),
        Some(f) => HttpResponse::ServiceUnavailable()
            .content_type("text/plain")
            .body(format!("region link: {f}\n")),
    }
}

async fn metrics(
    req: HttpRequest,
    agent: web::Data<Addr<NodeAgent>>,
    link: web::Data<LinkHealth>,
) -> HttpResponse {
    let Ok(snap) = agent.send(MetricsQuery).await else {
        return failed(&InvokeError::ShuttingDown);
    };
    let authorization = match req.headers().get("authorization").map(|v| v.to_str()) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(_)) => {
            return error(
                401,
                "unauthorized",
                "the Authorization header is not visible ASCII",
            )
        }
    };
    let full = match snap.metrics.sees_tenant_series(authorization) {
        Ok(full) => full,
        Err(message) => return error(401, "unauthorized", message),
    };
    match snap.metrics.exposition(&snap.status, full) {
        Ok(mut text) => {
            // 1 while the region link's TLS handshakes fail (see `/healthz`).
            text.push_str(&format!(
                "# HELP gshare_edge_region_link_tls_failing 1 while the region link's TLS handshakes fail (see /healthz).\n\
                 # TYPE gshare_edge_region_link_tls_failing gauge\n\
                 gshare_edge_region_link_tls_failing {}\n",
                u8::from(link.tls_failure().is_some())
            ));
            HttpResponse::Ok()
                .content_type("text/plain; version=0.0.4")
                .body(text)
        }
        Err(e) => error(500, "metrics", &e.to_string()),
    }
}

/// Any path or method without a route: 404 `unknown_route` (not an empty 404).
async fn unknown_route(req: HttpRequest) -> HttpResponse {
    error(
        404,
        "unknown_route",
        &format!("no route for {} {}", req.method(), req.path()),
    )
}

/// Binds the ingress on `addr` with `workers` threads (no metering endpoints).
pub fn serve(
    addr: SocketAddr,
    agent: Addr<NodeAgent>,
    workers: usize,
) -> std::io::Result<actix_web::dev::Server> {
    serve_metered(addr, agent, workers, None)
}

/// [`serve_metered`] over TLS when `tls` is set (`[http_tls]`), plain HTTP otherwise.
pub fn serve_tls(
    addr: SocketAddr,
    agent: Addr<NodeAgent>,
    workers: usize,
    journal: Option<Arc<UsageJournal>>,
    tls: Option<rustls::ServerConfig>,
) -> std::io::Result<actix_web::dev::Server> {
    let listener = std::net::TcpListener::bind(addr)?;
    serve_listener(
        listener,
        agent,
        workers,
        journal,
        tls,
        (LinkHealth::default(), BodyLimits::default()),
    )
}

/// [`serve_tls`] on a listener already bound (so that a taken port is
/// found before anything starts); `/healthz` and `/metrics` show `link`'s
/// TLS handshake failures; request bodies are taken within `limits`.
pub fn serve_listener(
    listener: std::net::TcpListener,
    agent: Addr<NodeAgent>,
    workers: usize,
    journal: Option<Arc<UsageJournal>>,
    tls: Option<rustls::ServerConfig>,
    (link, limits): (LinkHealth, BodyLimits),
) -> std::io::Result<actix_web::dev::Server> {
    let view = JournalView(journal);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(agent.clone()))
            .app_data(web::Data::new(view.clone()))
            .app_data(web::Data::new(link.clone()))
            .app_data(limits)
            .route("/v1/invoke/{tenant}/{name}", web::post().to(invoke))
            .route(
                "/v1/invoke/{tenant}/{name}/{path:.*}",
                web::route().to(invoke_transparent),
            )
            .route("/v1/agent/usage/{tenant}", web::get().to(tenant_usage))
            .route("/v1/agent/journal", web::get().to(journal_status))
            .route("/v1/agent/placement", web::get().to(placement))
            .route("/metrics", web::get().to(metrics))
            .route("/healthz", web::get().to(healthz))
            .default_service(web::to(unknown_route))
    })
    .workers(workers.max(1))
    .on_connect(on_connect)
    .disable_signals();
    let server = match tls {
        Some(tls) => server.listen_rustls_0_23(listener, tls)?,
        None => server.listen(listener)?,
    };
    Ok(server.run())
}

/// Binds the ingress on `addr` with `workers` threads; `journal` backs
/// `GET /v1/agent/usage/{tenant}` and `GET /v1/agent/journal`.
pub fn serve_metered(
    addr: SocketAddr,
    agent: Addr<NodeAgent>,
    workers: usize,
    journal: Option<Arc<UsageJournal>>,
) -> std::io::Result<actix_web::dev::Server> {
    serve_tls(addr, agent, workers, journal, None)
}
