//! The agent's one Prometheus registry and what `/metrics` shows.
//!
//! ```text
//!   NodeAgent ── observe(latency | queue wait | cold start | swap-in) ──▶ AgentMetrics
//!                                                                         (registry: histograms,
//!   ingress GET /metrics ── MetricsQuery ──▶ (NodeStatus, AgentMetrics)    gshare_build_info)
//!        └─ sample(NodeStatus) + registry ──▶ exposition (tenant families only with the metrics token)
//! ```
//!
//! The histograms are labelled by tenant, function and tier, with the
//! (tenant, function) pairs bounded by [`FunctionLabels`] (past
//! [`FunctionLabels::MAX_FUNCTIONS`] pairs a function counts under
//! `function="_other"`). Families with a `tenant` label are shown only to a
//! request with the agent's metrics token (`metrics_token_file`); without
//! one configured they are never shown.

use crate::agent::NodeStatus;
use crate::token::token_digest;
use gshare_core::metrics::prometheus::{HistogramOpts, HistogramVec, Registry};
use gshare_core::metrics::{
    bytes_from_mib, ratio_from_milli, FunctionLabels, Sampler, Series, LATENCY_BUCKETS_SECONDS,
    LOAD_BUCKETS_SECONDS, TENANT_LABEL,
};
use gshare_core::model::Tier;
use std::sync::Mutex;

/// What a histogram of [`AgentMetrics`] measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measured {
    /// A served invocation, from arrival at the agent to its result.
    Latency,
    /// A served invocation's wait before it ran.
    QueueWait,
    /// Loading weights from storage onto a GPU, from the command to the
    /// backend's report that they are loaded.
    ColdStart,
    /// Loading swapped-out weights from host memory (or another GPU) onto a GPU.
    SwapIn,
}

const LABELS: &[&str] = &[TENANT_LABEL, "function", "tier"];

/// The agent's registry, its histograms and the metrics token's digest.
#[derive(Debug)]
pub struct AgentMetrics {
    registry: Registry,
    latency: HistogramVec,
    queue_wait: HistogramVec,
    cold_start: HistogramVec,
    swap_in: HistogramVec,
    labels: Mutex<FunctionLabels>,
    token_digest: Option<String>,
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        LABELS,
    )
    .expect("valid histogram")
}

impl AgentMetrics {
    /// A registry with the histograms and `gshare_build_info`; tenant
    /// series are shown to a request bearing `metrics_token` (none: never).
    pub fn new(metrics_token: Option<&str>) -> Self {
        let registry = Registry::new();
        let latency = histogram(
            "gshare_edge_invocation_duration_seconds",
            "Served invocations, from arrival at the agent to the result, seconds",
            LATENCY_BUCKETS_SECONDS,
        );
        let queue_wait = histogram(
            "gshare_edge_invocation_queue_wait_seconds",
            "Served invocations' wait in the executor's queue before they ran, seconds",
            LATENCY_BUCKETS_SECONDS,
        );
        let cold_start = histogram(
            "gshare_edge_cold_start_duration_seconds",
            "Cold starts (weights from storage onto a GPU) until the GPU reported them loaded, seconds",
            LOAD_BUCKETS_SECONDS,
        );
        let swap_in = histogram(
            "gshare_edge_swap_in_duration_seconds",
            "Swap-ins and moves (weights from host memory or another GPU) until loaded, seconds",
            LOAD_BUCKETS_SECONDS,
        );
        for h in [&latency, &queue_wait, &cold_start, &swap_in] {
            registry
                .register(Box::new(h.clone()))
                .expect("one registration");
        }
        gshare_core::metrics::register_build_info(&registry, "edge").expect("one registration");
        AgentMetrics {
            registry,
            latency,
            queue_wait,
            cold_start,
            swap_in,
            labels: Mutex::new(FunctionLabels::new()),
            token_digest: metrics_token.map(token_digest),
        }
    }

    /// The registry (register further series here, once).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Records `seconds` of `what` for `tenant`'s `function` of `tier`.
    pub fn observe(&self, what: Measured, tenant: &str, function: &str, tier: Tier, seconds: f64) {
        let (t, f) = {
            let mut labels = self.labels.lock().unwrap_or_else(|p| p.into_inner());
            let (t, f) = labels.label(tenant, function);
            (t.to_string(), f.to_string())
        };
        let h = match what {
            Measured::Latency => &self.latency,
            Measured::QueueWait => &self.queue_wait,
            Measured::ColdStart => &self.cold_start,
            Measured::SwapIn => &self.swap_in,
        };
        h.with_label_values(&[t.as_str(), f.as_str(), tier.as_str()])
            .observe(seconds);
    }

