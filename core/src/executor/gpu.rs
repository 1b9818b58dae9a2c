//! The per-GPU executor: resident instances, the earliest-deadline-first
//! queue, the running requests, and dispatch.
//!
//! ```text
//!   enqueue ─▶ queue (sorted by deadline) ─▶ dispatch ─▶ Run ─▶ finish
//!                         │                     │
//!                         └─ too late ──────────┴─▶ Reject (DeadlineMissedInQueue)
//! ```
//!
//! The node-level [`super::NodeExecutor`] decides which GPU a request goes
//! to and what gets loaded or evicted; this type keeps one GPU's books.

use super::{Command, ExecutorRules, FunctionId, RejectReason, RequestId};
use crate::model::{Mib, Micros, MilliGpu, Tier, WHOLE_GPU};

/// One function's copy on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Instance {
    pub function: FunctionId,
    pub tier: Tier,
    /// GPU memory held (whole slots for slotted rules).
    pub mem_mib: Mib,
    /// Compute of its slots (slotted rules): it runs one request at a time on it.
    pub reserved_compute: Option<MilliGpu>,
    /// Weights are on the GPU (a load has finished).
    pub loaded: bool,
    /// When the pending load finishes (meaningful while `!loaded`).
    pub ready_at: Micros,
    pub running: u32,
    pub queued: u32,
    /// Sum of the service times of its queued requests, µs.
    pub queued_us: Micros,
    /// Latest finish of its running requests, µs.
    pub busy_until: Micros,
    pub last_used: Micros,
    /// The function was removed from the node: unload when idle.
    pub removing: bool,
    /// Its profile's continuous batching (see [`super::FunctionProfile::batch_ppm`]).
    pub batch_ppm: u32,
    /// Compute its running batch holds beyond its requests' own shares.
    pub held: MilliGpu,
    /// The GPU is no longer among the function's pinned GPUs: the copy
    /// takes no new request and leaves once idle.
    pub unpinned: bool,
    /// Compute the running batch started on (its first request's share and
    /// hold); below the function's share when it started squeezed.
    pub batch_share: MilliGpu,
}

impl Instance {
    /// Service time, compute share and batch hold of a request (solo:
    /// `solo_us` on `compute`) that starts now on this loaded instance.
    /// Without batching: `(solo_us, compute, 0)`. With batching, every
    /// request takes only its marginal share (none on a slot, whose compute
    /// the batch owns), and the batch's first request also takes the rest
    /// of `compute` as the hold, which the instance keeps until its last
    /// running request finishes (the weights every step reads are the
    /// batch's cost, whoever started it); a request that joins `k` running
    /// ones takes its batched service.
    pub fn join(
        &self,
        solo_us: Micros,
        compute: MilliGpu,
        slotted: bool,
    ) -> (Micros, MilliGpu, MilliGpu) {
        if self.batch_ppm == 0 {
            return (solo_us, compute, 0);
        }
        let (service, share) =
            super::profile::batched(self.batch_ppm, solo_us, compute, self.running.max(1));
        let marginal = if slotted { 0 } else { share };
        if self.running == 0 {
            (solo_us, marginal, compute - marginal)
        } else if (1..compute).contains(&self.batch_share) {
            // The batch steps at batch_share / compute of its full rate,
            // so a sequence's extra work per step takes that much less
            // bandwidth too.
            let slowed = if slotted {
                0
            } else {
                super::profile::batched(self.batch_ppm, solo_us, self.batch_share, 2).1
            };
            (squeezed_us(service, compute, self.batch_share), slowed, 0)
        } else {
            (service, marginal, 0)
        }
    }

    /// Loaded with nothing running or queued.
    pub fn idle(&self) -> bool {
        self.loaded && self.running == 0 && self.queued == 0
    }

    /// Predicted time it becomes idle: ready, its running requests done,
    /// then its queued ones served one after another; with queued requests
    /// on shared compute, not before `drain` (the GPU's committed work done).
    pub fn idle_at(&self, now: Micros, drain: Option<Micros>) -> Micros {
        let ready = if self.loaded {
            now
        } else {
            self.ready_at.max(now)
        };
        let own = ready.max(self.busy_until) + self.queued_us;
        match drain {
            Some(d) if self.queued > 0 => own.max(d),
            _ => own,
        }
    }
}

