//! `to-zero`: idle → zero instances → first request, twice: once with the
//! host copy of the weights kept by the agent (`warm_ms`), once after it
//! was dropped by restarting that agent (`cold_ms`).
//!
//! ```text
//!  deploy acme/resume (min 0, max 1, idle 2 s)   no instance
//!  request ─ held by the replica while one is placed ─ 200       from_zero_ms
//!  idle ─ the autoscaler releases it ─ replicated count 0          zero_s
//!  wait until an agent reports its weights in host memory (parked)
//!  request ─ placed again (preferring the node with the host copy) warm_ms  (swap-in expected)
//!  idle ─ count 0 again
//!  restart the agent(s) of the node(s) that ran it (host copies are memory only)
//!  wait until GET /v1/nodes shows each ready with its new registration
//!  request ─ placed again, nothing kept anywhere                   cold_ms  (cold start expected)
//! ```
//!
//! Each request is sent through a replica with a 30 s deadline (the hold
//! from zero is bounded by it) and timed by the client from send to the
//! answer's last byte. The kind of each resume (swap-in or cold start) is
//! read from the swap events the agents reported to the replicas
//! (`GET /v1/cluster/agents`) before and after the request.
//!
//! The check: all three served, the count reached 0 both times
//! (`instances_min=0`), the warm resume was a swap-in and the cold one a
//! cold start (kinds, not timings), and the region billed what the agents
//! journaled. It needs a region that brings a function back from zero and
//! agents that keep released weights in host memory; without them the
//! check says which part is missing.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use gshare_core::model::{PoolPreference, Runtime, Tier};

use super::super::demo::deploy_body;
use super::super::gpu_usage::GpuUsage;
use super::super::instances::instances_of;
use super::super::load::{self, Invocation};
use super::super::stop_signal::StopSignal;
use super::super::Up;
use super::crowd::Tally;
use super::{millis, secs, Outcome};
use crate::agents::SwapCounts;
use crate::api::functions::{FunctionBody, LatencyBody};

const TENANT: &str = "acme";
const NAME: &str = "resume";
/// The deadline of each request: a cold start plus the placement fit well in it.
const REQUEST_DEADLINE_MS: u64 = 30_000;
const IDLE_TIMEOUT_S: u64 = 2;
/// How long the count may take to reach 0 after a request.
const ZERO_BUDGET: Duration = Duration::from_secs(40);
/// How long a restarted agent may take to be heard again.
const BACK_BUDGET: Duration = Duration::from_secs(30);
/// How long the swap event of a resume may take to be reported.
const KIND_BUDGET: Duration = Duration::from_secs(5);
/// How long the agent that ran it may take to report the released
/// weights in host memory (its heartbeat is 200 ms in `up`).
const PARKED_BUDGET: Duration = Duration::from_secs(10);
const SAMPLE: Duration = Duration::from_millis(200);

fn body() -> FunctionBody {
    FunctionBody {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        name: NAME.into(),
        runtime: Runtime::Pytorch,
        // 4 GiB of weights: a cold start (0.5 s + 4096 MiB at 2 GB/s from
        // storage) is far slower than a swap-in (4096 MiB at 12 GB/s).
        memory_mib: 4096,
        compute_milli: 250,
        tier: Tier::Guaranteed,
        deadline_ms: 1000,
        pool: PoolPreference::Center,
        strict_pool: false,
        min_instances: 0,
        max_instances: Some(1),
        idle_timeout_s: IDLE_TIMEOUT_S,
        latency: Some(LatencyBody {
            full_gpu_us: 50_000,
            saturation_milli: 250,
        }),
    }
}

/// What loaded the weights for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    SwapIn,
    ColdStart,
    /// No swap event seen within [`KIND_BUDGET`].
    Unseen,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::SwapIn => "swap_in",
            Kind::ColdStart => "cold_start",
            Kind::Unseen => "unseen",
        }
    }
}

