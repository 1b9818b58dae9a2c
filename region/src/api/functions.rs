//! `/v1/functions` (tenant): deploy (and place `min_instances`), list,
//! show, update (`PUT`), delete; the operator reads a tenant's under
//! `/v1/tenants/{tenant}/functions`. Names are per tenant; another tenant's function answers
//! 404 exactly like a name nobody uses.
//!
//! Placement is the scheduler's (`crate::scheduler`): a deploy is an
//! evaluation that the leader's worker plans (core's `plan_placements`)
//! and commits as one `FunctionCreate` (deploy and placements together)
//! under the request's idempotency key (`idempotency.rs`); the state
//! machine re-checks fit and quota on apply and takes all of it or none of
//! it. A refused deploy left nothing behind; its answer names the resource
//! or quota that ran out, or `422 unsatisfiable` with the largest GPU when
//! the function is larger than every GPU. `?dry_run=true` answers where the
//! instances would go and what the plan passed over, proposing nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::bounds;
use gshare_core::model::{
    FunctionSpec, LatencyProfile, NodeId, PoolPreference, Runtime, Slice, TenantId, Tier,
};
use gshare_core::protocol::{InstanceState, RegionLoad};
use gshare_core::state::{
    Applied, ApplyError, DomainCommand, InstanceId, KeyLookup, ObjectKind, PlanRejection,
    PlannedInstance, RegionState,
};
use serde::{Deserialize, Serialize};

use super::{auth, idempotency, parse_json, read_body, ApiError};
use crate::agents::RegionAgents;
use crate::http::HttpContext;
use crate::scheduler::{EvalDone, EvalError, Evaluation};

/// The latency profile as written in a deploy.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyBody {
    /// Service time on a whole GPU, µs.
    pub full_gpu_us: u64,
    /// Compute beyond which a request gets no faster, milli-GPU.
    pub saturation_milli: u32,
}

/// `POST /v1/functions`: a function spec without its tenant (the token's).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionBody {
    /// Name (per tenant).
    pub name: String,
    /// Serving runtime.
    pub runtime: Runtime,
    /// GPU memory footprint, MiB.
    pub memory_mib: u64,
    /// Compute slice, milli-GPU (a multiple of 1000 for `exclusive`).
    pub compute_milli: u32,
    /// Sharing tier.
    pub tier: Tier,
    /// Per-request deadline, ms.
    pub deadline_ms: u64,
    /// `edge:<pool>`, `center` or `any` (default `any`): a preference,
    /// spilling to other pools when that one is full.
    #[serde(default = "any_pool")]
    pub pool: PoolPreference,
    /// Never place outside `pool` (default false): a full pool refuses
    /// the deploy and makes a scale-out wait; `any` names no pool. Left
    /// out of a body when false (a body without it reads as before).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub strict_pool: bool,
    /// Instances placed at deploy (default 1).
    #[serde(default = "one")]
    pub min_instances: u32,
    /// Most instances (default: `min_instances`).
    #[serde(default)]
    pub max_instances: Option<u32>,
    /// Idle time before scale-down, s (default 300).
    #[serde(default = "idle")]
    pub idle_timeout_s: u64,
    /// Latency profile (default: the deadline on a whole GPU, saturating at 1000).
    #[serde(default)]
    pub latency: Option<LatencyBody>,
    /// The model its runtime serves (`org/model`; `{model}` in the
    /// runtime's template); absent: the function's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Arguments appended to the runtime's command (within the template's
    /// `allow_args`, checked by the agent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment of the runtime (within the template's `allow_env`,
    /// checked by the agent).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env: std::collections::BTreeMap<String, String>,
}

fn any_pool() -> PoolPreference {
    PoolPreference::Any
}
fn one() -> u32 {
    1
}
fn idle() -> u64 {
    300
}

impl FunctionBody {
    /// The spec of `tenant`'s function: `pool` and `strict_pool` make its
    /// pool preference (`strict:edge:<p>`, `strict:center` when strict).
    /// Refused (422 `invalid_spec`, naming the field): `strict_pool` with
    /// `any`, and a `pool` written in the state's strict form (a body says
    /// it one way: `strict_pool: true`).
    pub fn into_spec(self, tenant: TenantId) -> Result<FunctionSpec, ApiError> {
        let invalid = |field: &str, reason: String| {
            ApiError::from_apply(&ApplyError::InvalidSpec {
                field: field.into(),
                reason,
            })
        };
        if self.pool.is_strict() {
            return Err(invalid(
                "pool",
                format!(
                    "a pool preference is edge:<pool>, center or any, got {:?}; for a strict \
                     pool send \"pool\": \"{}\" with \"strict_pool\": true",
                    self.pool.to_string(),
                    self.pool.preferred()
                ),
            ));
        }
        let pool = if self.strict_pool {
            self.pool.strict().map_err(|why| {
                invalid(
                    "strict_pool",
                    format!("pool is {:?}, and {why}", self.pool.to_string()),
                )
            })?
        } else {
            self.pool
        };
        let latency = self.latency.map_or(
            LatencyProfile {
                full_gpu_us: self.deadline_ms.saturating_mul(1000),
                saturation_milli: 1000,
            },
            |l| LatencyProfile {
                full_gpu_us: l.full_gpu_us,
                saturation_milli: l.saturation_milli,
            },
        );
        let spec = FunctionSpec {
            model: self.model,
            args: self.args,
            env: self.env,
            tenant,
            name: self.name,
            runtime: self.runtime,
            memory_mib: self.memory_mib,
            compute_milli: self.compute_milli,
            tier: self.tier,
            deadline_ms: self.deadline_ms,
            pool,
            min_instances: self.min_instances,
            max_instances: self.max_instances.unwrap_or(self.min_instances.max(1)),
            idle_timeout_s: self.idle_timeout_s,
            latency,
        };
        // The state machine's apply checks the same again.
        gshare_core::serving::check_serving(&spec).map_err(|e| invalid(&e.field, e.reason))?;
        Ok(spec)
    }
}

