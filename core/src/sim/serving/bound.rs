//! How few GPUs any policy could need: a proven lower bound, and the
//! central-queue EDF estimate beside it.
//!
//! ```text
//!   mandatory-part bound (proven, S < 2)       central-queue EDF (estimate)
//!   every met job runs during                  one queue for all GPUs, every
//!   [deadline − e, arrival + e): at most       model resident, no load cost;
//!   one per GPU at a time; drop at most the    a job starts on any GPU with
//!   miss budget (greedy, optimal) ─▶ GPUs      its share free, dropped once hopeless
//! ```
//!
//! **The mandatory-part bound.** A request of service time `e` on a whole
//! GPU and saturation share `σ` that meets its deadline `d` (arrival `a`)
//! runs at some fixed share `c` for `e · max(1, σ / c) ≥ e`, starting no
//! earlier than `a` and no later than `d − e · max(1, σ/c)`, so it is
//! running throughout `[d − e, a + e)`, non-empty when `d − a < 2e` (slack
//! below 2). It needs `c ≥ σ · e / (d − a)`; when that is above half a GPU,
//! no two such requests share a GPU at any moment. So at every instant the
//! met "heavy" requests whose mandatory part covers it are at most the GPU
//! count. Meeting ≥ the target attainment allows a miss budget of `k`
//! requests; the fewest requests to drop so that no instant is covered more
//! than `m` times is found exactly by the greedy sweep that, whenever `m`
//! is exceeded, drops the covering interval that ends last (the maximum
//! `m`-colourable subgraph of an interval graph; Yannakakis and Gavril,
//! 1987; Carlisle and Lloyd, 1995). The smallest `m` whose drops fit the
//! budget is a lower bound for every policy of the simulator, and for any
//! non-preemptive schedule on the latency model. At slack ≥ 2 there is no
//! mandatory part and the bound is the trivial 1 GPU. A batching function's
//! request may join a batch on a small share (running longer than `e`), so
//! only that share counts for it (the LLM workload: never heavy).
//!
//! **The EDF estimate is not a bound.** Maximising the number of requests
//! that meet their deadlines is NP-hard even on one machine
//! (1|r_j|ΣU_j), and a work-conserving EDF can lose to a policy that is
//! slowed down: a 10 s request (deadline 20 s) that arrives at 0 takes the
//! only GPU, so a 1 s request arriving at 1 s with deadline 2 s misses; a
//! policy whose 10 s request first waits 1.8 s for a swap-in serves both.
//! It is reported as an estimate (`edf_min_gpus`), never called a limit.

use super::engine::{deadline, Billing};
use super::{RunReport, RunSpec, ServingParams, ServingTrace};
use crate::executor::{ExecutorRules, NodeConfig};
use crate::model::{Micros, MilliGpu, WHOLE_GPU};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

/// Which argument gives [`mandatory_min_gpus`] its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundKind {
    /// Overlapping mandatory parts of requests that cannot share a GPU.
    MandatoryPart,
    /// No such overlap (e.g. slack ≥ 2): one GPU.
    Trivial,
}

impl BoundKind {
    /// The name used in the JSON (`bound_kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            BoundKind::MandatoryPart => "mandatory-part",
            BoundKind::Trivial => "trivial",
        }
    }
}

