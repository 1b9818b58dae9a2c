//! The demo's invocation load and its deadline attainment.
//!
//! Every demo function gets `clients` closed-loop clients; each sends
//! `POST /v1/invoke/{tenant}/{name}` with `X-Gshare-Deadline-Ms` set to the
//! function's deadline, alternately to the agent hosting it (its ingress)
//! and to a replica (which forwards to the agent over QUIC), then pauses a
//! random time around the function's `think_ms`. An invocation *attains*
//! its deadline when it is answered 200 within the deadline, measured by
//! the client from send to the last byte; every other answer (504
//! `deadline_unreachable`, 429, …) or a late 200 is a miss.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use gshare_core::model::Tier;
use gshare_core::net::http_client::{read_body, HttpClient, HttpError};
use gshare_core::rng::Rng;

use super::demo::DemoFunction;

/// How one invocation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invocation {
    /// HTTP status (0: no answer).
    pub status: u16,
    /// From send to the whole answer.
    pub latency: Duration,
}

/// Largest answer to one demo invocation read, bytes.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Sends one invocation with a deadline on the load's pooled client;
/// gives up 5 s after the deadline. Call from a thread outside any tokio
/// runtime (the load's threads): it blocks on the load's own runtime.
pub fn invoke(
    addr: SocketAddr,
    tenant: &str,
    name: &str,
    token: &str,
    deadline_ms: u64,
) -> Invocation {
    let start = Instant::now();
    let status = send(addr, tenant, name, token, deadline_ms).unwrap_or(0);
    Invocation {
        status,
        latency: start.elapsed(),
    }
}

/// The demo load's HTTP client: the pooled client
/// ([`gshare_core::net::http_client`]), one pool per address, driven by a
/// small tokio runtime of its own that every load thread blocks on (the
/// load's pacing stays plain threads and sleeps).
struct LoadClient {
    runtime: tokio::runtime::Runtime,
    clients: Mutex<HashMap<SocketAddr, HttpClient>>,
}

impl LoadClient {
    /// The process's load client (`None`: its runtime could not start).
    fn shared() -> Option<&'static LoadClient> {
        static SHARED: OnceLock<Option<LoadClient>> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("load-http")
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => Some(LoadClient {
                        runtime,
                        clients: Mutex::new(HashMap::new()),
                    }),
                    Err(e) => {
                        eprintln!("gsharectl up: the load's HTTP runtime did not start: {e}");
                        None
                    }
                }
            })
            .as_ref()
    }

    fn client(&self, addr: SocketAddr) -> HttpClient {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients
            .entry(addr)
            .or_insert_with(|| HttpClient::for_addr(addr, None))
            .clone()
    }
}

/// Why an invocation of the load got no status.
#[derive(Debug, thiserror::Error)]
enum LoadError {
    #[error("the load's HTTP runtime is not running")]
    NoRuntime,
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

fn send(
    addr: SocketAddr,
    tenant: &str,
    name: &str,
    token: &str,
    deadline_ms: u64,
) -> Result<u16, LoadError> {
    let load = LoadClient::shared().ok_or(LoadError::NoRuntime)?;
    let client = load.client(addr);
    let timeout = Duration::from_millis(deadline_ms).saturating_add(Duration::from_secs(5));
    let path = format!("/v1/invoke/{tenant}/{name}");
    let auth = format!("Bearer {token}");
    let deadline = deadline_ms.to_string();
    let headers: [(&str, &[u8]); 3] = [
        ("authorization", auth.as_bytes()),
        ("x-gshare-deadline-ms", deadline.as_bytes()),
        ("content-type", b"application/json"),
    ];
    let body = b"{\"demo\":true}".to_vec();
    load.runtime.block_on(async {
        let answer = async {
            let (head, body) = client.open("POST", &path, &headers, body).await?;
            // The demo's answers are small; an endless one is an error, not a leak.
            read_body(body, MAX_ANSWER_BYTES).await?;
            Ok::<_, HttpError>(head.status)
        };
        tokio::time::timeout(timeout, answer)
            .await
            .map_err(|_| LoadError::TimedOut(timeout))?
            .map_err(LoadError::from)
    })
}

/// Counts of one tier (or of everything).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attainment {
    /// Invocations answered (any status) or failed.
    pub invocations: u64,
    /// Answered 200 within the deadline.
    pub within: u64,
    /// Answered 200 after the deadline.
    pub late: u64,
    /// Answered with an error status or not at all.
    pub errors: u64,
}

impl Attainment {
    /// Counts one invocation made with `deadline`.
    pub(in crate::cli::up) fn add(&mut self, i: &Invocation, deadline: Duration) {
        self.invocations += 1;
        match i.status {
            200 if i.latency <= deadline => self.within += 1,
            200 => self.late += 1,
            _ => self.errors += 1,
        }
    }

    /// `within / invocations` (0 with no invocations).
    pub fn fraction(&self) -> f64 {
        if self.invocations == 0 {
            0.0
        } else {
            self.within as f64 / self.invocations as f64
        }
    }
}

/// What the load measured.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    /// All invocations.
    pub overall: Attainment,
    /// By tier.
    pub by_tier: BTreeMap<Tier, Attainment>,
    /// By function (`tenant/name`).
    pub by_function: BTreeMap<String, Attainment>,
    /// Error answers by status.
    pub statuses: BTreeMap<u16, u64>,
    /// How long the load ran.
    pub elapsed: Duration,
    /// Each invocation of the targets with [`Target::traced`], with the
    /// function (`tenant/name`) and when it was sent.
    pub traced: Vec<(String, Instant, Invocation)>,
}

