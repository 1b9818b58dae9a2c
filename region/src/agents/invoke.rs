//! `POST /v1/invoke/{tenant}/{name}` on a replica: check the tenant's
//! token, find the nodes hosting the function, and forward over QUIC to a
//! hosting agent connected to this replica; if none is connected here,
//! ask the other replicas over HTTP (once: the hop is marked with
//! `X-Gshare-Forwarded`). The answer is the agent's (same statuses as its
//! ingress).
//!
//! A forward carries the tenant's token, so it goes over TLS when this
//! replica's API does (`[http_tls]`: the peers' certificates must chain to
//! its `ca_cert` and name their IP address; the replicas of a region serve
//! alike), and reads at most [`MAX_FORWARD_REPLY_BYTES`] of the answer (a
//! larger one is a 502).

use crate::api::auth::sha256_hex;
use crate::http::HttpContext;
use crate::http_client::{send, HttpClientError, HttpTarget};
use crate::wire::{read_frame, write_frame};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::model::{NodeId, TenantId};
use gshare_core::protocol::{
    AgentMessage, AgentMessageV1, InvokeOutcome, InvokeRequest, RegionMessage, RegionMessageV1,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Largest answer read from a peer replica a forward went to: an agent's
/// answer fits in one frame, plus room for the headers.
pub const MAX_FORWARD_REPLY_BYTES: usize = gshare_core::protocol::MAX_FRAME_BYTES + (64 << 10);

const FORWARDED: &str = "x-gshare-forwarded";
const DEADLINE: &str = "x-gshare-deadline-ms";
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn error(status: u16, code: &str, message: &str) -> HttpResponse {
    HttpResponse::build(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY))
        .json(serde_json::json!({"error": {"code": code, "message": message}}))
}

fn outcome_response(outcome: InvokeOutcome) -> HttpResponse {
    match outcome {
        InvokeOutcome::Done {
            body,
            queued_us,
            service_us,
        } => HttpResponse::Ok()
            .insert_header(("x-gshare-queued-us", queued_us.to_string()))
            .insert_header(("x-gshare-service-us", service_us.to_string()))
            .body(body),
        InvokeOutcome::Failed(e) => error(e.http_status(), e.code(), &e.to_string()),
    }
}

async fn forward_quic(
    conn: &quinn::Connection,
    req: InvokeRequest,
) -> Result<InvokeOutcome, String> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    write_frame(&mut send, &RegionMessage::v1(RegionMessageV1::Invoke(req)))
        .await
        .map_err(|e| e.to_string())?;
    match read_frame::<AgentMessage>(&mut recv)
        .await
        .map_err(|e| e.to_string())?
    {
        AgentMessage::V1(AgentMessageV1::InvokeReply(r)) => Ok(r.outcome),
        other => Err(format!("unexpected answer {other:?}")),
    }
}

/// What a forward to a peer replica gave.
enum Forwarded {
    /// Its answer.
    Answer(u16, Vec<u8>),
    /// No answer (unreachable, TLS refused, timed out, malformed).
    Nothing,
    /// An answer past [`MAX_FORWARD_REPLY_BYTES`].
    TooLarge,
}

/// One HTTP/1.1 POST to a peer replica, over TLS when `tls` is set.
async fn forward_http(
    addr: &str,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    path: &str,
    auth: &str,
    deadline: Option<&str>,
    body: &[u8],
) -> Forwarded {
    let Ok(addr) = addr.parse::<SocketAddr>() else {
        return Forwarded::Nothing;
    };
    let target = match tls {
        Some(c) => HttpTarget::tls(addr, c),
        None => HttpTarget::plain(addr),
    };
    let (path, auth, deadline, body) = (
        path.to_string(),
        auth.to_string(),
        deadline.map(str::to_string),
        body.to_vec(),
    );
    let sent = tokio::task::spawn_blocking(move || {
        let mut headers = vec![("Authorization", auth.as_str()), (FORWARDED, "1")];
        if let Some(d) = &deadline {
            headers.push((DEADLINE, d.as_str()));
        }
        send(
            &target,
            "POST",
            &path,
            &headers,
            &body,
            Duration::from_secs(60),
            MAX_FORWARD_REPLY_BYTES,
        )
    })
    .await;
    match sent {
        Ok(Ok((status, body))) => Forwarded::Answer(status, body),
        Ok(Err(HttpClientError::TooLarge { .. })) => Forwarded::TooLarge,
        Ok(Err(e)) => {
            tracing::warn!("forward to replica {addr} failed: {e}");
            Forwarded::Nothing
        }
        Err(_) => Forwarded::Nothing,
    }
}

