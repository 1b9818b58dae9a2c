//! The node-level executor: routes each request to one of the node's GPUs,
//! loads, evicts and remaps instances between them, and keeps host memory.
//!
//! ```text
//!  Event ─▶ NodeExecutor::handle(now, event)
//!              │  route: predicted finish on every GPU
//!              │         (resident: queue wait; elsewhere: load + wait)
//!              │  no memory now, but busy/loading evictable instances free
//!              │  it in time ─▶ wait (node's waiting set, earliest deadline
//!              │  first; retried on RequestFinished, LoadFinished, Timer,
//!              │  InstanceRemoved)
//!              │  reject early if no GPU meets the deadline
//!              │  load: evict victims ─▶ SwapOut/Unload, then Move | SwapIn | ColdStart
//!              ▼
//!           GpuExecutor::dispatch (EDF) ─▶ Run / Reject
//!              │
//!              ▼
//!           output: Vec<Command>  (drained by the agent or the simulator)
//! ```
//!
//! Everything is decided from the event and `now`: no clock, no I/O, and the
//! output buffer is reused, so the simulator's hot path does not allocate.

use super::gpu::{evictable, squeezed_us, Instance, Newcomer, Queued};
use super::slots::Slots;
use super::{
    Command, Event, FunctionId, FunctionProfile, GpuExecutor, NodeConfig, RejectReason, RequestId,
};
use crate::model::{Mib, Micros, MilliGpu, Tier, WHOLE_GPU};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Host memory is shrunk to this percentage of its capacity when it overflows.
const HOST_LOW_WATER_PCT: u64 = 95;

/// Mean inter-arrival before a function's second request: "far away".
const NO_GAP: Micros = Micros::MAX / 4;

/// A reservation the region has not answered within this is given up.
pub const RESERVE_TIMEOUT_US: Micros = 5_000_000;

/// After a remap's answer (granted or refused) the function asks for no
/// other remap for this long (no ping-pong between GPUs).
pub const RESERVE_BACKOFF_US: Micros = 1_000_000;

#[derive(Debug, Clone, Copy)]
struct FunctionState {
    profile: FunctionProfile,
    /// Weights are in host memory (a load is a swap-in, not a cold start).
    in_host: bool,
    /// The region released it but its host copy is kept
    /// ([`Event::InstanceParked`]): it takes no request until
    /// [`Event::InstanceAdded`] revives it; `copies` counts only GPU
    /// copies still finishing their requests.
    parked: bool,
    last_arrival: Option<Micros>,
    /// Exponentially weighted mean inter-arrival (weight 1/4 on the newest gap).
    mean_gap: Micros,
    /// Instances on the node's GPUs (loaded or loading).
    copies: u32,
    /// Of those, instances still loading.
    loading: u32,
    /// A remap asked of the region and not answered: (from, to, asked at).
    reserving: Option<(u32, u32, Micros)>,
    /// No remap is asked before this.
    reserve_after: Micros,
    /// Every load of it takes this long (its runtime's measured start,
    /// [`Event::StartMeasured`]); `None`: the bandwidth model.
    start_us: Option<Micros>,
}

impl FunctionState {
    /// Predicted time of the next request.
    fn next_use(&self) -> Micros {
        self.last_arrival.unwrap_or(0).saturating_add(self.mean_gap)
    }
}

/// A candidate GPU for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Choice {
    finish: Micros,
    load: bool,
    /// The load needs victims evicted first.
    evicts: bool,
    /// Slotted rules, a load that evicts: the eviction key of the GPU's
    /// first victim, so that the victim is chosen across all GPUs (true
    /// LRU without a host cache); zero otherwise.
    victim: VictimKey,
    /// Memory in use on the GPU (loads spread to the emptiest GPU).
    used_mib: Mib,
    gpu: u32,
}

/// The best candidates of a route, each the least [`Choice`] of its kind.
#[derive(Debug, Clone, Copy, Default)]
struct Bests {
    /// Of the GPUs the function may use.
    all: Option<Choice>,
    /// Of those, the loads.
    load: Option<Choice>,
    /// Of those, the resident copies that meet the deadline (a delayable
    /// request prefers them).
    resident: Option<Choice>,
    /// Of the GPUs it is not pinned to (a remap's comparison only).
    other: Option<Choice>,
}

impl Bests {
    /// Counts `choice` in (on an allowed GPU or not; `resident`: it is a
    /// resident copy preferred within its deadline).
    fn keep(&mut self, choice: Choice, allowed: bool, resident: bool) {
        let keep_min = |best: &mut Option<Choice>| {
            if best.is_none_or(|b| choice < b) {
                *best = Some(choice);
            }
        };
        if !allowed {
            keep_min(&mut self.other);
            return;
        }
        if choice.load {
            keep_min(&mut self.load);
        }
        if resident && !choice.load {
            keep_min(&mut self.resident);
        }
        keep_min(&mut self.all);
    }
}

/// Eviction order of an idle instance, smallest first: weakest tier (under
/// `spread`, within a tier a copy whose function has another first),
/// farthest predicted next use, longest idle (host cache); least recently
/// used (no host cache).
type VictimKey = (u8, Micros, Micros);

/// An eviction candidate of [`NodeExecutor::write_back_us`]: its key, its
/// index on the GPU, its memory and its write-back µs.
type Victim = (VictimKey, usize, Mib, Micros);

/// A request that waits on the node for GPU memory to become evictable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Waiting {
    deadline: Micros,
    request: RequestId,
    function: FunctionId,
    full_gpu_us: Micros,
    /// When it was last routed.
    routed_at: Micros,
    /// Before this, a [`Event::Timer`] leaves it waiting (see
    /// [`NodeExecutor::next_timeout`]).
    recheck_at: Micros,
}

/// The executor of one node: the state machine the node agent runs live
/// and the serving simulator runs on traces.
#[derive(Debug, Clone)]
pub struct NodeExecutor {
    config: NodeConfig,
    gpus: Vec<GpuExecutor>,
    functions: Slots<FunctionState>,
    host_used_mib: Mib,
    output: Vec<Command>,
    /// Reused buffer of host-eviction candidates (order key, function).
    host_scratch: Vec<Reverse<((u8, Micros), u32)>>,
    /// Requests waiting for memory, by (deadline, request) ascending.
    waiting: Vec<Waiting>,
    /// Reused buffer of (predicted idle time, memory) of eviction candidates.
    memory_scratch: Vec<(Micros, Mib)>,
    /// Reused buffer of the eviction candidates of a write-back (filled
    /// while the GPUs are borrowed).
    victim_scratch: std::cell::RefCell<Vec<Victim>>,
    /// Reused buffer of a load's function and its victims.
    written_scratch: Vec<FunctionId>,
    /// Per function: the GPUs the region reserved for it (`None`: any GPU,
    /// as in the simulator, which has no region).
    pins: Slots<Vec<u32>>,
    /// Remaps asked and not answered yet.
    open_reservations: u32,
}

impl NodeExecutor {
    /// A node with empty GPUs and empty host memory.
    pub fn new(config: NodeConfig) -> Self {
        let gpus = (0..config.gpus)
            .map(|i| GpuExecutor::new(i, config.gpu_memory_mib))
            .collect();
        Self {
            config,
            gpus,
            functions: Slots::default(),
            host_used_mib: 0,
            output: Vec::new(),
            host_scratch: Vec::new(),
            waiting: Vec::new(),
            memory_scratch: Vec::new(),
            victim_scratch: std::cell::RefCell::new(Vec::new()),
            written_scratch: Vec::new(),
            pins: Slots::default(),
            open_reservations: 0,
        }
    }

