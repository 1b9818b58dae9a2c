//! Per-function load counters of one node, read (and reset) once per
//! report: what the agent sends the region as [`FunctionLoad`]s.
//!
//! ```text
//!  agent: request arrived ─▶ arrived(f)        Command::Run    ─▶ started(f, queue wait)
//!         ran past deadline ─▶ missed(f)       Command::Reject ─▶ rejected(f, reason)
//!                                              Command::SwapIn / Move ─▶ swapped(f)
//!  heartbeat ─▶ report(now, f, …) ─▶ FunctionLoad (counts since the previous report)
//! ```
//!
//! The counts that need a request's function or arrival time are fed by
//! the caller, which keeps both per request (the executor's queues and its
//! commands carry neither, and the simulator's hot path does not pay for
//! them); the idle time comes from the executor's own last arrival
//! ([`super::NodeExecutor::last_arrival`]). Pure: no clock, time comes in
//! as `now`. Counts saturate rather than wrap.

use std::collections::BTreeMap;

use super::{FunctionId, RejectReason};
use crate::model::{Micros, TenantId};
use crate::protocol::FunctionLoad;

/// Counts of one function since the previous report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    arrivals: u64,
    queue_wait_us: u64,
    deadline_misses: u64,
    early_rejects: u64,
    swaps: u64,
}

/// What a function has on the node now, as the caller sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Occupancy {
    /// Requests executing.
    pub in_flight: u32,
    /// Requests accepted and not started yet.
    pub waiting: u32,
    /// When its last request arrived, µs (`None`: none yet).
    pub last_arrival: Option<Micros>,
}

/// The node's per-function counters (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct LoadMeter {
    counts: BTreeMap<FunctionId, Counts>,
}

impl LoadMeter {
    /// An empty meter.
    pub fn new() -> Self {
        Self::default()
    }

    fn of(&mut self, function: FunctionId) -> &mut Counts {
        self.counts.entry(function).or_default()
    }

    /// A request for `function` arrived.
    pub fn arrived(&mut self, function: FunctionId) {
        let c = self.of(function);
        c.arrivals = c.arrivals.saturating_add(1);
    }

    /// A request for `function` started after waiting `queue_wait_us`.
    pub fn started(&mut self, function: FunctionId, queue_wait_us: Micros) {
        let c = self.of(function);
        c.queue_wait_us = c.queue_wait_us.saturating_add(queue_wait_us);
    }

    /// The executor turned a request for `function` away: on arrival
    /// ([`RejectReason::DeadlineUnreachable`]) an early reject, later
    /// ([`RejectReason::DeadlineMissedInQueue`]) a deadline miss; the other
    /// reasons are not load.
    pub fn rejected(&mut self, function: FunctionId, reason: &RejectReason) {
        match reason {
            RejectReason::DeadlineUnreachable { .. } => {
                let c = self.of(function);
                c.early_rejects = c.early_rejects.saturating_add(1);
            }
            RejectReason::DeadlineMissedInQueue { .. } => self.missed(function),
            RejectReason::NoCapacity | RejectReason::UnknownFunction => {}
        }
    }

    /// A request for `function` missed its deadline (in the queue, or while
    /// running).
    pub fn missed(&mut self, function: FunctionId) {
        let c = self.of(function);
        c.deadline_misses = c.deadline_misses.saturating_add(1);
    }

    /// `function`'s weights were swapped in (or moved) onto a GPU.
    pub fn swapped(&mut self, function: FunctionId) {
        let c = self.of(function);
        c.swaps = c.swaps.saturating_add(1);
    }

    /// Forgets a function that left the node.
    pub fn forget(&mut self, function: FunctionId) {
        self.counts.remove(&function);
    }

    /// `function`'s load since the previous report, under its names, and
    /// resets its counts.
    pub fn report(
        &mut self,
        now: Micros,
        function: FunctionId,
        tenant: TenantId,
        name: String,
        occupancy: Occupancy,
    ) -> FunctionLoad {
        let c = self.counts.remove(&function).unwrap_or_default();
        FunctionLoad {
            tenant,
            function: name,
            arrivals: c.arrivals,
            in_flight: occupancy.in_flight,
            waiting: occupancy.waiting,
            queue_wait_us: c.queue_wait_us,
            deadline_misses: c.deadline_misses,
            early_rejects: c.early_rejects,
            swaps: c.swaps,
            idle_ms: occupancy
                .last_arrival
                .map_or(u64::MAX, |t| now.saturating_sub(t) / 1000),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(m: &mut LoadMeter, now: Micros, f: u32, occ: Occupancy) -> FunctionLoad {
        m.report(
            now,
            FunctionId(f),
            TenantId("acme".into()),
            format!("f{f}"),
            occ,
        )
    }

    #[test]
    fn counts_since_the_previous_report() {
        let mut m = LoadMeter::new();
        let f = FunctionId(0);
        let g = FunctionId(1);
        for _ in 0..3 {
            m.arrived(f);
        }
        m.arrived(g);
        m.started(f, 1_500);
        m.started(f, 2_500);
        m.rejected(
            f,
            &RejectReason::DeadlineUnreachable {
                predicted_finish: 9,
                deadline: 8,
            },
        );
        m.rejected(
            f,
            &RejectReason::DeadlineMissedInQueue {
                earliest_finish: 9,
                deadline: 8,
            },
        );
        m.rejected(f, &RejectReason::NoCapacity);
        m.rejected(f, &RejectReason::UnknownFunction);
        m.missed(f);
        m.swapped(f);
        let occ = Occupancy {
            in_flight: 2,
            waiting: 1,
            last_arrival: Some(1_000_000),
        };
        assert_eq!(
            report(&mut m, 3_500_000, 0, occ),
            FunctionLoad {
                tenant: TenantId("acme".into()),
                function: "f0".into(),
                arrivals: 3,
                in_flight: 2,
                waiting: 1,
                queue_wait_us: 4_000,
                deadline_misses: 2,
                early_rejects: 1,
                swaps: 1,
                idle_ms: 2_500,
            }
        );
        // Read resets the counts, not what is on the node now.
        let again = report(&mut m, 4_000_000, 0, occ);
        assert_eq!(
            (again.arrivals, again.queue_wait_us, again.deadline_misses),
            (0, 0, 0)
        );
        assert_eq!((again.early_rejects, again.swaps), (0, 0));
        assert_eq!(
            (again.in_flight, again.waiting, again.idle_ms),
            (2, 1, 3_000)
        );
        // The other function's count was kept.
        assert_eq!(report(&mut m, 0, 1, Occupancy::default()).arrivals, 1);
    }

    #[test]
    fn never_invoked_is_idle_forever_and_forget_drops_counts() {
        let mut m = LoadMeter::new();
        m.arrived(FunctionId(4));
        m.forget(FunctionId(4));
        let r = report(&mut m, 10, 4, Occupancy::default());
        assert_eq!(r.arrivals, 0);
        assert_eq!(r.idle_ms, u64::MAX);
        // A last arrival in the future (clock seam misuse) saturates to 0.
        let r = report(
            &mut m,
            10,
            4,
            Occupancy {
                last_arrival: Some(5_000),
                ..Occupancy::default()
            },
        );
        assert_eq!(r.idle_ms, 0);
    }

    #[test]
    fn counts_saturate() {
        let mut m = LoadMeter::new();
        m.started(FunctionId(0), Micros::MAX);
        m.started(FunctionId(0), 7);
        assert_eq!(
            report(&mut m, 0, 0, Occupancy::default()).queue_wait_us,
            u64::MAX
        );
    }
}