/// A request waiting on this GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Queued {
    pub deadline: Micros,
    pub request: RequestId,
    pub function: FunctionId,
    pub service_us: Micros,
    pub compute: MilliGpu,
    /// Its function's mean inter-arrival when it was routed (what a batch
    /// it starts expects of joiners; see [`batch_sized`]).
    pub mean_gap: Micros,
}

/// A request being routed, as a GPU's queue would order and weigh it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Newcomer {
    /// Its place in the queue's order: (deadline, request).
    pub key: (Micros, RequestId),
    /// The compute it asks for.
    pub compute: MilliGpu,
    /// Its service time at that compute, µs.
    pub service_us: Micros,
}

/// A request running on this GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Running {
    pub request: RequestId,
    pub function: FunctionId,
    pub compute: MilliGpu,
    pub finish_at: Micros,
}

/// One GPU's state and its EDF dispatch.
#[derive(Debug, Clone)]
pub struct GpuExecutor {
    pub(crate) index: u32,
    pub(crate) free_mib: Mib,
    pub(crate) compute_free: MilliGpu,
    /// When the host-to-device link is free for the next load.
    pub(crate) link_free_at: Micros,
    /// Add and remove them with [`Self::add_instance`] and
    /// [`Self::remove_instance`] only (`functions` mirrors their order),
    /// and change `loaded`, `running` or `queued` only through
    /// [`Self::change_instance`] (`idle_mib` follows them).
    pub(crate) instances: Vec<Instance>,
    /// `instances[k].function` at `k`: [`Self::find`] scans 4-byte ids
    /// instead of whole instances (the router asks every GPU on every
    /// request).
    functions: Vec<FunctionId>,
    /// Bit `f % 64` of word `f / 64` set: some instance here is function
    /// `f`'s. [`Self::find`] answers "no copy" without scanning, as it
    /// does for most GPUs.
    present: Vec<u64>,
    /// Σ memory of the idle instances here, MiB: of any tier, and of
    /// swappable tiers (what [`Self::evictable_mib`] returns without and
    /// with a host cache), kept as instances change instead of summed on
    /// every request.
    idle_mib: [Mib; 2],
    /// Sorted by (deadline, request) descending: the last element is served first.
    pub(crate) queue: Vec<Queued>,
    pub(crate) running: Vec<Running>,
    /// Σ service × compute of the queue, µs·milli-GPU.
    pub(crate) queued_work: u64,
}

impl GpuExecutor {
    /// An empty GPU with `memory_mib` of memory.
    pub fn new(index: u32, memory_mib: Mib) -> Self {
        Self {
            index,
            free_mib: memory_mib,
            compute_free: WHOLE_GPU,
            link_free_at: 0,
            instances: Vec::new(),
            functions: Vec::new(),
            present: Vec::new(),
            idle_mib: [0; 2],
            queue: Vec::new(),
            running: Vec::new(),
            queued_work: 0,
        }
    }

    /// GPU memory not held by any instance, MiB.
    pub fn free_mib(&self) -> Mib {
        self.free_mib
    }

