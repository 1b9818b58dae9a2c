//! The supervisor: owns the node's executor and carries out its commands.

use super::group_commit::{GroupCommit, Sent, Written};
use super::metering::{HeldReply, HeldStream, InvocationKey, MeterState, Metering};
use super::{
    AbandonSliceRequests, Admission, AgentPlacement, ApplyAssignment, ApplyTokens, CheckToken,
    FlushUsage, FunctionPlacement, GpuActor, HostCopiesQuery, InstanceActor, Invoke, KeyAnswer,
    LoadDone, LoadWeights, LookupKey, MetricsQuery, MetricsSnapshot, NodeStatus, PlacementQuery,
    ReleaseInstance, ReleaseWeights, ReplyStart, RequestDone, Residency, RunRequest, SliceAnswer,
    SliceRequest, StatusQuery, StopNow, StopRuntimes, StreamOpened, TakeLoads, TakeSliceRequests,
    TakeSwapEvents,
};
use crate::gpu::{GpuInfo, SimulatedGpu};
use crate::metrics::{AgentMetrics, Measured};
use crate::runtime::{
    HttpCall, Invocation, Placement, ProcessCounters, RuntimeDriver, RuntimeError, StreamOpen,
};
use actix::{Actor, Addr, AsyncContext, Context, Handler, ResponseFuture, SpawnHandle};
use gshare_core::clock::SharedClock;
use gshare_core::config::AgentLoadCosts;
use gshare_core::executor::{
    footprint, Command, Event, ExecutorRules, FunctionId, FunctionProfile, LoadCosts, LoadMeter,
    NodeConfig, NodeExecutor, Occupancy, RejectReason, RequestId, WeightsChange,
};
use gshare_core::metering::{ResidencyId, UsageKey};
use gshare_core::model::{FunctionSpec, GpuId, Mib, Micros, MilliGpu, NodeId, Slice, TenantId};
use gshare_core::protocol::{
    cap_loads, plan_assignment, FunctionLoad, GpuStatus, HostCopy, InstanceState, InstanceStatus,
    InvokeError, InvokeOutcome, SwapEvent, SwapKind, TokenDigests, WantedFunction, MAX_HOST_COPIES,
};
use gshare_core::state::InstanceId;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The longest the agent sleeps between executor ticks, whatever
/// [`NodeExecutor::next_timeout`] says (a safety net: the executor's
/// timeouts are exact, so this tick normally finds nothing to do; an idle
/// agent wakes ten times a second).
const TICK_FALLBACK: Duration = Duration::from_millis(100);
/// How often, at most, the waiting requests are checked for callers that
/// went away ([`NodeAgent::cancel_abandoned`]), µs.
const SWEEP_EVERY_US: Micros = 50_000;
/// Swap events kept for the region when nobody collects them.
const MAX_SWAP_EVENTS: usize = 10_000;
/// Slice requests kept for the region when no link collects them (the
/// oldest are answered as refused beyond this).
const MAX_SLICE_REQUESTS: usize = 1_000;
/// Requests of one tenant that may wait here at once (admitted, not yet
/// running: queued for a GPU, a load or a swap-in); one more is refused
/// `429 over_capacity` (retryable). A waiting request holds its body, and
/// its deadline may be a day away: without a bound one tenant could fill
/// the agent's memory and its queues, which every tenant's admission reads.
pub const MAX_WAITING_PER_TENANT: u32 = 1_024;

/// Makes the runtime driver of a hosted function.
pub type DriverFactory = Box<dyn Fn(&FunctionSpec) -> Box<dyn RuntimeDriver>>;

/// What the agent needs to know about its node.
pub struct NodeSetup {
    /// The node.
    pub node: NodeId,
    /// Its GPUs.
    pub gpus: Vec<GpuInfo>,
    /// Host memory for swapped-out weights, MiB.
    pub host_swap_mib: Mib,
    /// Swap-in and cold-start costs.
    pub load: AgentLoadCosts,
    /// The runtime driver for each hosted function.
    pub driver: DriverFactory,
    /// Counters of the function processes its drivers start (`/metrics`).
    pub process_counters: ProcessCounters,
    /// Where the agent reads the time (executor `now`, metering and swap
    /// stamps, idempotency keys): [`gshare_core::clock::SystemClock`] in
    /// production, a `ManualClock` in tests.
    pub clock: SharedClock,
}

/// A hosted function: (tenant, name, version). During a reshaping
/// update's roll a node may host two versions of one function at once (an
/// outgoing instance and its replacement); invocations go to the newest
/// version with a resident copy (see `NodeAgent::serving`).
type FunctionKey = gshare_core::protocol::HostedKey;

/// At most this many released functions are kept parked (their weights
/// in host memory, see [`Parked`]); past it the oldest is forgotten.
pub const MAX_PARKED: usize = 1_024;

/// A released function whose weights the executor keeps in host memory
/// (`Event::InstanceParked`): an assignment that brings back its key with
/// the same spec moves its host copy to the new hosting's fresh id
/// (`NodeExecutor::move_host_copy`), so its first load is a swap-in, not a
/// cold start.
struct Parked {
    id: FunctionId,
    spec: FunctionSpec,
}

struct Hosted {
    /// (tenant, name, version).
    key: FunctionKey,
    spec: FunctionSpec,
    memory_mib: Mib,
    instances: Vec<InstanceId>,
    /// Each instance's slices on this node, as the last assignment gave them.
    slices: Vec<(InstanceId, Vec<Slice>)>,
    actor: Addr<InstanceActor>,
}

impl Hosted {
    /// The instance whose slices include GPU `gpu` (the first one if none does).
    fn instance_on(&self, gpu: u32) -> Option<InstanceId> {
        self.slices
            .iter()
            .find(|(_, s)| s.iter().any(|s| s.gpu.index == gpu))
            .map(|(i, _)| *i)
            .or_else(|| self.instances.first().copied())
    }
}

struct Pending {
    tx: oneshot::Sender<InvokeOutcome>,
    arrived: Micros,
    deadline: Micros,
    body: crate::runtime::RequestBody,
    /// The transparent route's request (moved into the invocation when it
    /// runs) and where the function's status and headers go.
    http: Option<HttpCall>,
    head: Option<oneshot::Sender<ReplyStart>>,
    /// When its reply started streaming (the usage up to then is billed as
    /// the invocation; the rest as compute when the stream ends).
    streamed_at: Option<Micros>,
    /// Its stream's start could not be journaled: its outcome is
    /// `usage_not_recorded` (the first byte never went out).
    stream_failed: Option<String>,
    /// The function's status and headers, once sent (the transparent
    /// route): what its idempotency key stores with the body.
    sent_head: Option<gshare_core::protocol::ReplyHead>,
    /// How its streamed body went (set when the run ended).
    streamed: Option<crate::runtime::Streamed>,
    started: Option<(Micros, u32, MilliGpu)>,
    /// Its share of `busy` was given back (a run whose answer waits for
    /// its stream's start to be journaled).
    busy_freed: bool,
    /// What its usage is metered under (set when it starts on a GPU).
    usage: Option<UsageKey>,
    /// Its idempotency key.
    key: Option<InvocationKey>,
    /// The function it calls (for its histograms).
    function: FunctionId,
    /// The tenant whose count of waiting requests ([`NodeAgent::waiting`])
    /// holds it, until it starts or is answered.
    waits_for: Option<TenantId>,
}

impl Pending {
    /// Nobody waits for its answer any more: its caller dropped the
    /// receiving end (the ingress does when the client's connection
    /// closes), and no idempotency key lets a later call pick its outcome
    /// up (a keyed request runs: a retry under its key joins or replays it).
    fn abandoned(&self) -> bool {
        self.key.is_none() && self.tx.is_closed()
    }
}

/// The node agent's supervisor actor (see the module docs of [`super`]).
pub struct NodeAgent {
    setup: NodeSetup,
    executor: NodeExecutor,
    /// The executor's time zero (its `now` is µs since this, on the clock).
    epoch: Instant,
    functions: HashMap<FunctionId, Hosted>,
    names: BTreeMap<FunctionKey, FunctionId>,
    /// Released functions whose host copy is kept (at most [`MAX_PARKED`];
    /// lost on a restart: they are memory).
    parked: BTreeMap<FunctionKey, Parked>,
    next_function: u32,
    next_request: u64,
    pending: HashMap<RequestId, Pending>,
    gpus: Vec<Addr<GpuActor>>,
    busy: Vec<MilliGpu>,
    tokens: HashMap<String, TenantId>,
    assignment_index: Option<u64>,
    tokens_index: Option<u64>,
    status: NodeStatus,
    swap_events: Vec<SwapEvent>,
    metering: Option<MeterState>,
    me: Option<Addr<NodeAgent>>,
    /// Keyed invocations running here: the function each calls, and the
    /// repeats waiting on it.
    running_keys: HashMap<InvocationKey, (String, Vec<oneshot::Sender<InvokeOutcome>>)>,
    /// Each tenant's requests admitted and not yet running (at most
    /// [`MAX_WAITING_PER_TENANT`]); tenants with none are absent.
    waiting: HashMap<TenantId, u32>,
    /// Remap halves for the region, oldest first (the link takes them).
    slice_requests: Vec<SliceRequest>,
    /// Slice requests the region link took and has not answered yet.
    slice_taken: Vec<SliceRequest>,
    /// Slices whose release was asked: left out of the pins until the
    /// assignment no longer has them.
    releasing: BTreeSet<(InstanceId, u32)>,
    /// Remaps completed (the source's release committed).
    remaps: u64,
    /// Reservations the region refused.
    remaps_refused: u64,
    /// The process's registry and histograms (`/metrics`).
    metrics: Arc<AgentMetrics>,
    /// Loads in progress: when each started and what it is.
    loads: HashMap<(FunctionId, u32), (Micros, Measured)>,
    /// The armed executor tick: when it fires, and its handle.
    wake: Option<(Micros, SpawnHandle)>,
    /// When [`NodeAgent::cancel_abandoned`] last looked.
    swept_at: Micros,
    /// Per-function load since the last report (the region's autoscaler).
    meter: LoadMeter,
    /// Why the usage journal takes no more appends (the agent is about to
    /// exit for a restart to replay it): new invocations are refused.
    journal_stopped: Option<String>,
    /// How the agent exits when its journal stops (`std::process::exit`;
    /// tests keep the process).
    exit: fn(i32),
}

impl NodeAgent {
    /// An agent for the node of `setup` (start it with `Actor::start`).
    pub fn new(setup: NodeSetup) -> Self {
        let memory = setup.gpus.iter().map(|g| g.memory_mib).min().unwrap_or(0);
        let h2d = setup
            .gpus
            .iter()
            .map(|g| g.h2d_mib_per_s)
            .min()
            .unwrap_or(1);
        let executor = NodeExecutor::new(NodeConfig {
            gpus: setup.gpus.len() as u32,
            gpu_memory_mib: memory,
            host_memory_mib: setup.host_swap_mib,
            load: LoadCosts {
                h2d_mib_per_s: h2d,
                swap_setup_us: setup.load.swap_setup_us,
                cold_setup_us: setup.load.cold_setup_us,
                storage_mib_per_s: setup.load.storage_mib_per_s,
            },
            rules: ExecutorRules::gshare(),
        });
        let n = setup.gpus.len();
        let epoch = setup.clock.now();
        Self {
            setup,
            executor,
            epoch,
            functions: HashMap::new(),
            names: BTreeMap::new(),
            parked: BTreeMap::new(),
            next_function: 0,
            next_request: 0,
            pending: HashMap::new(),
            gpus: Vec::new(),
            busy: vec![0; n],
            tokens: HashMap::new(),
            assignment_index: None,
            tokens_index: None,
            status: NodeStatus::default(),
            swap_events: Vec::new(),
            metering: None,
            me: None,
            running_keys: HashMap::new(),
            waiting: HashMap::new(),
            slice_requests: Vec::new(),
            slice_taken: Vec::new(),
            releasing: BTreeSet::new(),
            remaps: 0,
            remaps_refused: 0,
            metrics: Arc::new(AgentMetrics::new(None)),
            loads: HashMap::new(),
            wake: None,
            swept_at: 0,
            meter: LoadMeter::new(),
            journal_stopped: None,
            exit: |code| std::process::exit(code),
        }
    }

    /// Tests: what the agent calls instead of `std::process::exit` when
    /// its journal stops taking appends.
    #[cfg(test)]
    fn exiting_with(mut self, exit: fn(i32)) -> Self {
        self.exit = exit;
        self
    }

    /// Shows the tenant-labelled series of `/metrics` to a request bearing
    /// `token` (`metrics_token_file`; `None`: to nobody).
    pub fn with_metrics_token(mut self, token: Option<&str>) -> Self {
        self.metrics = Arc::new(AgentMetrics::new(token));
        self
    }

    /// The agent's metrics (registry and histograms).
    pub fn metrics(&self) -> Arc<AgentMetrics> {
        self.metrics.clone()
    }

    /// Records `seconds` of `what` for `function`, if it is still hosted.
    fn observe(&self, what: Measured, function: FunctionId, us: Micros) {
        if let Some(h) = self.functions.get(&function) {
            let seconds = gshare_core::metrics::seconds_from_us(us);
            self.metrics
                .observe(what, &h.key.0 .0, &h.key.1, h.spec.tier, seconds);
        }
    }

