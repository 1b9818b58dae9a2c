//! `POST /v1/topology/reload` (operator): reloads the topology from the
//! file named in the replica config, or from `{"toml": "..."}` in the body.
//! Nodes that disappear are drained (their instances released); the
//! leader's placement loop places them again.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::config::Topology;
use gshare_core::state::DomainCommand;

use super::prices::TomlBody;
use super::{auth, parse_json, propose, read_body, ApiError};
use crate::http::HttpContext;

async fn reload(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let raw = read_body(&req, payload).await?;
    let (name, text) = if raw.iter().all(u8::is_ascii_whitespace) {
        let path = ctx.api.topology_file.clone().ok_or_else(|| {
            ApiError::bad_request("no topology file configured; post {\"toml\": ...}")
        })?;
        let text = std::fs::read_to_string(&path).map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_config",
                format!("{}: {e}", path.display()),
            )
        })?;
        (path.display().to_string(), text)
    } else {
        let body: TomlBody = parse_json(&raw)?;
        ("(request body)".to_string(), body.toml)
    };
    let topology = Topology::from_toml(&name, &text).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_config",
            e.to_string(),
        )
    })?;
    let applied = propose(&ctx, DomainCommand::TopologyLoad { topology }).await?;
    Ok(HttpResponse::Ok().json(applied))
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/topology/reload", web::post().to(reload));
}
