//! `GET /v1/nodes` (operator): every node of the topology with its
//! committed liveness (`pending`, `ready`, `not_ready`), whether it is
//! drained, its agent (id, version, when it registered), when any replica
//! last heard that agent, its GPUs and its instances.
//! `POST /v1/nodes/{node}/drain` and `/undrain` (operator): a drained node
//! takes no new placements and the leader places its instances elsewhere
//! (make-before-break where `max_instances` allows); undrain lets
//! placements back. Both are Raft entries (`NodeDrainSet`).

use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::model::NodeId;
use gshare_core::state::{DomainCommand, NodeState};
use serde::{Deserialize, Serialize};

use super::{auth, propose, ApiError};
use crate::http::HttpContext;

/// A node's agent as the replicated state knows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeAgent {
    /// The agent's id.
    pub id: String,
    /// Its version string.
    pub version: String,
    /// When it last registered (Unix ms).
    pub registered_at_ms: u64,
}

/// One row of `GET /v1/nodes`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeRow {
    /// The node.
    pub node: String,
    /// Its pool.
    pub pool: String,
    /// The pool's kind.
    pub pool_kind: String,
    /// Its committed liveness.
    pub state: NodeState,
    /// Since when (Unix ms; for `pending`, since it entered the topology).
    pub since_ms: u64,
    /// Drained by the operator.
    pub draining: bool,
    /// Whether a new instance may be placed on it.
    pub takes_placements: bool,
    /// Its agent, once one registered.
    pub agent: Option<NodeAgent>,
    /// How long ago a replica last heard its agent, ms (`None`: not
    /// heard since the replicas started).
    pub last_heartbeat_ms_ago: Option<u64>,
    /// GPUs in the topology.
    pub gpus: u32,
    /// GPUs its agent registered without.
    pub gpus_unavailable: u32,
    /// Instances holding a slice of it.
    pub instances: u32,
}

async fn list(req: HttpRequest, ctx: web::Data<HttpContext>) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let heard = ctx.replica.scheduler.heard(&ctx.replica.agents).await;
    let now = ctx.replica.proposer.now_ms();
    let st = ctx.replica.state.read();
    let d = st.region.domain();
    let mut rows = Vec::new();
    for pool in d.topology().into_iter().flat_map(|t| t.pools()) {
        for n in &pool.nodes {
            let status = d.node_status(&n.name);
            let agent = d
                .agents()
                .filter(|a| a.node == n.name)
                .max_by_key(|a| a.registered_at)
                .map(|a| NodeAgent {
                    id: a.id.0.clone(),
                    version: a.version.clone(),
                    registered_at_ms: a.registered_at,
                });
            rows.push(NodeRow {
                node: n.name.0.clone(),
                pool: pool.name.clone(),
                pool_kind: pool.kind.as_str().to_string(),
                state: d.node_state(&n.name),
                since_ms: status.map_or(0, |s| s.since),
                draining: status.is_some_and(|s| s.draining),
                takes_placements: d.takes_placements(&n.name),
                agent,
                last_heartbeat_ms_ago: heard.get(&n.name).map(|t| now.saturating_sub(*t)),
                gpus: n.gpu_count(),
                gpus_unavailable: d
                    .unavailable_gpus()
                    .get(&n.name)
                    .map_or(0, |g| g.len() as u32),
                instances: d.instances_on(&n.name).count() as u32,
            });
        }
    }
    Ok(HttpResponse::Ok().json(rows))
}

async fn set_drain(
    req: &HttpRequest,
    ctx: &HttpContext,
    node: String,
    drain: bool,
) -> Result<HttpResponse, ApiError> {
    auth::operator(req, ctx).await?;
    let applied = propose(
        ctx,
        DomainCommand::NodeDrainSet {
            node: NodeId(node),
            drain,
        },
    )
    .await?;
    Ok(HttpResponse::Ok().json(applied))
}

async fn drain(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    node: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    set_drain(&req, &ctx, node.into_inner(), true).await
}

async fn undrain(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    node: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    set_drain(&req, &ctx, node.into_inner(), false).await
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/nodes", web::get().to(list))
        .route("/v1/nodes/{node}/drain", web::post().to(drain))
        .route("/v1/nodes/{node}/undrain", web::post().to(undrain));
}
