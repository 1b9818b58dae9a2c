//! The replica's HTTP surface (actix-web).
//!
//! | route | who | what |
//! |---|---|---|
//! | `GET /` | anyone | the dashboard page (`crate::dashboard`; its data come from `/v1` with the token in the URL fragment) |
//! | `GET /healthz` | anyone | `ok` while the process serves |
//! | `GET /v1/cluster` | anyone | id, role, leader, term, commit index, members |
//! | `GET /metrics` | anyone; tenant series with the metrics or operator token | Prometheus text of the same figures and QUIC counters |
//! | `POST /v1/cluster/replicas` `{id, raft_addr, http_addr}` | operator, leader | add as learner, then voter |
//! | `DELETE /v1/cluster/replicas/{id}` | operator, leader | remove a voter |
//!
//! Membership changes answer `421 not_leader` with the leader's HTTP
//! address on a follower; `gsharectl` follows it. Every error, including
//! an unknown route or method, is [`ApiError`]'s one shape.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use actix_web::{web, HttpRequest, HttpResponse};
use gshare_raft_store::ReplicaNode;
use openraft::{ChangeMembers, ServerState};
use serde::{Deserialize, Serialize};

use crate::api::ApiError;
use crate::replica::Replica;
use gshare_core::protocol::token_digest;

/// What the HTTP handlers share.
#[derive(Debug, Clone)]
pub struct HttpContext {
    /// The replica served.
    pub replica: Replica,
    /// The operator's bearer token.
    pub operator_token: String,
    /// The token that unlocks tenant-labelled series on `/metrics`
    /// (`metrics_token_file`); the operator token does too.
    pub metrics_token: Option<String>,
    /// The domain API's counters and caches (`crate::api`).
    pub api: std::sync::Arc<crate::api::ApiState>,
    /// TLS for invocations forwarded to peer replicas: set when this
    /// replica serves HTTPS (`[http_tls]`), `None` for plain HTTP.
    pub forward_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// What an invocation's request body may be: its size
    /// (`max_request_bytes`) and its pauses (`body_idle_timeout_ms`).
    pub body_limits: gshare_core::net::http_client::BodyLimits,
}

/// One member in [`ClusterStatus`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberStatus {
    /// Raft id.
    pub id: u64,
    /// QUIC address.
    pub raft_addr: String,
    /// HTTP address.
    pub http_addr: String,
    /// Voter (true) or learner (false).
    pub voter: bool,
}

/// The answer of `GET /v1/cluster`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// This replica's id.
    pub id: u64,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub role: String,
    /// The leader's id, if known.
    pub leader: Option<u64>,
    /// The leader's HTTP address, if known.
    pub leader_http: Option<String>,
    /// Current term.
    pub term: u64,
    /// Highest log index known committed.
    pub commit_index: Option<u64>,
    /// Highest log index applied here.
    pub last_applied: Option<u64>,
    /// Highest log index stored here.
    pub last_log_index: Option<u64>,
    /// Last log index covered by this replica's snapshot.
    pub snapshot_index: Option<u64>,
    /// Highest log index purged from this replica's log.
    pub purged_index: Option<u64>,
    /// Members of the current configuration.
    pub members: Vec<MemberStatus>,
    /// A membership change is half done: its joint configuration (the old
    /// and the new voters together) is in force, and `members` marks the
    /// voters of both as voters. Sending the change again finishes it.
    #[serde(default)]
    pub joint: bool,
}

/// The body of `POST /v1/cluster/replicas`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewReplica {
    /// Raft id of the new replica.
    pub id: u64,
    /// Its QUIC address.
    pub raft_addr: String,
    /// Its HTTP address.
    pub http_addr: String,
}

