//! The leader's migration tick: it ends the migrations in progress and
//! sends spilled instances back to their preferred pool.
//!
//! ```text
//!  leader, every MIGRATE_TICK (only when a migration runs or an instance spilled):
//!     hub.gather() (every replica's agent reports)
//!     migration_steps(view, ready, now, MIGRATION_WAIT, seen)   (core, pure; ages from the
//!        later of the start's stamp and this replica's first sight, on its clock: every
//!        replica notes first sights each tick, leader or not)
//!        Complete ─▶ MigrationEnd(release old)   the new one is resident (on-demand tiers: hosted),
//!                                                or a drain's or a roll's ran past MUST_FINISH_AFTER_MS
//!                                                with its old node leaving (a roll's also beside a
//!                                                ready instance of its version on its node, or with
//!                                                its old one on a node no agent registered for)
//!        Abort    ─▶ MigrationEnd(release new)   not ready in time, or its node went not_ready
//!                    (refused if the migration ended meanwhile)
//!     plan_returns(view, policy, calm)                    (core, pure)
//!        ─▶ Evaluation::Migrate { cause: Return } per function, one at a time
//!     functions whose placement answered gpu_full in the last 5 s
//!        ─▶ Evaluation::Defragment per function, one at a time
//!           (plan_defragment: the first of at most two moves, or wait)
//! ```
//!
//! A function is *calm* when its agents' latest reports show no deadline
//! miss and no early reject and the autoscaler wants no more instances
//! than it has: a spill under load is how an edge pool sheds, and it
//! goes back once the load has passed. Everything the tick decides is a
//! Raft entry (`InstanceMigrate`, `MigrationEnd`), so a new leader
//! picks up the migrations in progress where the old one left them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use gshare_core::command::{CommandOutcome, RegionCommand};
use gshare_core::model::TenantId;
use gshare_core::protocol::InstanceState;
use gshare_core::state::{
    give_up_after, migration_steps, note_migrations_seen, plan_returns, return_target, spilled,
    DomainCommand, Instance, InstanceId, MigrationCause, MigrationStep, RegionState,
};
use openraft::ServerState;

use super::{Evaluation, Inner, Scheduler};
use crate::agents::{AgentHub, RegionAgents};

/// How often the leader looks at its migrations.
pub const MIGRATE_TICK: Duration = Duration::from_secs(1);
/// Longest a migration's new instance may take to become ready before the
/// migration is given up (the old one stays).
pub const MIGRATION_WAIT: Duration = Duration::from_secs(60);
/// How long an instance stays where it spilled before it may return
/// (a shed under load does not bounce back the moment the load dips).
const RETURN_MIN_AGE_MS: u64 = 10_000;
/// How long an instance whose return was given up waits before another
/// return is planned for it.
const RETURN_AFTER_GIVE_UP_MS: u64 = 5 * 60_000;
/// Most returns started per tick (each function one at a time).
const RETURNS_PER_TICK: usize = 4;
/// A function blocked on `gpu_full` longer ago than this is not
/// defragmented for (its need was not seen again: the underplaced tick
/// and the autoscaler retry every second).
const BLOCKED_FRESH_MS: u64 = 5_000;

impl Scheduler {
    /// Starts the leader's migration tick (it acts only while this
    /// replica leads).
    pub fn watch_migrations(&self, hub: AgentHub) {
        tokio::spawn(tick(Arc::downgrade(&self.inner), hub));
    }
}

/// Whether the new side of a migration is ready for requests, as its
/// agent reports it: a copy resident, or, for a tier that loads on its
/// first request (`oversubscribed`), hosted in any state.
fn ready(agents: &RegionAgents, inst: &Instance) -> bool {
    inst.slices.iter().all(|s| {
        agents
            .of_node(&s.gpu.node.0)
            .and_then(|a| a.instance(inst.id))
            .is_some_and(|r| r.state == InstanceState::Resident || inst.tier.swappable())
    })
}

/// Whether anything in `view` is the tick's to do.
fn has_work(view: &RegionState) -> bool {
    view.migrations().next().is_some()
        || view.functions().any(|f| {
            return_target(&f.spec.pool).is_some()
                && view
                    .instances_of(&f.spec.tenant, &f.spec.name)
                    .any(|i| spilled(&f.spec.pool, i) && !view.operator_placed(i.id))
        })
}

