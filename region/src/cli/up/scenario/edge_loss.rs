//! `edge-loss`: the one node of the edge pool `edge-a` is lost under load
//! (its agent killed with SIGKILL: no goodbye); the function is served
//! from the center meanwhile and comes back once the node does.
//!
//! ```text
//!  deploy globex/ballast (guaranteed 500 milli, edge:edge-b)  on local-eb1: edge-b keeps 500 milli
//!  deploy acme/nearby    (guaranteed 750 milli, edge:edge-a)  on local-ea1: it cannot go to edge-b
//!  closed-loop load through the replicas, each request with a 15 s deadline ────────────────▶
//!   BEFORE s   kill -9 the agent of local-ea1                                        t_kill
//!              not heard for node_ready_grace_ms: not_ready; node_replace_grace_ms more:
//!              its instance is placed again under the pool preference: edge-a (lost),
//!              edge-b (no room), the center; requests wait while their deadline allows
//!              the state lists the instance on a center node, then a request is served   recovered_s
//!   restart that agent (same node, same data)                                         t_restart
//!              ready again; the leader's return migration places one on local-ea1,
//!              make-before-break; the state lists it there alone, no migration           returned_s
//!   AFTER s more, then the clients stop
//! ```
//!
//! `recovered_s` runs from the kill to the end of the first request
//! answered 200 that ended after a sample of the replicated state showed
//! the function's instances all on center nodes (samples every
//! [`SAMPLE`]; so at most that much late). `returned_s` runs from the
//! restart to the first sample showing them all on local-ea1 with no
//! migration in progress. `moved` counts the instances seen on a node
//! outside edge-a.
//!
//! The check: `moved ≥ 1`, the function was served from the center and
//! came back within [`BUDGET`] each, `attainment ≥ 0.95`, and the region
//! billed what the agents journaled. A request that was running on the
//! killed agent may have run: the replica answers `502 outcome_unknown`
//! for it (counted in `failed`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Context;
use gshare_core::model::{PoolKind, PoolPreference, Runtime, Tier};

use super::super::demo::deploy_body;
use super::super::instances::{function_of, instances_of, InstanceSeen};
use super::super::stop_signal::StopSignal;
use super::super::Up;
use super::crowd::{failures, Aim, Crowd, Record, Tally};
use super::migrate::nodes_of;
use super::{first_serve, secs, Outcome};
use crate::api::functions::{FunctionBody, LatencyBody};

const TENANT: &str = "acme";
const NAME: &str = "nearby";
const BALLAST_TENANT: &str = "globex";
const BALLAST: &str = "ballast";
/// The pool that is lost, and the one that has no room for the function.
const LOST_POOL: &str = "edge-a";
const FULL_POOL: &str = "edge-b";
/// Sent with every request: a request can wait out the replacement
/// (not_ready after 3 s, replaced 2 s later, a cold start in the center).
const DEADLINE_MS: u64 = 15_000;
const THINK_MS: u64 = 50;
const CLIENTS: usize = 4;
/// Load before the kill.
const BEFORE: Duration = Duration::from_secs(3);
/// Load served from the center before the agent is restarted.
const IN_CENTER: Duration = Duration::from_secs(2);
/// Load after the return.
const AFTER: Duration = Duration::from_secs(2);
/// How long the recovery, and then the return, may take.
const BUDGET: Duration = Duration::from_secs(60);
const SAMPLE: Duration = Duration::from_millis(150);
const MIN_ATTAINMENT: f64 = 0.95;

fn body() -> FunctionBody {
    FunctionBody {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        name: NAME.into(),
        runtime: Runtime::Pytorch,
        memory_mib: 2048,
        // With the ballast's 500 reserved on edge-b's GPU, 750 does not fit there.
        compute_milli: 750,
        tier: Tier::Guaranteed,
        deadline_ms: DEADLINE_MS,
        pool: PoolPreference::Edge(LOST_POOL.into()),
        strict_pool: false,
        min_instances: 1,
        max_instances: Some(1),
        idle_timeout_s: 300,
        latency: Some(LatencyBody {
            full_gpu_us: 15_000,
            saturation_milli: 750,
        }),
    }
}

