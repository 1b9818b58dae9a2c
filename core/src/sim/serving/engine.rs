//! The discrete-event loop: feeds a trace to one [`NodeExecutor`] and
//! carries out its commands in simulated time.
//!
//! ```text
//!   trace cursor (arrivals, sorted) ─┐
//!                                    ├─▶ earliest next ─▶ NodeExecutor::handle ─▶ commands
//!   binary heap (finishes, loads) ◀──┘                                              │
//!            ▲                                                                       │
//!            └──────────── Run ⇒ finish event, SwapIn/ColdStart/Move ⇒ load event ◀──┘
//! ```
//!
//! Before the first request, a warm-up of [`WARMUP_US`] lets the initial
//! placement prefetch functions onto free GPU memory (same rule for every
//! policy); its loads are counted like any other.
//!
//! The simulated GPUs form one executor domain (one node-level executor
//! spanning them), so requests may go to, and instances be remapped to,
//! any GPU. The heap and the latency buffer are sized once; the loop does
//! not allocate in steady state.

use super::{RunReport, ServingParams, ServingPolicy, ServingTrace};
use crate::config::Usage;
use crate::executor::{footprint, Command, Event, FunctionId, NodeConfig, NodeExecutor, RequestId};
use crate::model::Micros;
use crate::model::Tier;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One run's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunSpec {
    /// The policy.
    pub policy: ServingPolicy,
    /// Slices per GPU (`static` only).
    pub static_slices: u32,
    /// GPUs.
    pub gpus: u32,
    /// Deadline = arrival + slack × service time on a whole GPU.
    pub slack: f64,
}

/// Pending finishes and loads: (time, sequence, kind, a, b), earliest first;
/// the sequence number makes equal times deterministic (FIFO).
type EventHeap = BinaryHeap<Reverse<(Micros, u64, u8, u32, u64)>>;

const FINISH: u8 = 0;
const LOADED: u8 = 1;

/// Requests start this long after the simulated platform: the region's
/// initial placement prefetches functions (most requested first) onto free
/// GPU memory during it, for every policy alike, as a platform that has
/// been running before the trace window would have them.
pub const WARMUP_US: Micros = 3_600_000_000;

/// Deadline of a request under `slack`.
pub fn deadline(arrival_us: Micros, full_gpu_us: Micros, slack: f64) -> Micros {
    arrival_us + (full_gpu_us as f64 * slack).round() as Micros
}

