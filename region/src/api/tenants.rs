//! `/v1/tenants` (operator): create, update, list, delete.

use std::collections::BTreeMap;

use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::bounds;
use gshare_core::model::{PoolKind, Quota, TenantId};
use gshare_core::state::DomainCommand;
use serde::{Deserialize, Serialize};

use super::{auth, parse_json, propose, read_body, ApiError};
use crate::http::HttpContext;

/// A quota as written in requests.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaBody {
    /// Compute in milli-GPU.
    pub compute_milli: u64,
    /// GPU memory in MiB.
    pub memory_mib: u64,
    /// Instances.
    pub instances: u32,
}

impl From<QuotaBody> for Quota {
    fn from(q: QuotaBody) -> Quota {
        Quota {
            compute_milli: q.compute_milli,
            memory_mib: q.memory_mib,
            instances: q.instances,
        }
    }
}

/// `POST /v1/tenants`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTenant {
    name: String,
    #[serde(default)]
    display_name: Option<String>,
    #[serde(default)]
    quotas: BTreeMap<PoolKind, QuotaBody>,
}

/// `PUT /v1/tenants/{t}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantChange {
    #[serde(default)]
    display_name: Option<String>,
    #[serde(default)]
    quotas: Option<BTreeMap<PoolKind, QuotaBody>>,
}

/// One tenant in `GET /v1/tenants`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TenantView {
    /// Name.
    pub name: String,
    /// Name for humans.
    pub display_name: Option<String>,
    /// Quota per pool kind.
    pub quotas: BTreeMap<PoolKind, Quota>,
    /// What it holds per pool kind.
    pub held: BTreeMap<PoolKind, Quota>,
    /// Token ids (never secrets or digests).
    pub tokens: Vec<String>,
}

/// The quotas of a request, each within the bounds apply re-checks.
fn quotas(q: BTreeMap<PoolKind, QuotaBody>) -> Result<BTreeMap<PoolKind, Quota>, ApiError> {
    q.into_iter().map(|(k, v)| Ok((k, quota(k, v)?))).collect()
}

/// One pool kind's quota of a request, within its bounds.
pub(super) fn quota(kind: PoolKind, q: QuotaBody) -> Result<Quota, ApiError> {
    let q = Quota::from(q);
    bounds::check_quota(&format!("quotas.{kind}"), &q).map_err(ApiError::from_bounds)?;
    Ok(q)
}

async fn create(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let body: NewTenant = parse_json(&read_body(&req, payload).await?)?;
    let applied = propose(
        &ctx,
        DomainCommand::TenantCreate {
            tenant: TenantId(body.name),
            display_name: body.display_name,
            quotas: quotas(body.quotas)?,
        },
    )
    .await?;
    Ok(HttpResponse::Created().json(applied))
}

async fn update(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let body: TenantChange = parse_json(&read_body(&req, payload).await?)?;
    let applied = propose(
        &ctx,
        DomainCommand::TenantUpdate {
            tenant: TenantId(path.into_inner()),
            display_name: body.display_name,
            quotas: body.quotas.map(quotas).transpose()?,
        },
    )
    .await?;
    Ok(HttpResponse::Ok().json(applied))
}

async fn list(req: HttpRequest, ctx: web::Data<HttpContext>) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let st = ctx.replica.state.read();
    let d = st.region.domain();
    let views: Vec<TenantView> = d
        .tenants()
        .map(|t| TenantView {
            name: t.id.0.clone(),
            display_name: t.display_name.clone(),
            quotas: t.quotas.clone(),
            held: [PoolKind::Center, PoolKind::Edge]
                .into_iter()
                .map(|k| (k, d.held(&t.id, k)))
                .collect(),
            tokens: t.tokens.keys().cloned().collect(),
        })
        .collect();
    Ok(HttpResponse::Ok().json(views))
}

/// The query of `DELETE /v1/tenants/{t}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteQuery {
    /// Delete the tenant's functions too.
    #[serde(default)]
    force: bool,
}

/// `DELETE /v1/tenants/{t}[?force=true]`: refused (`409
/// tenant_has_functions`) while the tenant has functions, unless `force`.
/// Its usage and bills stay readable by the operator.
async fn delete(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<String>,
    q: web::Query<DeleteQuery>,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let applied = propose(
        &ctx,
        DomainCommand::TenantDelete {
            tenant: TenantId(path.into_inner()),
            force: q.force,
        },
    )
    .await?;
    Ok(HttpResponse::Ok().json(applied))
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/tenants", web::post().to(create))
        .route("/v1/tenants/{tenant}", web::delete().to(delete))
        .route("/v1/tenants", web::get().to(list))
        .route("/v1/tenants/{tenant}", web::put().to(update));
}
