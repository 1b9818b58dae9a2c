//! The leader's worker: batches of evaluations → plans → proposals,
//! pipelined.
//!
//! Each batch is planned on the applied view plus the plans of the batches
//! still being committed ([`PendingPlans`]: every plan is reserved there as
//! soon as it is made, so the next plan of the same batch, and of the next
//! batch, plans around it). Up to [`IN_FLIGHT_BATCHES`] proposals are being
//! committed while the next batch is planned; a proposal's plans are
//! released from the overlay once its outcome is applied. Apply re-checks
//! every placement with the same `fit`, so a plan made around a stale
//! overlay is refused and planned again, never over-allocated.
//!
//! A deploy whose idempotency key is already planned (in this batch or one
//! in flight) waits for that plan's outcome and is then decided again (a
//! replay of it, usually).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use gshare_core::command::{CommandOutcome, RegionCommand};
use gshare_core::model::PoolPreference;
use gshare_core::model::TenantId;
use gshare_core::state::{
    plan_defragment, plan_evacuation, plan_move, plan_placements, plan_replacement, ApplyError,
    Defragment, DomainCommand, KeyLookup, MigrationCause, MoveError, ObjectKind, PendingPlans,
    PlacementPolicy, PlanTicket, RegionRanking, RegionState, RejectReason,
};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use super::{
    EvalDone, EvalError, EvalResult, Evaluation, Inner, Queued, MAX_EVALS_PER_BATCH, PLACE_ATTEMPTS,
};
use crate::proposer::WriteError;

/// Proposals of planned batches being committed at once (the next batch
/// is planned while they commit).
pub const IN_FLIGHT_BATCHES: usize = 4;

/// A deploy key: (tenant, idempotency key).
type DeployKey = (TenantId, String);

