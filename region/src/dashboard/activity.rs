//! What this replica saw happen that the replicated state does not hold:
//! the outcomes of the invocations it forwarded to an agent (per function:
//! counts against the deadline and the latest latencies) and the swaps and
//! remaps its agents reported, newest kept. Each replica holds its own
//! part (the agents link to the leader, so most of it is there);
//! `GET /v1/activity` merges the parts of every replica
//! ([`merge`]) and cuts them to what the caller may see ([`for_tenant`]).
//!
//! ```text
//!  invoke_route ──invoked()──┐
//!  serve_agent ──swapped()───┤ Activity (this replica) ─▶ local view ─┐
//!  AgentReports ─────────────┘                                       ├─ merge ─▶ for_tenant? ─▶ JSON
//!  peers' GET /v1/activity?scope=replica ────────────────────────────┘
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use gshare_core::protocol::{InvokeOutcome, SwapEvent, SwapKind};
use gshare_core::state::{InstanceId, RegionState};
use serde::{Deserialize, Serialize};

use crate::agents::{AgentReport, SwapCounts};

/// Latencies kept per function on one replica (the percentiles are over
/// these: the most recent invocations, not all of them).
pub const RECENT_LATENCIES: usize = 512;
/// Swap and remap events kept per replica.
pub const RECENT_EVENTS: usize = 200;
/// Events in a merged answer.
pub const MERGED_EVENTS: usize = 100;

/// Invocation outcomes of one function, as forwarded by replicas.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionActivity {
    /// The tenant.
    pub tenant: String,
    /// The function.
    pub function: String,
    /// Invocations forwarded to an agent that came back with an outcome.
    pub invocations: u64,
    /// Answered within their deadline.
    pub within_deadline: u64,
    /// Answered after it.
    pub late: u64,
    /// Refused or failed by the agent (deadline unreachable, over capacity, …).
    pub failed: u64,
    /// Latencies of the latest answered invocations (forward to answer), µs, oldest first.
    pub recent_latency_us: Vec<u64>,
    /// Median of `recent_latency_us`, µs.
    pub p50_us: Option<u64>,
    /// 99th percentile of `recent_latency_us`, µs.
    pub p99_us: Option<u64>,
}

impl FunctionActivity {
    fn refresh_percentiles(&mut self) {
        let mut sorted = self.recent_latency_us.clone();
        sorted.sort_unstable();
        self.p50_us = percentile(&sorted, 50);
        self.p99_us = percentile(&sorted, 99);
    }
}

/// The nearest-rank `pct`-th percentile of `sorted` (ascending).
pub fn percentile(sorted: &[u64], pct: u64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len() as u64;
    // ceil(pct × n / 100), at least 1: the rank of the smallest sample with
    // at least pct % of the samples at or below it.
    let rank = (pct.min(100) * n).div_ceil(100).max(1);
    sorted.get((rank - 1) as usize).copied()
}

/// One swap or remap an agent reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivityEvent {
    /// When it started, the agent's clock, Unix ms.
    pub at_ms: u64,
    /// The replica the agent reported it to.
    pub replica: u64,
    /// `swap_in`, `swap_out`, `cold_start`, `move` or `unload` (an
    /// agent's), or `migrate_start`, `migrate_done`, `migrate_given_up`
    /// (the leader's migrations between nodes).
    pub kind: String,
    /// The node.
    pub node: String,
    /// The instance.
    pub instance: u64,
    /// Its tenant (empty when the instance is no longer in the state).
    pub tenant: String,
    /// Its function (empty likewise).
    pub function: String,
    /// GPU it left.
    pub from_gpu: Option<u32>,
    /// GPU it reached.
    pub to_gpu: Option<u32>,
    /// How long the copy takes, µs.
    pub duration_us: u64,
}

/// The name of a swap kind in events.
pub fn kind_name(kind: SwapKind) -> &'static str {
    match kind {
        SwapKind::SwapIn => "swap_in",
        SwapKind::SwapOut => "swap_out",
        SwapKind::ColdStart => "cold_start",
        SwapKind::Move => "move",
        SwapKind::Unload => "unload",
    }
}

