//! The `process` runtime driver: a function instance as a supervised OS process.
//!
//! ```text
//!  ProcessInstance::start(spec)
//!     │ spawn argv (own process group; CUDA_VISIBLE_DEVICES,
//!     │ CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)
//!     │ GET health_path until 200 (startup_timeout)            ─▶ Err(ProcessError)
//!     ▼
//!   Ready(generation g) ◀──────────────────────────────┐
//!     │ invoke(body, deadline): POST invoke_path       │ healthy again: restarts += 1
//!     │ process exits ─▶ crashes += 1, SIGKILL group,  │
//!     │   in-flight invocations: Err(Crashed{g})       │
//!     ▼                                                │
//!   Restarting ── sleep backoff (×2, capped) ─▶ spawn + health ──┘
//!     │ max_failed_starts in a row ─▶ Failed (invocations: Unavailable)
//!   stop(): SIGTERM to the group, SIGKILL after stop_grace ─▶ Stopped
//! ```
//!
//! One supervisor task (tokio) owns the child. Status changes go out on a
//! `watch` channel; an invocation watches it while its request is in flight,
//! so a crash ends it at once with [`InvokeError::Crashed`] instead of
//! waiting for a connection timeout, and its deadline bounds everything.
//! Dropping a `ProcessInstance` that was not stopped SIGKILLs its group.
//!
//! Swap and remap for a process runtime (DESIGN §1): a process's GPU state
//! cannot be moved from outside, so *swap-out* is [`ProcessInstance::stop`]
//! (weights leave the GPU with the process) and *swap-in* is a new
//! [`ProcessInstance::start`] — a cold start, timed by the runtime's own
//! loading. *Remap* to another slice or GPU is stop, then start with a spec
//! rendered for the new slice ([`ProcessSpec::from_template`]): the MPS
//! limits are per process and fixed when it starts. Runtimes that can
//! checkpoint (e.g. NVIDIA's `cuda-checkpoint` on driver ≥ 550, or a server
//! with its own sleep/wake API such as vLLM's sleep mode) could keep the
//! process and move only its GPU memory to host RAM; this driver does not
//! do that yet (docs/ops.md).

mod error;
mod ledger;
mod spec;
mod template;
#[cfg(test)]
mod tests;

pub use error::{InvokeError, ProcessError};
pub use gshare_core::net::http_client::{
    read_body, read_response, BodyCut, BodyPart, HttpClient, HttpError, HttpResponse, RequestBody,
    MAX_HEAD,
};
pub use gshare_core::protocol::{Headers, ReplyHead};
pub use ledger::{ProcessLedger, Reaped};
pub use spec::{free_port, Backoff, ProcessSpec, SliceLimits};
pub use template::{
    render, FunctionArgs, MpsOrdinals, RuntimeTemplate, TemplateError, TemplateVars, VmTemplate,
    VM_MEMORY_MIB,
};

use rustix::process::{kill_process_group, test_kill_process_group, Pid, Signal};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Largest response body accepted from a function by default (64 MiB;
/// a runtime template's `max_reply_bytes`).
pub const MAX_RESPONSE_BODY: usize = 64 * 1024 * 1024;
/// After a transport error, how long an invocation waits to learn whether
/// the process died (to report `Crashed` rather than `Transport`).
const CRASH_CONFIRM: Duration = Duration::from_millis(500);

/// One piece of a streamed reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamItem {
    /// Bytes of the body, as the function sent them.
    Data(hyper::body::Bytes),
    /// The body ended as the function ended it.
    End,
}

/// Passes `body`'s frames to `tx` (at most `max_body` bytes in all), then
/// [`StreamItem::End`]. A receiver that is gone ends it early (`Ok`).
async fn pump(
    mut body: hyper::body::Incoming,
    tx: &tokio::sync::mpsc::Sender<StreamItem>,
    max_body: usize,
) -> Result<(), HttpError> {
    use http_body_util::BodyExt;
    let mut sent = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        if let Ok(data) = frame.into_data() {
            if data.len() > max_body.saturating_sub(sent) {
                return Err(HttpError::TooLarge(max_body));
            }
            sent = sent.saturating_add(data.len());
            if tx.send(StreamItem::Data(data)).await.is_err() {
                return Ok(());
            }
        }
    }
    let _ = tx.send(StreamItem::End).await;
    Ok(())
}

