//! `GET /v1/bill?from=&to=` (tenant: its own) and
//! `GET /v1/tenants/{t}/bill?from=&to=` (operator): metered usage × price,
//! integers in the price list's smallest unit. `from`/`to` are Unix ms
//! (hour-aligned periods; `to` defaults to the end of time).

use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::model::TenantId;
use serde::Deserialize;

use super::{auth, ApiError};
use crate::http::HttpContext;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Period {
    #[serde(default)]
    from: u64,
    #[serde(default)]
    to: Option<u64>,
}

fn bill_of(ctx: &HttpContext, tenant: &TenantId, q: &Period) -> Result<HttpResponse, ApiError> {
    let st = ctx.replica.state.read();
    let to = q.to.unwrap_or(u64::MAX - gshare_core::state::HOUR_MS);
    if to < q.from {
        return Err(ApiError::bad_request("to is before from"));
    }
    let bill = st
        .region
        .domain()
        .bill(tenant, q.from, to)
        .map_err(|e| ApiError::from_query(&e))?;
    Ok(HttpResponse::Ok().json(bill))
}

async fn own(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    q: web::Query<Period>,
) -> Result<HttpResponse, ApiError> {
    let tenant = auth::tenant(&req, &ctx).await?;
    bill_of(&ctx, &tenant, &q)
}

async fn of_tenant(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<String>,
    q: web::Query<Period>,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    bill_of(&ctx, &TenantId(path.into_inner()), &q)
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/bill", web::get().to(own))
        .route("/v1/tenants/{tenant}/bill", web::get().to(of_tenant));
}