    /// The node's configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// GPU `index` of the node.
    pub fn gpu(&self, index: u32) -> &GpuExecutor {
        &self.gpus[index as usize]
    }

    /// Whether the function's weights are in host memory (placed or parked).
    pub fn in_host(&self, function: FunctionId) -> bool {
        self.functions.get(function).is_some_and(|f| f.in_host)
    }

    /// Moves parked `from`'s host copy to the unused id `to`, which becomes
    /// parked with it (an [`Event::InstanceAdded`] on `to` revives it: its
    /// first load is a swap-in). A caller that revives a function under a
    /// fresh id this way never mistakes a late answer about `from` (a load
    /// or a request of its old GPU copies) for one about `to`. `from` keeps
    /// no host copy; it is forgotten at once when no GPU copy of it is left,
    /// else when its last busy copy unloads. `false` (and nothing changed)
    /// unless `from` is parked with a host copy and `to` is unused.
    pub fn move_host_copy(&mut self, from: FunctionId, to: FunctionId) -> bool {
        let movable = self
            .functions
            .get(from)
            .is_some_and(|f| f.parked && f.in_host);
        let free = !self.functions.contains(to);
        if !movable || !free || from == to {
            return false;
        }
        let old = self.functions.get_mut(from).expect("checked above");
        let moved = FunctionState {
            in_host: true,
            parked: true,
            copies: 0,
            loading: 0,
            reserving: None,
            reserve_after: 0,
            ..*old
        };
        old.in_host = false;
        if old.copies == 0 {
            self.functions.remove(from);
        }
        self.functions.insert(to, moved);
        true
    }