/// One placed instance in an answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InstanceView {
    /// Its id.
    pub instance: InstanceId,
    /// Pool (in listings; empty in a deploy answer).
    #[serde(default)]
    pub pool: String,
    /// Its slices.
    pub slices: Vec<Slice>,
    /// In `GET /v1/functions/{name}` and a `?wait=ready` answer: `placed`
    /// (committed; its agent reports nothing of it), `assigned` (pushed to
    /// its node's agent, not reported yet), or what the agent reports:
    /// `cold` (hosted, no weights loaded), `loading`, `resident` or
    /// `swapped_out` (read from whichever replica holds the agent's link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The function version it runs.
    #[serde(default)]
    pub version: u64,
    /// `true`: it runs an earlier version than the function's (a reshaping
    /// update's roll replaces it, make-before-break, and then releases it).
    #[serde(default)]
    pub outgoing: bool,
}

/// The error body inside a `202` answer of `?wait=ready`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NotReady {
    /// `not_ready`.
    pub code: String,
    /// What is committed and what is still missing.
    pub message: String,
    /// `true`: the same request with the same `Idempotency-Key` waits again.
    pub retryable: bool,
}

/// A function as its tenant sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FunctionView {
    /// The spec.
    pub spec: FunctionSpec,
    /// Version (1 on deploy).
    pub version: u64,
    /// Placed instances.
    pub instances: Vec<InstanceView>,
    /// With `?wait=ready`: whether the function was ready (see
    /// [`WaitFor::Ready`]) before the wait ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// With `?wait=ready`, when it was not ready in time: why (the answer
    /// is then `202 Accepted` with `X-Gshare-Error: not_ready`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<NotReady>,
    /// In `GET /v1/functions/{name}`: its load, the latest load report of
    /// every agent hosting it summed (agents on `not_ready` nodes left
    /// out); absent when no agent reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<RegionLoad>,
    /// In `GET /v1/functions/{name}`: the leader's latest autoscaling
    /// decision for it, on any replica (a follower asks the leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<AutoscaleView>,
    /// In `GET /v1/functions/{name}`: the nodes whose agent holds the
    /// weights of its current version in host memory (released there and
    /// kept while host memory allows; agents on `not_ready` nodes left
    /// out). A placement from zero prefers them (where the node takes
    /// placements and fits) and there resumes by swap-in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_copies: Vec<NodeId>,
    /// Its migrations in progress (absent when none): the new instance
    /// serves beside the old one until it is ready, then the old one goes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrations: Vec<MigrationView>,
}

/// One migration in progress, in a function's view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationView {
    /// The instance that moves (released once `to` is ready).
    pub from: InstanceId,
    /// The instance placed for it.
    pub to: InstanceId,
    /// The new instance's node.
    pub to_node: NodeId,
    /// `return` (back to its preferred pool), `operator` or `defragment`.
    pub cause: String,
    /// When it started (Unix ms).
    pub started_at_ms: u64,
}

/// What `autoscale` of a function's view says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AutoscaleStatus {
    /// The leader's latest tick decided `decision`.
    Decided,
    /// The leader has no decision yet (it took over less than a tick ago).
    Undecided,
    /// `min_instances = max_instances`: the count is fixed, no autoscaler.
    Fixed,
    /// No leader answered (`reason` says why).
    Unknown,
}

/// The leader's latest autoscaling decision for a function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoscaleView {
    /// Whether there is a decision, and if not why.
    pub status: AutoscaleStatus,
    /// The decision: desired and current instances, the rule that set
    /// `desired`, panic mode, the windows' mean concurrency and the target
    /// of one instance (thousandths).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<gshare_core::autoscale::Decision>,
    /// When the leader made it (its clock, Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at_ms: Option<u64>,
    /// How old it was when the leader answered, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_ms: Option<u64>,
    /// The leader that made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<u64>,
    /// Why it is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl AutoscaleView {
    fn of(status: AutoscaleStatus) -> Self {
        AutoscaleView {
            status,
            decision: None,
            decided_at_ms: None,
            age_ms: None,
            leader: None,
            reason: None,
        }
    }
}

