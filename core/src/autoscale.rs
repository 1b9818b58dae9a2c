//! The autoscaler: a function's load signals and `now` in, the number of
//! instances it should have out. Pure: no clock, no I/O; the region's
//! scheduler feeds it and turns a decision into placements or releases.
//!
//! The rules follow Knative's KPA (a stable window and a shorter panic
//! window; panic mode never scales in), with one change that matters for
//! GPU serving: the target load of one instance is not a fixed
//! concurrency. It is derived from the function itself. A request on a
//! slice of `compute_milli` takes `service = latency.service_us(compute)`;
//! requests at one instance are served one after another, so the k-th
//! request waiting there finishes after about `k × service`, and meets its
//! deadline while `k ≤ deadline / service`. An instance's capacity is
//! therefore `deadline / service` requests in flight or waiting, and the
//! target is `target_utilization` of it (at least one request).
//!
//! ```text
//! target      = max(1, floor(deadline / service) × utilization)
//! demand      = concurrency + reject rate × service          (per signal)
//! stable      = mean demand over the stable window   (60 s)
//! panic value = mean demand over the panic window    (6 s)
//! desired     = ceil(stable / target)                        (stable mode)
//!             = max(current, ceil(panic value / target))     (panic mode)
//! panic mode  : entered when panic value / target ≥ threshold × current,
//!               left one stable window after the last time it held
//! scale-in    : only to the highest recommendation of the last
//!               idle_timeout_s (an extra instance is released after it
//!               has been unneeded that long), at most halving per decision
//! to zero     : min_instances = 0, no arrival and nothing in flight for
//!               idle_timeout_s → 0
//! from zero   : no instance and a request waiting or arrived in the
//!               panic window → at least 1; else no instance stays 0
//!               (min_instances = 0; the windows' old load does not count)
//! then        : clamp to [min_instances, max_instances] and to what the
//!               tenant's quota leaves
//! ```
//!
//! A request rejected early (the agent saw its deadline could not be met)
//! leaves at once, so the concurrency an agent samples does not show it:
//! under a burst far above capacity most requests are turned away and the
//! sampled concurrency stays near what the current instances hold. Each
//! signal therefore adds the load the rejected requests would have put on
//! an instance, `reject rate × service` (Little's law, with the service
//! time as a lower bound of their stay), to its concurrency. It is
//! left out when `deadline < service` (no instance could meet such a
//! deadline, so more instances would not help).
//!
//! Every decision says which rule set its value ([`Rule`]) and the
//! figures it used, so `gsharectl function describe` and `/metrics` can
//! explain it.
//!
//! Arithmetic is checked or saturating: the inputs come from agents and
//! from tenants' specs.

#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::model::{FunctionSpec, Tier, WHOLE_GPU};

/// The autoscaler's constants (the region's; not per function).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Params {
    /// Window of the stable mean, in ms (Knative: 60 s).
    pub stable_window_ms: u64,
    /// Window of the panic mean, in ms (Knative: 10 % of the stable one).
    pub panic_window_ms: u64,
    /// Panic when the panic window needs this many percent of the
    /// current instances (Knative: 200).
    pub panic_threshold_pct: u32,
    /// Share of an instance's deadline capacity to aim at, in percent.
    pub target_utilization_pct: u32,
    /// One decision divides the instances by at most this (Knative: 2).
    pub max_scale_down_ratio: u32,
    /// One decision multiplies the instances by at most this (Knative: 1000).
    pub max_scale_up_ratio: u32,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            stable_window_ms: 60_000,
            panic_window_ms: 6_000,
            panic_threshold_pct: 200,
            target_utilization_pct: 70,
            max_scale_down_ratio: 2,
            max_scale_up_ratio: 1000,
        }
    }
}

/// One observation of a function's load, summed over the agents hosting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signal {
    /// When it was observed (the region's clock), ms.
    pub at_ms: u64,
    /// Requests executing or waiting at the observation.
    pub concurrency: u32,
    /// Requests that arrived since the previous signal.
    pub arrivals: u64,
    /// Requests rejected early per second, thousandths (their deadline
    /// could not be met where they arrived), over the agents' latest
    /// report intervals: demand the concurrency above does not show, since
    /// a rejected request leaves at once.
    #[serde(default)]
    pub rejected_per_s_milli: u64,
}

