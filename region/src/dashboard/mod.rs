//! The operator's (and each tenant's) live page, served by every replica.
//!
//! | route | who | what |
//! |---|---|---|
//! | `GET /` | anyone | the page (static HTML: no data in it) |
//! | `GET /dashboard/app.js`, `GET /dashboard/style.css` | anyone | its script and style |
//! | `GET /v1/activity[?scope=replica]` | operator or tenant | what the replicas saw happen ([`activity`]) |
//!
//! The files are embedded in the binary (`include_str!`); nothing is
//! fetched from elsewhere. The script reads the token from the URL
//! fragment (`/#token=…`: a fragment never reaches the server) and polls
//! the `/v1` API with it every two seconds: as the operator
//! `/v1/cluster`, `/v1/cluster/state`, `/v1/activity` and each tenant's
//! `/v1/tenants/{t}/bill`; as a tenant `/v1/cluster`, `/v1/functions`,
//! `/v1/activity` and `/v1/bill`.
//!
//! ```text
//!  browser ──GET /──▶ any replica ──▶ index.html + app.js + style.css (static)
//!     │ fetch(/v1/…, Authorization: Bearer <#token>) every 2 s
//!     ▼
//!  this replica: state routes (applied state) + /v1/activity ──▶ peers' /v1/activity?scope=replica
//! ```
//!
//! `/v1/activity` exists because the rest of the API cannot give it:
//! agents link to one replica (the leader), which alone holds their
//! heartbeats, swaps and the invocations it forwarded; the answer merges
//! the part of every replica (each asked with the caller's token, over TLS
//! when this replica serves it; one that does not answer within
//! [`PEER_TIMEOUT`] is named in `replicas` with its error).

pub mod activity;

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

pub use activity::{Activity, ActivityView};

use crate::agents::forward;
use crate::api::auth::{self, Caller};
use crate::api::ApiError;
use crate::http::HttpContext;

/// The page.
pub const INDEX_HTML: &str = include_str!("static/index.html");
/// Its script.
pub const APP_JS: &str = include_str!("static/app.js");
/// Its style.
pub const STYLE_CSS: &str = include_str!("static/style.css");

/// Longest wait for a peer's part of `/v1/activity`.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest peer part read, bytes.
const MAX_PART_BYTES: usize = 8 << 20;

fn asset(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header(("cache-control", "no-cache"))
        .insert_header(("x-content-type-options", "nosniff"))
        .body(body)
}

async fn index() -> HttpResponse {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> HttpResponse {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style_css() -> HttpResponse {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scope {
    /// `region` (default: every replica's part) or `replica` (this one's).
    #[serde(default)]
    scope: Option<String>,
}

/// This replica's part of the activity, as the operator sees it.
fn local_part(ctx: &HttpContext) -> ActivityView {
    let hub = &ctx.replica.agents;
    let mut part = hub.activity.local_view(
        ctx.replica.id,
        ctx.replica.proposer.now_ms(),
        &hub.reports.list(),
    );
    part.replicas.push(activity::ReplicaPart {
        id: ctx.replica.id,
        http_addr: ctx.replica.node.http_addr.clone(),
        ok: true,
        error: None,
    });
    part
}

/// Asks the peer at `addr` for its part with the caller's `auth` header.
async fn peer_part(ctx: &HttpContext, id: u64, addr: String, auth: String) -> ActivityView {
    let failed = |error: String| ActivityView {
        replicas: vec![activity::ReplicaPart {
            id,
            http_addr: addr.clone(),
            ok: false,
            error: Some(error),
        }],
        ..ActivityView::default()
    };
    let got = tokio::time::timeout(PEER_TIMEOUT, async {
        let headers: [(&str, &[u8]); 1] = [("authorization", auth.as_bytes())];
        let (head, body) = forward::open(
            &addr,
            ctx.forward_tls.clone(),
            "GET",
            "/v1/activity?scope=replica",
            &headers,
            Vec::new(),
        )
        .await?;
        let body = forward::read_reply(&addr, body, MAX_PART_BYTES).await?;
        Ok::<_, forward::ForwardError>((head.status, body))
    })
    .await;
    match got {
        Ok(Ok((200, body))) => match serde_json::from_slice::<ActivityView>(&body) {
            Ok(mut v) => {
                v.replicas = vec![activity::ReplicaPart {
                    id,
                    http_addr: addr.clone(),
                    ok: true,
                    error: None,
                }];
                v
            }
            Err(e) => failed(format!("malformed part: {e}")),
        },
        Ok(Ok((status, _))) => failed(format!("answered {status}")),
        Ok(Err(e)) => failed(e.to_string()),
        Err(_) => failed(format!("no answer within {} s", PEER_TIMEOUT.as_secs())),
    }
}

async fn activity_route(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    q: web::Query<Scope>,
) -> Result<HttpResponse, ApiError> {
    let caller = auth::caller(&req, &ctx).await?;
    let whole = match q.scope.as_deref() {
        None | Some("region") => true,
        Some("replica") => false,
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_query",
                format!("scope must be region or replica, not {other:?}"),
            ))
        }
    };
    let mut view = local_part(&ctx);
    if whole {
        let auth = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let peers: Vec<(u64, String)> = {
            let m = ctx.replica.raft.metrics().borrow().clone();
            m.membership_config
                .membership()
                .nodes()
                .filter(|(id, _)| **id != ctx.replica.id)
                .map(|(id, n)| (*id, n.http_addr.clone()))
                .collect()
        };
        let asks: Vec<_> = peers
            .into_iter()
            .map(|(id, addr)| {
                let ctx = ctx.clone();
                let auth = auth.clone();
                tokio::spawn(async move { peer_part(&ctx, id, addr, auth).await })
            })
            .collect();
        let mut parts = vec![view];
        for a in asks {
            if let Ok(p) = a.await {
                parts.push(p);
            }
        }
        view = activity::merge(ctx.replica.proposer.now_ms(), parts);
    }
    if let Caller::Tenant(t) = caller {
        let st = ctx.replica.state.read();
        view = activity::for_tenant(view, &t.0, st.region.domain());
    }
    Ok(HttpResponse::Ok().json(view))
}

/// Registers the page and `/v1/activity`.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(index))
        .route("/dashboard/app.js", web::get().to(app_js))
        .route("/dashboard/style.css", web::get().to(style_css))
        .route("/v1/activity", web::get().to(activity_route));
}