/// The answer to an applied create (a replay of its key answers the same).
fn created(
    ctx: &HttpContext,
    spec: FunctionSpec,
    applied: Applied,
) -> Result<FunctionView, ApiError> {
    let Applied::FunctionCreated {
        version, instances, ..
    } = applied
    else {
        return Err(ApiError::internal(format!("unexpected {applied:?}")));
    };
    let st = ctx.replica.state.read();
    let topology = st.region.domain().topology();
    let pool_of = |slices: &[Slice]| {
        slices
            .first()
            .and_then(|s| topology?.node(&s.gpu.node.0))
            .map(|n| n.pool.clone())
            .unwrap_or_default()
    };
    Ok(FunctionView {
        spec,
        version,
        instances: instances
            .into_iter()
            .map(|i| InstanceView {
                instance: i.instance,
                pool: pool_of(&i.slices),
                slices: i.slices,
                state: None,
                version,
                outgoing: false,
            })
            .collect(),
        ready: None,
        error: None,
        load: None,
        autoscale: None,
        host_copies: Vec::new(),
        migrations: Vec::new(),
    })
}

/// The query of `POST /v1/functions`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct DeployQuery {
    /// `true`: plan only and answer where the instances would go (200).
    #[serde(default)]
    pub dry_run: bool,
    /// `ready`: answer once the function is ready (see [`WaitFor::Ready`];
    /// at most `ready_timeout_ms`, then `202 not_ready`); `committed` (the
    /// default): once the deploy-and-place entry is applied.
    #[serde(default)]
    pub wait: Option<WaitFor>,
    /// Longest wait for `wait=ready`, ms (default 10,000, at most 60,000).
    #[serde(default)]
    pub ready_timeout_ms: Option<u64>,
}

/// What a deploy waits for before it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WaitFor {
    /// The deploy-and-place entry is applied (201 then).
    Committed,
    /// Every replica that answers has applied the deploy, and every hosting
    /// agent reports its instances: with a copy of the weights resident on
    /// each hosting node (`oversubscribed` instances: hosted, in any state,
    /// since they load on their first request by design).
    Ready,
}

/// Default and largest `ready_timeout_ms`.
const READY_TIMEOUT_MS: (u64, u64) = (10_000, 60_000);

/// The answer of a dry run: where the instances would go now, or why not.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DryRun {
    /// The spec planned.
    pub spec: FunctionSpec,
    /// Whether every instance found a place.
    pub placeable: bool,
    /// Where each would go, with what its plan passed over.
    pub instances: Vec<PlannedInstance>,
    /// Why not (the error code a deploy would answer), if not.
    pub code: Option<String>,
    /// The planner's rejection with its counts, if not placeable.
    pub rejection: Option<PlanRejection>,
}

/// The answer to an evaluation that placed nothing.
pub(super) fn eval_error(e: &EvalError) -> ApiError {
    match e {
        EvalError::Rejected(r) => ApiError::from_rejection(r),
        EvalError::Refused(e) => ApiError::from_apply(e),
        EvalError::NoLeader => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "no_leader", e.to_string())
        }
        EvalError::Unknown(_) => ApiError::outcome_unknown(format!(
            "the deploy may or may not have taken effect ({e}); retry with its {}",
            idempotency::HEADER
        )),
        EvalError::Stopped => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "stopping", e.to_string())
        }
        EvalError::Unmovable(m) => match m {
            gshare_core::state::MoveError::Rejected(r) => ApiError::from_rejection(r),
            gshare_core::state::MoveError::Gone(_) => ApiError::not_found(m.to_string()),
            _ => ApiError::new(StatusCode::CONFLICT, "no_room", m.to_string()),
        },
        EvalError::NoRoom(_) => ApiError::new(StatusCode::CONFLICT, "no_room", e.to_string()),
    }
}

