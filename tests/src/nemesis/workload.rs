//! The clients of a nemesis run, each a thread with its own seeded
//! generator, recording every operation in the [`History`].
//!
//! - `deployer-<n>` (tenant `acme`): deploys functions named
//!   `d<n>-<i>`, updates their `deadline_ms` and deletes them, each under
//!   its own idempotency key, retried with that key through random
//!   replicas until a definite answer or [`OP_DEADLINE`]. A function is
//!   touched only by its deployer, one operation at a time, so its final
//!   state can be checked as a register.
//! - `invoker-<n>` (tenant `globex`): invokes `steady` under a fresh key,
//!   through a random replica (each retry through a random replica) or
//!   through one agent's ingress (retries to that agent: a key is the
//!   agent's own).
//! - `admin`: creates tenants `t<i>` (a retry that meets `409
//!   duplicate_name` is the first attempt's success) and issues tokens of
//!   `acme`.
//! - `sampler`: reads `GET /v1/cluster/state` of a random replica and
//!   checks quotas and GPU capacity on it (`RegionState::check_invariants`);
//!   a broken sample is recorded as a failed [`OpKind::Sample`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gshare_core::rng::Rng;
use gshare_core::state::RegionState;
use gshare_region::http_client::{request_with, HttpReply};
use serde_json::json;

use super::cluster::STEADY;
use super::history::{classify, Attempt, History, Op, OpKind, Outcome, Resolution};
use crate::TOKEN;

/// How long one op is retried before it is given up as it stands.
pub const OP_DEADLINE: Duration = Duration::from_secs(15);
/// One attempt's socket timeout (longer than most pauses are not: a
/// paused replica's attempt becomes unknown and the op moves on).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(4);

/// Where the clients send.
#[derive(Debug, Clone)]
pub struct Targets {
    /// Replicas' HTTP addresses.
    pub replicas: Vec<SocketAddr>,
    /// Agents' ingress addresses.
    pub agents: Vec<SocketAddr>,
    /// A token of `acme`.
    pub acme: String,
    /// A token of `globex`.
    pub globex: String,
}

impl Targets {
    /// `r<id>` for a replica, `agent<i>` for an agent's ingress.
    pub fn label(&self, addr: SocketAddr) -> String {
        if let Some(i) = self.replicas.iter().position(|a| *a == addr) {
            return format!("r{}", i + 1);
        }
        if let Some(i) = self.agents.iter().position(|a| *a == addr) {
            return format!("agent{i}");
        }
        addr.to_string()
    }
}

/// One HTTP request of an op.
pub struct Request<'a> {
    /// Method.
    pub method: &'a str,
    /// Path.
    pub path: &'a str,
    /// Bearer token.
    pub token: &'a str,
    /// `Idempotency-Key`, if any.
    pub key: Option<&'a str>,
    /// JSON body.
    pub body: Option<&'a str>,
    /// Error codes that mean this op's success (a retry's
    /// `duplicate_name` after a lost answer).
    pub ok_codes: &'a [&'a str],
}

/// Sends `req` to `pick_addr()` until the op is settled or `deadline`
/// passes (an op in flight when the run stops is still settled).
pub fn settle(
    req: &Request<'_>,
    deadline: Duration,
    mut pick_addr: impl FnMut() -> SocketAddr,
    t: &Targets,
) -> Resolution {
    let until = Instant::now() + deadline;
    let mut res = Resolution::default();
    loop {
        let headers: Vec<(&str, &str)> = req
            .key
            .map(|k| ("Idempotency-Key", k))
            .into_iter()
            .collect();
        let to = pick_addr();
        let answer = request_with(
            to,
            req.method,
            req.path,
            Some(req.token),
            &headers,
            req.body,
            ATTEMPT_TIMEOUT,
        )
        .map(|(r, headers)| HttpReply { headers, ..r });
        let mut attempt = classify(&answer);
        if let (Attempt::Definite { code, .. }, Ok(r)) = (&attempt, &answer) {
            if req.ok_codes.contains(&code.as_str()) {
                attempt = Attempt::Ok(r.body.clone());
            }
        }
        let again = res.add_at(&t.label(to), attempt);
        if !again || Instant::now() > until {
            return res;
        }
        std::thread::sleep(Duration::from_millis(150));
    }
}

fn run_op(
    h: &History,
    client: &str,
    kind: OpKind,
    target: &str,
    args: String,
    resolve: impl FnOnce() -> Resolution,
) -> Outcome {
    let start_ms = h.now_ms();
    let res = resolve();
    let attempts = res.attempts;
    let trail = res.trail.clone();
    let outcome = res.outcome();
    h.record(Op {
        client: client.to_string(),
        kind,
        target: target.to_string(),
        args,
        start_ms,
        end_ms: h.now_ms(),
        attempts,
        trail,
        outcome: outcome.clone(),
    });
    outcome
}

