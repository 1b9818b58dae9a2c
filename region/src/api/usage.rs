//! Usage: agents register and send metered batches (operator/agent token;
//! applied exactly once by (agent, seq) in the state machine); a tenant
//! reads its metered usage per hour.

use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::model::{NodeId, PoolKind, TenantId, Tier};
use gshare_core::state::{AgentId, DomainCommand, UsageRecord};
use serde::{Deserialize, Serialize};

use super::{auth, parse_json, propose, read_body, ApiError};
use crate::http::HttpContext;

/// `POST /v1/agents`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentBody {
    agent: String,
    node: String,
    version: String,
}

/// One record of `POST /v1/usage`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageRecordBody {
    /// Sequence number per agent, from 1.
    pub seq: u64,
    /// Tenant billed.
    pub tenant: String,
    /// Function metered.
    pub function: String,
    /// Its tier.
    pub tier: Tier,
    /// GPU model.
    pub gpu_model: String,
    /// Pool kind.
    pub pool_kind: PoolKind,
    /// milli-GPU × ms busy.
    pub compute_milli_gpu_ms: u64,
    /// MiB × ms resident.
    pub memory_mib_ms: u64,
    /// Invocations completed (optional, default 0).
    #[serde(default)]
    pub invocations: u64,
    /// End of the interval (Unix ms).
    pub end_ms: u64,
}

/// `POST /v1/usage`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageBatchBody {
    /// The sending agent (registered).
    pub agent: String,
    /// The records.
    pub records: Vec<UsageRecordBody>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Period {
    #[serde(default)]
    from: u64,
    #[serde(default)]
    to: Option<u64>,
}

async fn register(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let b: AgentBody = parse_json(&read_body(&req, payload).await?)?;
    let applied = propose(
        &ctx,
        DomainCommand::AgentRegister {
            agent: AgentId(b.agent),
            node: NodeId(b.node),
            version: b.version,
        },
    )
    .await?;
    Ok(HttpResponse::Ok().json(applied))
}

async fn apply_batch(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let b: UsageBatchBody = parse_json(&read_body(&req, payload).await?)?;
    let records = b
        .records
        .into_iter()
        .map(|r| UsageRecord {
            seq: r.seq,
            tenant: TenantId(r.tenant),
            function: r.function,
            tier: r.tier,
            gpu_model: r.gpu_model,
            pool_kind: r.pool_kind,
            compute_milli_gpu_ms: r.compute_milli_gpu_ms,
            memory_mib_ms: r.memory_mib_ms,
            invocations: r.invocations,
            end_ms: r.end_ms,
        })
        .collect();
    let applied = propose(
        &ctx,
        DomainCommand::UsageBatch {
            agent: AgentId(b.agent),
            records,
        },
    )
    .await?;
    Ok(HttpResponse::Ok().json(applied))
}

async fn usage(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    q: web::Query<Period>,
) -> Result<HttpResponse, ApiError> {
    let tenant = auth::tenant(&req, &ctx).await?;
    usage_of(&ctx, &tenant, &q)
}

/// `GET /v1/tenants/{tenant}/usage` (operator): a tenant's usage, also
/// after the tenant was deleted.
async fn usage_for_operator(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<String>,
    q: web::Query<Period>,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    usage_of(&ctx, &TenantId(path.into_inner()), &q)
}

fn usage_of(ctx: &HttpContext, tenant: &TenantId, q: &Period) -> Result<HttpResponse, ApiError> {
    let st = ctx.replica.state.read();
    let lines = st
        .region
        .domain()
        .usage(tenant, q.from, q.to.unwrap_or(u64::MAX))
        .map_err(|e| ApiError::from_query(&e))?;
    Ok(HttpResponse::Ok().json(lines))
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/agents", web::post().to(register))
        .route("/v1/usage", web::post().to(apply_batch))
        .route("/v1/usage", web::get().to(usage))
        .route(
            "/v1/tenants/{tenant}/usage",
            web::get().to(usage_for_operator),
        );
}
