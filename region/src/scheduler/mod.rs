//! The region's scheduler: a leader-only worker that turns evaluations
//! into plans and commits them (Nomad's eval → plan → plan-apply).
//!
//! ```text
//!  POST /v1/functions ─▶ Scheduler::submit(Deploy) ──(follower)──▶ PeerRequest::Evaluate ─▶ leader
//!  underplaced tick (1 s) ─▶ Scheduler::submit(Underplaced)                                    │
//!                                                                                              ▼
//!  leader's worker: a batch of queued evaluations (≤ MAX_EVALS_PER_BATCH)
//!     for each, on the applied view plus the pending plans (this batch's
//!     earlier plans and those of the batches still committing):
//!        key replayed / reused / name taken ─▶ answered, nothing proposed
//!        plan_placements(view, spec, count, policy) ─▶ PlanRejection ─▶ answered (definite)
//!                                                 └─▶ PlacementPlan ─▶ one command, reserved as pending
//!     every command of the batch ─▶ Proposer::propose_all ─▶ one Raft entry ─▶ apply (fit, quota)
//!        (≤ IN_FLIGHT_BATCHES proposals commit while the next batch is planned)
//!        applied ─▶ released, answered   refused, may_succeed_on_replan() ─▶ planned again (≤ PLACE_ATTEMPTS)
//! ```
//!
//! A deploy and its initial placements are one `FunctionCreate` (inside a
//! `Keyed` under the request's idempotency key): the function exists with
//! its instances, or not at all. The planner is reached only through core's
//! [`gshare_core::state::plan_placements`]; every placement is re-checked
//! by the state machine with the same `fit`. One worker plans for the
//! whole region, so plans never race each other and conflicts come only
//! from other writers (a topology reload, a quota change); a refusal
//! of the class that a newer view may change
//! ([`gshare_core::state::ApplyError::may_succeed_on_replan`]) is planned
//! again, any other is the answer.
//!
//! Evaluations reach the worker only on the replica that leads: a follower
//! forwards them over the peer wire; a replica that lost leadership answers
//! [`EvalError::NoLeader`] and the caller tries again where the leader now
//! is (a deploy under its idempotency key is applied at most once).

mod autoscale;
mod decision;
mod evaluation;
mod liveness;
mod migrate;
mod worker;

pub use autoscale::AUTOSCALE_TICK;
pub use decision::{DecisionLookup, LatestDecision};
pub use evaluation::{EvalDone, EvalError, EvalResult, Evaluation};
pub use liveness::{watch_plan, HeardTimes, LIVENESS_TICK};
pub use migrate::{MIGRATE_TICK, MIGRATION_WAIT};
pub use worker::{decide_on, IN_FLIGHT_BATCHES};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::agents::HostCopyKey;
use gshare_core::autoscale::{Decision, FunctionKey};
use gshare_core::model::{FunctionSpec, NodeId, TenantId};
use gshare_core::state::{
    plan_placements, PendingPlans, PlacementPlan, PlacementPolicy, PlanOptions, PlanRejection,
    RegionRanking, RegionState,
};
use gshare_raft_store::{StateReader, TypeConfig};
use openraft::{Raft, ServerState};
use tokio::sync::{mpsc, oneshot};

use crate::peer_link::PeerLinks;
use crate::proposer::Proposer;
use crate::wire::{PeerReply, PeerRequest};

/// Plans per evaluation before a refusal on a stale view is the answer.
pub const PLACE_ATTEMPTS: u32 = 8;
/// Most evaluations planned into one proposal.
pub const MAX_EVALS_PER_BATCH: usize = 256;
/// How often the leader looks for functions below `min_instances`.
pub const UNDERPLACED_TICK: Duration = Duration::from_secs(1);
/// How long a cached [`RegionRanking`] (the region's policy over the
/// shapes of the deployed functions) is reused before it is rebuilt.
const RANKING_TTL: Duration = Duration::from_secs(1);
/// Tries of one submitted evaluation (leader changes, lost forwards).
const SUBMIT_ATTEMPTS: u32 = 5;
/// Longest wait for the leader's answer to a forwarded evaluation.
const FORWARD_TTL: Duration = Duration::from_secs(10);