/// The rule that set a decision's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// No signal in the stable window: keep what there is.
    NoSignal,
    /// The stable window's mean.
    Stable,
    /// Panic mode: the panic window's mean, never fewer than now.
    Panic,
    /// Scale-in held by a higher recommendation within `idle_timeout_s`.
    ScaleInDelay,
    /// Scale-in limited to `max_scale_down_ratio` per decision.
    ScaleDownRate,
    /// Scale-out limited to `max_scale_up_ratio` per decision.
    ScaleUpRate,
    /// Idle for `idle_timeout_s` with `min_instances = 0`, or at zero
    /// with no request since (it stays there).
    ToZero,
    /// A request for a function with no instance.
    FromZero,
    /// Raised to `min_instances`.
    Min,
    /// Cut to `max_instances`.
    Max,
    /// Cut to what the tenant's quota leaves.
    Quota,
}

impl Rule {
    /// The snake-case name used in `/metrics` labels and `describe`.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::NoSignal => "no_signal",
            Rule::Stable => "stable",
            Rule::Panic => "panic",
            Rule::ScaleInDelay => "scale_in_delay",
            Rule::ScaleDownRate => "scale_down_rate",
            Rule::ScaleUpRate => "scale_up_rate",
            Rule::ToZero => "to_zero",
            Rule::FromZero => "from_zero",
            Rule::Min => "min",
            Rule::Max => "max",
            Rule::Quota => "quota",
        }
    }
}

/// What the autoscaler decided, with the figures behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Instances the function should have.
    pub desired: u32,
    /// Instances it had when asked.
    pub current: u32,
    /// The rule that set `desired` last.
    pub rule: Rule,
    /// Whether the autoscaler is in panic mode.
    pub panic: bool,
    /// Mean concurrency over the stable window, in thousandths.
    pub stable_concurrency_milli: u64,
    /// Mean concurrency over the panic window, in thousandths.
    pub panic_concurrency_milli: u64,
    /// Target concurrency of one instance, in thousandths.
    pub target_milli: u64,
}

/// Target concurrency of one instance of `spec`, in thousandths of a
/// request (at least one request): `floor(deadline / service) ×
/// utilization`.
pub fn target_concurrency_milli(spec: &FunctionSpec, params: &Params) -> u64 {
    let compute = spec.compute_milli.min(WHOLE_GPU);
    let service_us = spec.latency.service_us(compute).max(1);
    let deadline_us = spec.deadline_ms.saturating_mul(1000);
    let capacity = deadline_us.checked_div(service_us).unwrap_or(0);
    let target = capacity
        .saturating_mul(1000)
        .saturating_mul(u64::from(params.target_utilization_pct))
        .checked_div(100)
        .unwrap_or(0);
    target.max(1000)
}

/// The service time (µs) one early-rejected request of `spec` counts for
/// in the demand, or 0 when `deadline < service`: no instance could meet
/// such a deadline, so its rejects ask for no instance.
fn rejected_service_us(spec: &FunctionSpec) -> u64 {
    let service_us = spec
        .latency
        .service_us(spec.compute_milli.min(WHOLE_GPU))
        .max(1);
    if spec.deadline_ms.saturating_mul(1000) >= service_us {
        service_us
    } else {
        0
    }
}

/// One function's autoscaler state: its recent signals and recommendations.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Autoscaler {
    /// Signals within the stable window, oldest first.
    signals: VecDeque<Signal>,
    /// When the panic condition last held (panic mode lasts one stable
    /// window after it).
    panic_since_ms: Option<u64>,
    /// Recommendations within the scale-in delay, a max-queue: times
    /// increasing, values strictly decreasing.
    recent: VecDeque<(u64, u32)>,
    /// The last time a request arrived or was in flight.
    last_active_ms: Option<u64>,
    /// When this autoscaler was made (a function that never saw a
    /// request is idle from then).
    since_ms: u64,
}

/// Most signals kept per function: a stable window of one-second
/// heartbeats from a few agents fits well within it.
const MAX_SIGNALS: usize = 4096;