/// The route handler.
pub async fn invoke_route(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    body: web::Bytes,
    ctx: web::Data<HttpContext>,
) -> HttpResponse {
    let (tenant, name) = path.into_inner();
    let tenant = TenantId(tenant);
    let Some(auth) = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return error(401, "unauthorized", "missing bearer token");
    };
    let digest = sha256_hex(auth.strip_prefix("Bearer ").unwrap_or("").trim());
    let deadline = req
        .headers()
        .get(DEADLINE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let deadline_ms = match &deadline {
        None => None,
        Some(d) => match d.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Some(ms),
            _ => {
                return error(
                    400,
                    "bad_deadline",
                    "X-Gshare-Deadline-Ms must be a positive integer",
                )
            }
        },
    };
    let nodes: Vec<NodeId> = {
        let st = ctx.replica.state.read();
        let d = st.region.domain();
        if d.token_owner(&digest).map(|(t, _)| t) != Some(&tenant) {
            return error(401, "unauthorized", "token not valid for this tenant");
        }
        if d.function(&tenant, &name).is_err() {
            return error(404, "unknown_function", "unknown function");
        }
        let mut nodes: Vec<NodeId> = d
            .instances()
            .filter(|i| i.tenant == tenant && i.function == name)
            .flat_map(|i| i.slices.iter().map(|s| s.gpu.node.clone()))
            .collect();
        nodes.dedup();
        nodes
    };
    if nodes.is_empty() {
        return error(
            503,
            "no_instance",
            "the function has no instance placed yet",
        );
    }
    let hub = &ctx.replica.agents;
    let start = NEXT_ID.fetch_add(1, Ordering::Relaxed) as usize;
    for k in 0..nodes.len() {
        let node = &nodes[(start + k) % nodes.len()];
        let Some(conn) = hub.link(node) else { continue };
        let request = InvokeRequest {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            tenant: tenant.clone(),
            function: name.clone(),
            deadline_ms,
            body: body.to_vec(),
        };
        match forward_quic(&conn, request).await {
            Ok(outcome) => return outcome_response(outcome),
            Err(e) => tracing::warn!(node = %node.0, "forwarding to agent failed: {e}"),
        }
    }
    if req.headers().contains_key(FORWARDED) {
        return error(
            503,
            "no_agent",
            "no hosting agent is connected to this replica",
        );
    }
    let peers: Vec<String> = {
        let m = ctx.replica.raft.metrics().borrow().clone();
        m.membership_config
            .membership()
            .nodes()
            .filter(|(id, _)| **id != ctx.replica.id)
            .map(|(_, n)| n.http_addr.clone())
            .collect()
    };
    let path = format!("/v1/invoke/{}/{name}", tenant.0);
    for peer in peers {
        let tls = ctx.forward_tls.clone();
        match forward_http(&peer, tls, &path, &auth, deadline.as_deref(), &body).await {
            Forwarded::Answer(status, body) if status != 503 => {
                return HttpResponse::build(
                    StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                )
                .body(body);
            }
            Forwarded::TooLarge => {
                return error(
                    502,
                    "reply_too_large",
                    &format!(
                        "the answer forwarded from replica {peer} is larger than {MAX_FORWARD_REPLY_BYTES} bytes"
                    ),
                )
            }
            _ => {}
        }
    }
    error(
        503,
        "no_agent",
        "no agent hosting the function is connected to the region",
    )
}