/// Run `trace` under `spec` and measure it.
pub fn simulate(trace: &ServingTrace, params: &ServingParams, spec: RunSpec) -> RunReport {
    let Some(rules) = spec.policy.rules(spec.static_slices) else {
        return super::bound::edf_simulate(trace, params, spec);
    };
    let gpus = spec.gpus.max(1);
    let config = NodeConfig {
        gpus,
        gpu_memory_mib: params.gpu_memory_mib,
        host_memory_mib: params.host_memory_mib_per_gpu * gpus as u64,
        load: params.load,
        rules,
    };
    let mut ex = NodeExecutor::new(config);
    for (i, f) in trace.functions.iter().enumerate() {
        ex.handle(
            0,
            Event::InstanceAdded {
                function: FunctionId(i as u32),
                profile: f.profile,
            },
        );
    }
    ex.drain_commands().for_each(drop);
    let mut popularity: Vec<(u64, u32)> = vec![(0, 0); trace.functions.len()];
    for (i, p) in popularity.iter_mut().enumerate() {
        p.1 = i as u32;
    }
    for r in &trace.requests {
        popularity[r.function as usize].0 += 1;
    }
    popularity.sort_by_key(|&(count, f)| (std::cmp::Reverse(count), f));
    let mut billing = Billing::new(trace, &config, spec.policy);

    let n = trace.requests.len();
    let mut report = RunReport::empty(spec.policy, gpus, n as u64, params);
    report.static_slices = (spec.policy == ServingPolicy::Static).then_some(spec.static_slices);
    let mut latencies: Vec<Micros> = Vec::with_capacity(n);
    // (time, sequence, kind, a, b): finish (gpu, request) or loaded (gpu, function).
    let mut heap: EventHeap = BinaryHeap::with_capacity(4 * gpus as usize + 1024);
    let mut seq = 0u64;
    let mut cursor = 0usize;
    let mut now: Micros = 0;
    let mut pending: Vec<Event> = popularity
        .iter()
        .filter(|p| p.0 > 0)
        .map(|&(_, f)| Event::Prefetch {
            function: FunctionId(f),
        })
        .collect();
    pending.reverse();
    let t0 = WARMUP_US;
    loop {
        let next_arrival = match pending.last() {
            Some(_) => Some(0),
            None => trace.requests.get(cursor).map(|r| t0 + r.arrival_us),
        };
        let next_heap = heap.peek().map(|Reverse(e)| e.0);
        let event = match (next_arrival, next_heap) {
            (None, None) => break,
            // Finishes and loads at the same instant go before arrivals.
            (Some(a), Some(h)) if h <= a => heap_event(&mut heap),
            (None, Some(_)) => heap_event(&mut heap),
            (Some(_), _) if !pending.is_empty() => (0, pending.pop().expect("not empty")),
            (Some(_), _) => {
                let r = trace.requests[cursor];
                let id = cursor as u64;
                cursor += 1;
                (
                    t0 + r.arrival_us,
                    Event::RequestArrived {
                        request: RequestId(id),
                        function: FunctionId(r.function),
                        full_gpu_us: r.full_gpu_us,
                        deadline: t0 + deadline(r.arrival_us, r.full_gpu_us, spec.slack),
                    },
                )
            }
        };
        now = event.0;
        report.events += 1;
        ex.handle(now, event.1);
        for cmd in ex.drain_commands() {
            match cmd {
                Command::Run {
                    request,
                    function,
                    gpu,
                    compute_milli,
                    finish_at,
                } => {
                    let r = trace.requests[request.0 as usize];
                    if finish_at <= t0 + deadline(r.arrival_us, r.full_gpu_us, spec.slack) {
                        report.met += 1;
                    }
                    latencies.push(finish_at - (t0 + r.arrival_us));
                    let service = finish_at - now;
                    let work = service as u128 * compute_milli as u128;
                    report.busy_us_milli += work;
                    billing.add(function.0, service, compute_milli);
                    seq += 1;
                    heap.push(Reverse((finish_at, seq, FINISH, gpu, request.0)));
                }
                Command::SwapIn {
                    function,
                    gpu,
                    ready_at,
                } => {
                    report.swaps += 1;
                    seq += 1;
                    heap.push(Reverse((ready_at, seq, LOADED, gpu, function.0 as u64)));
                }
                Command::ColdStart {
                    function,
                    gpu,
                    ready_at,
                } => {
                    report.cold_starts += 1;
                    seq += 1;
                    heap.push(Reverse((ready_at, seq, LOADED, gpu, function.0 as u64)));
                }
                Command::Move {
                    function,
                    to,
                    ready_at,
                    ..
                } => {
                    report.swaps += 1;
                    report.remaps += 1;
                    seq += 1;
                    heap.push(Reverse((ready_at, seq, LOADED, to, function.0 as u64)));
                }
                Command::SwapOut { .. } => report.swap_outs += 1,
                Command::Unload { .. } => report.unloads += 1,
                Command::Reject { .. } => report.rejected += 1,
                // No region here: the simulator never pins a function, so
                // its executor never asks for (or releases) a reservation.
                Command::Reserve { .. } | Command::Release { .. } => {}
            }
        }
    }
    report.span_us = now.saturating_sub(t0);
    report.billed_units = billing.bill(params);
    report.set_percentiles(&mut latencies);
    report
}

/// What tenants are billed for the runs of a simulation: Σ compute × µs
/// and Σ MiB × µs per billed tier, each tier's line charged once.
pub(super) struct Billing {
    /// Per function: the tier it is billed at (index into [`Tier::ALL`])
    /// and the GPU memory its instance holds.
    functions: Vec<(usize, u128)>,
    compute_us: [u128; 4],
    memory_us: [u128; 4],
}

impl Billing {
    pub(super) fn new(trace: &ServingTrace, config: &NodeConfig, policy: ServingPolicy) -> Self {
        let functions = trace
            .functions
            .iter()
            .map(|f| {
                let tier = policy.billed_tier(f.profile.tier);
                let tier = Tier::ALL.iter().position(|t| *t == tier).unwrap_or(0);
                let mem = footprint(config, &f.profile).map_or(f.profile.memory_mib, |fp| fp.0);
                (tier, mem as u128)
            })
            .collect();
        Self {
            functions,
            compute_us: [0; 4],
            memory_us: [0; 4],
        }
    }

    /// A run of `function` for `service_us` on `compute_milli`.
    pub(super) fn add(&mut self, function: u32, service_us: Micros, compute_milli: u32) {
        let (tier, mem) = self.functions[function as usize];
        self.compute_us[tier] += service_us as u128 * compute_milli as u128;
        self.memory_us[tier] += service_us as u128 * mem;
    }

    /// The bill, in units of the price list.
    pub(super) fn bill(&self, params: &ServingParams) -> u64 {
        let mut usage = [Usage::default(); 4];
        for (i, u) in usage.iter_mut().enumerate() {
            u.compute_milli_gpu_ms = u64::try_from(self.compute_us[i] / 1000).unwrap_or(u64::MAX);
            u.memory_mib_ms = u64::try_from(self.memory_us[i] / 1000).unwrap_or(u64::MAX);
        }
        params.bill(&usage)
    }
}

fn heap_event(heap: &mut EventHeap) -> (Micros, Event) {
    let Reverse((t, _, kind, a, b)) = heap.pop().expect("peeked");
    let event = if kind == FINISH {
        Event::RequestFinished {
            request: RequestId(b),
            gpu: a,
        }
    } else {
        Event::LoadFinished {
            function: FunctionId(b as u32),
            gpu: a,
        }
    };
    (t, event)
}