/// What the scheduler counted (shown in `/metrics` of the replica that led).
#[derive(Debug, Default)]
pub struct Counters {
    /// Evaluations answered, by (kind, outcome).
    evaluations: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// Proposals the worker made (each one Raft entry or part of one).
    batches: AtomicU64,
    /// Commands in those proposals.
    planned: AtomicU64,
    /// Plans made again after a refusal on a changed view.
    replans: AtomicU64,
    /// The autoscalers' latest decision per function and when it was made
    /// (the leader's tick, its clock, Unix ms).
    decisions: Mutex<BTreeMap<gshare_core::autoscale::FunctionKey, (Decision, u64)>>,
    /// Decisions made, by the rule that set them.
    decided_by_rule: Mutex<BTreeMap<&'static str, u64>>,
    /// Migrations, by (cause, outcome: started, completed, given_up).
    migrations: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

impl Counters {
    /// Counts one step of a migration of `cause`.
    fn migration(&self, cause: gshare_core::state::MigrationCause, outcome: &'static str) {
        let mut m = self.migrations.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry((cause.as_str(), outcome)).or_default();
        *n = n.saturating_add(1);
    }

    fn answered(&self, eval: &Evaluation, result: &EvalResult) {
        let kind = eval.kind();
        if let Ok(EvalDone {
            applied: Some(gshare_core::state::Applied::InstanceMigrating { .. }),
            ..
        }) = result
        {
            match eval {
                Evaluation::Migrate { cause, .. } => self.migration(*cause, "started"),
                Evaluation::Defragment { .. } => {
                    self.migration(gshare_core::state::MigrationCause::Defragment, "started")
                }
                // (A drain's or a roll's: counted by the liveness task,
                // which reads the cause from the state.)
                _ => {}
            }
        }
        let outcome = match result {
            Ok(_) => "committed",
            Err(EvalError::Rejected(_)) => "rejected",
            Err(EvalError::Refused(_)) => "refused",
            Err(EvalError::NoLeader) => "no_leader",
            Err(EvalError::Unknown(_)) => "unknown",
            Err(EvalError::Stopped) => "stopped",
            Err(EvalError::Unmovable(_)) => "unmovable",
            Err(EvalError::NoRoom(_)) => "no_room",
        };
        let mut e = self.evaluations.lock().unwrap_or_else(|p| p.into_inner());
        *e.entry((kind, outcome)).or_default() += 1;
    }

    /// Keeps the decisions of the latest autoscaling tick, made at `at_ms`
    /// (functions gone from it are gone from here), and counts them.
    fn decided(&self, steps: &[gshare_core::autoscale::ScaleStep], at_ms: u64) {
        {
            let mut by_rule = self
                .decided_by_rule
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for s in steps {
                let n = by_rule.entry(s.decision.rule.as_str()).or_default();
                *n = n.saturating_add(1);
            }
        }
        let mut d = self.decisions.lock().unwrap_or_else(|p| p.into_inner());
        *d = steps
            .iter()
            .map(|s| (s.key.clone(), (s.decision, at_ms)))
            .collect();
    }

    /// The latest decision for `key` and when it was made (`None`: the
    /// latest tick made none for it).
    fn decision(&self, key: &gshare_core::autoscale::FunctionKey) -> Option<(Decision, u64)> {
        self.decisions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied()
    }

    /// The counters' samples for `/metrics`.
    pub fn sample(&self, out: &mut gshare_core::metrics::Sampler) {
        use gshare_core::metrics::Series;
        const EVALUATIONS: Series = Series::counter(
            "gshare_region_scheduler_evaluations_total",
            "Evaluations the scheduler answered, by kind and outcome",
            &["kind", "outcome"],
        );
        const PLAIN: [Series; 3] = [
            Series::counter(
                "gshare_region_scheduler_proposals_total",
                "Proposals of planned commands the scheduler made",
                &[],
            ),
            Series::counter(
                "gshare_region_scheduler_planned_commands_total",
                "Planned commands in those proposals",
                &[],
            ),
            Series::counter(
                "gshare_region_scheduler_replans_total",
                "Plans made again after apply refused one planned on a changed view",
                &[],
            ),
        ];
        for ((kind, outcome), n) in self
            .evaluations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            out.add(&EVALUATIONS, &[kind, outcome], *n as f64);
        }
        const DESIRED: Series = Series::gauge(
            "gshare_region_autoscale_desired_instances",
            "Instances the leader's autoscaler wants for a function, by the rule that set it (the leader only)",
            &["tenant", "function", "rule"],
        );
        for ((tenant, function), (d, _)) in self
            .decisions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            out.add(
                &DESIRED,
                &[&tenant.0, function, d.rule.as_str()],
                f64::from(d.desired),
            );
        }
        const DECIDED: Series = Series::counter(
            "gshare_region_autoscale_decisions_total",
            "Decisions the autoscalers made while this replica led, by the rule that set them",
            &["rule"],
        );
        for (rule, n) in self
            .decided_by_rule
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            out.add(&DECIDED, &[rule], *n as f64);
        }
        const MIGRATIONS: Series = Series::counter(
            "gshare_region_migrations_total",
            "Make-before-break migrations between nodes while this replica led, by cause (return, operator, defragment, drain, roll) and outcome (started, completed, given_up)",
            &["cause", "outcome"],
        );
        for ((cause, outcome), n) in self
            .migrations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            out.add(&MIGRATIONS, &[cause, outcome], *n as f64);
        }
        for (series, v) in PLAIN
            .iter()
            .zip([&self.batches, &self.planned, &self.replans])
        {
            out.add(series, &[], v.load(Ordering::Relaxed) as f64);
        }
    }
}