/// Runs `to-zero` on the started region.
pub fn run(up: &mut Up, stop: &mut StopSignal) -> anyhow::Result<Outcome> {
    let token = up.tokens[TENANT].clone();
    deploy_body(&up.api, &body(), &token).context("deploying acme/resume")?;
    println!(
        "scenario to-zero: deployed {TENANT}/{NAME} (min 0, max 1, idle timeout {IDLE_TIMEOUT_S} s, 4 GiB)"
    );
    let mut o = Outcome::default();
    let mut served: Vec<Invocation> = Vec::new();
    let mut ran_on = BTreeSet::new();
    // The lowest count seen after the function served (its start at zero
    // is not a scale to zero).
    let mut min_seen = usize::MAX;

    let first = request(up, &token, "from zero", &mut served);
    o.figure("from_zero_ms", millis(first.latency));
    if first.status != 200 {
        o.problems.push(format!(
            "the first request to a function with no instance was answered HTTP {} (this region \
             does not bring a function back from zero)",
            first.status
        ));
        return finish(o, up, &served, min_seen);
    }
    ran_on.extend(nodes(up));

    for (round, kept) in [(1, true), (2, false)] {
        up.check(stop)?;
        let Some(zero) = wait_zero(up, stop, &mut ran_on)? else {
            min_seen = min_seen.min(count(up).unwrap_or(usize::MAX));
            o.problems.push(format!(
                "the instance count did not reach 0 within {} s of idleness (round {round})",
                ZERO_BUDGET.as_secs()
            ));
            return finish(o, up, &served, min_seen);
        };
        min_seen = 0;
        if round == 1 {
            o.figure("zero_s", secs(zero));
        }
        if kept {
            // The release reaches the agent after the replicated count
            // shows 0; a request sent in between finds the weights still on
            // the GPU (no load at all), which is not the resume shown here.
            if !wait_parked(up, stop)? {
                o.problems.push(format!(
                    "no agent reported the released weights in host memory within {} s",
                    PARKED_BUDGET.as_secs()
                ));
            }
        } else {
            restart_agents(up, stop, &ran_on)?;
        }
        let before = swap_totals(up);
        let what = if kept { "warm" } else { "cold" };
        let i = request(up, &token, what, &mut served);
        let kind = kind_of(up, before);
        println!(
            "scenario to-zero: the {what} resume loaded by {}",
            kind.as_str()
        );
        o.figure(if kept { "warm_ms" } else { "cold_ms" }, millis(i.latency));
        o.figure(if kept { "warm_kind" } else { "cold_kind" }, kind.as_str());
        if i.status != 200 {
            o.problems
                .push(format!("the {what} resume was answered HTTP {}", i.status));
            return finish(o, up, &served, min_seen);
        }
        ran_on.extend(nodes(up));
        let expected = if kept { Kind::SwapIn } else { Kind::ColdStart };
        if kind != expected {
            o.problems.push(format!(
                "the {what} resume was loaded by {} where {} was expected{}",
                kind.as_str(),
                expected.as_str(),
                if kept {
                    " (no agent kept the released weights in host memory)"
                } else {
                    ""
                }
            ));
        }
    }
    finish(o, up, &served, min_seen)
}

/// Counts, `instances_min=`, and the billing check.
fn finish(
    mut o: Outcome,
    up: &Up,
    served: &[Invocation],
    min_seen: usize,
) -> anyhow::Result<Outcome> {
    let mut t = Tally::default();
    for i in served {
        t.add(i, Duration::from_millis(REQUEST_DEADLINE_MS));
    }
    o.count(&t);
    o.figure(
        "instances_min",
        if min_seen == usize::MAX {
            "?".to_string()
        } else {
            min_seen.to_string()
        },
    );
    if t.lost > 0 {
        o.problems
            .push(format!("{} invocations got no answer at all", t.lost));
    }
    o.check_billing(up, TENANT);
    Ok(o)
}

/// One request through a replica with [`REQUEST_DEADLINE_MS`].
fn request(up: &Up, token: &str, what: &str, served: &mut Vec<Invocation>) -> Invocation {
    let i = load::invoke(
        up.api.replicas()[0],
        TENANT,
        NAME,
        token,
        REQUEST_DEADLINE_MS,
    );
    println!(
        "scenario to-zero: {what}: HTTP {} after {} ms",
        i.status,
        millis(i.latency)
    );
    served.push(i);
    i
}

fn count(up: &Up) -> Option<usize> {
    instances_of(&up.api, &up.operator, TENANT, NAME)
        .ok()
        .map(|is| is.len())
}

/// The nodes of the function's instances now.
fn nodes(up: &Up) -> Vec<String> {
    instances_of(&up.api, &up.operator, TENANT, NAME)
        .unwrap_or_default()
        .into_iter()
        .map(|i| i.node)
        .filter(|n| !n.is_empty())
        .collect()
}

