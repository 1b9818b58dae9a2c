//! `POST /v1/invoke/{tenant}/{name}` on a replica: check the tenant's
//! token, find the nodes hosting the function, and forward over QUIC to a
//! hosting agent connected to this replica; if none is connected here,
//! ask the other replicas over HTTP (once: the hop is marked with
//! `X-Gshare-Forwarded`). The answer is the agent's (same statuses as its
//! ingress). Every error is [`ApiError`]'s one shape; a peer's answer is
//! passed on with its `Content-Type`, `X-Gshare-Error` and timing headers.
//! The token is checked before the body is read (`413 body_too_large`
//! beyond [`MAX_INVOKE_BODY_BYTES`]).

use crate::api::auth::sha256_hex;
use crate::api::{read_body_limited, ApiError};
use crate::http::HttpContext;
use crate::wire::{read_frame, write_frame};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::http_surface::ERROR_HEADER;
use gshare_core::model::{NodeId, TenantId};
use gshare_core::protocol::{
    AgentMessage, AgentMessageV1, InvokeOutcome, InvokeRequest, RegionMessage, RegionMessageV1,
    MAX_INVOKE_BODY_BYTES,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const FORWARDED: &str = "x-gshare-forwarded";
const DEADLINE: &str = "x-gshare-deadline-ms";
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Headers of a peer's answer passed on to the client.
const PASSED_ON: [&str; 4] = [
    "content-type",
    ERROR_HEADER,
    "x-gshare-queued-us",
    "x-gshare-service-us",
];

fn error(status: StatusCode, code: &'static str, message: &str) -> HttpResponse {
    answer(ApiError::new(status, code, message))
}

fn answer(e: ApiError) -> HttpResponse {
    actix_web::ResponseError::error_response(&e)
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
        InvokeOutcome::Failed(e) => answer(ApiError::from_invoke(&e)),
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

/// A peer replica's answer: status, the headers passed on, body.
struct PeerAnswer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// One HTTP/1.1 POST to a peer replica; `None` if it gave no answer.
async fn forward_http(
    addr: &str,
    path: &str,
    auth: &str,
    deadline: Option<&str>,
    body: &[u8],
) -> Option<PeerAnswer> {
    let mut s = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {auth}\r\n{FORWARDED}: 1\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(d) = deadline {
        head.push_str(&format!("{DEADLINE}: {d}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.ok()?;
    s.write_all(body).await.ok()?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut out))
        .await
        .ok()?
        .ok()?;
    let split = out.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&out[..split]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .filter(|(k, _)| PASSED_ON.contains(&k.as_str()))
        .collect();
    Some(PeerAnswer {
        status,
        headers,
        body: out[split + 4..].to_vec(),
    })
}

/// The route handler.
pub async fn invoke_route(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
    ctx: web::Data<HttpContext>,
) -> HttpResponse {
    let (tenant, name) = path.into_inner();
    let tenant = TenantId(tenant);
    let token = match crate::api::auth::bearer(&req) {
        Ok(t) => t.to_string(),
        Err(e) => return answer(e),
    };
    let digest = sha256_hex(&token);
    let auth = format!("Bearer {token}");
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
                    StatusCode::BAD_REQUEST,
                    "bad_deadline",
                    "X-Gshare-Deadline-Ms must be a positive integer",
                )
            }
        },
    };
    let owned = {
        let st = ctx.replica.state.read();
        st.region.domain().token_owner(&digest).map(|(t, _)| t) == Some(&tenant)
    };
    if !owned {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "token not valid for this tenant",
        );
    }
    let body = match read_body_limited(&req, payload, MAX_INVOKE_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => return answer(e),
    };
    let nodes: Vec<NodeId> = {
        let st = ctx.replica.state.read();
        let d = st.region.domain();
        if d.function(&tenant, &name).is_err() {
            return error(
                StatusCode::NOT_FOUND,
                "unknown_function",
                "unknown function",
            );
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
            StatusCode::SERVICE_UNAVAILABLE,
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
            StatusCode::SERVICE_UNAVAILABLE,
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
        if let Some(a) = forward_http(&peer, &path, &auth, deadline.as_deref(), &body).await {
            if a.status != 503 {
                let Ok(status) = StatusCode::from_u16(a.status) else {
                    continue;
                };
                let mut reply = HttpResponse::build(status);
                for h in a.headers {
                    reply.insert_header(h);
                }
                return reply.body(a.body);
            }
        }
    }
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "no_agent",
        "no agent hosting the function is connected to the region",
    )
}