/// `POST /v1/functions`: the leader's scheduler commits the deploy and the
/// placement of `min_instances` as one replicated command (all of it or
/// nothing) under the request's idempotency key; 201 once it is applied.
/// `?dry_run=true` plans on this replica's view and proposes nothing.
async fn deploy(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    query: web::Query<DeployQuery>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let tenant = auth::tenant(&req, &ctx).await?;
    let raw = read_body(&req, payload).await?;
    let key = idempotency::write_key(&req, &ctx, &raw)?;
    let body: FunctionBody = parse_json(&raw).map_err(|e| e.with_key(&key.key))?;
    let spec = body
        .into_spec(tenant.clone())
        .map_err(|e| e.with_key(&key.key))?;
    // The same bounds apply re-checks: refused here before anything is planned.
    bounds::check_spec(&spec).map_err(|e| ApiError::from_bounds(e).with_key(&key.key))?;
    if query.dry_run {
        // An invalid spec is refused as its deploy would refuse it, not
        // planned (the planner may take it, e.g. 1 500 milli exclusive as
        // one whole GPU, or refuse it for another reason).
        let invalid = {
            let st = ctx.replica.state.read();
            st.region.domain().check_function_spec(&spec)
        };
        invalid.map_err(|e| ApiError::from_apply(&e).with_key(&key.key))?;
        return Ok(HttpResponse::Ok().json(dry_run(&ctx, spec)));
    }
    let eval = Evaluation::Deploy {
        tenant: tenant.clone(),
        key: key.key.clone(),
        fingerprint: key.fingerprint.clone(),
        spec: Box::new(spec.clone()),
    };
    match ctx.replica.scheduler.submit(eval).await {
        Ok(EvalDone {
            applied: Some(applied),
            replans,
        }) => {
            ctx.api.replans.inc_by(u64::from(replans));
            if let Applied::FunctionCreated { instances, .. } = &applied {
                ctx.api.placements.inc_by(instances.len() as u64);
            }
            let mut view = created(&ctx, spec, applied)?;
            if query.wait == Some(WaitFor::Ready) {
                let ms = query
                    .ready_timeout_ms
                    .unwrap_or(READY_TIMEOUT_MS.0)
                    .min(READY_TIMEOUT_MS.1);
                let waited = wait_ready(&ctx, &mut view, Duration::from_millis(ms)).await;
                view.ready = Some(waited.is_ok());
                if let Err(missing) = waited {
                    view.error = Some(NotReady {
                        code: "not_ready".into(),
                        message: format!(
                            "the deploy committed (version {}, {} instance(s) placed) but is \
                             not ready after {ms} ms: {missing}; the same request with {}: {} \
                             waits again",
                            view.version,
                            view.instances.len(),
                            idempotency::HEADER,
                            key.key
                        ),
                        retryable: true,
                    });
                    return Ok(HttpResponse::Accepted()
                        .insert_header((idempotency::HEADER, key.key.as_str()))
                        .insert_header((gshare_core::http_surface::ERROR_HEADER, "not_ready"))
                        .json(view));
                }
            }
            Ok(HttpResponse::Created()
                .insert_header((idempotency::HEADER, key.key.as_str()))
                .json(view))
        }
        Ok(EvalDone { applied: None, .. }) => {
            Err(ApiError::internal("the deploy's evaluation applied nothing").with_key(&key.key))
        }
        Err(e) => {
            let e = eval_error(&e);
            ctx.api.reject(e.code);
            Err(e.with_key(&key.key))
        }
    }
}

impl DryRun {
    /// The answer for `spec` that apply would refuse with `e` (not planned).
    fn refused(spec: FunctionSpec, e: &ApplyError) -> Self {
        DryRun {
            spec,
            placeable: false,
            instances: Vec::new(),
            code: Some(e.code().to_string()),
            rejection: None,
        }
    }
}

/// Plans `spec` on this replica's view through the scheduler's seam.
fn dry_run(ctx: &HttpContext, spec: FunctionSpec) -> DryRun {
    let taken = {
        let st = ctx.replica.state.read();
        st.region
            .domain()
            .function(&spec.tenant, &spec.name)
            .is_ok()
    };
    if taken {
        let e = ApplyError::DuplicateName {
            kind: ObjectKind::Function,
            name: spec.name.clone(),
        };
        return DryRun::refused(spec, &e);
    }
    // No room in the tenant's stored specs: refused as the deploy's apply
    // refuses it (after the name, as apply checks).
    let room = ctx
        .replica
        .state
        .read()
        .region
        .domain()
        .check_spec_room(&spec);
    if let Err(e) = room {
        return DryRun::refused(spec, &e);
    }
    match ctx.replica.scheduler.dry_run(&spec) {
        Ok(plan) => DryRun {
            spec,
            placeable: true,
            instances: plan.instances,
            code: None,
            rejection: None,
        },
        Err(r) => DryRun {
            spec,
            placeable: false,
            instances: Vec::new(),
            code: Some(r.code().to_string()),
            rejection: Some(*r),
        },
    }
}

/// The view of a function whose keyed update the leader committed, read
/// from this replica's state once it has applied that update (its key
/// replays here). A replica behind (a follower a moment late, or one that
/// had not even applied the deploy) catches up through a read barrier
/// first (after which the update is applied here, its key replaying or
/// not), so a committed update is never answered with a stale
/// `unknown_function`. `None`: applied here and the function is gone
/// (deleted since; the update did happen). If this replica cannot catch up,
/// the answer is `outcome_unknown` with the key to retry under (its replay
/// answers the update), never a definite error.
async fn updated_view(
    ctx: &HttpContext,
    tenant: &TenantId,
    name: &str,
    version: u64,
    key: &idempotency::WriteKey,
) -> Result<Option<FunctionView>, ApiError> {
    let applied_here = || {
        matches!(
            idempotency::local_lookup(ctx, tenant, key),
            KeyLookup::Replay(_)
        )
    };
    if !applied_here() {
        // A read barrier that passes has this replica apply every write
        // acknowledged before it, this update among them: the view is then
        // read even if the key is gone meanwhile (evicted by the tenant's
        // key cap), where an `outcome_unknown` would have the client apply
        // the update a second time under a key no longer recorded.
        if let Err(e) = ctx.replica.proposer.read_barrier().await {
            if !applied_here() {
                return Err(ApiError::outcome_unknown(format!(
                    "the update committed (version {version}) but this replica has not applied it \
                     (it did not catch up: {e}); the same request with {}: {} answers it again",
                    idempotency::HEADER,
                    key.key,
                ))
                .with_key(&key.key));
            }
        }
    }
    Ok(view(ctx, tenant, name).ok())
}