async fn tick(inner: Weak<Inner>, hub: AgentHub) {
    let busy: Arc<Mutex<BTreeSet<(TenantId, String)>>> = Arc::default();
    // Old sides of migrations this leader gave up, and when: not planned
    // to return again for RETURN_AFTER_GIVE_UP_MS (a model that loads
    // slower than its wait, MIGRATION_WAIT or twice its predicted cold
    // start, would churn forever).
    let mut given_up: BTreeMap<InstanceId, u64> = BTreeMap::new();
    // When this replica first saw each migration (by its new side), on its
    // own clock: ages count from it too, so a leader whose clock runs ahead
    // of the one that started a migration ends nothing early. Every
    // replica keeps it, leader or not, so a failover does not restart the
    // waits (a follower sees a migration once it applies it).
    let mut seen: BTreeMap<InstanceId, u64> = BTreeMap::new();
    loop {
        tokio::time::sleep(MIGRATE_TICK).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.raft.metrics().borrow().state == ServerState::Shutdown {
            return;
        }
        note_migrations_seen(
            inner.state.read().region.domain(),
            &mut seen,
            inner.proposer.now_ms(),
        );
        if !inner.leads() {
            continue;
        }
        if !(inner.any_blocked() || has_work(inner.state.read().region.domain())) {
            continue;
        }
        let agents = hub.gather().await;
        let now = inner.proposer.now_ms();
        let wait_ms = MIGRATION_WAIT.as_millis() as u64;
        // (step, cause, node of the new side, tenant, function, its wait in s)
        let steps: Vec<(MigrationStep, MigrationCause, String, TenantId, String, u64)> = {
            let st = inner.state.read();
            let view = st.region.domain();
            note_migrations_seen(view, &mut seen, now);
            migration_steps(view, &|i| ready(&agents, i), now, wait_ms, &seen)
                .into_iter()
                .filter_map(|step| {
                    let to = match step {
                        MigrationStep::Complete { to, .. } | MigrationStep::Abort { to, .. } => to,
                    };
                    let m = view.migration_of(to)?;
                    let new = view.instance(to)?;
                    let node = new.slices.first().map(|s| s.gpu.node.0.clone())?;
                    let wait_s = give_up_after(view, new, wait_ms) / 1000;
                    Some((
                        step,
                        m.cause,
                        node,
                        new.tenant.clone(),
                        new.function.clone(),
                        wait_s,
                    ))
                })
                .collect()
        };
        if !steps.is_empty() {
            // Conditional ends: refused if the migration ended meanwhile
            // (a plain release decided on this view could take the only
            // side left).
            let commands = steps
                .iter()
                .map(|(s, ..)| {
                    let (from, to, complete) = match *s {
                        MigrationStep::Complete { from, to } => (from, to, true),
                        MigrationStep::Abort { from, to } => (from, to, false),
                    };
                    RegionCommand::domain(DomainCommand::MigrationEnd { from, to, complete })
                })
                .collect();
            match inner.proposer.propose_all(commands).await {
                Ok(outcomes) => {
                    for ((step, cause, node, tenant, function, wait_s), outcome) in
                        steps.iter().zip(outcomes)
                    {
                        if let CommandOutcome::Domain(Err(e)) = &outcome {
                            tracing::debug!("migration step {step:?} refused: {e}");
                            continue;
                        }
                        if let MigrationStep::Abort { from, .. } = step {
                            given_up.insert(*from, now);
                        }
                        let (outcome, kind, to) = match step {
                            MigrationStep::Complete { to, .. } => {
                                ("completed", "migrate_done", *to)
                            }
                            MigrationStep::Abort { to, .. } => {
                                ("given_up", "migrate_given_up", *to)
                            }
                        };
                        inner.counters.migration(*cause, outcome);
                        hub.activity
                            .migrated(now, kind, node, to, &tenant.0, function);
                        match step {
                            MigrationStep::Complete { from, to } => tracing::info!(
                                "migration ({cause}) of {tenant}/{function}: {to} on {node} is ready{}; released {from}",
                                if cause.must_finish() {
                                    " (or its 10 s wait ran out where it may complete regardless)"
                                } else {
                                    ""
                                }
                            ),
                            MigrationStep::Abort { from, to } => tracing::warn!(
                                "migration ({cause}) of {tenant}/{function}: {to} on {node} not ready within {} s (or its node stopped taking placements); released it, {from} stays",
                                wait_s
                            ),
                        }
                    }
                }
                Err(e) => tracing::debug!("migration steps not committed: {e}"),
            }
        }
        given_up.retain(|_, at| now.saturating_sub(*at) < RETURN_AFTER_GIVE_UP_MS);
        let loads = agents.function_loads(|_| true);
        let returns: Vec<(Evaluation, (TenantId, String))> = {
            let st = inner.state.read();
            let view = st.region.domain();
            let calm = |tenant: &TenantId, function: &str| {
                let key = (tenant.clone(), function.to_string());
                let quiet = loads
                    .get(&key)
                    .is_none_or(|l| l.deadline_misses == 0 && l.early_rejects == 0);
                let wanted = inner
                    .counters
                    .decision(&key)
                    .is_none_or(|(d, _)| d.desired <= view.instance_count(tenant, function));
                quiet && wanted
            };
            let ranking = inner.ranking(view);
            let policy = inner.policy(&ranking, None);
            plan_returns(
                view,
                &policy,
                &calm,
                now,
                RETURN_MIN_AGE_MS,
                RETURNS_PER_TICK,
            )
            .into_iter()
            .filter(|(instance, _)| !given_up.contains_key(instance))
            .filter_map(|(instance, _)| {
                let i = view.instance(instance)?;
                let f = view.function(&i.tenant, &i.function).ok()?;
                let target = return_target(&f.spec.pool)?;
                let eval = Evaluation::Migrate {
                    instance,
                    target,
                    cause: MigrationCause::Return,
                };
                Some((eval, (i.tenant.clone(), i.function.clone())))
            })
            .collect()
        };
        // Functions whose placement found no GPU in the last few seconds:
        // make room by moving small instances (at most one evaluation per
        // function at a time; the next tick plans the next move).
        let since = now.saturating_sub(BLOCKED_FRESH_MS);
        let defrags: Vec<(Evaluation, (TenantId, String))> = inner
            .take_blocked(since)
            .into_iter()
            .map(|((tenant, function), b)| {
                let key = (tenant.clone(), function.clone());
                let eval = Evaluation::Defragment {
                    tenant,
                    function,
                    desired: b.desired,
                    shed: b.shed,
                };
                (eval, key)
            })
            .collect();
        let scheduler = Scheduler { inner };
        let starts = defrags
            .into_iter()
            .map(|(eval, key)| (eval, key, "defragmentation"))
            .chain(
                returns
                    .into_iter()
                    .map(|(eval, key)| (eval, key, "return to its preferred pool")),
            );
        for (eval, key, why) in starts {
            start_move(&scheduler, &busy, &hub, eval, key, why);
        }
    }
}