/// Waits until the replicated state lists no instance; how long it took.
/// Nodes seen holding one meanwhile are added to `ran_on`.
fn wait_zero(
    up: &mut Up,
    stop: &mut StopSignal,
    ran_on: &mut BTreeSet<String>,
) -> anyhow::Result<Option<Duration>> {
    let began = Instant::now();
    while began.elapsed() < ZERO_BUDGET {
        up.check(stop)?;
        if let Ok(is) = instances_of(&up.api, &up.operator, TENANT, NAME) {
            if is.is_empty() {
                println!(
                    "scenario to-zero: 0 instances {:.1} s after the request",
                    began.elapsed().as_secs_f64()
                );
                return Ok(Some(began.elapsed()));
            }
            ran_on.extend(is.into_iter().map(|i| i.node).filter(|n| !n.is_empty()));
        }
        stop.wait(SAMPLE);
    }
    Ok(None)
}

/// Waits until an agent reports the function's weights in host memory
/// (its `host_copies`: released there and parked), at most
/// [`PARKED_BUDGET`]; whether one did.
fn wait_parked(up: &mut Up, stop: &mut StopSignal) -> anyhow::Result<bool> {
    let began = Instant::now();
    while began.elapsed() < PARKED_BUDGET {
        up.check(stop)?;
        let agents = GpuUsage::listing(&up.api, &up.operator);
        if let Some(a) = agents.iter().find(|a| {
            a.host_copies
                .iter()
                .any(|c| c.tenant.0 == TENANT && c.function == NAME)
        }) {
            println!(
                "scenario to-zero: {} reports the weights in host memory {:.1} s after 0",
                a.node,
                began.elapsed().as_secs_f64()
            );
            return Ok(true);
        }
        stop.wait(SAMPLE);
    }
    Ok(false)
}

/// Restarts the agent of each node in `nodes` and waits until the region
/// hears each again (`GET /v1/nodes`: `ready`, a newer registration).
fn restart_agents(
    up: &mut Up,
    stop: &mut StopSignal,
    nodes: &BTreeSet<String>,
) -> anyhow::Result<()> {
    for node in nodes {
        let before = registered_at(up, node).unwrap_or(0);
        let (p, killed) = up.children.restart(&format!("agent {node}"))?;
        println!(
            "up: restarted agent {node} pid {}{} (its host copies are gone with the process)",
            p.pid(),
            if killed {
                " (the old one was killed)"
            } else {
                ""
            }
        );
        let began = Instant::now();
        loop {
            up.check(stop)?;
            let row = node_row(up, node);
            let back = row.as_ref().is_some_and(|r| {
                r["state"].as_str() == Some("ready")
                    && r["agent"]["registered_at_ms"].as_u64().unwrap_or(0) > before
                    && r["last_heartbeat_ms_ago"]
                        .as_u64()
                        .is_some_and(|ms| ms < 2_000)
            });
            if back {
                println!(
                    "scenario to-zero: agent {node} ready again after {:.1} s",
                    began.elapsed().as_secs_f64()
                );
                break;
            }
            if began.elapsed() > BACK_BUDGET {
                anyhow::bail!(
                    "the restarted agent of {node} was not heard within {} s: {row:?}",
                    BACK_BUDGET.as_secs()
                );
            }
            stop.wait(SAMPLE);
        }
    }
    Ok(())
}

fn node_row(up: &Up, node: &str) -> Option<serde_json::Value> {
    let v = up.api.call("GET", "/v1/nodes", &up.operator, None).ok()?;
    v.as_array()?
        .iter()
        .find(|r| r["node"].as_str() == Some(node))
        .cloned()
}

fn registered_at(up: &Up, node: &str) -> Option<u64> {
    node_row(up, node)?["agent"]["registered_at_ms"].as_u64()
}

/// The swap counts of every linked agent, summed.
fn swap_totals(up: &Up) -> SwapCounts {
    sum_swaps(&GpuUsage::listing(&up.api, &up.operator))
}

fn sum_swaps(reports: &[crate::agents::AgentReport]) -> SwapCounts {
    let mut s = SwapCounts::default();
    for r in reports {
        s.swap_in = s.swap_in.saturating_add(r.swaps.swap_in);
        s.cold_start = s.cold_start.saturating_add(r.swaps.cold_start);
    }
    s
}

/// Which load the agents reported since `before`, waiting up to
/// [`KIND_BUDGET`] for the report.
fn kind_of(up: &Up, before: SwapCounts) -> Kind {
    let began = Instant::now();
    loop {
        let now = swap_totals(up);
        if now.cold_start > before.cold_start {
            return Kind::ColdStart;
        }
        if now.swap_in > before.swap_in {
            return Kind::SwapIn;
        }
        if began.elapsed() > KIND_BUDGET {
            return Kind::Unseen;
        }
        std::thread::sleep(SAMPLE);
    }
}
