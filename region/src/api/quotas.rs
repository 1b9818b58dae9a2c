//! `PUT /v1/tenants/{t}/quotas/{kind}` (operator): one pool kind's quota.

use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::model::{PoolKind, TenantId};
use gshare_core::state::DomainCommand;

use super::tenants::{quota, QuotaBody};
use super::{auth, parse_json, propose, read_body, ApiError};
use crate::http::HttpContext;

async fn set(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let (tenant, kind) = path.into_inner();
    let pool_kind: PoolKind = kind
        .parse()
        .map_err(|e| ApiError::bad_request(format!("pool kind: {e}")))?;
    let body: QuotaBody = parse_json(&read_body(&req, payload).await?)?;
    let quota = quota(pool_kind, body)?;
    let applied = propose(
        &ctx,
        DomainCommand::QuotaSet {
            tenant: TenantId(tenant),
            pool_kind,
            quota,
        },
    )
    .await?;
    Ok(HttpResponse::Ok().json(applied))
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/tenants/{tenant}/quotas/{kind}", web::put().to(set));
}
