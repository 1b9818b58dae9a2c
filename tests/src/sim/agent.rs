//! A simulated node agent: the agent's pure core, driven on simulated time.
//!
//! The same code as the live agent (`edge::agent::NodeAgent`) for:
//! - the assignment's reconciliation: [`plan_assignment`] (which functions
//!   to add, update and remove; a stale assignment ignored);
//! - the executor: [`NodeExecutor`] (admission, queueing, loads, swaps,
//!   remaps' local half, deadlines, its `next_timeout`);
//! - metering: [`UsageMeter`] (busy compute and residency, split at hours),
//!   fed by the executor's commands through [`Command::weights_changes`];
//! - the journal's numbering: [`JournalSeqs`] (which records are durable
//!   and sendable, what a registration's answer asks).
//!
//! What the actor does around them (carrying out the executor's commands,
//! feeding the meter, writing the journal) is this module's own short
//! version; runtimes are modelled by the executor's own timing (a load is
//! ready at its `ready_at`, a run ends at its `finish_at`).

use std::collections::BTreeMap;

use gshare_core::executor::{
    Command, Event, ExecutorRules, FunctionId, FunctionProfile, LoadCosts, NodeConfig,
    NodeExecutor, RequestId, WeightsChange,
};
use gshare_core::metering::{JournalSeqs, ResidencyId, UsageKey, UsageMeter};
use gshare_core::model::{FunctionSpec, Micros, NodeId, PoolKind};
use gshare_core::protocol::{plan_assignment, Assignment, HostedKey};
use gshare_core::state::UsageRecord;

/// GPUs per simulated node (as in the simulation's topology).
pub const GPUS: u32 = 2;

/// An agent's usage journal: the live journal's numbering on a simulated
/// disk. A record is written (volatile), then durable once a flush that
/// began after it returns; a crash loses what is not durable.
#[derive(Debug, Clone, Default)]
pub struct SimJournal {
    /// The numbering, as `UsageJournal` keeps it.
    pub seqs: Option<JournalSeqs>,
    /// Records written, by seq, with whether they are durable.
    pub held: BTreeMap<u64, (UsageRecord, bool)>,
    /// `m:next_seq` as on disk (written with removals, flushed).
    pub stored_next: u64,
    /// Every durable record ever written and not lost, by seq (what the
    /// region must bill, exactly once).
    pub ledger: BTreeMap<u64, UsageRecord>,
    /// Durable records whose number an earlier durable record had (the
    /// journal handed a number out twice).
    pub reused: Vec<u64>,
    /// Records a crash threw away (written, not durable).
    pub lost: u64,
}

impl SimJournal {
    fn seqs(&mut self) -> &mut JournalSeqs {
        self.seqs.get_or_insert_with(|| JournalSeqs::opened(1, 1))
    }

    /// Writes `records` (not yet durable); returns the end of their numbers.
    pub fn write(&mut self, records: Vec<UsageRecord>) -> Option<u64> {
        let range = self.seqs().numbers(records.len() as u64)?;
        for (seq, mut r) in range.clone().zip(records) {
            r.seq = seq;
            self.held.insert(seq, (r, false));
        }
        self.seqs().taken(range.end);
        Some(range.end)
    }

    /// Makes the records below `end` durable without raising the watermark
    /// (a crash's background flush: the reopened journal finds them).
    fn flushed_only(&mut self, end: u64) {
        for (seq, (r, durable)) in self.held.range_mut(..end) {
            if !*durable {
                *durable = true;
                if self.ledger.insert(*seq, r.clone()).is_some() {
                    self.reused.push(*seq);
                }
            }
        }
    }

    /// A flush begun when the records below `end` were written returned.
    pub fn flushed(&mut self, end: u64) {
        self.flushed_only(end);
        self.seqs().flushed(end);
    }

    /// What may be sent (durable unacked records, oldest first, at most `max`);
    /// with `planted_early` the records still flushing too (a planted bug).
    pub fn batch(&mut self, max: usize, planted_early: bool) -> Vec<UsageRecord> {
        let range = if planted_early {
            Some(0..u64::MAX)
        } else {
            self.seqs().sendable_after(0)
        };
        let Some(range) = range else {
            return Vec::new();
        };
        self.held
            .range(range)
            .take(max)
            .map(|(_, (r, _))| r.clone())
            .collect()
    }

    /// The region acknowledged these records: they leave the journal.
    pub fn ack(&mut self, seqs: &[u64]) {
        for s in seqs {
            self.held.remove(s);
        }
        self.stored_next = self.stored_next.max(self.seqs().next());
    }

    /// The registration's answer: records below `region_next` were applied.
    pub fn reconcile(&mut self, region_next: u64) {
        let plan = self.seqs().reconcile(region_next);
        self.held = self.held.split_off(&plan.applied_below);
        self.stored_next = self.stored_next.max(plan.next);
        self.seqs().taken(plan.next);
    }

