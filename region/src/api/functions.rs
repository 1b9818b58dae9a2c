//! `/v1/functions` (tenant): deploy (and place `min_instances`), list,
//! show, delete. Names are per tenant; another tenant's function answers
//! 404 exactly like a name nobody uses.
//!
//! Placement: the replica that takes the deploy plans its `min_instances`
//! instances on its applied view with core's planner (`plan_spec_with`,
//! fragmentation-aware ranking, a limited scan of [`FEASIBLE_LIMIT`]
//! feasible candidates from a rotating start) and proposes one
//! `FunctionCreate` (deploy and placements together) under the request's
//! idempotency key (`idempotency.rs`); the state machine re-checks fit and
//! quota on apply and takes all of it or none of it. A refusal there
//! (another placement landed first: a stale view) re-plans, up to
//! [`PLACE_ATTEMPTS`] times. A refused deploy left nothing behind; its
//! answer names the resource or quota that ran out. The leader's placement
//! loop (`placement_loop.rs`) uses [`place_one`] for functions below
//! `min_instances` later (a drained node, a reshaping update).

use std::sync::atomic::Ordering;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::bounds;
use gshare_core::model::{
    FunctionSpec, LatencyProfile, PoolPreference, Runtime, Slice, TenantId, Tier,
};
use gshare_core::state::{
    plan_spec_with, Applied, ApplyError, DomainCommand, InstanceId, KeyLookup, ObjectKind,
    PlanOptions, RegionState,
};
use serde::{Deserialize, Serialize};

use super::{auth, idempotency, parse_json, propose, read_body, ApiError};
use crate::http::HttpContext;

/// Feasible candidates a plan ranks before it stops (Nomad ranks about
/// log2(nodes); the region's tests and benchmark use 1,000-node topologies).
pub const FEASIBLE_LIMIT: u32 = 16;
/// Plans per instance before a stale-view refusal is given up.
pub const PLACE_ATTEMPTS: u32 = 8;

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
    /// `edge:<pool>`, `center` or `any` (default `any`).
    #[serde(default = "any_pool")]
    pub pool: PoolPreference,
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
    /// The spec of `tenant`'s function.
    pub fn into_spec(self, tenant: TenantId) -> FunctionSpec {
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
        FunctionSpec {
            tenant,
            name: self.name,
            runtime: self.runtime,
            memory_mib: self.memory_mib,
            compute_milli: self.compute_milli,
            tier: self.tier,
            deadline_ms: self.deadline_ms,
            pool: self.pool,
            min_instances: self.min_instances,
            max_instances: self.max_instances.unwrap_or(self.min_instances.max(1)),
            idle_timeout_s: self.idle_timeout_s,
            latency,
        }
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
}

/// Plans and proposes one instance of `spec`, re-planning after stale-view refusals.
pub async fn place_one(ctx: &HttpContext, spec: &FunctionSpec) -> Result<InstanceView, ApiError> {
    let mut last = None;
    for attempt in 0..PLACE_ATTEMPTS {
        let planned = {
            let st = ctx.replica.state.read();
            let d = st.region.domain();
            let ranking = ctx.api.ranking(d);
            let options = PlanOptions {
                feasible_limit: Some(FEASIBLE_LIMIT),
                start: ctx.api.plan_start.fetch_add(7, Ordering::Relaxed),
            };
            plan_spec_with(d, spec, &*ranking, &options)
        };
        let proposal = match planned {
            Ok(p) => p,
            Err(r) => {
                ctx.api.reject(r.code());
                return Err(ApiError::from_rejection(&r));
            }
        };
        match propose(ctx, proposal.command()).await {
            Ok(Applied::InstancePlaced { instance, slices }) => {
                ctx.api.placements.inc();
                return Ok(InstanceView {
                    instance,
                    pool: proposal.pool,
                    slices,
                });
            }
            Ok(other) => return Err(ApiError::internal(format!("unexpected {other:?}"))),
            Err(e) if matches!(e.code, "gpu_full" | "quota_exceeded") => {
                // Planned on a view another placement has since changed.
                ctx.api.replans.inc();
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(2 << attempt.min(5))).await;
            }
            Err(e) => {
                ctx.api.reject(e.code);
                return Err(e);
            }
        }
    }
    let e = last.unwrap_or_else(|| ApiError::internal("no placement attempt"));
    ctx.api.reject(e.code);
    Err(e)
}