impl LoadReport {
    fn add(&mut self, f: &DemoFunction, i: &Invocation) {
        let d = Duration::from_millis(f.deadline_ms);
        self.overall.add(i, d);
        self.by_tier.entry(f.tier).or_default().add(i, d);
        self.by_function.entry(f.id()).or_default().add(i, d);
        if i.status != 200 {
            *self.statuses.entry(i.status).or_default() += 1;
        }
    }
}

/// One function under load: where to send and with which token.
#[derive(Debug, Clone)]
pub struct Target {
    /// The function.
    pub function: DemoFunction,
    /// Its tenant's token.
    pub token: String,
    /// The ingress of the agent hosting it (`None`: it had no instance
    /// when the load began; its requests all go through the replicas).
    pub ingress: Option<SocketAddr>,
    /// Keep each of its invocations in [`LoadReport::traced`].
    pub traced: bool,
}

/// Runs the load for `duration` (or until `stop` is set) over `targets`,
/// alternating each client's requests between the hosting agent and the
/// `replicas`.
pub fn run(
    targets: &[Target],
    replicas: &[SocketAddr],
    duration: Duration,
    stop: &Arc<AtomicBool>,
) -> LoadReport {
    let report = Arc::new(Mutex::new(LoadReport::default()));
    let start = Instant::now();
    let end = start + duration;
    let mut threads = Vec::new();
    let mut seed = 1u64;
    for t in targets {
        for c in 0..t.function.clients {
            seed += 1;
            let (t, report, stop) = (t.clone(), report.clone(), stop.clone());
            let replicas = replicas.to_vec();
            let spawned = std::thread::Builder::new()
                .name(format!("load-{}", t.function.name))
                .spawn(move || {
                    let mut rng = Rng::new(seed);
                    let mut k = c as usize;
                    while Instant::now() < end && !stop.load(Ordering::Relaxed) {
                        let addr = match t.ingress {
                            Some(a) if k % 2 == 0 || replicas.is_empty() => a,
                            _ if replicas.is_empty() => break,
                            _ => replicas[(k / 2) % replicas.len()],
                        };
                        k += 1;
                        let f = &t.function;
                        let sent = Instant::now();
                        let i = invoke(addr, f.tenant, f.name, &t.token, f.deadline_ms);
                        if let Ok(mut r) = report.lock() {
                            r.add(f, &i);
                            if t.traced {
                                r.traced.push((f.id(), sent, i));
                            }
                        }
                        // Pause uniformly in [think/2, 3·think/2].
                        let pause = f.think_ms / 2 + rng.below(f.think_ms.max(1));
                        std::thread::sleep(Duration::from_millis(pause));
                    }
                });
            if let Ok(h) = spawned {
                threads.push(h);
            }
        }
    }
    for h in threads {
        let _ = h.join();
    }
    let mut r = report.lock().map(|r| r.clone()).unwrap_or_default();
    r.elapsed = start.elapsed();
    r
}

/// Sends one invocation per target with a long deadline (cold starts),
/// retrying while the agent has not got the instance or the token yet;
/// returns the targets that never answered 200 within `timeout`. Targets
/// without an ingress are left out (see [`Target::ingress`]).
///
/// Exclusive functions are warmed first, then the others: an agent's
/// executor chooses the GPU of each load itself, and an exclusive
/// instance needs a GPU nobody else has loaded onto.
pub fn warm_up(targets: &[Target], timeout: Duration, stop: &Arc<AtomicBool>) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    let (first, rest): (Vec<Target>, Vec<Target>) = targets
        .iter()
        .filter(|t| t.ingress.is_some())
        .cloned()
        .partition(|t| t.function.tier == Tier::Exclusive);
    let mut cold = warm_wave(first, deadline, stop);
    cold.extend(warm_wave(rest, deadline, stop));
    cold
}

fn warm_wave(targets: Vec<Target>, deadline: Instant, stop: &Arc<AtomicBool>) -> Vec<String> {
    let threads: Vec<_> = targets
        .into_iter()
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let f = &t.function;
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() || stop.load(Ordering::Relaxed) {
                        return Some(f.id());
                    }
                    // Bounded so that a signal is noticed between attempts.
                    let ms = left.min(Duration::from_secs(30)).as_millis().max(1) as u64;
                    let Some(ingress) = t.ingress else {
                        return Some(f.id());
                    };
                    let i = invoke(ingress, f.tenant, f.name, &t.token, ms);
                    if i.status == 200 {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        })
        .collect();
    threads
        .into_iter()
        .filter_map(|h| h.join().ok().flatten())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_answer_is_an_error_not_a_leak() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut head = [0u8; 1024];
            let _ = s.read(&mut head);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\n");
            let chunk = vec![b'x'; 64 * 1024];
            while s.write_all(&chunk).is_ok() {}
        });
        // A hang guard, not a timing assert.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(invoke(addr, "t", "f", "tok", 1_000));
        });
        let got = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the load client kept reading an endless answer");
        assert_eq!(got.status, 0);
    }

    #[test]
    fn attainment_counts_late_and_failed_invocations_as_misses() {
        let d = Duration::from_millis(100);
        let mut a = Attainment::default();
        let ok = |ms, status| Invocation {
            status,
            latency: Duration::from_millis(ms),
        };
        a.add(&ok(50, 200), d);
        a.add(&ok(100, 200), d);
        a.add(&ok(150, 200), d);
        a.add(&ok(10, 504), d);
        assert_eq!(
            a,
            Attainment {
                invocations: 4,
                within: 2,
                late: 1,
                errors: 1
            }
        );
        assert_eq!(a.fraction(), 0.5);
        assert_eq!(Attainment::default().fraction(), 0.0);
    }
}