/// The largest number of missed requests out of `n` that still reaches `target`.
pub fn miss_budget(n: u64, target: f64) -> u64 {
    let ok = |k: u64| n == 0 || (n - k) as f64 / n as f64 >= target;
    // Binary search the largest k with ok(k); ok is monotone decreasing.
    let (mut lo, mut hi) = (0u64, n);
    if !ok(0) {
        return 0;
    }
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if ok(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Mandatory parts `[d − e, a + e)` of the requests no two of which can
/// share a GPU, sorted by start.
fn mandatory_parts(trace: &ServingTrace, slack: f64) -> Vec<(Micros, Micros)> {
    let mut parts: Vec<(Micros, Micros)> = trace
        .requests
        .iter()
        .filter_map(|r| {
            let e = r.full_gpu_us;
            let window = deadline(r.arrival_us, e, slack) - r.arrival_us;
            let profile = trace.functions[r.function as usize].profile;
            // A batch member may run on the batch's small share (for longer
            // than e): only that share is certain.
            let sigma = profile
                .batched(e, profile.saturation_milli.clamp(1, WHOLE_GPU), 1)
                .1 as u128;
            // Share needed: σ·e/window > 500 milli ⇔ 2·σ·e > 1000·window.
            let heavy = 2 * sigma * e as u128 > WHOLE_GPU as u128 * window as u128;
            let start = r.arrival_us + window - e.min(window);
            let end = r.arrival_us + e;
            (heavy && e > 0 && start < end).then_some((start, end))
        })
        .collect();
    parts.sort_unstable();
    parts
}

/// Fewest intervals of `parts` (sorted by start) to drop so that no
/// instant is covered by more than `m`: the greedy that drops the covering
/// interval ending last is optimal for interval graphs.
fn fewest_drops(parts: &[(Micros, Micros)], m: usize) -> u64 {
    let mut active: BTreeSet<(Micros, usize)> = BTreeSet::new();
    let mut drops = 0;
    for (i, &(start, end)) in parts.iter().enumerate() {
        while active.first().is_some_and(|&(e, _)| e <= start) {
            active.pop_first();
        }
        active.insert((end, i));
        if active.len() > m {
            active.pop_last();
            drops += 1;
        }
    }
    drops
}

/// The proven lower bound on the GPUs any policy needs to reach `target`
/// attainment on `trace` at `slack` (see the module docs), and which
/// argument gives it.
pub fn mandatory_min_gpus(trace: &ServingTrace, slack: f64, target: f64) -> (u32, BoundKind) {
    let parts = mandatory_parts(trace, slack);
    let budget = miss_budget(trace.requests.len() as u64, target);
    if fewest_drops(&parts, 1) <= budget {
        return (1, BoundKind::Trivial);
    }
    // drops(m) is non-increasing in m and 0 at m = parts.len().
    let (mut lo, mut hi) = (1usize, parts.len());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fewest_drops(&parts, mid) <= budget {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    (
        u32::try_from(hi).unwrap_or(u32::MAX),
        BoundKind::MandatoryPart,
    )
}

/// A queued request of the EDF estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Job {
    deadline: Micros,
    request: u32,
}

/// The central-queue EDF estimate on `spec.gpus` GPUs: one queue, earliest
/// deadline first, every model resident everywhere at no cost, each request
/// on its saturation share for its whole-GPU service time, started on the
/// GPU with the least free compute that fits it, dropped once it can no
/// longer meet its deadline. Billed at the `exclusive` tier.
pub fn edf_simulate(trace: &ServingTrace, params: &ServingParams, spec: RunSpec) -> RunReport {
    let gpus = spec.gpus.max(1);
    let config = NodeConfig {
        gpus,
        gpu_memory_mib: params.gpu_memory_mib,
        host_memory_mib: 0,
        load: params.load,
        rules: ExecutorRules::gshare(),
    };
    let mut billing = Billing::new(trace, &config, spec.policy);
    let n = trace.requests.len();
    let mut report = RunReport::empty(spec.policy, gpus, n as u64, params);
    let share = |f: u32| -> MilliGpu {
        trace.functions[f as usize]
            .profile
            .saturation_milli
            .clamp(1, WHOLE_GPU)
    };
    let deadlines: Vec<Micros> = trace
        .requests
        .iter()
        .map(|r| deadline(r.arrival_us, r.full_gpu_us, spec.slack))
        .collect();
    // (free compute, gpu) of every GPU.
    let mut free: BTreeSet<(MilliGpu, u32)> = (0..gpus).map(|g| (WHOLE_GPU, g)).collect();
    let mut free_of: Vec<MilliGpu> = vec![WHOLE_GPU; gpus as usize];
    let mut queue: BinaryHeap<Reverse<Job>> = BinaryHeap::new();
    // (finish, gpu, request).
    let mut running: BinaryHeap<Reverse<(Micros, u32, u32)>> = BinaryHeap::new();
    let mut latencies: Vec<Micros> = Vec::with_capacity(n);
    let mut cursor = 0usize;
    let mut now: Micros = 0;
    loop {
        let next_arrival = trace.requests.get(cursor).map(|r| r.arrival_us);
        let next_finish = running.peek().map(|Reverse(r)| r.0);
        match (next_arrival, next_finish) {
            (None, None) => break,
            (Some(a), Some(f)) if f <= a => now = f,
            (None, Some(f)) => now = f,
            (Some(a), _) => now = a,
        }
        report.events += 1;
        if next_finish == Some(now) {
            let Reverse((_, g, r)) = running.pop().expect("peeked");
            let c = share(trace.requests[r as usize].function);
            let f = &mut free_of[g as usize];
            free.remove(&(*f, g));
            *f += c;
            free.insert((*f, g));
        } else {
            queue.push(Reverse(Job {
                deadline: deadlines[cursor],
                request: cursor as u32,
            }));
            cursor += 1;
        }
        while let Some(&Reverse(job)) = queue.peek() {
            let r = trace.requests[job.request as usize];
            if now + r.full_gpu_us > job.deadline {
                queue.pop();
                report.rejected += 1;
                continue;
            }
            let c = share(r.function);
            let Some(&(f, g)) = free.range((c, 0)..).next() else {
                break;
            };
            queue.pop();
            free.remove(&(f, g));
            free.insert((f - c, g));
            free_of[g as usize] = f - c;
            let finish = now + r.full_gpu_us;
            running.push(Reverse((finish, g, job.request)));
            report.met += 1;
            latencies.push(finish - r.arrival_us);
            report.busy_us_milli += r.full_gpu_us as u128 * c as u128;
            billing.add(r.function, r.full_gpu_us, c);
        }
    }
    report.span_us = now;
    report.billed_units = billing.bill(params);
    report.set_percentiles(&mut latencies);
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::FunctionProfile;
    use crate::model::Tier;
    use crate::sim::serving::{ServingPolicy, TraceFunction, TraceRequest};

    const S: Micros = 1_000_000;

    fn trace(sigma: MilliGpu, requests: &[(Micros, Micros)]) -> ServingTrace {
        ServingTrace {
            name: "t".into(),
            functions: vec![TraceFunction {
                name: "f".into(),
                profile: FunctionProfile {
                    tier: Tier::Oversubscribed,
                    memory_mib: 1_000,
                    saturation_milli: sigma,
                    batch_ppm: 0,
                },
            }],
            requests: requests
                .iter()
                .map(|&(a, e)| TraceRequest {
                    arrival_us: a,
                    function: 0,
                    full_gpu_us: e,
                })
                .collect(),
        }
    }

    #[test]
    fn the_miss_budget_is_the_most_misses_that_still_reach_the_target() {
        assert_eq!(miss_budget(100, 0.99), 1);
        assert_eq!(miss_budget(14_279, 0.99), 142);
        assert_eq!(miss_budget(99, 0.99), 0);
        assert_eq!(miss_budget(0, 0.99), 0);
        assert_eq!(miss_budget(10, 0.0), 10);
    }

    #[test]
    fn greedy_drops_the_fewest_intervals() {
        // Three intervals cover [2, 3); dropping the one ending last (0..10)
        // leaves [1,3) and [2,4) and frees the later ones.
        let parts = [(0, 10), (1, 3), (2, 4), (5, 7), (6, 8)];
        assert_eq!(fewest_drops(&parts, 2), 1);
        assert_eq!(fewest_drops(&parts, 1), 3);
        assert_eq!(fewest_drops(&parts, 3), 0);
    }

    #[test]
    fn simultaneous_whole_gpu_requests_below_slack_two_need_one_gpu_each() {
        // 100 requests of 10 s at once, slack 1.5: each runs during [5 s, 10 s).
        let t = trace(1000, &[(0, 10 * S); 100]);
        // One may miss: 99 GPUs.
        assert_eq!(
            mandatory_min_gpus(&t, 1.5, 0.99),
            (99, BoundKind::MandatoryPart)
        );
        assert_eq!(mandatory_min_gpus(&t, 2.0, 0.99), (1, BoundKind::Trivial));
        // Half-GPU models can share a GPU: no bound from them.
        let t = trace(500, &[(0, 10 * S); 100]);
        assert_eq!(mandatory_min_gpus(&t, 1.5, 0.99), (1, BoundKind::Trivial));
    }

    #[test]
    fn edf_runs_earliest_deadline_first_on_any_gpu_and_drops_the_hopeless() {
        // One GPU: a 10 s request, then two 1 s ones arriving at 1 s; the
        // one due at 11.5 s runs at 10 s, the one due at 3 s is dropped.
        let t = trace(1000, &[(0, 10 * S), (S, S), (S, 9 * S + S / 2)]);
        let spec = RunSpec {
            policy: ServingPolicy::Bound,
            static_slices: 1,
            gpus: 1,
            slack: 2.0,
        };
        let r = edf_simulate(&t, &params(), spec);
        // Deadlines: 20 s, 3 s, 1 s + 2 × 9.5 s = 20 s.
        assert_eq!((r.met, r.rejected), (2, 1));
        let r = edf_simulate(&t, &params(), RunSpec { gpus: 2, ..spec });
        assert_eq!((r.met, r.rejected), (3, 0));
    }

    fn params() -> ServingParams {
        ServingParams::from_toml(
            "topology.toml",
            include_str!("../../../../configs/examples/topology.toml"),
        )
        .unwrap()
    }
}
