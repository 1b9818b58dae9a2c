//! `POST /v1/tenants/{tenant}/functions/{name}/move` (operator): moves a
//! function's instances into a pool, the center or a node, one at a time
//! and make-before-break. Body `{"to": "<target>"}`: `center`, a pool's
//! or a node's name, or `pool:<name>` / `node:<name>` where a name is both.
//!
//! ```text
//!   for each instance of the current version not in the target:
//!      Evaluation::Migrate { cause: Operator } ─▶ the leader plans it (plan_move)
//!         ─▶ InstanceMigrate: the new instance beside the old
//!      wait until the leader's migration tick ends it:
//!         the old one released ─▶ completed    the new one released ─▶ given_up
//! ```
//!
//! The answer lists every move with its outcome (`in_progress` if the
//! wait ran out; the leader still ends it). A move that cannot start stops
//! the walk: `409 no_room` (the target has no room; the best place is
//! named), or the planner's answer (`gpu_full`, `quota_exceeded`, ...);
//! the moves before it stand and are listed in the error's message. The leader
//! never moves an instance an operator placed back to its pool preference.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::model::{NodeId, TenantId};
use gshare_core::state::{Applied, InstanceId, MigrationCause, MoveTarget};
use serde::{Deserialize, Serialize};

use super::{auth, parse_json, read_body, ApiError};
use crate::http::HttpContext;
use crate::scheduler::{EvalError, Evaluation, MIGRATION_WAIT};

/// The body of a move.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveBody {
    /// `center`, a pool or node name, `pool:<name>` or `node:<name>`.
    pub to: String,
}

/// One instance moved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveView {
    /// The instance that moved.
    pub from: InstanceId,
    /// The instance placed for it.
    pub to: InstanceId,
    /// The new instance's node.
    pub node: NodeId,
    /// `completed` (the old one is released), `given_up` (the new one did
    /// not become ready; the old one stays) or `in_progress`.
    pub outcome: String,
}

/// The answer of a move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveAnswer {
    /// The target, as understood.
    pub target: String,
    /// The moves made, in order.
    pub moves: Vec<MoveView>,
    /// Instances that were in the target already.
    pub already_there: u32,
}

/// How often a move looks at the applied state while it waits.
const POLL: Duration = Duration::from_millis(100);