fn role(s: ServerState) -> &'static str {
    match s {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

/// Builds the cluster status of `replica`.
pub async fn cluster_status(replica: &Replica) -> ClusterStatus {
    let commit_index = replica
        .raft
        .with_raft_state(|st| st.committed.map(|l| l.index))
        .await
        .ok()
        .flatten();
    let m = replica.raft.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let members = membership
        .nodes()
        .map(|(id, n)| MemberStatus {
            id: *id,
            raft_addr: n.raft_addr.clone(),
            http_addr: n.http_addr.clone(),
            voter: voters.contains(id),
        })
        .collect();
    let leader_http = m
        .current_leader
        .and_then(|l| membership.get_node(&l).map(|n| n.http_addr.clone()));
    ClusterStatus {
        id: replica.id,
        role: role(m.state).to_string(),
        leader: m.current_leader,
        leader_http,
        term: m.current_term,
        commit_index,
        last_applied: m.last_applied.map(|l| l.index),
        last_log_index: m.last_log_index,
        snapshot_index: m.snapshot.map(|l| l.index),
        purged_index: m.purged.map(|l| l.index),
        members,
        joint: membership.get_joint_config().len() > 1,
    }
}

/// The refusal of a request without the operator token, if it lacks it.
async fn refuse_unless_operator(req: &HttpRequest, ctx: &HttpContext) -> Option<HttpResponse> {
    crate::api::auth::operator(req, ctx)
        .await
        .err()
        .map(|e| actix_web::ResponseError::error_response(&e))
}

fn answer(e: ApiError) -> HttpResponse {
    actix_web::ResponseError::error_response(&e)
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

async fn cluster(ctx: web::Data<HttpContext>) -> HttpResponse {
    HttpResponse::Ok().json(cluster_status(&ctx.replica).await)
}

/// Whether the request may see tenant-labelled series: no token means
/// no (the public series only); a wrong token is refused.
fn sees_tenant_series(req: &HttpRequest, ctx: &HttpContext) -> Result<bool, ApiError> {
    if !req.headers().contains_key("authorization") {
        return Ok(false);
    }
    let digest = token_digest(crate::api::auth::bearer(req)?);
    let metrics = ctx.metrics_token.as_deref().map(token_digest);
    if digest == token_digest(&ctx.operator_token) || metrics.as_ref() == Some(&digest) {
        Ok(true)
    } else {
        Err(ApiError::new(
            actix_web::http::StatusCode::UNAUTHORIZED,
            "unauthorized",
            "/metrics takes the metrics token or the operator token (or none: public series only)",
        ))
    }
}

async fn metrics(req: HttpRequest, ctx: web::Data<HttpContext>) -> HttpResponse {
    let full = match sees_tenant_series(&req, &ctx) {
        Ok(full) => full,
        Err(e) => return answer(e),
    };
    let mut sampler = gshare_core::metrics::Sampler::new();
    sample_replica(&ctx.replica, &mut sampler).await;
    ctx.api
        .sample(ctx.replica.state.read().region.domain(), &mut sampler);
    ctx.replica.agents.reports.sample(&mut sampler);
    ctx.replica.scheduler.counters().sample(&mut sampler);
    match gshare_core::metrics::exposition(ctx.api.registry(), sampler.into_families(), full) {
        Ok(text) => HttpResponse::Ok()
            .content_type("text/plain; version=0.0.4")
            .body(text),
        Err(e) => answer(ApiError::new(
            actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
            "metrics",
            e.to_string(),
        )),
    }
}

mod series {
    use gshare_core::metrics::Series;

    pub const RAFT: [Series; 10] = [
        Series::gauge("gshare_region_raft_term", "Current Raft term", &[]),
        Series::gauge(
            "gshare_region_raft_commit_index",
            "Highest committed log index, -1 if none",
            &[],
        ),
        Series::gauge(
            "gshare_region_raft_last_applied_index",
            "Highest applied log index, -1 if none",
            &[],
        ),
        Series::gauge(
            "gshare_region_raft_last_log_index",
            "Highest stored log index, -1 if none",
            &[],
        ),
        Series::gauge(
            "gshare_region_raft_snapshot_index",
            "Last index in the snapshot, -1 if none",
            &[],
        ),
        Series::gauge(
            "gshare_region_raft_purged_index",
            "Highest purged log index, -1 if none",
            &[],
        ),
        Series::gauge(
            "gshare_region_raft_is_leader",
            "1 if this replica leads",
            &[],
        ),
        Series::gauge(
            "gshare_region_raft_leader_id",
            "Known leader id, 0 if none",
            &[],
        ),
        Series::gauge(
            "gshare_region_raft_members",
            "Members of the configuration",
            &[],
        ),
        Series::gauge(
            "gshare_region_keys",
            "Key/value entries in the applied state (written by older versions only)",
            &[],
        ),
    ];

    pub const QUIC: [Series; 5] = [
        Series::counter(
            "gshare_region_quic_connections_total",
            "QUIC connections accepted",
            &[],
        ),
        Series::counter(
            "gshare_region_quic_handshake_failures_total",
            "QUIC handshakes failed",
            &[],
        ),
        Series::counter(
            "gshare_region_quic_requests_total",
            "Peer requests answered",
            &[],
        ),
        Series::counter(
            "gshare_region_quic_bad_frames_total",
            "Connections closed for a bad frame",
            &[],
        ),
        Series::counter(
            "gshare_region_quic_peers_refused_total",
            "Peer-protocol connections refused: the certificate is not a known replica's (r<id>)",
            &[],
        ),
    ];
}

/// Samples the Raft figures and QUIC counters of `replica`.
pub async fn sample_replica(replica: &Replica, out: &mut gshare_core::metrics::Sampler) {
    let st = cluster_status(replica).await;
    let c = &replica.counters;
    let keys = replica.state.read().region.len() as f64;
    let index = |i: Option<u64>| i.map_or(-1.0, |i| i as f64);
    let raft = [
        st.term as f64,
        index(st.commit_index),
        index(st.last_applied),
        index(st.last_log_index),
        index(st.snapshot_index),
        index(st.purged_index),
        f64::from(u8::from(st.role == "leader")),
        st.leader.unwrap_or(0) as f64,
        st.members.len() as f64,
        keys,
    ];
    for (s, v) in series::RAFT.iter().zip(raft) {
        out.add(s, &[], v);
    }
    let quic = [
        &c.connections,
        &c.handshake_failures,
        &c.requests,
        &c.bad_frames,
        &c.peers_refused,
    ];
    for (s, v) in series::QUIC.iter().zip(quic) {
        out.add(s, &[], v.load(Ordering::Relaxed) as f64);
    }
}

/// Parses a JSON body after authorization, so a stranger learns nothing from parse errors.
fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Box<HttpResponse>> {
    crate::api::parse_json(body).map_err(|e| Box::new(answer(e)))
}

fn not_leader(st: &ClusterStatus) -> HttpResponse {
    answer(ApiError::not_leader(st.leader, st.leader_http.clone()))
}

/// How long a membership request (adding a replica: the learner, which
/// waits for it to catch up, then its promotion; removing a voter) may take
/// before its answer says the outcome is unknown: a change needs a quorum
/// to commit, and without one openraft would hold the request for ever.
/// One deadline for the whole request, below the 30 s that `gsharectl
/// cluster` waits for an answer.
pub const MEMBERSHIP_WITHIN: std::time::Duration = std::time::Duration::from_secs(25);

/// Most log entries a new replica may lag the leader by when it is
/// promoted: with a voter down, the new configuration's quorum may need the
/// new one, and every write would wait while it caught up further.
const PROMOTION_LAG: u64 = 256;

/// Why a membership change was not made.
enum MembershipRefusal {
    /// This replica no longer leads (its uncommitted change was dropped):
    /// the change did not happen; send it to the leader.
    NotLeader(Option<u64>, Option<String>),
    /// openraft refused it (e.g. another change in progress, a stopped
    /// Raft): nothing changed.
    Refused(String),
}

type ChangeError =
    openraft::error::RaftError<u64, openraft::error::ClientWriteError<u64, ReplicaNode>>;

fn refusal(what: &str, e: ChangeError) -> MembershipRefusal {
    use openraft::error::{ClientWriteError, RaftError};
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            MembershipRefusal::NotLeader(f.leader_id, f.leader_node.map(|n| n.http_addr))
        }
        other => MembershipRefusal::Refused(format!("{what}: {other}")),
    }
}