    /// Meters usage into `metering`'s journal; a successful result is
    /// released only once its usage is journaled (see [`super::metering`]).
    pub fn with_metering(mut self, metering: Metering) -> Self {
        let base = self.setup.clock.unix_us().saturating_sub(self.now());
        let groups = GroupCommit::new(self.setup.clock.clone(), self.epoch, base);
        self.metering = Some(MeterState::new(metering, groups, base));
        self
    }

    fn now(&self) -> Micros {
        let since = self.setup.clock.now().saturating_duration_since(self.epoch);
        Micros::try_from(since.as_micros()).unwrap_or(Micros::MAX)
    }

    fn usage_key(&self, function: FunctionId, gpu: u32) -> Option<UsageKey> {
        let m = self.metering.as_ref()?;
        let h = self.functions.get(&function)?;
        Some(UsageKey {
            tenant: h.key.0.clone(),
            function: h.key.1.clone(),
            tier: h.spec.tier,
            gpu_model: self.setup.gpus.get(gpu as usize)?.model.clone(),
            pool_kind: m.setup.pool_kind,
        })
    }

    fn residency_id(function: FunctionId, gpu: u32) -> ResidencyId {
        ResidencyId((u64::from(function.0) << 32) | u64::from(gpu))
    }

    fn resident_start(&mut self, now: Micros, function: FunctionId, gpu: u32) {
        let (Some(key), Some(h)) = (self.usage_key(function, gpu), self.functions.get(&function))
        else {
            return;
        };
        let mib = h.memory_mib;
        if let Some(m) = self.metering.as_mut() {
            let at = m.unix_base_us + now;
            let id = Self::residency_id(function, gpu);
            m.groups
                .meter(|meter| meter.resident_start(id, key, mib, at));
        }
    }

    fn resident_stop(&mut self, now: Micros, function: FunctionId, gpu: u32) {
        if let Some(m) = self.metering.as_mut() {
            let at = m.unix_base_us + now;
            let id = Self::residency_id(function, gpu);
            m.groups.meter(|meter| meter.resident_stop(id, at));
        }
    }

    /// Sends `outcome`, and to the calls that joined its key the same,
    /// or for a transparent run what its key stored (`stored`: its
    /// status and headers; they have no head of their own).
    fn release(
        &mut self,
        tx: oneshot::Sender<InvokeOutcome>,
        outcome: InvokeOutcome,
        key: Option<InvocationKey>,
        stored: Option<&crate::journal::KeyedOutcome>,
    ) {
        self.count(&outcome);
        if let Some((_, waiting)) = key.and_then(|k| self.running_keys.remove(&k)) {
            let joined = match stored {
                Some(o) if o.head.is_some() => o.replay(),
                _ => outcome.clone(),
            };
            for w in waiting {
                let _ = w.send(joined.clone());
            }
        }
        let _ = tx.send(outcome);
    }

    /// What request `p`'s key stores for `outcome` (a keyed run that
    /// answered, or a streamed one, whatever its end: its first byte went
    /// out), with `reply`'s streamed body when it streamed.
    fn stored_for(
        p: &Pending,
        outcome: &InvokeOutcome,
        streamed: Option<crate::runtime::Streamed>,
    ) -> Option<crate::journal::KeyedOutcome> {
        let (tenant, key) = p.key.clone()?;
        let stored =
            match (outcome, &p.sent_head) {
                (InvokeOutcome::Done { body, .. }, None) => {
                    Some(crate::journal::KeyedOutcome::new(tenant, key, 0, &body[..]))
                }
                (InvokeOutcome::Done { body, .. }, Some(head)) => {
                    let (len, complete) = match streamed {
                        Some(s) => (s.len, s.complete),
                        None => (body.len() as u64, true),
                    };
                    Some(crate::journal::KeyedOutcome::http(
                        tenant,
                        key,
                        0,
                        head.clone(),
                        &body[..],
                        len,
                        complete,
                    ))
                }
                // A stream cut by its deadline or a crash: its start stays
                // stored as not complete.
                (_, Some(head)) if p.streamed_at.is_some() => Some(
                    crate::journal::KeyedOutcome::http(tenant, key, 0, head.clone(), &[], 0, false),
                ),
                _ => None,
            };
        // (A keyed run that stores an outcome ran: its usage key names its function.)
        match &p.usage {
            Some(u) => stored.map(|o| o.of_function(&u.function)),
            None => stored,
        }
    }

    /// Arms the executor tick for its next timeout (at most
    /// [`TICK_FALLBACK`] away), unless one is armed no later; called after
    /// every message that feeds the executor.
    fn arm(&mut self, ctx: &mut Context<Self>) {
        let now = self.now();
        let fallback = now.saturating_add(TICK_FALLBACK.as_micros() as Micros);
        let at = self
            .executor
            .next_timeout()
            .map_or(fallback, |t| t.min(fallback));
        if let Some((armed, handle)) = self.wake {
            if armed <= at {
                return;
            }
            ctx.cancel_future(handle);
        }
        let delay = Duration::from_micros(at.saturating_sub(now));
        let handle = ctx.run_later(delay, |a, ctx| {
            a.wake = None;
            a.tick(ctx);
        });
        self.wake = Some((at, handle));
    }

    /// The armed tick fired: the executor's timeouts that are due (and, as
    /// a safety net, a tick whenever requests are pending), then re-arm.
    fn tick(&mut self, ctx: &mut Context<Self>) {
        let now = self.now();
        self.cancel_abandoned(now);
        let due = self.executor.next_timeout().is_some_and(|t| t <= now);
        if due || !self.pending.is_empty() {
            self.step(now, Event::Timer);
        }
        self.arm(ctx);
    }

    /// Requests not started whose callers went away
    /// ([`Pending::abandoned`]) leave the executor's queues (checked on
    /// ticks at least [`SWEEP_EVERY_US`] apart; ticks come at most
    /// [`TICK_FALLBACK`] apart), so that their work no longer delays or
    /// refuses others.
    fn cancel_abandoned(&mut self, now: Micros) {
        // A tick may come at every executor timeout: look at most every
        // SWEEP_EVERY.
        if now.saturating_sub(self.swept_at) < SWEEP_EVERY_US || self.pending.is_empty() {
            return;
        }
        self.swept_at = now;
        let gone: Vec<RequestId> = self
            .pending
            .iter()
            .filter(|(_, p)| p.started.is_none() && p.abandoned())
            .map(|(r, _)| *r)
            .collect();
        for request in gone {
            if self.drop_abandoned(request) {
                self.step(now, Event::RequestCancelled { request });
            }
        }
    }

    /// Forgets `request` if it has not started and nobody waits for it
    /// ([`Pending::abandoned`]): it never runs and nothing of it is billed.
    /// Returns whether it did.
    fn drop_abandoned(&mut self, request: RequestId) -> bool {
        if !self
            .pending
            .get(&request)
            .is_some_and(|p| p.started.is_none() && p.abandoned())
        {
            return false;
        }
        if let Some(p) = self.pending.remove(&request) {
            if let Some(tenant) = &p.waits_for {
                self.stop_waiting(tenant);
            }
        }
        self.status.abandoned += 1;
        true
    }

    fn step(&mut self, now: Micros, event: Event) {
        self.executor.handle(now, event);
        for command in self.executor.take_commands() {
            self.carry_out(now, command);
        }
    }

    fn answer(&mut self, request: RequestId, outcome: InvokeOutcome) {
        let now = self.now();
        self.answer_at(now, request, outcome);
    }

    /// [`Self::answer`] for a run that ended at `now`.
    fn answer_at(&mut self, now: Micros, request: RequestId, outcome: InvokeOutcome) {
        let Some(p) = self.pending.remove(&request) else {
            return;
        };
        if let Some(tenant) = &p.waits_for {
            self.stop_waiting(tenant);
        }
        if let Some((_, gpu, compute)) = p.started.filter(|_| !p.busy_freed) {
            self.busy[gpu as usize] -= compute;
        }
        if let InvokeOutcome::Done {
            queued_us,
            service_us,
            ..
        } = &outcome
        {
            self.observe(Measured::QueueWait, p.function, *queued_us);
            self.observe(
                Measured::Latency,
                p.function,
                queued_us.saturating_add(*service_us),
            );
        }
        let stored = Self::stored_for(&p, &outcome, p.streamed);
        // The journal stopped taking appends: what would wait for a write
        // (a streamed run, a completed one) is answered at once, its usage
        // not recorded (a streamed run that failed keeps its error).
        if let Some(why) = &self.journal_stopped {
            let held = p.streamed_at.is_some() || matches!(outcome, InvokeOutcome::Done { .. });
            if held && p.started.is_some() && p.usage.is_some() && self.metering.is_some() {
                let answer = match outcome {
                    failed @ InvokeOutcome::Failed(_) => failed,
                    _ => {
                        self.status.usage_withheld += 1;
                        InvokeOutcome::Failed(InvokeError::UsageNotRecorded {
                            detail: stopped_detail(why),
                        })
                    }
                };
                self.release(p.tx, answer, p.key, None);
                return;
            }
        }
        match (&outcome, p.started, p.usage, self.metering.as_mut()) {
            // A streamed run: its first part was billed when the stream
            // started; the rest is compute, whatever the end (unless the
            // start's write failed: nothing was delivered, nothing billed).
            // The outcome waits for the next write (the tail goes out
            // with it); its start was sent already (a run that ended
            // before its start's write returned is answered only once it
            // did: `MeterState::ended`).
            (_, Some((_, _, compute)), Some(key), Some(m)) if p.streamed_at.is_some() => {
                let withheld = matches!(
                    outcome,
                    InvokeOutcome::Failed(InvokeError::UsageNotRecorded { .. })
                );
                let from = m.unix_base_us + p.streamed_at.unwrap_or(now);
                let to = m.unix_base_us + now;
                // Its stored outcome goes into the same group as the usage
                // that bills it (the journal batch of that group's write).
                let group = m.groups.hold(
                    |meter| {
                        if !withheld {
                            meter.accrue_busy(&key, u64::from(compute), from, to);
                        }
                    },
                    stored.clone(),
                );
                let held = HeldReply {
                    tx: p.tx,
                    outcome,
                    key: p.key,
                    stored,
                };
                m.waiting.push((group, held));
            }
            // A plain reply (no key): the writer thread sends it itself.
            (InvokeOutcome::Done { .. }, Some((started, _, compute)), Some(key), Some(m))
                if p.key.is_none() =>
            {
                let (from, to) = (m.unix_base_us + started, m.unix_base_us + now);
                m.groups.hold_reply(
                    |meter| meter.invocation(&key, u64::from(compute), from, to),
                    p.tx,
                    outcome,
                );
            }
            (InvokeOutcome::Done { .. }, Some((started, _, compute)), Some(key), Some(m)) => {
                // Held until its usage is journaled.
                let (from, to) = (m.unix_base_us + started, m.unix_base_us + now);
                let group = m.groups.hold(
                    |meter| meter.invocation(&key, u64::from(compute), from, to),
                    stored.clone(),
                );
                let held = HeldReply {
                    tx: p.tx,
                    outcome,
                    key: p.key,
                    stored,
                };
                m.waiting.push((group, held));
            }
            _ => self.release(p.tx, outcome, p.key, stored.as_ref()),
        }
    }

    /// The journal stopped taking appends (`why`) and its writer ended:
    /// no write will come, so what waits for one (replies held for their
    /// usage, plain ones included, and held stream starts) is answered
    /// `usage_not_recorded` now (its usage was never journaled), as after a
    /// failed write; runs that ended behind a held start are answered too.
    fn withhold_held(&mut self, why: &str) {
        let e = stopped_detail(why);
        let Some(m) = self.metering.as_mut() else {
            return;
        };
        let plain = m.groups.send(|_| true, &Err(e.clone()));
        let replies = std::mem::take(&mut m.waiting);
        let streams = std::mem::take(&mut m.streams);
        let ended = std::mem::take(&mut m.ended);
        self.status.failed += plain;
        self.status.usage_withheld += plain + replies.len() as u64;
        for (_, held) in replies {
            let err = InvokeError::UsageNotRecorded { detail: e.clone() };
            self.release(held.tx, InvokeOutcome::Failed(err), held.key, None);
        }
        for (_, held) in streams {
            if let Some(p) = self.pending.get_mut(&held.request) {
                p.stream_failed = Some(e.clone());
                p.sent_head = None;
            }
        }
        for (at, done) in ended {
            self.request_done(at, done);
        }
        // Requests not begun are refused now (their turn on a GPU may come
        // after the exit, which would drop them unanswered); the executor
        // still dispatches them, and `Command::Run` then finishes each
        // without running it.
        let queued: Vec<RequestId> = self
            .pending
            .iter()
            .filter(|(_, p)| p.started.is_none())
            .map(|(r, _)| *r)
            .collect();
        for request in queued {
            self.answer(request, InvokeOutcome::Failed(InvokeError::ShuttingDown));
        }
    }

    fn count(&mut self, outcome: &InvokeOutcome) {
        match outcome {
            InvokeOutcome::Done { .. } => self.status.served += 1,
            InvokeOutcome::Failed(_) => self.status.failed += 1,
            InvokeOutcome::Replayed { .. } | InvokeOutcome::ReplayedHttp { .. } => {
                self.status.replayed += 1
            }
        }
    }

