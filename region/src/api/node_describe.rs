//! `GET /v1/cluster/nodes/{node}` (operator): one node as the region sees
//! it: its pool, whether it is drained, each GPU with its model, size,
//! what is reserved on it and the instances placed there (tenant,
//! function, tier, slice), the agent registered for it (replicated), and
//! the latest report of its agent if the agent is linked to this replica.

use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::model::{NodeId, Tier};
use gshare_core::state::InstanceId;
use serde::{Deserialize, Serialize};

use super::{auth, ApiError};
use crate::agents::AgentReport;
use crate::http::HttpContext;

/// One instance on a GPU of the node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeInstance {
    /// Its id.
    pub instance: InstanceId,
    /// Owner.
    pub tenant: String,
    /// Function.
    pub function: String,
    /// Tier.
    pub tier: Tier,
    /// Its slice on this GPU: compute, milli-GPU.
    pub compute_milli: u32,
    /// Its slice on this GPU: memory, MiB.
    pub memory_mib: u64,
}

/// One GPU of the node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeGpuView {
    /// Index on the node.
    pub index: u32,
    /// Model.
    pub model: String,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// `false` when its agent registered without it.
    pub available: bool,
    /// Reserved compute (exclusive, guaranteed), milli-GPU.
    pub reserved_compute: u32,
    /// Compute of burstable instances, milli-GPU.
    pub burst_compute: u32,
    /// Reserved resident memory, MiB.
    pub resident_mib: u64,
    /// Memory of oversubscribed instances, MiB.
    pub oversub_mib: u64,
    /// What is placed on it.
    pub instances: Vec<NodeInstance>,
}

/// The answer of `GET /v1/cluster/nodes/{node}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeDescription {
    /// Node name.
    pub node: String,
    /// Its pool.
    pub pool: String,
    /// The pool's kind.
    pub kind: String,
    /// Host memory for swapped-out weights, MiB.
    pub swap_mib: u64,
    /// Its GPUs.
    pub gpus: Vec<NodeGpuView>,
    /// The agent registered for it in the replicated state (any replica
    /// answers the same), if one registered.
    pub registered: Option<RegisteredAgent>,
    /// Its agent's latest report, when the agent is linked to this replica.
    pub agent: Option<AgentReport>,
}

/// An agent's registration as the replicated state holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegisteredAgent {
    /// The agent's id.
    pub agent: String,
    /// Its version.
    pub version: String,
    /// When it last registered (Unix ms).
    pub registered_at: u64,
}

async fn describe(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let id = NodeId(path.into_inner());
    let agent = ctx
        .replica
        .agents
        .reports
        .list()
        .into_iter()
        .find(|r| r.node == id.0);
    let st = ctx.replica.state.read();
    let d = st.region.domain();
    let node = d.topology().and_then(|t| t.node(&id.0)).ok_or_else(|| {
        let why = if d.drained().contains_key(&id) {
            "was removed from the topology and is draining"
        } else {
            "is not in the topology"
        };
        ApiError::new(
            actix_web::http::StatusCode::NOT_FOUND,
            "not_found",
            format!("node {id} {why}"),
        )
    })?;
    let registered = d
        .agents()
        .filter(|a| a.node == id)
        .max_by_key(|a| a.registered_at)
        .map(|a| RegisteredAgent {
            agent: a.id.0.clone(),
            version: a.version.clone(),
            registered_at: a.registered_at,
        });
    let load = d.node_load(&id);
    let gpus = node
        .gpus()
        .map(|(gpu, group)| {
            let slot = load.and_then(|l| l.gpus.get(gpu.index as usize));
            let instances = slot
                .map(|s| s.instances.as_slice())
                .unwrap_or_default()
                .iter()
                .filter_map(|&i| d.instance(i))
                .map(|i| {
                    let sl = i.slices.iter().find(|s| s.gpu == gpu);
                    NodeInstance {
                        instance: i.id,
                        tenant: i.tenant.0.clone(),
                        function: i.function.clone(),
                        tier: i.tier,
                        compute_milli: sl.map_or(0, |s| s.compute_milli),
                        memory_mib: sl.map_or(0, |s| s.memory_mib),
                    }
                })
                .collect();
            NodeGpuView {
                index: gpu.index,
                model: group.model.clone(),
                memory_mib: slot.map_or(group.memory_mib, |s| s.capacity.memory_mib),
                available: slot.is_none_or(|s| s.capacity.available),
                reserved_compute: slot.map_or(0, |s| s.load.reserved_compute),
                burst_compute: slot.map_or(0, |s| s.load.burst_compute),
                resident_mib: slot.map_or(0, |s| s.load.resident_mib),
                oversub_mib: slot.map_or(0, |s| s.load.oversub_mib),
                instances,
            }
        })
        .collect();
    Ok(HttpResponse::Ok().json(NodeDescription {
        node: id.0.clone(),
        pool: node.pool.clone(),
        kind: node.kind.to_string(),
        swap_mib: node.swap_mib,
        gpus,
        registered,
        agent,
    }))
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/cluster/nodes/{node}", web::get().to(describe));
}
