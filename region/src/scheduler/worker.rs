//! The leader's worker: batches of evaluations → plans → one proposal.
//!
//! A deferred evaluation (its node or key taken by an earlier plan of the
//! batch) goes first into the next round, so every round commits at least
//! its first plan.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use gshare_core::command::{CommandOutcome, RegionCommand};
use gshare_core::model::{NodeId, Slice, TenantId};
use gshare_core::state::{
    plan_placements, ApplyError, DomainCommand, KeyLookup, ObjectKind, PlacementPolicy, RegionState,
};
use tokio::sync::mpsc;

use super::{
    EvalDone, EvalError, EvalResult, Evaluation, Inner, Queued, MAX_EVALS_PER_BATCH, PLACE_ATTEMPTS,
};
use crate::proposer::{unix_ms, WriteError};

/// What one evaluation comes to before anything is proposed.
enum Decision {
    /// Answered from the view: nothing to propose.
    Answer(EvalResult),
    /// Its key is planned already in this batch: decide it after that commits.
    Defer,
    /// Propose this command.
    Propose(DomainCommand),
}

/// The nodes a planned command places on.
fn nodes_of(cmd: &DomainCommand) -> BTreeSet<NodeId> {
    let slices: Vec<&Slice> = match cmd {
        DomainCommand::Keyed { command, .. } => match &**command {
            DomainCommand::FunctionCreate { placements, .. } => {
                placements.iter().flatten().collect()
            }
            _ => Vec::new(),
        },
        DomainCommand::InstancePlace { slices, .. }
        | DomainCommand::InstanceReplace { slices, .. } => slices.iter().collect(),
        _ => Vec::new(),
    };
    slices.into_iter().map(|s| s.gpu.node.clone()).collect()
}