/// One request to a function's server.
#[derive(Debug)]
pub struct FunctionCall<'a> {
    /// The method.
    pub method: &'a str,
    /// Path and query (starting with `/`); `None`: the template's invoke path.
    pub target: Option<&'a str>,
    /// Headers (the agent's `X-Gshare-Deadline-Ms` replaces any given).
    pub headers: &'a [(&'a str, &'a [u8])],
    /// The body, whole or streamed as it arrives (a cut one aborts the call).
    pub body: RequestBody,
}

/// Where an instance is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// First start in progress.
    Starting,
    /// Healthy, taking invocations.
    Ready,
    /// Crashed; waiting out the backoff or starting again.
    Restarting,
    /// Stopped on request.
    Stopped,
    /// Gave up after too many failed starts in a row.
    Failed,
}

/// The instance's status, as published on its watch channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// Phase.
    pub phase: Phase,
    /// Which start of the process is (or was last) running, from 1.
    pub generation: u64,
    /// The process id of the running process (its group id too).
    pub pid: Option<u32>,
}

struct Shared {
    spec: ProcessSpec,
    /// The pooled client to the server (its port is kept across restarts).
    client: HttpClient,
    status: watch::Sender<Status>,
    stop: watch::Sender<bool>,
    crashes: AtomicU64,
    restarts: AtomicU64,
    failed_starts: AtomicU64,
    in_flight: AtomicU64,
    /// Process group of the running process (0: none).
    pgid: AtomicI32,
    /// Where started groups are recorded (see [`ProcessLedger`]).
    ledger: Option<ProcessLedger>,
}

impl Shared {
    fn set_status(&self, phase: Phase, generation: u64, pid: Option<u32>) {
        self.status.send_replace(Status {
            phase,
            generation,
            pid,
        });
    }
}

/// A function instance running as a supervised process.
pub struct ProcessInstance {
    shared: Arc<Shared>,
    supervisor: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for ProcessInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessInstance")
            .field("instance", &self.shared.spec.instance)
            .field("status", &self.status())
            .finish()
    }
}

struct InFlight<'a>(&'a AtomicU64);
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn signal_group(pgid: i32, sig: Signal) {
    if let Some(pid) = Pid::from_raw(pgid) {
        // ESRCH (group already gone) is the expected outcome, not an error.
        let _ = kill_process_group(pid, sig);
    }
}