/// One evaluation waiting for the worker.
struct Queued {
    eval: Evaluation,
    attempts: u32,
    replans: u32,
    reply: oneshot::Sender<EvalResult>,
}

struct Inner {
    id: u64,
    raft: Raft<TypeConfig>,
    state: StateReader,
    proposer: Proposer,
    links: PeerLinks,
    tx: mpsc::Sender<Queued>,
    counters: Counters,
    /// The ranking and when it was built (the replica's clock, Unix ms).
    ranking: Mutex<Option<(u64, Arc<RegionRanking>)>>,
    /// Where each function version's weights wait in host memory (nodes
    /// whose agent reported a host copy), as the latest autoscale tick
    /// gathered it; what a placement of that function prefers.
    host_copies: Mutex<BTreeMap<HostCopyKey, Vec<NodeId>>>,
    /// The agent reports (set by `watch_load`): what a wake from zero
    /// reads the freshest host copies from.
    hub: std::sync::OnceLock<crate::agents::AgentHub>,
    /// Functions whose latest placement found no GPU (`gpu_full`): the
    /// instances each should have, whether it was a shed, and when (Unix
    /// ms). The migration tick takes them as defragmentation evaluations.
    blocked: Mutex<BTreeMap<FunctionKey, Blocked>>,
}

/// A function whose placement found no GPU (see `Inner::blocked`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Blocked {
    desired: u32,
    shed: bool,
    at_ms: u64,
}

/// The handle of a replica's scheduler (cheap to clone).
#[derive(Clone)]
pub struct Scheduler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("id", &self.inner.id)
            .finish_non_exhaustive()
    }
}

/// What the attempts of one [`Scheduler::submit`] answered so far.
#[derive(Debug, Default)]
struct Attempts {
    /// An attempt's outcome was unknown (it may have been applied).
    unknown: Option<EvalError>,
}

impl Attempts {
    /// Takes one attempt's result: the answer to give now, or `None` to
    /// try again. Nothing decided (no leader), or an unknown outcome (a
    /// retry under the same key is safe), tries again; so does a stop
    /// after an unknown outcome, whose answer stays unknown.
    fn take(&mut self, result: EvalResult) -> Option<EvalResult> {
        match result {
            Err(e @ EvalError::Unknown(_)) => {
                self.unknown = Some(e);
                None
            }
            Err(EvalError::NoLeader) => None,
            Err(EvalError::Stopped) if self.unknown.is_some() => {
                Some(Err(self.unknown.take().unwrap_or(EvalError::Stopped)))
            }
            other => Some(other),
        }
    }

    /// The answer once no attempt is left: unknown if any attempt's
    /// outcome was, else no leader.
    fn answer(self) -> EvalResult {
        Err(self.unknown.unwrap_or(EvalError::NoLeader))
    }
}

impl Scheduler {
    /// Starts the worker and the underplaced tick on the current tokio
    /// runtime; they act only while this replica leads.
    pub fn start(
        id: u64,
        raft: Raft<TypeConfig>,
        state: StateReader,
        proposer: Proposer,
        links: PeerLinks,
    ) -> Self {
        let (tx, rx) = mpsc::channel(MAX_EVALS_PER_BATCH * 8);
        let inner = Arc::new(Inner {
            id,
            raft,
            state,
            proposer,
            links,
            tx,
            counters: Counters::default(),
            ranking: Mutex::new(None),
            host_copies: Mutex::default(),
            hub: std::sync::OnceLock::new(),
            blocked: Mutex::default(),
        });
        tokio::spawn(worker::run(Arc::downgrade(&inner), rx));
        tokio::spawn(underplaced_tick(Arc::downgrade(&inner)));
        Scheduler { inner }
    }

