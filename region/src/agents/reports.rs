//! What the agents connected to this replica report: the latest heartbeat
//! of each and its swap/remap counts. Kept in memory on the replica that
//! holds the agent's link (not replicated through Raft); an agent's entry
//! is dropped when its connection ends.

use gshare_core::protocol::{Heartbeat, NodeGpu, Register, SwapEvent, SwapKind};
use gshare_core::state::AgentId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

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
    #[serde(skip)]
    link: usize,
}

/// The reports of the agents connected to this replica.
#[derive(Debug, Default)]
pub struct AgentReports {
    agents: Mutex<BTreeMap<AgentId, AgentReport>>,
}

fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl AgentReports {
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
                link,
            },
        );
    }

    /// Keeps `h` as the agent's latest heartbeat (ignored if the agent is
    /// not registered here).
    pub fn heartbeat(&self, h: Heartbeat) {
        if let Some(r) = self.lock().get_mut(&h.agent) {
            r.heartbeats += 1;
            r.heartbeat = Some(h);
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

    /// The connected agents, by id.
    pub fn list(&self) -> Vec<AgentReport> {
        self.lock().values().cloned().collect()
    }

    /// Prometheus text: per agent and GPU the reported utilization,
    /// memory, queue depth and residency; per agent in-flight invocations
    /// and swap events by kind.
    pub fn render(&self, out: &mut String) {
        let agents = self.list();
        let gauges: [(&str, &str); 5] = [
            (
                "gshare_region_agent_gpu_utilization_milli",
                "Compute in use on a GPU (milli-GPU), from the agent's latest heartbeat",
            ),
            (
                "gshare_region_agent_gpu_memory_used_mib",
                "GPU memory held by resident instances (MiB), from the latest heartbeat",
            ),
            (
                "gshare_region_agent_gpu_queued",
                "Requests queued on a GPU, from the latest heartbeat",
            ),
            (
                "gshare_region_agent_gpu_resident",
                "Instances resident on a GPU, from the latest heartbeat",
            ),
            (
                "gshare_region_agent_gpu_measured_utilization_pct",
                "NVML-measured GPU utilization (percent); absent on simulated GPUs",
            ),
        ];
        for (i, (name, help)) in gauges.iter().enumerate() {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            for a in &agents {
                let Some(h) = &a.heartbeat else { continue };
                for g in &h.gpus {
                    let v = match i {
                        0 => Some(u64::from(g.utilization_milli)),
                        1 => Some(g.memory_used_mib),
                        2 => Some(u64::from(g.queued)),
                        3 => Some(g.resident.len() as u64),
                        _ => g.measured_utilization_pct.map(u64::from),
                    };
                    if let Some(v) = v {
                        let _ = writeln!(
                            out,
                            "{name}{{agent=\"{}\",gpu=\"{}\"}} {v}",
                            label(&a.agent),
                            g.index
                        );
                    }
                }
            }
        }
        let name = "gshare_region_agent_in_flight";
        let _ = writeln!(
            out,
            "# HELP {name} Invocations in flight on an agent, from its latest heartbeat"
        );
        let _ = writeln!(out, "# TYPE {name} gauge");
        for a in &agents {
            if let Some(h) = &a.heartbeat {
                let _ = writeln!(
                    out,
                    "{name}{{agent=\"{}\"}} {}",
                    label(&a.agent),
                    h.in_flight
                );
            }
        }
        let counters: [(&str, &str, &str); 5] = [
            (
                "gshare_region_agent_process_crashes_total",
                "counter",
                "Function processes that crashed on an agent, from its latest heartbeat",
            ),
            (
                "gshare_region_agent_process_restarts_total",
                "counter",
                "Function processes restarted healthy after a crash, from the latest heartbeat",
            ),
            (
                "gshare_region_agent_process_running",
                "gauge",
                "Function processes running on an agent, from its latest heartbeat",
            ),
            (
                "gshare_region_agent_usage_pending_records",
                "gauge",
                "Usage records an agent journaled that the region has not acknowledged yet",
            ),
            (
                "gshare_region_agent_usage_withheld_total",
                "counter",
                "Results an agent withheld because their usage could not be journaled",
            ),
        ];
        for (i, (name, kind, help)) in counters.iter().enumerate() {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for a in &agents {
                let Some(h) = &a.heartbeat else { continue };
                let c = &h.counters;
                let v = match i {
                    0 => c.process_crashes,
                    1 => c.process_restarts,
                    2 => c.process_running,
                    3 => c.usage_pending_records,
                    _ => c.usage_withheld,
                };
                let _ = writeln!(out, "{name}{{agent=\"{}\"}} {v}", label(&a.agent));
            }
        }
        let name = "gshare_region_agent_swaps_total";
        let _ = writeln!(
            out,
            "# HELP {name} Swap and remap events an agent reported to this replica, by kind"
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        for a in &agents {
            for (kind, n) in a.swaps.by_kind() {
                let _ = writeln!(
                    out,
                    "{name}{{agent=\"{}\",kind=\"{kind}\"}} {n}",
                    label(&a.agent)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gshare_core::model::NodeId;
    use gshare_core::protocol::{AgentCounters, GpuStatus};
    use gshare_core::state::InstanceId;

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
        let mut text = String::new();
        r.render(&mut text);
        assert!(
            text.contains("gshare_region_agent_gpu_utilization_milli{agent=\"a\",gpu=\"0\"} 700\n")
        );
        assert!(text.contains("gshare_region_agent_gpu_resident{agent=\"a\",gpu=\"0\"} 2\n"));
        assert!(text.contains("gshare_region_agent_in_flight{agent=\"a\"} 5\n"));
        assert!(text.contains("gshare_region_agent_swaps_total{agent=\"a\",kind=\"swap_in\"} 2\n"));
        assert!(!text.contains("measured_utilization_pct{"));
        assert!(text.contains("gshare_region_agent_process_crashes_total{agent=\"a\"} 2\n"));
        assert!(text.contains("gshare_region_agent_process_running{agent=\"a\"} 1\n"));
        assert!(text.contains("gshare_region_agent_usage_pending_records{agent=\"a\"} 40\n"));
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