/// The answer to a refused membership change.
fn refused(r: MembershipRefusal) -> HttpResponse {
    match r {
        MembershipRefusal::NotLeader(leader, leader_http) => {
            answer(ApiError::not_leader(leader, leader_http))
        }
        MembershipRefusal::Refused(why) => answer(ApiError::new(
            actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
            "membership",
            why,
        )),
    }
}

/// Whether the latest membership (committed or not) is joint with `id` a
/// voter of its old half only: a removal of `id` half done.
fn being_removed(raft: &openraft::Raft<gshare_raft_store::TypeConfig>, id: u64) -> bool {
    let m = raft.metrics().borrow().membership_config.clone();
    match m.membership().get_joint_config().as_slice() {
        [old, new] => old.contains(&id) && !new.contains(&id),
        _ => false,
    }
}

/// Where an add left replica `id` when it was refused: what the answer
/// says happened (as this replica's latest membership, which may not be
/// committed yet, has it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AddLeft {
    /// Added as a learner, its addition committed at this log index, and
    /// not promoted (not a voter in any configuration).
    Learner(u64),
    /// A voter of a joint configuration (a change half done: this
    /// request's promotion where it added the learner).
    JointVoter {
        /// This request added it as a learner (so the change is its
        /// promotion).
        promoting: bool,
    },
    /// A voter (the refusal came after the promotion took effect).
    Voter,
    /// Not a voter; nothing was added by this request (it only promoted).
    NotVoter,
}