/// Submits one move-starting evaluation for `key`'s function, unless one
/// of it is still being decided; logs and records the move it started
/// (`why`: what started it, in words).
fn start_move(
    scheduler: &Scheduler,
    busy: &Arc<Mutex<BTreeSet<(TenantId, String)>>>,
    hub: &AgentHub,
    eval: Evaluation,
    key: (TenantId, String),
    why: &'static str,
) {
    let fresh = busy
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key.clone());
    if !fresh {
        return;
    }
    let (s, busy, hub) = (scheduler.clone(), busy.clone(), hub.clone());
    tokio::spawn(async move {
        match s.submit_here(eval).await {
            Ok(done) => {
                if let Some(gshare_core::state::Applied::InstanceMigrating {
                    from,
                    instance: new,
                    slices,
                }) = done.applied
                {
                    let node = slices.first().map_or("", |s| s.gpu.node.0.as_str());
                    // The instance that moves (another function's, for a
                    // defragmentation).
                    let (tenant, function) = {
                        let st = s.inner.state.read();
                        st.region.domain().instance(new).map_or_else(
                            || (key.0 .0.clone(), key.1.clone()),
                            |i| (i.tenant.0.clone(), i.function.clone()),
                        )
                    };
                    tracing::info!(
                        "{why} for {}/{}: {from} of {tenant}/{function} moves as {new} to {node}",
                        key.0,
                        key.1
                    );
                    hub.activity.migrated(
                        hub.clock.unix_ms(),
                        "migrate_start",
                        node,
                        new,
                        &tenant,
                        &function,
                    );
                }
            }
            Err(e) => tracing::debug!("{why} for {}/{}: {e}", key.0, key.1),
        }
        busy.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
    });
}
