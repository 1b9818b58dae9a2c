//! `burst`: a function goes from idle to 20× its load.
//!
//! ```text
//!  deploy acme/burst (min 1, max 6)  ── first request served (cold start)
//!  1× load: 1 client  ─────────────── BASE            instances_start = count at the burst
//!  20× load: 20 clients ──┬─ every 200 ms: instances (replicated state, any replica)
//!                         │               + the leader's desired count (its /metrics)
//!                         └─ need: the desired count once it has not risen for STEADY
//!                            scaled_s: burst start → the first sample where that many
//!                            instances were listed and hosted by their agents
//!  then HOLD more of it (instances_peak = the highest count sampled), stop the clients
//! ```
//!
//! The function: 100 ms per request on its 250-milli slice, a 300 ms
//! deadline, so one instance's target is `floor(300/100) × 0.7 = 2.1`
//! requests at once (`core/src/autoscale.rs`). A client waits ~100 ms
//! between requests, so it keeps about 0.5 in the function: 1× (one
//! client) fits one instance, 20× (about 10 at once) needs five.
//! "Hosted" is the state the instance's agent reports for it (`cold`,
//! `loading`, `resident`, `swapped_out`; not `placed` or `assigned`): the
//! agent has it. `resident_peak` is the most instances seen `resident`
//! (weights on the GPU) at once. The scale-out spreads a function's
//! instances over GPUs, so the extra ones become resident and serve
//! (`resident_peak` above 1); the phase after the needed instances were
//! hosted is printed apart, and in measured runs it had no failures.
//!
//! The check: the scale-out happened (`instances_peak > instances_start`)
//! and the needed instances served within [`BUDGET`], every request was
//! answered (a refusal such as `504 deadline_unreachable` while one
//! instance carries the burst is an answer, counted in `failed`, not a
//! loss), and the region billed what the agents journaled.

use std::time::{Duration, Instant};

use anyhow::Context;
use gshare_core::model::{PoolPreference, Runtime, Tier};

use super::super::demo::deploy_body;
use super::super::instances::instances_of;
use super::super::stop_signal::StopSignal;
use super::super::Up;
use super::crowd::{Aim, Crowd, Tally};
use super::{first_serve, secs, Outcome};
use crate::api::functions::{FunctionBody, LatencyBody};

const TENANT: &str = "acme";
const NAME: &str = "burst";
const DEADLINE_MS: u64 = 300;
const THINK_MS: u64 = 100;
const MAX_INSTANCES: u32 = 6;
/// Clients of the 1× load; the burst has 20× as many.
const BASE_CLIENTS: usize = 1;
const BURST_FACTOR: usize = 20;
/// How long the 1× load runs before the burst.
const BASE: Duration = Duration::from_secs(4);
/// How long the needed instances may take to serve.
const BUDGET: Duration = Duration::from_secs(45);
/// How long the burst goes on once they serve.
const HOLD: Duration = Duration::from_secs(2);
/// How long the autoscaler's desired count must stay put to be its need.
const STEADY: Duration = Duration::from_secs(4);
const SAMPLE: Duration = Duration::from_millis(200);

fn body() -> FunctionBody {
    FunctionBody {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        name: NAME.into(),
        runtime: Runtime::Pytorch,
        memory_mib: 1024,
        compute_milli: 250,
        tier: Tier::Guaranteed,
        deadline_ms: DEADLINE_MS,
        pool: PoolPreference::Center,
        strict_pool: false,
        min_instances: 1,
        max_instances: Some(MAX_INSTANCES),
        // No scale-in while the scenario runs.
        idle_timeout_s: 300,
        latency: Some(LatencyBody {
            full_gpu_us: 100_000,
            saturation_milli: 250,
        }),
    }
}