    /// Whether a request with `authorization` (the header's value, if
    /// any) sees the tenant series: `Ok(false)` without one, `Ok(true)`
    /// with the metrics token, `Err` with anything else.
    pub fn sees_tenant_series(&self, authorization: Option<&str>) -> Result<bool, &'static str> {
        let Some(header) = authorization else {
            return Ok(false);
        };
        let refused = "/metrics takes the agent's metrics token (or none: public series only)";
        let token = gshare_core::http_surface::bearer_token(header).map_err(|_| refused)?;
        match &self.token_digest {
            Some(d) if *d == token_digest(token) => Ok(true),
            _ => Err(refused),
        }
    }

    /// The Prometheus text of the registry and `status`.
    pub fn exposition(
        &self,
        status: &NodeStatus,
        with_tenants: bool,
    ) -> Result<String, gshare_core::metrics::prometheus::Error> {
        let mut s = Sampler::new();
        sample(status, &mut s);
        gshare_core::metrics::exposition(&self.registry, s.into_families(), with_tenants)
    }
}

impl Default for AgentMetrics {
    fn default() -> Self {
        AgentMetrics::new(None)
    }
}

/// The node's figures, unlabelled, in [`sample`]'s order.
pub const NODE_SERIES: [Series; 21] = [
    Series::gauge(
        "gshare_edge_in_flight",
        "Invocations accepted and not answered yet",
        &[],
    ),
    Series::gauge("gshare_edge_functions", "Functions hosted", &[]),
    Series::counter(
        "gshare_edge_invocations_served_total",
        "Invocations answered with a result",
        &[],
    ),
    Series::counter(
        "gshare_edge_invocations_failed_total",
        "Invocations answered with an explicit error",
        &[],
    ),
    Series::counter(
        "gshare_edge_invocations_replayed_total",
        "Invocations answered with the stored answer of their idempotency key",
        &[],
    ),
    Series::counter(
        "gshare_edge_invocations_abandoned_total",
        "Invocations dropped before they ran because their caller went away (never run, never billed)",
        &[],
    ),
    Series::counter(
        "gshare_edge_swap_ins_total",
        "Swap-ins from host memory",
        &[],
    ),
    Series::counter(
        "gshare_edge_swap_outs_total",
        "Swap-outs to host memory",
        &[],
    ),
    Series::counter("gshare_edge_cold_starts_total", "Cold starts", &[]),
    Series::counter(
        "gshare_edge_moves_total",
        "Moves between the node's GPUs (remaps)",
        &[],
    ),
    Series::counter(
        "gshare_edge_accounting_errors_total",
        "Loads the GPU backend's accounting refused (must stay 0)",
        &[],
    ),
    Series::counter(
        "gshare_edge_process_starts_total",
        "Function processes started (placements, swap-ins, moves; not restarts)",
        &[],
    ),
    Series::counter(
        "gshare_edge_process_crashes_total",
        "Function processes that exited without being asked to",
        &[],
    ),
    Series::counter(
        "gshare_edge_process_restarts_total",
        "Restarts after a crash that became healthy",
        &[],
    ),
    Series::counter(
        "gshare_edge_process_failed_starts_total",
        "Restart attempts that failed",
        &[],
    ),
    Series::gauge(
        "gshare_edge_process_running",
        "Function processes started and not stopped",
        &[],
    ),
    Series::counter(
        "gshare_edge_usage_journal_writes_total",
        "Usage journal appends that succeeded",
        &[],
    ),
    Series::counter(
        "gshare_edge_usage_records_journaled_total",
        "Usage records journaled",
        &[],
    ),
    Series::counter(
        "gshare_edge_usage_journal_failures_total",
        "Usage journal appends that failed",
        &[],
    ),
    Series::counter(
        "gshare_edge_usage_results_withheld_total",
        "Results withheld (usage_not_recorded) because their usage could not be journaled",
        &[],
    ),
    Series::gauge(
        "gshare_edge_usage_results_waiting",
        "Results waiting for their usage to be journaled",
        &[],
    ),
];

/// The node's microVMs (shown only with a `microvm` runtime), in
/// [`sample`]'s order.
pub const MICROVM_SERIES: [Series; 4] = [
    Series::gauge(
        "gshare_edge_microvm_accel",
        "How the node's microVMs are accelerated: 1 for the accel in use (kvm, or tcg where KVM is not real, e.g. PVM)",
        &["accel"],
    ),
    Series::counter(
        "gshare_edge_microvm_boots_total",
        "MicroVM boots measured (QEMU start to the first healthy answer)",
        &[],
    ),
    Series::gauge(
        "gshare_edge_microvm_boot_last_seconds",
        "The last microVM boot-to-ready, seconds",
        &[],
    ),
    Series::gauge(
        "gshare_edge_microvm_boot_median_seconds",
        "Median of the recent microVM boots: what the executor times a microVM load by, seconds",
        &[],
    ),
];