    fn swap_event(
        &mut self,
        function: FunctionId,
        kind: SwapKind,
        from: Option<u32>,
        to: Option<u32>,
        duration_us: Micros,
    ) {
        let Some(h) = self.functions.get(&function) else {
            return;
        };
        let Some(instance) = h.instance_on(from.or(to).unwrap_or(0)) else {
            return;
        };
        if self.swap_events.len() >= MAX_SWAP_EVENTS {
            self.swap_events.remove(0);
        }
        let at_ms = self.setup.clock.unix_ms();
        self.swap_events.push(SwapEvent {
            instance,
            kind,
            from_gpu: from,
            to_gpu: to,
            at_ms,
            duration_us,
        });
    }

    fn load(&mut self, now: Micros, function: FunctionId, gpu: u32, ready_at: Micros) {
        let Some(h) = self.functions.get(&function) else {
            return;
        };
        self.gpus[gpu as usize].do_send(LoadWeights {
            function,
            memory_mib: h.memory_mib,
            duration_us: ready_at.saturating_sub(now),
        });
    }

    /// Tells the function's instance where its weights are now.
    fn residency(&self, function: FunctionId, change: Placement) {
        if let Some(h) = self.functions.get(&function) {
            h.actor.do_send(Residency(change));
        }
    }

    fn carry_out(&mut self, now: Micros, command: Command) {
        // The meter follows the weights (the same rule as the simulation's).
        for change in command.weights_changes() {
            match change {
                WeightsChange::Joined { function, gpu } => self.resident_start(now, function, gpu),
                WeightsChange::Left { function, gpu } => self.resident_stop(now, function, gpu),
            }
        }
        match command {
            Command::Run {
                request,
                function,
                gpu,
                compute_milli,
                finish_at,
            } => {
                let Some(actor) = self.functions.get(&function).map(|h| h.actor.clone()) else {
                    // (The executor counted the run on its GPU: it ends here.)
                    self.answer(request, InvokeOutcome::Failed(InvokeError::UnknownFunction));
                    self.step(now, Event::RequestFinished { request, gpu });
                    return;
                };
                if !actor.connected() {
                    // The instance actor is gone: answer now instead of losing the request.
                    self.answer(
                        request,
                        InvokeOutcome::Failed(InvokeError::InstanceFailed {
                            detail: "instance actor stopped".into(),
                        }),
                    );
                    self.step(now, Event::RequestFinished { request, gpu });
                    return;
                }
                if self.journal_stopped.is_some() && self.metering.is_some() {
                    // Queued before the journal stopped: its usage could
                    // not be journaled, so it does not run (retryable).
                    self.answer(request, InvokeOutcome::Failed(InvokeError::ShuttingDown));
                    self.step(now, Event::RequestFinished { request, gpu });
                    return;
                }
                if self.drop_abandoned(request) {
                    // Its caller went away while it waited (before the
                    // tick that would have cancelled it): it does not run,
                    // and its share ends.
                    self.step(now, Event::RequestFinished { request, gpu });
                    return;
                }
                let usage = self.usage_key(function, gpu);
                let stream_to = self
                    .pending
                    .get(&request)
                    .filter(|p| p.http.is_some())
                    .map(|_| self.stream_watch(request));
                let Some(p) = self.pending.get_mut(&request) else {
                    // Answered already: it does not run, and its share ends.
                    self.step(now, Event::RequestFinished { request, gpu });
                    return;
                };
                p.started = Some((now, gpu, compute_milli));
                p.usage = usage;
                let waited = p.waits_for.take();
                self.meter.started(function, now.saturating_sub(p.arrived));
                self.busy[gpu as usize] += compute_milli;
                actor.do_send(RunRequest(Invocation {
                    request,
                    gpu,
                    compute_milli,
                    service_us: finish_at.saturating_sub(now),
                    deadline: Some(self.epoch + Duration::from_micros(p.deadline)),
                    body: std::mem::take(&mut p.body),
                    stream_to,
                    http: p.http.take(),
                }));
                if let Some(tenant) = waited {
                    self.stop_waiting(&tenant);
                }
            }
            Command::SwapIn {
                function,
                gpu,
                ready_at,
            } => {
                self.status.swap_ins += 1;
                self.meter.swapped(function);
                self.loads.insert((function, gpu), (now, Measured::SwapIn));
                self.swap_event(function, SwapKind::SwapIn, None, Some(gpu), ready_at - now);
                self.load(now, function, gpu, ready_at);
                self.residency(function, Placement::Joined(gpu));
            }
            Command::ColdStart {
                function,
                gpu,
                ready_at,
            } => {
                self.status.cold_starts += 1;
                self.loads
                    .insert((function, gpu), (now, Measured::ColdStart));
                self.swap_event(
                    function,
                    SwapKind::ColdStart,
                    None,
                    Some(gpu),
                    ready_at - now,
                );
                self.load(now, function, gpu, ready_at);
                self.residency(function, Placement::Joined(gpu));
            }
            Command::Move {
                function,
                from,
                to,
                ready_at,
            } => {
                self.status.moves += 1;
                self.meter.swapped(function);
                self.loads.insert((function, to), (now, Measured::SwapIn));
                self.swap_event(
                    function,
                    SwapKind::Move,
                    Some(from),
                    Some(to),
                    ready_at - now,
                );
                self.gpus[from as usize].do_send(ReleaseWeights { function });
                self.load(now, function, to, ready_at);
                self.residency(function, Placement::Joined(to));
                self.residency(function, Placement::Left(from));
            }
            Command::SwapOut { function, gpu } => {
                self.status.swap_outs += 1;
                self.swap_event(function, SwapKind::SwapOut, Some(gpu), None, 0);
                self.gpus[gpu as usize].do_send(ReleaseWeights { function });
                self.residency(function, Placement::Left(gpu));
            }
            Command::Unload { function, gpu } => {
                self.swap_event(function, SwapKind::Unload, Some(gpu), None, 0);
                self.gpus[gpu as usize].do_send(ReleaseWeights { function });
                self.residency(function, Placement::Left(gpu));
            }
            Command::Reject { request, reason } => {
                let arrived = self.pending.get(&request).map_or(now, |p| p.arrived);
                if let Some(p) = self
                    .pending
                    .get(&request)
                    .filter(|p| self.functions.contains_key(&p.function))
                {
                    self.meter.rejected(p.function, &reason);
                }
                let error = match reason {
                    RejectReason::DeadlineUnreachable {
                        predicted_finish,
                        deadline,
                    }
                    | RejectReason::DeadlineMissedInQueue {
                        earliest_finish: predicted_finish,
                        deadline,
                    } => InvokeError::DeadlineUnreachable {
                        predicted_us: predicted_finish.saturating_sub(arrived),
                        deadline_us: deadline.saturating_sub(arrived),
                    },
                    RejectReason::NoCapacity => InvokeError::OverCapacity,
                    RejectReason::UnknownFunction => InvokeError::UnknownFunction,
                };
                self.answer(request, InvokeOutcome::Failed(error));
            }
            Command::Reserve { function, from, to } => self.ask_reserve(now, function, from, to),
            Command::Release { function, gpu } => self.ask_release(function, gpu),
        }
    }

    fn queue_slice_request(&mut self, now: Micros, request: SliceRequest) {
        if self.slice_requests.len() >= MAX_SLICE_REQUESTS {
            let oldest = self.slice_requests.remove(0);
            self.slice_answer(now, oldest, false);
        }
        self.slice_requests.push(request);
    }

    /// Phase one of a remap: the executor's ask, for the instance holding
    /// one slice of GPU `from`; without one, it is refused here at once.
    fn ask_reserve(&mut self, now: Micros, function: FunctionId, from: u32, to: u32) {
        let found = self.functions.get(&function).and_then(|h| {
            h.slices.iter().find_map(|(id, s)| match s.as_slice() {
                [one] if one.gpu.index == from => Some((*id, one.clone())),
                _ => None,
            })
        });
        let Some((instance, source)) = found else {
            self.step(
                now,
                Event::Reserved {
                    function,
                    from,
                    to,
                    granted: false,
                },
            );
            return;
        };
        let slice = Slice {
            gpu: GpuId {
                node: self.setup.node.clone(),
                index: to,
            },
            ..source
        };
        tracing::debug!(
            instance = instance.0,
            from,
            to,
            "asking the region to remap"
        );
        self.queue_slice_request(
            now,
            SliceRequest::Reserve {
                function,
                instance,
                from,
                slice,
            },
        );
    }

    /// Phase two: the function left GPU `gpu`; the instance that holds two
    /// slices and is moving from `gpu` (a slice there other than its last,
    /// the target) gives that one up. (None: nothing to release — the GPU
    /// was the instance's placement, or already released.) Another
    /// instance's target on `gpu` is never taken for a source.
    fn ask_release(&mut self, function: FunctionId, gpu: u32) {
        let Some(instance) = self
            .functions
            .get(&function)
            .and_then(|h| moving_from(&h.slices, gpu, &self.releasing))
        else {
            return;
        };
        self.release_slice(instance, gpu);
    }

    /// Asks the region to release `instance`'s slice on GPU `gpu` (a move's
    /// source), once.
    fn release_slice(&mut self, instance: InstanceId, gpu: u32) {
        if !self.releasing.insert((instance, gpu)) {
            return;
        }
        let gpu = GpuId {
            node: self.setup.node.clone(),
            index: gpu,
        };
        let now = self.now();
        self.queue_slice_request(now, SliceRequest::Release { instance, gpu });
    }

    fn slice_answer(&mut self, now: Micros, request: SliceRequest, granted: bool) {
        match request {
            SliceRequest::Reserve {
                function,
                instance,
                from,
                slice,
            } => {
                if granted {
                    if let Some(h) = self.functions.get_mut(&function) {
                        // The assignment will say so too; the executor moves now.
                        for (id, s) in &mut h.slices {
                            if *id == instance && !s.contains(&slice) {
                                s.push(slice.clone());
                            }
                        }
                    }
                } else {
                    self.remaps_refused += 1;
                }
                tracing::debug!(
                    instance = instance.0,
                    from,
                    to = slice.gpu.index,
                    granted,
                    "remap answer"
                );
                self.step(
                    now,
                    Event::Reserved {
                        function,
                        from,
                        to: slice.gpu.index,
                        granted,
                    },
                );
            }
            SliceRequest::Release { instance, gpu } => {
                if granted {
                    self.remaps += 1;
                } else {
                    // Not released (or nothing to release): the next
                    // assignment tells what the instance holds.
                    self.releasing.remove(&(instance, gpu.index));
                }
            }
        }
    }

    /// Pins every hosted function to its instances' slices. An instance
    /// holding two slices with no remap asked for it (an answer lost, or an
    /// agent restarted mid-move) keeps its last one, the target: its source
    /// is left and released, by the executor once its copy there is idle
    /// ([`Command::Release`]), or at once where it has no copy there (the
    /// copy went meanwhile, or the agent restarted) or where the function
    /// stays pinned to that GPU for another of its instances (its copy
    /// never leaves, so no release would come): the slice would otherwise
    /// stay reserved, and the instance unable to move again.
    fn pin_all(&mut self, now: Micros) {
        // (function, the GPUs it is pinned to, the move sources it left)
        type Pin = (FunctionId, Vec<u32>, Vec<(InstanceId, u32)>);
        let mut pins: Vec<Pin> = Vec::new();
        for (id, h) in &self.functions {
            let asked = self.executor.reserving(*id).is_some();
            let mut gpus = Vec::new();
            let mut left = Vec::new();
            for (inst, s) in &h.slices {
                let keep = if s.len() > 1 && !asked && h.spec.tier.remappable() {
                    left.extend(s[..s.len() - 1].iter().map(|s| (*inst, s.gpu.index)));
                    &s[s.len() - 1..]
                } else {
                    &s[..]
                };
                gpus.extend(
                    keep.iter()
                        .map(|s| s.gpu.index)
                        .filter(|g| !self.releasing.contains(&(*inst, *g))),
                );
            }
            pins.push((*id, gpus, left));
        }
        for (id, gpus, left) in pins {
            self.executor.pin(now, id, &gpus);
            for command in self.executor.take_commands() {
                self.carry_out(now, command);
            }
            for (instance, gpu) in left {
                let copy = gpu < self.executor.config().gpus
                    && self.executor.gpu(gpu).resident().any(|f| f == id);
                if !copy || gpus.contains(&gpu) {
                    self.release_slice(instance, gpu);
                }
            }
        }
    }

    fn add_function(
        &mut self,
        ctx: &mut Context<Self>,
        key: FunctionKey,
        spec: FunctionSpec,
        instances: Vec<InstanceId>,
        placed: Vec<(InstanceId, Vec<Slice>)>,
    ) {
        let slices: Vec<Slice> = placed.iter().flat_map(|(_, s)| s.clone()).collect();
        // Always a fresh id: a late answer about an earlier hosting (a load
        // or request of its old actor) must not be taken for this one's.
        let id = FunctionId(self.next_function);
        self.next_function += 1;
        // The same weights parked here: move them to the new id (a swap-in
        // on the first request). Another spec under the key: forget them.
        let revived = match self.parked.remove(&key) {
            Some(p) if p.spec == spec && self.executor.move_host_copy(p.id, id) => true,
            Some(p) => {
                self.forget_parked(p.id);
                false
            }
            None => false,
        };
        if revived {
            tracing::info!(function = %id, "resuming {}/{} from host memory", key.0 .0, key.1);
        }
        let profile = FunctionProfile {
            tier: spec.tier,
            memory_mib: spec.memory_mib,
            saturation_milli: spec.latency.saturation_milli,
            batch_ppm: 0,
        };
        let memory_mib =
            footprint(self.executor.config(), &profile).map_or(spec.memory_mib, |f| f.0);
        let driver = (self.setup.driver)(&spec);
        let actor =
            InstanceActor::new(driver, spec.clone(), slices, ctx.address().recipient()).start();
        tracing::info!(function = %id, "hosting {}/{} ({:?}, {} MiB)", key.0 .0, key.1, spec.tier, spec.memory_mib);
        self.names.insert(key.clone(), id);
        self.functions.insert(
            id,
            Hosted {
                key,
                spec,
                memory_mib,
                instances,
                slices: placed,
                actor,
            },
        );
        let now = self.now();
        self.step(
            now,
            Event::InstanceAdded {
                function: id,
                profile,
            },
        );
        self.feed_start_estimates(now);
    }