impl AddLeft {
    /// Where `raft`'s latest membership has `id`, after this request added
    /// it as a learner at `added` (`None`: it did not add it).
    fn now(
        raft: &openraft::Raft<gshare_raft_store::TypeConfig>,
        id: u64,
        added: Option<u64>,
    ) -> Self {
        let m = raft.metrics().borrow().membership_config.clone();
        let membership = m.membership();
        if membership.voter_ids().any(|v| v == id) {
            if membership.get_joint_config().len() > 1 {
                AddLeft::JointVoter {
                    promoting: added.is_some(),
                }
            } else {
                AddLeft::Voter
            }
        } else {
            added.map_or(AddLeft::NotVoter, AddLeft::Learner)
        }
    }
}

/// The answer to a refusal that came after this request changed the
/// membership (added replica `id` as a learner, or began its promotion):
/// the same status and code as [`refused`], so a client follows a
/// `not_leader` as before, but the message says where it left the replica.
fn refused_after_add(id: u64, left: AddLeft, r: MembershipRefusal) -> HttpResponse {
    answer(after_add(id, left, r))
}

/// The error of [`refused_after_add`].
fn after_add(id: u64, left: AddLeft, r: MembershipRefusal) -> ApiError {
    let (done, again) = match left {
        AddLeft::Learner(added) => (
            format!("replica {id} was added as a learner (committed at log index {added}) but not promoted to voter"),
            "send the same request again to promote it once it has caught up, or remove it",
        ),
        AddLeft::JointVoter { promoting: true } => (
            format!("replica {id} was added as a learner and this replica's latest membership (perhaps not yet committed) has it a voter of a joint configuration (its promotion half done)"),
            "send the same request again to finish it (GET /v1/cluster shows `joint`)",
        ),
        AddLeft::JointVoter { promoting: false } => (
            format!("this replica's latest membership (perhaps not yet committed) is a joint configuration (a membership change half done) with replica {id} a voter"),
            "send the same request again to finish it (GET /v1/cluster shows `joint`)",
        ),
        AddLeft::Voter => (
            format!("this replica's latest membership (perhaps not yet committed) has replica {id} a voter (the refusal came after its promotion)"),
            "see GET /v1/cluster",
        ),
        AddLeft::NotVoter => (
            format!("replica {id} is not a voter"),
            "send the same request again",
        ),
    };
    match r {
        MembershipRefusal::NotLeader(leader, leader_http) => {
            let mut e = ApiError::not_leader(leader, leader_http);
            e.message =
                format!("{done}: this replica lost its leadership; {again} (at the leader)");
            e
        }
        MembershipRefusal::Refused(why) => ApiError::new(
            actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
            "membership",
            format!("{done}: {why}; {again}"),
        ),
    }
}

