//! The domain API under `/v1/` (issue 5): one file per resource.
//!
//! | route | who | file |
//! |---|---|---|
//! | `GET/POST /v1/tenants`, `PUT/DELETE /v1/tenants/{t}` | operator | `tenants.rs` |
//! | `POST /v1/tenants/{t}/tokens`, `DELETE /v1/tenants/{t}/tokens/{id}` | operator | `tokens.rs` |
//! | `PUT /v1/tenants/{t}/quotas/{kind}` | operator | `quotas.rs` |
//! | `GET /v1/prices` (any token), `PUT /v1/prices` | operator | `prices.rs` |
//! | `POST /v1/topology/reload` | operator | `topology.rs` |
//! | `GET /v1/cluster/view`, `GET /v1/cluster/state`, `GET /v1/cluster/agents` | operator | `cluster_view.rs` |
//! | `POST/GET /v1/functions`, `GET/PUT/DELETE /v1/functions/{name}` | tenant | `functions.rs` |
//! | `GET /v1/tenants/{t}/functions[/{name}]`, `GET /v1/tenants/{t}/usage` | operator | `functions.rs`, `usage.rs` |
//! | `GET /v1/cluster/nodes/{node}` | operator | `node_describe.rs` |
//! | `GET /v1/nodes`, `POST /v1/nodes/{node}/drain`, `POST /v1/nodes/{node}/undrain` | operator | `nodes.rs` |
//! | `POST /v1/agents`, `POST /v1/usage` | operator (agents) | `usage.rs` |
//! | `GET /v1/usage`, `GET /v1/bill?from=&to=` | tenant | `usage.rs`, `bill.rs` |
//!
//! Writes go through the replica's [`crate::proposer::Proposer`] (a follower
//! forwards them to the leader); reads answer from this replica's applied
//! state. Every refusal is `{"error": {"code", "message", "retryable"}}`
//! with the header `X-Gshare-Error: <code>` ([`ApiError`]).
//! Bodies are parsed only after the token is checked, with unknown fields
//! refused, and are limited to [`MAX_BODY`] bytes (413 beyond).

pub mod auth;
mod bill;
mod cluster_view;
pub mod error;
pub mod function_move;
pub mod functions;
pub mod idempotency;
pub mod metrics;
mod node_describe;
mod nodes;
mod prices;
mod quotas;
mod tenants;
mod tokens;
mod topology;
mod usage;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest};
use gshare_core::command::{CommandOutcome, RegionCommand};
use gshare_core::state::{Applied, DomainCommand};

pub use error::ApiError;
pub use metrics::ApiState;

use crate::http::HttpContext;

/// Largest request body accepted, in bytes.
pub const MAX_BODY: usize = 1 << 20;

/// Reads a request body of at most [`MAX_BODY`] bytes (413 beyond).
pub async fn read_body(req: &HttpRequest, payload: web::Payload) -> Result<web::Bytes, ApiError> {
    read_body_limited(req, payload, MAX_BODY).await
}

/// Reads a request body of at most `limit` bytes: `413 body_too_large`
/// beyond (call after the token is checked, so a stranger learns nothing).
pub async fn read_body_limited(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
) -> Result<web::Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("request body over {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    match payload.to_bytes_limited(limit).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(e)) => Err(ApiError::bad_request(format!("reading body: {e}"))),
        Err(_) => Err(too_large()),
    }
}

/// Parses a JSON body (call after authorization).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed_body",
            format!("request body: {e}"),
        )
    })
}

/// Proposes one domain command and waits for its outcome.
pub async fn propose(ctx: &HttpContext, command: DomainCommand) -> Result<Applied, ApiError> {
    match ctx
        .replica
        .proposer
        .propose(RegionCommand::domain(command))
        .await
    {
        Ok(CommandOutcome::Domain(Ok(applied))) => Ok(applied),
        Ok(CommandOutcome::Domain(Err(e))) => Err(ApiError::from_apply(&e)),
        Ok(other) => Err(ApiError::internal(format!("unexpected outcome {other:?}"))),
        Err(e) => Err(ApiError::from_write(&e)),
    }
}

/// Registers the domain routes.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.app_data(web::QueryConfig::default().error_handler(|e, _| {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_query", e.to_string()).into()
    }))
    .app_data(web::PathConfig::default().error_handler(|e, _| {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_path", e.to_string()).into()
    }));
    tenants::routes(cfg);
    tokens::routes(cfg);
    quotas::routes(cfg);
    prices::routes(cfg);
    topology::routes(cfg);
    cluster_view::routes(cfg);
    node_describe::routes(cfg);
    nodes::routes(cfg);
    functions::routes(cfg);
    function_move::routes(cfg);
    usage::routes(cfg);
    bill::routes(cfg);
}
