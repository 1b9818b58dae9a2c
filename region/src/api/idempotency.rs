//! Idempotency keys of function deploys and deletes.
//!
//! ```text
//!  request ─▶ key = Idempotency-Key header | assigned here ("r<replica>-<random>")
//!          ─▶ fingerprint = SHA-256(method, path, body)
//!          ─▶ propose Keyed { tenant, key, fingerprint, command }
//!               answered ─▶ the outcome (a replay of the key: the first outcome)
//!               lost (forward or leader failed mid-write) ─▶ propose the same again:
//!                   the state machine applies it once, so the answer is the first outcome
//!               still lost ─▶ 502 outcome_unknown, retryable, with the key
//! ```
//!
//! The state machine records a key with the outcome of the command it
//! applied (successes only: a refusal changed nothing) for
//! [`gshare_core::state::KEY_WINDOW_MS`], at most
//! [`gshare_core::state::MAX_KEYS_PER_TENANT`] keys per tenant. Every answer
//! of a keyed write names its key in the `Idempotency-Key` header (and in
//! the error body), so a client that sent none can retry with it.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::HttpRequest;
use gshare_core::command::{CommandOutcome, RegionCommand};
use gshare_core::model::TenantId;
use gshare_core::state::{is_valid_key, Applied, DomainCommand, KeyLookup, MAX_KEY_LEN};

use super::ApiError;
use crate::http::HttpContext;
use crate::proposer::WriteError;

/// The request and answer header carrying the key.
pub const HEADER: &str = "idempotency-key";
/// Proposals of one keyed write before its outcome is given up as unknown.
pub const LEARN_ATTEMPTS: u32 = 4;

/// The idempotency key of one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteKey {
    /// The key.
    pub key: String,
    /// Whether the client sent it (else this replica assigned it).
    pub from_client: bool,
    /// What the request was.
    pub fingerprint: String,
}

/// The request's key (400 `invalid_idempotency_key` if it is malformed), or a
/// fresh one, and the request's fingerprint.
pub fn write_key(req: &HttpRequest, ctx: &HttpContext, body: &[u8]) -> Result<WriteKey, ApiError> {
    let fingerprint = fingerprint(req.method().as_str(), req.path(), body);
    match req.headers().get(HEADER) {
        Some(v) => {
            let key = v.to_str().ok().filter(|k| is_valid_key(k)).ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_idempotency_key",
                    format!("{HEADER}: 1 to {MAX_KEY_LEN} printable ASCII characters"),
                )
            })?;
            Ok(WriteKey {
                key: key.to_string(),
                from_client: true,
                fingerprint,
            })
        }
        None => {
            let secret = super::auth::new_secret()?;
            let random = secret.trim_start_matches("gst_");
            Ok(WriteKey {
                key: format!("r{}-{}", ctx.replica.id, &random[..32]),
                from_client: false,
                fingerprint,
            })
        }
    }
}

/// SHA-256 (hex) of method, path and body.
pub fn fingerprint(method: &str, path: &str, body: &[u8]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(method.as_bytes());
    ctx.update(b" ");
    ctx.update(path.as_bytes());
    ctx.update(b"\n");
    ctx.update(body);
    ctx.finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What this replica's applied view holds for the key (it may lag the leader).
pub fn local_lookup(ctx: &HttpContext, tenant: &TenantId, key: &WriteKey) -> KeyLookup {
    let st = ctx.replica.state.read();
    st.region.domain().idempotency().lookup(
        tenant,
        &key.key,
        &key.fingerprint,
        ctx.replica.proposer.now_ms(),
    )
}

/// Proposes `command` under `key` and waits for its outcome. When the
/// outcome of a proposal is lost, the same keyed command is proposed again
/// (the state machine applies it at most once and replays the first
/// outcome); only when that also stays unknown is the answer 502
/// `outcome_unknown`. Every error names the key.
pub async fn propose_keyed(
    ctx: &HttpContext,
    tenant: &TenantId,
    key: &WriteKey,
    command: DomainCommand,
) -> Result<Applied, ApiError> {
    let keyed = RegionCommand::domain(DomainCommand::Keyed {
        tenant: tenant.clone(),
        key: key.key.clone(),
        fingerprint: key.fingerprint.clone(),
        command: Box::new(command),
    });
    let mut unknown: Option<String> = None;
    for attempt in 0..LEARN_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(250 * u64::from(attempt))).await;
        }
        match ctx.replica.proposer.propose(keyed.clone()).await {
            Ok(CommandOutcome::Domain(Ok(applied))) => return Ok(applied),
            Ok(CommandOutcome::Domain(Err(e))) => {
                return Err(ApiError::from_apply(&e).with_key(&key.key))
            }
            Ok(other) => {
                return Err(
                    ApiError::internal(format!("unexpected outcome {other:?}")).with_key(&key.key)
                )
            }
            Err(WriteError::Unknown(detail)) => unknown = Some(detail),
            // This proposal was not appended; an earlier one may have been.
            Err(e) if unknown.is_some() && e.retryable() => {}
            Err(e) => return Err(ApiError::from_write(&e).with_key(&key.key)),
        }
    }
    Err(ApiError::outcome_unknown(format!(
        "the write may or may not have taken effect ({}); retry with {HEADER}: {}",
        unknown.unwrap_or_default(),
        key.key
    ))
    .with_key(&key.key))
}