/// Runs `change` (a voter change described by `what`) in a task of its own
/// and waits for it until `deadline`; past that, `502 outcome_unknown`. The
/// task goes on after the answer: openraft changes the voters in two
/// commits (a joint configuration, then the final one), both made by the
/// caller's future, so a future dropped in between would leave the region
/// in the joint configuration for good.
async fn membership_by(
    deadline: tokio::time::Instant,
    what: String,
    change: impl std::future::Future<Output = Result<(), MembershipRefusal>> + Send + 'static,
) -> Result<(), ChangeFailure> {
    let task = tokio::spawn(change);
    match tokio::time::timeout_at(deadline, task).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(r))) => Err(ChangeFailure::Refused(r)),
        Ok(Err(join)) => Err(ChangeFailure::Unknown(answer(ApiError::outcome_unknown(format!(
            "{what}: the change's task ended without an answer ({join}); see GET /v1/cluster"
        ))))),
        Err(_) => Err(ChangeFailure::Unknown(answer(ApiError::outcome_unknown(format!(
            "{what}: not done within {} s (the region may have lost its quorum); this replica goes on with it while it leads: see GET /v1/cluster, and send the same request again if it is not done or `joint` is true (while it is still under way the answer is 503 membership)",
            MEMBERSHIP_WITHIN.as_secs()
        ))))),
    }
}

/// How a voter change run by [`membership_by`] failed.
enum ChangeFailure {
    /// openraft refused it.
    Refused(MembershipRefusal),
    /// Its outcome is unknown: the answer says so.
    Unknown(HttpResponse),
}

async fn add_replica(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    body: web::Bytes,
) -> HttpResponse {
    if let Some(refusal) = refuse_unless_operator(&req, &ctx).await {
        return refusal;
    }
    let st = cluster_status(&ctx.replica).await;
    if st.role != "leader" {
        return not_leader(&st);
    }
    let NewReplica {
        id,
        raft_addr,
        http_addr,
    } = match json_body(&body) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    if raft_addr.parse::<std::net::SocketAddr>().is_err()
        || http_addr.parse::<std::net::SocketAddr>().is_err()
    {
        return answer(ApiError::bad_request(
            "raft_addr and http_addr must be ip:port",
        ));
    }
    // A member already: openraft keeps the addresses it has, so other ones
    // are refused rather than silently ignored; a voter at the same ones is
    // done.
    if let Some(m) = st.members.iter().find(|m| m.id == id) {
        if (m.raft_addr.as_str(), m.http_addr.as_str()) != (raft_addr.as_str(), http_addr.as_str())
        {
            return answer(ApiError::new(
                actix_web::http::StatusCode::CONFLICT,
                "membership",
                format!(
                    "replica {id} is a member at raft_addr {} and http_addr {}: remove it first to change its addresses",
                    m.raft_addr, m.http_addr
                ),
            ));
        }
        if m.voter && !st.joint {
            return HttpResponse::Ok().json(st);
        }
        // A voter of a joint configuration: where it is a voter of the new
        // half (its promotion, or another replica's removal, half done),
        // the promotion below finishes the change; where it is being
        // removed, promoting it would revert the removal without checking
        // that it is still there to catch up: refused.
        if m.voter && st.joint && being_removed(&ctx.replica.raft, id) {
            return answer(ApiError::new(
                actix_web::http::StatusCode::CONFLICT,
                "membership",
                format!(
                    "replica {id} is being removed (a removal half done: GET /v1/cluster shows `joint`): finish it with the same removal first, then add it again"
                ),
            ));
        }
    }
    let deadline = tokio::time::Instant::now() + MEMBERSHIP_WITHIN;
    let raft = ctx.replica.raft.clone();
    let added = if st.members.iter().any(|m| m.id == id && m.voter) {
        None
    } else {
        let node = ReplicaNode {
            raft_addr,
            http_addr,
        };
        match add_learner_caught_up(&raft, id, node, deadline).await {
            Ok(added) => Some(added),
            Err(resp) => return resp,
        }
    };
    let change = async move {
        raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map(|_| ())
            .map_err(|e| refusal(&format!("promoting {id} to voter"), e))
    };
    match membership_by(deadline, format!("promoting {id} to voter"), change).await {
        Ok(()) => HttpResponse::Ok().json(cluster_status(&ctx.replica).await),
        Err(ChangeFailure::Refused(r)) => {
            refused_after_add(id, AddLeft::now(&ctx.replica.raft, id, added), r)
        }
        Err(ChangeFailure::Unknown(resp)) => resp,
    }
}

