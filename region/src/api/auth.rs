//! Who is calling: `Authorization: Bearer <token>`.
//!
//! The operator's token comes from the replica config (a file); a tenant's
//! token is looked up by its digest (`gshare_core::protocol::token_digest`,
//! the agents' too) in the replicated state, so the
//! plaintext exists only in the answer that issued it.

use actix_web::http::StatusCode;
use actix_web::HttpRequest;
use gshare_core::http_surface::bearer_token;
use gshare_core::model::TenantId;
use gshare_core::protocol::token_digest;

use super::error::ApiError;
use crate::http::HttpContext;

/// The authenticated caller of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The operator (token from the replica config).
    Operator,
    /// A tenant, by one of its tokens.
    Tenant(TenantId),
}

/// A fresh random secret: `gst_` and 64 hex digits (256 bits).
pub fn new_secret() -> Result<String, ApiError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| ApiError::internal("no randomness"))?;
    Ok(format!(
        "gst_{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
}

/// The request's bearer token under the one strict rule
/// ([`bearer_token`]: nothing trimmed), or 401.
pub fn bearer(req: &HttpRequest) -> Result<&str, ApiError> {
    let header = req
        .headers()
        .get("authorization")
        .ok_or_else(|| unauthorized("missing Authorization: Bearer <token>"))?
        .to_str()
        .map_err(|_| unauthorized("the Authorization header is not visible ASCII"))?;
    bearer_token(header).map_err(|e| unauthorized(&e.to_string()))
}

/// Whether `token` has the shape [`new_secret`] gives (`gst_` and 64 hex
/// digits): only such a token is worth a read barrier.
fn issued_shape(token: &str) -> bool {
    token
        .strip_prefix("gst_")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn owner(ctx: &HttpContext, digest: &str) -> Option<TenantId> {
    let st = ctx.replica.state.read();
    st.region
        .domain()
        .token_owner(digest)
        .map(|(tenant, _)| tenant.clone())
}

/// Authenticates the request (401 without a known token).
///
/// A token this replica does not know may have been issued a moment ago
/// and not yet be applied here: before a definite 401 the replica catches
/// up with the leader's commit index ([`crate::proposer::Proposer::read_barrier`]),
/// so a token is good on every replica as soon as its issue was answered.
/// (A revoked token may still pass on a replica that has not applied the
/// revocation, for the replication lag.)
pub async fn caller(req: &HttpRequest, ctx: &HttpContext) -> Result<Caller, ApiError> {
    let token = bearer(req)?;
    let digest = token_digest(token);
    // Compare digests, not secrets: equal-length strings, no early exit on a prefix.
    if digest == token_digest(&ctx.operator_token) {
        return Ok(Caller::Operator);
    }
    if let Some(tenant) = owner(ctx, &digest) {
        return Ok(Caller::Tenant(tenant));
    }
    if !issued_shape(token) {
        return Err(unauthorized("unknown or revoked token"));
    }
    ctx.replica.proposer.read_barrier().await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "token_unverified",
            format!("this replica cannot check the token with the leader now ({e}); retry"),
        )
    })?;
    match owner(ctx, &digest) {
        Some(tenant) => Ok(Caller::Tenant(tenant)),
        None => Err(unauthorized("unknown or revoked token")),
    }
}

/// The operator, or 401/403.
pub async fn operator(req: &HttpRequest, ctx: &HttpContext) -> Result<(), ApiError> {
    match caller(req, ctx).await? {
        Caller::Operator => Ok(()),
        Caller::Tenant(_) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this route needs the operator token",
        )),
    }
}

/// A tenant, or 401/403 (the operator has no functions of its own).
pub async fn tenant(req: &HttpRequest, ctx: &HttpContext) -> Result<TenantId, ApiError> {
    match caller(req, ctx).await? {
        Caller::Tenant(t) => Ok(t),
        Caller::Operator => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this route needs a tenant token (the operator reads tenants under /v1/tenants)",
        )),
    }
}