/// Whether any process of group `pgid` still runs. Zombies do not count:
/// a member whose parent died is reparented and reaped by PID 1 whenever
/// it gets to it (seconds in some containers); `kill(-pgid, 0)` still
/// finds it, so `/proc` is read to tell (when it is readable).
fn group_alive(pgid: i32) -> bool {
    if Pid::from_raw(pgid).is_none_or(|p| test_kill_process_group(p).is_err()) {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.flatten().any(|e| {
        e.file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
            .and_then(ledger::stat)
            .is_some_and(|(state, pgrp, _)| pgrp == pgid && !matches!(state.as_str(), "Z" | "X"))
    })
}

fn spawn(
    spec: &ProcessSpec,
    log: Option<&PathBuf>,
    ledger: Option<&ProcessLedger>,
) -> Result<Child, ProcessError> {
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .envs(&spec.env)
        .process_group(0)
        .kill_on_drop(true)
        .stdin(Stdio::null());
    if let Some(dir) = &spec.workdir {
        cmd.current_dir(dir);
    }
    let (out, err) = match log {
        Some(path) => {
            let open = || {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
            };
            match (open(), open()) {
                (Ok(a), Ok(b)) => (Stdio::from(a), Stdio::from(b)),
                _ => (Stdio::null(), Stdio::null()),
            }
        }
        None => (Stdio::null(), Stdio::null()),
    };
    cmd.stdout(out).stderr(err);
    let child = cmd.spawn().map_err(|source| ProcessError::Spawn {
        instance: spec.instance.clone(),
        program: spec.argv[0].clone(),
        source,
    })?;
    if let (Some(ledger), Some(pid)) = (ledger, child.id()) {
        ledger.record(pid as i32);
    }
    Ok(child)
}

/// Polls the health endpoint until 200, the process exits, the start-up
/// timeout passes or a stop is requested. Kills the group on failure.
async fn wait_healthy(
    spec: &ProcessSpec,
    client: &HttpClient,
    child: &mut Child,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), ProcessError> {
    let until = Instant::now() + spec.startup_timeout;
    let pgid = child.id().unwrap_or(0) as i32;
    let fail = |child: &mut Child| {
        signal_group(pgid, Signal::KILL);
        let _ = child.start_kill();
    };
    loop {
        if *stop.borrow() {
            fail(child);
            let _ = child.wait().await;
            return Err(ProcessError::StoppedDuringStart {
                instance: spec.instance.clone(),
            });
        }
        if let Ok(Some(status)) = child.try_wait() {
            signal_group(pgid, Signal::KILL);
            return Err(ProcessError::ExitedDuringStart {
                instance: spec.instance.clone(),
                status: status.to_string(),
            });
        }
        let probe = client.send("GET", &spec.health_path, &[], Vec::new(), 64 * 1024);
        if let Ok(Ok(resp)) = tokio::time::timeout(spec.health_request_timeout, probe).await {
            if resp.status == 200 {
                return Ok(());
            }
        }
        if Instant::now() >= until {
            fail(child);
            let _ = child.wait().await;
            return Err(ProcessError::Unhealthy {
                instance: spec.instance.clone(),
                after: spec.startup_timeout,
            });
        }
        tokio::select! {
            _ = tokio::time::sleep(spec.health_interval) => {}
            _ = stop.changed() => {}
        }
    }
}

/// SIGTERM to the group; SIGKILL once `grace` passed with anything left.
async fn terminate(child: &mut Child, grace: Duration) {
    let pgid = child.id().unwrap_or(0) as i32;
    signal_group(pgid, Signal::TERM);
    let until = Instant::now() + grace;
    let mut leader_done = false;
    while Instant::now() < until {
        if !leader_done {
            leader_done = matches!(child.try_wait(), Ok(Some(_)));
        }
        if leader_done && !group_alive(pgid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal_group(pgid, Signal::KILL);
    let _ = child.start_kill();
    let _ = child.wait().await;
}

impl ProcessInstance {
    /// Starts the process and waits until its health endpoint answers 200.
    /// A first start that fails is an error (no retry); later crashes are
    /// restarted by the supervisor.
    pub async fn start(spec: ProcessSpec) -> Result<Self, ProcessError> {
        Self::start_logged(spec, None).await
    }

    /// Like [`start`](Self::start), with the server's stdout and stderr
    /// appended to `log` (discarded when `None`).
    pub async fn start_logged(
        spec: ProcessSpec,
        log: Option<PathBuf>,
    ) -> Result<Self, ProcessError> {
        Self::start_supervised(spec, log, None).await
    }

    /// Like [`start_logged`](Self::start_logged), and every process group
    /// it starts (restarts included) is recorded in `ledger`, so a later
    /// agent can stop it if this one is killed.
    pub async fn start_supervised(
        spec: ProcessSpec,
        log: Option<PathBuf>,
        ledger: Option<ProcessLedger>,
    ) -> Result<Self, ProcessError> {
        if spec.argv.is_empty() || spec.argv[0].is_empty() {
            return Err(ProcessError::InvalidSpec {
                instance: spec.instance.clone(),
                reason: "empty argv".into(),
            });
        }
        let (status, _) = watch::channel(Status {
            phase: Phase::Starting,
            generation: 1,
            pid: None,
        });
        let (stop, mut stop_rx) = watch::channel(false);
        let client = HttpClient::new(&spec.host, spec.port, None);
        let shared = Arc::new(Shared {
            spec,
            client,
            status,
            stop,
            crashes: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            failed_starts: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            pgid: AtomicI32::new(0),
            ledger,
        });
        let mut child = spawn(&shared.spec, log.as_ref(), shared.ledger.as_ref())?;
        let pid = child.id();
        shared.pgid.store(pid.unwrap_or(0) as i32, Ordering::SeqCst);
        shared.set_status(Phase::Starting, 1, pid);
        if let Err(e) = wait_healthy(&shared.spec, &shared.client, &mut child, &mut stop_rx).await {
            shared.pgid.store(0, Ordering::SeqCst);
            shared.set_status(Phase::Failed, 1, None);
            return Err(e);
        }
        shared.set_status(Phase::Ready, 1, pid);
        let task = tokio::spawn(supervise(shared.clone(), child, stop_rx, log));
        Ok(Self {
            shared,
            supervisor: Mutex::new(Some(task)),
        })
    }

    /// The spec it runs.
    pub fn spec(&self) -> &ProcessSpec {
        &self.shared.spec
    }

    /// The current status.
    pub fn status(&self) -> Status {
        *self.shared.status.borrow()
    }

    /// Status changes (phase, generation, pid), for the instance's owner.
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.shared.status.subscribe()
    }

    /// How many times the process exited without being asked to.
    pub fn crashes(&self) -> u64 {
        self.shared.crashes.load(Ordering::Relaxed)
    }

    /// How many restarts became healthy.
    pub fn restarts(&self) -> u64 {
        self.shared.restarts.load(Ordering::Relaxed)
    }

    /// How many restart attempts failed (exited or unhealthy during start).
    pub fn failed_starts(&self) -> u64 {
        self.shared.failed_starts.load(Ordering::Relaxed)
    }

    /// Invocations in flight now.
    pub fn in_flight(&self) -> u64 {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// POSTs `body` (JSON) to the function's invoke path; see
    /// [`invoke_with`](Self::invoke_with).
    pub async fn invoke(
        &self,
        body: &[u8],
        deadline: Duration,
    ) -> Result<HttpResponse, InvokeError> {
        let call = FunctionCall {
            method: "POST",
            target: None,
            headers: &[("content-type", b"application/json")],
            body: RequestBody::from(body.to_vec()),
        };
        self.invoke_with(call, deadline).await
    }

    /// Sends `call` to the function and returns its response (any status:
    /// the function's own errors are its answer), its body at most the
    /// spec's `max_reply_bytes`.
    ///
    /// While the instance restarts the call waits for it, within `deadline`.
    /// It ends with an error if the deadline passes, the process crashes
    /// while the request is in flight, or the instance is stopped or failed.
    /// The remaining time is sent as `X-Gshare-Deadline-Ms`.
    pub async fn invoke_with(
        &self,
        call: FunctionCall<'_>,
        deadline: Duration,
    ) -> Result<HttpResponse, InvokeError> {
        self.invoke_streaming(call, deadline, |_| None).await
    }

    /// [`invoke_with`](Self::invoke_with), where `on_head` may take the
    /// reply's body as a stream: given the head, it returns where the
    /// body's chunks go (a bounded channel: the function is read only as
    /// fast as the receiver takes them), or `None` to read it whole. A
    /// streamed body ends with [`StreamItem::End`]; a channel closed
    /// without it means the reply was cut (deadline, crash, over
    /// `max_reply_bytes`: the call's error says which). The answer of a
    /// streamed call has an empty body. A receiver that goes away ends the
    /// call (`Ok`, the client left).
    pub async fn invoke_streaming(
        &self,
        call: FunctionCall<'_>,
        deadline: Duration,
        on_head: impl FnOnce(&ReplyHead) -> Option<tokio::sync::mpsc::Sender<StreamItem>>,
    ) -> Result<HttpResponse, InvokeError> {
        let spec = &self.shared.spec;
        let instance = || spec.instance.clone();
        let until = tokio::time::Instant::now() + deadline;
        let mut rx = self.shared.status.subscribe();
        let generation = loop {
            let s = *rx.borrow_and_update();
            match s.phase {
                Phase::Ready => break s.generation,
                Phase::Stopped | Phase::Failed => {
                    return Err(InvokeError::Unavailable {
                        instance: instance(),
                        phase: s.phase,
                    })
                }
                Phase::Starting | Phase::Restarting => {}
            }
            if tokio::time::timeout_at(until, rx.changed()).await.is_err() {
                return Err(InvokeError::DeadlineExceeded {
                    instance: instance(),
                    deadline,
                    while_: "waiting for restart",
                });
            }
        };
        self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        let _guard = InFlight(&self.shared.in_flight);
        let left_ms = until
            .saturating_duration_since(tokio::time::Instant::now())
            .as_millis()
            .to_string();
        let mut all_headers: Vec<(&str, &[u8])> = call
            .headers
            .iter()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("x-gshare-deadline-ms"))
            .copied()
            .collect();
        all_headers.push(("x-gshare-deadline-ms", left_ms.as_bytes()));
        let changed = |s: &Status| s.phase != Phase::Ready || s.generation != generation;
        let crashed_or_stopped = |s: Status| match s.phase {
            Phase::Stopped => InvokeError::Unavailable {
                instance: instance(),
                phase: Phase::Stopped,
            },
            _ => InvokeError::Crashed {
                instance: instance(),
                generation,
            },
        };
        let mut rx2 = rx.clone();
        let target = call.target.unwrap_or(&spec.invoke_path);
        let client = &self.shared.client;
        let request = async {
            let (head, body) = client
                .open_body(call.method, target, &all_headers, call.body)
                .await?;
            let body = match on_head(&head) {
                None => read_body(body, spec.max_reply_bytes).await?,
                Some(tx) => {
                    pump(body, &tx, spec.max_reply_bytes).await?;
                    Vec::new()
                }
            };
            Ok::<_, HttpError>(HttpResponse {
                status: head.status,
                headers: head.headers,
                body,
            })
        };
        // Owned values only across awaits (`watch::Ref` is not `Send`).
        let status_change = async { rx.wait_for(changed).await.map(|s| *s).ok() };
        let outcome = tokio::select! {
            r = request => Ok(r),
            s = status_change => Err(Some(s.unwrap_or(Status { phase: Phase::Stopped, generation, pid: None }))),
            _ = tokio::time::sleep_until(until) => Err(None),
        };
        match outcome {
            Ok(Ok(resp)) => Ok(resp),
            // The body's sender cut it: nothing to learn from the process.
            Ok(Err(HttpError::BodyCut(_))) => Err(InvokeError::RequestCut {
                instance: instance(),
            }),
            Ok(Err(source)) => {
                // Did the process die under us? Wait briefly to find out.
                let confirm = (tokio::time::Instant::now() + CRASH_CONFIRM).min(until);
                let changed_now = async { rx2.wait_for(changed).await.map(|s| *s).ok() };
                match tokio::time::timeout_at(confirm, changed_now).await {
                    Ok(Some(s)) => Err(crashed_or_stopped(s)),
                    _ => Err(InvokeError::Transport {
                        instance: instance(),
                        source,
                    }),
                }
            }
            Err(Some(s)) => Err(crashed_or_stopped(s)),
            Err(None) => Err(InvokeError::DeadlineExceeded {
                instance: instance(),
                deadline,
                while_: "waiting for response",
            }),
        }
    }

    /// Stops the instance: SIGTERM to its process group, SIGKILL after the
    /// spec's grace. In-flight invocations end with `Unavailable(Stopped)`.
    /// Idempotent.
    pub async fn stop(&self) {
        self.shared.stop.send_replace(true);
        let task = self
            .supervisor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Drop for ProcessInstance {
    fn drop(&mut self) {
        self.shared.stop.send_replace(true);
        let pgid = self.shared.pgid.load(Ordering::SeqCst);
        if pgid > 0 {
            signal_group(pgid, Signal::KILL);
        }
    }
}

/// Resolves once a stop was requested (or the instance handle is gone).
async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Owns the child: restarts it on crash, stops it on request.
async fn supervise(
    shared: Arc<Shared>,
    mut child: Child,
    mut stop: watch::Receiver<bool>,
    log: Option<PathBuf>,
) {
    let spec = &shared.spec;
    let mut generation = 1u64;
    let mut healthy_since = Instant::now();
    let mut attempt = 0u32;
    loop {
        // Running and healthy: wait for an exit or a stop.
        tokio::select! {
            _ = child.wait() => {}
            _ = stop_requested(&mut stop) => {
                terminate(&mut child, spec.stop_grace).await;
                shared.pgid.store(0, Ordering::SeqCst);
                shared.set_status(Phase::Stopped, generation, None);
                return;
            }
        }
        // Crashed: clear what is left of its group, tell in-flight calls.
        let pgid = shared.pgid.swap(0, Ordering::SeqCst);
        signal_group(pgid, Signal::KILL);
        shared.crashes.fetch_add(1, Ordering::Relaxed);
        shared.set_status(Phase::Restarting, generation, None);
        if healthy_since.elapsed() >= spec.backoff.reset_after {
            attempt = 0;
        }
        loop {
            attempt += 1;
            if spec.max_failed_starts.is_some_and(|m| attempt > m) {
                shared.set_status(Phase::Failed, generation, None);
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(spec.backoff.delay(attempt)) => {}
                _ = stop_requested(&mut stop) => {
                    shared.set_status(Phase::Stopped, generation, None);
                    return;
                }
            }
            generation += 1;
            let mut next = match spawn(spec, log.as_ref(), shared.ledger.as_ref()) {
                Ok(c) => c,
                Err(_) => {
                    shared.failed_starts.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            let pid = next.id();
            shared.pgid.store(pid.unwrap_or(0) as i32, Ordering::SeqCst);
            shared.set_status(Phase::Restarting, generation, pid);
            match wait_healthy(spec, &shared.client, &mut next, &mut stop).await {
                Ok(()) => {
                    child = next;
                    healthy_since = Instant::now();
                    shared.restarts.fetch_add(1, Ordering::Relaxed);
                    shared.set_status(Phase::Ready, generation, pid);
                    break;
                }
                Err(ProcessError::StoppedDuringStart { .. }) => {
                    shared.pgid.store(0, Ordering::SeqCst);
                    shared.set_status(Phase::Stopped, generation, None);
                    return;
                }
                Err(_) => {
                    shared.pgid.store(0, Ordering::SeqCst);
                    shared.failed_starts.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