/// Per running microVM (labelled by tenant: shown with the metrics token
/// only), in [`sample`]'s order.
pub const MICROVM_VM_SERIES: [Series; 2] = [
    Series::gauge(
        "gshare_edge_microvm_vm_boot_seconds",
        "A running microVM's boot-to-ready as measured at its start (QEMU spawned to the first healthy answer), seconds",
        &[TENANT_LABEL, "function", "pid"],
    ),
    Series::gauge(
        "gshare_edge_microvm_vm_rss_bytes",
        "A running microVM's resident memory (its QEMU process), bytes",
        &[TENANT_LABEL, "function", "pid"],
    ),
];

/// Per GPU of the node, in [`sample`]'s order.
pub const GPU_SERIES: [Series; 3] = [
    Series::gauge(
        "gshare_edge_gpu_utilization_ratio",
        "Compute in use on a GPU, ratio of the GPU (may exceed 1 while overcommitted)",
        &["gpu"],
    ),
    Series::gauge(
        "gshare_edge_gpu_memory_used_bytes",
        "GPU memory held by resident instances, bytes",
        &["gpu"],
    ),
    Series::gauge(
        "gshare_edge_gpu_queued",
        "Requests queued on a GPU",
        &["gpu"],
    ),
];

/// Samples the node's figures of `s`.
pub fn sample(s: &NodeStatus, out: &mut Sampler) {
    let figures = [
        u64::from(s.in_flight),
        u64::from(s.functions),
        s.served,
        s.failed,
        s.replayed,
        s.abandoned,
        s.swap_ins,
        s.swap_outs,
        s.cold_starts,
        s.moves,
        s.accounting_errors,
        s.process_starts,
        s.process_crashes,
        s.process_restarts,
        s.process_failed_starts,
        s.process_running,
        s.usage_writes,
        s.usage_records,
        s.usage_write_failures,
        s.usage_withheld,
        s.usage_waiting,
    ];
    for (series, v) in NODE_SERIES.iter().zip(figures) {
        out.add(series, &[], v as f64);
    }
    if let Some(accel) = s.vm_accel {
        out.add(&MICROVM_SERIES[0], &[accel], 1.0);
        out.add(&MICROVM_SERIES[1], &[], s.vm_boots as f64);
        let secs = gshare_core::metrics::seconds_from_us;
        out.add(&MICROVM_SERIES[2], &[], secs(s.vm_boot_last_us));
        out.add(&MICROVM_SERIES[3], &[], secs(s.vm_boot_median_us));
        for v in &s.vms {
            let pid = v.pid.to_string();
            let labels = [v.tenant.as_str(), v.function.as_str(), pid.as_str()];
            out.add(&MICROVM_VM_SERIES[0], &labels, secs(v.boot_us));
            out.add(
                &MICROVM_VM_SERIES[1],
                &labels,
                v.rss_kib.saturating_mul(1024) as f64,
            );
        }
    }
    for g in &s.gpus {
        let gpu = g.index.to_string();
        let labels = [gpu.as_str()];
        out.add(
            &GPU_SERIES[0],
            &labels,
            ratio_from_milli(u64::from(g.utilization_milli)),
        );
        out.add(&GPU_SERIES[1], &labels, bytes_from_mib(g.memory_used_mib));
        out.add(&GPU_SERIES[2], &labels, f64::from(g.queued));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gshare_core::metrics::{check_exposition, FunctionLabels};
    use std::time::Instant;

    #[test]
    fn the_agent_series_keep_the_conventions_and_hide_tenants_without_the_token() {
        let m = AgentMetrics::new(Some("scrape-me"));
        m.observe(Measured::Latency, "acme", "hello", Tier::Guaranteed, 0.004);
        m.observe(Measured::ColdStart, "acme", "hello", Tier::Guaranteed, 0.2);
        let status = NodeStatus {
            served: 3,
            gpus: vec![gshare_core::protocol::GpuStatus {
                index: 0,
                utilization_milli: 250,
                memory_used_mib: 1,
                resident: vec![],
                queued: 0,
                measured_utilization_pct: None,
                measured_memory_used_mib: None,
            }],
            ..NodeStatus::default()
        };
        let full = m.exposition(&status, true).unwrap();
        assert_eq!(check_exposition(&full), Vec::<String>::new(), "{full}");
        assert!(!full.contains("gshare_edge_microvm_"), "{full}");
        let with_vms = NodeStatus {
            vm_accel: Some("tcg"),
            vm_boots: 2,
            vm_boot_last_us: 2_500_000,
            vm_boot_median_us: 2_000_000,
            vms: vec![crate::runtime::VmFigures {
                tenant: "acme".into(),
                function: "hello".into(),
                pid: 4242,
                boot_us: 6_250_000,
                rss_kib: 300 * 1024,
            }],
            ..status.clone()
        };
        let text = m.exposition(&with_vms, false).unwrap();
        assert_eq!(check_exposition(&text), Vec::<String>::new(), "{text}");
        assert!(!text.contains("gshare_edge_microvm_vm_"), "{text}");
        let full_vms = m.exposition(&with_vms, true).unwrap();
        assert_eq!(
            check_exposition(&full_vms),
            Vec::<String>::new(),
            "{full_vms}"
        );
        for want in [
            "gshare_edge_microvm_vm_boot_seconds{tenant=\"acme\",function=\"hello\",pid=\"4242\"} 6.25\n",
            "gshare_edge_microvm_vm_rss_bytes{tenant=\"acme\",function=\"hello\",pid=\"4242\"} 314572800\n",
        ] {
            assert!(full_vms.contains(want), "{want} missing in {full_vms}");
        }
        for want in [
            "gshare_edge_microvm_accel{accel=\"tcg\"} 1\n",
            "gshare_edge_microvm_boots_total 2\n",
            "gshare_edge_microvm_boot_last_seconds 2.5\n",
            "gshare_edge_microvm_boot_median_seconds 2\n",
        ] {
            assert!(text.contains(want), "{want} missing in {text}");
        }
        for want in [
            "gshare_edge_invocations_served_total 3\n",
            "gshare_edge_gpu_utilization_ratio{gpu=\"0\"} 0.25\n",
            "gshare_edge_gpu_memory_used_bytes{gpu=\"0\"} 1048576\n",
            "gshare_edge_invocation_duration_seconds_bucket{function=\"hello\",tenant=\"acme\",tier=\"guaranteed\",le=\"0.005\"} 1\n",
            "gshare_edge_cold_start_duration_seconds_count{function=\"hello\",tenant=\"acme\",tier=\"guaranteed\"} 1\n",
            "gshare_build_info{component=\"edge\",version=\"",
        ] {
            assert!(full.contains(want), "{want} missing in {full}");
        }
        let public = m.exposition(&status, false).unwrap();
        assert!(
            !public.contains("acme") && !public.contains("hello"),
            "{public}"
        );
        assert!(public.contains("gshare_edge_invocations_served_total 3\n"));
        assert_eq!(m.sees_tenant_series(None), Ok(false));
        assert_eq!(m.sees_tenant_series(Some("Bearer scrape-me")), Ok(true));
        assert!(m.sees_tenant_series(Some("Bearer other")).is_err());
        assert!(AgentMetrics::new(None)
            .sees_tenant_series(Some("Bearer scrape-me"))
            .is_err());
    }

    /// 1,000 functions observed: the label bound holds and a scrape stays
    /// small (the figures are printed; no timing is asserted).
    #[test]
    fn a_scrape_with_a_thousand_functions_stays_bounded() {
        let m = AgentMetrics::new(Some("t"));
        for i in 0..1000 {
            let tenant = format!("tenant-{}", i % 10);
            let function = format!("fn-{i}");
            for what in [
                Measured::Latency,
                Measured::QueueWait,
                Measured::ColdStart,
                Measured::SwapIn,
            ] {
                m.observe(what, &tenant, &function, Tier::Burstable, 0.01);
            }
        }
        let status = NodeStatus::default();
        let start = Instant::now();
        let text = m.exposition(&status, true).unwrap();
        let took = start.elapsed();
        let series = text.lines().filter(|l| !l.starts_with('#')).count();
        let labelled = FunctionLabels::MAX_FUNCTIONS + 10;
        println!(
            "agent scrape, 1000 functions: {} bytes, {series} samples, {took:?}",
            text.len()
        );
        // Per histogram: buckets + +Inf + sum + count per label set.
        let per_set = LATENCY_BUCKETS_SECONDS
            .len()
            .max(LOAD_BUCKETS_SECONDS.len())
            + 3;
        assert!(series <= 4 * labelled * per_set + 100, "{series}");
        assert!(
            text.contains("function=\"_other\""),
            "past the bound: _other"
        );
        assert_eq!(check_exposition(&text), Vec::<String>::new());
    }
}
