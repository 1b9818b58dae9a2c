//! A function's instances as the replicated state lists them, read by
//! `gsharectl up` as a client (the operator's
//! `GET /v1/tenants/{t}/functions/{name}` on any replica), and a sampler
//! that records how their count changes over time.
//!
//! ```text
//!  InstanceWatch thread ── every PERIOD ──▶ GET /v1/tenants/{t}/functions/{name}
//!        │                                      (each watched function)
//!        └─ samples: (time since start, instances, resident) ─▶ Trace ─▶ report
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::api_client::{ApiClient, CallError};

/// Sampling period of [`InstanceWatch`].
const PERIOD: Duration = Duration::from_millis(250);

/// One instance as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceSeen {
    /// Its id (`i-<id>`).
    pub id: u64,
    /// The node of its first slice (empty if it has none).
    pub node: String,
    /// Its state (`placed`, `assigned`, `cold`, `loading`, `resident`,
    /// `swapped_out`; empty if the answer had none).
    pub state: String,
    /// It runs an earlier version (a rolling update replaces it).
    pub outgoing: bool,
}

impl InstanceSeen {
    /// Its weights are loaded on a GPU: it has served or is serving.
    pub fn resident(&self) -> bool {
        self.state == "resident"
    }

    /// Its agent reports it (`cold`, `loading`, `resident`,
    /// `swapped_out`): the agent has it, not just the replicated state.
    pub fn hosted(&self) -> bool {
        matches!(
            self.state.as_str(),
            "cold" | "loading" | "resident" | "swapped_out"
        )
    }
}

/// `tenant/name`'s instances now, from whichever replica answers.
pub fn instances_of(
    api: &ApiClient,
    operator: &str,
    tenant: &str,
    name: &str,
) -> Result<Vec<InstanceSeen>, CallError> {
    function_of(api, operator, tenant, name).map(|f| f.instances)
}

/// A function's instances and its migrations in progress, as listed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FunctionSeen {
    /// Its instances.
    pub instances: Vec<InstanceSeen>,
    /// Its migrations in progress (`migrations` of the view).
    pub migrations: usize,
}

/// `tenant/name`'s instances and migrations now, from whichever replica
/// answers.
pub fn function_of(
    api: &ApiClient,
    operator: &str,
    tenant: &str,
    name: &str,
) -> Result<FunctionSeen, CallError> {
    let v = api.call(
        "GET",
        &format!("/v1/tenants/{tenant}/functions/{name}"),
        operator,
        None,
    )?;
    let instances = v["instances"]
        .as_array()
        .map(|is| {
            is.iter()
                .map(|i| InstanceSeen {
                    id: i["instance"].as_u64().unwrap_or_default(),
                    node: i["slices"][0]["gpu"]["node"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    state: i["state"].as_str().unwrap_or_default().to_string(),
                    outgoing: i["outgoing"].as_bool().unwrap_or(false),
                })
                .collect()
        })
        .unwrap_or_default();
    let migrations = v["migrations"].as_array().map_or(0, Vec::len);
    Ok(FunctionSeen {
        instances,
        migrations,
    })
}

/// One sample of a function's instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Since the watch started.
    pub at: Duration,
    /// Instances listed.
    pub instances: usize,
    /// Of them, `resident`.
    pub resident: usize,
}

/// The samples of one function, oldest first (failed reads left out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// The samples.
    pub samples: Vec<Sample>,
}

impl Trace {
    /// The first count seen.
    pub fn first(&self) -> Option<usize> {
        self.samples.first().map(|s| s.instances)
    }

    /// The highest count seen, and when it was first seen.
    pub fn peak(&self) -> Option<(usize, Duration)> {
        let max = self.samples.iter().map(|s| s.instances).max()?;
        let at = self.samples.iter().find(|s| s.instances == max)?.at;
        Some((max, at))
    }

    /// The first time the count was 0 after it had been above 0.
    pub fn reached_zero(&self) -> Option<Duration> {
        let above = self.samples.iter().position(|s| s.instances > 0)?;
        self.samples[above..]
            .iter()
            .find(|s| s.instances == 0)
            .map(|s| s.at)
    }
}

/// Samples the instance counts of some functions in a thread until
/// [`InstanceWatch::finish`].
pub struct InstanceWatch {
    started: Instant,
    stop: Arc<AtomicBool>,
    traces: Arc<Mutex<BTreeMap<String, Trace>>>,
    thread: Option<JoinHandle<()>>,
}

impl InstanceWatch {
    /// Starts sampling `functions` (`(tenant, name)`) through `replicas`
    /// with the `operator` token.
    pub fn start(
        replicas: Vec<SocketAddr>,
        operator: String,
        functions: Vec<(String, String)>,
    ) -> Self {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let traces = Arc::new(Mutex::new(BTreeMap::new()));
        let (s, t) = (stop.clone(), traces.clone());
        let thread = std::thread::Builder::new()
            .name("up-instance-watch".into())
            .spawn(move || {
                let api = ApiClient::new(replicas);
                while !s.load(Ordering::Relaxed) {
                    for (tenant, name) in &functions {
                        let Ok(seen) = instances_of(&api, &operator, tenant, name) else {
                            continue;
                        };
                        let sample = Sample {
                            at: started.elapsed(),
                            instances: seen.len(),
                            resident: seen.iter().filter(|i| i.resident()).count(),
                        };
                        if let Ok(mut t) = t.lock() {
                            t.entry(format!("{tenant}/{name}"))
                                .or_insert_with(Trace::default)
                                .samples
                                .push(sample);
                        }
                    }
                    std::thread::sleep(PERIOD);
                }
            })
            .ok();
        Self {
            started,
            stop,
            traces,
            thread,
        }
    }

    /// When it started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Stops sampling; the trace of each function (`tenant/name`).
    pub fn finish(mut self) -> BTreeMap<String, Trace> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
        self.traces.lock().map(|t| t.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(counts: &[usize]) -> Trace {
        Trace {
            samples: counts
                .iter()
                .enumerate()
                .map(|(k, &n)| Sample {
                    at: Duration::from_secs(k as u64),
                    instances: n,
                    resident: n,
                })
                .collect(),
        }
    }

    #[test]
    fn a_trace_reports_its_peak_and_the_first_zero_after_serving() {
        let t = trace(&[0, 1, 2, 3, 3, 1, 0, 1]);
        assert_eq!(t.first(), Some(0));
        assert_eq!(t.peak(), Some((3, Duration::from_secs(3))));
        // The 0 before the first instance is a start at zero, not a
        // scale to zero.
        assert_eq!(t.reached_zero(), Some(Duration::from_secs(6)));
        assert_eq!(trace(&[0, 0]).reached_zero(), None);
        assert_eq!(trace(&[1, 2, 1]).reached_zero(), None);
        assert_eq!(Trace::default().peak(), None);
    }
}