    /// Number of requests queued here.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The functions whose instances are on this GPU (loaded or loading).
    pub fn resident(&self) -> impl Iterator<Item = FunctionId> + '_ {
        self.instances.iter().map(|i| i.function)
    }

    /// The functions with a copy on this GPU, each with whether its load
    /// has finished (`false`: still loading).
    pub fn copies(&self) -> impl Iterator<Item = (FunctionId, bool)> + '_ {
        self.instances.iter().map(|i| (i.function, i.loaded))
    }

    /// Nothing loaded, queued or running, and the link idle at `now`.
    pub(crate) fn pristine(&self, now: Micros) -> bool {
        self.instances.is_empty()
            && self.queue.is_empty()
            && self.running.is_empty()
            && self.link_free_at <= now
    }

    pub(crate) fn find(&self, function: FunctionId) -> Option<usize> {
        debug_assert_eq!(self.functions.len(), self.instances.len());
        let (word, bit) = presence_bit(function);
        if self.present.get(word).is_none_or(|w| w & bit == 0) {
            return None;
        }
        self.functions.iter().position(|&f| f == function)
    }

    /// Fluid estimate of when the compute a newcomer `n` asks for frees up
    /// here: without `edf`, behind everything queued (no wait when the
    /// queue is empty and its compute is free, else the committed work
    /// spread over the whole GPU). With `edf`, as the queue is served,
    /// earliest deadline first: only the running work and the queued
    /// requests of lower keys come before it (no wait when none is queued
    /// ahead and its compute is free), unless it could make late a queued
    /// request of a later key that the fluid estimate has finishing in
    /// time: one that, with everything before it and the newcomer run one
    /// after another (the most strict EDF on compute can take, whatever
    /// the shares), would finish past its deadline. Then it counts as
    /// behind everything, as without `edf`. So a tenant's queue of far
    /// deadlines does not turn away another's near ones that fit before
    /// them, and a request queued in time is not made late by one that
    /// comes after it (short of runs that take longer than their service at
    /// full share: a batch joiner, a right-sized or squeezed run).
    pub(crate) fn compute_start(&self, now: Micros, n: &Newcomer, edf: bool) -> Micros {
        if !edf {
            if self.queue.is_empty() && self.compute_free >= n.compute {
                return now;
            }
            return self.drain_at(now);
        }
        let whole = WHOLE_GPU as u64;
        let running = self.running_work(now);
        let mut serial: Micros = self
            .running
            .iter()
            .map(|r| r.finish_at.saturating_sub(now))
            .fold(0, Micros::saturating_add);
        // Earliest key first (the queue is sorted descending).
        let mut queued = self.queue.iter().rev();
        let mut ahead = 0u64;
        let mut any_ahead = false;
        let behind = loop {
            match queued.next() {
                Some(q) if (q.deadline, q.request) < n.key => {
                    ahead = ahead.saturating_add(q.service_us.saturating_mul(q.compute as u64));
                    serial = serial.saturating_add(q.service_us);
                    any_ahead = true;
                }
                first_behind => break first_behind,
            }
        };
        let start = if !any_ahead && self.compute_free >= n.compute {
            now
        } else {
            now.saturating_add(running.saturating_add(ahead) / whole)
        };
        if start.saturating_add(n.service_us) > n.key.0 {
            // Late even so: nothing behind it to look at (the caller
            // takes no estimate that misses the deadline from here).
            return start;
        }
        // The queued requests behind it, each with the work before it.
        let mut before = running.saturating_add(ahead);
        serial = serial.saturating_add(n.service_us);
        for q in behind.into_iter().chain(queued) {
            let fluid = now
                .saturating_add(before / whole)
                .saturating_add(q.service_us);
            let worst = now.saturating_add(serial).saturating_add(q.service_us);
            if fluid <= q.deadline && worst > q.deadline {
                return self.drain_at(now);
            }
            before = before.saturating_add(q.service_us.saturating_mul(q.compute as u64));
            serial = serial.saturating_add(q.service_us);
        }
        start
    }

    /// The running requests' work left at `now`, µs·milli-GPU.
    fn running_work(&self, now: Micros) -> u64 {
        self.running
            .iter()
            .map(|r| r.finish_at.saturating_sub(now) * r.compute as u64)
            .sum()
    }

    /// Fluid estimate of when the running and queued work here is done.
    pub(crate) fn drain_at(&self, now: Micros) -> Micros {
        now + (self.running_work(now) + self.queued_work) / WHOLE_GPU as u64
    }

    /// Memory that evicting idle instances could free under `rules`.
    pub(crate) fn evictable_mib(&self, rules: &ExecutorRules) -> Mib {
        let mib = self.idle_mib[usize::from(rules.host_cache)];
        if cfg!(any(test, debug_assertions)) {
            let summed = self
                .instances
                .iter()
                .filter(|i| evictable(i, rules))
                .fold(0, |sum: Mib, i| sum.saturating_add(i.mem_mib));
            assert_eq!(mib, summed, "idle memory kept = summed");
        }
        mib
    }

    /// Change instance `k` with `change`, keeping the idle memory in step.
    pub(crate) fn change_instance<R>(
        &mut self,
        k: usize,
        change: impl FnOnce(&mut Instance) -> R,
    ) -> R {
        let before = idle_mib(&self.instances[k]);
        let r = change(&mut self.instances[k]);
        let after = idle_mib(&self.instances[k]);
        for ((sum, b), a) in self.idle_mib.iter_mut().zip(before).zip(after) {
            *sum = sum.saturating_sub(b).saturating_add(a);
        }
        r
    }

    /// Earliest predicted time at which free memory plus instances that
    /// will have become idle and may then be evicted under `rules` (or
    /// unloaded, for a removed function) reach `need_mib`; `None` if even
    /// all of them together are too few. `scratch` is a reused buffer.
    pub(crate) fn memory_free_at(
        &self,
        now: Micros,
        need_mib: Mib,
        rules: &ExecutorRules,
        scratch: &mut Vec<(Micros, Mib)>,
    ) -> Option<Micros> {
        if self.free_mib >= need_mib {
            return Some(now);
        }
        // Shared compute: queued requests wait behind all committed work.
        let drain = rules.slots_per_gpu.is_none().then(|| self.drain_at(now));
        scratch.clear();
        scratch.extend(
            self.instances
                .iter()
                .filter(|i| i.removing || evictable_tier(i.tier, rules))
                .map(|i| (i.idle_at(now, drain), i.mem_mib)),
        );
        let total = scratch
            .iter()
            .fold(0, |sum: Mib, &(_, mib)| sum.saturating_add(mib));
        if self.free_mib.saturating_add(total) < need_mib {
            return None;
        }
        // Take candidates earliest first until enough is free: usually one
        // or two, so this beats sorting them all.
        let mut free = self.free_mib;
        while !scratch.is_empty() {
            let (k, &(at, mib)) = scratch
                .iter()
                .enumerate()
                .min_by_key(|&(_, e)| e)
                .expect("not empty");
            free = free.saturating_add(mib);
            if free >= need_mib {
                return Some(at);
            }
            scratch.swap_remove(k);
        }
        None
    }

    /// Insert a request in deadline order and book its work.
    pub(crate) fn enqueue(&mut self, q: Queued, inst: Option<usize>) {
        let key = (q.deadline, q.request);
        let pos = self
            .queue
            .partition_point(|e| (e.deadline, e.request) > key);
        self.queue.insert(pos, q);
        self.queued_work += q.service_us * q.compute as u64;
        if let Some(i) = inst {
            self.change_instance(i, |inst| {
                inst.queued += 1;
                inst.queued_us += q.service_us;
            });
        }
    }

    /// Whether a request of a key later than `key` is queued here.
    pub(crate) fn queued_after(&self, key: (Micros, RequestId)) -> bool {
        // Sorted descending: the first is the latest.
        self.queue
            .first()
            .is_some_and(|q| (q.deadline, q.request) > key)
    }

    /// Takes `request` out of the queue (its work no longer booked);
    /// `None` if it is not queued here.
    pub(crate) fn cancel(&mut self, request: RequestId, all_resident: bool) -> Option<Queued> {
        let pos = self.queue.iter().position(|q| q.request == request)?;
        Some(self.unqueue(pos, all_resident))
    }

    fn unqueue(&mut self, pos: usize, all_resident: bool) -> Queued {
        let q = self.queue.remove(pos);
        self.queued_work -= q.service_us * q.compute as u64;
        if !all_resident {
            if let Some(i) = self.find(q.function) {
                self.change_instance(i, |inst| {
                    inst.queued -= 1;
                    inst.queued_us -= q.service_us;
                });
            }
        }
        q
    }

    /// Start every queued request that can start now, earliest deadline
    /// first; reject those that can no longer finish in time.
    pub(crate) fn dispatch(&mut self, now: Micros, rules: &ExecutorRules, out: &mut Vec<Command>) {
        let slotted = rules.slots_per_gpu.is_some();
        let mut idx = self.queue.len();
        while idx > 0 {
            idx -= 1;
            let q = self.queue[idx];
            let inst = if rules.all_resident {
                None
            } else {
                self.find(q.function)
            };
            if let Some(i) = inst {
                let it = &self.instances[i];
                if !it.loaded {
                    let earliest = it.ready_at.max(now) + q.service_us;
                    if earliest > q.deadline {
                        self.unqueue(idx, rules.all_resident);
                        out.push(reject_late(q, earliest));
                    }
                    continue;
                }
                if slotted && it.running > 0 && it.batch_ppm == 0 {
                    continue;
                }
            }
            let (mut service_us, mut compute, mut hold) = match inst {
                Some(i) => self.instances[i].join(q.service_us, q.compute, slotted),
                None => (q.service_us, q.compute, 0),
            };
            // Squeeze: a request that would start a batch or run alone may
            // start on the compute that is free when that still meets its
            // deadline (it runs slower by the latency model for its whole
            // service; a batch started so runs its joiners as slowly).
            // Right-size: while another function's copy here may still take
            // requests, take only the share that finishes within
            // RIGHT_SIZE_PCT % of the time left (at most MAX_SLOWDOWN times
            // slower), grown for the joiners a batching function expects
            // (`batch_sized`), leaving the rest to its arrivals; alone on
            // the GPU, take the whole share (nobody else wants the compute).
            // Requests that need a whole GPU are never squeezed: on the
            // latency model a job that saturates the GPU gains nothing from
            // sharing it, and a slowed one keeps its slowness to the end.
            let squeeze = rules.squeeze && !slotted && q.compute < WHOLE_GPU;
            let want = if squeeze && compute + hold == q.compute && self.shared_with(q.function) {
                let ppm = inst.map_or(0, |i| self.instances[i].batch_ppm);
                batch_sized(q, ppm, q.deadline.saturating_sub(now))
            } else {
                compute + hold
            };
            let free = self.compute_free.min(want);
            let squeezed = (squeeze && free > 0 && free < compute + hold)
                .then_some(())
                .filter(|()| compute + hold == q.compute)
                .map(|()| squeezed_us(q.service_us, q.compute, free))
                .filter(|s| now.saturating_add(*s) <= q.deadline);
            if let Some(s) = squeezed {
                service_us = s;
                compute = compute.min(free);
                hold = free - compute;
            }
            if self.compute_free < compute + hold {
                if slotted {
                    continue;
                }
                // Strict EDF on compute: nothing later overtakes the head.
                // The head cannot start before the first running request
                // ends; if even that is too late, reject it now.
                let first_free = self
                    .running
                    .iter()
                    .map(|r| r.finish_at)
                    .min()
                    .unwrap_or(now);
                let earliest = first_free.max(now) + q.service_us;
                if earliest > q.deadline {
                    self.unqueue(idx, rules.all_resident);
                    out.push(reject_late(q, earliest));
                    continue;
                }
                break;
            }
            let finish_at = now + service_us;
            if finish_at > q.deadline {
                self.unqueue(idx, rules.all_resident);
                out.push(reject_late(q, finish_at));
                continue;
            }
            self.unqueue(idx, rules.all_resident);
            self.compute_free -= compute + hold;
            self.running.push(Running {
                request: q.request,
                function: q.function,
                compute,
                finish_at,
            });
            if let Some(i) = inst {
                self.change_instance(i, |it| {
                    if it.running == 0 {
                        it.batch_share = compute + hold;
                    }
                    it.running += 1;
                    it.held += hold;
                    it.busy_until = it.busy_until.max(finish_at);
                    it.last_used = now;
                });
            }
            out.push(Command::Run {
                request: q.request,
                function: q.function,
                gpu: self.index,
                compute_milli: compute + hold,
                finish_at,
            });
        }
    }

    /// Whether a copy of another function on this GPU may still take
    /// requests (so its arrivals may want compute that `function` leaves).
    fn shared_with(&self, function: FunctionId) -> bool {
        self.instances
            .iter()
            .any(|i| i.function != function && !i.removing && !i.unpinned)
    }

    /// Book a finished request; returns its function, or `None` if unknown.
    pub(crate) fn finish(&mut self, now: Micros, request: RequestId) -> Option<FunctionId> {
        let pos = self.running.iter().position(|r| r.request == request)?;
        let r = self.running.swap_remove(pos);
        self.compute_free += r.compute;
        if let Some(i) = self.find(r.function) {
            let released = self.change_instance(i, |it| {
                it.running -= 1;
                it.last_used = now;
                if it.running == 0 {
                    std::mem::take(&mut it.held)
                } else {
                    0
                }
            });
            self.compute_free += released;
        }
        Some(r.function)
    }

    /// Drop queued requests that can no longer finish by their deadline.
    pub(crate) fn reject_hopeless(
        &mut self,
        now: Micros,
        rules: &ExecutorRules,
        out: &mut Vec<Command>,
    ) {
        let mut idx = self.queue.len();
        while idx > 0 {
            idx -= 1;
            let q = self.queue[idx];
            let ready = match (rules.all_resident, self.find(q.function)) {
                (false, Some(i)) if !self.instances[i].loaded => self.instances[i].ready_at,
                _ => now,
            };
            let earliest = ready.max(now) + q.service_us;
            if earliest > q.deadline {
                self.unqueue(idx, rules.all_resident);
                out.push(reject_late(q, earliest));
            }
        }
    }

    /// The earliest time at which [`Self::reject_hopeless`] (or the
    /// deadline checks of [`Self::dispatch`]) would turn a queued request
    /// away: a request of service `s` and deadline `d` becomes hopeless once
    /// `max(ready, now) + s > d`, i.e. at `d - s + 1` (at once if its
    /// instance's load already ends too late). `None` with an empty queue.
    /// Nothing else here changes with time alone: starts follow events.
    pub(crate) fn next_timeout(&self, rules: &ExecutorRules) -> Option<Micros> {
        self.queue
            .iter()
            .map(|q| {
                let ready = match (rules.all_resident, self.find(q.function)) {
                    (false, Some(i)) if !self.instances[i].loaded => self.instances[i].ready_at,
                    _ => 0,
                };
                if ready.saturating_add(q.service_us) > q.deadline {
                    0
                } else {
                    // ready + s ≤ d, so s ≤ d: no underflow.
                    (q.deadline - q.service_us).saturating_add(1)
                }
            })
            .min()
    }

    /// Remove a function's queued requests (it left the node), rejecting them.
    pub(crate) fn reject_function(
        &mut self,
        function: FunctionId,
        rules: &ExecutorRules,
        out: &mut Vec<Command>,
    ) {
        let mut idx = self.queue.len();
        while idx > 0 {
            idx -= 1;
            if self.queue[idx].function == function {
                let q = self.unqueue(idx, rules.all_resident);
                out.push(Command::Reject {
                    request: q.request,
                    reason: RejectReason::UnknownFunction,
                });
            }
        }
    }

    /// Add an instance (loading until `ready_at`) holding `mem_mib`.
    pub(crate) fn add_instance(&mut self, inst: Instance) -> usize {
        // Callers make room first (free ≥ mem_mib); never wrap if not.
        self.free_mib = self.free_mib.saturating_sub(inst.mem_mib);
        self.functions.push(inst.function);
        let (word, bit) = presence_bit(inst.function);
        if self.present.len() <= word {
            self.present.resize(word + 1, 0);
        }
        self.present[word] |= bit;
        for (sum, mib) in self.idle_mib.iter_mut().zip(idle_mib(&inst)) {
            *sum = sum.saturating_add(mib);
        }
        self.instances.push(inst);
        self.instances.len() - 1
    }

    /// Remove instance `i`, releasing its memory.
    pub(crate) fn remove_instance(&mut self, i: usize) -> Instance {
        let function = self.functions.swap_remove(i);
        if !self.functions.contains(&function) {
            let (word, bit) = presence_bit(function);
            self.present[word] &= !bit;
        }
        let inst = self.instances.swap_remove(i);
        for (sum, mib) in self.idle_mib.iter_mut().zip(idle_mib(&inst)) {
            *sum = sum.saturating_sub(mib);
        }
        self.free_mib = self.free_mib.saturating_add(inst.mem_mib);
        inst
    }
}