    /// Gives the executor the current start estimate of every hosted
    /// function whose runtime measures its starts (microVM boots; see
    /// [`ProcessCounters::start_estimate_us`]): its loads are then timed by
    /// the driver's measured boot-to-ready, not the bandwidth model. Called
    /// when a function arrives and after each load (a boot measured since
    /// shows in the next load's timing).
    fn feed_start_estimates(&mut self, now: Micros) {
        let counters = self.setup.process_counters.clone();
        let estimates: Vec<(FunctionId, Micros)> = self
            .functions
            .iter()
            .filter_map(|(id, h)| Some((*id, counters.start_estimate_us(h.spec.runtime)?)))
            .collect();
        for (function, start_us) in estimates {
            self.step(now, Event::StartMeasured { function, start_us });
        }
    }

    /// The region released the function: its GPU copies go; its weights
    /// stay parked in host memory if the executor holds them there.
    fn remove_function(&mut self, id: FunctionId) {
        if let Some(h) = self.functions.get(&id) {
            tracing::info!(function = %id, "releasing {}/{}", h.key.0 .0, h.key.1);
            h.actor.do_send(ReleaseInstance);
            self.names.remove(&h.key);
        }
        let now = self.now();
        self.step(now, Event::InstanceParked { function: id });
        if let Some(h) = self.functions.remove(&id) {
            if self.executor.in_host(id) {
                if let Some(old) = self.parked.insert(h.key, Parked { id, spec: h.spec }) {
                    self.forget_parked(old.id);
                }
            }
        }
        self.sweep_parked();
        self.loads.retain(|(f, _), _| *f != id);
        self.meter.forget(id);
        // Its residency ended with the Unload above: journal it now.
        if let Some(m) = &self.metering {
            m.groups.memory_due();
        }
    }

    /// Drops a parked function's host copy.
    fn forget_parked(&mut self, id: FunctionId) {
        let now = self.now();
        self.step(now, Event::InstanceRemoved { function: id });
    }

    /// Forgets parked entries whose host copy the executor dropped (to make
    /// room), and the oldest ones past [`MAX_PARKED`].
    fn sweep_parked(&mut self) {
        let executor = &self.executor;
        self.parked.retain(|_, p| executor.in_host(p.id));
        while self.parked.len() > MAX_PARKED {
            let oldest = self
                .parked
                .iter()
                .min_by_key(|(_, p)| p.id.0)
                .map(|(k, p)| (k.clone(), p.id));
            let Some((key, id)) = oldest else { break };
            self.parked.remove(&key);
            self.forget_parked(id);
        }
        self.status.parked = self.parked.len() as u32;
    }
}

impl Actor for NodeAgent {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let me = ctx.address();
        self.me = Some(me.clone());
        if let Some(m) = &self.metering {
            let journal = m.setup.journal.clone();
            if let Err(e) = m.groups.spawn_writer(journal, me.downgrade()) {
                // Without its writer nothing metered could be released:
                // fail closed (pending requests are answered `shutting_down`).
                tracing::error!("cannot start the usage journal writer: {e}");
                actix::ActorContext::stop(ctx);
                return;
            }
            ctx.run_interval(m.setup.interval, |a, _| {
                if let Some(m) = &a.metering {
                    if !m.flushed {
                        m.groups.memory_due();
                    }
                }
            });
        }
        self.gpus = self
            .setup
            .gpus
            .iter()
            .map(|g| GpuActor::new(SimulatedGpu::new(g.clone()), me.clone().recipient()).start())
            .collect();
        self.arm(ctx);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        for (_, p) in self.pending.drain() {
            let _ = p.tx.send(InvokeOutcome::Failed(InvokeError::ShuttingDown));
        }
        if let Some(m) = self.metering.as_mut() {
            for (_, held) in m.waiting.drain(..) {
                let _ = held
                    .tx
                    .send(InvokeOutcome::Failed(InvokeError::ShuttingDown));
            }
            m.streams.clear();
            m.ended.clear();
            m.groups.close();
        }
        for (_, (_, waiting)) in self.running_keys.drain() {
            for tx in waiting {
                let _ = tx.send(InvokeOutcome::Failed(InvokeError::ShuttingDown));
            }
        }
    }
}

/// The `usage_not_recorded` detail of a run answered after the journal
/// stopped taking appends (`why`).
fn stopped_detail(why: &str) -> String {
    format!(
        "the usage journal stopped taking appends ({why}); the agent restarts to replay it: what was not yet recorded of this call's usage is not billed; retry it under the same idempotency key"
    )
}

impl Handler<Written> for NodeAgent {
    type Result = ();

    fn handle(&mut self, msg: Written, ctx: &mut Context<Self>) {
        // Known before this write's answers go out: a run they answer
        // (one that ended behind a held stream start) must not be held
        // again for a write that will not come.
        if let Some(why) = &msg.fatal {
            self.journal_stopped = Some(why.clone());
        }
        // A refused write is counted as a failure by `written`.
        let counted = msg.result.is_err();
        // The writer writes one group at a time, in order: everything
        // tagged up to its group was in this write or an earlier one.
        self.written(msg.result, msg.sent, |tag| tag <= msg.group);
        if let Some(why) = msg.fatal {
            // Its usage is durable and released; nothing more can be
            // journaled until a restart replays the log's entry into the
            // journal's tree: exit (code 70) once the released answers
            // are out, for the supervisor to restart the agent
            // (systemd `Restart=on-failure`). Meanwhile no new invocation
            // runs: its usage could not be journaled (it would be
            // withheld after running), and a keyed one could not be looked
            // up in the entry not yet in the tree, so a retry after the
            // restart would run it again.
            tracing::error!(
                "usage journal stopped taking appends ({why}); the agent exits to replay it"
            );
            if !counted {
                self.status.usage_write_failures += 1;
            }
            self.withhold_held(&why);
            ctx.run_later(std::time::Duration::from_millis(500), |agent, _| {
                (agent.exit)(70);
            });
        }
    }
}

impl Handler<FlushUsage> for NodeAgent {
    type Result = ();

    fn handle(&mut self, _: FlushUsage, _: &mut Context<Self>) {
        let Some(m) = self.metering.as_mut() else {
            return;
        };
        // Everything metered up to now, as a group of its own: it releases
        // the replies tagged with it; those of a group the writer is
        // writing wait for that write (this one may not cover it).
        let group = m.groups.take_all();
        m.flushed = true;
        let number = group.number;
        let mut durable = None;
        let appended =
            m.setup
                .journal
                .append_keyed_then(group.records, group.keyed, group.now_ms, |n| {
                    durable = Some(n)
                });
        let result = match (appended, durable) {
            (Ok(seqs), _) => Ok(seqs.end - seqs.start),
            // Durable (a restart replays what the journal's tree lacks).
            (Err(e), Some(n)) => {
                tracing::error!("usage journal: the final flush is durable but not applied: {e}");
                Ok(n)
            }
            (Err(e), None) => Err(super::group_commit::withheld_because(&e)),
        };
        let sent = match m.groups.send(|tag| tag == number, &result) {
            n if result.is_ok() => Sent::Released(n),
            n => Sent::Failed(n),
        };
        self.written(result, sent, |tag| tag == number);
    }
}

impl NodeAgent {
    /// Releases (or, on a failed append, fails) the replies and stream
    /// starts of a write: those whose tag `covered` accepts; `sent` plain
    /// replies of it were sent by the writer (counted here).
    fn written(&mut self, result: Result<u64, String>, sent: Sent, covered: impl Fn(u64) -> bool) {
        let Some(m) = self.metering.as_mut() else {
            return;
        };
        let (streams, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut m.streams)
            .into_iter()
            .partition(|(tag, _)| covered(*tag));
        m.streams = rest;
        let (replies, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut m.waiting)
            .into_iter()
            .partition(|(tag, _)| covered(*tag));
        m.waiting = rest;
        let (released, failed) = match sent {
            Sent::Released(n) => (n, 0),
            Sent::Failed(n) => (0, n),
        };
        self.status.served += released;
        self.status.failed += failed;
        self.status.usage_withheld += failed;
        match result {
            // A group with nothing in it (an interval tick with nothing
            // resident) wrote nothing: not counted as a write.
            Ok(0) if replies.is_empty() && streams.is_empty() && released == 0 => {}
            Ok(records) => {
                self.status.usage_writes += 1;
                self.status.usage_records += records;
                m.setup.appended.notify_one();
                // Starts first (a run's end is released only after its
                // start: see `MeterState::ended`).
                for (_, held) in streams {
                    let _ = held.tx.send(held.start);
                }
                for (_, held) in replies {
                    self.release(held.tx, held.outcome, held.key, held.stored.as_ref());
                }
            }
            Err(e) => {
                self.status.usage_write_failures += 1;
                self.status.usage_withheld += replies.len() as u64;
                tracing::error!(
                    withheld = replies.len() as u64 + failed,
                    "usage journal append failed, results withheld: {e}"
                );
                for (_, held) in replies {
                    let err = InvokeError::UsageNotRecorded { detail: e.clone() };
                    self.release(held.tx, InvokeOutcome::Failed(err), held.key, None);
                }
                // Dropping the chunks stops the function's reply; the run's
                // outcome (its RequestDone) becomes usage_not_recorded.
                for (_, held) in streams {
                    if let Some(p) = self.pending.get_mut(&held.request) {
                        p.stream_failed = Some(e.clone());
                        p.sent_head = None;
                    }
                }
            }
        }
        // Runs that ended while their start was held: that write returned.
        let Some(m) = self.metering.as_mut() else {
            return;
        };
        let (ready, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut m.ended)
            .into_iter()
            .partition(|(_, done)| !m.streams.iter().any(|(_, h)| h.request == done.request));
        m.ended = rest;
        for (at, done) in ready {
            self.request_done(at, done);
        }
    }
}

impl Handler<CheckToken> for NodeAgent {
    type Result = bool;

    fn handle(&mut self, msg: CheckToken, _: &mut Context<Self>) -> bool {
        self.tokens.get(&msg.digest) == Some(&msg.tenant)
    }
}

impl Handler<Invoke> for NodeAgent {
    type Result = Admission;

    fn handle(&mut self, msg: Invoke, ctx: &mut Context<Self>) -> Admission {
        if let Some(digest) = &msg.token_digest {
            if self.tokens.get(digest) != Some(&msg.tenant) {
                return Admission::Unauthorized;
            }
        }
        let (tx, rx) = oneshot::channel();
        if self.journal_stopped.is_some() {
            // Retryable: another agent, or this one once restarted.
            let outcome = InvokeOutcome::Failed(InvokeError::ShuttingDown);
            self.count(&outcome);
            let _ = tx.send(outcome);
            return Admission::Accepted(rx);
        }
        let invocation_key = msg.idempotency_key.map(|k| (msg.tenant.clone(), k));
        if let Some(k) = &invocation_key {
            match self.key_answer(k, Some(&msg.function)) {
                KeyAnswer::Known(outcome) => {
                    self.count(&outcome);
                    let _ = tx.send(outcome);
                    return Admission::Accepted(rx);
                }
                KeyAnswer::Running(joined) => return Admission::Accepted(joined),
                KeyAnswer::Unknown => {}
            }
        }
        let Some(function) = self.serving(&msg.tenant, &msg.function) else {
            let outcome = InvokeOutcome::Failed(InvokeError::UnknownFunction);
            self.count(&outcome);
            let _ = tx.send(outcome);
            return Admission::Accepted(rx);
        };
        let waiting = self.waiting.get(&msg.tenant).copied().unwrap_or(0);
        if waiting >= MAX_WAITING_PER_TENANT {
            let outcome = InvokeOutcome::Failed(InvokeError::OverCapacity);
            self.count(&outcome);
            let _ = tx.send(outcome);
            return Admission::Accepted(rx);
        }
        let spec = &self.functions[&function].spec;
        let full_gpu_us = spec.latency.full_gpu_us;
        let deadline_ms = msg.deadline_ms.unwrap_or(spec.deadline_ms);
        let now = self.now();
        let deadline = now.saturating_add(deadline_ms.saturating_mul(1000));
        let request = RequestId(self.next_request);
        self.next_request += 1;
        let (http, head) = match msg.http {
            Some(t) => (Some(t.call), Some(t.head)),
            None => (None, None),
        };
        self.pending.insert(
            request,
            Pending {
                tx,
                arrived: now,
                deadline,
                body: msg.body,
                http,
                head,
                streamed_at: None,
                stream_failed: None,
                sent_head: None,
                streamed: None,
                started: None,
                busy_freed: false,
                usage: None,
                key: invocation_key.clone(),
                function,
                waits_for: Some(msg.tenant.clone()),
            },
        );
        self.waiting.insert(msg.tenant, waiting.saturating_add(1));
        if let Some(k) = invocation_key {
            self.running_keys.insert(k, (msg.function, Vec::new()));
        }
        self.meter.arrived(function);
        self.step(
            now,
            Event::RequestArrived {
                request,
                function,
                full_gpu_us,
                deadline,
            },
        );
        self.arm(ctx);
        Admission::Accepted(rx)
    }
}

