//! `GET /v1/cluster/view` (operator): nodes, GPUs in use, instances,
//! drained nodes; `GET /v1/cluster/state`: the whole replicated domain
//! state of this replica as JSON (for audits and the tests' invariant
//! checks); `GET /v1/cluster/agents`: every agent linked to some replica,
//! with its latest heartbeat, its age (`age_ms`), the replica holding the
//! link and its swap counts, read from every replica
//! (`crate::agents::region_agents`; `?scope=replica`: only the agents
//! linked to this one). A replica that did not answer is named in the
//! header `X-Gshare-Replicas-Missing`. The agents' reports are never part
//! of `/v1/cluster/state`, which is the replicated state alone.

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
    /// What the node's agent reports, read from the replica holding its
    /// link (`None`: no replica that answered holds one).
    #[serde(default)]
    pub agent: Option<NodeAgentView>,
}

/// A node's agent in [`ClusterView`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeAgentView {
    /// The replica holding its link.
    pub replica: u64,
    /// Its version.
    pub version: String,
    /// Heartbeats received on the link.
    pub heartbeats: u64,
    /// Age of the latest heartbeat when the holder answered, ms.
    pub report_age_ms: Option<u64>,
    /// Its hosted instances by reported state (`cold`, `loading`,
    /// `resident`, `swapped_out`).
    pub instances: std::collections::BTreeMap<String, u32>,
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
    /// The replicas whose agent reports did not come (the agents linked to
    /// them show `agent: null`).
    #[serde(default)]
    pub agent_replicas_missing: Vec<u64>,
}

fn agent_view(r: &crate::agents::AgentReport) -> NodeAgentView {
    let mut instances = std::collections::BTreeMap::new();
    for i in r.heartbeat.iter().flat_map(|h| &h.instances) {
        *instances.entry(i.state.name().to_string()).or_insert(0) += 1;
    }
    NodeAgentView {
        replica: r.replica,
        version: r.version.clone(),
        heartbeats: r.heartbeats,
        report_age_ms: r.age_ms,
        instances,
    }
}

async fn view(req: HttpRequest, ctx: web::Data<HttpContext>) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let agents = ctx.replica.agents.gather().await;
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
                agent: agents.of_node(&n.name.0).map(agent_view),
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
        agent_replicas_missing: agents.missing(),
    }))
}

async fn state(req: HttpRequest, ctx: web::Data<HttpContext>) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let st = ctx.replica.state.read();
    Ok(HttpResponse::Ok().json(st.region.domain()))
}

/// The query of `GET /v1/cluster/agents`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentsQuery {
    /// `region` (default: every replica's agents) or `replica` (this one's).
    #[serde(default)]
    scope: Option<String>,
}

async fn agents(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    q: web::Query<AgentsQuery>,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let hub = &ctx.replica.agents;
    match q.scope.as_deref() {
        None | Some("region") => {
            let all = hub.gather().await;
            let missing = all.missing();
            let mut answer = HttpResponse::Ok();
            if !missing.is_empty() {
                let ids: Vec<String> = missing.iter().map(u64::to_string).collect();
                answer.insert_header(("x-gshare-replicas-missing", ids.join(",")));
            }
            Ok(answer.json(all.agents))
        }
        Some("replica") => Ok(HttpResponse::Ok().json(hub.local_part().agents)),
        Some(other) => Err(ApiError::new(
            actix_web::http::StatusCode::BAD_REQUEST,
            "bad_query",
            format!("scope must be region or replica, not {other:?}"),
        )),
    }
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/cluster/view", web::get().to(view))
        .route("/v1/cluster/agents", web::get().to(agents))
        .route("/v1/cluster/state", web::get().to(state));
}