/// Runs `burst` on the started region.
pub fn run(up: &mut Up, stop: &mut StopSignal) -> anyhow::Result<Outcome> {
    let token = up.tokens[TENANT].clone();
    deploy_body(&up.api, &body(), &token).context("deploying acme/burst")?;
    println!("scenario burst: deployed {TENANT}/{NAME} (min 1, max {MAX_INSTANCES}; 100 ms a request, {DEADLINE_MS} ms deadline)");
    let replicas = up.api.replicas().to_vec();
    let cold = first_serve(&replicas, TENANT, NAME, &token, stop)?;
    println!(
        "scenario burst: first request served after {} ms (cold start)",
        cold.as_millis()
    );
    up.check(stop)?;

    let mut crowd = Crowd::new(
        Aim {
            tenant: TENANT.into(),
            name: NAME.into(),
            token: token.clone(),
            deadline_ms: DEADLINE_MS,
            think_ms: THINK_MS,
        },
        replicas,
    );
    crowd.grow_to(BASE_CLIENTS);
    println!(
        "scenario burst: 1× load ({BASE_CLIENTS} client) for {} s",
        BASE.as_secs()
    );
    stop.wait(BASE);
    up.check(stop)?;
    let start = count(up).unwrap_or(0);
    let burst_at = crowd.created().elapsed();
    let burst_began = Instant::now();
    crowd.grow_to(BASE_CLIENTS * BURST_FACTOR);
    println!(
        "scenario burst: 20× load ({} clients) with {start} instance{}",
        crowd.clients(),
        if start == 1 { "" } else { "s" }
    );

    let mut peak = start;
    let mut resident_peak = 0;
    // The autoscaler's need: its desired count once it has not risen for
    // STEADY; `reached`: when the listed count first met the current one.
    let mut desired_since: Option<(usize, Instant)> = None;
    let mut reached: Option<Duration> = None;
    let mut scaled: Option<(Duration, usize)> = None;
    while burst_began.elapsed() < BUDGET {
        up.check(stop)?;
        let seen = instances_of(&up.api, &up.operator, TENANT, NAME).unwrap_or_default();
        let current: Vec<_> = seen.iter().filter(|i| !i.outgoing).collect();
        let listed = current.len();
        let hosted = current.iter().filter(|i| i.hosted()).count();
        let resident = current.iter().filter(|i| i.resident()).count();
        peak = peak.max(listed);
        resident_peak = resident_peak.max(resident);
        let desired = leader_desired(up);
        if let Some(d) = desired {
            if desired_since.is_none_or(|(old, _)| d > old) {
                println!(
                    "scenario burst: +{:.1} s: the autoscaler wants {d}; {listed} listed, {hosted} \
                     hosted by their agent, {resident} resident",
                    burst_began.elapsed().as_secs_f64(),
                );
                desired_since = Some((d, Instant::now()));
                reached = None;
            }
        }
        if let Some((d, since)) = desired_since.filter(|&(d, _)| d > start) {
            if reached.is_none() && hosted >= d {
                reached = Some(burst_began.elapsed());
            }
            if let Some(at) = reached.filter(|_| since.elapsed() >= STEADY) {
                println!(
                    "scenario burst: {d} instances hosted at +{:.1} s; the autoscaler has wanted \
                     no more for {} s",
                    at.as_secs_f64(),
                    STEADY.as_secs()
                );
                scaled = Some((at, d));
                break;
            }
        }
        stop.wait(SAMPLE);
    }
    let last_desired = desired_since.map(|(d, _)| d);
    if scaled.is_some() {
        let hold_end = Instant::now() + HOLD;
        while Instant::now() < hold_end {
            up.check(stop)?;
            if let Some(n) = count(up) {
                peak = peak.max(n);
            }
            stop.wait(SAMPLE);
        }
    }
    let scaled_seen = scaled.map(|(at, _)| burst_at + at);
    let records = crowd.finish();
    up.check(stop)?;

    let deadline = Duration::from_millis(DEADLINE_MS);
    let all = Tally::of(&records, deadline);
    let phase = |from: Duration, to: Duration| {
        let rs: Vec<_> = records
            .iter()
            .filter(|r| r.sent >= from && r.sent < to)
            .copied()
            .collect();
        Tally::of(&rs, deadline)
    };
    let end = records.iter().map(|r| r.sent).max().unwrap_or_default() + Duration::from_secs(1);
    for (what, t) in [
        ("1× load", phase(Duration::ZERO, burst_at)),
        (
            "burst until scaled",
            phase(burst_at, scaled_seen.unwrap_or(end)),
        ),
        ("burst once scaled", phase(scaled_seen.unwrap_or(end), end)),
    ] {
        println!(
            "scenario burst: {what}: {} invocations, {} within {DEADLINE_MS} ms, {} failed, {} lost",
            t.attainment.invocations,
            t.attainment.within,
            t.failed(),
            t.lost
        );
    }

    let mut o = Outcome::default();
    o.count(&all);
    match scaled {
        Some((at, _)) => o.figure("scaled_s", secs(at)),
        None => o.problems.push(format!(
            "the needed instances did not serve within {} s of the burst (start {start}, peak \
             {peak}, the autoscaler last wanted {})",
            BUDGET.as_secs(),
            last_desired.map_or("?".into(), |d| d.to_string())
        )),
    }
    o.figure("instances_start", start);
    o.figure("instances_peak", peak);
    o.figure("resident_peak", resident_peak);
    o.figure("lost", all.lost);
    if peak <= start {
        o.problems.push(format!(
            "no scale-out: instances_peak {peak} ≤ instances_start {start}"
        ));
    }
    if all.lost > 0 {
        o.problems
            .push(format!("{} invocations got no answer at all", all.lost));
    }
    o.check_billing(up, TENANT);
    Ok(o)
}