    /// A crash: of the records not durable, the first `keep` (in number
    /// order) reached the disk anyway and the rest are lost; the journal
    /// reopens after the highest number on disk.
    pub fn crash(&mut self, keep: usize) {
        let volatile: Vec<u64> = self
            .held
            .iter()
            .filter(|(_, (_, durable))| !*durable)
            .map(|(s, _)| *s)
            .collect();
        if let Some(last) = keep.checked_sub(1).and_then(|i| volatile.get(i)) {
            self.flushed_only(last + 1);
        }
        let before = self.held.len();
        self.held.retain(|_, (_, durable)| *durable);
        self.lost += (before - self.held.len()) as u64;
        let after_last = self.held.keys().next_back().map_or(1, |s| s + 1);
        self.seqs = Some(JournalSeqs::opened(self.stored_next.max(1), after_last));
    }

    /// Whether everything written was acknowledged.
    pub fn drained(&self) -> bool {
        self.held.is_empty()
    }
}

/// A completion the driver must deliver to the executor at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    /// When (the executor's µs).
    pub at: Micros,
    /// What.
    pub event: Event,
}

/// The pure core of one agent.
pub struct SimAgent {
    /// Its node.
    pub node: NodeId,
    executor: NodeExecutor,
    hosted: BTreeMap<HostedKey, (FunctionId, FunctionSpec)>,
    by_id: BTreeMap<FunctionId, HostedKey>,
    next_function: u32,
    next_request: u64,
    assignment_index: Option<u64>,
    meter: UsageMeter,
    /// Requests arrived and not yet answered (run to the end or rejected).
    pub outstanding: BTreeMap<RequestId, FunctionId>,
    /// Requests answered: (finished, rejected).
    pub answered: (u64, u64),
    /// Requests running: their function, slice (milli-GPU) and start (Unix µs).
    running: BTreeMap<RequestId, (FunctionId, u64, u64)>,
}

fn config() -> NodeConfig {
    NodeConfig {
        gpus: GPUS,
        gpu_memory_mib: 81_920,
        host_memory_mib: 262_144,
        load: LoadCosts {
            h2d_mib_per_s: 25_000,
            swap_setup_us: 2_000,
            cold_setup_us: 500_000,
            storage_mib_per_s: 2_000,
        },
        rules: ExecutorRules::gshare(),
    }
}

fn key_of(spec: &FunctionSpec) -> UsageKey {
    UsageKey {
        tenant: spec.tenant.clone(),
        function: spec.name.clone(),
        tier: spec.tier,
        gpu_model: "sim-80g".into(),
        pool_kind: PoolKind::Center,
    }
}

fn residency(f: FunctionId, gpu: u32) -> ResidencyId {
    ResidencyId(u64::from(f.0) << 8 | u64::from(gpu))
}

impl SimAgent {
    /// A freshly started agent on `node` (nothing hosted, nothing metered).
    pub fn new(node: NodeId) -> SimAgent {
        SimAgent {
            node,
            executor: NodeExecutor::new(config()),
            hosted: BTreeMap::new(),
            by_id: BTreeMap::new(),
            next_function: 0,
            next_request: 0,
            assignment_index: None,
            meter: UsageMeter::new(),
            outstanding: BTreeMap::new(),
            answered: (0, 0),
            running: BTreeMap::new(),
        }
    }