impl Autoscaler {
    /// A new autoscaler for a function deployed (or first seen) at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Autoscaler {
            since_ms: now_ms,
            ..Autoscaler::default()
        }
    }

    /// An autoscaler taking over a function that has `current` instances
    /// at `now_ms` (a new leader): it scales in only once its own
    /// recommendations have stayed lower for `idle_timeout_s`, as if it
    /// had recommended `current` just now, and counts the function active
    /// now, so it goes to zero no sooner than `idle_timeout_s` after the
    /// takeover (it has not seen the activity before it, and agents
    /// linked to the old leader report late; an old placement time must
    /// not stand in for the last activity).
    pub fn resume(now_ms: u64, current: u32) -> Self {
        let mut a = Autoscaler::new(now_ms);
        a.recent.push_back((now_ms, current));
        a.last_active_ms = Some(now_ms);
        a
    }

    /// Records a signal. Signals older than the newest one kept are
    /// ignored (they would not change the windows' order).
    pub fn observe(&mut self, params: &Params, signal: Signal) {
        if self.signals.back().is_some_and(|s| s.at_ms > signal.at_ms) {
            return;
        }
        if signal.concurrency > 0 || signal.arrivals > 0 || signal.rejected_per_s_milli > 0 {
            self.last_active_ms = Some(signal.at_ms);
        }
        self.signals.push_back(signal);
        self.prune(params, signal.at_ms);
        while self.signals.len() > MAX_SIGNALS {
            self.signals.pop_front();
        }
    }

    /// An instance of the function was placed at `at_ms` (woken from zero
    /// by a held request, or scaled out, or replaced): the function counts
    /// as active then, so it goes to zero no sooner than `idle_timeout_s`
    /// after its newest placement. What keeps an instance just woken from
    /// being released before its agent's first reports arrive (activity
    /// otherwise comes from those reports only).
    pub fn placed(&mut self, at_ms: u64) {
        if self.last_active_ms.is_none_or(|t| t < at_ms) {
            self.last_active_ms = Some(at_ms);
        }
    }

    fn prune(&mut self, params: &Params, now_ms: u64) {
        let from = now_ms.saturating_sub(params.stable_window_ms);
        while self.signals.front().is_some_and(|s| s.at_ms <= from) {
            self.signals.pop_front();
        }
    }

    /// Mean demand (thousandths) of the signals in `(now - window, now]`,
    /// and whether any arrived or was in flight there; `None` if no signal.
    /// A signal's demand is its concurrency plus its reject rate ×
    /// `service_us` (see the module docs); `service_us = 0` leaves rejects
    /// out.
    fn window(&self, now_ms: u64, window_ms: u64, service_us: u64) -> Option<(u64, bool)> {
        let from = now_ms.saturating_sub(window_ms);
        let mut sum: u64 = 0;
        let mut n: u64 = 0;
        let mut active = false;
        for s in self
            .signals
            .iter()
            .filter(|s| s.at_ms > from && s.at_ms <= now_ms)
        {
            // per s (thousandths) × µs / 10⁶ = concurrency (thousandths)
            let turned_away = s.rejected_per_s_milli.saturating_mul(service_us) / 1_000_000;
            sum = sum
                .saturating_add(u64::from(s.concurrency).saturating_mul(1000))
                .saturating_add(turned_away);
            n = n.saturating_add(1);
            active |= s.concurrency > 0 || s.arrivals > 0 || s.rejected_per_s_milli > 0;
        }
        sum.checked_div(n).map(|mean| (mean, active))
    }

    /// The number of instances `spec` should have now, given `current`
    /// instances and room in the tenant's quota for `quota_room` more.
    pub fn decide(
        &mut self,
        params: &Params,
        spec: &FunctionSpec,
        now_ms: u64,
        current: u32,
        quota_room: u32,
    ) -> Decision {
        self.prune(params, now_ms);
        let target = target_concurrency_milli(spec, params);
        let service_us = rejected_service_us(spec);
        let stable = self.window(now_ms, params.stable_window_ms, service_us);
        let panic_w = self.window(
            now_ms,
            params.panic_window_ms.min(params.stable_window_ms),
            service_us,
        );
        let stable_milli = stable.map_or(0, |(m, _)| m);
        let panic_milli = panic_w.map_or(0, |(m, _)| m);
        let need = |milli: u64| -> u32 {
            u32::try_from(milli.div_ceil(target.max(1))).unwrap_or(u32::MAX)
        };

        let mut panic = false;
        let (mut desired, mut rule) = match stable {
            None => (current, Rule::NoSignal),
            Some(_) => {
                let over = current > 0
                    && u128::from(panic_milli).saturating_mul(100)
                        >= u128::from(target)
                            .saturating_mul(u128::from(current))
                            .saturating_mul(u128::from(params.panic_threshold_pct));
                if over {
                    self.panic_since_ms = Some(now_ms);
                } else if self
                    .panic_since_ms
                    .is_some_and(|t| now_ms >= t.saturating_add(params.stable_window_ms))
                {
                    self.panic_since_ms = None;
                }
                if self.panic_since_ms.is_some() {
                    panic = true;
                    (need(panic_milli).max(current), Rule::Panic)
                } else {
                    (need(stable_milli), Rule::Stable)
                }
            }
        };

        // From zero: a request is waiting or arrived with nothing to serve
        // it. At zero nothing else brings an instance: the windows' means
        // still hold the load from before the release (no agent reports a
        // function it does not host) and would bring it back at once.
        let fresh = panic_w.is_some_and(|(_, active)| active);
        if current == 0 {
            if fresh {
                desired = desired.max(1);
                rule = Rule::FromZero;
            } else if spec.min_instances == 0 {
                desired = 0;
                rule = Rule::ToZero;
            }
        }

        // Scale-in waits until the recommendation has stayed low for
        // idle_timeout_s: never below the highest one of that window.
        let idle_ms = spec.idle_timeout_s.saturating_mul(1000);
        self.remember(now_ms, idle_ms, desired);
        if desired < current {
            let held = self
                .recent
                .front()
                .map_or(desired, |&(_, v)| v)
                .min(current);
            if held > desired {
                desired = held;
                rule = Rule::ScaleInDelay;
            }
        }

        // Rate limits.
        let floor = current.div_ceil(params.max_scale_down_ratio.max(1));
        if desired < floor {
            desired = floor;
            rule = Rule::ScaleDownRate;
        }
        let ceiling = current
            .max(1)
            .saturating_mul(params.max_scale_up_ratio.max(1));
        if desired > ceiling {
            desired = ceiling;
            rule = Rule::ScaleUpRate;
        }

        // To zero: idle for idle_timeout_s, and zero allowed.
        let idle_since = self.last_active_ms.unwrap_or(self.since_ms);
        if spec.min_instances == 0
            && current > 0
            && !fresh
            && now_ms >= idle_since.saturating_add(idle_ms)
        {
            desired = 0;
            rule = Rule::ToZero;
        }

        if desired < spec.min_instances {
            desired = spec.min_instances;
            rule = Rule::Min;
        }
        if desired > spec.max_instances {
            desired = spec.max_instances;
            rule = Rule::Max;
        }
        let allowed = current.saturating_add(quota_room);
        if desired > current && desired > allowed {
            desired = allowed;
            rule = Rule::Quota;
        }

        Decision {
            desired,
            current,
            rule,
            panic,
            stable_concurrency_milli: stable_milli,
            panic_concurrency_milli: panic_milli,
            target_milli: target,
        }
    }

    /// Adds a recommendation to the max-queue of the last `window_ms`.
    fn remember(&mut self, now_ms: u64, window_ms: u64, value: u32) {
        let from = now_ms.saturating_sub(window_ms);
        while self.recent.front().is_some_and(|&(t, _)| t < from) {
            self.recent.pop_front();
        }
        while self.recent.back().is_some_and(|&(_, v)| v <= value) {
            self.recent.pop_back();
        }
        self.recent.push_back((now_ms, value));
    }
}

