//! Per-function load signals an agent reports, and their sum over agents.
//!
//! ```text
//!  agent A: [FunctionLoad ...] ─┐
//!  agent B: [FunctionLoad ...] ─┼─ sum_loads ─▶ (tenant, function) → RegionLoad::signal(at_ms)
//!  agent C: [FunctionLoad ...] ─┘
//! ```
//!
//! A report holds at most [`MAX_FUNCTION_LOADS`] entries; [`cap_loads`]
//! keeps the busiest ones (an idle function dropped from a report is seen
//! by the region as having no load on that agent, which is what it has).
//!
//! Counts in a report cover the interval since the agent's previous one;
//! the region samples only the latest report of each agent, so a count is
//! also summed as a rate over its report's interval (a region that samples
//! once a second loses nothing from agents that report every 200 ms).

#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::autoscale::Signal;
use crate::model::TenantId;

/// Most entries in one agent's load report. With function names of at
/// most 63 bytes and tenant names of at most 63 bytes an entry encodes in
/// under 200 bytes (bincode; the worst case, every count at its maximum,
/// is 196,638 bytes for the full 1,024), so a full report for
/// 1,000 functions on a node is under 200 KiB; above the cap the least
/// loaded entries are left out.
pub const MAX_FUNCTION_LOADS: usize = 1024;

/// One function's load on one agent since that agent's previous report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionLoad {
    /// The tenant.
    pub tenant: TenantId,
    /// The function's name.
    pub function: String,
    /// Requests that arrived since the previous report.
    pub arrivals: u64,
    /// Requests executing now.
    pub in_flight: u32,
    /// Requests waiting for a slice now.
    pub waiting: u32,
    /// Summed queue wait of the requests that started since the previous
    /// report, µs.
    pub queue_wait_us: u64,
    /// Requests that missed their deadline since the previous report.
    pub deadline_misses: u64,
    /// Requests rejected early (their deadline could not be met) since the
    /// previous report.
    pub early_rejects: u64,
    /// Swap-ins of this function's weights since the previous report.
    pub swaps: u64,
    /// Ms since the last request arrived (`u64::MAX`: none yet).
    pub idle_ms: u64,
}

impl FunctionLoad {
    /// Requests executing or waiting.
    pub fn concurrency(&self) -> u32 {
        self.in_flight.saturating_add(self.waiting)
    }
}

/// Keeps at most [`MAX_FUNCTION_LOADS`] entries: the highest concurrency
/// first, then the most arrivals; ties by (tenant, function) so the result
/// does not depend on the input's order. Returns how many were left out.
pub fn cap_loads(loads: &mut Vec<FunctionLoad>) -> usize {
    if loads.len() <= MAX_FUNCTION_LOADS {
        return 0;
    }
    loads.sort_by(|a, b| {
        b.concurrency()
            .cmp(&a.concurrency())
            .then(b.arrivals.cmp(&a.arrivals))
            .then_with(|| (&a.tenant, &a.function).cmp(&(&b.tenant, &b.function)))
    });
    let dropped = loads.len().saturating_sub(MAX_FUNCTION_LOADS);
    loads.truncate(MAX_FUNCTION_LOADS);
    dropped
}

/// One function's load summed over every agent reporting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RegionLoad {
    /// Requests that arrived since the agents' previous reports.
    pub arrivals: u64,
    /// Requests executing or waiting.
    pub concurrency: u32,
    /// Deadline misses since the previous reports.
    pub deadline_misses: u64,
    /// Early rejects since the previous reports.
    pub early_rejects: u64,
    /// Early rejects per second (thousandths), summed over the agents
    /// whose report interval is known: each agent's count over the
    /// interval since its previous report.
    #[serde(default)]
    pub early_rejects_per_s_milli: u64,
    /// Swap-ins since the previous reports.
    pub swaps: u64,
    /// The smallest idle time over the agents, ms (`u64::MAX`: none has
    /// seen a request).
    pub idle_ms: u64,
}

impl RegionLoad {
    /// The autoscaler's observation of this load at `at_ms`.
    pub fn signal(&self, at_ms: u64) -> Signal {
        Signal {
            at_ms,
            concurrency: self.concurrency,
            arrivals: self.arrivals,
            rejected_per_s_milli: self.early_rejects_per_s_milli,
        }
    }
}