/// Decides `eval` on the applied `view`; `keys` are the deploy keys
/// planned already in this batch.
fn decide(
    view: &RegionState,
    eval: &Evaluation,
    policy: &PlacementPolicy<'_>,
    keys: &BTreeSet<(TenantId, String)>,
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
            if keys.contains(&(tenant.clone(), key.clone())) {
                return Decision::Defer;
            }
            // The name is taken: say so (apply would refuse the create the
            // same way), rather than the planner's view of its instances.
            if view.function(&spec.tenant, &spec.name).is_ok() {
                return Decision::Answer(Err(EvalError::Refused(ApplyError::DuplicateName {
                    kind: ObjectKind::Function,
                    name: spec.name.clone(),
                })));
            }
            match plan_placements(view, spec, spec.min_instances, policy, now) {
                Err(r) => Decision::Answer(Err(EvalError::Rejected(r))),
                Ok(plan) => Decision::Propose(DomainCommand::Keyed {
                    tenant: tenant.clone(),
                    key: key.clone(),
                    fingerprint: fingerprint.clone(),
                    command: Box::new(DomainCommand::FunctionCreate {
                        spec: spec.clone(),
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
            if view.instance_count(tenant, function) >= f.spec.min_instances {
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
            let Ok(f) = view.function(&inst.tenant, &inst.function) else {
                return nothing;
            };
            let count = view.instance_count(&inst.tenant, &inst.function);
            let make_first =
                matches!(eval, Evaluation::Drain { .. }) && count < f.spec.max_instances;
            let mut spec = f.spec.clone();
            if !make_first {
                // A move keeps the count: plan as if the old one were gone.
                spec.max_instances = spec.max_instances.saturating_add(1);
            }
            match plan_placements(view, &spec, 1, policy, now) {
                Err(r) => Decision::Answer(Err(EvalError::Rejected(r))),
                Ok(plan) => {
                    let slices = plan.placements().pop().unwrap_or_default();
                    Decision::Propose(if make_first {
                        DomainCommand::InstancePlace {
                            tenant: inst.tenant.clone(),
                            function: inst.function.clone(),
                            slices,
                        }
                    } else {
                        DomainCommand::InstanceReplace {
                            instance: *instance,
                            slices,
                        }
                    })
                }
            }
        }
    }
}

fn answer(inner: &Inner, q: Queued, result: EvalResult) {
    inner.counters.answered(q.eval.kind(), &result);
    let _ = q.reply.send(result);
}

/// Runs until the scheduler is dropped.
pub(super) async fn run(inner: Weak<Inner>, mut rx: mpsc::Receiver<Queued>) {
    let mut again: Vec<Queued> = Vec::new();
    loop {
        let mut batch = std::mem::take(&mut again);
        if batch.is_empty() {
            match rx.recv().await {
                Some(q) => batch.push(q),
                None => return,
            }
        }
        while batch.len() < MAX_EVALS_PER_BATCH {
            match rx.try_recv() {
                Ok(q) => batch.push(q),
                Err(_) => break,
            }
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        again = round(&inner, batch).await;
        if let Some(attempt) = again.iter().map(|q| q.attempts).max() {
            // Give the writes that changed the view a moment to land.
            tokio::time::sleep(Duration::from_millis(2 << attempt.min(5))).await;
        }
    }
}

/// Plans and proposes one batch; returns the evaluations to plan again.
async fn round(inner: &Arc<Inner>, batch: Vec<Queued>) -> Vec<Queued> {
    let mut again = Vec::new();
    if !inner.leads() {
        for q in batch {
            answer(inner, q, Err(EvalError::NoLeader));
        }
        return again;
    }
    let now = unix_ms();
    let mut planned: Vec<(Queued, DomainCommand)> = Vec::new();
    {
        let st = inner.state.read();
        let view = st.region.domain();
        let ranking = inner.ranking(view);
        // Every plan of the batch is made on the applied view (copying a
        // region's state per batch costs more than the plans); a plan that
        // lands on a node an earlier plan of this batch took is deferred to
        // the next round, planned on the view with that one applied.
        let mut touched: BTreeSet<NodeId> = BTreeSet::new();
        let mut keys = BTreeSet::new();
        for q in batch {
            let policy = inner.policy(&ranking);
            match decide(view, &q.eval, &policy, &keys, now) {
                Decision::Answer(r) => answer(inner, q, r),
                Decision::Defer => again.push(q),
                Decision::Propose(cmd) => {
                    let nodes = nodes_of(&cmd);
                    if nodes.iter().any(|n| touched.contains(n)) {
                        again.push(q);
                        continue;
                    }
                    touched.extend(nodes);
                    if let Evaluation::Deploy { tenant, key, .. } = &q.eval {
                        keys.insert((tenant.clone(), key.clone()));
                    }
                    planned.push((q, cmd));
                }
            }
        }
    }
    if planned.is_empty() {
        return again;
    }
    inner.counters.batches.fetch_add(1, Ordering::Relaxed);
    inner
        .counters
        .planned
        .fetch_add(planned.len() as u64, Ordering::Relaxed);
    let commands = planned
        .iter()
        .map(|(_, c)| RegionCommand::domain(c.clone()))
        .collect();
    match inner.proposer.propose_all(commands).await {
        Ok(outcomes) if outcomes.len() == planned.len() => {
            for ((mut q, _), outcome) in planned.into_iter().zip(outcomes) {
                match outcome {
                    CommandOutcome::Domain(Ok(applied)) => {
                        let replans = q.replans;
                        answer(
                            inner,
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
                    CommandOutcome::Domain(Err(e)) => answer(inner, q, Err(EvalError::Refused(e))),
                    other => answer(
                        inner,
                        q,
                        Err(EvalError::Unknown(format!("unexpected outcome {other:?}"))),
                    ),
                }
            }
        }
        Ok(outcomes) => {
            let e = format!("{} outcomes for {} commands", outcomes.len(), planned.len());
            for (q, _) in planned {
                answer(inner, q, Err(EvalError::Unknown(e.clone())));
            }
        }
        Err(e) => {
            let result = match e {
                WriteError::NoLeader => EvalError::NoLeader,
                WriteError::Stopped => EvalError::Stopped,
                // A deploy is keyed: its submitter retries under the key.
                e => EvalError::Unknown(e.to_string()),
            };
            for (q, _) in planned {
                answer(inner, q, Err(result.clone()));
            }
        }
    }
    again
}
