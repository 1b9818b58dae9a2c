//! `POST /v1/invoke/{tenant}/{name}` on a replica: check the tenant's
//! token, find the nodes hosting the function, and forward over QUIC to a
//! hosting agent connected to this replica; if none is connected here,
//! ask the other replicas over HTTP (once: the hop is marked with
//! `X-Gshare-Forwarded`). The answer is the agent's (same statuses as its
//! ingress).
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
const KEY: &str = crate::api::idempotency::HEADER;
/// How long a replica whose forward lost its answer keeps trying to reach
/// the agent again to ask what became of the key.
const RELEARN: Duration = Duration::from_secs(3);
/// Longest wait for an invocation still running when asked about its key.
const LOOKUP_WAIT: Duration = Duration::from_secs(60);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Largest answer read from a peer replica: an agent-wire frame (the
/// largest outcome an agent can send) and a head.
const MAX_FORWARDED_ANSWER: usize = AGENT_FRAME_BYTES + 64 * 1024;

fn error(status: u16, code: &str, message: &str) -> HttpResponse {
    HttpResponse::build(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY))
        .json(serde_json::json!({"error": {"code": code, "message": message}}))
}

fn outcome_unknown(key: &str, detail: &str) -> HttpResponse {
    HttpResponse::build(StatusCode::BAD_GATEWAY)
        .insert_header((KEY, key))
        .json(serde_json::json!({"error": {
            "code": "outcome_unknown",
            "message": format!("the invocation may or may not have run ({detail}); retry with {KEY}: {key}"),
            "retryable": true,
            "idempotency_key": key,
        }}))
}

fn outcome_response(outcome: InvokeOutcome) -> HttpResponse {
    match outcome {
        InvokeOutcome::Replayed {
            body_len,
            truncated: true,
            ..
        } => HttpResponse::Ok()
            .insert_header(("x-gshare-replayed", "truncated"))
            .json(serde_json::json!({"replayed_truncated": true, "body_len": body_len})),
        InvokeOutcome::Replayed { body, .. } => HttpResponse::Ok()
            .insert_header(("x-gshare-replayed", "1"))
            .body(body),
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

/// Why a forward to an agent got no answer.
enum Lost {
    /// No stream could be opened: the request never left.
    NotSent(String),
    /// The request may have reached the agent.
    AfterSend(String),
}

async fn forward_quic(
    conn: &quinn::Connection,
    req: InvokeRequest,
    key: &str,
) -> Result<InvokeOutcome, Lost> {
    let (mut send, mut recv) = conn
        .open_bi()
        .await
        .map_err(|e| Lost::NotSent(e.to_string()))?;
    let msg = RegionMessageV1::InvokeKeyed {
        key: key.to_string(),
        request: req,
    };
    let lost = |e: String| Lost::AfterSend(e);
    write_frame(&mut send, &RegionMessage::v1(msg))
        .await
        .map_err(|e| lost(e.to_string()))?;
    match read_frame::<AgentMessage>(&mut recv)
        .await
        .map_err(|e| lost(e.to_string()))?
    {
        AgentMessage::V1(AgentMessageV1::InvokeReply(r)) => Ok(r.outcome),
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

/// One HTTP/1.1 POST to a peer replica: `Ok` with its answer, or
/// `Err(sent)` with whether the request may have reached it.
async fn forward_http(
    addr: &str,
    path: &str,
    auth: &str,
    deadline: Option<&str>,
    key: &str,
    body: &[u8],
) -> Result<(u16, Vec<u8>), bool> {
    let mut s = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| false)?
        .map_err(|_| false)?;
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {auth}\r\n{FORWARDED}: 1\r\n{KEY}: {key}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(d) = deadline {
        head.push_str(&format!("{DEADLINE}: {d}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.map_err(|_| true)?;
    s.write_all(body).await.map_err(|_| true)?;
    let mut out = Vec::new();
    // A peer's answer carries at most an agent-wire frame's body; reading
    // stops one byte past the limit, whatever the peer sends.
    let limit = MAX_FORWARDED_ANSWER as u64;
    tokio::time::timeout(
        Duration::from_secs(60),
        (&mut s).take(limit.saturating_add(1)).read_to_end(&mut out),
    )
    .await
    .map_err(|_| true)?
    .map_err(|_| true)?;
    if out.len() > MAX_FORWARDED_ANSWER {
        let e = serde_json::json!({"error": {
            "code": "answer_too_large",
            "message": format!("the replica that served the invocation answered over {MAX_FORWARDED_ANSWER} bytes"),
            "retryable": false,
        }});
        return Ok((502, e.to_string().into_bytes()));
    }
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").ok_or(true)?;
    let status = std::str::from_utf8(&out[..split])
        .ok()
        .and_then(|h| h.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or(true)?;
    Ok((status, out[split + 4..].to_vec()))
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
    let key = match req.headers().get(KEY) {
        None => match crate::api::auth::new_secret() {
            Ok(secret) => format!("r{}-{}", ctx.replica.id, &secret[4..36]),
            Err(e) => return error(500, "internal", &e.to_string()),
        },
        Some(v) => match v
            .to_str()
            .ok()
            .filter(|k| gshare_core::state::is_valid_key(k))
        {
            Some(k) => k.to_string(),
            None => {
                return error(
                    400,
                    "invalid_idempotency_key",
                    "Idempotency-Key must be 1 to 128 printable ASCII characters",
                )
            }
        },
    };
    let keyed = |mut r: HttpResponse| {
        if let Ok(v) = actix_web::http::header::HeaderValue::from_str(&key) {
            r.headers_mut()
                .insert(actix_web::http::header::HeaderName::from_static(KEY), v);
        }
        r
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
        match forward_quic(&conn, request, &key).await {
            Ok(outcome) => return keyed(outcome_response(outcome)),
            Err(Lost::NotSent(e)) => {
                tracing::warn!(node = %node.0, "forwarding to agent failed: {e}")
            }
            Err(Lost::AfterSend(e)) => {
                tracing::warn!(node = %node.0, "forward to agent lost its answer: {e}");
                return match relearn(&ctx, node, &tenant, &key).await {
                    Some(outcome) => keyed(outcome_response(outcome)),
                    None => outcome_unknown(&key, &e),
                };
            }
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
        match forward_http(&peer, &path, &auth, deadline.as_deref(), &key, &body).await {
            Ok((status, body)) if status != 503 => {
                return keyed(
                    HttpResponse::build(
                        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                    )
                    .body(body),
                );
            }
            Ok(_) | Err(false) => {}
            // The peer may have forwarded it: another peer could run it twice.
            Err(true) => return outcome_unknown(&key, &format!("replica {peer} gave no answer")),
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
            forward_http(&addr, "/v1/invoke/t/f", "Bearer x", None, "k1", b"{}"),
        )
        .await
        .expect("the forward kept reading an endless answer");
        let (status, body) = got.expect("an answer");
        assert_eq!(status, 502);
        assert!(String::from_utf8_lossy(&body).contains("answer_too_large"));
    }
}