impl NodeAgent {
    /// One request of `tenant` no longer waits (it started, or was answered).
    fn stop_waiting(&mut self, tenant: &TenantId) {
        if let Some(n) = self.waiting.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.waiting.remove(tenant);
            }
        }
    }

    /// What is known here of the invocation under `key`: running (a
    /// channel for its outcome), completed (its stored answer), or nothing.
    ///
    /// A key names one call: asked for `function` (an invocation; `None`: a
    /// replica's look-up of a key it sent) while it runs or is stored for
    /// another function of the tenant, the answer is `KeyReused` and
    /// nothing runs (a record stored before records named their function
    /// is not checked).
    fn key_answer(&mut self, key: &InvocationKey, function: Option<&str>) -> KeyAnswer {
        let reused = |of: &str| {
            KeyAnswer::Known(InvokeOutcome::Failed(InvokeError::KeyReused {
                function: of.to_string(),
            }))
        };
        if let Some((of, waiting)) = self.running_keys.get_mut(key) {
            if function.is_some_and(|f| f != of) {
                return reused(of);
            }
            let (tx, rx) = oneshot::channel();
            waiting.push(tx);
            return KeyAnswer::Running(rx);
        }
        let Some(m) = &self.metering else {
            return KeyAnswer::Unknown;
        };
        match m
            .setup
            .journal
            .keyed(&key.0, &key.1, self.setup.clock.unix_ms())
        {
            Ok(Some(stored)) => match (&stored.function, function) {
                (Some(of), Some(f)) if of != f => reused(of),
                _ => KeyAnswer::Known(stored.replay()),
            },
            Ok(None) => KeyAnswer::Unknown,
            // Running it again could bill it twice: refuse instead.
            Err(e) => KeyAnswer::Known(InvokeOutcome::Failed(InvokeError::InstanceFailed {
                detail: format!("idempotency key lookup: {e}"),
            })),
        }
    }
}

impl Handler<LookupKey> for NodeAgent {
    type Result = KeyAnswer;

    fn handle(&mut self, msg: LookupKey, _: &mut Context<Self>) -> KeyAnswer {
        self.key_answer(&(msg.tenant, msg.key), None)
    }
}

impl Handler<RequestDone> for NodeAgent {
    type Result = ();

    fn handle(&mut self, msg: RequestDone, ctx: &mut Context<Self>) {
        let now = self.now();
        let (request, gpu) = (msg.request, msg.gpu);
        let start_held = self
            .metering
            .as_ref()
            .is_some_and(|m| m.streams.iter().any(|(_, h)| h.request == request));
        if start_held {
            // Its stream's start is still being journaled: answered when
            // that write returns (see `MeterState::ended`). Its GPU share
            // is free now, as the executor's is.
            if let Some(p) = self.pending.get_mut(&request) {
                if let Some((_, gpu, compute)) = p.started.filter(|_| !p.busy_freed) {
                    self.busy[gpu as usize] -= compute;
                    p.busy_freed = true;
                }
            }
            if let Some(m) = self.metering.as_mut() {
                m.ended.push((now, msg));
            }
        } else {
            self.request_done(now, msg);
        }
        self.step(now, Event::RequestFinished { request, gpu });
        self.arm(ctx);
    }
}

impl NodeAgent {
    /// Answers a run that ended at `now` with its outcome.
    fn request_done(&mut self, now: Micros, msg: RequestDone) {
        let failed_stream = self
            .pending
            .get_mut(&msg.request)
            .and_then(|p| p.stream_failed.take());
        let outcome = match (msg.result, self.pending.get_mut(&msg.request)) {
            (_, Some(_)) if failed_stream.is_some() => {
                InvokeOutcome::Failed(InvokeError::UsageNotRecorded {
                    detail: failed_stream.unwrap_or_default(),
                })
            }
            (Ok(reply), Some(p)) => {
                let started = p.started.map_or(p.arrived, |s| s.0);
                // The head first: the outcome may wait for the journal,
                // and the ingress answers only once it has it.
                if let Some(head) = p.head.take() {
                    p.sent_head = Some(reply.head.clone());
                    let start = ReplyStart {
                        head: reply.head,
                        chunks: None,
                    };
                    let _ = head.send(start);
                }
                p.streamed = reply.streamed;
                InvokeOutcome::Done {
                    body: reply.body,
                    queued_us: started - p.arrived,
                    service_us: now - started,
                }
            }
            (Err(RuntimeError::Crashed(detail)), _) => {
                InvokeOutcome::Failed(InvokeError::FunctionCrashed { detail })
            }
            (Err(RuntimeError::DeadlineExceeded(_)), Some(p)) => {
                // (Not for a function removed meanwhile: its counts were
                // forgotten, and a new entry would never be reported.)
                if self.functions.contains_key(&p.function) {
                    self.meter.missed(p.function);
                }
                InvokeOutcome::Failed(InvokeError::DeadlineUnreachable {
                    predicted_us: now.saturating_sub(p.arrived),
                    deadline_us: p.deadline.saturating_sub(p.arrived),
                })
            }
            (Err(e), _) => InvokeOutcome::Failed(InvokeError::InstanceFailed {
                detail: e.to_string(),
            }),
            (Ok(_), None) => InvokeOutcome::Failed(InvokeError::UnknownFunction),
        };
        // A no-op when the request was already answered.
        self.answer_at(now, msg.request, outcome);
    }
}

impl NodeAgent {
    /// Where a driver sends the start of request `request`'s streamed
    /// reply: a task passes it on as [`StreamOpened`].
    fn stream_watch(&self, request: RequestId) -> oneshot::Sender<StreamOpen> {
        let (tx, rx) = oneshot::channel();
        if let Some(me) = self.me.clone() {
            actix::spawn(async move {
                if let Ok(open) = rx.await {
                    me.do_send(StreamOpened { request, open });
                }
            });
        }
        tx
    }
}

impl Handler<StreamOpened> for NodeAgent {
    type Result = ();

    /// The usage of the run so far is metered as the invocation; the head
    /// and chunks go to the ingress once that is journaled (at once
    /// without metering).
    fn handle(&mut self, msg: StreamOpened, _: &mut Context<Self>) {
        let now = self.now();
        let Some(p) = self.pending.get_mut(&msg.request) else {
            return;
        };
        let Some(tx) = p.head.take() else {
            return;
        };
        p.streamed_at = Some(now);
        p.sent_head = Some(msg.open.head.clone());
        // A keyed run stores its start with its first byte's usage: a
        // retry of the key while (or after) it streams never runs it again.
        let stored = p.key.clone().map(|(tenant, key)| {
            let o = crate::journal::KeyedOutcome::http(
                tenant,
                key,
                0,
                msg.open.head.clone(),
                &[],
                0,
                false,
            );
            match &p.usage {
                Some(u) => o.of_function(&u.function),
                None => o,
            }
        });
        let start = ReplyStart {
            head: msg.open.head,
            chunks: Some(msg.open.chunks),
        };
        if let Some(why) = &self.journal_stopped {
            if self.metering.is_some() && p.usage.is_some() {
                // Its first byte's usage cannot be journaled: nothing goes
                // out (the chunks dropped stop the reply), and its end is
                // answered `usage_not_recorded`.
                p.stream_failed = Some(stopped_detail(why));
                p.sent_head = None;
                return;
            }
        }
        match (p.started, p.usage.clone(), self.metering.as_mut()) {
            (Some((started, _, compute)), Some(key), Some(m)) => {
                let (from, to) = (m.unix_base_us + started, m.unix_base_us + now);
                // Its start under its key goes into the same group as its
                // first byte's usage (and before its end, held later).
                let group = m.groups.hold(
                    |meter| meter.invocation(&key, u64::from(compute), from, to),
                    stored,
                );
                let held = HeldStream {
                    request: msg.request,
                    tx,
                    start,
                };
                m.streams.push((group, held));
            }
            _ => {
                let _ = tx.send(start);
            }
        }
    }
}

impl Handler<LoadDone> for NodeAgent {
    type Result = ();

    fn handle(&mut self, msg: LoadDone, ctx: &mut Context<Self>) {
        if msg.error.is_some() {
            self.status.accounting_errors += 1;
        }
        let now = self.now();
        if let Some((started, what)) = self.loads.remove(&(msg.function, msg.gpu)) {
            if msg.error.is_none() {
                self.observe(what, msg.function, now.saturating_sub(started));
            }
        }
        self.step(
            now,
            Event::LoadFinished {
                function: msg.function,
                gpu: msg.gpu,
            },
        );
        self.feed_start_estimates(now);
        self.arm(ctx);
    }
}

impl Handler<ApplyAssignment> for NodeAgent {
    type Result = ();

    fn handle(&mut self, ApplyAssignment(a): ApplyAssignment, ctx: &mut Context<Self>) {
        let hosted = self.functions.values().map(|h| (&h.key, &h.spec));
        let Some(plan) = plan_assignment(self.assignment_index, &self.setup.node, a, hosted) else {
            return;
        };
        self.assignment_index = Some(plan.index);
        for instance in &plan.foreign {
            tracing::warn!(
                instance = instance.0,
                "assigned slices of another node; ignored"
            );
        }
        // A release is done once the assignment no longer has the slice.
        self.releasing.retain(|r| plan.held.contains(r));
        for key in &plan.stale {
            if let Some(id) = self.names.get(key).copied() {
                self.remove_function(id);
            }
        }
        let mut added = Vec::new();
        for (
            key,
            WantedFunction {
                spec,
                instances,
                slices,
                ..
            },
        ) in plan.wanted
        {
            match self.names.get(&key) {
                Some(id) => {
                    if let Some(h) = self.functions.get_mut(id) {
                        h.instances = instances;
                        h.slices = slices;
                    }
                }
                None => {
                    let warm = !spec.tier.swappable();
                    self.add_function(ctx, key.clone(), spec, instances, slices);
                    if let Some(id) = self.names.get(&key).filter(|_| warm) {
                        added.push(*id);
                    }
                }
            }
        }
        let now = self.now();
        self.pin_all(now);
        // Instances that are never swapped out hold their memory anyway:
        // their weights are loaded now (onto a pinned GPU with room; nothing
        // is evicted), so the first request runs without a cold start and
        // `?wait=ready` sees them resident. `oversubscribed` ones load on
        // their first request.
        for function in added {
            self.step(now, Event::Prefetch { function });
        }
        self.sweep_parked();
        self.status.functions = self.functions.len() as u32;
        self.arm(ctx);
    }
}

impl Handler<ApplyTokens> for NodeAgent {
    type Result = ();

    fn handle(&mut self, ApplyTokens(t): ApplyTokens, _: &mut Context<Self>) {
        if self.tokens_index.is_some_and(|i| t.applied_index < i) {
            return;
        }
        self.tokens_index = Some(t.applied_index);
        self.tokens = token_table(t);
    }
}

/// The instance among `slices` (a function's instances and their slices,
/// a move's target last) that is moving from GPU `gpu`: its slice there is
/// not its last (another instance's target there is not a source), and
/// its release there is not already asked for (`releasing`).
fn moving_from(
    slices: &[(InstanceId, Vec<Slice>)],
    gpu: u32,
    releasing: &BTreeSet<(InstanceId, u32)>,
) -> Option<InstanceId> {
    slices
        .iter()
        .find(|(id, s)| {
            s.split_last()
                .is_some_and(|(_, sources)| sources.iter().any(|s| s.gpu.index == gpu))
                && !releasing.contains(&(*id, gpu))
        })
        .map(|(id, _)| *id)
}

fn token_table(t: TokenDigests) -> HashMap<String, TenantId> {
    let mut out = HashMap::new();
    for tenant in t.tenants {
        for d in tenant.digests {
            out.insert(d, tenant.tenant.clone());
        }
    }
    out
}

impl Handler<MetricsQuery> for NodeAgent {
    type Result = MetricsSnapshot;

    fn handle(&mut self, _: MetricsQuery, ctx: &mut Context<Self>) -> MetricsSnapshot {
        MetricsSnapshot {
            status: <Self as Handler<StatusQuery>>::handle(self, StatusQuery, ctx),
            metrics: self.metrics.clone(),
        }
    }
}

impl Handler<StatusQuery> for NodeAgent {
    type Result = NodeStatus;