/// The body of an `acme` function `name` with `deadline_ms`.
pub fn function_body(name: &str, deadline_ms: u64) -> String {
    json!({
        "name": name, "runtime": "pytorch", "memory_mib": 2000, "compute_milli": 400,
        "tier": "guaranteed", "deadline_ms": deadline_ms, "pool": "center",
        "min_instances": 1, "max_instances": 1,
        "latency": {"full_gpu_us": 2000, "saturation_milli": 400},
    })
    .to_string()
}

/// The running clients; [`Clients::stop`] ends them.
pub struct Clients {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// States sampled so far.
    pub samples: Arc<AtomicU64>,
}

impl Clients {
    /// Starts `deployers` deployers, `invokers` invokers, the admin and
    /// the sampler.
    pub fn start(
        seed: u64,
        t: &Targets,
        h: &History,
        deployers: usize,
        invokers: usize,
    ) -> Clients {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        for n in 0..deployers {
            let (t, h, stop) = (t.clone(), h.clone(), stop.clone());
            let rng = Rng::new(seed.wrapping_mul(31).wrapping_add(n as u64 + 1));
            threads.push(std::thread::spawn(move || deployer(n, rng, &t, &h, &stop)));
        }
        for n in 0..invokers {
            let (t, h, stop) = (t.clone(), h.clone(), stop.clone());
            let rng = Rng::new(seed.wrapping_mul(37).wrapping_add(n as u64 + 1));
            threads.push(std::thread::spawn(move || {
                invoker(seed, n, rng, &t, &h, &stop)
            }));
        }
        {
            let (t, h, stop) = (t.clone(), h.clone(), stop.clone());
            let rng = Rng::new(seed.wrapping_mul(41).wrapping_add(1));
            threads.push(std::thread::spawn(move || admin(rng, &t, &h, &stop)));
        }
        {
            let (t, h, stop, samples) = (t.clone(), h.clone(), stop.clone(), samples.clone());
            let rng = Rng::new(seed.wrapping_mul(43).wrapping_add(1));
            threads.push(std::thread::spawn(move || {
                sampler(rng, &t, &h, &stop, &samples)
            }));
        }
        Clients {
            stop,
            threads,
            samples,
        }
    }

    /// Stops the clients after their current op and waits for them.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn random_of(rng: &mut Rng, xs: &[SocketAddr]) -> SocketAddr {
    xs[rng.below(xs.len() as u64) as usize]
}

fn pace(rng: &mut Rng) {
    std::thread::sleep(Duration::from_millis(50 + rng.below(150)));
}

fn deployer(n: usize, mut rng: Rng, t: &Targets, h: &History, stop: &AtomicBool) {
    let client = format!("deployer-{n}");
    // Functions this deployer may have (deployed, not known deleted).
    let mut live: Vec<String> = Vec::new();
    let mut next = 0u32;
    let mut op = 0u32;
    while !stop.load(Ordering::Relaxed) {
        op += 1;
        let key = format!("{client}-op{op}");
        let mut pick_rng = rng.clone();
        let _ = rng.next_u64();
        let pick = || random_of(&mut pick_rng, &t.replicas);
        let choice = rng.below(10);
        if live.is_empty() || choice < 4 {
            let name = format!("d{n}-{next}");
            next += 1;
            let deadline = 100 + rng.below(1_900);
            let body = function_body(&name, deadline);
            let req = Request {
                method: "POST",
                path: "/v1/functions",
                token: &t.acme,
                key: Some(&key),
                body: Some(&body),
                ok_codes: &[],
            };
            let target = format!("acme/{name}");
            let out = run_op(
                h,
                &client,
                OpKind::Deploy,
                &target,
                format!(" deadline_ms={deadline} key={key}"),
                || settle(&req, OP_DEADLINE, pick, t),
            );
            if !matches!(out, Outcome::Fail(_)) {
                live.push(name);
            }
        } else {
            let i = rng.below(live.len() as u64) as usize;
            let name = live[i].clone();
            let path = format!("/v1/functions/{name}");
            let target = format!("acme/{name}");
            if choice < 7 {
                let deadline = 100 + rng.below(1_900);
                let body = function_body(&name, deadline);
                let req = Request {
                    method: "PUT",
                    path: &path,
                    token: &t.acme,
                    key: Some(&key),
                    body: Some(&body),
                    ok_codes: &[],
                };
                run_op(
                    h,
                    &client,
                    OpKind::Update,
                    &target,
                    format!(" deadline_ms={deadline} key={key}"),
                    || settle(&req, OP_DEADLINE, pick, t),
                );
            } else {
                let req = Request {
                    method: "DELETE",
                    path: &path,
                    token: &t.acme,
                    key: Some(&key),
                    body: None,
                    ok_codes: &[],
                };
                let out = run_op(
                    h,
                    &client,
                    OpKind::Delete,
                    &target,
                    format!(" key={key}"),
                    || settle(&req, OP_DEADLINE, pick, t),
                );
                if out.is_ok() {
                    live.remove(i);
                }
            }
        }
        pace(&mut rng);
    }
}