/// The function's instances (not outgoing) in the replicated state.
fn count(up: &Up) -> Option<usize> {
    instances_of(&up.api, &up.operator, TENANT, NAME)
        .ok()
        .map(|is| is.iter().filter(|i| !i.outgoing).count())
}

/// The leader's autoscaler's desired count for the function (its
/// `/metrics`, `gshare_region_autoscale_desired_instances`).
fn leader_desired(up: &Up) -> Option<usize> {
    let cluster = up.api.call("GET", "/v1/cluster", "", None).ok()?;
    let leader = cluster["leader"].as_u64()?;
    let addr = up
        .layout
        .replicas
        .iter()
        .find(|r| r.id == leader)?
        .http_addr;
    let r = crate::http_client::request(
        addr,
        "GET",
        "/metrics",
        Some(&up.operator),
        None,
        Duration::from_secs(5),
    )
    .ok()?;
    desired_in(&r.body, TENANT, NAME)
}

/// The desired count of `tenant/function` in a `/metrics` text.
fn desired_in(metrics: &str, tenant: &str, function: &str) -> Option<usize> {
    let t = format!("tenant=\"{tenant}\"");
    let f = format!("function=\"{function}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("gshare_region_autoscale_desired_instances{"))
        .find(|l| l.contains(&t) && l.contains(&f))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v.max(0.0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_desired_count_is_read_from_the_leaders_metrics() {
        let m = "# HELP x\n\
            gshare_region_autoscale_desired_instances{tenant=\"acme\",function=\"other\",rule=\"stable\"} 2\n\
            gshare_region_autoscale_desired_instances{tenant=\"acme\",function=\"burst\",rule=\"panic\"} 5\n";
        assert_eq!(desired_in(m, "acme", "burst"), Some(5));
        assert_eq!(desired_in(m, "globex", "burst"), None);
    }

    #[test]
    fn one_x_fits_one_instance_and_twenty_x_needs_several() {
        let spec = body()
            .into_spec(gshare_core::model::TenantId("acme".into()))
            .expect("a valid spec");
        let target = gshare_core::autoscale::target_concurrency_milli(&spec, &Default::default())
            as f64
            / 1000.0;
        let service_ms = spec.latency.service_us(spec.compute_milli) as f64 / 1000.0;
        let per_client = service_ms / (service_ms + THINK_MS as f64);
        let base = BASE_CLIENTS as f64 * per_client;
        let burst = base * BURST_FACTOR as f64;
        assert!(base <= target, "1×: {base} > target {target}");
        let needed = (burst / target).ceil() as u32;
        assert!(
            (3..=MAX_INSTANCES).contains(&needed),
            "20× needs {needed} (target {target}, {burst} at once)"
        );
    }
}
