//! What the agents connected to this replica report: the latest heartbeat
//! of each, its latest per-function load report, the weights it keeps in
//! host memory (host copies) and its swap/remap counts. Kept in memory on the replica that
//! holds the agent's link (not replicated through Raft); an agent's entry
//! is dropped when its connection ends. Every replica reads the others'
//! over the peer wire ([`super::region_agents`]).

use gshare_core::clock::{SharedClock, SystemClock};
use gshare_core::metrics::{bytes_from_mib, ratio_from_milli, FunctionLabels, Sampler, Series};
use gshare_core::model::TenantId;
use gshare_core::protocol::{
    sum_loads, FunctionLoad, Heartbeat, HostCopy, InstanceState, InstanceStatus, NodeGpu, Register,
    SwapEvent, SwapKind, MAX_FUNCTION_LOADS, MAX_HOST_COPIES,
};
use gshare_core::state::{AgentId, InstanceId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Instant;

/// Swap and remap events an agent reported, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwapCounts {
    /// Host memory → GPU.
    pub swap_in: u64,
    /// GPU → host memory.
    pub swap_out: u64,
    /// Storage → GPU.
    pub cold_start: u64,
    /// Moves between GPUs of the node (remaps).
    pub moves: u64,
    /// Dropped without a host copy.
    pub unload: u64,
}

impl SwapCounts {
    fn add(&mut self, kind: SwapKind) {
        match kind {
            SwapKind::SwapIn => self.swap_in += 1,
            SwapKind::SwapOut => self.swap_out += 1,
            SwapKind::ColdStart => self.cold_start += 1,
            SwapKind::Move => self.moves += 1,
            SwapKind::Unload => self.unload += 1,
        }
    }

    fn by_kind(&self) -> [(&'static str, u64); 5] {
        [
            ("swap_in", self.swap_in),
            ("swap_out", self.swap_out),
            ("cold_start", self.cold_start),
            ("move", self.moves),
            ("unload", self.unload),
        ]
    }
}

/// One connected agent, as `GET /v1/cluster/agents` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentReport {
    /// The agent.
    pub agent: String,
    /// Its node.
    pub node: String,
    /// Its pool.
    pub pool: String,
    /// Its version.
    pub version: String,
    /// Its HTTP ingress.
    pub ingress: String,
    /// The node's GPUs, as registered.
    pub gpus: Vec<NodeGpu>,
    /// The latest heartbeat (per-GPU utilization, memory, residency, queue
    /// depth; the agent's time), if one came yet.
    pub heartbeat: Option<Heartbeat>,
    /// Heartbeats received on this link.
    pub heartbeats: u64,
    /// Swap/remap events reported on this link.
    pub swaps: SwapCounts,
    /// The replica holding the agent's link (the one these reports come from).
    #[serde(default)]
    pub replica: u64,
    /// How long ago that replica received the latest heartbeat, ms, when
    /// it answered (`None`: no heartbeat yet). Measured on the holder's
    /// clock, not the agent's.
    #[serde(default)]
    pub age_ms: Option<u64>,
    /// The instances that replica last pushed to the agent (its assignment).
    #[serde(default)]
    pub delivered: Vec<InstanceId>,
    /// The agent's latest per-function load report (counts since its
    /// previous one; empty until one came).
    #[serde(default)]
    pub loads: Vec<FunctionLoad>,
    /// Entries that report left out (over `MAX_FUNCTION_LOADS`).
    #[serde(default)]
    pub loads_dropped: u64,
    /// When the agent made that report, ms on its clock (0: none yet).
    #[serde(default)]
    pub loads_at_ms: u64,
    /// The interval that report's counts cover: ms on the agent's clock
    /// since its previous report on this link (0: unknown, the link's
    /// first). What turns its counts into rates.
    #[serde(default)]
    pub loads_interval_ms: u64,
    /// The functions whose weights the agent keeps in host memory without
    /// hosting them (its latest `HostCopies` report; empty until one came).
    #[serde(default)]
    pub host_copies: Vec<HostCopy>,
    #[serde(skip)]
    link: usize,
    #[serde(skip)]
    received: Option<Instant>,
}

