//! Closed-loop clients of one function over HTTP through the replicas,
//! whose number a scenario changes while they run, and what each
//! invocation got, as the client measured it.
//!
//! Each client sends `POST /v1/invoke/{tenant}/{name}` with
//! `X-Gshare-Deadline-Ms` (the demo load's [`load::invoke`]) to the
//! replicas in turn, then pauses uniformly in `[think/2, 3·think/2]`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gshare_core::rng::Rng;

use super::super::load::{self, Attainment, Invocation};

/// What clients send to.
#[derive(Debug, Clone)]
pub struct Aim {
    /// Tenant.
    pub tenant: String,
    /// Function.
    pub name: String,
    /// The tenant's token.
    pub token: String,
    /// Deadline sent with each request, ms.
    pub deadline_ms: u64,
    /// Mean pause between two requests of a client, ms.
    pub think_ms: u64,
}

/// One invocation as its client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// When it was sent, since the crowd was created.
    pub sent: Duration,
    /// Status and latency.
    pub outcome: Invocation,
}

/// Counts over records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Deadline attainment (invocations, within, late, errors).
    pub attainment: Attainment,
    /// Answered 200.
    pub served: u64,
    /// Not answered at all (no HTTP answer: lost).
    pub lost: u64,
}

impl Tally {
    /// Adds one invocation made with `deadline`.
    pub fn add(&mut self, i: &Invocation, deadline: Duration) {
        self.attainment.add(i, deadline);
        match i.status {
            200 => self.served += 1,
            0 => self.lost += 1,
            _ => {}
        }
    }

    /// Adds every record.
    pub fn of(records: &[Record], deadline: Duration) -> Self {
        let mut t = Self::default();
        for r in records {
            t.add(&r.outcome, deadline);
        }
        t
    }

    /// Invocations not answered 200 (an error status or no answer).
    pub fn failed(&self) -> u64 {
        self.attainment.invocations.saturating_sub(self.served)
    }
}

/// The answers other than 200 among `records`, as `502×2 0×1` (status 0:
/// no answer); empty when there are none.
pub fn failures(records: &[Record]) -> String {
    let mut by: std::collections::BTreeMap<u16, u64> = std::collections::BTreeMap::new();
    for r in records.iter().filter(|r| r.outcome.status != 200) {
        *by.entry(r.outcome.status).or_default() += 1;
    }
    by.iter()
        .map(|(s, n)| format!("{s}×{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Running clients of one [`Aim`].
pub struct Crowd {
    aim: Aim,
    replicas: Vec<SocketAddr>,
    created: Instant,
    records: Arc<Mutex<Vec<Record>>>,
    clients: Vec<(Arc<AtomicBool>, JoinHandle<()>)>,
}

impl Crowd {
    /// No clients yet.
    pub fn new(aim: Aim, replicas: Vec<SocketAddr>) -> Self {
        Self {
            aim,
            replicas,
            created: Instant::now(),
            records: Arc::new(Mutex::new(Vec::new())),
            clients: Vec::new(),
        }
    }

    /// When it was created (the origin of [`Record::sent`]).
    pub fn created(&self) -> Instant {
        self.created
    }

    /// Clients running.
    pub fn clients(&self) -> usize {
        self.clients.len()
    }

    /// Grows to `n` clients (never shrinks).
    pub fn grow_to(&mut self, n: usize) {
        while self.clients.len() < n {
            let k = self.clients.len();
            let stop = Arc::new(AtomicBool::new(false));
            let (s, records, aim) = (stop.clone(), self.records.clone(), self.aim.clone());
            let replicas = self.replicas.clone();
            let created = self.created;
            let spawned = std::thread::Builder::new()
                .name(format!("scenario-client-{k}"))
                .spawn(move || {
                    let mut rng = Rng::new(0x5ce0 + k as u64);
                    let mut turn = k;
                    while !s.load(Ordering::Relaxed) && !replicas.is_empty() {
                        let addr = replicas[turn % replicas.len()];
                        turn += 1;
                        let sent = created.elapsed();
                        let outcome =
                            load::invoke(addr, &aim.tenant, &aim.name, &aim.token, aim.deadline_ms);
                        if let Ok(mut r) = records.lock() {
                            r.push(Record { sent, outcome });
                        }
                        let pause = aim.think_ms / 2 + rng.below(aim.think_ms.max(1));
                        std::thread::sleep(Duration::from_millis(pause));
                    }
                });
            match spawned {
                Ok(h) => self.clients.push((stop, h)),
                Err(_) => return,
            }
        }
    }

    /// The records so far.
    pub fn records(&self) -> Vec<Record> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Stops every client after its invocation in flight is answered;
    /// returns all records.
    pub fn finish(mut self) -> Vec<Record> {
        for (stop, _) in &self.clients {
            stop.store(true, Ordering::Relaxed);
        }
        for (_, h) in self.clients.drain(..) {
            let _ = h.join();
        }
        self.records()
    }
}

impl Drop for Crowd {
    fn drop(&mut self) {
        for (stop, _) in &self.clients {
            stop.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_counts_served_failed_and_lost_apart() {
        let d = Duration::from_millis(100);
        let r = |status, ms| Record {
            sent: Duration::ZERO,
            outcome: Invocation {
                status,
                latency: Duration::from_millis(ms),
            },
        };
        let t = Tally::of(&[r(200, 50), r(200, 150), r(504, 5), r(0, 5000)], d);
        assert_eq!(t.attainment.invocations, 4);
        assert_eq!(t.attainment.within, 1);
        assert_eq!(t.served, 2);
        assert_eq!(t.failed(), 2);
        assert_eq!(t.lost, 1);
    }
}
