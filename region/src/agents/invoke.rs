//! `POST /v1/invoke/{tenant}/{name}` on a replica: check the tenant's
//! token, find the nodes hosting the function, and forward over QUIC to a
//! hosting agent connected to this replica; if none is connected here,
//! ask the other replicas over HTTP (once: the hop is marked with
//! `X-Gshare-Forwarded`). The answer is the agent's (same statuses as its
//! ingress).

use crate::http::HttpContext;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::model::{NodeId, TenantId};
use gshare_core::net::{read_frame, write_frame};
use gshare_core::protocol::{
    token_digest, AgentMessage, AgentMessageV1, InvokeOutcome, InvokeRequest, RegionMessage,
    RegionMessageV1, AGENT_FRAME_BYTES,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const FORWARDED: &str = "x-gshare-forwarded";
const DEADLINE: &str = "x-gshare-deadline-ms";
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Largest answer read from a peer replica: an agent-wire frame (the
/// largest outcome an agent can send) and a head.
const MAX_FORWARDED_ANSWER: usize = AGENT_FRAME_BYTES + 64 * 1024;

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

/// One HTTP/1.1 POST to a peer replica; `None` if it gave no answer.
async fn forward_http(
    addr: &str,
    path: &str,
    auth: &str,
    deadline: Option<&str>,
    body: &[u8],
) -> Option<(u16, Vec<u8>)> {
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
    // A peer's answer carries at most an agent-wire frame's body; reading
    // stops one byte past the limit, whatever the peer sends.
    let limit = MAX_FORWARDED_ANSWER as u64;
    tokio::time::timeout(
        Duration::from_secs(60),
        (&mut s).take(limit.saturating_add(1)).read_to_end(&mut out),
    )
    .await
    .ok()?
    .ok()?;
    if out.len() > MAX_FORWARDED_ANSWER {
        let e = serde_json::json!({"error": {
            "code": "answer_too_large",
            "message": format!("the replica that served the invocation answered over {MAX_FORWARDED_ANSWER} bytes"),
        }});
        return Some((502, e.to_string().into_bytes()));
    }
    let split = out.windows(4).position(|w| w == b"\r\n\r\n")?;
    let status = std::str::from_utf8(&out[..split])
        .ok()?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()?;
    Some((status, out[split + 4..].to_vec()))
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
    let digest = token_digest(auth.strip_prefix("Bearer ").unwrap_or("").trim());
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
        if let Some((status, body)) =
            forward_http(&peer, &path, &auth, deadline.as_deref(), &body).await
        {
            if status != 503 {
                return HttpResponse::build(
                    StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                )
                .body(body);
            }
        }
    }
    error(
        503,
        "no_agent",
        "no agent hosting the function is connected to the region",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_endless_peer_answer_is_cut_at_the_limit() {
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
        // A hang guard, not a timing assert (the forward's own timeout is 60 s).
        let got = tokio::time::timeout(
            Duration::from_secs(30),
            forward_http(&addr, "/v1/invoke/t/f", "Bearer x", None, b"{}"),
        )
        .await
        .expect("the forward kept reading an endless answer");
        let (status, body) = got.expect("an answer");
        assert_eq!(status, 502);
        assert!(String::from_utf8_lossy(&body).contains("answer_too_large"));
    }
}