/// What the worker and its in-flight proposals share.
struct Shared {
    /// Plans proposed and not yet applied (or refused).
    pending: Mutex<PendingPlans>,
    /// Deploy keys planned and not yet decided, with the evaluations of
    /// the same key that wait for that.
    keys: Mutex<HashMap<DeployKey, Vec<Queued>>>,
    /// Evaluations to plan again.
    again: mpsc::UnboundedSender<Queued>,
    /// One permit per proposal in flight.
    slots: Arc<Semaphore>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What one evaluation comes to before anything is proposed.
enum Decision {
    /// Answered from the view: nothing to propose.
    Answer(EvalResult),
    /// Its key is planned already in this batch: decide it after that commits.
    Defer,
    /// Propose this command.
    Propose(DomainCommand),
}

/// What the leader's worker decides for `eval` on `view` alone (no plans
/// pending, no key in flight), with the region's placement policy: the
/// command to propose, or the answer given without proposing. The
/// deterministic simulation (`tests/src/sim`) decides deploys through it.
pub fn decide_on(
    view: &RegionState,
    eval: &Evaluation,
    now: u64,
) -> Result<DomainCommand, EvalResult> {
    let ranking = RegionRanking::from_state(view);
    let policy = super::region_policy(&ranking, None);
    match decide(view, eval, &policy, &|_| false, now) {
        Decision::Propose(c) => Ok(c),
        Decision::Answer(r) => Err(r),
        // Nothing is in flight here, so nothing defers; say so if it does.
        Decision::Defer => Err(Err(EvalError::Unknown("deferred".into()))),
    }
}

/// Decides `eval` on the applied `view` (plus the policy's pending plans);
/// `planned` says whether a deploy key is planned already and undecided.
fn decide(
    view: &RegionState,
    eval: &Evaluation,
    policy: &PlacementPolicy<'_>,
    planned: &dyn Fn(&DeployKey) -> bool,
    now: u64,
) -> Decision {
    match eval {
        Evaluation::Deploy {
            tenant,
            key,
            fingerprint,
            spec,
        } => {
            match view.idempotency().lookup(tenant, key, fingerprint, now) {
                KeyLookup::Replay(a) => {
                    return Decision::Answer(Ok(EvalDone {
                        applied: Some(a),
                        replans: 0,
                    }))
                }
                KeyLookup::Reused => {
                    return Decision::Answer(Err(EvalError::Refused(
                        ApplyError::IdempotencyKeyReused { key: key.clone() },
                    )))
                }
                KeyLookup::New => {}
            }
            if planned(&(tenant.clone(), key.clone())) {
                return Decision::Defer;
            }
            // Refused as apply would refuse the create, in apply's order
            // (the spec, then the name, then the tenant's room for specs),
            // as a dry run answers too: not as whatever the planner runs
            // into first (e.g. min > max), nor as its view of the instances.
            let refused = view.check_function_spec(spec).and_then(|()| {
                if view.function(&spec.tenant, &spec.name).is_ok() {
                    return Err(ApplyError::DuplicateName {
                        kind: ObjectKind::Function,
                        name: spec.name.clone(),
                    });
                }
                view.check_spec_room(spec)
            });
            if let Err(e) = refused {
                return Decision::Answer(Err(EvalError::Refused(e)));
            }
            match plan_placements(view, spec, spec.min_instances, policy, now) {
                Err(r) => Decision::Answer(Err(EvalError::Rejected(r))),
                Ok(plan) => Decision::Propose(DomainCommand::Keyed {
                    tenant: tenant.clone(),
                    key: key.clone(),
                    fingerprint: fingerprint.clone(),
                    command: Box::new(DomainCommand::FunctionCreate {
                        spec: (**spec).clone(),
                        placements: plan.placements(),
                    }),
                }),
            }
        }
        Evaluation::Underplaced { tenant, function } => {
            let nothing = Decision::Answer(Ok(EvalDone {
                applied: None,
                replans: 0,
            }));
            let Ok(f) = view.function(tenant, function) else {
                return nothing; // deleted meanwhile
            };
            // Pending placements count: one being committed already
            // brings it up (another would be one too many).
            if policy.instance_count(view, tenant, function) >= f.spec.min_instances {
                return nothing;
            }
            match plan_placements(view, &f.spec, 1, policy, now) {
                Err(r) => Decision::Answer(Err(EvalError::Rejected(r))),
                Ok(plan) => Decision::Propose(DomainCommand::InstancePlace {
                    tenant: tenant.clone(),
                    function: function.clone(),
                    slices: plan.placements().pop().unwrap_or_default(),
                }),
            }
        }
        Evaluation::Replace { instance } => match plan_replacement(view, *instance, policy, now) {
            Err(r) => Decision::Answer(Err(EvalError::Rejected(r))),
            Ok(r) => match r.command(view, *instance) {
                Some(cmd) => Decision::Propose(cmd),
                None => Decision::Answer(Ok(EvalDone {
                    applied: None,
                    replans: 0,
                })),
            },
        },
        Evaluation::ScaleOut {
            tenant,
            function,
            desired,
        }
        | Evaluation::Shed {
            tenant,
            function,
            desired,
        } => {
            let nothing = Decision::Answer(Ok(EvalDone {
                applied: None,
                replans: 0,
            }));
            let Ok(f) = view.function(tenant, function) else {
                return nothing; // deleted meanwhile
            };
            // Pending placements count toward `desired`: replicas each ask
            // for a wake from zero (they do not dedupe with each other), and
            // the second ask, planned while the first one's placement
            // commits, would place one too many or, at `max_instances`, be
            // refused as full and its replica answer its held requests 503.
            if policy.instance_count(view, tenant, function) >= (*desired).min(f.spec.max_instances)
            {
                return nothing;
            }
            let mut spec = f.spec.clone();
            if matches!(eval, Evaluation::Shed { .. }) {
                // Its edge pool misses deadlines: the center takes the load.
                spec.pool = PoolPreference::Center;
            }
            match plan_placements(view, &spec, 1, policy, now) {
                Err(r) => Decision::Answer(Err(EvalError::Rejected(r))),
                Ok(plan) => Decision::Propose(DomainCommand::InstancePlace {
                    tenant: tenant.clone(),
                    function: function.clone(),
                    slices: plan.placements().pop().unwrap_or_default(),
                }),
            }
        }
        Evaluation::ScaleIn {
            tenant,
            function,
            instance,
        } => {
            let nothing = Decision::Answer(Ok(EvalDone {
                applied: None,
                replans: 0,
            }));
            let Ok(f) = view.function(tenant, function) else {
                return nothing;
            };
            // Not an outgoing one: the roll replaces those.
            let ours = view.instance(*instance).is_some_and(|i| {
                &i.tenant == tenant && &i.function == function && i.version == f.version
            });
            // A function in the middle of a migration keeps both sides
            // until the leader ends it.
            if !ours
                || view.instance_count(tenant, function) <= f.spec.min_instances
                || view.migrating(tenant, function)
            {
                return nothing;
            }
            Decision::Propose(DomainCommand::InstanceScaleIn {
                instance: *instance,
            })
        }
        // A side of a migration already: a retry whose first attempt
        // committed (its answer lost), or another move of it; none is
        // started beside it (apply would refuse it as a conflict).
        Evaluation::Migrate { instance, .. } if view.migration_of(*instance).is_some() => {
            Decision::Answer(Ok(EvalDone {
                applied: None,
                replans: 0,
            }))
        }
        Evaluation::Migrate {
            instance,
            target,
            cause,
        } => match plan_move(view, *instance, target, policy, now) {
            // Moved or released meanwhile, or there already: nothing to do.
            Err(MoveError::Gone(_) | MoveError::AlreadyThere { .. }) => {
                Decision::Answer(Ok(EvalDone {
                    applied: None,
                    replans: 0,
                }))
            }
            Err(e) => Decision::Answer(Err(EvalError::Unmovable(e))),
            Ok(slices) => Decision::Propose(DomainCommand::InstanceMigrate {
                instance: *instance,
                slices,
                cause: *cause,
            }),
        },
        Evaluation::Defragment {
            tenant,
            function,
            desired,
            shed,
        } => {
            let nothing = Decision::Answer(Ok(EvalDone {
                applied: None,
                replans: 0,
            }));
            let Ok(f) = view.function(tenant, function) else {
                return nothing;
            };
            // (Pending placements count, as for a scale-out.)
            if policy.instance_count(view, tenant, function) >= (*desired).min(f.spec.max_instances)
            {
                return nothing;
            }
            let mut spec = f.spec.clone();
            if *shed {
                spec.pool = PoolPreference::Center;
            }
            // Room may have come meanwhile, or the reason be another now.
            match plan_placements(view, &spec, 1, policy, now) {
                Ok(_) => return nothing,
                Err(r) if !matches!(r.reason, RejectReason::Gpu { .. }) => {
                    return Decision::Answer(Err(EvalError::Rejected(r)))
                }
                Err(_) => {}
            }
            match plan_defragment(view, &spec, policy, now) {
                Defragment::Move(plan) => match plan.moves.first() {
                    Some(m) => {
                        tracing::info!("defragmentation: {plan}");
                        Decision::Propose(DomainCommand::InstanceMigrate {
                            instance: m.instance,
                            slices: m.slices.clone(),
                            cause: MigrationCause::Defragment,
                        })
                    }
                    None => nothing,
                },
                Defragment::Waiting { .. } => nothing,
                Defragment::Nothing(why) => Decision::Answer(Err(EvalError::NoRoom(why))),
            }
        }
        Evaluation::NodeNotReady { node, instance } | Evaluation::Drain { node, instance } => {
            let nothing = Decision::Answer(Ok(EvalDone {
                applied: None,
                replans: 0,
            }));
            // Moved or released meanwhile, or the node takes placements
            // again (its agent came back, or it was undrained): nothing.
            let Some(inst) = view.instance(*instance) else {
                return nothing;
            };
            if !inst.slices.iter().any(|s| &s.gpu.node == node) || view.takes_placements(node) {
                return nothing;
            }
            // A side of a migration: the migration tick ends it (apply
            // refuses a replacement of it too).
            if view.migration_of(*instance).is_some() {
                return nothing;
            }
            // A drain makes first, as a migration the migration tick ends
            // (and a new leader finds); a lost node's instances move in
            // one step.
            let make_first = matches!(eval, Evaluation::Drain { .. });
            match plan_evacuation(view, *instance, make_first, policy, now) {
                Err(r) => Decision::Answer(Err(EvalError::Rejected(r))),
                Ok(r) => r
                    .command(view, *instance)
                    .map_or(nothing, Decision::Propose),
            }
        }
    }
}

fn answer(inner: &Inner, q: Queued, result: EvalResult) {
    inner.counters.answered(&q.eval, &result);
    let _ = q.reply.send(result);
}

/// Runs until the scheduler is dropped.
pub(super) async fn run(inner: Weak<Inner>, mut rx: mpsc::Receiver<Queued>) {
    let (again, mut again_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        pending: Mutex::new(PendingPlans::default()),
        keys: Mutex::new(HashMap::new()),
        again,
        slots: Arc::new(Semaphore::new(IN_FLIGHT_BATCHES)),
    });
    loop {
        let mut batch = Vec::new();
        while batch.len() < MAX_EVALS_PER_BATCH {
            match again_rx.try_recv() {
                Ok(q) => batch.push(q),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            tokio::select! {
                q = rx.recv() => match q {
                    Some(q) => batch.push(q),
                    None => return,
                },
                Some(q) = again_rx.recv() => batch.push(q),
            }
        }
        // Plan on the freshest view: after a slot frees (its plans released).
        let Ok(permit) = shared.slots.clone().acquire_owned().await else {
            return;
        };
        while batch.len() < MAX_EVALS_PER_BATCH {
            match rx.try_recv() {
                Ok(q) => batch.push(q),
                Err(_) => break,
            }
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if places_a_function_at_zero(&inner, &batch) {
            super::autoscale::refresh_host_copies(&inner).await;
        }
        let planned = plan_batch(&inner, &shared, batch);
        if planned.is_empty() {
            continue;
        }
        tokio::spawn(commit(inner, shared.clone(), planned, permit));
    }
}

/// Whether `batch` places an instance of a function that has none (a
/// wake from zero, or a function whose every instance went): such a
/// placement prefers the nodes holding its weights, read afresh.
fn places_a_function_at_zero(inner: &Inner, batch: &[Queued]) -> bool {
    let st = inner.state.read();
    let view = st.region.domain();
    batch.iter().any(|q| match &q.eval {
        Evaluation::ScaleOut {
            tenant, function, ..
        }
        | Evaluation::Underplaced { tenant, function } => {
            view.function(tenant, function).is_ok()
                && view.instances_of(tenant, function).next().is_none()
        }
        _ => false,
    })
}

/// One planned command of a batch: its evaluation, the command, its
/// reservations in the overlay and its deploy key.
struct Planned {
    q: Queued,
    cmd: DomainCommand,
    tickets: Vec<PlanTicket>,
    key: Option<DeployKey>,
}

/// Plans one batch on the applied view plus the pending plans, reserving
/// each plan as it is made; answers what needs no proposal.
fn plan_batch(inner: &Arc<Inner>, shared: &Shared, batch: Vec<Queued>) -> Vec<Planned> {
    let mut planned = Vec::new();
    if !inner.leads() {
        for q in batch {
            answer(inner, q, Err(EvalError::NoLeader));
        }
        return planned;
    }
    let now = inner.proposer.now_ms();
    let st = inner.state.read();
    let view = st.region.domain();
    let ranking = inner.ranking(view);
    let mut pending = lock(&shared.pending);
    let mut keys = lock(&shared.keys);
    for q in batch {
        // A function coming back (from zero, or below its minimum) prefers
        // the nodes that still hold its weights in host memory (a warm
        // resume; only the plan's first instance, see `PlacementPolicy`).
        let prefer = match &q.eval {
            Evaluation::ScaleOut {
                tenant, function, ..
            }
            | Evaluation::Underplaced { tenant, function } => {
                inner.host_copies_of(view, tenant, function)
            }
            _ => Vec::new(),
        };
        let decision = {
            let policy = PlacementPolicy {
                prefer: &prefer,
                ..inner.policy(&ranking, Some(&pending))
            };
            decide(view, &q.eval, &policy, &|k| keys.contains_key(k), now)
        };
        match decision {
            Decision::Answer(r) => {
                inner.note_blocked(view, &q.eval, &r, now);
                answer(inner, q, r)
            }
            Decision::Defer => match &q.eval {
                Evaluation::Deploy { tenant, key, .. } => {
                    let k = (tenant.clone(), key.clone());
                    match keys.get_mut(&k) {
                        Some(waiting) => waiting.push(q),
                        None => {
                            let _ = shared.again.send(q);
                        }
                    }
                }
                Evaluation::Underplaced { .. }
                | Evaluation::NodeNotReady { .. }
                | Evaluation::Drain { .. }
                | Evaluation::Replace { .. }
                | Evaluation::ScaleOut { .. }
                | Evaluation::ScaleIn { .. }
                | Evaluation::Migrate { .. }
                | Evaluation::Shed { .. }
                | Evaluation::Defragment { .. } => {
                    let _ = shared.again.send(q);
                }
            },
            Decision::Propose(cmd) => {
                let tickets = pending.reserve_command(view, &cmd);
                let key = match &q.eval {
                    Evaluation::Deploy { tenant, key, .. } => {
                        let k = (tenant.clone(), key.clone());
                        keys.insert(k.clone(), Vec::new());
                        Some(k)
                    }
                    Evaluation::Underplaced { .. }
                    | Evaluation::NodeNotReady { .. }
                    | Evaluation::Drain { .. }
                    | Evaluation::Replace { .. }
                    | Evaluation::ScaleOut { .. }
                    | Evaluation::ScaleIn { .. }
                    | Evaluation::Migrate { .. }
                    | Evaluation::Shed { .. }
                    | Evaluation::Defragment { .. } => None,
                };
                planned.push(Planned {
                    q,
                    cmd,
                    tickets,
                    key,
                });
            }
        }
    }
    planned
}

/// Proposes one planned batch and answers its evaluations once the outcome
/// is applied; releases its plans from the overlay first, then its slot.
async fn commit(
    inner: Arc<Inner>,
    shared: Arc<Shared>,
    planned: Vec<Planned>,
    permit: OwnedSemaphorePermit,
) {
    inner.counters.batches.fetch_add(1, Ordering::Relaxed);
    inner
        .counters
        .planned
        .fetch_add(planned.len() as u64, Ordering::Relaxed);
    let commands = planned
        .iter()
        .map(|p| RegionCommand::domain(p.cmd.clone()))
        .collect();
    let result = inner.proposer.propose_all(commands).await;
    {
        let st = inner.state.read();
        let view = st.region.domain();
        let mut pending = lock(&shared.pending);
        let mut keys = lock(&shared.keys);
        for p in &planned {
            for t in &p.tickets {
                pending.release(view, *t);
            }
            if let Some(waiting) = p.key.as_ref().and_then(|k| keys.remove(k)) {
                for q in waiting {
                    let _ = shared.again.send(q);
                }
            }
        }
    }
    drop(permit);
    let mut again = Vec::new();
    match result {
        Ok(outcomes) if outcomes.len() == planned.len() => {
            for (p, outcome) in planned.into_iter().zip(outcomes) {
                let mut q = p.q;
                match outcome {
                    CommandOutcome::Domain(Ok(applied)) => {
                        let replans = q.replans;
                        answer(
                            &inner,
                            q,
                            Ok(EvalDone {
                                applied: Some(applied),
                                replans,
                            }),
                        )
                    }
                    CommandOutcome::Domain(Err(e))
                        if e.may_succeed_on_replan() && q.attempts + 1 < PLACE_ATTEMPTS =>
                    {
                        // Planned on a view another write has since changed.
                        q.attempts += 1;
                        q.replans += 1;
                        inner.counters.replans.fetch_add(1, Ordering::Relaxed);
                        again.push(q);
                    }
                    CommandOutcome::Domain(Err(e)) => answer(&inner, q, Err(EvalError::Refused(e))),
                    other => answer(
                        &inner,
                        q,
                        Err(EvalError::Unknown(format!("unexpected outcome {other:?}"))),
                    ),
                }
            }
        }
        Ok(outcomes) => {
            let e = format!("{} outcomes for {} commands", outcomes.len(), planned.len());
            for p in planned {
                answer(&inner, p.q, Err(EvalError::Unknown(e.clone())));
            }
        }
        Err(e) => {
            let result = match e {
                WriteError::NoLeader => EvalError::NoLeader,
                WriteError::Stopped => EvalError::Stopped,
                // A deploy is keyed: its submitter retries under the key.
                e => EvalError::Unknown(e.to_string()),
            };
            for p in planned {
                answer(&inner, p.q, Err(result.clone()));
            }
        }
    }
    if let Some(attempt) = again.iter().map(|q| q.attempts).max() {
        // Give the writes that changed the view a moment to land.
        tokio::time::sleep(Duration::from_millis(2 << attempt.min(5))).await;
        for q in again {
            let _ = shared.again.send(q);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gshare_core::config::Topology;
    use gshare_core::model::{
        FunctionSpec, LatencyProfile, NodeId, PoolKind, Quota, Runtime, TenantId, Tier,
    };
    use gshare_core::state::{Applied, MoveTarget};
    use std::collections::BTreeMap;

    const T0: u64 = 1_800_000_000_000;

    /// The local demo's topology and acme's burstable function `chat`
    /// (`min` to `max` instances), deployed with none.
    fn deployed(min: u32, max: u32) -> RegionState {
        let topology = Topology::from_toml(
            "topology.toml",
            include_str!("../../../configs/local/topology.toml"),
        )
        .expect("configs/local/topology.toml");
        let mut s = RegionState::default();
        s.apply(DomainCommand::TopologyLoad { topology }, T0)
            .expect("topology");
        let quota = Quota {
            compute_milli: 4_000,
            memory_mib: 65_536,
            instances: 8,
        };
        s.apply(
            DomainCommand::TenantCreate {
                tenant: TenantId("acme".into()),
                display_name: None,
                quotas: BTreeMap::from([(PoolKind::Center, quota)]),
            },
            T0,
        )
        .expect("tenant");
        let spec = FunctionSpec {
            model: None,
            args: Vec::new(),
            env: Default::default(),
            tenant: TenantId("acme".into()),
            name: "chat".into(),
            runtime: Runtime::Custom,
            memory_mib: 1_024,
            compute_milli: 250,
            tier: Tier::Burstable,
            deadline_ms: 100,
            pool: PoolPreference::Center,
            min_instances: min,
            max_instances: max,
            idle_timeout_s: 60,
            latency: LatencyProfile {
                full_gpu_us: 1_000,
                saturation_milli: 1_000,
            },
        };
        s.apply(DomainCommand::FunctionDeploy { spec }, T0)
            .expect("deploy");
        s
    }

    /// [`deployed`] with one instance of `chat` (1 to 2), and a move of it
    /// to the other center node.
    fn one_instance() -> (RegionState, gshare_core::state::InstanceId, MoveTarget) {
        let mut s = deployed(1, 2);
        let eval = Evaluation::Underplaced {
            tenant: TenantId("acme".into()),
            function: "chat".into(),
        };
        let place = decide_on(&s, &eval, T0).expect("a placement");
        let Ok(Applied::InstancePlaced {
            instance, slices, ..
        }) = s.apply(place, T0)
        else {
            panic!("not placed");
        };
        let other = if slices[0].gpu.node.0 == "local-c1" {
            "local-c2"
        } else {
            "local-c1"
        };
        (s, instance, MoveTarget::Node(NodeId(other.into())))
    }

    /// A deploy under a taken name with an invalid spec is refused as
    /// apply and a dry run refuse it: the spec first (422), not the name
    /// (409); a valid spec under the taken name is the name's refusal.
    #[test]
    fn a_deploy_is_refused_in_applys_order_spec_before_name() {
        let (s, _, _) = one_instance();
        let taken = s
            .function(&TenantId("acme".into()), "chat")
            .expect("deployed")
            .spec
            .clone();
        let mut invalid = taken.clone();
        invalid.min_instances = 3;
        invalid.max_instances = 2;
        let deploy = |spec: &FunctionSpec| Evaluation::Deploy {
            tenant: TenantId("acme".into()),
            key: format!("k-{}", spec.min_instances),
            fingerprint: "f".into(),
            spec: Box::new(spec.clone()),
        };
        let code = |spec: &FunctionSpec| match decide_on(&s, &deploy(spec), T0) {
            Err(Err(EvalError::Refused(e))) => e.code(),
            other => panic!("{other:?}"),
        };
        let applied = s
            .clone()
            .apply(
                DomainCommand::FunctionCreate {
                    spec: invalid.clone(),
                    placements: Vec::new(),
                },
                T0,
            )
            .expect_err("apply refuses it");
        assert_eq!(code(&invalid), applied.code());
        assert_eq!(code(&invalid), "invalid_spec");
        // What a dry run checks first.
        assert_eq!(
            s.check_function_spec(&invalid).map_err(|e| e.code()),
            Err("invalid_spec")
        );
        assert_eq!(code(&taken), "duplicate_name");
    }

    /// An operator's move retried after its first attempt committed (the
    /// answer lost) finds the instance migrating: nothing new is started,
    /// where a second `InstanceMigrate` was planned and refused as a
    /// conflict (or on quota, the new side holding it already).
    #[test]
    fn a_move_of_an_instance_migrating_already_starts_nothing() {
        let (mut s, instance, target) = one_instance();
        let eval = Evaluation::Migrate {
            instance,
            target,
            cause: MigrationCause::Operator,
        };
        let first = decide_on(&s, &eval, T0).expect("a migration");
        assert!(
            matches!(first, DomainCommand::InstanceMigrate { .. }),
            "{first:?}"
        );
        s.apply(first, T0).expect("migrating");
        assert!(s.migration_of(instance).is_some());
        assert_eq!(
            decide_on(&s, &eval, T0),
            Err(Ok(EvalDone {
                applied: None,
                replans: 0,
            }))
        );
    }

    /// Two replicas each wake `chat` from zero (`ScaleOut { desired: 1 }`,
    /// not deduplicated across replicas): the leader plans the first and
    /// reserves it; the second, decided while that placement commits,
    /// finds it pending and places nothing. It was planned again: refused
    /// at `max_instances` (its replica answered its held requests 503), or
    /// with room for more, a second instance where one was asked for.
    #[test]
    fn a_second_wake_while_the_first_commits_places_nothing() {
        for max in [1, 2] {
            let s = deployed(0, max);
            let wake = Evaluation::ScaleOut {
                tenant: TenantId("acme".into()),
                function: "chat".into(),
                desired: 1,
            };
            let ranking = RegionRanking::from_state(&s);
            let mut pending = PendingPlans::default();
            let first = {
                let policy = super::super::region_policy(&ranking, Some(&pending));
                decide(&s, &wake, &policy, &|_| false, T0)
            };
            let Decision::Propose(cmd) = first else {
                panic!("max {max}: the first wake places nothing");
            };
            assert_eq!(pending.reserve_command(&s, &cmd).len(), 1);
            let policy = super::super::region_policy(&ranking, Some(&pending));
            match decide(&s, &wake, &policy, &|_| false, T0) {
                Decision::Answer(r) => assert_eq!(
                    r,
                    Ok(EvalDone {
                        applied: None,
                        replans: 0,
                    }),
                    "max {max}"
                ),
                Decision::Propose(c) => panic!("max {max}: planned again: {c:?}"),
                Decision::Defer => panic!("max {max}: deferred"),
            }
            // Asking for two (room for them) still places the second.
            if max == 2 {
                let two = Evaluation::ScaleOut {
                    tenant: TenantId("acme".into()),
                    function: "chat".into(),
                    desired: 2,
                };
                assert!(matches!(
                    decide(&s, &two, &policy, &|_| false, T0),
                    Decision::Propose(DomainCommand::InstancePlace { .. })
                ));
            }
        }
    }

    /// A function below its minimum whose missing instance is pending
    /// (the underplaced tick came round while it commits) places nothing
    /// more.
    #[test]
    fn an_underplaced_function_with_its_instance_pending_places_nothing() {
        let s = deployed(1, 2);
        let eval = Evaluation::Underplaced {
            tenant: TenantId("acme".into()),
            function: "chat".into(),
        };
        let ranking = RegionRanking::from_state(&s);
        let mut pending = PendingPlans::default();
        let cmd = decide_on(&s, &eval, T0).expect("a placement");
        assert_eq!(pending.reserve_command(&s, &cmd).len(), 1);
        let policy = super::super::region_policy(&ranking, Some(&pending));
        assert!(matches!(
            decide(&s, &eval, &policy, &|_| false, T0),
            Decision::Answer(Ok(EvalDone { applied: None, .. }))
        ));
    }
}
