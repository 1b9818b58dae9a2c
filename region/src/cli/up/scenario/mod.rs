//! `gsharectl up --scenario <name>`: the local region through a named,
//! scripted situation instead of the demo.
//!
//! ```text
//!  up::run ── Up::start (3 replicas, one gshare-edge per node, tokens)
//!          ── Scenario::run(&mut Up)        deploys its own function(s), drives
//!               │                            HTTP load through the replicas (crowd.rs),
//!               │                            samples the replicated state (instances.rs),
//!               │                            checks the bills against the journals (billing.rs)
//!               └─▶ Outcome { figures, problems }
//!          ── the normal stop (agents, bills, replicas)
//!          ── last stdout line: Outcome::line()
//!             `scenario: name=<n> invocations=<N> failed=<F> attainment=<x> <metric>=<value> …`
//!             exit non-zero when `problems` is not empty
//! ```
//!
//! Every figure is measured by the scenario as a client: latencies from
//! send to the answer's last byte, instance counts from the replicated
//! state over the HTTP API. `invocations` counts every request the
//! scenario's clients sent; `failed` those not answered 200 (an error
//! status or no answer); `attainment` the fraction answered 200 within the
//! deadline they were sent with. A scenario adds its own figures; seconds
//! and milliseconds are printed as decimals.
//!
//! Adding one: a module with `pub fn run(up: &mut Up, stop: &mut
//! StopSignal) -> anyhow::Result<Outcome>` and a variant here.

mod billing;
mod burst;
mod crowd;
mod edge_loss;
mod migrate;
mod to_zero;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::load;
use super::stop_signal::StopSignal;
use super::Up;

/// The scenarios of `gsharectl up --scenario`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// A function goes from idle to 20× its load; scaled_s= is the time until the instances the
    /// autoscaler wants all serve (instances_start=, instances_peak=).
    Burst,
    /// Idle → zero instances → first request: warm_ms= with the host copy kept, cold_ms= after
    /// an agent restart dropped it (instances_min=0).
    ToZero,
    /// An operator moves a function under load from the center to edge-b, make-before-break:
    /// moved= instances, move_s= the move call; no invocation may fail.
    Migrate,
    /// An edge node's agent is killed under load: recovered_s= until a request is served from
    /// the center, returned_s= from its restart until the function is back on it.
    EdgeLoss,
}

impl Scenario {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Burst => "burst",
            Scenario::ToZero => "to-zero",
            Scenario::Migrate => "migrate",
            Scenario::EdgeLoss => "edge-loss",
        }
    }

    /// Runs it on the started region `up`.
    pub(super) fn run(self, up: &mut Up, stop: &mut StopSignal) -> anyhow::Result<Outcome> {
        println!("scenario {}: starting", self.name());
        let mut o = match self {
            Scenario::Burst => burst::run(up, stop)?,
            Scenario::ToZero => to_zero::run(up, stop)?,
            Scenario::Migrate => migrate::run(up, stop)?,
            Scenario::EdgeLoss => edge_loss::run(up, stop)?,
        };
        o.name = self.name();
        for p in &o.problems {
            eprintln!("gsharectl up: scenario {}: {p}", o.name);
        }
        Ok(o)
    }
}

/// What a scenario measured and whether its own check held.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// The scenario's name.
    pub name: &'static str,
    /// Requests its clients sent.
    pub invocations: u64,
    /// Of them, not answered 200.
    pub failed: u64,
    /// Answered 200 within their deadline / invocations.
    pub attainment: f64,
    /// Its own figures, in order (`key`, value as printed).
    pub figures: Vec<(&'static str, String)>,
    /// Why its check failed (empty: it held).
    pub problems: Vec<String>,
}

impl Outcome {
    /// The last line of `gsharectl up --scenario`.
    pub fn line(&self) -> String {
        let mut l = format!(
            "scenario: name={} invocations={} failed={} attainment={:.3}",
            self.name, self.invocations, self.failed, self.attainment
        );
        for (k, v) in &self.figures {
            let _ = write!(l, " {k}={v}");
        }
        l
    }

    /// Adds a figure.
    fn figure(&mut self, key: &'static str, value: impl ToString) {
        self.figures.push((key, value.to_string()));
    }

    /// Sets the counts from a tally.
    fn count(&mut self, t: &crowd::Tally) {
        self.invocations = t.attainment.invocations;
        self.failed = t.failed();
        self.attainment = t.attainment.fraction();
    }

    /// Checks the region's usage of `tenant` against the agents' journals
    /// and adds `billed_invocations=`; a difference is a problem.
    fn check_billing(&mut self, up: &Up, tenant: &str) {
        match billing::check(up, tenant) {
            Ok(b) => {
                println!(
                    "scenario: usage of {tenant}: region {:?}; agents' journals {:?}",
                    b.region, b.journals
                );
                self.figure("billed_invocations", b.region.invocations);
            }
            Err(e) => self.problems.push(e),
        }
    }
}

/// Sends requests with a long deadline through the first replica until
/// one is served (the cold start of the first instance); how long the
/// served one took.
fn first_serve(
    replicas: &[SocketAddr],
    tenant: &str,
    name: &str,
    token: &str,
    stop: &StopSignal,
) -> anyhow::Result<Duration> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = 0;
    while Instant::now() < deadline && !stop.requested() {
        let i = load::invoke(replicas[0], tenant, name, token, 30_000);
        if i.status == 200 {
            return Ok(i.latency);
        }
        last = i.status;
        std::thread::sleep(Duration::from_millis(200));
    }
    anyhow::bail!("{tenant}/{name} was not served within 60 s (last answer HTTP {last})")
}

/// Seconds with three decimals.
fn secs(d: std::time::Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

/// Milliseconds with one decimal.
fn millis(d: std::time::Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_has_the_counts_then_the_figures_in_order() {
        let mut o = Outcome {
            name: "burst",
            invocations: 120,
            failed: 3,
            attainment: 0.9251,
            ..Outcome::default()
        };
        o.figure("scaled_s", secs(std::time::Duration::from_millis(2345)));
        o.figure("instances_start", 1);
        assert_eq!(
            o.line(),
            "scenario: name=burst invocations=120 failed=3 attainment=0.925 scaled_s=2.345 \
             instances_start=1"
        );
        assert_eq!(millis(std::time::Duration::from_micros(12_340)), "12.3");
    }
}