    /// What this scheduler counted.
    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// Submits `eval` to the leader's scheduler (this one if this replica
    /// leads, else over the peer wire) and waits for its answer; follows
    /// leadership changes. Once an attempt's outcome was unknown, a later
    /// attempt that could not be made (no leader, stopping) does not make
    /// the answer definite: it stays [`EvalError::Unknown`] (that attempt
    /// may have been applied).
    pub async fn submit(&self, eval: Evaluation) -> EvalResult {
        let mut attempts = Attempts::default();
        for attempt in 0..SUBMIT_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100 << attempt.min(4))).await;
            }
            let (leader, node) = {
                let m = self.inner.raft.metrics().borrow().clone();
                let node = m
                    .current_leader
                    .and_then(|l| m.membership_config.membership().get_node(&l).cloned());
                (m.current_leader, node)
            };
            let result = match (leader, node) {
                (Some(l), _) if l == self.inner.id => self.submit_here(eval.clone()).await,
                (Some(_), Some(node)) => {
                    let req = PeerRequest::Evaluate(eval.clone());
                    match self
                        .inner
                        .links
                        .call(&node.raft_addr, &req, FORWARD_TTL)
                        .await
                    {
                        Ok(PeerReply::Evaluate(r)) => r,
                        Ok(other) => Err(EvalError::Unknown(format!("unexpected reply {other:?}"))),
                        Err(e) => Err(EvalError::Unknown(e.to_string())),
                    }
                }
                _ => Err(EvalError::NoLeader),
            };
            if let Some(answer) = attempts.take(result) {
                return answer;
            }
        }
        attempts.answer()
    }

    /// Queues `eval` for this replica's worker: [`EvalError::NoLeader`]
    /// unless this replica leads (what a forwarded evaluation gets).
    pub async fn submit_here(&self, eval: Evaluation) -> EvalResult {
        if !self.inner.leads() {
            return Err(EvalError::NoLeader);
        }
        let (reply, rx) = oneshot::channel();
        let queued = Queued {
            eval,
            attempts: 0,
            replans: 0,
            reply,
        };
        if self.inner.tx.send(queued).await.is_err() {
            return Err(EvalError::Stopped);
        }
        rx.await.unwrap_or(Err(EvalError::Stopped))
    }

    /// Where `spec.min_instances` instances would go on this replica's
    /// view now (the same seam and policy as a deploy; nothing is proposed).
    pub fn dry_run(&self, spec: &FunctionSpec) -> Result<PlacementPlan, Box<PlanRejection>> {
        let st = self.inner.state.read();
        let view = st.region.domain();
        let ranking = self.inner.ranking(view);
        let policy = self.inner.policy(&ranking, None);
        plan_placements(
            view,
            spec,
            spec.min_instances,
            &policy,
            self.inner.proposer.now_ms(),
        )
    }
}

impl Inner {
    fn leads(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// The region's ranking, rebuilt at most every [`RANKING_TTL`].
    fn ranking(&self, state: &RegionState) -> Arc<RegionRanking> {
        let now = self.proposer.now_ms();
        let ttl = u64::try_from(RANKING_TTL.as_millis()).unwrap_or(u64::MAX);
        let mut cache = self.ranking.lock().unwrap_or_else(|p| p.into_inner());
        match &*cache {
            // A clock stepped back counts as stale too.
            Some((at, r)) if *at <= now && now - *at < ttl => r.clone(),
            _ => {
                let r = Arc::new(RegionRanking::from_state(state));
                *cache = Some((now, r.clone()));
                r
            }
        }
    }

    /// The nodes holding a host copy of `tenant`'s function `function` at
    /// its current version in `view` (empty: none known).
    fn host_copies_of(&self, view: &RegionState, tenant: &TenantId, function: &str) -> Vec<NodeId> {
        let Ok(f) = view.function(tenant, function) else {
            return Vec::new();
        };
        self.host_copies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(tenant.clone(), function.to_string(), f.version))
            .cloned()
            .unwrap_or_default()
    }