/// The word of [`GpuExecutor::present`] that holds `function`'s bit, and the bit.
fn presence_bit(function: FunctionId) -> (usize, u64) {
    ((function.0 / 64) as usize, 1 << (function.0 % 64))
}

/// The memory `inst` adds to [`GpuExecutor::idle_mib`]: all of it to both
/// sums when idle, the second only for a swappable tier.
fn idle_mib(inst: &Instance) -> [Mib; 2] {
    match (inst.idle(), inst.tier.swappable()) {
        (false, _) => [0, 0],
        (true, false) => [inst.mem_mib, 0],
        (true, true) => [inst.mem_mib, inst.mem_mib],
    }
}

/// Whether `inst` may be evicted under `rules`: idle, and of a swappable
/// tier when weights go to host memory (gshare), any tier when the
/// baseline scales idle instances to zero.
pub(crate) fn evictable(inst: &Instance, rules: &ExecutorRules) -> bool {
    inst.idle() && evictable_tier(inst.tier, rules)
}

/// Whether an idle instance of `tier` may be evicted under `rules`.
fn evictable_tier(tier: Tier, rules: &ExecutorRules) -> bool {
    !rules.host_cache || tier.swappable()
}

/// Share of the time left to its deadline a right-sized request plans to use, %.
const RIGHT_SIZE_PCT: u128 = 95;