fn view(ctx: &HttpContext, tenant: &TenantId, name: &str) -> Result<FunctionView, ApiError> {
    let st = ctx.replica.state.read();
    view_in(st.region.domain(), tenant, name)
}

/// [`view`] on the state `d` (a listing reads every function under one lock).
fn view_in(d: &RegionState, tenant: &TenantId, name: &str) -> Result<FunctionView, ApiError> {
    let f = d
        .function(tenant, name)
        .map_err(|e| ApiError::from_query(&e))?;
    Ok(FunctionView {
        spec: f.spec.clone(),
        version: f.version,
        instances: d
            .instances_of(tenant, name)
            .map(|i| InstanceView {
                instance: i.id,
                pool: i.pool.clone(),
                slices: i.slices.clone(),
                state: None,
                version: i.version,
                outgoing: i.version != f.version,
            })
            .collect(),
        ready: None,
        error: None,
        load: None,
        autoscale: None,
        host_copies: Vec::new(),
        migrations: d
            .migrations()
            .filter_map(|m| {
                let to = d.instance(m.to)?;
                let to_node = to.slices.first().map(|s| s.gpu.node.clone())?;
                (&to.tenant == tenant && to.function == name).then(|| MigrationView {
                    from: m.from,
                    to: m.to,
                    to_node,
                    cause: m.cause.as_str().to_string(),
                    started_at_ms: m.started_at,
                })
            })
            .collect(),
    })
}

async fn list(req: HttpRequest, ctx: web::Data<HttpContext>) -> Result<HttpResponse, ApiError> {
    let tenant = auth::tenant(&req, &ctx).await?;
    list_of(&ctx, &tenant)
}

/// `GET /v1/tenants/{tenant}/functions` (operator): what the tenant sees
/// in `GET /v1/functions`.
async fn list_for_operator(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let tenant = known_tenant(&ctx, path.into_inner())?;
    list_of(&ctx, &tenant)
}

/// `GET /v1/tenants/{tenant}/functions/{name}` (operator): what the tenant
/// sees in `GET /v1/functions/{name}`.
async fn show_for_operator(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    auth::operator(&req, &ctx).await?;
    let (tenant, name) = path.into_inner();
    let tenant = known_tenant(&ctx, tenant)?;
    show_of(&ctx, &tenant, &name).await
}

/// The tenant named in an operator's path (404 if there is none).
fn known_tenant(ctx: &HttpContext, name: String) -> Result<TenantId, ApiError> {
    let tenant = TenantId(name);
    let st = ctx.replica.state.read();
    if st.region.domain().tenant(&tenant).is_none() {
        return Err(ApiError::from_apply(&ApplyError::UnknownTenant { tenant }));
    }
    Ok(tenant)
}

/// The tenant's functions, all read under one lock: a delete applied while
/// the list is built cannot turn it into a 404 (as reading each function
/// under a lock of its own did).
fn list_of(ctx: &HttpContext, tenant: &TenantId) -> Result<HttpResponse, ApiError> {
    let views = {
        let st = ctx.replica.state.read();
        let d = st.region.domain();
        d.functions_of(tenant)
            .map(|f| view_in(d, tenant, &f.spec.name))
            .collect::<Result<Vec<_>, _>>()?
    };
    Ok(HttpResponse::Ok().json(views))
}

async fn show(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let tenant = auth::tenant(&req, &ctx).await?;
    show_of(&ctx, &tenant, &path).await
}

async fn show_of(
    ctx: &HttpContext,
    tenant: &TenantId,
    name: &str,
) -> Result<HttpResponse, ApiError> {
    let mut v = view(ctx, tenant, name)?;
    let agents = ctx.replica.agents.gather().await;
    for i in &mut v.instances {
        i.state = Some(instance_state(&agents, i).to_string());
    }
    let not_ready = agents.not_ready_nodes(ctx.replica.state.read().region.domain());
    v.load = function_load(&agents, &not_ready, tenant, name);
    v.host_copies = host_copies_of(&agents, &not_ready, tenant, name, v.version);
    v.autoscale = Some(autoscale_of(ctx, &v.spec).await);
    Ok(HttpResponse::Ok().json(v))
}

/// The leader's latest decision for `spec`'s function (none to ask for
/// a fixed count).
async fn autoscale_of(ctx: &HttpContext, spec: &FunctionSpec) -> AutoscaleView {
    use crate::scheduler::DecisionLookup;
    if spec.min_instances >= spec.max_instances {
        return AutoscaleView::of(AutoscaleStatus::Fixed);
    }
    match ctx
        .replica
        .scheduler
        .leader_decision(&spec.tenant, &spec.name)
        .await
    {
        Ok(DecisionLookup::Decided(d)) => AutoscaleView {
            decision: Some(d.decision),
            decided_at_ms: Some(d.at_ms),
            age_ms: Some(d.age_ms),
            leader: Some(d.leader),
            ..AutoscaleView::of(AutoscaleStatus::Decided)
        },
        Ok(DecisionLookup::Undecided { leader }) => AutoscaleView {
            leader: Some(leader),
            ..AutoscaleView::of(AutoscaleStatus::Undecided)
        },
        Ok(DecisionLookup::NotLeader) => AutoscaleView {
            reason: Some("the replica asked is no longer the leader".into()),
            ..AutoscaleView::of(AutoscaleStatus::Unknown)
        },
        Err(reason) => AutoscaleView {
            reason: Some(reason),
            ..AutoscaleView::of(AutoscaleStatus::Unknown)
        },
    }
}

