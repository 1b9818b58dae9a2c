//! `GET /v1/cluster/view` (operator): nodes, GPUs in use, instances,
//! drained nodes; `GET /v1/cluster/state`: the whole replicated domain
//! state of this replica as JSON (for audits and the tests' invariant
//! checks); `GET /v1/cluster/agents`: the agents connected to this replica
//! with their latest heartbeat and swap counts (not replicated: ask the
//! replica holding the agent's link).

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};

use super::{auth, ApiError};
use crate::http::HttpContext;

/// One node in [`ClusterView`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeView {
    /// Node name.
    pub node: String,
    /// GPUs.
    pub gpus: u32,
    /// GPUs with something placed.
    pub gpus_in_use: u32,
    /// Instances on the node.
    pub instances: u32,
}

/// The answer of `GET /v1/cluster/view`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterView {
    /// Applied time of the state (Unix ms).
    pub now_ms: u64,
    /// Tenants.
    pub tenants: u32,
    /// Functions.
    pub functions: u32,
    /// Instances.
    pub instances: u32,
    /// Functions below `min_instances`.
    pub underplaced: u32,
    /// Active nodes.
    pub nodes: Vec<NodeView>,
    /// Drained nodes.
    pub drained: Vec<String>,
}

async fn view(req: HttpRequest, ctx: web::Data<HttpContext>) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let st = ctx.replica.state.read();
    let d = st.region.domain();
    let mut per_node = std::collections::BTreeMap::<String, u32>::new();
    for i in d.instances() {
        if let Some(s) = i.slices.first() {
            *per_node.entry(s.gpu.node.0.clone()).or_default() += 1;
        }
    }
    let nodes = d
        .topology()
        .into_iter()
        .flat_map(|t| t.nodes())
        .map(|n| {
            let load = d.node_load(&n.name);
            NodeView {
                node: n.name.0.clone(),
                gpus: n.gpu_count(),
                gpus_in_use: load.map_or(0, |l| {
                    l.gpus.iter().filter(|g| !g.instances.is_empty()).count() as u32
                }),
                instances: per_node.get(&n.name.0).copied().unwrap_or(0),
            }
        })
        .collect();
    Ok(HttpResponse::Ok().json(ClusterView {
        now_ms: st.region.now_ms(),
        tenants: d.tenants().count() as u32,
        functions: d.functions().count() as u32,
        instances: d.instances().count() as u32,
        underplaced: d.underplaced().len() as u32,
        nodes,
        drained: d.drained().keys().map(|n| n.0.clone()).collect(),
    }))
}

async fn state(req: HttpRequest, ctx: web::Data<HttpContext>) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let st = ctx.replica.state.read();
    Ok(HttpResponse::Ok().json(st.region.domain()))
}

async fn agents(req: HttpRequest, ctx: web::Data<HttpContext>) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    Ok(HttpResponse::Ok().json(ctx.replica.agents.reports.list()))
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/cluster/view", web::get().to(view))
        .route("/v1/cluster/agents", web::get().to(agents))
        .route("/v1/cluster/state", web::get().to(state));
}
