//! What one simulated run measured.

use super::{ServingParams, ServingPolicy};
use crate::model::Micros;

const US_PER_HOUR: f64 = 3.6e9;

/// Counters and latencies of one run of one policy on one GPU count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    /// The policy.
    pub policy: ServingPolicy,
    /// Slices per GPU (`static` only).
    pub static_slices: Option<u32>,
    /// GPUs simulated.
    pub gpus: u32,
    /// Requests in the trace.
    pub requests: u64,
    /// Requests finished by their deadline.
    pub met: u64,
    /// Requests rejected (early, with a reason).
    pub rejected: u64,
    /// Simulated events processed (arrivals, finishes, load completions).
    pub events: u64,
    /// Median response time of finished requests, µs.
    pub p50_us: Micros,
    /// 99th percentile response time of finished requests, µs.
    pub p99_us: Micros,
    /// From the first arrival to the last event, µs.
    pub span_us: Micros,
    /// Σ service time × compute share of all runs, µs · milli-GPU.
    pub busy_us_milli: u128,
    /// Swap-ins from host memory (moves included).
    pub swaps: u64,
    /// Swap-outs to host memory.
    pub swap_outs: u64,
    /// Instances moved between GPUs.
    pub remaps: u64,
    /// Loads from storage.
    pub cold_starts: u64,
    /// Instances dropped without a host copy.
    pub unloads: u64,
    /// What tenants are billed, in units of the price list.
    pub billed_units: u64,
    /// Units of the price list per currency unit.
    pub units_per_currency: u64,
}

impl RunReport {
    /// A report of a run that has not started: every counter zero.
    pub fn empty(policy: ServingPolicy, gpus: u32, requests: u64, params: &ServingParams) -> Self {
        Self {
            policy,
            static_slices: None,
            gpus,
            requests,
            met: 0,
            rejected: 0,
            events: 0,
            p50_us: 0,
            p99_us: 0,
            span_us: 0,
            busy_us_milli: 0,
            swaps: 0,
            swap_outs: 0,
            remaps: 0,
            cold_starts: 0,
            unloads: 0,
            billed_units: 0,
            units_per_currency: params.pricing.units_per_currency,
        }
    }

    /// Set p50 and p99 from the response times of the finished requests
    /// (reorders them; nearest rank).
    pub fn set_percentiles(&mut self, latencies: &mut [Micros]) {
        if !latencies.is_empty() {
            self.p50_us = percentile(latencies, 0.50);
            self.p99_us = percentile(latencies, 0.99);
        }
    }

    /// Requests finished by their deadline ÷ all requests (0–1).
    pub fn attainment(&self) -> f64 {
        if self.requests == 0 {
            1.0
        } else {
            self.met as f64 / self.requests as f64
        }
    }

    /// Provisioned GPU-hours: GPUs × span.
    pub fn gpu_hours(&self) -> f64 {
        self.gpus as f64 * self.span_us as f64 / US_PER_HOUR
    }

    /// Busy compute ÷ provisioned compute (0–1).
    pub fn utilization(&self) -> f64 {
        let cap = self.gpus as f64 * 1000.0 * self.span_us as f64;
        if cap == 0.0 {
            0.0
        } else {
            (self.busy_us_milli as f64 / cap).min(1.0)
        }
    }

    /// What tenants are billed, in the price list's currency.
    pub fn cost(&self) -> f64 {
        self.billed_units as f64 / self.units_per_currency.max(1) as f64
    }
}

/// Nearest-rank percentile (reorders `xs`, not empty).
fn percentile(xs: &mut [Micros], q: f64) -> Micros {
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    *xs.select_nth_unstable(rank - 1).1
}