/// Sums the agents' reports per (tenant, function); each report comes
/// with the interval it covers, ms (0: unknown, such as a link's first
/// report; its counts are summed but give no rate). Counts saturate
/// rather than wrap: they come from agents.
pub fn sum_loads<'a>(
    reports: impl IntoIterator<Item = (&'a [FunctionLoad], u64)>,
) -> BTreeMap<(TenantId, String), RegionLoad> {
    let mut out: BTreeMap<(TenantId, String), RegionLoad> = BTreeMap::new();
    for (report, interval_ms) in reports {
        for load in report {
            let sum = out
                .entry((load.tenant.clone(), load.function.clone()))
                .or_insert(RegionLoad {
                    idle_ms: u64::MAX,
                    ..RegionLoad::default()
                });
            sum.arrivals = sum.arrivals.saturating_add(load.arrivals);
            sum.concurrency = sum.concurrency.saturating_add(load.concurrency());
            sum.deadline_misses = sum.deadline_misses.saturating_add(load.deadline_misses);
            sum.early_rejects = sum.early_rejects.saturating_add(load.early_rejects);
            let per_s_milli = load
                .early_rejects
                .saturating_mul(1_000_000)
                .checked_div(interval_ms)
                .unwrap_or(0);
            sum.early_rejects_per_s_milli =
                sum.early_rejects_per_s_milli.saturating_add(per_s_milli);
            sum.swaps = sum.swaps.saturating_add(load.swaps);
            sum.idle_ms = sum.idle_ms.min(load.idle_ms);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(
        tenant: &str,
        function: &str,
        arrivals: u64,
        in_flight: u32,
        waiting: u32,
    ) -> FunctionLoad {
        FunctionLoad {
            tenant: TenantId(tenant.into()),
            function: function.into(),
            arrivals,
            in_flight,
            waiting,
            queue_wait_us: 0,
            deadline_misses: 1,
            early_rejects: 2,
            swaps: 3,
            idle_ms: 1000u64.saturating_sub(arrivals),
        }
    }

    #[test]
    fn sums_per_function_across_agents() {
        let a = vec![load("t", "f", 5, 2, 1), load("t", "g", 0, 0, 0)];
        let b = vec![load("t", "f", 7, 1, 3), load("u", "f", 1, 1, 0)];
        // a's report covers 200 ms, b's 1 s: 2 rejects each, 10/s + 2/s.
        let sums = sum_loads([(a.as_slice(), 200), (b.as_slice(), 1000)]);
        let f = sums[&(TenantId("t".into()), "f".into())];
        assert_eq!(
            f,
            RegionLoad {
                arrivals: 12,
                concurrency: 7,
                deadline_misses: 2,
                early_rejects: 4,
                early_rejects_per_s_milli: 12_000,
                swaps: 6,
                idle_ms: 993,
            }
        );
        assert_eq!(
            f.signal(42),
            Signal {
                at_ms: 42,
                concurrency: 7,
                arrivals: 12,
                rejected_per_s_milli: 12_000,
            }
        );
        assert_eq!(sums[&(TenantId("t".into()), "g".into())].idle_ms, 1000);
        assert_eq!(sums[&(TenantId("u".into()), "f".into())].concurrency, 1);
        assert_eq!(sums.len(), 3);
        // An unknown interval gives no rate; the counts still sum.
        let f = sum_loads([(a.as_slice(), 0)])[&(TenantId("t".into()), "f".into())];
        assert_eq!((f.early_rejects, f.early_rejects_per_s_milli), (2, 0));
    }

    #[test]
    fn sums_saturate() {
        let a = vec![load("t", "f", u64::MAX, u32::MAX, 1)];
        let b = vec![load("t", "f", 1, 1, 0)];
        let f =
            sum_loads([(a.as_slice(), 1), (b.as_slice(), 1)])[&(TenantId("t".into()), "f".into())];
        assert_eq!(f.arrivals, u64::MAX);
        assert_eq!(f.concurrency, u32::MAX);
    }

    #[test]
    fn cap_keeps_the_busiest() {
        let mut loads: Vec<FunctionLoad> = (0..MAX_FUNCTION_LOADS + 3)
            .map(|i| load("t", &format!("f{i:05}"), 0, 0, 0))
            .collect();
        loads.push(load("t", "hot", 0, 4, 0));
        loads.push(load("t", "warm", 9, 0, 0));
        let dropped = cap_loads(&mut loads);
        assert_eq!(dropped, 5);
        assert_eq!(loads.len(), MAX_FUNCTION_LOADS);
        assert_eq!(loads[0].function, "hot");
        assert_eq!(loads[1].function, "warm");
        assert_eq!(loads[2].function, "f00000");
        assert_eq!(
            loads[MAX_FUNCTION_LOADS - 1].function,
            format!("f{:05}", MAX_FUNCTION_LOADS - 3)
        );
    }

    #[test]
    fn cap_leaves_a_small_report_alone() {
        let mut loads = vec![load("t", "b", 0, 0, 0), load("t", "a", 0, 9, 0)];
        assert_eq!(cap_loads(&mut loads), 0);
        assert_eq!(loads[0].function, "b");
    }
}