    /// Remembers a function whose placement `eval` found no GPU although
    /// the answer came from the view (`result`): the migration tick looks
    /// whether moving small instances makes room (a deploy is answered to
    /// its caller instead; see docs/migration.md).
    fn note_blocked(&self, view: &RegionState, eval: &Evaluation, result: &EvalResult, now: u64) {
        let Err(EvalError::Rejected(r)) = result else {
            return;
        };
        if !matches!(r.reason, gshare_core::state::RejectReason::Gpu { .. }) {
            return;
        }
        let (tenant, function, desired, shed) = match eval {
            Evaluation::ScaleOut {
                tenant,
                function,
                desired,
            } => (tenant, function, *desired, false),
            Evaluation::Shed {
                tenant,
                function,
                desired,
            } => (tenant, function, *desired, true),
            Evaluation::Underplaced { tenant, function } => {
                let Ok(f) = view.function(tenant, function) else {
                    return;
                };
                (tenant, function, f.spec.min_instances, false)
            }
            _ => return,
        };
        self.blocked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                (tenant.clone(), function.clone()),
                Blocked {
                    desired,
                    shed,
                    at_ms: now,
                },
            );
    }

    /// Takes the functions blocked since `since_ms` (older ones are
    /// dropped: their need was not seen again).
    fn take_blocked(&self, since_ms: u64) -> Vec<(FunctionKey, Blocked)> {
        std::mem::take(&mut *self.blocked.lock().unwrap_or_else(|p| p.into_inner()))
            .into_iter()
            .filter(|(_, b)| b.at_ms >= since_ms)
            .collect()
    }

    /// Whether any function waits for room.
    fn any_blocked(&self) -> bool {
        !self
            .blocked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// The policy of one plan: the index over free capacity (what a full
    /// scan would pick), around the `pending` plans not yet applied.
    fn policy<'a>(
        &self,
        ranking: &'a RegionRanking,
        pending: Option<&'a PendingPlans>,
    ) -> PlacementPolicy<'a> {
        region_policy(ranking, pending)
    }
}

/// The region's placement policy: the index over free capacity (what a
/// full scan would pick), around the `pending` plans not yet applied.
pub(crate) fn region_policy<'a>(
    ranking: &'a RegionRanking,
    pending: Option<&'a PendingPlans>,
) -> PlacementPolicy<'a> {
    PlacementPolicy {
        ranking,
        options: PlanOptions::indexed(),
        pending,
        prefer: &[],
        avoid: &[],
    }
}

/// Every [`UNDERPLACED_TICK`], while this replica leads, one
/// [`Evaluation::Underplaced`] per function below `min_instances`.
async fn underplaced_tick(inner: std::sync::Weak<Inner>) {
    loop {
        tokio::time::sleep(UNDERPLACED_TICK).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.raft.metrics().borrow().state == ServerState::Shutdown {
            return;
        }
        if !inner.leads() {
            continue;
        }
        let under = inner.state.read().region.domain().underplaced();
        let scheduler = Scheduler { inner };
        let mut tasks = tokio::task::JoinSet::new();
        for (tenant, function, _) in under {
            let s = scheduler.clone();
            tasks.spawn(async move {
                let eval = Evaluation::Underplaced { tenant, function };
                let what = format!("{eval:?}");
                if let Err(e) = s.submit_here(eval).await {
                    tracing::debug!("{what}: {e}");
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(results: Vec<EvalResult>) -> EvalResult {
        let mut attempts = Attempts::default();
        for r in results {
            if let Some(answer) = attempts.take(r) {
                return answer;
            }
        }
        attempts.answer()
    }

    fn unknown() -> EvalResult {
        Err(EvalError::Unknown("a forward lost its answer".into()))
    }

    fn done() -> EvalResult {
        Ok(EvalDone {
            applied: None,
            replans: 0,
        })
    }

    /// An attempt whose outcome was unknown may have been applied: no later
    /// attempt that could not be made turns the answer into a definite
    /// "nothing was written" (it did: `no_leader` after a lost answer).
    #[test]
    fn an_unknown_outcome_is_not_forgotten_by_later_attempts_that_could_not_be_made() {
        let no_leader = || Err(EvalError::NoLeader);
        assert!(matches!(
            run(vec![unknown(), no_leader(), no_leader()]),
            Err(EvalError::Unknown(_))
        ));
        assert!(matches!(
            run(vec![unknown(), Err(EvalError::Stopped)]),
            Err(EvalError::Unknown(_))
        ));
        assert!(matches!(
            run(vec![no_leader(), no_leader()]),
            Err(EvalError::NoLeader)
        ));
        assert!(matches!(
            run(vec![Err(EvalError::Stopped), unknown()]),
            Err(EvalError::Stopped)
        ));
        // A later attempt's answer (a keyed retry replays the first
        // outcome) is the answer.
        assert!(run(vec![unknown(), done()]).is_ok());
    }
}