/// Adds replica `id` at `node` as a learner and waits, until `deadline`,
/// for it to catch up; the log index its addition committed at, or the
/// answer to give.
async fn add_learner_caught_up(
    raft: &openraft::Raft<gshare_raft_store::TypeConfig>,
    id: u64,
    node: ReplicaNode,
    deadline: tokio::time::Instant,
) -> Result<u64, HttpResponse> {
    // The learner, then its catch-up, within the request: a future dropped
    // here leaves at most the learner added (one commit), never a promotion
    // made later without a request. Caught up means it acknowledged the
    // entry that added it and is within `PROMOTION_LAG` entries of the
    // leader's log: openraft's own blocking `add_learner` calls a
    // learner caught up while the leader's log is within its lag threshold
    // (5,000 entries) of it, which a learner that never answered is on a
    // young region, so an unreachable replica became a voter at once and
    // the region needed one more replica for its quorum.
    let added = match tokio::time::timeout_at(deadline, raft.add_learner(id, node, false)).await {
        Ok(Ok(resp)) => resp.log_id.index,
        Ok(Err(e)) => return Err(refused(refusal(&format!("adding learner {id}"), e))),
        Err(_) => {
            return Err(answer(ApiError::outcome_unknown(format!(
                "adding replica {id}: its addition as a learner was not committed within {} s (the region may have lost its quorum; if it commits, the learner catches up meanwhile); it is not a voter: see GET /v1/cluster, and send the same request again, which promotes it once it has caught up (or remove it)",
                MEMBERSHIP_WITHIN.as_secs()
            ))))
        }
    };
    let wait = raft.wait(None);
    let caught_up = wait.metrics(
        move |m| {
            // No longer the leader: answered below.
            m.replication.as_ref().is_none_or(|r| {
                r.get(&id)
                    .and_then(|matched| matched.as_ref())
                    .is_some_and(|matched| {
                        matched.index >= added
                            && m.last_log_index.unwrap_or(0).saturating_sub(matched.index)
                                <= PROMOTION_LAG
                    })
            })
        },
        "the new learner acknowledged its addition",
    );
    match tokio::time::timeout_at(deadline, caught_up).await {
        Ok(Ok(m)) if m.replication.is_none() => {
            let leader_http = m.current_leader.and_then(|l| {
                m.membership_config
                    .membership()
                    .get_node(&l)
                    .map(|n| n.http_addr.clone())
            });
            Err(refused_after_add(
                id,
                AddLeft::Learner(added),
                MembershipRefusal::NotLeader(m.current_leader, leader_http),
            ))
        }
        Ok(Ok(_)) => Ok(added),
        Ok(Err(e)) => Err(refused_after_add(
            id,
            AddLeft::Learner(added),
            MembershipRefusal::Refused(format!("waiting for it to catch up: {e}")),
        )),
        Err(_) => Err(answer(ApiError::outcome_unknown(format!(
            "adding replica {id}: it was added as a learner (committed at log index {added}) but has not caught up within {} s (it goes on catching up, if it can be reached); it is not a voter: see GET /v1/cluster, and send the same request again, which promotes it once it has caught up (or remove it)",
            MEMBERSHIP_WITHIN.as_secs()
        )))),
    }
}

async fn remove_replica(
    req: HttpRequest,
    ctx: web::Data<HttpContext>,
    path: web::Path<u64>,
) -> HttpResponse {
    if let Some(refusal) = refuse_unless_operator(&req, &ctx).await {
        return refusal;
    }
    let st = cluster_status(&ctx.replica).await;
    if st.role != "leader" {
        return not_leader(&st);
    }
    let id = path.into_inner();
    let Some(member) = st.members.iter().find(|m| m.id == id) else {
        return answer(ApiError::not_found(format!("replica {id} is not a member")));
    };
    // A learner (added, never promoted) is no voter to remove: it is
    // removed as a node (`RemoveVoters` of it changed nothing and answered
    // 200).
    let changes = if member.voter {
        ChangeMembers::RemoveVoters(BTreeSet::from([id]))
    } else {
        ChangeMembers::RemoveNodes(BTreeSet::from([id]))
    };
    let deadline = tokio::time::Instant::now() + MEMBERSHIP_WITHIN;
    let raft = ctx.replica.raft.clone();
    let change = async move {
        raft.change_membership(changes, false)
            .await
            .map(|_| ())
            .map_err(|e| refusal(&format!("removing {id}"), e))
    };
    match membership_by(deadline, format!("removing {id}"), change).await {
        Ok(()) => HttpResponse::Ok().json(cluster_status(&ctx.replica).await),
        Err(ChangeFailure::Refused(r)) => refused(r),
        Err(ChangeFailure::Unknown(resp)) => resp,
    }
}