    /// The parked functions (see [`Event::InstanceParked`]) and the host
    /// memory their kept copy holds, MiB, by function id. A parked function
    /// whose host copy was dropped to make room is forgotten, so it is not
    /// listed: the caller may forget it too.
    pub fn parked(&self) -> impl Iterator<Item = (FunctionId, Mib)> + '_ {
        self.functions
            .iter()
            .filter(|(_, f)| f.parked && f.in_host)
            .map(|(k, f)| (k, f.profile.memory_mib))
    }

    /// How many functions the node keeps state for: placed, parked, or
    /// with copies still finishing (not every id it ever saw).
    pub fn functions_held(&self) -> usize {
        self.functions.iter().count()
    }

    /// When the function's last request arrived, µs (`None`: none yet, or
    /// not placed here).
    pub fn last_arrival(&self, function: FunctionId) -> Option<Micros> {
        self.state(function).and_then(|f| f.last_arrival)
    }

    /// Number of requests waiting for GPU memory (not yet on a GPU's queue).
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Host memory holding swapped-out weights, MiB.
    pub fn host_used_mib(&self) -> Mib {
        self.host_used_mib
    }

    /// The GPUs the function is pinned to (`None`: unpinned, any GPU).
    pub fn pins(&self, function: FunctionId) -> Option<&[u32]> {
        self.pins.get(function).map(Vec::as_slice)
    }

    /// The remap asked of the region for the function and not answered.
    pub fn reserving(&self, function: FunctionId) -> Option<(u32, u32)> {
        self.state(function)
            .and_then(|f| f.reserving)
            .map(|(a, b, _)| (a, b))
    }

    /// Whether the function may have a copy on GPU `gpu`.
    fn allowed(&self, function: FunctionId, gpu: u32) -> bool {
        self.pins(function).is_none_or(|p| p.contains(&gpu))
    }

    /// Pins the function to the GPUs the region reserved for it (its
    /// instances' slices on this node): from now on its copies are loaded
    /// only there. A copy on a GPU no longer listed takes no new request
    /// and leaves once idle (then [`Command::Release`] is emitted). The
    /// simulator never pins (its functions may use any GPU). A function
    /// not placed here (never added, removed, or parked: a parked function
    /// comes back under a new id) is not pinned: nothing would drop its pin.
    pub fn pin(&mut self, now: Micros, function: FunctionId, gpus: &[u32]) {
        if self.state(function).is_none() {
            return;
        }
        let mut set: Vec<u32> = gpus
            .iter()
            .copied()
            .filter(|&g| g < self.config.gpus)
            .collect();
        set.sort_unstable();
        set.dedup();
        self.pins.insert(function, set);
        let gpus: Vec<u32> = (0..self.config.gpus).collect();
        for g in gpus {
            let allowed = self.allowed(function, g);
            let gi = g as usize;
            match self.gpus[gi].find(function) {
                Some(k) if allowed => self.gpus[gi].instances[k].unpinned = false,
                Some(_) => self.retire(now, function, g, None),
                None => {}
            }
        }
        self.redispatch(now);
    }

    fn redispatch(&mut self, now: Micros) {
        let rules = self.config.rules;
        for g in &mut self.gpus {
            g.dispatch(now, &rules, &mut self.output);
        }
        self.retry_waiting(now);
    }

    /// The function leaves GPU `gpu` (its pin there is gone): an idle copy
    /// is moved to `to` (when given, free there and not holding one) or
    /// dropped, a busy or loading one is marked to leave once idle; when
    /// nothing of it is left there, [`Command::Release`] is emitted.
    fn retire(&mut self, now: Micros, function: FunctionId, gpu: u32, to: Option<u32>) {
        if let Some(p) = self.pins.get_mut(function) {
            p.retain(|&g| g != gpu);
        }
        let gi = gpu as usize;
        let Some(k) = self.gpus[gi].find(function) else {
            self.output.push(Command::Release { function, gpu });
            return;
        };
        if !self.gpus[gi].instances[k].idle() {
            self.gpus[gi].instances[k].unpinned = true;
            return;
        }
        let mem = self.gpus[gi].instances[k].mem_mib;
        let target = to.filter(|&t| {
            let tg = &self.gpus[t as usize];
            self.config.rules.remap && tg.find(function).is_none() && tg.free_mib >= mem
        });
        match target {
            Some(t) => self.move_copy(now, function, gpu, t),
            None => self.drop_copy(now, function, gpu, k),
        }
        self.output.push(Command::Release { function, gpu });
    }

    /// Moves the function's idle copy from GPU `from` to `to` (free memory
    /// there checked by the caller): a [`Command::Move`].
    fn move_copy(&mut self, now: Micros, function: FunctionId, from: u32, to: u32) {
        let Some(k) = self.gpus[from as usize].find(function) else {
            return;
        };
        let inst = self.gpus[from as usize].remove_instance(k);
        // From host memory: a copy whose host copy was dropped is written
        // back first (`load_us` counts both crossings).
        let load_us = self.state(function).map_or_else(
            || self.config.load.swap_in_us(inst.mem_mib),
            |f| self.load_us(f),
        );
        if self.restore_host_copy(function) {
            self.shrink_host(function, &[]);
        }
        let t = &mut self.gpus[to as usize];
        let ready_at = t.link_free_at.max(now).saturating_add(load_us);
        t.link_free_at = ready_at;
        t.add_instance(Instance {
            loaded: false,
            ready_at,
            running: 0,
            queued: 0,
            queued_us: 0,
            busy_until: 0,
            last_used: now,
            unpinned: false,
            ..inst
        });
        if let Some(f) = self.functions.get_mut(function) {
            f.loading = f.loading.saturating_add(1);
        }
        self.output.push(Command::Move {
            function,
            from,
            to,
            ready_at,
        });
    }

    /// Drops the function's idle copy `k` on GPU `gpu` (its weights go to
    /// host memory with a host cache, see [`NodeExecutor::swap_out`]).
    fn drop_copy(&mut self, now: Micros, function: FunctionId, gpu: u32, k: usize) {
        self.gpus[gpu as usize].remove_instance(k);
        if let Some(f) = self.functions.get_mut(function) {
            f.copies = f.copies.saturating_sub(1);
        }
        if self.config.rules.host_cache {
            let us = self.swap_out(function, gpu, &[]);
            let g = &mut self.gpus[gpu as usize];
            if us > 0 {
                g.link_free_at = g.link_free_at.max(now).saturating_add(us);
            }
        } else {
            self.output.push(Command::Unload { function, gpu });
        }
    }

    /// A host cache's swap-out of `function`'s copy just removed from GPU
    /// `gpu` (its `copies` already counted down): [`Command::SwapOut`], and
    /// the µs its weights take to reach host memory over that GPU's link.
    /// That is zero while the host keeps their copy or another GPU holds
    /// one; else (the host dropped its copy to make room, see
    /// [`NodeExecutor::shrink_host`]) they are copied back to host memory,
    /// which may drop other host copies in turn (never those of `keep`: the
    /// function a load is being made of, and its victims).
    fn swap_out(&mut self, function: FunctionId, gpu: u32, keep: &[FunctionId]) -> Micros {
        self.output.push(Command::SwapOut { function, gpu });
        let Some(f) = self.functions.get(function) else {
            return 0;
        };
        if f.in_host || f.copies > 0 {
            return 0;
        }
        let mem = f.profile.memory_mib;
        if self.restore_host_copy(function) {
            self.shrink_host(function, keep);
        }
        self.config.load.swap_in_us(mem)
    }

    /// Under a host cache, `function`'s weights are put in host memory if
    /// they are not there (fetched from storage, or written back from a GPU
    /// copy whose host copy was dropped): `true` when host memory then holds
    /// more than its capacity.
    fn restore_host_copy(&mut self, function: FunctionId) -> bool {
        let Some(f) = self.functions.get_mut(function) else {
            return false;
        };
        if !self.config.rules.host_cache || f.in_host {
            return false;
        }
        f.in_host = true;
        self.host_used_mib = self.host_used_mib.saturating_add(f.profile.memory_mib);
        self.host_used_mib > self.config.host_memory_mib
    }

    /// The µs evicting `inst` spends copying its function's weights back to
    /// host memory ([`NodeExecutor::swap_out`]): nonzero under a host cache
    /// when the host has no copy, no other GPU has one, and the copy is not
    /// being removed (that is an unload). `fs`: its function's state.
    fn write_back_of(&self, inst: &Instance, fs: Option<&FunctionState>) -> Micros {
        match fs {
            Some(f)
                if self.config.rules.host_cache
                    && !inst.removing
                    && !f.in_host
                    && f.copies <= 1 =>
            {
                self.config.load.swap_in_us(f.profile.memory_mib)
            }
            _ => 0,
        }
    }

    /// The µs a load of `need` MiB onto `g` first spends copying its
    /// victims' weights back to host memory: those of the victims
    /// [`Self::load`] evicts, in its order.
    fn write_back_us(&self, g: &GpuExecutor, need: Mib) -> Micros {
        let rules = self.config.rules;
        if g.free_mib >= need || !rules.host_cache {
            return 0;
        }
        let mut scratch = self.victim_scratch.borrow_mut();
        scratch.clear();
        let mut any = false;
        for (k, i) in g.instances.iter().enumerate() {
            if !evictable(i, &rules) {
                continue;
            }
            let fs = self.functions.get(i.function);
            let write_back = self.write_back_of(i, fs);
            any |= write_back > 0;
            scratch.push((self.victim_key_of(i, fs), k, i.mem_mib, write_back));
        }
        if !any {
            return 0;
        }
        // Usually one or two victims: picked smallest first, not sorted.
        let mut free = g.free_mib;
        let mut us: Micros = 0;
        while free < need && !scratch.is_empty() {
            let (k, &(_, _, mib, write_back)) = scratch
                .iter()
                .enumerate()
                .min_by_key(|&(_, e)| e)
                .expect("not empty");
            free = free.saturating_add(mib);
            us = us.saturating_add(write_back);
            scratch.swap_remove(k);
        }
        us
    }

    /// A copy marked to leave its GPU ([`Instance::unpinned`]) is dropped
    /// once idle, and the GPU's slice may then be released.
    fn leave_if_unpinned(&mut self, now: Micros, function: FunctionId, gpu: u32) {
        let g = &self.gpus[gpu as usize];
        if let Some(k) = g.find(function) {
            if g.instances[k].unpinned && g.instances[k].idle() {
                self.drop_copy(now, function, gpu, k);
                self.output.push(Command::Release { function, gpu });
            }
        }
    }

    /// The region answered a remap (see [`Event::Reserved`]).
    fn reserved(&mut self, now: Micros, function: FunctionId, from: u32, to: u32, granted: bool) {
        let Some(fs) = self.functions.get_mut(function).filter(|f| !f.parked) else {
            return;
        };
        if fs.reserving.is_some_and(|(a, b, _)| (a, b) == (from, to)) {
            fs.reserving = None;
            self.open_reservations = self.open_reservations.saturating_sub(1);
        }
        fs.reserve_after = now.saturating_add(RESERVE_BACKOFF_US);
        if !granted || from == to || to >= self.config.gpus {
            return;
        }
        let Some(p) = self.pins.get_mut(function) else {
            return;
        };
        if !p.contains(&to) {
            p.push(to);
        }
        self.retire(now, function, from, Some(to));
        self.redispatch(now);
    }

    /// Drain the commands produced so far, in order.
    pub fn drain_commands(&mut self) -> std::vec::Drain<'_, Command> {
        self.output.drain(..)
    }

    /// Take the commands produced so far (tests and one-off callers).
    pub fn take_commands(&mut self) -> Vec<Command> {
        std::mem::take(&mut self.output)
    }

    /// Feed one event at time `now`; decisions accumulate in the output.
    pub fn handle(&mut self, now: Micros, event: Event) {
        match event {
            Event::InstanceAdded { function, profile } => self.add_function(function, profile),
            Event::InstanceRemoved { function } => self.remove_function(now, function, false),
            Event::InstanceParked { function } => self.remove_function(now, function, true),
            Event::RequestArrived {
                request,
                function,
                full_gpu_us,
                deadline,
            } => self.arrive(now, request, function, full_gpu_us, deadline),
            Event::RequestFinished { request, gpu } => self.finish(now, request, gpu),
            Event::RequestCancelled { request } => self.cancel(now, request),
            Event::LoadFinished { function, gpu } => self.loaded(now, function, gpu),
            Event::Prefetch { function } => self.prefetch(now, function),
            Event::StartMeasured { function, start_us } => {
                if let Some(f) = self.functions.get_mut(function) {
                    f.start_us = Some(start_us);
                }
            }
            Event::Timer => {
                let rules = self.config.rules;
                for g in &mut self.gpus {
                    g.reject_hopeless(now, &rules, &mut self.output);
                    g.dispatch(now, &rules, &mut self.output);
                }
                self.retry_waiting(now);
                if self.open_reservations > 0 {
                    self.expire_reservations(now);
                }
            }
            Event::Reserved {
                function,
                from,
                to,
                granted,
            } => self.reserved(now, function, from, to, granted),
        }
        // Only the agent pins (the simulator never does): nothing to look
        // at without pins.
        if !self.pins.is_empty() {
            self.leave_idle_unpinned(now);
        }
    }

    /// The earliest time at which an [`Event::Timer`] may do something
    /// (quinn-proto's `poll_timeout`): a queued request becoming hopeless,
    /// a waiting request whose prediction may have slipped past its
    /// deadline or that may now ask for a remap, or a reservation expiring.
    /// A tick before it changes nothing; `None`: no tick is needed until the
    /// next event. It may lie in the past (then a tick now is due), and it
    /// may be early for waiting requests (their bound is conservative; the
    /// tick then only re-arms it), never late. Every other change follows an
    /// event, not time.
    pub fn next_timeout(&self) -> Option<Micros> {
        let rules = self.config.rules;
        let queues = self.gpus.iter().filter_map(|g| g.next_timeout(&rules));
        let reservations = (self.open_reservations > 0)
            .then(|| self.functions.iter().filter_map(|(_, f)| f.reserving))
            .into_iter()
            .flatten()
            .map(|(_, _, at)| at.saturating_add(RESERVE_TIMEOUT_US));
        let waiting = self.waiting.iter().map(|w| {
            // A remap back-off that ended since it was routed.
            let remap = self
                .state(w.function)
                .filter(|f| f.reserving.is_none() && f.reserve_after > w.routed_at)
                .map(|f| f.reserve_after);
            remap.map_or(w.recheck_at, |r| r.min(w.recheck_at))
        });
        queues.chain(reservations).chain(waiting).min()
    }

    /// Forgets remaps the region did not answer within [`RESERVE_TIMEOUT_US`]
    /// (a late grant still moves: see [`Event::Reserved`]).
    fn expire_reservations(&mut self, now: Micros) {
        for f in self.functions.values_mut() {
            if let Some((_, _, at)) = f.reserving {
                if now.saturating_sub(at) >= RESERVE_TIMEOUT_US {
                    f.reserving = None;
                    f.reserve_after = now.saturating_add(RESERVE_BACKOFF_US);
                    self.open_reservations = self.open_reservations.saturating_sub(1);
                }
            }
        }
    }

    /// A placed function's state (`None`: not placed here, or parked).
    fn state(&self, function: FunctionId) -> Option<&FunctionState> {
        self.functions.get(function).filter(|f| !f.parked)
    }

    /// A placed function's state, mutable (`None`: not placed, or parked).
    fn state_mut(&mut self, function: FunctionId) -> Option<&mut FunctionState> {
        self.functions.get_mut(function).filter(|f| !f.parked)
    }

    fn add_function(&mut self, function: FunctionId, profile: FunctionProfile) {
        if let Some(f) = self.functions.get_mut(function) {
            f.profile = profile;
            if f.parked {
                // Revived: its host copy serves the next load (a swap-in),
                // and copies still finishing on a GPU serve again.
                f.parked = false;
                for g in &mut self.gpus {
                    if let Some(k) = g.find(function) {
                        g.instances[k].removing = false;
                    }
                }
            }
            return;
        }
        self.functions.insert(
            function,
            FunctionState {
                profile,
                in_host: false,
                parked: false,
                last_arrival: None,
                mean_gap: NO_GAP,
                copies: 0,
                loading: 0,
                reserving: None,
                reserve_after: 0,
                start_us: None,
            },
        );
    }

    /// What loading `fs` onto a GPU takes now: its runtime's measured
    /// start if it has one, else a swap-in when its weights are in host
    /// memory (with the host cache), else a cold start.
    fn load_us(&self, fs: &FunctionState) -> Micros {
        match fs.start_us {
            Some(us) => us,
            None if self.config.rules.host_cache && fs.in_host => {
                self.config.load.swap_in_us(fs.profile.memory_mib)
            }
            // Its host copy was dropped while a GPU copy stayed
            // (`shrink_host`): back to host memory, then in.
            None if self.config.rules.host_cache && fs.copies > 0 => self
                .config
                .load
                .swap_in_us(fs.profile.memory_mib)
                .saturating_mul(2),
            None => self.config.load.cold_start_us(fs.profile.memory_mib),
        }
    }

    /// The function leaves the node; with `park` (and a host copy under a
    /// host cache) its host copy stays, see [`Event::InstanceParked`].
    fn remove_function(&mut self, now: Micros, function: FunctionId, park: bool) {
        let Some(mut fs) = self.functions.remove(function) else {
            return;
        };
        if park && self.config.rules.host_cache && !fs.in_host && fs.copies > 0 {
            // Its host copy was dropped while it had a GPU copy: the copy
            // parked goes back to host memory first (over the link of one
            // GPU holding it).
            let mem = fs.profile.memory_mib;
            let us = self.config.load.swap_in_us(mem);
            if let Some(g) = self.gpus.iter_mut().find(|g| g.find(function).is_some()) {
                g.link_free_at = g.link_free_at.max(now).saturating_add(us);
            }
            fs.in_host = true;
            self.host_used_mib = self.host_used_mib.saturating_add(mem);
        }
        let park = park && self.config.rules.host_cache && fs.in_host;
        if fs.in_host && !park {
            self.host_used_mib = self.host_used_mib.saturating_sub(fs.profile.memory_mib);
        }
        if fs.reserving.is_some() {
            self.open_reservations = self.open_reservations.saturating_sub(1);
        }
        self.pins.remove(function);
        let output = &mut self.output;
        self.waiting.retain(|w| {
            let gone = w.function == function;
            if gone {
                output.push(Command::Reject {
                    request: w.request,
                    reason: RejectReason::UnknownFunction,
                });
            }
            !gone
        });
        let rules = self.config.rules;
        for g in &mut self.gpus {
            g.reject_function(function, &rules, &mut self.output);
            if let Some(i) = g.find(function) {
                if g.instances[i].running == 0 {
                    g.remove_instance(i);
                    self.output.push(Command::Unload {
                        function,
                        gpu: g.index,
                    });
                } else {
                    g.instances[i].removing = true;
                }
            }
            g.dispatch(now, &rules, &mut self.output);
        }
        if park {
            let busy = self
                .gpus
                .iter()
                .filter(|g| g.find(function).is_some())
                .count();
            fs.parked = true;
            fs.copies = busy as u32;
            fs.loading = 0;
            fs.reserving = None;
            self.functions.insert(function, fs);
        }
        if self.host_used_mib > self.config.host_memory_mib {
            // A parked copy written back may overflow host memory.
            self.shrink_host(function, &[]);
        }
        self.retry_waiting(now);
    }

    /// GPU memory one instance holds and the compute its requests get, or
    /// `None` if no GPU of this node can ever hold it.
    fn footprint(&self, profile: &FunctionProfile) -> Option<(Mib, MilliGpu, Option<MilliGpu>)> {
        footprint(&self.config, profile)
    }

    fn arrive(
        &mut self,
        now: Micros,
        request: RequestId,
        function: FunctionId,
        full_gpu_us: Micros,
        deadline: Micros,
    ) {
        if let Some(fs) = self.state_mut(function) {
            if let Some(last) = fs.last_arrival {
                let gap = now.saturating_sub(last);
                fs.mean_gap = if fs.mean_gap == NO_GAP {
                    gap
                } else {
                    (3 * fs.mean_gap + gap) / 4
                };
            }
            fs.last_arrival = Some(now);
        }
        let mut w = Waiting {
            deadline,
            request,
            function,
            full_gpu_us,
            routed_at: now,
            recheck_at: now,
        };
        if let Some(later) = self.route(now, w, true) {
            w.recheck_at = recheck_at(now, later, deadline);
            let key = (w.deadline, w.request);
            let pos = self
                .waiting
                .partition_point(|e| (e.deadline, e.request) < key);
            self.waiting.insert(pos, w);
        }
    }

    /// Retry the requests waiting for memory, earliest deadline first:
    /// each is placed, rejected, or keeps waiting.
    fn retry_waiting(&mut self, now: Micros) {
        if self.waiting.is_empty() {
            return;
        }
        let mut waiting = std::mem::take(&mut self.waiting);
        waiting.retain_mut(|w| match self.route(now, *w, false) {
            Some(later) => {
                w.routed_at = now;
                w.recheck_at = recheck_at(now, later, w.deadline);
                true
            }
            None => false,
        });
        self.waiting = waiting;
    }

    /// Route request `w`: run or queue it on a GPU (loading its function
    /// there if needed), or reject it; returns its predicted finish (at
    /// most its deadline) if it must wait for memory instead (nothing but a
    /// [`Command::Reserve`] was output). `arrival`: it has just arrived
    /// (else it was waiting).
    fn route(&mut self, now: Micros, w: Waiting, arrival: bool) -> Option<Micros> {
        let Waiting {
            deadline,
            request,
            function,
            full_gpu_us,
            ..
        } = w;
        let Some(fs) = self.state(function).copied() else {
            self.output.push(Command::Reject {
                request,
                reason: RejectReason::UnknownFunction,
            });
            return None;
        };
        let profile = fs.profile;
        let Some((mem_cost, compute, reserved)) = self.footprint(&profile) else {
            self.output.push(Command::Reject {
                request,
                reason: RejectReason::NoCapacity,
            });
            return None;
        };
        let rules = self.config.rules;
        let slotted = rules.slots_per_gpu.is_some();
        let service = profile.service_us(full_gpu_us, compute);
        let newcomer = Newcomer {
            key: (deadline, request),
            compute,
            service_us: service,
        };
        let prefer_resident = rules.wait_within_deadline && profile.tier.delayable();
        let load_us = self.load_us(&fs);

        // A pinned function may ask to be remapped onto a GPU it is not
        // pinned to: the best such load, for comparison only.
        let pins = self.pins(function);
        let may_remap = rules.remap
            && !rules.all_resident
            && pins.is_some()
            && profile.tier.remappable()
            && fs.reserving.is_none()
            && now >= fs.reserve_after;
        // The candidates, each GPU's queue counted as ahead of the request
        // (`edf` false) or, earliest deadline first, only where that is
        // harmless ([`super::gpu::GpuExecutor::compute_start`]).
        let candidates = |edf: bool| {
            // All pristine GPUs (nothing loaded, queued or running, link idle)
            // give the same prediction: only the first one is evaluated (of
            // those pinned, and of the others).
            let mut bests = Bests::default();
            let mut seen_pristine = [false; 2];
            for g in &self.gpus {
                // Without a later deadline queued, a GPU's queue counts
                // whole either way: judged so already. And only a loaded
                // copy goes ahead: one still loading (or to be loaded) is
                // passed over by dispatch until it is ready, while the
                // later deadlines take the compute.
                if edf && !g.queued_after(newcomer.key) {
                    continue;
                }
                // And only a copy ready when the compute frees for it goes
                // ahead: dispatch passes over one still loading, and the
                // later deadlines take the compute meanwhile. (A load that
                // evicts, whose write-backs may come first, never does.)
                if edf && !rules.all_resident {
                    let ready = match g.find(function) {
                        Some(i) if g.instances[i].loaded => now,
                        Some(i) => g.instances[i].ready_at.max(now),
                        None if g.free_mib < mem_cost => continue,
                        None => g.link_free_at.max(now) + load_us,
                    };
                    if ready > g.compute_start(now, &newcomer, true) {
                        continue;
                    }
                }
                let allowed = pins.is_none_or(|p| p.contains(&g.index));
                if !allowed && (!may_remap || g.find(function).is_some()) {
                    continue;
                }
                if !rules.all_resident && g.pristine(now) {
                    if seen_pristine[usize::from(allowed)] {
                        continue;
                    }
                    seen_pristine[usize::from(allowed)] = true;
                }
                let choice = if rules.all_resident {
                    Choice {
                        finish: g.compute_start(now, &newcomer, edf) + service,
                        load: false,
                        evicts: false,
                        victim: (0, 0, 0),
                        used_mib: 0,
                        gpu: g.index,
                    }
                } else if let Some(i) = g.find(function) {
                    let it = &g.instances[i];
                    let ready = if it.loaded { now } else { it.ready_at.max(now) };
                    // Batching: a request may join the running batch now.
                    let (joined, share, _) = it.join(service, compute, slotted);
                    let finish = if it.loaded
                        && it.running > 0
                        && it.batch_ppm > 0
                        && g.queue.is_empty()
                        && g.compute_free >= share
                    {
                        now + joined
                    } else if slotted {
                        ready.max(it.busy_until) + it.queued_us + service
                    } else {
                        let waited = ready.max(g.compute_start(now, &newcomer, edf)) + service;
                        // Squeezed onto the free compute now (see `GpuExecutor::dispatch`).
                        let squeezed = (rules.squeeze
                            && compute < WHOLE_GPU
                            && it.loaded
                            && g.queue.is_empty()
                            && (1..compute).contains(&g.compute_free)
                            && (it.running == 0 || it.batch_ppm == 0))
                            .then(|| now + squeezed_us(service, compute, g.compute_free));
                        squeezed.map_or(waited, |s| s.min(waited))
                    };
                    Choice {
                        finish,
                        load: false,
                        evicts: false,
                        victim: (0, 0, 0),
                        used_mib: 0,
                        gpu: g.index,
                    }
                } else {
                    if g.free_mib < mem_cost
                        && g.free_mib.saturating_add(g.evictable_mib(&rules)) < mem_cost
                    {
                        continue;
                    }
                    let evicts = g.free_mib < mem_cost;
                    let ready = g.link_free_at.max(now) + load_us;
                    let start_at = |ready: Micros| {
                        if slotted {
                            ready
                        } else {
                            ready.max(g.compute_start(now, &newcomer, edf))
                        }
                    };
                    let victim = if evicts && slotted {
                        g.instances
                            .iter()
                            .filter(|i| evictable(i, &rules))
                            .map(|i| self.victim_key(i))
                            .min()
                            .unwrap_or((0, 0, 0))
                    } else {
                        (0, 0, 0)
                    };
                    let mut choice = Choice {
                        finish: start_at(ready) + service,
                        load: true,
                        evicts,
                        victim,
                        used_mib: self.config.gpu_memory_mib.saturating_sub(g.free_mib),
                        gpu: g.index,
                    };
                    if evicts && rules.host_cache {
                        // A write-back of the victims only delays this load:
                        // skip its (costlier) sum when the load is beaten
                        // without it (a later finish keeps it beaten).
                        let beaten = if allowed { bests.load } else { bests.other };
                        if beaten.is_some_and(|b| choice >= b) {
                            continue;
                        }
                        let write_back = self.write_back_us(g, mem_cost);
                        if write_back > 0 {
                            choice.finish = start_at(ready + write_back) + service;
                        }
                    }
                    choice
                };
                bests.keep(
                    choice,
                    allowed,
                    prefer_resident && choice.finish <= deadline,
                );
            }
            bests
        };
        let mut bests = candidates(false);
        // Nothing meets the deadline behind all the queued work: earliest
        // deadline first it may still fit ahead of later deadlines, where
        // that makes none of them late. (Only then: counting the queues
        // whole spreads the load, which the next requests need.)
        // (Slotted rules wait for a slot, not for compute: the same again.)
        let misses = |b: &Bests| b.resident.or(b.all).is_none_or(|c| c.finish > deadline);
        if !slotted && misses(&bests) {
            let ahead = candidates(true);
            if !misses(&ahead) {
                // A remap's comparison keeps the GPUs the second look
                // passed over (an empty one is the natural target).
                let other = match (bests.other, ahead.other) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                bests = Bests { other, ..ahead };
            }
        }
        let Bests {
            all: best,
            load: best_load,
            resident: best_resident,
            other: best_other,
        } = bests;
        let chosen = best_resident.or(best);
        if let Some(other) = best_other {
            // Another GPU would serve it sooner: ask the region for a slice
            // there (the request itself is served where it is pinned).
            let from = chosen
                .map(|c| c.gpu)
                .or_else(|| pins.and_then(|p| p.first().copied()));
            if let Some(from) = from.filter(|_| chosen.is_none_or(|c| other.finish < c.finish)) {
                if let Some(f) = self.functions.get_mut(function) {
                    f.reserving = Some((from, other.gpu, now));
                }
                self.open_reservations = self.open_reservations.saturating_add(1);
                self.output.push(Command::Reserve {
                    function,
                    from,
                    to: other.gpu,
                });
            }
        }
        if let Some(choice) = chosen.filter(|c| c.finish <= deadline) {
            let g = choice.gpu as usize;
            let inst = if rules.all_resident {
                None
            } else if choice.load {
                Some(self.load(now, function, g, mem_cost, reserved, load_us))
            } else {
                self.gpus[g].find(function)
            };
            self.gpus[g].enqueue(
                Queued {
                    deadline,
                    request,
                    function,
                    service_us: service,
                    compute,
                    mean_gap: fs.mean_gap,
                },
                inst,
            );
            self.gpus[g].dispatch(now, &rules, &mut self.output);
            if rules.spread && !choice.load && choice.finish > now.saturating_add(service) {
                self.spread(now, function, mem_cost, compute, reserved, load_us);
            }
            return None;
        }
        // Nothing meets the deadline now: wait if memory that busy or
        // loading instances will free in time gets it done by the deadline.
        let later = if rules.wait_for_memory && !rules.all_resident {
            // A later finish beyond both the deadline and the finish now
            // changes nothing below.
            let cutoff = chosen.map_or(Micros::MAX, |c| c.finish.max(deadline));
            self.memory_wait_finish(now, function, mem_cost, load_us, &newcomer, cutoff)
        } else {
            None
        };
        if later.is_some_and(|f| f <= deadline) {
            return later;
        }
        let predicted = match (chosen.map(|c| c.finish), later) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let Some(predicted_finish) = predicted else {
            self.output.push(Command::Reject {
                request,
                reason: RejectReason::NoCapacity,
            });
            return None;
        };
        self.output.push(Command::Reject {
            request,
            reason: if arrival {
                RejectReason::DeadlineUnreachable {
                    predicted_finish,
                    deadline,
                }
            } else {
                RejectReason::DeadlineMissedInQueue {
                    earliest_finish: predicted_finish,
                    deadline,
                }
            },
        });
        if !arrival {
            return None;
        }
        // Demand exceeds the copies on the node: warm one up for the next
        // requests (a load alone may exceed this deadline) when there is
        // none, or, one at a time, when free memory holds another copy
        // without evicting anything (scale out) and an idle warm copy
        // would have met this deadline.
        let useful = now + service <= deadline;
        let warm = match best_load.filter(|_| useful) {
            Some(c) if fs.copies == 0 => Some(c),
            Some(c) if fs.loading == 0 && (rules.scale_out_evicts || !c.evicts) => Some(c),
            _ => None,
        };
        if let Some(c) = warm.filter(|_| !rules.all_resident) {
            self.load(now, function, c.gpu as usize, mem_cost, reserved, load_us);
        }
        None
    }

    /// [`ExecutorRules::spread`]: a request of `function` was served on a
    /// resident copy later than alone on its full share (it waits, is
    /// squeezed or joins a batch), so a copy is loaded, for its next
    /// requests, on a GPU with its share of compute free and nothing
    /// queued, and with its memory free or made free by evicting idle
    /// spare copies (their function has another copy) whose predicted next
    /// use is later than this function's — never a function's sole copy.
    /// GPUs with the memory free come first, then the most free compute.
    /// One load at a time, never for a pinned function, and only while the
    /// node's free memory stays at least the memory of the functions that
    /// have had requests and have no copy.
    fn spread(
        &mut self,
        now: Micros,
        function: FunctionId,
        mem_cost: Mib,
        compute: MilliGpu,
        reserved: Option<MilliGpu>,
        load_us: Micros,
    ) {
        if self.state(function).is_none_or(|f| f.loading > 0) || self.pins(function).is_some() {
            return;
        }
        let rules = self.config.rules;
        let mine = self.state(function).map_or(0, |f| f.next_use());
        // Whether evicting idle spare copies (their function has another
        // copy) next wanted later than this function frees `need` MiB on
        // GPU `g` (stops summing once it does).
        let spares_free = |g: &GpuExecutor, need: Mib| -> bool {
            let mut sum: Mib = 0;
            g.instances
                .iter()
                .filter(|i| evictable(i, &rules))
                .filter(|i| {
                    self.functions
                        .get(i.function)
                        .is_some_and(|f| f.copies > 1 && f.next_use() > mine)
                })
                .any(|i| {
                    sum = sum.saturating_add(i.mem_mib);
                    sum >= need
                })
        };
        let eligible = |g: &&GpuExecutor| {
            g.find(function).is_none() && g.compute_free >= compute && g.queue.is_empty()
        };
        let rank = |g: &&GpuExecutor| (g.compute_free, g.free_mib, std::cmp::Reverse(g.index));
        // GPUs with the memory free first; spare copies are looked at only
        // when there is none.
        let Some(target) = self
            .gpus
            .iter()
            .filter(eligible)
            .filter(|g| g.free_mib >= mem_cost)
            .max_by_key(rank)
            .or_else(|| {
                self.gpus
                    .iter()
                    .filter(eligible)
                    .filter(|g| spares_free(g, mem_cost.saturating_sub(g.free_mib)))
                    .max_by_key(rank)
            })
            .map(|g| g.index as usize)
        else {
            return;
        };
        // The memory this load takes from the node's free memory (at most
        // the target's free memory when spare copies make the rest).
        let taken = mem_cost.min(self.gpus[target].free_mib);
        let free: Mib = self.gpus.iter().map(|g| g.free_mib).sum();
        let absent: Mib = self
            .functions
            .iter()
            .map(|(_, f)| f)
            .filter(|f| f.copies == 0 && f.last_arrival.is_some())
            .map(|f| f.profile.memory_mib)
            .fold(0, Mib::saturating_add);
        if free >= absent.saturating_add(taken) {
            self.load(now, function, target, mem_cost, reserved, load_us);
        }
    }

    /// Earliest predicted finish of a request of `function` on a GPU that
    /// holds no copy of it, loading it once enough memory there is free or
    /// held by instances that will have become evictable; `None` if no GPU
    /// ever gets enough. Exact when that finish is at most `cutoff`;
    /// otherwise `None` or some finish after `cutoff`.
    fn memory_wait_finish(
        &mut self,
        now: Micros,
        function: FunctionId,
        mem_cost: Mib,
        load_us: Micros,
        n: &Newcomer,
        cutoff: Micros,
    ) -> Option<Micros> {
        let service = n.service_us;
        let rules = self.config.rules;
        let slotted = rules.slots_per_gpu.is_some();
        let mut scratch = std::mem::take(&mut self.memory_scratch);
        let mut best: Option<Micros> = None;
        let pins = self.pins.get(function).map(Vec::as_slice);
        for g in &self.gpus {
            // No finish here beats this bound: skip the GPU when the bound
            // is past the cutoff or no better than the best so far.
            let bound = g.link_free_at.max(now) + load_us + service;
            if bound > cutoff
                || best.is_some_and(|b| bound >= b)
                || g.find(function).is_some()
                || pins.is_some_and(|p| !p.contains(&g.index))
            {
                continue;
            }
            let Some(at) = g.memory_free_at(now, mem_cost, &rules, &mut scratch) else {
                continue;
            };
            let ready = at.max(g.link_free_at).max(now) + load_us;
            let start = if slotted {
                ready
            } else {
                ready.max(g.compute_start(now, n, false))
            };
            if best.is_some_and(|b| start + service >= b) {
                // A write-back only adds to it.
                continue;
            }
            // The write-back of every candidate that needs one (an upper
            // bound on that of the victims the load will take).
            let write_back = if rules.host_cache {
                g.instances
                    .iter()
                    .filter(|i| i.tier.swappable())
                    .map(|i| self.write_back_of(i, self.functions.get(i.function)))
                    .fold(0, Micros::saturating_add)
            } else {
                0
            };
            let ready = ready + write_back;
            let start = if slotted {
                ready
            } else {
                ready.max(g.compute_start(now, n, false))
            };
            let finish = start + service;
            best = Some(best.map_or(finish, |b| b.min(finish)));
        }
        self.memory_scratch = scratch;
        best
    }

    /// Where an idle instance comes in the eviction order (see [`VictimKey`]).
    fn victim_key(&self, i: &Instance) -> VictimKey {
        self.victim_key_of(i, self.functions.get(i.function))
    }

    /// [`Self::victim_key`] given its function's state `fs`.
    fn victim_key_of(&self, i: &Instance, fs: Option<&FunctionState>) -> VictimKey {
        if self.config.rules.host_cache {
            let next = fs.map_or(Micros::MAX, |f| f.next_use());
            // Under `spread`, a copy whose function has another goes first.
            let sole = self.config.rules.spread && fs.is_some_and(|f| f.copies <= 1);
            (
                2 * tier_keep_rank(i.tier) + u8::from(sole),
                Micros::MAX - next,
                i.last_used,
            )
        } else {
            (0, 0, i.last_used)
        }
    }

    /// Make room on GPU `g` and start loading `function` there; returns the
    /// new instance's index on that GPU.
    fn load(
        &mut self,
        now: Micros,
        function: FunctionId,
        g: usize,
        mem_cost: Mib,
        reserved: Option<MilliGpu>,
        load_us: Micros,
    ) -> usize {
        let rules = self.config.rules;
        // Memory is scarce here: keep one copy per function (remap below).
        let scarce = self.gpus[g].free_mib < mem_cost;
        let mut write_back: Micros = 0;
        // Victims: weakest tier, farthest predicted next use, longest idle
        // (gshare); least recently used (baselines); ties by their place on
        // the GPU (as `write_back_us` predicts them). All are chosen first,
        // so that a write-back making room in host memory never drops the
        // host copy of a later victim of the same load.
        let mut victims = std::mem::take(self.victim_scratch.get_mut());
        victims.clear();
        if self.gpus[g].free_mib < mem_cost {
            victims.extend(
                self.gpus[g]
                    .instances
                    .iter()
                    .enumerate()
                    .filter(|(_, i)| evictable(i, &rules))
                    .map(|(k, i)| (self.victim_key(i), k, i.mem_mib, 0)),
            );
            victims.sort_unstable();
            let mut free = self.gpus[g].free_mib;
            let taken = victims
                .iter()
                .take_while(|v| {
                    let short = free < mem_cost;
                    free = free.saturating_add(v.2);
                    short
                })
                .count();
            victims.truncate(taken);
        }
        // This load's function and its victims: no host copy of theirs is
        // dropped to make room for its write-backs.
        let mut keep = std::mem::take(&mut self.written_scratch);
        keep.clear();
        keep.push(function);
        keep.extend(victims.iter().map(|v| self.gpus[g].instances[v.1].function));
        for &victim in &keep[1..] {
            let Some(k) = self.gpus[g].find(victim) else {
                continue;
            };
            self.gpus[g].remove_instance(k);
            if let Some(f) = self.functions.get_mut(victim) {
                f.copies -= 1;
            }
            let gpu = g as u32;
            if rules.host_cache {
                write_back = write_back.saturating_add(self.swap_out(victim, gpu, &keep));
            } else {
                self.output.push(Command::Unload {
                    function: victim,
                    gpu,
                });
            }
        }
        *self.victim_scratch.get_mut() = victims;
        // The victims' weights that go back to host memory cross the link
        // before this load's.
        let ready_at = self.gpus[g].link_free_at.max(now) + write_back + load_us;
        self.gpus[g].link_free_at = ready_at;
        let moved_from = if rules.remap && scarce {
            self.gpus.iter().position(|o| {
                o.index as usize != g
                    && o.find(function)
                        .is_some_and(|i| o.instances[i].idle() && !o.instances[i].unpinned)
            })
        } else {
            None
        };
        // From storage (nothing of it on the node) or from host memory.
        let cold = self
            .state(function)
            .is_none_or(|f| !rules.host_cache || (!f.in_host && f.copies == 0));
        // Its weights reach host memory first: fetched from storage, or
        // written back from a GPU copy whose host copy was dropped
        // (`load_us` counts both crossings; a move too).
        self.restore_host_copy(function);
        let fs = self
            .functions
            .get_mut(function)
            .expect("routed function is placed");
        if let Some(a) = moved_from {
            let i = self.gpus[a].find(function).expect("found above");
            self.gpus[a].remove_instance(i);
            fs.copies -= 1;
            self.output.push(Command::Move {
                function,
                from: a as u32,
                to: g as u32,
                ready_at,
            });
        } else if cold {
            self.output.push(Command::ColdStart {
                function,
                gpu: g as u32,
                ready_at,
            });
        } else {
            self.output.push(Command::SwapIn {
                function,
                gpu: g as u32,
                ready_at,
            });
        }
        fs.copies += 1;
        fs.loading += 1;
        let tier = fs.profile.tier;
        let batch_ppm = fs.profile.batch_ppm;
        if self.host_used_mib > self.config.host_memory_mib {
            // Not the victims' copies (a write-back just paid for), unless
            // host memory's capacity needs them.
            self.shrink_host(function, &keep);
            if self.host_used_mib > self.config.host_memory_mib {
                self.shrink_host_to(self.config.host_memory_mib, function, &[]);
            }
        }
        self.written_scratch = keep;
        self.gpus[g].add_instance(Instance {
            function,
            tier,
            mem_mib: mem_cost,
            reserved_compute: reserved,
            loaded: false,
            ready_at,
            running: 0,
            queued: 0,
            queued_us: 0,
            busy_until: 0,
            last_used: now,
            removing: false,
            batch_ppm,
            held: 0,
            unpinned: false,
            batch_share: 0,
        })
    }

    /// Drop host copies (never those of `keep` and `also`): first those of functions
    /// with a loaded GPU copy (nothing is lost: the weights go back to host
    /// memory when the last GPU copy is evicted, [`NodeExecutor::swap_out`]),
    /// the soonest used first (the least likely to be evicted); then those
    /// of functions with no GPU copy, least recently invoked first (their
    /// next load is a cold start); down to [`HOST_LOW_WATER_PCT`] % of host
    /// memory, so that the scan over all functions is amortized. Host memory
    /// so holds weights that are on no GPU before duplicates of ones that
    /// are.
    fn shrink_host(&mut self, keep: FunctionId, also: &[FunctionId]) {
        let target = self.config.host_memory_mib / 100 * HOST_LOW_WATER_PCT;
        self.shrink_host_to(target, keep, also);
    }

    /// [`Self::shrink_host`] down to `target` MiB.
    fn shrink_host_to(&mut self, target: Mib, keep: FunctionId, also: &[FunctionId]) {
        let mut candidates = std::mem::take(&mut self.host_scratch);
        candidates.clear();
        candidates.extend(
            self.functions
                .iter()
                .filter(|(k, f)| f.in_host && *k != keep && !also.contains(k))
                .filter_map(|(k, f)| {
                    let key = if f.copies == 0 {
                        (1, f.last_arrival.unwrap_or(0))
                    } else if f.loading == 0 && !f.parked {
                        (0, f.next_use())
                    } else {
                        // A load reads the host copy now.
                        return None;
                    };
                    Some(Reverse((key, k.0)))
                }),
        );
        // A few are dropped out of many: a heap, not a sort.
        let mut heap = BinaryHeap::from(candidates);
        while self.host_used_mib > target {
            let Some(Reverse((_, k))) = heap.pop() else {
                break;
            };
            let k = FunctionId(k);
            let f = self.functions.get_mut(k).expect("listed above");
            f.in_host = false;
            self.host_used_mib = self.host_used_mib.saturating_sub(f.profile.memory_mib);
            if f.parked {
                // Nothing of it is left on the node.
                self.functions.remove(k);
            }
        }
        self.host_scratch = heap.into_vec();
    }

    fn prefetch(&mut self, now: Micros, function: FunctionId) {
        let rules = self.config.rules;
        let Some(fs) = self.state(function).copied() else {
            return;
        };
        if rules.all_resident || fs.copies > 0 {
            return;
        }
        let Some((mem_cost, _, reserved)) = self.footprint(&fs.profile) else {
            return;
        };
        let pins = self.pins.get(function).map(Vec::as_slice);
        let Some(g) = self
            .gpus
            .iter()
            .filter(|g| g.free_mib >= mem_cost && pins.is_none_or(|p| p.contains(&g.index)))
            .min_by_key(|g| (g.link_free_at.max(now), g.index))
            .map(|g| g.index as usize)
        else {
            return;
        };
        let load_us = self.load_us(&fs);
        self.load(now, function, g, mem_cost, reserved, load_us);
    }

    fn finish(&mut self, now: Micros, request: RequestId, gpu: u32) {
        let rules = self.config.rules;
        let Some(g) = self.gpus.get_mut(gpu as usize) else {
            return;
        };
        let done = g.finish(now, request);
        if let Some(function) = done {
            if let Some(i) = g.find(function) {
                if g.instances[i].removing && g.instances[i].running == 0 {
                    g.remove_instance(i);
                    self.output.push(Command::Unload { function, gpu });
                    if let Some(f) = self.functions.get_mut(function) {
                        f.copies = f.copies.saturating_sub(1);
                        if f.parked && !f.in_host && f.copies == 0 {
                            // Its host copy moved on (`move_host_copy`):
                            // nothing of it is left on the node.
                            self.functions.remove(function);
                        }
                    }
                }
            }
        }
        g.dispatch(now, &rules, &mut self.output);
        if let Some(function) = done {
            self.leave_if_unpinned(now, function, gpu);
        }
        self.retry_waiting(now);
    }

    /// See [`Event::RequestCancelled`]: a queued request's work stops
    /// counting in its GPU's predictions, and what queued behind it may
    /// start now.
    fn cancel(&mut self, now: Micros, request: RequestId) {
        if let Some(k) = self.waiting.iter().position(|w| w.request == request) {
            self.waiting.remove(k);
            return;
        }
        let rules = self.config.rules;
        let Some(g) = self.gpus.iter_mut().find_map(|g| {
            g.cancel(request, rules.all_resident)?;
            Some(g)
        }) else {
            return;
        };
        g.dispatch(now, &rules, &mut self.output);
        // A copy that waited only for it leaves before the waiting
        // requests look for memory.
        if !self.pins.is_empty() {
            self.leave_idle_unpinned(now);
        }
        self.retry_waiting(now);
    }

    /// Copies marked to leave their GPU ([`Instance::unpinned`]) that a
    /// cancel or a rejection left idle leave now (a run's end sees to
    /// its own function's copy; these have no run to end).
    fn leave_idle_unpinned(&mut self, now: Micros) {
        let idle: Vec<(FunctionId, u32)> = self
            .gpus
            .iter()
            .flat_map(|g| {
                g.instances
                    .iter()
                    .filter(|i| i.unpinned && i.idle())
                    .map(move |i| (i.function, g.index))
            })
            .collect();
        for (function, gpu) in idle {
            self.leave_if_unpinned(now, function, gpu);
        }
    }

    fn loaded(&mut self, now: Micros, function: FunctionId, gpu: u32) {
        let rules = self.config.rules;
        let Some(g) = self.gpus.get_mut(gpu as usize) else {
            return;
        };
        if let Some(i) = g.find(function) {
            if !g.instances[i].loaded {
                g.change_instance(i, |it| {
                    it.loaded = true;
                    it.last_used = now;
                });
                if let Some(f) = self.functions.get_mut(function) {
                    f.loading -= 1;
                }
            }
        }
        g.dispatch(now, &rules, &mut self.output);
        self.leave_if_unpinned(now, function, gpu);
        self.retry_waiting(now);
    }
}