/// globex's whole edge compute quota, reserved on edge-b's one GPU.
fn ballast() -> FunctionBody {
    FunctionBody {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        name: BALLAST.into(),
        runtime: Runtime::Pytorch,
        memory_mib: 1024,
        compute_milli: 500,
        tier: Tier::Guaranteed,
        deadline_ms: 1000,
        pool: PoolPreference::Edge(FULL_POOL.into()),
        strict_pool: false,
        min_instances: 1,
        max_instances: Some(1),
        idle_timeout_s: 300,
        latency: None,
    }
}

/// Runs `edge-loss` on the started region.
pub fn run(up: &mut Up, stop: &mut StopSignal) -> anyhow::Result<Outcome> {
    let pools: BTreeMap<String, String> = up
        .layout
        .agents
        .iter()
        .map(|a| (a.node.clone(), a.pool.clone()))
        .collect();
    let pool_of = |node: &str| pools.get(node).cloned().unwrap_or_default();
    let lost_node = up
        .layout
        .agents
        .iter()
        .find(|a| a.pool == LOST_POOL)
        .map(|a| a.node.clone())
        .context("no node in edge-a")?;
    let agent = format!("agent {lost_node}");

    deploy_body(&up.api, &ballast(), &up.tokens[BALLAST_TENANT])
        .context("deploying globex/ballast")?;
    let b = instances_of(&up.api, &up.operator, BALLAST_TENANT, BALLAST).unwrap_or_default();
    println!(
        "scenario edge-loss: deployed {BALLAST_TENANT}/{BALLAST} (guaranteed 500 milli, \
         edge:{FULL_POOL}): {}",
        nodes_of(&b)
    );
    let token = up.tokens[TENANT].clone();
    deploy_body(&up.api, &body(), &token).context("deploying acme/nearby")?;
    let replicas = up.api.replicas().to_vec();
    let cold = first_serve(&replicas, TENANT, NAME, &token, stop)?;
    let start = instances_of(&up.api, &up.operator, TENANT, NAME).unwrap_or_default();
    println!(
        "scenario edge-loss: deployed {TENANT}/{NAME} (guaranteed 750 milli, edge:{LOST_POOL}): \
         {}; first request served after {} ms",
        nodes_of(&start),
        cold.as_millis()
    );
    let mut o = Outcome::default();
    if b.iter().any(|i| pool_of(&i.node) != FULL_POOL) {
        o.problems.push(format!(
            "the ballast is not on {FULL_POOL} ({}): {FULL_POOL} may take the function",
            nodes_of(&b)
        ));
    }
    if start.is_empty() || start.iter().any(|i| i.node != lost_node) {
        o.problems.push(format!(
            "{TENANT}/{NAME} is not on {lost_node} at the start ({})",
            nodes_of(&start)
        ));
    }
    up.check(stop)?;

    let mut crowd = Crowd::new(
        Aim {
            tenant: TENANT.into(),
            name: NAME.into(),
            token,
            deadline_ms: DEADLINE_MS,
            think_ms: THINK_MS,
        },
        replicas,
    );
    crowd.grow_to(CLIENTS);
    println!(
        "scenario edge-loss: {CLIENTS} clients through the replicas ({DEADLINE_MS} ms deadline) \
         for {} s, then the agent of {lost_node} is killed",
        BEFORE.as_secs()
    );
    stop.wait(BEFORE);
    up.check(stop)?;

    let pid = up.children.kill(&agent)?;
    let t_kill = crowd.created().elapsed();
    let killed = Instant::now();
    println!("up: killed agent {lost_node} pid {pid} (SIGKILL: it could not say goodbye)");

    let mut watch = Watch::default();
    let center: BTreeSet<String> = up
        .layout
        .agents
        .iter()
        .filter(|a| {
            up.layout
                .topology
                .pool(&a.pool)
                .is_some_and(|p| p.kind == PoolKind::Center)
        })
        .map(|a| a.node.clone())
        .collect();
    // When a sample first showed the instances all on center nodes, and
    // the end of the first request served after it (both since the
    // crowd's creation).
    let mut on_center: Option<Duration> = None;
    let mut recovered: Option<Duration> = None;
    while killed.elapsed() < BUDGET {
        up.check(stop)?;
        let now = crowd.created().elapsed();
        let seen = watch.sample(up, &lost_node, &pool_of, t_kill, now);
        if on_center.is_none()
            && seen
                .as_ref()
                .is_some_and(|s| !s.is_empty() && s.iter().all(|i| center.contains(&i.node)))
        {
            println!(
                "scenario edge-loss: +{:.2} s after the kill: the state lists it in the center",
                (now - t_kill).as_secs_f64()
            );
            on_center = Some(now);
        }
        if let Some(c) = on_center {
            if let Some(end) = first_served_after(&crowd.records(), c) {
                recovered = Some(end - t_kill);
                break;
            }
        }
        stop.wait(SAMPLE);
    }
    match recovered {
        Some(r) => println!(
            "scenario edge-loss: served from the center {:.2} s after the kill",
            r.as_secs_f64()
        ),
        None => o.problems.push(format!(
            "{TENANT}/{NAME} was not served from the center within {} s of the kill",
            BUDGET.as_secs()
        )),
    }

    if recovered.is_some() {
        stop.wait(IN_CENTER);
        up.check(stop)?;
    }
    let p = up.children.revive(&agent)?;
    println!(
        "up: restarted agent {lost_node} pid {} (the node comes back)",
        p.pid()
    );
    let t_restart = crowd.created().elapsed();
    let restarted = Instant::now();
    let mut returned: Option<Duration> = None;
    while restarted.elapsed() < BUDGET {
        up.check(stop)?;
        let now = crowd.created().elapsed();
        let back = function_of(&up.api, &up.operator, TENANT, NAME).is_ok_and(|f| {
            f.migrations == 0
                && !f.instances.is_empty()
                && f.instances.iter().all(|i| i.node == lost_node)
        });
        watch.sample(up, &lost_node, &pool_of, t_kill, now);
        if back {
            returned = Some(now - t_restart);
            println!(
                "scenario edge-loss: back on {lost_node} alone, no migration in progress, {:.2} s \
                 after the restart",
                (now - t_restart).as_secs_f64()
            );
            break;
        }
        stop.wait(SAMPLE);
    }
    if returned.is_none() {
        o.problems.push(format!(
            "{TENANT}/{NAME} did not return to {lost_node} within {} s of the restart",
            BUDGET.as_secs()
        ));
    }
    stop.wait(AFTER);
    up.check(stop)?;
    let records = crowd.finish();

    let deadline = Duration::from_millis(DEADLINE_MS);
    let all = Tally::of(&records, deadline);
    let during = |from: Duration, to: Duration| -> Vec<Record> {
        records
            .iter()
            .filter(|r| r.sent >= from && r.sent < to)
            .copied()
            .collect()
    };
    let t_recovered = recovered.map_or(t_restart, |r| t_kill + r);
    let t_returned = returned.map_or(Duration::MAX, |r| t_restart + r);
    for (what, from, to) in [
        ("before the kill", Duration::ZERO, t_kill),
        ("kill → served from the center", t_kill, t_recovered),
        ("in the center", t_recovered, t_restart),
        ("restart → returned", t_restart, t_returned),
        ("after the return", t_returned, Duration::MAX),
    ] {
        let rs = during(from, to);
        let t = Tally::of(&rs, deadline);
        let f = failures(&rs);
        println!(
            "scenario edge-loss: sent {what}: {} invocations, {} within {DEADLINE_MS} ms, {} \
             failed{}",
            t.attainment.invocations,
            t.attainment.within,
            t.failed(),
            if f.is_empty() {
                String::new()
            } else {
                format!(" (HTTP {f})")
            },
        );
    }
    // Those the outage touched: sent before the center served, answered
    // after the kill.
    let touched: Vec<Record> = records
        .iter()
        .filter(|r| r.sent < t_recovered && r.sent + r.outcome.latency > t_kill)
        .copied()
        .collect();
    let held = touched
        .iter()
        .filter(|r| r.outcome.status == 200)
        .map(|r| r.outcome.latency)
        .max();
    println!(
        "scenario edge-loss: in flight or sent during the outage: {} invocations, {} served (the \
         longest after {}), {} failed{}",
        touched.len(),
        touched.iter().filter(|r| r.outcome.status == 200).count(),
        held.map_or("-".into(), |l| format!("{:.2} s", l.as_secs_f64())),
        touched.iter().filter(|r| r.outcome.status != 200).count(),
        {
            let f = failures(&touched);
            let waits: Vec<f64> = touched
                .iter()
                .filter(|r| r.outcome.status != 200)
                .map(|r| r.outcome.latency.as_secs_f64())
                .collect();
            let (lo, hi) = waits
                .iter()
                .fold((f64::MAX, 0.0f64), |(lo, hi), w| (lo.min(*w), hi.max(*w)));
            if f.is_empty() {
                String::new()
            } else {
                format!(" (HTTP {f}, answered after {lo:.2}–{hi:.2} s)")
            }
        }
    );

    o.count(&all);
    o.figure("moved", watch.moved.len());
    if let Some(r) = recovered {
        o.figure("recovered_s", secs(r));
    }
    if let Some(r) = returned {
        o.figure("returned_s", secs(r));
    }
    if watch.moved.is_empty() {
        o.problems.push(format!(
            "no instance of {TENANT}/{NAME} was seen outside {LOST_POOL}"
        ));
    }
    if o.attainment < MIN_ATTAINMENT {
        o.problems.push(format!(
            "attainment {:.3} < {MIN_ATTAINMENT} ({} of {} failed)",
            o.attainment,
            all.failed(),
            all.attainment.invocations
        ));
    }
    o.check_billing(up, TENANT);
    Ok(o)
}