impl AgentReport {
    /// The agent's reported state of `instance` (`None`: not in its latest
    /// heartbeat).
    pub fn instance(&self, instance: InstanceId) -> Option<&InstanceStatus> {
        self.heartbeat
            .as_ref()?
            .instances
            .iter()
            .find(|i| i.instance == instance)
    }
}

/// The reports of the agents connected to this replica.
#[derive(Debug)]
pub struct AgentReports {
    agents: Mutex<BTreeMap<AgentId, AgentReport>>,
    /// What heartbeat ages are measured on.
    clock: SharedClock,
}

impl Default for AgentReports {
    /// Reports on the system clock.
    fn default() -> Self {
        Self::new(SystemClock::shared())
    }
}

impl AgentReports {
    /// No reports yet; heartbeat ages measured on `clock`.
    pub fn new(clock: SharedClock) -> Self {
        Self {
            agents: Mutex::default(),
            clock,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<AgentId, AgentReport>> {
        self.agents.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `r` registered on the connection `link` (quinn's `stable_id`);
    /// replaces an earlier entry of the same agent.
    pub fn registered(&self, link: usize, r: &Register) {
        self.lock().insert(
            r.agent.clone(),
            AgentReport {
                agent: r.agent.0.clone(),
                node: r.node.0.clone(),
                pool: r.pool.clone(),
                version: r.version.clone(),
                ingress: r.ingress.clone(),
                gpus: r.gpus.clone(),
                heartbeat: None,
                heartbeats: 0,
                swaps: SwapCounts::default(),
                replica: 0,
                age_ms: None,
                delivered: Vec::new(),
                loads: Vec::new(),
                loads_dropped: 0,
                loads_at_ms: 0,
                loads_interval_ms: 0,
                host_copies: Vec::new(),
                link,
                received: None,
            },
        );
    }

    /// Keeps `h` as the agent's latest heartbeat (ignored if the agent is
    /// not registered here).
    pub fn heartbeat(&self, h: Heartbeat) {
        if let Some(r) = self.lock().get_mut(&h.agent) {
            r.heartbeats += 1;
            r.heartbeat = Some(h);
            r.received = Some(self.clock.now());
        }
    }

    /// Keeps `loads` as the agent's latest load report (ignored if the
    /// agent is not registered here). Entries over `MAX_FUNCTION_LOADS`
    /// (a misbehaving agent) are cut off and counted as dropped.
    pub fn loads(&self, agent: &AgentId, at_ms: u64, mut loads: Vec<FunctionLoad>, dropped: u64) {
        let over = loads.len().saturating_sub(MAX_FUNCTION_LOADS);
        loads.truncate(MAX_FUNCTION_LOADS);
        if let Some(r) = self.lock().get_mut(agent) {
            r.loads_interval_ms = if r.loads_at_ms == 0 {
                0
            } else {
                at_ms.saturating_sub(r.loads_at_ms)
            };
            r.loads_at_ms = at_ms;
            r.loads = loads;
            r.loads_dropped = dropped.saturating_add(over as u64);
        }
    }

    /// Keeps `copies` as the host copies `agent` holds (ignored if the
    /// agent is not registered here); entries over `MAX_HOST_COPIES` (a
    /// misbehaving agent) are cut off.
    pub fn host_copies(&self, agent: &AgentId, mut copies: Vec<HostCopy>) {
        copies.truncate(MAX_HOST_COPIES);
        if let Some(r) = self.lock().get_mut(agent) {
            r.host_copies = copies;
        }
    }

    /// Counts the swap/remap `events` of `agent`.
    pub fn swaps(&self, agent: &AgentId, events: &[SwapEvent]) {
        if let Some(r) = self.lock().get_mut(agent) {
            for e in events {
                r.swaps.add(e.kind);
            }
        }
    }

    /// The connection `link` of `agent` ended: drops its entry unless the
    /// agent has registered again on another connection since.
    pub fn disconnected(&self, agent: &AgentId, link: usize) {
        let mut agents = self.lock();
        if agents.get(agent).is_some_and(|r| r.link == link) {
            agents.remove(agent);
        }
    }

    /// The nodes of the agents connected here whose latest heartbeat
    /// reports one of `instances` resident (weights loaded on a GPU).
    pub fn resident_nodes(&self, instances: &[InstanceId]) -> BTreeSet<String> {
        self.lock()
            .values()
            .filter(|r| {
                instances.iter().any(|i| {
                    r.instance(*i)
                        .is_some_and(|s| s.state == InstanceState::Resident)
                })
            })
            .map(|r| r.node.clone())
            .collect()
    }

    /// The connected agents, by id, each with the age of its latest
    /// heartbeat now.
    pub fn list(&self) -> Vec<AgentReport> {
        let now = self.clock.now();
        self.lock()
            .values()
            .map(|r| AgentReport {
                age_ms: r.received.map(|at| {
                    u64::try_from(now.duration_since(at).as_millis()).unwrap_or(u64::MAX)
                }),
                ..r.clone()
            })
            .collect()
    }

    /// Samples, per agent and GPU, the reported utilization, memory, queue
    /// depth and residency; per agent in-flight invocations, process and
    /// journal figures, and swap events by kind.
    pub fn sample(&self, out: &mut Sampler) {
        let agents = self.list();
        for a in &agents {
            let Some(h) = &a.heartbeat else { continue };
            for g in &h.gpus {
                let gpu = g.index.to_string();
                let labels = [
                    a.agent.as_str(),
                    a.pool.as_str(),
                    a.node.as_str(),
                    gpu.as_str(),
                ];
                out.add(
                    &GPU_SERIES[0],
                    &labels,
                    ratio_from_milli(u64::from(g.utilization_milli)),
                );
                out.add(&GPU_SERIES[1], &labels, bytes_from_mib(g.memory_used_mib));
                out.add(&GPU_SERIES[2], &labels, f64::from(g.queued));
                out.add(&GPU_SERIES[3], &labels, g.resident.len() as f64);
                if let Some(pct) = g.measured_utilization_pct {
                    out.add(&GPU_SERIES[4], &labels, f64::from(pct) / 100.0);
                }
            }
            let labels = [a.agent.as_str()];
            out.add(&AGENT_SERIES[0], &labels, f64::from(h.in_flight));
            let c = &h.counters;
            let figures = [
                c.process_crashes,
                c.process_restarts,
                c.process_running,
                c.usage_pending_records,
                c.usage_withheld,
            ];
            for (s, v) in AGENT_SERIES[1..].iter().zip(figures) {
                out.add(s, &labels, v as f64);
            }
        }
        for a in &agents {
            for (kind, n) in a.swaps.by_kind() {
                out.add(&SWAPS, &[a.agent.as_str(), kind], n as f64);
            }
            if a.heartbeat.is_some() {
                out.add(&LOADS_DROPPED, &[a.agent.as_str()], a.loads_dropped as f64);
            }
        }
        sample_loads(&agents, out);
    }
}

/// Per (tenant, function), the latest load reports of `agents` summed;
/// the label pairs are bounded by [`FunctionLabels`] (in name order, so
/// the same ones keep their labels), the rest summed under `OTHER`.
fn sample_loads(agents: &[AgentReport], out: &mut Sampler) {
    let mut keys: Vec<(&TenantId, &str)> = agents
        .iter()
        .flat_map(|a| &a.loads)
        .map(|l| (&l.tenant, l.function.as_str()))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let mut bound = FunctionLabels::new();
    let labels: BTreeMap<(&TenantId, &str), (TenantId, String)> = keys
        .into_iter()
        .map(|(tenant, function)| {
            let (t, f) = bound.label(&tenant.0, function);
            let label = (TenantId(t.to_string()), f.to_string());
            ((tenant, function), label)
        })
        .collect();
    let labelled: Vec<FunctionLoad> = agents
        .iter()
        .flat_map(|a| &a.loads)
        .map(|l| {
            let (tenant, function) = labels[&(&l.tenant, l.function.as_str())].clone();
            FunctionLoad {
                tenant,
                function,
                ..l.clone()
            }
        })
        .collect();
    for ((tenant, function), load) in sum_loads([(labelled.as_slice(), 0)]) {
        let labels = [tenant.0.as_str(), function.as_str()];
        let figures = [
            f64::from(load.concurrency),
            load.arrivals as f64,
            load.deadline_misses as f64,
            load.early_rejects as f64,
        ];
        for (s, v) in LOAD_SERIES.iter().zip(figures) {
            out.add(s, &labels, v);
        }
    }
}

const GPU_LABELS: &[&str] = &["agent", "pool", "node", "gpu"];

/// Per agent and GPU, from the agent's latest heartbeat.
pub const GPU_SERIES: [Series; 5] = [
    Series::gauge(
        "gshare_region_agent_gpu_utilization_ratio",
        "Compute in use on a GPU, ratio of the GPU (may exceed 1 while overcommitted), from the agent's latest heartbeat",
        GPU_LABELS,
    ),
    Series::gauge(
        "gshare_region_agent_gpu_memory_used_bytes",
        "GPU memory held by resident instances, bytes, from the latest heartbeat",
        GPU_LABELS,
    ),
    Series::gauge(
        "gshare_region_agent_gpu_queued",
        "Requests queued on a GPU, from the latest heartbeat",
        GPU_LABELS,
    ),
    Series::gauge(
        "gshare_region_agent_gpu_resident",
        "Instances resident on a GPU, from the latest heartbeat",
        GPU_LABELS,
    ),
    Series::gauge(
        "gshare_region_agent_gpu_measured_utilization_ratio",
        "NVML-measured GPU utilization, ratio (0 to 1); absent on simulated GPUs",
        GPU_LABELS,
    ),
];

/// Per agent, from its latest heartbeat.
pub const AGENT_SERIES: [Series; 6] = [
    Series::gauge(
        "gshare_region_agent_in_flight",
        "Invocations in flight on an agent, from its latest heartbeat",
        &["agent"],
    ),
    Series::counter(
        "gshare_region_agent_process_crashes_total",
        "Function processes that crashed on an agent, from its latest heartbeat",
        &["agent"],
    ),
    Series::counter(
        "gshare_region_agent_process_restarts_total",
        "Function processes restarted healthy after a crash, from the latest heartbeat",
        &["agent"],
    ),
    Series::gauge(
        "gshare_region_agent_process_running",
        "Function processes running on an agent, from its latest heartbeat",
        &["agent"],
    ),
    Series::gauge(
        "gshare_region_agent_usage_pending_records",
        "Usage records an agent journaled that the region has not acknowledged yet",
        &["agent"],
    ),
    Series::counter(
        "gshare_region_agent_usage_withheld_total",
        "Results an agent withheld because their usage could not be journaled",
        &["agent"],
    ),
];

/// Per (tenant, function), from the latest load reports of the agents
/// linked to this replica, summed (see `docs/autoscaling.md`).
pub const LOAD_SERIES: [Series; 4] = [
    Series::gauge(
        "gshare_region_function_load_concurrency",
        "Requests executing or waiting for a function, from the latest load reports of the agents linked to this replica",
        &["tenant", "function"],
    ),
    Series::gauge(
        "gshare_region_function_load_arrivals",
        "Requests that arrived for a function within the agents' latest report intervals",
        &["tenant", "function"],
    ),
    Series::gauge(
        "gshare_region_function_load_deadline_misses",
        "Requests of a function that missed their deadline within the agents' latest report intervals",
        &["tenant", "function"],
    ),
    Series::gauge(
        "gshare_region_function_load_early_rejects",
        "Requests of a function rejected early (deadline unreachable) within the agents' latest report intervals",
        &["tenant", "function"],
    ),
];

/// Load entries an agent's latest report left out (over the cap).
pub const LOADS_DROPPED: Series = Series::gauge(
    "gshare_region_agent_loads_dropped",
    "Function load entries the agent's latest report left out (over MAX_FUNCTION_LOADS)",
    &["agent"],
);

/// Swap and remap events reported on an agent's link, by kind.
pub const SWAPS: Series = Series::counter(
    "gshare_region_agent_swaps_total",
    "Swap and remap events an agent reported to this replica, by kind",
    &["agent", "kind"],
);

#[cfg(test)]
mod tests {
    use super::*;
    use gshare_core::model::NodeId;
    use gshare_core::protocol::{AgentCounters, GpuStatus};

    fn register(agent: &str) -> Register {
        Register {
            agent: AgentId(agent.into()),
            node: NodeId(agent.into()),
            pool: "center".into(),
            version: "0.1.0".into(),
            gpus: vec![NodeGpu {
                index: 0,
                model: "L4".into(),
                memory_mib: 23_034,
            }],
            ingress: "127.0.0.1:1".into(),
        }
    }

    fn beat(agent: &str, util: u32) -> Heartbeat {
        Heartbeat {
            agent: AgentId(agent.into()),
            at_ms: 7,
            gpus: vec![GpuStatus {
                index: 0,
                utilization_milli: util,
                memory_used_mib: 4096,
                resident: vec![InstanceId(1), InstanceId(2)],
                queued: 3,
                measured_utilization_pct: None,
                measured_memory_used_mib: None,
            }],
            in_flight: 5,
            swaps: 0,
            counters: AgentCounters {
                process_crashes: 2,
                process_running: 1,
                usage_pending_records: 40,
                ..AgentCounters::default()
            },
            instances: Vec::new(),
        }
    }

    fn event(kind: SwapKind) -> SwapEvent {
        SwapEvent {
            instance: InstanceId(1),
            kind,
            from_gpu: None,
            to_gpu: Some(0),
            at_ms: 1,
            duration_us: 10,
        }
    }

    #[test]
    fn heartbeat_ages_are_measured_on_the_replicas_clock() {
        let (manual, clock) = gshare_core::clock::ManualClock::shared(1_000);
        let r = AgentReports::new(clock);
        r.registered(1, &register("a"));
        assert_eq!(r.list()[0].age_ms, None);
        r.heartbeat(beat("a", 1));
        assert_eq!(r.list()[0].age_ms, Some(0));
        manual.advance(std::time::Duration::from_millis(1_500));
        assert_eq!(r.list()[0].age_ms, Some(1_500));
        r.heartbeat(beat("a", 2));
        assert_eq!(r.list()[0].age_ms, Some(0));
    }

    #[test]
    fn keeps_the_latest_heartbeat_and_counts_swaps_by_kind() {
        let r = AgentReports::default();
        r.heartbeat(beat("a", 1)); // not registered: ignored
        assert!(r.list().is_empty());
        r.registered(1, &register("a"));
        r.heartbeat(beat("a", 300));
        r.heartbeat(beat("a", 700));
        let a = AgentId("a".into());
        r.swaps(&a, &[event(SwapKind::SwapIn), event(SwapKind::SwapIn)]);
        r.swaps(&a, &[event(SwapKind::Move), event(SwapKind::SwapOut)]);
        let list = r.list();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].heartbeats, 2);
        assert!(
            list[0].age_ms.is_some(),
            "a heartbeat came: its age is known"
        );
        assert_eq!(
            list[0].heartbeat.as_ref().unwrap().gpus[0].utilization_milli,
            700
        );
        assert_eq!(
            list[0].swaps,
            SwapCounts {
                swap_in: 2,
                swap_out: 1,
                moves: 1,
                ..SwapCounts::default()
            }
        );
        let mut sampler = Sampler::new();
        r.sample(&mut sampler);
        let text = gshare_core::metrics::exposition(
            &gshare_core::metrics::prometheus::Registry::new(),
            sampler.into_families(),
            true,
        )
        .unwrap();
        assert_eq!(
            gshare_core::metrics::check_exposition(&text),
            Vec::<String>::new(),
            "{text}"
        );
        let gpu = "{agent=\"a\",pool=\"center\",node=\"a\",gpu=\"0\"}";
        for want in [
            format!("gshare_region_agent_gpu_utilization_ratio{gpu} 0.7\n"),
            format!("gshare_region_agent_gpu_memory_used_bytes{gpu} 4294967296\n"),
            format!("gshare_region_agent_gpu_resident{gpu} 2\n"),
            "gshare_region_agent_in_flight{agent=\"a\"} 5\n".into(),
            "gshare_region_agent_swaps_total{agent=\"a\",kind=\"swap_in\"} 2\n".into(),
            "# TYPE gshare_region_agent_process_crashes_total counter\n".into(),
            "gshare_region_agent_process_crashes_total{agent=\"a\"} 2\n".into(),
            "gshare_region_agent_process_running{agent=\"a\"} 1\n".into(),
            "gshare_region_agent_usage_pending_records{agent=\"a\"} 40\n".into(),
        ] {
            assert!(text.contains(&want), "{want} missing in {text}");
        }
        assert!(!text.contains("measured_utilization_ratio{"));
    }

    fn load(function: &str, arrivals: u64, in_flight: u32, misses: u64) -> FunctionLoad {
        FunctionLoad {
            tenant: TenantId("acme".into()),
            function: function.into(),
            arrivals,
            in_flight,
            waiting: 2,
            queue_wait_us: 0,
            deadline_misses: misses,
            early_rejects: 1,
            swaps: 0,
            idle_ms: 0,
        }
    }

    #[test]
    fn keeps_the_latest_load_report_and_exports_it_summed_per_function() {
        let r = AgentReports::default();
        r.loads(&AgentId("a".into()), 900, vec![load("f", 1, 1, 0)], 0); // not registered
        r.registered(1, &register("a"));
        r.registered(2, &register("b"));
        r.heartbeat(beat("a", 1));
        r.heartbeat(beat("b", 1));
        r.loads(&AgentId("a".into()), 1000, vec![load("f", 99, 9, 9)], 0);
        // The latest report replaces the previous one, and covers the
        // 200 ms since it.
        r.loads(&AgentId("a".into()), 1200, vec![load("f", 3, 1, 1)], 4);
        r.loads(
            &AgentId("b".into()),
            1000,
            vec![load("f", 5, 2, 0), load("g", 0, 0, 0)],
            0,
        );
        // A misbehaving agent's report over the cap is cut, the rest counted.
        let many: Vec<FunctionLoad> = (0..MAX_FUNCTION_LOADS + 2)
            .map(|i| load(&format!("h{i}"), 0, 0, 0))
            .collect();
        r.registered(3, &register("c"));
        r.loads(&AgentId("c".into()), 1000, many, 1);
        let list = r.list();
        assert_eq!(list[0].loads, vec![load("f", 3, 1, 1)]);
        assert_eq!(list[0].loads_dropped, 4);
        // a: 200 ms since its previous report; b: its first (unknown).
        assert_eq!(
            (list[0].loads_at_ms, list[0].loads_interval_ms),
            (1200, 200)
        );
        assert_eq!((list[1].loads_at_ms, list[1].loads_interval_ms), (1000, 0));
        assert_eq!(list[2].loads.len(), MAX_FUNCTION_LOADS);
        assert_eq!(list[2].loads_dropped, 3);
        r.disconnected(&AgentId("c".into()), 3);
        let mut sampler = Sampler::new();
        r.sample(&mut sampler);
        let families = sampler.into_families();
        let registry = gshare_core::metrics::prometheus::Registry::new();
        let text = gshare_core::metrics::exposition(&registry, families.clone(), true).unwrap();
        assert_eq!(
            gshare_core::metrics::check_exposition(&text),
            Vec::<String>::new(),
            "{text}"
        );
        let f = "{tenant=\"acme\",function=\"f\"}";
        for want in [
            format!("gshare_region_function_load_concurrency{f} 7\n"),
            format!("gshare_region_function_load_arrivals{f} 8\n"),
            format!("gshare_region_function_load_deadline_misses{f} 1\n"),
            format!("gshare_region_function_load_early_rejects{f} 2\n"),
            "gshare_region_agent_loads_dropped{agent=\"a\"} 4\n".into(),
        ] {
            assert!(text.contains(&want), "{want} missing in {text}");
        }
        // Without the metrics or operator token: no tenant-labelled series.
        let public = gshare_core::metrics::exposition(&registry, families, false).unwrap();
        assert!(!public.contains("gshare_region_function_load"), "{public}");
        assert!(public.contains("gshare_region_agent_loads_dropped{agent=\"a\"} 4\n"));
    }

    #[test]
    fn an_old_link_ending_does_not_drop_a_newer_registration() {
        let r = AgentReports::default();
        let a = AgentId("a".into());
        r.registered(1, &register("a"));
        r.registered(2, &register("a"));
        r.disconnected(&a, 1);
        assert_eq!(r.list().len(), 1);
        r.disconnected(&a, 2);
        assert!(r.list().is_empty());
    }
}
