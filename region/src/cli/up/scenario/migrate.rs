//! `migrate`: an operator moves a function under load from the center to
//! the edge pool `edge-b`, make-before-break; no invocation may fail.
//!
//! ```text
//!  deploy acme/mover (guaranteed, center, min = max = 1)   first request served
//!  closed-loop load through the replicas ──────────────────────────────────────▶
//!    BEFORE s   POST /v1/tenants/acme/functions/mover/move {"to": "edge-b"}   move_s
//!                 the new instance on local-eb1 beside the old one; once its agent
//!                 reports it resident the leader releases the old one; the answer
//!               AFTER s more, then the clients stop
//!  moved = instances listed at the end on a node of edge-b that none of the
//!          function's instances had at the start
//! ```
//!
//! Requests go through the replicas, which route each to an agent hosting
//! the function (a resident copy first), so they follow the move. The
//! check: `failed = 0` (a migration caused no failed invocation), every
//! move the answer lists `completed`, `moved ≥ 1`, and the region billed
//! what the agents journaled.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context;
use gshare_core::model::{PoolPreference, Runtime, Tier};

use super::super::demo::deploy_body;
use super::super::instances::{instances_of, InstanceSeen};
use super::super::moves::move_function;
use super::super::stop_signal::StopSignal;
use super::super::Up;
use super::crowd::{failures, Aim, Crowd, Record, Tally};
use super::{first_serve, secs, Outcome};
use crate::api::functions::{FunctionBody, LatencyBody};

const TENANT: &str = "acme";
const NAME: &str = "mover";
/// The pool it moves to.
const TARGET: &str = "edge-b";
const DEADLINE_MS: u64 = 1000;
const THINK_MS: u64 = 50;
const CLIENTS: usize = 4;
/// Load before the move.
const BEFORE: Duration = Duration::from_secs(3);
/// Load after the move's answer.
const AFTER: Duration = Duration::from_secs(3);

fn body() -> FunctionBody {
    FunctionBody {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        name: NAME.into(),
        runtime: Runtime::Pytorch,
        // A cold start of 0.5 s + 2048 MiB at 2 GB/s where it moves to.
        memory_mib: 2048,
        compute_milli: 250,
        tier: Tier::Guaranteed,
        deadline_ms: DEADLINE_MS,
        pool: PoolPreference::Center,
        strict_pool: false,
        min_instances: 1,
        max_instances: Some(1),
        idle_timeout_s: 300,
        latency: Some(LatencyBody {
            full_gpu_us: 10_000,
            saturation_milli: 250,
        }),
    }
}

/// Runs `migrate` on the started region.
pub fn run(up: &mut Up, stop: &mut StopSignal) -> anyhow::Result<Outcome> {
    let token = up.tokens[TENANT].clone();
    deploy_body(&up.api, &body(), &token).context("deploying acme/mover")?;
    let replicas = up.api.replicas().to_vec();
    let cold = first_serve(&replicas, TENANT, NAME, &token, stop)?;
    let start = instances_of(&up.api, &up.operator, TENANT, NAME).unwrap_or_default();
    let start_nodes: BTreeSet<String> = start.iter().map(|i| i.node.clone()).collect();
    println!(
        "scenario migrate: deployed {TENANT}/{NAME} (guaranteed, center, 1 instance on {}); \
         first request served after {} ms",
        nodes_of(&start),
        cold.as_millis()
    );
    up.check(stop)?;

    let mut crowd = Crowd::new(
        Aim {
            tenant: TENANT.into(),
            name: NAME.into(),
            token,
            deadline_ms: DEADLINE_MS,
            think_ms: THINK_MS,
        },
        replicas.clone(),
    );
    crowd.grow_to(CLIENTS);
    println!(
        "scenario migrate: {CLIENTS} clients through the replicas for {} s, then the move to {TARGET}",
        BEFORE.as_secs()
    );
    stop.wait(BEFORE);
    up.check(stop)?;
    let move_at = crowd.created().elapsed();
    let moved = move_function(replicas[0], &up.operator, TENANT, NAME, TARGET);
    let move_end = crowd.created().elapsed();
    println!(
        "scenario migrate: the move answered after {:.2} s: {}",
        moved.took.as_secs_f64(),
        moved.describe()
    );
    up.check(stop)?;
    stop.wait(AFTER);
    up.check(stop)?;
    let records = crowd.finish();
    let end = instances_of(&up.api, &up.operator, TENANT, NAME).unwrap_or_default();
    println!(
        "scenario migrate: instances at the start on {}, at the end on {}",
        nodes_of(&start),
        nodes_of(&end)
    );

    let deadline = Duration::from_millis(DEADLINE_MS);
    let all = Tally::of(&records, deadline);
    let during = |from: Duration, to: Duration| -> Vec<Record> {
        records
            .iter()
            .filter(|r| r.sent >= from && r.sent < to)
            .copied()
            .collect()
    };
    let phases = [
        ("before the move", during(Duration::ZERO, move_at)),
        ("during the move", during(move_at, move_end)),
        ("after the move", during(move_end, Duration::MAX)),
    ];
    for (what, rs) in &phases {
        let t = Tally::of(rs, deadline);
        let f = failures(rs);
        println!(
            "scenario migrate: sent {what}: {} invocations, {} within {DEADLINE_MS} ms, {} failed{}",
            t.attainment.invocations,
            t.attainment.within,
            t.failed(),
            if f.is_empty() {
                String::new()
            } else {
                format!(" (HTTP {f})")
            }
        );
    }

    let target_nodes: BTreeSet<String> = up
        .layout
        .agents
        .iter()
        .filter(|a| a.pool == TARGET)
        .map(|a| a.node.clone())
        .collect();
    let moved_count = end
        .iter()
        .filter(|i| !start_nodes.contains(&i.node) && target_nodes.contains(&i.node))
        .count();

    let mut o = Outcome::default();
    o.count(&all);
    o.figure("moved", moved_count);
    o.figure("move_s", secs(moved.took));
    match &moved.answer {
        Ok(a) => {
            let not_done: Vec<String> = a
                .moves
                .iter()
                .filter(|m| m.outcome != "completed")
                .map(|m| format!("{} → {}: {}", m.from, m.to, m.outcome))
                .collect();
            if !not_done.is_empty() {
                o.problems
                    .push(format!("moves not completed: {}", not_done.join(", ")));
            }
        }
        Err(e) => o.problems.push(format!("the move was refused: {e}")),
    }
    if all.failed() > 0 {
        o.problems.push(format!(
            "a migration caused failed invocations: {} of {} not answered 200 (HTTP {})",
            all.failed(),
            all.attainment.invocations,
            failures(&records)
        ));
    }
    if moved_count < 1 {
        o.problems.push(format!(
            "no instance moved to {TARGET}: at the start on {}, at the end on {}",
            nodes_of(&start),
            nodes_of(&end)
        ));
    }
    if end.iter().any(|i| !target_nodes.contains(&i.node)) {
        o.problems.push(format!(
            "instances outside {TARGET} at the end: {}",
            nodes_of(&end)
        ));
    }
    o.check_billing(up, TENANT);
    Ok(o)
}

/// `i-3 on local-c1, i-7 on local-eb1` (`none` when empty).
pub(super) fn nodes_of(is: &[InstanceSeen]) -> String {
    if is.is_empty() {
        return "none".into();
    }
    is.iter()
        .map(|i| format!("i-{} on {}", i.id, i.node))
        .collect::<Vec<_>>()
        .join(", ")
}