/// Registers every route on an actix `App`.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/healthz", web::get().to(healthz))
        .route("/metrics", web::get().to(metrics))
        .route("/v1/cluster", web::get().to(cluster))
        .route("/v1/cluster/replicas", web::post().to(add_replica))
        .route(
            "/v1/cluster/replicas/{id}",
            web::delete().to(remove_replica),
        );
    crate::api::routes(cfg);
    crate::dashboard::routes(cfg);
    cfg.route(
        "/v1/invoke/{tenant}/{name}",
        web::post().to(crate::agents::invoke_route),
    )
    .route(
        "/v1/invoke/{tenant}/{name}/{path:.*}",
        web::route().to(crate::agents::invoke_transparent_route),
    )
    .default_service(web::to(unknown_route));
}

/// Any path or method without a route: 404 `unknown_route` (not an empty 404).
async fn unknown_route(req: HttpRequest) -> HttpResponse {
    answer(ApiError::unknown_route(req.method().as_str(), req.path()))
}

/// Binds the HTTP server of `ctx` on `addr` (run the returned server to serve).
pub fn server(
    ctx: HttpContext,
    addr: std::net::SocketAddr,
    workers: usize,
    tls: Option<rustls::ServerConfig>,
) -> std::io::Result<actix_web::dev::Server> {
    let data = web::Data::new(ctx);
    let server = actix_web::HttpServer::new(move || {
        actix_web::App::new()
            .app_data(data.clone())
            .configure(routes)
    })
    .workers(workers)
    .disable_signals();
    let server = match tls {
        Some(tls) => server.bind_rustls_0_23(addr, tls)?,
        None => server.bind(addr)?,
    };
    Ok(server.run())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_after_the_learner_was_added_says_where_it_left_it() {
        // Leadership lost while it caught up: still a 421 that clients
        // follow, no longer "the change did not happen".
        let e = after_add(
            4,
            AddLeft::Learner(17),
            MembershipRefusal::NotLeader(Some(2), None),
        );
        assert_eq!((e.status.as_u16(), e.code), (421, "not_leader"));
        assert!(
            e.message
                .starts_with("replica 4 was added as a learner (committed at log index 17)"),
            "{}",
            e.message
        );
        // The promotion refused: 503 as any refused change, saying what stays.
        let e = after_add(
            4,
            AddLeft::Learner(17),
            MembershipRefusal::Refused("promoting 4 to voter: in progress".into()),
        );
        assert_eq!((e.status.as_u16(), e.code), (503, "membership"));
        assert!(
            e.message.contains("was added as a learner"),
            "{}",
            e.message
        );
        assert!(e.message.contains("promoting 4 to voter: in progress"));
        assert!(e.message.contains("send the same request again"));
        // The promotion's first commit made it a voter of a joint
        // configuration before leadership was lost: said so, not "not promoted".
        let e = after_add(
            4,
            AddLeft::JointVoter { promoting: true },
            MembershipRefusal::NotLeader(None, None),
        );
        assert_eq!(e.status.as_u16(), 421);
        assert!(
            e.message
                .contains("voter of a joint configuration (its promotion half done)"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("not promoted"), "{}", e.message);
        // A joint configuration this request did not begin (it only sent
        // the promotion of a voter): no claim of a promotion.
        let e = after_add(
            4,
            AddLeft::JointVoter { promoting: false },
            MembershipRefusal::Refused("in progress".into()),
        );
        assert!(
            e.message.contains("a membership change half done"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("promotion"), "{}", e.message);
    }
}
