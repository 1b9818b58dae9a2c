//! `/v1/prices`: the price list in force (any token) and a new one (operator).

use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::config::PriceList;
use gshare_core::state::DomainCommand;
use serde::Deserialize;

use super::{auth, parse_json, propose, read_body, ApiError};
use crate::http::HttpContext;

/// `PUT /v1/prices`: a `[pricing]` table in the topology file's schema.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TomlBody {
    pub(super) toml: String,
}

async fn get(req: HttpRequest, ctx: web::Data<HttpContext>) -> Result<HttpResponse, ApiError> {
    auth::caller(&req, &ctx).await?;
    let st = ctx.replica.state.read();
    match st.region.domain().price_list() {
        Some(list) => Ok(HttpResponse::Ok().json(list)),
        None => Err(ApiError::not_found("no price list yet (load a topology)")),
    }
}

async fn set(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let body: TomlBody = parse_json(&read_body(&req, payload).await?)?;
    let list = PriceList::from_toml("(request body)", &body.toml).map_err(|e| {
        ApiError::new(
            actix_web::http::StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_config",
            e.to_string(),
        )
    })?;
    let applied = propose(&ctx, DomainCommand::PriceListSet { list }).await?;
    Ok(HttpResponse::Ok().json(applied))
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/prices", web::get().to(get))
        .route("/v1/prices", web::put().to(set));
}