/// The most a right-sized request is planned to slow down: it takes at
/// least `compute / MAX_SLOWDOWN` (rounded up). Going below buys others at
/// most the last 1/MAX_SLOWDOWN of its share and costs it unbounded latency.
const MAX_SLOWDOWN: u32 = 8;

/// The share (≤ `compute`, ≥ `compute / MAX_SLOWDOWN`) on which a request
/// of `service_us` on `compute` finishes within [`RIGHT_SIZE_PCT`] % of
/// `left` µs.
fn right_sized(service_us: Micros, compute: MilliGpu, left: Micros) -> MilliGpu {
    let budget = u128::from(left) * RIGHT_SIZE_PCT / 100;
    if budget == 0 {
        return compute;
    }
    let c = (u128::from(service_us) * u128::from(compute)).div_ceil(budget);
    let floor = compute.div_ceil(MAX_SLOWDOWN).max(1);
    MilliGpu::try_from(c)
        .unwrap_or(compute)
        .clamp(floor, compute.max(floor))
}

/// The share a request that starts a batch beside other functions' copies
/// takes when it has `left` µs to its deadline ([`right_sized`] on its own
/// service as the floor). A batching function (`batch_ppm` > 0) plans for
/// the joiners its mean inter-arrival predicts within [`RIGHT_SIZE_PCT`] %
/// of `left` (at most 10⁶ / `batch_ppm`): it right-sizes the service of a
/// batch of that many more members, so that they can join at a rate that
/// still meets deadlines like its own. It grows beyond the floor only up to
/// the share at which as many batches as of the floor's share, each with
/// room for one joiner, still fit a GPU (`⌊1000 / floor⌋` batches, each
/// at most `1000 / that − one joiner's share`): a batch grown for its own
/// joiners never shuts out another function's batch that would have fit.
fn batch_sized(q: Queued, batch_ppm: u32, left: Micros) -> MilliGpu {
    let floor = right_sized(q.service_us, q.compute, left);
    if batch_ppm == 0 {
        return floor;
    }
    let ppm = u128::from(batch_ppm);
    let expected = (u128::from(left) * RIGHT_SIZE_PCT / 100 / u128::from(q.mean_gap.max(1)))
        .min(1_000_000 / ppm);
    let batch_us = u128::from(q.service_us) * (1_000_000 + expected * ppm) / 1_000_000;
    let grown = right_sized(
        Micros::try_from(batch_us).unwrap_or(Micros::MAX),
        q.compute,
        left,
    );
    let batches = WHOLE_GPU / floor.max(1);
    let joiner =
        MilliGpu::try_from((u128::from(floor) * ppm).div_ceil(1_000_000)).unwrap_or(MilliGpu::MAX);
    let cap = (WHOLE_GPU / batches.max(1)).saturating_sub(joiner);
    floor.max(grown.min(cap))
}

/// Service of a request that takes `service_us` on `compute` when it runs
/// on `share` < `compute` instead (the latency model: slower in proportion,
/// rounded up).
pub(crate) fn squeezed_us(service_us: Micros, compute: MilliGpu, share: MilliGpu) -> Micros {
    let v = (u128::from(service_us) * u128::from(compute)).div_ceil(u128::from(share.max(1)));
    Micros::try_from(v).unwrap_or(Micros::MAX)
}

fn reject_late(q: Queued, earliest_finish: Micros) -> Command {
    Command::Reject {
        request: q.request,
        reason: RejectReason::DeadlineMissedInQueue {
            earliest_finish,
            deadline: q.deadline,
        },
    }
}