/// The end of the first request answered 200 that ended at or after `at`.
fn first_served_after(records: &[Record], at: Duration) -> Option<Duration> {
    records
        .iter()
        .filter(|r| r.outcome.status == 200)
        .map(|r| r.sent + r.outcome.latency)
        .filter(|end| *end >= at)
        .min()
}

/// What the samples saw: instances outside the lost pool, and changes.
#[derive(Default)]
struct Watch {
    /// Instance ids seen on a node of another pool than the lost one.
    moved: BTreeSet<u64>,
    /// The last listing printed (`id node state`), and the node's state.
    last: String,
    last_node: String,
}

impl Watch {
    /// Samples the function's instances and the lost node's state, prints
    /// what changed; the instances (`None`: no replica answered).
    fn sample(
        &mut self,
        up: &Up,
        lost_node: &str,
        pool_of: &dyn Fn(&str) -> String,
        t_kill: Duration,
        now: Duration,
    ) -> Option<Vec<InstanceSeen>> {
        let seen = instances_of(&up.api, &up.operator, TENANT, NAME).ok();
        let at = now.saturating_sub(t_kill).as_secs_f64();
        if let Some(is) = &seen {
            for i in is {
                if !i.node.is_empty() && pool_of(&i.node) != LOST_POOL {
                    self.moved.insert(i.id);
                }
            }
            let listing = is
                .iter()
                .map(|i| format!("i-{} on {} ({})", i.id, i.node, i.state))
                .collect::<Vec<_>>()
                .join(", ");
            if listing != self.last {
                println!("scenario edge-loss: +{at:.2} s after the kill: {listing}");
                self.last = listing;
            }
        }
        let node = node_state(up, lost_node).unwrap_or_else(|| "?".into());
        if node != self.last_node {
            println!("scenario edge-loss: +{at:.2} s after the kill: {lost_node} is {node}");
            self.last_node = node;
        }
        seen
    }
}

/// `GET /v1/nodes`: the node's state (`ready`, `not_ready`, …).
fn node_state(up: &Up, node: &str) -> Option<String> {
    let v = up.api.call("GET", "/v1/nodes", &up.operator, None).ok()?;
    v.as_array()?
        .iter()
        .find(|r| r["node"].as_str() == Some(node))
        .and_then(|r| r["state"].as_str())
        .map(str::to_string)
}