/// An instance the scheduler may release when a function scales in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleInCandidate<I> {
    /// The instance.
    pub id: I,
    /// Its function's tier.
    pub tier: Tier,
    /// How full its GPU is (reserved memory / capacity), in parts per million.
    pub gpu_used_ppm: u32,
    /// Whether it is the last copy of the function on a node where
    /// requests for it are waiting.
    pub last_on_node_with_waiting: bool,
}

/// The instance whose removal loses least: never the last copy on a node
/// with requests waiting; the weakest tier first (oversubscribed before
/// burstable before guaranteed before exclusive); then the emptiest GPU
/// (its removal frees a GPU soonest); then the lowest id, so the choice
/// is deterministic. `None` if every candidate is protected.
pub fn pick_scale_in<I: Ord>(candidates: &[ScaleInCandidate<I>]) -> Option<&ScaleInCandidate<I>> {
    candidates
        .iter()
        .filter(|c| !c.last_on_node_with_waiting)
        .min_by(|a, b| {
            b.tier
                .cmp(&a.tier)
                .then(a.gpu_used_ppm.cmp(&b.gpu_used_ppm))
                .then(a.id.cmp(&b.id))
        })
}

mod fleet;
pub use fleet::{fewest_kept, Autoscalers, FunctionKey, Scalable, ScaleAction, ScaleStep};

#[cfg(test)]
mod tests;