    fn handle(&mut self, _: StatusQuery, _: &mut Context<Self>) -> NodeStatus {
        let mut s = self.status.clone();
        s.in_flight = self.pending.len() as u32;
        s.at_ms = self.setup.clock.unix_ms();
        let p = &self.setup.process_counters;
        s.process_starts = p.starts();
        s.process_crashes = p.crashes();
        s.process_restarts = p.restarts();
        s.process_failed_starts = p.failed_starts();
        s.process_running = p.running();
        s.vm_accel = p.vm_accel();
        s.vm_boots = p.vm_boots();
        s.vm_boot_last_us = p.vm_boot_last_us().unwrap_or(0);
        s.vm_boot_median_us = p.vm_boot_median_us().unwrap_or(0);
        s.vms = p.running_vms();
        s.usage_waiting = self
            .metering
            .as_ref()
            .map_or(0, |m| (m.waiting.len() + m.ended.len()) as u64);
        s.gpus = (0..self.setup.gpus.len() as u32)
            .map(|i| {
                let g = self.executor.gpu(i);
                GpuStatus {
                    index: i,
                    utilization_milli: self.busy[i as usize],
                    memory_used_mib: self.executor.config().gpu_memory_mib - g.free_mib(),
                    resident: g
                        .resident()
                        .filter_map(|f| self.functions.get(&f).and_then(|h| h.instance_on(i)))
                        .collect(),
                    queued: g.queued() as u32,
                    measured_utilization_pct: None,
                    measured_memory_used_mib: None,
                }
            })
            .collect();
        s.instances = self.instance_states();
        s
    }
}

impl NodeAgent {
    /// The hosted version of `tenant`'s function `name` an invocation goes
    /// to: the newest one with a copy loaded on a GPU, or else the newest
    /// (its copy loads for the request). While a reshaping update's new
    /// version loads beside the old one, calls keep going to the old one.
    fn serving(&self, tenant: &TenantId, name: &str) -> Option<FunctionId> {
        let from = (tenant.clone(), name.to_string(), 0);
        let to = (tenant.clone(), name.to_string(), u64::MAX);
        let versions: Vec<FunctionId> = self.names.range(from..=to).map(|(_, id)| *id).collect();
        let resident = |id: FunctionId| {
            (0..self.setup.gpus.len() as u32).any(|g| {
                self.executor
                    .gpu(g)
                    .copies()
                    .any(|(f, loaded)| f == id && loaded)
            })
        };
        versions
            .iter()
            .rev()
            .find(|id| resident(**id))
            .or(versions.last())
            .copied()
    }

    /// Each hosted instance with where its weights are: a copy on a GPU
    /// counts for the instance whose slices hold that GPU (as in
    /// [`GpuStatus::resident`]).
    fn instance_states(&self) -> Vec<InstanceStatus> {
        let mut out = Vec::new();
        for (id, h) in &self.functions {
            let mut copies: BTreeMap<InstanceId, Vec<(u32, bool)>> = BTreeMap::new();
            for g in 0..self.setup.gpus.len() as u32 {
                for (f, loaded) in self.executor.gpu(g).copies() {
                    if f == *id {
                        if let Some(i) = h.instance_on(g) {
                            copies.entry(i).or_default().push((g, loaded));
                        }
                    }
                }
            }
            let in_host = self.executor.in_host(*id);
            for instance in &h.instances {
                let mine = copies.remove(instance).unwrap_or_default();
                let state = if mine.iter().any(|(_, loaded)| *loaded) {
                    InstanceState::Resident
                } else if !mine.is_empty() {
                    InstanceState::Loading
                } else if in_host {
                    InstanceState::SwappedOut
                } else {
                    InstanceState::Cold
                };
                out.push(InstanceStatus {
                    instance: *instance,
                    state,
                    gpus: mine.into_iter().map(|(g, _)| g).collect(),
                });
            }
        }
        out.sort_by_key(|i| i.instance);
        out
    }
}

impl Handler<TakeLoads> for NodeAgent {
    type Result = actix::MessageResult<TakeLoads>;

    fn handle(&mut self, _: TakeLoads, _: &mut Context<Self>) -> Self::Result {
        let now = self.now();
        let mut occupancy: HashMap<FunctionId, Occupancy> = HashMap::new();
        for p in self.pending.values() {
            let o = occupancy.entry(p.function).or_default();
            if p.started.is_some() {
                o.in_flight = o.in_flight.saturating_add(1);
            } else {
                o.waiting = o.waiting.saturating_add(1);
            }
        }
        let mut loads: Vec<FunctionLoad> = self
            .functions
            .iter()
            .map(|(id, h)| {
                let occ = Occupancy {
                    last_arrival: self.executor.last_arrival(*id),
                    ..occupancy.get(id).copied().unwrap_or_default()
                };
                self.meter
                    .report(now, *id, h.key.0.clone(), h.key.1.clone(), occ)
            })
            .collect();
        let dropped = cap_loads(&mut loads);
        actix::MessageResult((loads, dropped as u64))
    }
}

impl Handler<HostCopiesQuery> for NodeAgent {
    type Result = actix::MessageResult<HostCopiesQuery>;

    fn handle(&mut self, _: HostCopiesQuery, _: &mut Context<Self>) -> Self::Result {
        // `parked` is a BTreeMap by (tenant, function, version): in order.
        let copies = self
            .parked
            .iter()
            .filter(|(_, p)| self.executor.in_host(p.id))
            .take(MAX_HOST_COPIES)
            .map(|((tenant, function, version), p)| HostCopy {
                tenant: tenant.clone(),
                function: function.clone(),
                version: *version,
                memory_mib: p.spec.memory_mib,
            })
            .collect();
        actix::MessageResult(copies)
    }
}

impl Handler<TakeSwapEvents> for NodeAgent {
    type Result = Vec<SwapEvent>;

    fn handle(&mut self, _: TakeSwapEvents, _: &mut Context<Self>) -> Vec<SwapEvent> {
        std::mem::take(&mut self.swap_events)
    }
}

impl Handler<StopRuntimes> for NodeAgent {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: StopRuntimes, _: &mut Context<Self>) -> Self::Result {
        // All are asked at once (`send` queues now); then each is awaited.
        let stops: Vec<_> = self
            .functions
            .values()
            .map(|h| h.actor.send(StopNow))
            .collect();
        Box::pin(async move {
            for s in stops {
                let _ = s.await;
            }
        })
    }
}

impl Handler<TakeSliceRequests> for NodeAgent {
    type Result = Vec<SliceRequest>;

    fn handle(&mut self, _: TakeSliceRequests, _: &mut Context<Self>) -> Vec<SliceRequest> {
        let taken = std::mem::take(&mut self.slice_requests);
        self.slice_taken.extend(taken.iter().cloned());
        taken
    }
}

impl Handler<AbandonSliceRequests> for NodeAgent {
    type Result = ();

    fn handle(&mut self, _: AbandonSliceRequests, ctx: &mut Context<Self>) {
        let now = self.now();
        for request in std::mem::take(&mut self.slice_taken) {
            self.slice_answer(now, request, false);
        }
        self.arm(ctx);
    }
}

impl Handler<SliceAnswer> for NodeAgent {
    type Result = ();

    fn handle(&mut self, msg: SliceAnswer, ctx: &mut Context<Self>) {
        let now = self.now();
        // Answered once: one the session no longer holds is not.
        let Some(k) = self.slice_taken.iter().position(|r| *r == msg.request) else {
            return;
        };
        self.slice_taken.remove(k);
        if let Some(i) = msg.applied_index.filter(|_| msg.granted) {
            // An assignment older than the replica's state with the remap
            // would undo it (one read before it was applied, still in
            // flight): ignored from now on.
            self.assignment_index = Some(self.assignment_index.map_or(i, |a| a.max(i)));
        }
        self.slice_answer(now, msg.request, msg.granted);
        self.arm(ctx);
    }
}

impl Handler<PlacementQuery> for NodeAgent {
    type Result = AgentPlacement;