    /// The functions hosted, by key.
    pub fn hosted(&self) -> impl Iterator<Item = &HostedKey> + '_ {
        self.hosted.keys()
    }

    /// Feeds `event` at `now` and carries out the executor's commands;
    /// `unix_us` stamps the meter. Returns the completions to deliver later.
    pub fn step(&mut self, now: Micros, unix_us: u64, event: Event) -> Vec<Due> {
        self.executor.handle(now, event);
        let mut due = Vec::new();
        for cmd in self.executor.take_commands() {
            // The meter follows the weights, by the live agent's rule.
            for change in cmd.weights_changes() {
                match change {
                    WeightsChange::Joined { function, gpu } => {
                        if let Some(spec) = self.spec_of(function).cloned() {
                            self.meter.resident_start(
                                residency(function, gpu),
                                key_of(&spec),
                                spec.memory_mib,
                                unix_us,
                            );
                        }
                    }
                    WeightsChange::Left { function, gpu } => {
                        self.meter.resident_stop(residency(function, gpu), unix_us);
                    }
                }
            }
            match cmd {
                Command::Run {
                    request,
                    function,
                    gpu,
                    compute_milli,
                    finish_at,
                } => {
                    // Metered when it ends, from when it started (as the
                    // live agent meters an answered request).
                    self.running
                        .insert(request, (function, u64::from(compute_milli), unix_us));
                    due.push(Due {
                        at: finish_at,
                        event: Event::RequestFinished { request, gpu },
                    });
                }
                Command::ColdStart {
                    function,
                    gpu,
                    ready_at,
                }
                | Command::SwapIn {
                    function,
                    gpu,
                    ready_at,
                } => due.push(Due {
                    at: ready_at,
                    event: Event::LoadFinished { function, gpu },
                }),
                Command::Move {
                    function,
                    to,
                    ready_at,
                    ..
                } => due.push(Due {
                    at: ready_at,
                    event: Event::LoadFinished { function, gpu: to },
                }),
                Command::SwapOut { .. } | Command::Unload { .. } => {}
                Command::Reject { request, .. } => {
                    if self.outstanding.remove(&request).is_some() {
                        self.answered.1 += 1;
                    }
                }
                // No region in this loop: reservations are never granted
                // (the executor's remap waits, then times out).
                Command::Reserve { .. } | Command::Release { .. } => {}
            }
        }
        if let Event::RequestFinished { request, .. } = event {
            if let Some((function, compute, start)) = self.running.remove(&request) {
                if let Some(spec) = self.spec_of(function) {
                    self.meter
                        .invocation(&key_of(spec), compute, start, unix_us.max(start));
                }
            }
            if self.outstanding.remove(&request).is_some() {
                self.answered.0 += 1;
            }
        }
        due
    }

    fn spec_of(&self, f: FunctionId) -> Option<&FunctionSpec> {
        let key = self.by_id.get(&f)?;
        self.hosted.get(key).map(|(_, s)| s)
    }

    /// Applies an assignment (ignored if older than the last applied).
    pub fn assign(&mut self, now: Micros, unix_us: u64, a: Assignment) -> Vec<Due> {
        let hosted = self.hosted.iter().map(|(k, (_, s))| (k, s));
        let Some(plan) = plan_assignment(self.assignment_index, &self.node, a, hosted) else {
            return Vec::new();
        };
        self.assignment_index = Some(plan.index);
        let mut due = Vec::new();
        for key in &plan.stale {
            if let Some((id, _)) = self.hosted.remove(key) {
                due.extend(self.step(now, unix_us, Event::InstanceParked { function: id }));
                due.extend(self.step(now, unix_us, Event::InstanceRemoved { function: id }));
                self.by_id.remove(&id);
            }
        }
        for (key, w) in plan.wanted {
            if self.hosted.contains_key(&key) {
                continue;
            }
            let id = FunctionId(self.next_function);
            self.next_function += 1;
            let profile = FunctionProfile {
                tier: w.spec.tier,
                memory_mib: w.spec.memory_mib,
                saturation_milli: w.spec.latency.saturation_milli,
                batch_ppm: 0,
            };
            self.hosted.insert(key.clone(), (id, w.spec));
            self.by_id.insert(id, key);
            due.extend(self.step(
                now,
                unix_us,
                Event::InstanceAdded {
                    function: id,
                    profile,
                },
            ));
        }
        due
    }

    /// One request for the `pick`-th hosted function (none hosted: nothing).
    pub fn invoke(&mut self, now: Micros, unix_us: u64, pick: u64, work_us: Micros) -> Vec<Due> {
        if self.hosted.is_empty() {
            return Vec::new();
        }
        let i = (pick % self.hosted.len() as u64) as usize;
        let Some((_, (function, spec))) = self.hosted.iter().nth(i) else {
            return Vec::new();
        };
        let (function, deadline_ms) = (*function, spec.deadline_ms);
        let request = RequestId(self.next_request);
        self.next_request += 1;
        self.outstanding.insert(request, function);
        self.step(
            now,
            unix_us,
            Event::RequestArrived {
                request,
                function,
                full_gpu_us: work_us,
                deadline: now + deadline_ms.max(1) * 1_000 + work_us,
            },
        )
    }

    /// When the executor next needs a [`Event::Timer`].
    pub fn next_timeout(&self) -> Option<Micros> {
        self.executor.next_timeout()
    }

    /// Usage metered so far, as records to journal (memory closed at `unix_us`).
    pub fn take_usage(&mut self, unix_us: u64) -> Vec<UsageRecord> {
        self.meter
            .take_all(unix_us)
            .into_iter()
            .map(|d| d.into_record())
            .collect()
    }

    /// Whether the hosted functions are exactly those `a` assigns.
    pub fn matches(&self, a: Assignment) -> Result<(), String> {
        let hosted = self.hosted.iter().map(|(k, (_, s))| (k, s));
        let plan = plan_assignment(None, &self.node, a, hosted).ok_or("stale")?;
        let want: Vec<&HostedKey> = plan.wanted.keys().collect();
        let have: Vec<&HostedKey> = self.hosted.keys().collect();
        if plan.stale.is_empty() && want == have {
            Ok(())
        } else {
            Err(format!("hosts {have:?}, assigned {want:?}"))
        }
    }
}