fn invoker(seed: u64, n: usize, mut rng: Rng, t: &Targets, h: &History, stop: &AtomicBool) {
    let client = format!("invoker-{n}");
    let path = format!("/v1/invoke/globex/{STEADY}");
    let mut i = 0u32;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let key = format!("s{seed}-{client}-{i}");
        let req = Request {
            method: "POST",
            path: &path,
            token: &t.globex,
            key: Some(&key),
            body: Some("{}"),
            ok_codes: &[],
        };
        let through_agent = rng.below(10) < 3;
        let mut pick_rng = rng.clone();
        let _ = rng.next_u64();
        if through_agent {
            let a = rng.below(t.agents.len() as u64) as usize;
            let addr = t.agents[a];
            run_op(
                h,
                &client,
                OpKind::Invoke,
                &key,
                format!(" via agent {a}"),
                || settle(&req, OP_DEADLINE, || addr, t),
            );
        } else {
            run_op(
                h,
                &client,
                OpKind::Invoke,
                &key,
                " via replicas".to_string(),
                || {
                    settle(
                        &req,
                        OP_DEADLINE,
                        || random_of(&mut pick_rng, &t.replicas),
                        t,
                    )
                },
            );
        }
        pace(&mut rng);
    }
}

fn admin(mut rng: Rng, t: &Targets, h: &History, stop: &AtomicBool) {
    let mut i = 0u32;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let mut pick_rng = rng.clone();
        let _ = rng.next_u64();
        let pick = || random_of(&mut pick_rng, &t.replicas);
        if rng.below(3) == 0 {
            let req = Request {
                method: "POST",
                path: "/v1/tenants/acme/tokens",
                token: TOKEN,
                key: None,
                body: None,
                ok_codes: &[],
            };
            run_op(
                h,
                "admin",
                OpKind::IssueToken,
                "acme",
                String::new(),
                || settle(&req, OP_DEADLINE, pick, t),
            );
        } else {
            create_tenant(h, "admin", &format!("t{i}"), t, OP_DEADLINE, pick);
        }
        pace(&mut rng);
    }
}

/// Creates tenant `name` (display name `v-<name>`), recorded as `client`'s op.
pub fn create_tenant(
    h: &History,
    client: &str,
    name: &str,
    t: &Targets,
    deadline: Duration,
    pick: impl FnMut() -> SocketAddr,
) -> Outcome {
    let body = json!({"name": name, "display_name": format!("v-{name}")}).to_string();
    let req = Request {
        method: "POST",
        path: "/v1/tenants",
        token: TOKEN,
        key: None,
        body: Some(&body),
        ok_codes: &["duplicate_name"],
    };
    run_op(h, client, OpKind::CreateTenant, name, String::new(), || {
        settle(&req, deadline, pick, t)
    })
}

/// Invokes `globex/steady` under `key` through the replicas, recorded as
/// `client`'s op.
pub fn invoke_once(
    h: &History,
    client: &str,
    key: &str,
    t: &Targets,
    deadline: Duration,
    pick: impl FnMut() -> SocketAddr,
) -> Outcome {
    let path = format!("/v1/invoke/globex/{STEADY}");
    let req = Request {
        method: "POST",
        path: &path,
        token: &t.globex,
        key: Some(key),
        body: Some("{}"),
        ok_codes: &[],
    };
    run_op(
        h,
        client,
        OpKind::Invoke,
        key,
        " via replicas".into(),
        || settle(&req, deadline, pick, t),
    )
}

fn sampler(mut rng: Rng, t: &Targets, h: &History, stop: &AtomicBool, samples: &AtomicU64) {
    while !stop.load(Ordering::Relaxed) {
        let i = rng.below(t.replicas.len() as u64) as usize;
        let start_ms = h.now_ms();
        let r = gshare_region::http_client::request(
            t.replicas[i],
            "GET",
            "/v1/cluster/state",
            Some(TOKEN),
            None,
            Duration::from_secs(3),
        );
        if let Ok(r) = r {
            if r.status == 200 {
                samples.fetch_add(1, Ordering::Relaxed);
                let broken = match serde_json::from_str::<RegionState>(&r.body) {
                    Ok(s) => s.check_invariants().err(),
                    Err(e) => Some(format!("state does not decode: {e}")),
                };
                if let Some(why) = broken {
                    h.record(Op {
                        client: "sampler".into(),
                        kind: OpKind::Sample,
                        target: format!("r{}", i + 1),
                        args: String::new(),
                        start_ms,
                        end_ms: h.now_ms(),
                        attempts: 1,
                        trail: Vec::new(),
                        outcome: Outcome::Fail(why),
                    });
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200 + rng.below(400)));
    }
}