    fn handle(&mut self, _: PlacementQuery, _: &mut Context<Self>) -> AgentPlacement {
        let mut functions: Vec<FunctionPlacement> = self
            .functions
            .iter()
            .map(|(id, h)| FunctionPlacement {
                instances: h
                    .slices
                    .iter()
                    .map(|(inst, s)| {
                        let gpus = s
                            .iter()
                            .map(|s| s.gpu.index)
                            .filter(|g| !self.releasing.contains(&(*inst, *g)))
                            .collect();
                        (*inst, gpus)
                    })
                    .collect(),
                copies: (0..self.setup.gpus.len() as u32)
                    .filter(|g| self.executor.gpu(*g).resident().any(|f| f == *id))
                    .collect(),
                reserving: self.executor.reserving(*id),
            })
            .collect();
        functions.sort_by_key(|f| f.instances.first().map(|i| i.0));
        AgentPlacement {
            assignment_index: self.assignment_index,
            remaps: self.remaps,
            remaps_refused: self.remaps_refused,
            swap_outs: self.status.swap_outs,
            swap_ins: self.status.swap_ins,
            functions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streams a short reply: its head, one chunk and its end all go into
    /// the stream's channel at once, and the run ends before the write
    /// that sends the head returns. Says on `ended` when it did.
    struct ShortStream {
        ended: tokio::sync::mpsc::UnboundedSender<()>,
    }

    impl RuntimeDriver for ShortStream {
        fn start(
            &mut self,
            _: &FunctionSpec,
            _: &[Slice],
        ) -> crate::runtime::RuntimeFuture<Result<(), RuntimeError>> {
            Box::pin(async { Ok(()) })
        }

        fn invoke(
            &mut self,
            invocation: Invocation,
        ) -> crate::runtime::RuntimeFuture<Result<crate::runtime::FunctionReply, RuntimeError>>
        {
            let ended = self.ended.clone();
            Box::pin(async move {
                let head = gshare_core::protocol::ReplyHead {
                    status: 200,
                    headers: Vec::new(),
                };
                let (tx, chunks) = tokio::sync::mpsc::channel(4);
                let _ = tx.try_send(crate::runtime::StreamItem::Data(b"tok".to_vec().into()));
                let _ = tx.try_send(crate::runtime::StreamItem::End);
                if let Some(to) = invocation.stream_to {
                    let _ = to.send(StreamOpen {
                        head: head.clone(),
                        chunks,
                    });
                }
                // The stream lasts a moment: its start reaches the agent
                // before its end.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = ended.send(());
                Ok(crate::runtime::FunctionReply {
                    head,
                    body: b"tok".to_vec(),
                    streamed: Some(crate::runtime::Streamed {
                        len: 3,
                        complete: true,
                    }),
                })
            })
        }

        fn stop(&mut self) -> crate::runtime::RuntimeFuture<()> {
            Box::pin(async {})
        }
    }

    /// acme's function `name` of `tier`: 1 GiB, half a GPU.
    fn spec(name: &str, tier: gshare_core::model::Tier) -> FunctionSpec {
        FunctionSpec {
            model: None,
            args: Vec::new(),
            env: Default::default(),
            tenant: TenantId("acme".into()),
            name: name.into(),
            runtime: gshare_core::model::Runtime::Custom,
            memory_mib: 1_024,
            compute_milli: 500,
            tier,
            deadline_ms: 5_000,
            pool: gshare_core::model::PoolPreference::Any,
            min_instances: 1,
            max_instances: 1,
            idle_timeout_s: 600,
            latency: gshare_core::model::LatencyProfile {
                full_gpu_us: 1_000,
                saturation_milli: 500,
            },
        }
    }

    fn assigned(index: u64, names: &[&str]) -> ApplyAssignment {
        ApplyAssignment(gshare_core::protocol::Assignment {
            applied_index: index,
            instances: names
                .iter()
                .zip(1..)
                .map(|(name, id)| gshare_core::protocol::AssignedInstance {
                    instance: InstanceId(id),
                    spec: spec(name, gshare_core::model::Tier::Burstable),
                    version: 1,
                    slices: vec![on(0)],
                })
                .collect(),
        })
    }

    /// A started agent on simulated GPUs whose executor asked for
    /// `requests` (not taken yet).
    fn sim_agent(requests: Vec<SliceRequest>) -> Addr<NodeAgent> {
        let mut agent = NodeAgent::new(NodeSetup {
            node: NodeId("n1".into()),
            gpus: (0..2)
                .map(|index| GpuInfo {
                    index,
                    model: "sim".into(),
                    memory_mib: 16_384,
                    h2d_mib_per_s: 600_000,
                })
                .collect(),
            host_swap_mib: 8_192,
            load: AgentLoadCosts {
                swap_setup_us: 1_000,
                cold_setup_us: 1_000,
                storage_mib_per_s: 100_000,
            },
            driver: Box::new(|_| Box::new(crate::runtime::SimDriver::new())),
            process_counters: Default::default(),
            clock: gshare_core::clock::SystemClock::shared(),
        });
        agent.slice_requests = requests;
        agent.start()
    }

    fn release_of_gpu_1() -> SliceRequest {
        SliceRequest::Release {
            instance: InstanceId(1),
            gpu: GpuId {
                node: NodeId("n1".into()),
                index: 1,
            },
        }
    }

    /// A session that ends with remap halves taken and unanswered (a lost
    /// link, a move to another replica) leaves none waiting: each is
    /// answered not granted, once; one the session answered is not.
    #[actix_rt::test]
    async fn remap_halves_a_session_left_unanswered_are_refused_once() {
        let reserve = SliceRequest::Reserve {
            function: FunctionId(0),
            instance: InstanceId(1),
            from: 0,
            slice: on(1),
        };
        let agent = sim_agent(vec![reserve.clone(), release_of_gpu_1()]);
        agent.do_send(assigned(10, &["a"]));
        let taken = agent.send(TakeSliceRequests).await.unwrap();
        assert_eq!(taken.len(), 2);
        // The release was answered (granted); the reservation not.
        agent.do_send(SliceAnswer {
            request: release_of_gpu_1(),
            granted: true,
            applied_index: None,
        });
        agent.do_send(AbandonSliceRequests);
        agent.do_send(AbandonSliceRequests);
        let p = agent.send(PlacementQuery).await.unwrap();
        assert_eq!((p.remaps, p.remaps_refused), (1, 1));
        // A late answer for the refused one changes nothing.
        agent.do_send(SliceAnswer {
            request: reserve,
            granted: false,
            applied_index: None,
        });
        let p = agent.send(PlacementQuery).await.unwrap();
        assert_eq!((p.remaps, p.remaps_refused), (1, 1));
    }

    /// A remap granted with the replica's applied index (`Granted`): an
    /// assignment older than it (read before the remap was applied: in
    /// flight, or a lagging follower's) is ignored, one at that index
    /// applies. A grant without an index (`Ack`, an older replica) moves
    /// nothing.
    #[actix_rt::test]
    async fn after_a_granted_remap_older_assignments_are_ignored() {
        let agent = sim_agent(vec![release_of_gpu_1(); 3]);
        let hosted = |a: &Addr<NodeAgent>| {
            let a = a.clone();
            async move { a.send(PlacementQuery).await.unwrap() }
        };
        agent.do_send(assigned(10, &["a"]));
        assert_eq!(agent.send(TakeSliceRequests).await.unwrap().len(), 3);
        let release = |index| SliceAnswer {
            request: release_of_gpu_1(),
            granted: true,
            applied_index: index,
        };
        agent.do_send(release(None));
        assert_eq!(hosted(&agent).await.assignment_index, Some(10));
        agent.do_send(release(Some(20)));
        assert_eq!(hosted(&agent).await.assignment_index, Some(20));
        // Read before the remap: it would have dropped nothing here, but
        // it adds `b`, and it is older than the grant.
        agent.do_send(assigned(15, &["a", "b"]));
        let p = hosted(&agent).await;
        assert_eq!((p.assignment_index, p.functions.len()), (Some(20), 1));
        agent.do_send(assigned(20, &["a", "b"]));
        let p = hosted(&agent).await;
        assert_eq!((p.assignment_index, p.functions.len()), (Some(20), 2));
        // A refused remap sets nothing.
        agent.do_send(SliceAnswer {
            granted: false,
            ..release(Some(99))
        });
        assert_eq!(hosted(&agent).await.assignment_index, Some(20));
    }

    /// A short stream ends while the write of its start (its first byte's
    /// usage) is still running, and that write fails: nothing was
    /// delivered and the start is not billed, so the outcome is
    /// `usage_not_recorded`. It was answered `Done` (a complete 200 with
    /// the whole short body, its key storing it as complete), because the
    /// run's end was handled before the failure marked it.
    /// A journal through the write-ahead log in a fresh directory (kept
    /// alive by the returned guard); `None` where the file system has no
    /// `O_DIRECT` (nothing to test there).
    fn logged_journal() -> Option<(tempfile::TempDir, Arc<crate::journal::UsageJournal>)> {
        let dir = tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")).unwrap();
        let journal = crate::journal::UsageJournal::open(
            dir.path(),
            gshare_core::state::AgentId("n1".into()),
        )
        .unwrap();
        if !journal.logged() {
            eprintln!("no O_DIRECT on this file system: nothing to test");
            return None;
        }
        Some((dir, Arc::new(journal)))
    }

    /// One 16 GiB GPU on node n1, fast loads, on `driver`.
    fn one_gpu(driver: DriverFactory) -> NodeSetup {
        NodeSetup {
            node: NodeId("n1".into()),
            gpus: vec![GpuInfo {
                index: 0,
                model: "sim".into(),
                memory_mib: 16_384,
                h2d_mib_per_s: 600_000,
            }],
            host_swap_mib: 8_192,
            load: AgentLoadCosts {
                swap_setup_us: 1_000,
                cold_setup_us: 1_000,
                storage_mib_per_s: 100_000,
            },
            driver,
            process_counters: Default::default(),
            clock: gshare_core::clock::SystemClock::shared(),
        }
    }

    /// A [`Gated`] driver with `permits`: the gate, the count of runs
    /// begun, and the factory.
    fn gated(
        permits: usize,
    ) -> (
        Arc<tokio::sync::Semaphore>,
        Arc<std::sync::atomic::AtomicU32>,
        DriverFactory,
    ) {
        let gate = Arc::new(tokio::sync::Semaphore::new(permits));
        let started = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (runs, count) = (gate.clone(), started.clone());
        let driver: DriverFactory = Box::new(move |_| {
            Box::new(Gated {
                gate: runs.clone(),
                started: count.clone(),
            })
        });
        (gate, started, driver)
    }

    /// A one-GPU agent metering into `journal` every `interval`, hosting
    /// function `name` (instance 1, 1 GiB on GPU 0) on `driver`.
    fn metered_agent(
        journal: &Arc<crate::journal::UsageJournal>,
        interval: Duration,
        name: &str,
        driver: DriverFactory,
    ) -> Addr<NodeAgent> {
        let agent = NodeAgent::new(one_gpu(driver))
            .with_metering(Metering {
                journal: journal.clone(),
                appended: Arc::default(),
                interval,
                pool_kind: gshare_core::model::PoolKind::Center,
            })
            .exiting_with(|_| {})
            .start();
        agent.do_send(ApplyAssignment(gshare_core::protocol::Assignment {
            applied_index: 1,
            instances: vec![gshare_core::protocol::AssignedInstance {
                instance: InstanceId(1),
                spec: spec(name, gshare_core::model::Tier::Guaranteed),
                version: 1,
                slices: vec![on(0)],
            }],
        }));
        agent
    }

    #[actix_rt::test]
    async fn a_short_stream_whose_start_is_not_journaled_is_not_answered_complete() {
        let Some((_dir, journal)) = logged_journal() else {
            return;
        };
        let (ended_tx, mut ended) = tokio::sync::mpsc::unbounded_channel();
        let driver: DriverFactory = Box::new(move |_| {
            Box::new(ShortStream {
                ended: ended_tx.clone(),
            })
        });
        let agent = metered_agent(&journal, Duration::from_secs(3_600), "short", driver);
        // Loaded, and whatever hosting it journals written.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let gate = journal.stall_then_fail_next_write().unwrap();
        let (head_tx, head) = oneshot::channel();
        let admitted = agent
            .send(Invoke {
                tenant: TenantId("acme".into()),
                function: "short".into(),
                token_digest: None,
                deadline_ms: None,
                body: b"{}".to_vec().into(),
                idempotency_key: None,
                http: Some(crate::agent::Transparent {
                    call: HttpCall {
                        method: "POST".into(),
                        target: "/v1/completions".into(),
                        headers: Vec::new(),
                    },
                    head: head_tx,
                }),
            })
            .await
            .unwrap();
        let Admission::Accepted(outcome) = admitted else {
            panic!("not admitted");
        };
        // The run ended (its start's write is stalled); the agent handles
        // its end before the write returns.
        tokio::time::timeout(Duration::from_secs(10), ended.recv())
            .await
            .expect("the run ends")
            .unwrap();
        let handled = tokio::time::timeout(Duration::from_secs(10), async {
            while agent.send(StatusQuery).await.unwrap().usage_waiting == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        handled.await.expect("the run's end waits for its usage");
        gate.send(()).unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(10), outcome)
            .await
            .expect("an outcome")
            .unwrap();
        assert!(
            matches!(
                outcome,
                InvokeOutcome::Failed(InvokeError::UsageNotRecorded { .. })
            ),
            "{outcome:?}"
        );
        // Its start never went out.
        assert!(head.await.is_err());
    }

    /// A keyed invocation of acme's `function` on `agent`: its outcome
    /// (10 s at most).
    async fn invoke_keyed(agent: &Addr<NodeAgent>, function: &str, key: &str) -> InvokeOutcome {
        let admitted = agent
            .send(Invoke {
                tenant: TenantId("acme".into()),
                function: function.into(),
                token_digest: None,
                deadline_ms: None,
                body: b"{}".to_vec().into(),
                idempotency_key: Some(key.into()),
                http: None,
            })
            .await
            .unwrap();
        let Admission::Accepted(outcome) = admitted else {
            panic!("not admitted");
        };
        tokio::time::timeout(Duration::from_secs(10), outcome)
            .await
            .expect("an outcome within 10 s")
            .unwrap()
    }

    /// An idempotency key names one call: repeated for another function of
    /// the tenant, while its run goes on or once it is stored, it is
    /// refused `idempotency_key_reused` and nothing runs (the other
    /// function's answer was replayed as this one's); repeated for its own
    /// function it joins or replays as before.
    #[actix_rt::test]
    async fn a_key_used_for_one_function_is_refused_for_another() {
        let Some((_dir, journal)) = logged_journal() else {
            return;
        };
        let (gate, started, driver) = gated(0);
        let agent = metered_agent(&journal, Duration::from_millis(100), "f", driver);
        agent.do_send(ApplyAssignment(gshare_core::protocol::Assignment {
            applied_index: 2,
            instances: ["f", "g"]
                .into_iter()
                .zip(1..)
                .map(|(name, id)| gshare_core::protocol::AssignedInstance {
                    instance: InstanceId(id),
                    spec: spec(name, gshare_core::model::Tier::Guaranteed),
                    version: 1,
                    slices: vec![on(0)],
                })
                .collect(),
        }));
        let begun = || started.load(std::sync::atomic::Ordering::SeqCst);
        // While f's run under "k" goes on.
        let first = {
            let agent = agent.clone();
            tokio::spawn(async move { invoke_keyed(&agent, "f", "k").await })
        };
        tokio::time::timeout(Duration::from_secs(10), async {
            while begun() == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("f runs");
        let reused = |o: &InvokeOutcome| matches!(o, InvokeOutcome::Failed(InvokeError::KeyReused { function }) if function == "f");
        let other = invoke_keyed(&agent, "g", "k").await;
        assert!(reused(&other), "while it runs: {other:?}");
        gate.add_permits(100);
        let first = tokio::time::timeout(Duration::from_secs(10), first)
            .await
            .expect("f answered")
            .unwrap();
        assert!(matches!(first, InvokeOutcome::Done { .. }), "{first:?}");
        // Once stored.
        let other = invoke_keyed(&agent, "g", "k").await;
        assert!(reused(&other), "once stored: {other:?}");
        let again = invoke_keyed(&agent, "f", "k").await;
        assert!(matches!(again, InvokeOutcome::Replayed { .. }), "{again:?}");
        assert_eq!(begun(), 1, "g never ran, nor f again");
        // Another key runs g.
        let g = invoke_keyed(&agent, "g", "k2").await;
        assert!(matches!(g, InvokeOutcome::Done { .. }), "{g:?}");
    }

    /// An invocation of `tenant`'s `function` on `agent`, admitted: the
    /// channel its outcome comes on.
    async fn admit(
        agent: &Addr<NodeAgent>,
        tenant: &str,
        function: &str,
    ) -> oneshot::Receiver<InvokeOutcome> {
        let admitted = agent
            .send(Invoke {
                tenant: TenantId(tenant.into()),
                function: function.into(),
                token_digest: None,
                deadline_ms: None,
                body: b"{}".to_vec().into(),
                idempotency_key: None,
                http: None,
            })
            .await
            .unwrap();
        let Admission::Accepted(outcome) = admitted else {
            panic!("not admitted");
        };
        outcome
    }

    /// One tenant's waiting requests are bounded; another tenant's still
    /// wait beside them, and the count follows starts and answers (nothing
    /// is left counted once all ran).
    #[actix_rt::test]
    async fn one_tenant_cannot_queue_without_bound() {
        let (gate, _, driver) = gated(0);
        let agent = NodeAgent::new(one_gpu(driver)).start();
        let mut other = spec("g", gshare_core::model::Tier::Guaranteed);
        other.tenant = TenantId("other".into());
        let mut f = spec("f", gshare_core::model::Tier::Guaranteed);
        // A long deadline: nothing is refused as late while the gate holds.
        f.deadline_ms = 600_000;
        other.deadline_ms = 600_000;
        agent.do_send(ApplyAssignment(gshare_core::protocol::Assignment {
            applied_index: 1,
            instances: [f, other]
                .into_iter()
                .zip(1..)
                .map(|(spec, id)| gshare_core::protocol::AssignedInstance {
                    instance: InstanceId(id),
                    spec,
                    version: 1,
                    slices: vec![on(0)],
                })
                .collect(),
        }));
        // Both loaded first: a request waits here only for the GPU.
        resident(&agent, 2).await;
        // acme's requests: the first fill the GPU (the driver holds every
        // run at the gate), the rest wait, until one more than the bound.
        let mut outcomes = Vec::new();
        let refused = loop {
            let mut o = admit(&agent, "acme", "f").await;
            // A refusal is sent before the admission returns.
            match o.try_recv() {
                Ok(refused) => break refused,
                Err(_) => outcomes.push(o),
            }
            assert!(
                outcomes.len() <= 2 * MAX_WAITING_PER_TENANT as usize,
                "no bound"
            );
        };
        assert!(
            matches!(refused, InvokeOutcome::Failed(InvokeError::OverCapacity)),
            "{refused:?}"
        );
        let st = agent.send(StatusQuery).await.unwrap();
        assert_eq!(st.gpus[0].queued, MAX_WAITING_PER_TENANT, "{st:?}");
        assert!(st.in_flight > MAX_WAITING_PER_TENANT, "some run: {st:?}");
        // Another tenant is not refused for acme's queue.
        let mut theirs = admit(&agent, "other", "g").await;
        assert!(theirs.try_recv().is_err(), "other's request waits or runs");
        gate.add_permits(100_000);
        outcomes.push(theirs);
        for (i, o) in outcomes.into_iter().enumerate() {
            let o = tokio::time::timeout(Duration::from_secs(30), o)
                .await
                .expect("every admitted request is answered")
                .unwrap();
            assert!(matches!(o, InvokeOutcome::Done { .. }), "{i}: {o:?}");
        }
        // Nothing stays counted: acme may queue again.
        let again = admit(&agent, "acme", "f").await;
        let again = tokio::time::timeout(Duration::from_secs(10), again)
            .await
            .expect("answered")
            .unwrap();
        assert!(matches!(again, InvokeOutcome::Done { .. }), "{again:?}");
    }

    /// Waits (at most 10 s) until `n` instances are resident.
    async fn resident(agent: &Addr<NodeAgent>, n: usize) {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let st = agent.send(StatusQuery).await.unwrap();
                let resident = st
                    .instances
                    .iter()
                    .filter(|i| i.state == gshare_core::protocol::InstanceState::Resident);
                if resident.count() == n {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("resident");
    }

    /// Polls the agent's status (at most 10 s) until `done` holds of it.
    async fn status_until(
        agent: &Addr<NodeAgent>,
        what: &str,
        done: impl Fn(&NodeStatus) -> bool,
    ) -> NodeStatus {
        let polled = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let st = agent.send(StatusQuery).await.unwrap();
                if done(&st) {
                    return st;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        match polled {
            Ok(st) => st,
            Err(_) => panic!("{what}: {:?}", agent.send(StatusQuery).await.unwrap()),
        }
    }

    #[actix_rt::test]
    async fn a_request_whose_caller_went_away_leaves_its_queue_and_never_runs() {
        let (gate, started, driver) = gated(0);
        let agent = NodeAgent::new(one_gpu(driver)).start();
        let mut f = spec("f", gshare_core::model::Tier::Guaranteed);
        f.deadline_ms = 600_000;
        agent.do_send(ApplyAssignment(gshare_core::protocol::Assignment {
            applied_index: 1,
            instances: vec![gshare_core::protocol::AssignedInstance {
                instance: InstanceId(1),
                spec: f,
                version: 1,
                slices: vec![on(0)],
            }],
        }));
        agent.do_send(ApplyTokens(gshare_core::protocol::TokenDigests {
            applied_index: 1,
            tenants: vec![gshare_core::protocol::TenantTokens {
                tenant: TenantId("acme".into()),
                digests: vec![crate::token::token_digest("t")],
            }],
        }));
        resident(&agent, 1).await;
        // Runs are held at the gate: the GPU fills, then requests queue.
        let mut kept = Vec::new();
        while agent.send(StatusQuery).await.unwrap().gpus[0].queued < 2 {
            kept.push(admit(&agent, "acme", "f").await);
        }
        let running = started.load(std::sync::atomic::Ordering::SeqCst);
        // The last one's caller goes away: it leaves the queue at the next tick.
        drop(kept.pop());
        let st = status_until(&agent, "cancelled", |s| s.abandoned == 1).await;
        assert_eq!(st.gpus[0].queued, 1, "{st:?}");
        // Through the ingress: a client that closes its connection while its
        // call waits (the ingress sees the connection end and drops the
        // call, and with it the answer's receiving end).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = crate::ingress::serve_listener(
            listener,
            agent.clone(),
            1,
            None,
            None,
            Default::default(),
        )
        .unwrap();
        actix_rt::spawn(server);
        let client = std::thread::spawn(move || {
            use std::io::Write;
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            write!(
                c,
                "POST /v1/invoke/acme/f HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\nContent-Length: 2\r\n\r\n{{}}"
            )
            .unwrap();
            c
        });
        let conn = actix_rt::task::spawn_blocking(move || client.join().unwrap())
            .await
            .unwrap();
        status_until(&agent, "the call queued", |s| s.gpus[0].queued == 2).await;
        // Past the ingress's first look (50 ms): the socket's readiness
        // tells it.
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(conn);
        let st = status_until(&agent, "the closed call cancelled", |s| s.abandoned == 2).await;
        assert_eq!(st.gpus[0].queued, 1, "{st:?}");
        // The gate opens: every kept request is answered, the two gone
        // never ran.
        gate.add_permits(1_000);
        let kept_n = kept.len() as u32;
        for (i, o) in kept.into_iter().enumerate() {
            let o = tokio::time::timeout(Duration::from_secs(30), o)
                .await
                .expect("answered")
                .unwrap();
            assert!(matches!(o, InvokeOutcome::Done { .. }), "{i}: {o:?}");
        }
        assert!(running < kept_n, "some waited: {running} of {kept_n}");
        assert_eq!(started.load(std::sync::atomic::Ordering::SeqCst), kept_n);
        let st = agent.send(StatusQuery).await.unwrap();
        assert_eq!((st.abandoned, st.in_flight), (2, 0), "{st:?}");
    }

    /// A driver whose runs each wait for a permit of `gate`, then echo;
    /// `started` counts the runs begun.
    struct Gated {
        gate: Arc<tokio::sync::Semaphore>,
        started: Arc<std::sync::atomic::AtomicU32>,
    }

    impl RuntimeDriver for Gated {
        fn start(
            &mut self,
            _: &FunctionSpec,
            _: &[Slice],
        ) -> crate::runtime::RuntimeFuture<Result<(), RuntimeError>> {
            Box::pin(async { Ok(()) })
        }

        fn invoke(
            &mut self,
            invocation: Invocation,
        ) -> crate::runtime::RuntimeFuture<Result<crate::runtime::FunctionReply, RuntimeError>>
        {
            let gate = self.gate.clone();
            self.started
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                let body = invocation
                    .body
                    .collect(usize::MAX)
                    .await
                    .map_err(|e| RuntimeError::Failed(e.to_string()))?;
                gate.acquire()
                    .await
                    .map_err(|e| RuntimeError::Failed(e.to_string()))?
                    .forget();
                Ok(crate::runtime::FunctionReply::ok(body))
            })
        }

        fn stop(&mut self) -> crate::runtime::RuntimeFuture<()> {
            Box::pin(async {})
        }
    }

    /// The journal stops taking appends (an entry in its log not applied
    /// to its tree): the agent exits for a restart to replay it. Until it
    /// does, a new invocation is refused `shutting_down` (retryable) before
    /// it runs, as is one queued at the stop, and one running across the
    /// stop is answered `usage_not_recorded` when it ends. Both used to wait for a write
    /// that never came (the writer ends at the stop); a keyed one run in
    /// that window would run again when retried after the restart.
    #[actix_rt::test]
    async fn once_the_journal_stops_no_invocation_runs_before_the_exit() {
        let Some((_dir, journal)) = logged_journal() else {
            return;
        };
        let (gate, started, driver) = gated(1);
        let begun = || started.load(std::sync::atomic::Ordering::SeqCst);
        // Resident memory is journaled every 100 ms.
        let agent = metered_agent(&journal, Duration::from_millis(100), "f", driver);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let first = invoke_keyed(&agent, "f", "k1").await;
        assert!(matches!(first, InvokeOutcome::Done { .. }), "{first:?}");
        // A run in flight across the stop (no permit left: it waits).
        let across = {
            let agent = agent.clone();
            tokio::spawn(async move { invoke_keyed(&agent, "f", "k2").await })
        };
        let running = tokio::time::timeout(Duration::from_secs(10), async {
            while agent.send(StatusQuery).await.unwrap().in_flight == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        running.await.expect("k2 runs");
        // Two more: k2b runs beside k2 (500 milli-GPU each fill the GPU),
        // k2c waits for the GPU.
        let spawn = |key: &'static str| {
            let agent = agent.clone();
            tokio::spawn(async move { invoke_keyed(&agent, "f", key).await })
        };
        let (beside, queued) = (spawn("k2b"), spawn("k2c"));
        let waiting = tokio::time::timeout(Duration::from_secs(10), async {
            while agent.send(StatusQuery).await.unwrap().in_flight < 3 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        waiting.await.expect("k2b and k2c are admitted");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(begun(), 3, "k1, k2 and k2b began; k2c waits");
        // The next memory write meets the refusal: the writer stops.
        journal.refuse_appends("a test's unapplied entry").unwrap();
        let stopped = tokio::time::timeout(Duration::from_secs(10), async {
            while agent.send(StatusQuery).await.unwrap().usage_write_failures == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        stopped.await.expect("the agent learns the journal stopped");
        for key in ["k3", "k1"] {
            let refused = invoke_keyed(&agent, "f", key).await;
            assert!(
                matches!(refused, InvokeOutcome::Failed(InvokeError::ShuttingDown)),
                "{key}: {refused:?}"
            );
        }
        // k2c, queued before the stop, is refused at the stop (its turn
        // on the GPU may come after the exit), with the GPU still full.
        let queued = tokio::time::timeout(Duration::from_secs(10), queued)
            .await
            .expect("k2c is answered")
            .unwrap();
        assert!(
            matches!(queued, InvokeOutcome::Failed(InvokeError::ShuttingDown)),
            "{queued:?}"
        );
        // The refused ones never began.
        assert_eq!(begun(), 3);
        gate.add_permits(2);
        let ended = tokio::time::timeout(Duration::from_secs(10), across)
            .await
            .expect("k2 is answered")
            .unwrap();
        assert!(
            matches!(
                ended,
                InvokeOutcome::Failed(InvokeError::UsageNotRecorded { .. })
            ),
            "{ended:?}"
        );
        let beside = tokio::time::timeout(Duration::from_secs(10), beside)
            .await
            .expect("k2b is answered")
            .unwrap();
        assert!(
            matches!(
                beside,
                InvokeOutcome::Failed(InvokeError::UsageNotRecorded { .. })
            ),
            "{beside:?}"
        );
        assert_eq!(begun(), 3);
        let after = agent.send(StatusQuery).await.unwrap();
        assert_eq!(after.usage_waiting, 0, "nothing waits for a write");
        // The one refused write, counted once (it was counted twice).
        assert_eq!(after.usage_write_failures, 1);
    }

    /// Waits (10 s at most) until `cond` holds.
    async fn until(cond: impl Fn() -> bool) {
        for _ in 0..1_000 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out");
    }

    /// The records in `journal`, oldest first.
    fn journaled(journal: &crate::journal::UsageJournal) -> Vec<gshare_core::state::UsageRecord> {
        journal
            .batch_after(0, gshare_core::state::MAX_USAGE_BATCH)
            .unwrap()
            .map(|b| b.records)
            .unwrap_or_default()
    }

    /// A write holding resident memory fails. The memory was held anyway,
    /// so it goes with the next write: each memory record covers the time
    /// since the one before it (1 GiB resident: 1,024 MiB·ms per ms, within
    /// the records' whole-ms ends). Before, the failed write's memory was
    /// dropped with its group: the record after it fell short by the
    /// failed interval (~100 ms here, ~102,400 MiB·ms).
    #[actix_rt::test]
    async fn resident_memory_of_a_failed_write_goes_with_the_next_write() {
        let Some((_dir, journal)) = logged_journal() else {
            return;
        };
        let driver: DriverFactory = Box::new(|_| Box::new(crate::runtime::SimDriver::new()));
        let agent = metered_agent(&journal, Duration::from_millis(100), "mem", driver);
        // Hosted, and memory written twice.
        until(|| journaled(&journal).len() >= 2).await;
        let before = journaled(&journal).len();
        // The next write stalls (holding the journal: nothing reads it
        // meanwhile) while ticks pass, then fails.
        let gate = journal.stall_then_fail_next_write().unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        gate.send(()).unwrap();
        let failed = tokio::time::timeout(Duration::from_secs(10), async {
            while agent.send(StatusQuery).await.unwrap().usage_write_failures == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        failed.await.expect("the write fails");
        until(|| journaled(&journal).len() >= before + 2).await;
        let records = journaled(&journal);
        assert!(records
            .iter()
            .all(|r| r.function == "mem" && r.invocations == 0));
        for pair in records.windows(2) {
            let span_ms = pair[1].end_ms - pair[0].end_ms;
            let want = 1_024 * span_ms;
            assert!(
                pair[1].memory_mib_ms.abs_diff(want) <= 2 * 1_024,
                "{} MiB·ms over {span_ms} ms (want {want}): {records:?}",
                pair[1].memory_mib_ms
            );
        }
    }

    fn on(index: u32) -> Slice {
        Slice {
            gpu: GpuId {
                node: NodeId("n1".into()),
                index,
            },
            compute_milli: 500,
            memory_mib: 1_024,
        }
    }

    /// The executor's release of GPU 0 (the function's copy left it) goes
    /// to the instance moving from GPU 0, not to the one moving to it.
    #[test]
    fn a_release_goes_to_the_instance_moving_from_the_gpu() {
        let slices = vec![
            (InstanceId(1), vec![on(2), on(0)]),
            (InstanceId(2), vec![on(0), on(1)]),
            (InstanceId(3), vec![on(0)]),
        ];
        let none = BTreeSet::new();
        assert_eq!(moving_from(&slices, 0, &none), Some(InstanceId(2)));
        assert_eq!(moving_from(&slices, 2, &none), Some(InstanceId(1)));
        // A target or a plain placement is nothing to release.
        assert_eq!(moving_from(&slices, 1, &none), None);
        // Asked already: not asked again.
        let asked = BTreeSet::from([(InstanceId(2), 0)]);
        assert_eq!(moving_from(&slices, 0, &asked), None);
    }
}