/// GPU memory one instance of `profile` holds on a GPU of `config`, the
/// compute share its requests run on, and that share if it is reserved
/// (slotted rules); `None` if it cannot fit on one GPU. Slotted rules round
/// memory up to whole slots; `exclusive` functions take whole GPUs.
pub fn footprint(
    config: &NodeConfig,
    profile: &FunctionProfile,
) -> Option<(Mib, MilliGpu, Option<MilliGpu>)> {
    let mem = config.gpu_memory_mib;
    match config.rules.slots_per_gpu {
        Some(k) => {
            let slot = mem / k as u64;
            let slots = profile.memory_mib.div_ceil(slot.max(1)).max(1);
            if slots > k as u64 {
                return None;
            }
            let compute = (slots * WHOLE_GPU as u64 / k as u64) as MilliGpu;
            Some((slots * slot, compute, Some(compute)))
        }
        None => {
            let need = if profile.tier == Tier::Exclusive {
                mem
            } else {
                profile.memory_mib
            };
            (need <= mem).then_some((need, profile.request_compute(), None))
        }
    }
}

/// Before this a waiting request routed at `now` with predicted finish
/// `later` ≤ `deadline` certainly still waits: every prediction of
/// [`NodeExecutor::route`] grows by at most one µs per µs of time alone,
/// so it passes the deadline no sooner than `deadline - later + 1` from now.
fn recheck_at(now: Micros, later: Micros, deadline: Micros) -> Micros {
    now.saturating_add(deadline.saturating_sub(later))
        .saturating_add(1)
}

/// Order in which tiers give up GPU memory: oversubscribed first.
fn tier_keep_rank(tier: Tier) -> u8 {
    match tier {
        Tier::Oversubscribed => 0,
        Tier::Burstable => 1,
        Tier::Guaranteed => 2,
        Tier::Exclusive => 3,
    }
}