/// The slices of `spec.min_instances` instances planned on this replica's
/// view, each planned with the ones before it counted.
fn plan_all(ctx: &HttpContext, spec: &FunctionSpec) -> Result<Vec<Vec<Slice>>, ApiError> {
    let st = ctx.replica.state.read();
    let d = st.region.domain();
    // The name is taken: say so (apply would refuse the create the same
    // way), rather than the planner's view of the existing instances.
    if d.function(&spec.tenant, &spec.name).is_ok() {
        return Err(ApiError::from_apply(&ApplyError::DuplicateName {
            kind: ObjectKind::Function,
            name: spec.name.clone(),
        }));
    }
    let ranking = ctx.api.ranking(d);
    let plan = |view: &RegionState| {
        let options = PlanOptions {
            feasible_limit: Some(FEASIBLE_LIMIT),
            start: ctx.api.plan_start.fetch_add(7, Ordering::Relaxed),
        };
        plan_spec_with(view, spec, &*ranking, &options).map_err(|r| {
            ctx.api.reject(r.code());
            ApiError::from_rejection(&r)
        })
    };
    match spec.min_instances {
        0 => Ok(Vec::new()),
        1 => Ok(vec![plan(d)?.slices]),
        n => {
            // Later instances are planned on a copy holding the earlier ones.
            let now = crate::proposer::unix_ms();
            let mut view = d.clone();
            view.apply(DomainCommand::FunctionDeploy { spec: spec.clone() }, now)
                .map_err(|e| ApiError::from_apply(&e))?;
            let mut out = Vec::new();
            for _ in 0..n {
                let p = plan(&view)?;
                view.apply(p.command(), now)
                    .map_err(|e| ApiError::from_apply(&e))?;
                out.push(p.slices);
            }
            Ok(out)
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
            })
            .collect(),
    })
}

/// `POST /v1/functions`: the deploy and the placement of `min_instances`
/// are one replicated command (all of it or nothing), under the request's
/// idempotency key. A refusal because the plan's view was stale (another
/// placement landed first) re-plans, up to [`PLACE_ATTEMPTS`] times.
async fn deploy(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let tenant = auth::tenant(&req, &ctx).await?;
    let raw = read_body(&req, payload).await?;
    let key = idempotency::write_key(&req, &ctx, &raw)?;
    let body: FunctionBody = parse_json(&raw).map_err(|e| e.with_key(&key.key))?;
    let spec = body.into_spec(tenant.clone());
    // The same bounds apply re-checks: refused here before anything is proposed.
    bounds::check_spec(&spec).map_err(|e| ApiError::from_bounds(e).with_key(&key.key))?;
    let answer = |view: FunctionView| {
        HttpResponse::Created()
            .insert_header((idempotency::HEADER, key.key.as_str()))
            .json(view)
    };
    let mut last = None;
    for attempt in 0..PLACE_ATTEMPTS {
        match idempotency::local_lookup(&ctx, &tenant, &key) {
            KeyLookup::Replay(applied) => return Ok(answer(created(&ctx, spec, applied)?)),
            KeyLookup::Reused => {
                return Err(ApiError::from_apply(&ApplyError::IdempotencyKeyReused {
                    key: key.key.clone(),
                })
                .with_key(&key.key))
            }
            KeyLookup::New => {}
        }
        let placements = match plan_all(&ctx, &spec) {
            Ok(p) => p,
            // A key the client sent may already be applied at the leader and
            // not yet here: give the view a moment before refusing.
            Err(e) if key.from_client && attempt + 1 < PLACE_ATTEMPTS => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(e) => return Err(e.with_key(&key.key)),
        };
        let command = DomainCommand::FunctionCreate {
            spec: spec.clone(),
            placements,
        };
        match idempotency::propose_keyed(&ctx, &tenant, &key, command).await {
            Ok(applied) => {
                if let Applied::FunctionCreated { instances, .. } = &applied {
                    ctx.api.placements.inc_by(instances.len() as u64);
                }
                return Ok(answer(created(&ctx, spec, applied)?));
            }
            Err(e) if matches!(e.code, "gpu_full" | "quota_exceeded" | "max_instances") => {
                // Planned on a view another placement has since changed.
                ctx.api.replans.inc();
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(2 << attempt.min(5))).await;
            }
            Err(e) => {
                ctx.api.reject(e.code);
                return Err(e);
            }
        }
    }
    let e = last.unwrap_or_else(|| ApiError::internal("no placement attempt"));
    ctx.api.reject(e.code);
    Err(e.with_key(&key.key))
}

fn view(ctx: &HttpContext, tenant: &TenantId, name: &str) -> Result<FunctionView, ApiError> {
    let st = ctx.replica.state.read();
    let d = st.region.domain();
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
            })
            .collect(),
    })
}

async fn list(req: HttpRequest, ctx: web::Data<HttpContext>) -> Result<HttpResponse, ApiError> {
    let tenant = auth::tenant(&req, &ctx).await?;
    let names: Vec<String> = {
        let st = ctx.replica.state.read();
        st.region
            .domain()
            .functions_of(&tenant)
            .map(|f| f.spec.name.clone())
            .collect()
    };
    let views = names
        .iter()
        .map(|n| view(&ctx, &tenant, n))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HttpResponse::Ok().json(views))
}

async fn show(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let tenant = auth::tenant(&req, &ctx).await?;
    Ok(HttpResponse::Ok().json(view(&ctx, &tenant, &path)?))
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
        .route("/v1/functions/{name}", web::delete().to(delete));
}
