//! `/v1/functions` (tenant): deploy (and place `min_instances`), list,
//! show, delete. Names are per tenant; another tenant's function answers
//! 404 exactly like a name nobody uses.
//!
//! Placement: the replica that takes the deploy plans each instance on its
//! applied view with core's planner (`plan_spec_with`, fragmentation-aware
//! ranking, a limited scan of [`FEASIBLE_LIMIT`] feasible candidates from a
//! rotating start) and proposes `InstancePlace`; the state machine re-checks
//! fit and quota on apply. A refusal there (another placement landed first:
//! a stale view) re-plans, up to [`PLACE_ATTEMPTS`] times. If the
//! function's `min_instances` cannot all be placed the deploy is rolled
//! back (the function is deleted, releasing what was placed) and the answer
//! names the resource or quota that ran out. Instances the leader's
//! placement loop (`placement_loop.rs`) placed meanwhile count.

use std::sync::atomic::Ordering;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use gshare_core::bounds;
use gshare_core::model::{
    FunctionSpec, LatencyProfile, PoolPreference, Runtime, Slice, TenantId, Tier,
};
use gshare_core::state::{plan_spec_with, Applied, DomainCommand, InstanceId, PlanOptions};
use serde::{Deserialize, Serialize};

use super::{auth, parse_json, propose, read_body, ApiError};
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
                ctx.api.placements.fetch_add(1, Ordering::Relaxed);
                return Ok(InstanceView {
                    instance,
                    pool: proposal.pool,
                    slices,
                });
            }
            Ok(other) => return Err(ApiError::internal(format!("unexpected {other:?}"))),
            Err(e) if matches!(e.code, "gpu_full" | "quota_exceeded") => {
                // Planned on a view another placement has since changed.
                ctx.api.replans.fetch_add(1, Ordering::Relaxed);
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

async fn deploy(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let tenant = auth::tenant(&req, &ctx)?;
    let body: FunctionBody = parse_json(&read_body(&req, payload).await?)?;
    let spec = body.into_spec(tenant.clone());
    // The same bounds apply re-checks: refused here before anything is proposed.
    bounds::check_spec(&spec).map_err(ApiError::from_bounds)?;
    let version = match propose(&ctx, DomainCommand::FunctionDeploy { spec: spec.clone() }).await? {
        Applied::FunctionDeployed { version, .. } => version,
        other => return Err(ApiError::internal(format!("unexpected {other:?}"))),
    };
    let mut instances = Vec::new();
    let mut races = 0;
    loop {
        let have = {
            let st = ctx.replica.state.read();
            st.region.domain().instance_count(&tenant, &spec.name)
        };
        if have >= spec.min_instances || instances.len() as u32 >= spec.min_instances {
            break;
        }
        match place_one(&ctx, &spec).await {
            Ok(i) => instances.push(i),
            // The leader's placement loop placed one meanwhile (this view lags).
            Err(e) if e.code == "max_instances" && races < 5 => {
                races += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                // Roll back: a deploy places all of min_instances or nothing.
                let _ = propose(
                    &ctx,
                    DomainCommand::FunctionDelete {
                        tenant,
                        name: spec.name.clone(),
                    },
                )
                .await;
                return Err(e);
            }
        }
    }
    if (instances.len() as u32) < spec.min_instances {
        if let Ok(v) = view(&ctx, &tenant, &spec.name) {
            instances = v.instances;
        }
    }
    Ok(HttpResponse::Created().json(FunctionView {
        spec,
        version,
        instances,
    }))
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
    let tenant = auth::tenant(&req, &ctx)?;
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
    let tenant = auth::tenant(&req, &ctx)?;
    Ok(HttpResponse::Ok().json(view(&ctx, &tenant, &path)?))
}

async fn delete(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let tenant = auth::tenant(&req, &ctx)?;
    let applied = propose(
        &ctx,
        DomainCommand::FunctionDelete {
            tenant,
            name: path.into_inner(),
        },
    )
    .await?;
    Ok(HttpResponse::build(StatusCode::OK).json(applied))
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/functions", web::post().to(deploy))
        .route("/v1/functions", web::get().to(list))
        .route("/v1/functions/{name}", web::get().to(show))
        .route("/v1/functions/{name}", web::delete().to(delete));
}