/// One GPU of a linked agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLive {
    /// Index on the node.
    pub index: u32,
    /// Model, as the agent registered it.
    pub model: String,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Compute of the requests running at the heartbeat, milli-GPU (operator only).
    pub utilization_milli: Option<u32>,
    /// GPU memory held by resident instances, MiB (operator only).
    pub memory_used_mib: Option<u64>,
    /// NVML's measured utilization, percent (operator only; `None` on simulated GPUs).
    pub measured_utilization_pct: Option<u32>,
    /// NVML's measured memory in use, MiB (operator only; `None` on simulated GPUs).
    pub measured_memory_used_mib: Option<u64>,
    /// Requests queued (operator only).
    pub queued: Option<u32>,
    /// Instances whose weights are on the GPU (a tenant sees only its own).
    pub resident: Vec<u64>,
}

/// An agent linked to some replica, with its latest heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentLink {
    /// The replica holding the link.
    pub replica: u64,
    /// The agent.
    pub agent: String,
    /// Its node.
    pub node: String,
    /// Its pool.
    pub pool: String,
    /// Its version.
    pub version: String,
    /// Heartbeats received on the link.
    pub heartbeats: u64,
    /// The agent's clock at its latest heartbeat, Unix ms.
    pub heartbeat_at_ms: Option<u64>,
    /// Invocations in flight at the heartbeat (operator only).
    pub in_flight: Option<u32>,
    /// The node's GPUs.
    pub gpus: Vec<GpuLive>,
    /// Swap and remap counts on the link (operator only).
    pub swaps: Option<SwapCounts>,
}

impl AgentLink {
    /// The operator's view of `report`, linked to `replica`.
    pub fn of(replica: u64, report: &AgentReport) -> Self {
        let status = |i: u32| {
            report
                .heartbeat
                .as_ref()
                .and_then(|h| h.gpus.iter().find(|g| g.index == i))
        };
        Self {
            replica,
            agent: report.agent.clone(),
            node: report.node.clone(),
            pool: report.pool.clone(),
            version: report.version.clone(),
            heartbeats: report.heartbeats,
            heartbeat_at_ms: report.heartbeat.as_ref().map(|h| h.at_ms),
            in_flight: report.heartbeat.as_ref().map(|h| h.in_flight),
            gpus: report
                .gpus
                .iter()
                .map(|g| {
                    let s = status(g.index);
                    GpuLive {
                        index: g.index,
                        model: g.model.clone(),
                        memory_mib: g.memory_mib,
                        utilization_milli: s.map(|s| s.utilization_milli),
                        memory_used_mib: s.map(|s| s.memory_used_mib),
                        measured_utilization_pct: s.and_then(|s| s.measured_utilization_pct),
                        measured_memory_used_mib: s.and_then(|s| s.measured_memory_used_mib),
                        queued: s.map(|s| s.queued),
                        resident: s
                            .map_or(Vec::new(), |s| s.resident.iter().map(|i| i.0).collect()),
                    }
                })
                .collect(),
            swaps: Some(report.swaps),
        }
    }
}

/// How one replica's part of the answer came.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaPart {
    /// Raft id.
    pub id: u64,
    /// HTTP address.
    pub http_addr: String,
    /// Whether its part is in the answer.
    pub ok: bool,
    /// Why not.
    pub error: Option<String>,
}

/// The answer of `GET /v1/activity`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivityView {
    /// The answering replica's clock, Unix ms.
    pub now_ms: u64,
    /// The replicas asked (just this one with `scope=replica`).
    pub replicas: Vec<ReplicaPart>,
    /// Linked agents.
    pub agents: Vec<AgentLink>,
    /// Invocation outcomes per function (invocations that went through a replica).
    pub functions: Vec<FunctionActivity>,
    /// Swaps and remaps, newest first.
    pub events: Vec<ActivityEvent>,
}

#[derive(Debug, Default)]
struct Inner {
    functions: BTreeMap<(String, String), FunctionActivity>,
    events: VecDeque<ActivityEvent>,
}