async fn move_function(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let (tenant, name) = path.into_inner();
    let tenant = TenantId(tenant);
    let body: MoveBody = parse_json(&read_body(&req, payload).await?)?;
    let (target, todo, already_there) = {
        let st = ctx.replica.state.read();
        let d = st.region.domain();
        if d.tenant(&tenant).is_none() {
            return Err(ApiError::not_found(format!("no tenant {tenant}")));
        }
        let f = d
            .function(&tenant, &name)
            .map_err(|e| ApiError::from_query(&e))?;
        let topology = d
            .topology()
            .ok_or_else(|| ApiError::bad_request("no topology is loaded"))?;
        let target = MoveTarget::parse(topology, body.to.trim())
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_target", e))?;
        let current: Vec<_> = d
            .instances_of(&tenant, &name)
            .filter(|i| i.version == f.version && d.migration_of(i.id).is_none())
            .collect();
        let todo: Vec<InstanceId> = current
            .iter()
            .filter(|i| !target.holds(i))
            .map(|i| i.id)
            .collect();
        let there = (current.len() - todo.len()) as u32;
        (target, todo, there)
    };
    let mut moves = Vec::new();
    for instance in todo {
        let eval = Evaluation::Migrate {
            instance,
            target: target.clone(),
            cause: MigrationCause::Operator,
        };
        let done = match ctx.replica.scheduler.submit(eval).await {
            Ok(done) => done,
            Err(e) => {
                let mut err = match &e {
                    // (A move has no idempotency key: a retry finds the
                    // move under way and answers it.)
                    EvalError::Unknown(_) => ApiError::outcome_unknown(format!(
                        "the move may or may not have started ({e}); retry it: a retry finds a move already under way"
                    )),
                    _ => super::functions::eval_error(&e),
                };
                if !moves.is_empty() {
                    let made = serde_json::to_string(&moves).unwrap_or_default();
                    err.message = format!("{}; the moves before it stand: {made}", err.message);
                }
                return Err(err);
            }
        };
        let (new, node) = match done.applied {
            Some(Applied::InstanceMigrating {
                instance: new,
                slices,
                ..
            }) => {
                let node = slices
                    .first()
                    .map(|s| s.gpu.node.clone())
                    .unwrap_or_else(|| NodeId(String::new()));
                ctx.replica.agents.activity.migrated(
                    ctx.replica.proposer.now_ms(),
                    "migrate_start",
                    &node.0,
                    new,
                    &tenant.0,
                    &name,
                );
                (new, node)
            }
            // Nothing started: gone meanwhile, there already, or moving
            // already (a retry of an attempt whose answer was lost found
            // its migration: that is the move, reported as such).
            _ => match moving(&ctx, instance, &target).await {
                Ok(Some(found)) => found,
                Ok(None) => continue,
                Err(mut err) => {
                    if !moves.is_empty() {
                        let made = serde_json::to_string(&moves).unwrap_or_default();
                        err.message = format!("{}; the moves before it stand: {made}", err.message);
                    }
                    return Err(err);
                }
            },
        };
        let outcome = wait_for_end(&ctx, instance, new).await;
        moves.push(MoveView {
            from: instance,
            to: new,
            node,
            outcome: outcome.to_string(),
        });
    }
    Ok(HttpResponse::Ok().json(MoveAnswer {
        target: target.to_string(),
        moves,
        already_there,
    }))
}

/// The migration `from` is the old side of on this replica's applied state,
/// once it caught up with the leader's commit (the leader's entry may not
/// be applied here yet): its new instance and that instance's node when it
/// is an operator's move into `target` (this move's first attempt, whose
/// answer was lost); a migration of another cause or elsewhere is a
/// conflict, as before.
async fn moving(
    ctx: &HttpContext,
    from: InstanceId,
    target: &MoveTarget,
) -> Result<Option<(InstanceId, NodeId)>, ApiError> {
    let _ = ctx.replica.proposer.read_barrier().await;
    let st = ctx.replica.state.read();
    let d = st.region.domain();
    let Some(m) = d.migration_of(from).filter(|m| m.from == from) else {
        return Ok(None);
    };
    let new = d.instance(m.to);
    if m.cause != MigrationCause::Operator || !new.is_some_and(|i| target.holds(i)) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "migration_conflict",
            format!(
                "instance {from} is migrating already ({:?}, to instance {}), not by this move",
                m.cause, m.to
            ),
        ));
    }
    let node = new
        .and_then(|i| i.slices.first())
        .map(|s| s.gpu.node.clone())
        .unwrap_or_else(|| NodeId(String::new()));
    Ok(Some((m.to, node)))
}

/// Waits until the migration `from` → `to` ends on this replica's applied
/// state: `completed`, `given_up`, or `in_progress` after the leader's
/// longest wait and a margin.
async fn wait_for_end(ctx: &HttpContext, from: InstanceId, to: InstanceId) -> &'static str {
    let deadline = tokio::time::Instant::now() + MIGRATION_WAIT + Duration::from_secs(10);
    // A follower may not have applied the leader's entry yet: `to` counts
    // as given up only once it was seen here and went.
    let mut seen = false;
    loop {
        {
            let st = ctx.replica.state.read();
            let d = st.region.domain();
            match (d.instance(from).is_some(), d.instance(to).is_some()) {
                (false, true) => return "completed",
                (_, true) => seen = true,
                (_, false) if seen => return "given_up",
                (_, false) => {}
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return "in_progress";
        }
        tokio::time::sleep(POLL).await;
    }
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/v1/tenants/{tenant}/functions/{name}/move",
        web::post().to(move_function),
    );
}