/// `tenant`'s `name`'s load over the agents, those on `not_ready` nodes
/// left out (`None`: no agent reports it).
fn function_load(
    agents: &RegionAgents,
    not_ready: &BTreeSet<String>,
    tenant: &TenantId,
    name: &str,
) -> Option<RegionLoad> {
    let mut loads = agents.function_loads(|a| !not_ready.contains(&a.node));
    loads.remove(&(tenant.clone(), name.to_string()))
}

/// The nodes holding `tenant`'s `name`'s weights of `version` in host
/// memory, those on `not_ready` nodes left out (as the scheduler sees them).
fn host_copies_of(
    agents: &RegionAgents,
    not_ready: &BTreeSet<String>,
    tenant: &TenantId,
    name: &str,
    version: u64,
) -> Vec<NodeId> {
    let mut copies = agents.host_copies(|a| !not_ready.contains(&a.node));
    copies
        .remove(&(tenant.clone(), name.to_string(), version))
        .unwrap_or_default()
}

/// The answer of `PUT /v1/functions/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpdateView {
    /// The function's new version.
    pub version: u64,
    /// Instances the update released because it lowered `max_instances`.
    pub released: Vec<InstanceId>,
    /// Instances the update made outgoing because it changed their shape
    /// (runtime, memory, compute, tier or pool): each keeps serving until
    /// a new-version instance placed for it (a `roll` migration) is ready
    /// (or for 10 s), then goes; without room for both it moves in one
    /// step, and where `max_instances` current ones exist it just goes.
    #[serde(default)]
    pub replacing: Vec<InstanceId>,
    /// The function after the update, with the instances placed for it
    /// since (and, with `?wait=ready`, whether its agents took them);
    /// `null` if it was deleted after the update (which did happen).
    pub function: Option<FunctionView>,
}

/// `PUT /v1/functions/{name}` under the request's idempotency key: a new
/// spec through `FunctionUpdate`. An update that changes what an instance
/// holds or runs makes the old instances outgoing in that entry (they
/// keep serving, on their slices, with their version's spec); the
/// leader's roll then replaces them one at a time, make-before-break
/// (a new-version instance placed as a `roll` migration; the old one is
/// released once the new one is ready; a new one never ready is given up and the old one
/// stays: docs/migration.md), or, where capacity or quota has no
/// room for both, moves the instance in one step (its log line and the
/// `replace` evaluation counters say so). Other changes (deadline,
/// instance counts, idle timeout, latency) keep the instances.
/// `?wait=ready` answers once the roll is done (no outgoing instance
/// left, `min_instances` current ones) and the function is ready (at most
/// `ready_timeout_ms`).
async fn update(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<String>,
    query: web::Query<DeployQuery>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let tenant = auth::tenant(&req, &ctx).await?;
    let raw = read_body(&req, payload).await?;
    let key = idempotency::write_key(&req, &ctx, &raw)?;
    let body: FunctionBody = parse_json(&raw).map_err(|e| e.with_key(&key.key))?;
    let name = path.into_inner();
    if body.name != name {
        return Err(ApiError::bad_request(format!(
            "the body names function {:?}, the path {name:?}",
            body.name
        ))
        .with_key(&key.key));
    }
    if query.dry_run {
        return Err(ApiError::bad_request("dry_run is for deploys, not updates").with_key(&key.key));
    }
    let spec = body
        .into_spec(tenant.clone())
        .map_err(|e| e.with_key(&key.key))?;
    bounds::check_spec(&spec).map_err(|e| ApiError::from_bounds(e).with_key(&key.key))?;
    let min = spec.min_instances;
    let applied =
        idempotency::propose_keyed(&ctx, &tenant, &key, DomainCommand::FunctionUpdate { spec })
            .await?;
    let Applied::FunctionUpdated {
        version,
        released,
        replacing,
        ..
    } = applied
    else {
        return Err(ApiError::internal(format!("unexpected {applied:?}")).with_key(&key.key));
    };
    let ms = query
        .ready_timeout_ms
        .unwrap_or(READY_TIMEOUT_MS.0)
        .min(READY_TIMEOUT_MS.1);
    let until = tokio::time::Instant::now() + Duration::from_millis(ms);
    let mut shown = updated_view(&ctx, &tenant, &name, version, &key).await?;
    // `?wait=ready` waits for the roll and readiness of the function shown
    // (none to wait for if it was deleted since).
    let wait_for = shown
        .as_mut()
        .filter(|_| query.wait == Some(WaitFor::Ready));
    if let Some(function) = wait_for {
        // The roll: until no outgoing instance is left and `min` current
        // ones are placed (this replica may apply them a moment after the
        // leader); then until the function is ready.
        let rolled = |f: &FunctionView| {
            let current = f.instances.iter().filter(|i| !i.outgoing).count() as u64;
            let outgoing = f.instances.iter().filter(|i| i.outgoing).count();
            (f.version >= version && outgoing == 0 && current >= u64::from(min))
                .then_some(())
                .ok_or_else(|| {
                    format!(
                        "{current} of {min} new instance(s) placed, {outgoing} old one(s) \
                         not replaced yet"
                    )
                })
        };
        while rolled(function).is_err() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Gone meanwhile (deleted by another request): the update still
            // happened; answer with what was last seen.
            match view(&ctx, &tenant, &name) {
                Ok(f) => *function = f,
                Err(_) => break,
            }
        }
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let waited = match rolled(function) {
            Ok(()) => wait_ready(&ctx, function, left).await,
            Err(e) => Err(e),
        };
        function.ready = Some(waited.is_ok());
        if let Err(missing) = waited {
            function.error = Some(NotReady {
                code: "not_ready".into(),
                message: format!(
                    "the update committed (version {version}) but is not ready after {ms} ms: \
                     {missing}; the same request with {}: {} waits again",
                    idempotency::HEADER,
                    key.key
                ),
                retryable: true,
            });
        }
    }
    Ok(HttpResponse::Ok()
        .insert_header((idempotency::HEADER, key.key.as_str()))
        .json(UpdateView {
            version,
            released,
            replacing,
            function: shown,
        }))
}

