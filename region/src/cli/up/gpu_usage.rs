//! GPU utilization during the demo load, sampled from the agents'
//! heartbeats as the replicas hold them (`GET /v1/cluster/agents` on every
//! replica: each lists the agents linked to it).
//!
//! `utilization_milli` is the compute of the requests running on a GPU at
//! the heartbeat (1000 = the whole GPU; above 1000 while burstable compute
//! is overcommitted). The report gives its mean over the samples of the
//! load, the mean GPU memory held by resident instances, and the swap
//! counts each agent reported.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::agents::{AgentReport, SwapCounts};

use super::api_client::ApiClient;

/// Sampling period.
const PERIOD: Duration = Duration::from_millis(250);

/// Sums over the samples of one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuSamples {
    /// Samples taken.
    pub samples: u64,
    /// Σ utilization, milli-GPU.
    pub utilization_milli: u64,
    /// Σ memory held, MiB.
    pub memory_mib: u64,
}

impl GpuSamples {
    /// Mean utilization, percent of the GPU.
    pub fn mean_utilization_pct(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.utilization_milli as f64 / self.samples as f64 / 10.0
        }
    }

    /// Mean memory held, MiB.
    pub fn mean_memory_mib(&self) -> u64 {
        self.memory_mib.checked_div(self.samples).unwrap_or(0)
    }
}

/// What the sampler saw.
#[derive(Debug, Clone, Default)]
pub struct GpuUsage {
    /// By (node, GPU index).
    pub gpus: BTreeMap<(String, u32), GpuSamples>,
    /// The latest swap counts of each node's agent.
    pub swaps: BTreeMap<String, SwapCounts>,
}

impl GpuUsage {
    /// Adds one listing of agents.
    pub fn add(&mut self, reports: &[AgentReport]) {
        for r in reports {
            self.swaps.insert(r.node.clone(), r.swaps);
            let Some(h) = &r.heartbeat else { continue };
            for g in &h.gpus {
                let s = self.gpus.entry((r.node.clone(), g.index)).or_default();
                s.samples += 1;
                s.utilization_milli += u64::from(g.utilization_milli);
                s.memory_mib += g.memory_used_mib;
            }
        }
    }

    /// Every agent connected to some replica, from one listing per replica.
    pub fn listing(api: &ApiClient, operator: &str) -> Vec<AgentReport> {
        let mut all = Vec::new();
        for &addr in api.replicas() {
            if let Ok(v) = ApiClient::call_at(
                addr,
                "GET",
                "/v1/cluster/agents?scope=replica",
                operator,
                None,
            ) {
                if let Ok(list) = serde_json::from_value::<Vec<AgentReport>>(v) {
                    all.extend(list);
                }
            }
        }
        all
    }
}

/// A thread sampling [`GpuUsage`] until stopped.
#[derive(Debug)]
pub struct GpuSampler {
    stop: Arc<AtomicBool>,
    usage: Arc<Mutex<GpuUsage>>,
    thread: Option<JoinHandle<()>>,
}

impl GpuSampler {
    /// Starts sampling the `replicas` with the operator token.
    pub fn start(replicas: Vec<SocketAddr>, operator: String) -> GpuSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let usage = Arc::new(Mutex::new(GpuUsage::default()));
        let (s, u) = (stop.clone(), usage.clone());
        let thread = std::thread::Builder::new()
            .name("up-gpu-sampler".into())
            .spawn(move || {
                let api = ApiClient::new(replicas);
                while !s.load(Ordering::Relaxed) {
                    let list = GpuUsage::listing(&api, &operator);
                    if let Ok(mut u) = u.lock() {
                        u.add(&list);
                    }
                    std::thread::sleep(PERIOD);
                }
            })
            .ok();
        GpuSampler {
            stop,
            usage,
            thread,
        }
    }

    /// Stops sampling; returns what was seen.
    pub fn finish(mut self) -> GpuUsage {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.usage.lock().map(|u| u.clone()).unwrap_or_default()
    }
}
