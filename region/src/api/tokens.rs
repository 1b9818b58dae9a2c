//! `/v1/tenants/{t}/tokens` (operator): issue (the plaintext is answered
//! once; only its SHA-256 digest enters the log) and revoke.

use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::model::TenantId;
use gshare_core::protocol::token_digest;
use gshare_core::state::DomainCommand;
use serde::{Deserialize, Serialize};

use super::{auth, parse_json, propose, read_body, ApiError};
use crate::http::HttpContext;

/// `POST /v1/tenants/{t}/tokens` (body optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewToken {
    #[serde(default)]
    token_id: Option<String>,
}

/// The answer of an issue: the only time the secret is shown.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IssuedToken {
    /// The tenant.
    pub tenant: String,
    /// The token's public id.
    pub token_id: String,
    /// The bearer secret.
    pub token: String,
}

async fn issue(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let raw = read_body(&req, payload).await?;
    let body: NewToken = if raw.iter().all(u8::is_ascii_whitespace) {
        NewToken::default()
    } else {
        parse_json(&raw)?
    };
    let secret = auth::new_secret()?;
    let token_id = match body.token_id {
        Some(id) => id,
        None => format!("t-{}", &token_digest(&secret)[..12]),
    };
    let tenant = path.into_inner();
    propose(
        &ctx,
        DomainCommand::TokenIssue {
            tenant: TenantId(tenant.clone()),
            token_id: token_id.clone(),
            digest: token_digest(&secret),
        },
    )
    .await?;
    Ok(HttpResponse::Created().json(IssuedToken {
        tenant,
        token_id,
        token: secret,
    }))
}

async fn revoke(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let (tenant, token_id) = path.into_inner();
    let applied = propose(
        &ctx,
        DomainCommand::TokenRevoke {
            tenant: TenantId(tenant),
            token_id,
        },
    )
    .await?;
    Ok(HttpResponse::Ok().json(applied))
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/tenants/{tenant}/tokens", web::post().to(issue))
        .route(
            "/v1/tenants/{tenant}/tokens/{token_id}",
            web::delete().to(revoke),
        );
}