/// The node of an instance (its first slice's).
fn node_of(i: &InstanceView) -> Option<&NodeId> {
    i.slices.first().map(|s| &s.gpu.node)
}

/// The agent's report of `i`, if its node's agent is linked to a replica
/// that answered and reports it.
fn reported(agents: &RegionAgents, i: &InstanceView) -> Option<InstanceState> {
    let node = node_of(i)?;
    agents
        .of_node(&node.0)?
        .instance(i.instance)
        .map(|s| s.state)
}

/// See [`InstanceView::state`].
fn instance_state(agents: &RegionAgents, i: &InstanceView) -> &'static str {
    if let Some(s) = reported(agents, i) {
        return s.name();
    }
    let delivered = node_of(i)
        .and_then(|n| agents.of_node(&n.0))
        .is_some_and(|a| a.delivered.contains(&i.instance));
    if delivered {
        "assigned"
    } else {
        "placed"
    }
}

/// What keeps `v` from being ready (see [`WaitFor::Ready`]), given every
/// replica's agents and the log index the deploy is applied at; `None`
/// when nothing does.
fn not_ready(v: &FunctionView, agents: &RegionAgents, index: u64) -> Option<String> {
    let mut missing = Vec::new();
    for (part, applied) in &agents.replicas {
        if let Some(a) = applied.filter(|a| *a < index) {
            missing.push(format!(
                "replica {} has applied up to index {a}, the deploy is at {index}",
                part.id
            ));
        }
    }
    let swappable = v.spec.tier.swappable();
    for i in &v.instances {
        let Some(node) = node_of(i) else { continue };
        let state = reported(agents, i);
        // A copy resident for another instance of the function on the
        // same node serves this one's first request without a load too.
        let warm = v
            .instances
            .iter()
            .filter(|o| node_of(o) == Some(node))
            .any(|o| reported(agents, o) == Some(InstanceState::Resident));
        let ok = match state {
            Some(_) if swappable => true,
            Some(_) => warm,
            None => false,
        };
        if !ok {
            let why = match state {
                Some(s) => s.name().to_string(),
                None if agents.of_node(&node.0).is_none() => format!(
                    "{} (no replica that answered holds an agent link for {})",
                    instance_state(agents, i),
                    node.0
                ),
                None => instance_state(agents, i).to_string(),
            };
            missing.push(format!("instance {} on {}: {why}", i.instance, node.0));
        }
    }
    let n = missing.len();
    if n == 0 {
        return None;
    }
    missing.truncate(5);
    let more = if n > 5 {
        format!(" (and {} more)", n - 5)
    } else {
        String::new()
    };
    Some(format!("{}{more}", missing.join("; ")))
}