/// This replica's record of invocations and agent events.
#[derive(Debug, Default)]
pub struct Activity {
    inner: Mutex<Inner>,
}

impl Activity {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an invocation of `tenant`'s `function` forwarded to an agent:
    /// its outcome after `elapsed`, against a deadline of `deadline_ms`.
    /// A replayed answer (it ran before) is not counted again.
    pub fn invoked(
        &self,
        tenant: &str,
        function: &str,
        deadline_ms: u64,
        elapsed: Duration,
        outcome: &InvokeOutcome,
    ) {
        let answered = match outcome {
            InvokeOutcome::Done { .. } => true,
            InvokeOutcome::Failed(_) => false,
            InvokeOutcome::Replayed { .. } | InvokeOutcome::ReplayedHttp { .. } => return,
        };
        let mut inner = self.lock();
        let f = inner
            .functions
            .entry((tenant.to_string(), function.to_string()))
            .or_insert_with(|| FunctionActivity {
                tenant: tenant.to_string(),
                function: function.to_string(),
                ..FunctionActivity::default()
            });
        f.invocations = f.invocations.saturating_add(1);
        if !answered {
            f.failed = f.failed.saturating_add(1);
            return;
        }
        if elapsed <= Duration::from_millis(deadline_ms) {
            f.within_deadline = f.within_deadline.saturating_add(1);
        } else {
            f.late = f.late.saturating_add(1);
        }
        if f.recent_latency_us.len() >= RECENT_LATENCIES {
            f.recent_latency_us.remove(0);
        }
        f.recent_latency_us
            .push(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    }

    /// Records the swaps and remaps `node`'s agent reported here, naming
    /// each instance's tenant and function from `state`.
    pub fn swapped(&self, node: &str, events: &[SwapEvent], state: &RegionState) {
        let mut inner = self.lock();
        for e in events {
            let owner = state.instance(e.instance);
            if inner.events.len() >= RECENT_EVENTS {
                inner.events.pop_front();
            }
            inner.events.push_back(ActivityEvent {
                at_ms: e.at_ms,
                replica: 0,
                kind: kind_name(e.kind).to_string(),
                node: node.to_string(),
                instance: e.instance.0,
                tenant: owner.map_or_else(String::new, |i| i.tenant.0.clone()),
                function: owner.map_or_else(String::new, |i| i.function.clone()),
                from_gpu: e.from_gpu,
                to_gpu: e.to_gpu,
                duration_us: e.duration_us,
            });
        }
    }

    /// Records a step of a migration the leader took: `kind` is
    /// `migrate_start`, `migrate_done` or `migrate_given_up`, for the new
    /// instance `instance` on `node`.
    pub fn migrated(
        &self,
        at_ms: u64,
        kind: &str,
        node: &str,
        instance: InstanceId,
        tenant: &str,
        function: &str,
    ) {
        let mut inner = self.lock();
        if inner.events.len() >= RECENT_EVENTS {
            inner.events.pop_front();
        }
        inner.events.push_back(ActivityEvent {
            at_ms,
            replica: 0,
            kind: kind.to_string(),
            node: node.to_string(),
            instance: instance.0,
            tenant: tenant.to_string(),
            function: function.to_string(),
            from_gpu: None,
            to_gpu: None,
            duration_us: 0,
        });
    }

    /// This replica's part: its records and the agents linked to it.
    pub fn local_view(&self, replica: u64, now_ms: u64, reports: &[AgentReport]) -> ActivityView {
        let inner = self.lock();
        let mut functions: Vec<FunctionActivity> = inner.functions.values().cloned().collect();
        for f in &mut functions {
            f.refresh_percentiles();
        }
        let events: Vec<ActivityEvent> = inner
            .events
            .iter()
            .rev()
            .take(MERGED_EVENTS)
            .map(|e| ActivityEvent {
                replica,
                ..e.clone()
            })
            .collect();
        ActivityView {
            now_ms,
            replicas: Vec::new(),
            agents: reports.iter().map(|r| AgentLink::of(replica, r)).collect(),
            functions,
            events,
        }
    }
}

/// Merges the parts of several replicas: an agent linked to two (it moved)
/// counts once, with its newest heartbeat; a function's counts add up and
/// its percentiles are over the latencies of all parts.
pub fn merge(now_ms: u64, parts: Vec<ActivityView>) -> ActivityView {
    let mut agents = BTreeMap::<String, AgentLink>::new();
    let mut functions = BTreeMap::<(String, String), FunctionActivity>::new();
    let mut events = Vec::new();
    let mut replicas = Vec::new();
    for p in parts {
        replicas.extend(p.replicas);
        for a in p.agents {
            match agents.get(&a.agent) {
                Some(old) if old.heartbeat_at_ms >= a.heartbeat_at_ms => {}
                _ => {
                    agents.insert(a.agent.clone(), a);
                }
            }
        }
        for f in p.functions {
            let m = functions
                .entry((f.tenant.clone(), f.function.clone()))
                .or_insert_with(|| FunctionActivity {
                    tenant: f.tenant.clone(),
                    function: f.function.clone(),
                    ..FunctionActivity::default()
                });
            m.invocations = m.invocations.saturating_add(f.invocations);
            m.within_deadline = m.within_deadline.saturating_add(f.within_deadline);
            m.late = m.late.saturating_add(f.late);
            m.failed = m.failed.saturating_add(f.failed);
            m.recent_latency_us.extend(f.recent_latency_us);
        }
        events.extend(p.events);
    }
    let mut functions: Vec<FunctionActivity> = functions.into_values().collect();
    for f in &mut functions {
        f.refresh_percentiles();
    }
    events.sort_by_key(|e: &ActivityEvent| std::cmp::Reverse(e.at_ms));
    events.truncate(MERGED_EVENTS);
    ActivityView {
        now_ms,
        replicas,
        agents: agents.into_values().collect(),
        functions,
        events,
    }
}

/// What `tenant` may see of `view`: its functions and the events of its
/// instances; of the agents only the nodes hosting one of its instances
/// in `state`, with their GPUs' sizes and its own residents (no load
/// figures, which would tell of other tenants).
pub fn for_tenant(view: ActivityView, tenant: &str, state: &RegionState) -> ActivityView {
    let mine: std::collections::BTreeSet<u64> = state
        .instances()
        .filter(|i| i.tenant.0 == tenant)
        .map(|i| i.id.0)
        .collect();
    let nodes: std::collections::BTreeSet<&str> = state
        .instances()
        .filter(|i| i.tenant.0 == tenant)
        .flat_map(|i| i.slices.iter().map(|s| s.gpu.node.0.as_str()))
        .collect();
    let agents = view
        .agents
        .into_iter()
        .filter(|a| nodes.contains(a.node.as_str()))
        .map(|a| AgentLink {
            in_flight: None,
            swaps: None,
            gpus: a
                .gpus
                .into_iter()
                .map(|g| GpuLive {
                    utilization_milli: None,
                    memory_used_mib: None,
                    measured_utilization_pct: None,
                    measured_memory_used_mib: None,
                    queued: None,
                    resident: g
                        .resident
                        .into_iter()
                        .filter(|i| mine.contains(i))
                        .collect(),
                    ..g
                })
                .collect(),
            ..a
        })
        .collect();
    ActivityView {
        now_ms: view.now_ms,
        replicas: view.replicas,
        agents,
        functions: view
            .functions
            .into_iter()
            .filter(|f| f.tenant == tenant)
            .collect(),
        events: view
            .events
            .into_iter()
            .filter(|e| e.tenant == tenant)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done() -> InvokeOutcome {
        InvokeOutcome::Done {
            body: Vec::new(),
            queued_us: 0,
            service_us: 0,
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50), Some(50));
        assert_eq!(percentile(&v, 99), Some(99));
        assert_eq!(percentile(&[7], 99), Some(7));
        assert_eq!(percentile(&[1, 2], 50), Some(1));
        assert_eq!(percentile(&[], 50), None);
    }

    #[test]
    fn invocations_count_against_their_deadline_and_replays_not_at_all() {
        let a = Activity::default();
        a.invoked("t", "f", 100, Duration::from_millis(20), &done());
        a.invoked("t", "f", 100, Duration::from_millis(150), &done());
        a.invoked(
            "t",
            "f",
            100,
            Duration::from_millis(1),
            &InvokeOutcome::Failed(gshare_core::protocol::InvokeError::OverCapacity),
        );
        a.invoked(
            "t",
            "f",
            100,
            Duration::from_millis(1),
            &InvokeOutcome::Replayed {
                body: Vec::new(),
                body_len: 0,
                truncated: false,
            },
        );
        let v = a.local_view(1, 0, &[]);
        let f = &v.functions[0];
        assert_eq!(
            (f.invocations, f.within_deadline, f.late, f.failed),
            (3, 1, 1, 1)
        );
        assert_eq!(f.recent_latency_us, vec![20_000, 150_000]);
        assert_eq!((f.p50_us, f.p99_us), (Some(20_000), Some(150_000)));
    }

    #[test]
    fn only_the_latest_latencies_are_kept() {
        let a = Activity::default();
        for ms in 0..(RECENT_LATENCIES as u64 + 10) {
            a.invoked("t", "f", 10_000, Duration::from_millis(ms), &done());
        }
        let v = a.local_view(1, 0, &[]);
        let f = &v.functions[0];
        assert_eq!(f.recent_latency_us.len(), RECENT_LATENCIES);
        assert_eq!(f.recent_latency_us[0], 10_000);
        assert_eq!(f.invocations, RECENT_LATENCIES as u64 + 10);
    }

    /// The local demo's topology with acme's function on `local-c1` GPU 0
    /// and globex's on GPU 1.
    fn two_tenants() -> (RegionState, u64, u64) {
        use gshare_core::config::Topology;
        use gshare_core::model::{
            FunctionSpec, GpuId, LatencyProfile, NodeId, PoolKind, PoolPreference, Quota, Runtime,
            Slice, TenantId, Tier,
        };
        use gshare_core::state::{Applied, DomainCommand};
        let topology = Topology::from_toml(
            "topology.toml",
            include_str!("../../../configs/local/topology.toml"),
        )
        .expect("configs/local/topology.toml");
        let mut s = RegionState::default();
        s.apply(DomainCommand::TopologyLoad { topology }, 1)
            .expect("topology");
        let mut ids = Vec::new();
        for (tenant, index) in [("acme", 0), ("globex", 1)] {
            let quota = Quota {
                compute_milli: 4_000,
                memory_mib: 65_536,
                instances: 8,
            };
            s.apply(
                DomainCommand::TenantCreate {
                    tenant: TenantId(tenant.into()),
                    display_name: None,
                    quotas: BTreeMap::from([(PoolKind::Center, quota)]),
                },
                1,
            )
            .expect("tenant");
            let spec = FunctionSpec {
                model: None,
                args: Vec::new(),
                env: Default::default(),
                tenant: TenantId(tenant.into()),
                name: format!("{tenant}-fn"),
                runtime: Runtime::Custom,
                memory_mib: 1_024,
                compute_milli: 250,
                tier: Tier::Guaranteed,
                deadline_ms: 100,
                pool: PoolPreference::Center,
                min_instances: 1,
                max_instances: 1,
                idle_timeout_s: 60,
                latency: LatencyProfile {
                    full_gpu_us: 1_000,
                    saturation_milli: 1_000,
                },
            };
            let slice = Slice {
                gpu: GpuId {
                    node: NodeId("local-c1".into()),
                    index,
                },
                compute_milli: 250,
                memory_mib: 1_024,
            };
            match s.apply(
                DomainCommand::FunctionCreate {
                    spec,
                    placements: vec![vec![slice]],
                },
                1,
            ) {
                Ok(Applied::FunctionCreated { instances, .. }) => ids.push(instances[0].instance.0),
                other => panic!("{other:?}"),
            }
        }
        (s, ids[0], ids[1])
    }

    #[test]
    fn a_tenant_sees_its_own_part_and_no_load_figures() {
        let (state, mine, theirs) = two_tenants();
        let gpu = |index, resident: Vec<u64>| GpuLive {
            index,
            model: "sim-gpu-16g".into(),
            memory_mib: 16_384,
            utilization_milli: Some(700),
            memory_used_mib: Some(2_048),
            measured_utilization_pct: Some(70),
            measured_memory_used_mib: Some(2_048),
            queued: Some(3),
            resident,
        };
        let link = |node: &str, gpus| AgentLink {
            replica: 1,
            agent: node.into(),
            node: node.into(),
            pool: "center".into(),
            version: "v".into(),
            heartbeats: 4,
            heartbeat_at_ms: Some(10),
            in_flight: Some(2),
            gpus,
            swaps: Some(SwapCounts::default()),
        };
        let event = |tenant: &str, instance| ActivityEvent {
            at_ms: 5,
            replica: 1,
            kind: "swap_in".into(),
            node: "local-c1".into(),
            instance,
            tenant: tenant.into(),
            function: format!("{tenant}-fn"),
            from_gpu: None,
            to_gpu: Some(0),
            duration_us: 10,
        };
        let stats = |tenant: &str| FunctionActivity {
            tenant: tenant.into(),
            function: format!("{tenant}-fn"),
            invocations: 1,
            ..FunctionActivity::default()
        };
        let view = ActivityView {
            now_ms: 11,
            replicas: Vec::new(),
            agents: vec![
                link(
                    "local-c1",
                    vec![gpu(0, vec![mine, theirs]), gpu(1, vec![theirs])],
                ),
                link("local-c2", vec![gpu(0, Vec::new())]),
            ],
            functions: vec![stats("acme"), stats("globex")],
            events: vec![event("acme", mine), event("globex", theirs)],
        };
        let v = for_tenant(view, "acme", &state);
        assert_eq!(v.agents.len(), 1, "only the node hosting acme");
        let a = &v.agents[0];
        assert_eq!(a.node, "local-c1");
        assert_eq!((a.in_flight, a.swaps), (None, None));
        assert_eq!(a.gpus.len(), 2, "the node's GPUs, with their sizes");
        for g in &a.gpus {
            assert_eq!(g.memory_mib, 16_384);
            assert_eq!(
                (g.utilization_milli, g.memory_used_mib, g.queued),
                (None, None, None)
            );
            assert_eq!(g.measured_utilization_pct, None);
        }
        assert_eq!(a.gpus[0].resident, vec![mine]);
        assert!(a.gpus[1].resident.is_empty());
        assert_eq!(v.functions.len(), 1);
        assert_eq!(v.functions[0].tenant, "acme");
        assert_eq!(v.events.len(), 1);
        assert_eq!(v.events[0].instance, mine);
    }

    #[test]
    fn merged_parts_add_up_and_keep_the_newest_heartbeat_of_an_agent() {
        let link = |replica, at| AgentLink {
            replica,
            agent: "a1".into(),
            node: "n1".into(),
            pool: "p".into(),
            version: "v".into(),
            heartbeats: 1,
            heartbeat_at_ms: at,
            in_flight: None,
            gpus: Vec::new(),
            swaps: None,
        };
        let f = |n, lat: Vec<u64>| FunctionActivity {
            tenant: "t".into(),
            function: "f".into(),
            invocations: n,
            within_deadline: n,
            recent_latency_us: lat,
            ..FunctionActivity::default()
        };
        let p1 = ActivityView {
            agents: vec![link(1, Some(5))],
            functions: vec![f(2, vec![10, 30])],
            ..ActivityView::default()
        };
        let p2 = ActivityView {
            agents: vec![link(2, Some(9))],
            functions: vec![f(1, vec![20])],
            ..ActivityView::default()
        };
        let m = merge(0, vec![p1, p2]);
        assert_eq!(m.agents.len(), 1);
        assert_eq!(m.agents[0].replica, 2);
        assert_eq!(m.functions.len(), 1);
        assert_eq!(m.functions[0].invocations, 3);
        assert_eq!(m.functions[0].p50_us, Some(20));
        assert_eq!(m.functions[0].p99_us, Some(30));
    }
}