/// Waits, for at most `wait`, until `v` is ready (see [`WaitFor::Ready`]):
/// this replica applied the deploy, every replica that answers applied it
/// too (so an invocation through any of them finds the function), and its
/// hosting agents report its instances. Sets each instance's state as last
/// seen; `Err` says what was still missing.
async fn wait_ready(ctx: &HttpContext, v: &mut FunctionView, wait: Duration) -> Result<(), String> {
    let until = tokio::time::Instant::now() + wait;
    let mut index = None;
    let mut missing = "this replica has not applied the deploy yet".to_string();
    loop {
        if index.is_none() {
            let st = ctx.replica.state.read();
            let here = st
                .region
                .domain()
                .function(&v.spec.tenant, &v.spec.name)
                .is_ok();
            if here {
                index = Some(st.last_applied.map_or(0, |l| l.index));
            }
        }
        if let Some(index) = index {
            let agents = ctx.replica.agents.gather().await;
            for i in &mut v.instances {
                i.state = Some(instance_state(&agents, i).to_string());
            }
            match not_ready(v, &agents, index) {
                None => return Ok(()),
                Some(why) => missing = why,
            }
        }
        if tokio::time::Instant::now() >= until {
            return Err(missing);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `DELETE /v1/functions/{name}` under the request's idempotency key: a
/// retried delete answers as the first did.
async fn delete(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let tenant = auth::tenant(&req, &ctx).await?;
    let key = idempotency::write_key(&req, &ctx, b"")?;
    let applied = idempotency::propose_keyed(
        &ctx,
        &tenant,
        &key,
        DomainCommand::FunctionDelete {
            tenant: tenant.clone(),
            name: path.into_inner(),
        },
    )
    .await?;
    Ok(HttpResponse::build(StatusCode::OK)
        .insert_header((idempotency::HEADER, key.key.as_str()))
        .json(applied))
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/functions", web::post().to(deploy))
        .route("/v1/functions", web::get().to(list))
        .route("/v1/functions/{name}", web::get().to(show))
        .route("/v1/functions/{name}", web::put().to(update))
        .route(
            "/v1/tenants/{tenant}/functions",
            web::get().to(list_for_operator),
        )
        .route(
            "/v1/tenants/{tenant}/functions/{name}",
            web::get().to(show_for_operator),
        )
        .route("/v1/functions/{name}", web::delete().to(delete));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(extra: serde_json::Value) -> FunctionBody {
        let mut v = serde_json::json!({
            "name": "f", "runtime": "custom", "memory_mib": 1024, "compute_milli": 500,
            "tier": "guaranteed", "deadline_ms": 100,
        });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    fn pool_of(extra: serde_json::Value) -> Result<PoolPreference, ApiError> {
        body(extra)
            .into_spec(TenantId("acme".into()))
            .map(|s| s.pool)
    }

    #[test]
    fn a_deploy_carries_model_args_and_env_and_refuses_bad_ones_by_field() {
        use serde_json::json;
        let spec = body(json!({
            "model": "org/model", "args": ["--max-model-len=4096"], "env": {"HF_HOME": "/c"}
        }))
        .into_spec(TenantId("acme".into()))
        .unwrap();
        assert_eq!(spec.model.as_deref(), Some("org/model"));
        assert_eq!(spec.args, ["--max-model-len=4096"]);
        assert_eq!(spec.env["HF_HOME"], "/c");
        // Absent: none, and `{model}` is the name (as before the field).
        let spec = body(json!({})).into_spec(TenantId("acme".into())).unwrap();
        assert_eq!((spec.model.as_deref(), spec.model_or_name()), (None, "f"));
        for (extra, field) in [
            (json!({"model": "../etc"}), "model"),
            (json!({"model": ""}), "model"),
            (json!({"args": ["ok", ""]}), "args[1]"),
            (json!({"env": {"A-B": "x"}}), "env.A-B"),
        ] {
            let e = body(extra.clone())
                .into_spec(TenantId("acme".into()))
                .unwrap_err();
            assert_eq!(
                (e.status, e.code),
                (StatusCode::UNPROCESSABLE_ENTITY, "invalid_spec"),
                "{extra}"
            );
            assert!(e.message.contains(field), "{extra}: {}", e.message);
        }
    }

    #[test]
    fn strict_pool_makes_the_strict_preference_and_needs_a_pool() {
        use serde_json::json;
        assert_eq!(pool_of(json!({})).unwrap(), PoolPreference::Any);
        assert_eq!(
            pool_of(json!({"pool": "edge:edge-a"})).unwrap(),
            PoolPreference::Edge("edge-a".into())
        );
        assert_eq!(
            pool_of(json!({"pool": "edge:edge-a", "strict_pool": true})).unwrap(),
            PoolPreference::EdgeOnly("edge-a".into())
        );
        assert_eq!(
            pool_of(json!({"pool": "center", "strict_pool": true})).unwrap(),
            PoolPreference::CenterOnly
        );
        assert_eq!(
            pool_of(json!({"pool": "center", "strict_pool": false})).unwrap(),
            PoolPreference::Center
        );
        for any in [
            json!({"strict_pool": true}),
            json!({"pool": "any", "strict_pool": true}),
        ] {
            let e = pool_of(any).unwrap_err();
            assert_eq!(
                (e.status, e.code),
                (StatusCode::UNPROCESSABLE_ENTITY, "invalid_spec")
            );
            assert_eq!(
                e.message,
                "invalid function spec: strict_pool: pool is \"any\", and any names no pool"
            );
        }
        // The state's spelling is refused in a body: one way to say it.
        let e = pool_of(json!({"pool": "strict:edge:edge-a"})).unwrap_err();
        assert_eq!(e.code, "invalid_spec");
        assert!(
            e.message.contains(
                "pool: a pool preference is edge:<pool>, center or any, got \
                 \"strict:edge:edge-a\"; for a strict pool send \"pool\": \"edge:edge-a\" \
                 with \"strict_pool\": true"
            ),
            "{}",
            e.message
        );
        // A body without strict_pool reads and writes as before.
        let v = serde_json::to_value(body(json!({"pool": "center"}))).unwrap();
        assert!(v.get("strict_pool").is_none(), "{v}");
        let v = serde_json::to_value(body(json!({"pool": "center", "strict_pool": true}))).unwrap();
        assert_eq!(v["strict_pool"], json!(true));
    }
}
