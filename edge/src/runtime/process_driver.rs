//! The `process` runtime driver: a [`ProcessInstance`] per hosted function.
//!
//! ```text
//!  start(spec, slices) ─▶ render the runtime's template for the slice
//!                          (CUDA_VISIBLE_DEVICES, MPS limits, {port} …)
//!                          ─▶ ProcessInstance::start: spawn, wait for health
//!  invoke(invocation)  ─▶ POST the body (or, on the transparent route, the
//!                          client's method, path, headers), bounded by the deadline
//!                          ─▶ 2xx (any status when transparent): its reply
//!                             │ crash: Crashed │ late: DeadlineExceeded
//!                          a transparent reply without a length, when the agent
//!                          allows it (`stream_to`): head and chunk channel sent at
//!                          once, the call answered (empty body) when it ended
//!  place(Some(gpu))    ─▶ not running, or on another GPU: stop, start on `gpu`
//!  place(None)         ─▶ stop (weights leave the GPU with the process)
//!  stop()              ─▶ SIGTERM to the process group, SIGKILL after the grace
//! ```
//!
//! With [`ProcessOptions::vm`] set this is the `microvm` driver: the
//! process is QEMU booting the function in its own VM
//! ([`super::microvm::guest_spec`]); everything else (supervision,
//! backoff, ledger, readiness, placement) is the same, and each start's
//! boot-to-ready is recorded for the executor ([`ProcessCounters::vm_booted`]).
//!
//! Crashes are the instance's supervisor's business: it restarts the
//! process with capped exponential backoff while the driver keeps the
//! same handle; calls in flight at the crash end with
//! [`RuntimeError::Crashed`]. A watcher task copies the instance's crash
//! and restart counts into the node's [`ProcessCounters`].

use super::microvm::{self, MicrovmOptions};
use super::process::{
    FunctionArgs, FunctionCall, InvokeError, Phase, ProcessInstance, ProcessLedger, ProcessSpec,
    ReplyHead, RuntimeTemplate, SliceLimits,
};
use super::process_counters::VmGuard;
use super::{
    FunctionReply, Invocation, Placement, ProcessCounters, RuntimeDriver, RuntimeError,
    RuntimeFuture, StreamItem, StreamOpen, Streamed,
};
use gshare_core::model::{FunctionSpec, GpuId, Mib, Slice};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Chunks of a streamed reply held between the function and the client
/// (the function is read only as fast as the client takes them).
const STREAM_CHUNKS: usize = 16;

/// Passes a streamed reply's chunks from the function's pump to the
/// ingress (both ends arrive on `ends` once the reply streams) and keeps
/// its first [`gshare_core::protocol::MAX_REPLAY_BODY`] bytes; `None`
/// when the reply did not stream. Ends when the pump does; a receiver that
/// went away, or one that takes nothing until the request's deadline
/// `until`, stops it (the pump then sees its channel closed).
async fn tee(
    ends: tokio::sync::oneshot::Receiver<(
        tokio::sync::mpsc::Receiver<StreamItem>,
        tokio::sync::mpsc::Sender<StreamItem>,
    )>,
    until: tokio::time::Instant,
) -> Option<(Vec<u8>, Streamed)> {
    let (mut from, to) = ends.await.ok()?;
    let (mut first, mut len, mut complete) = (Vec::new(), 0u64, false);
    while let Some(item) = from.recv().await {
        // Counted once passed on: a cut stream's length is what went out.
        let (end, sent) = match &item {
            StreamItem::Data(b) => (false, b.clone()),
            StreamItem::End => (true, Default::default()),
        };
        if !matches!(
            tokio::time::timeout_at(until, to.send(item)).await,
            Ok(Ok(()))
        ) {
            break;
        }
        let room = gshare_core::protocol::MAX_REPLAY_BODY.saturating_sub(first.len());
        first.extend_from_slice(&sent[..sent.len().min(room)]);
        len = len.saturating_add(sent.len() as u64);
        if end {
            complete = true;
            break;
        }
    }
    Some((first, Streamed { len, complete }))
}

/// How much of a function's error body is kept in the error message.
const ERROR_BODY_EXCERPT: usize = 200;

/// What every process driver of one runtime shares.
#[derive(Debug, Clone)]
pub struct ProcessOptions {
    /// The runtime's command template.
    pub template: RuntimeTemplate,
    /// Working directory of the processes (the template file's directory);
    /// the agent's own when `None`.
    pub workdir: Option<PathBuf>,
    /// Where each instance's stdout and stderr are appended
    /// (`<dir>/<tenant>-<function>.log`); discarded when `None`.
    pub log_dir: Option<PathBuf>,
    /// Memory of the node's GPUs, MiB (for `{memory_fraction}`).
    pub gpu_memory_mib: Option<Mib>,
    /// The node's counters.
    pub counters: ProcessCounters,
    /// Where started process groups are recorded (reaped by the next
    /// agent after a `kill -9`); none when `None`.
    pub ledger: Option<ProcessLedger>,
    /// Run each instance in a microVM (the `microvm` driver); a plain
    /// process when `None`.
    pub vm: Option<Arc<MicrovmOptions>>,
}

struct Running {
    instance: Arc<ProcessInstance>,
    gpus: Vec<u32>,
    watcher: JoinHandle<()>,
    /// The microVM's initramfs, removed when it stops.
    initrd: Option<PathBuf>,
    /// Counts the microVM as running (in `/metrics`) until dropped.
    _vm: Option<VmGuard>,
}

/// The running process, if any. Shared with the driver's own futures
/// (they run on the instance actor's thread; start and place are never
/// concurrent with each other, the actor waits for them).
type Slot = Rc<RefCell<Option<Running>>>;

/// Runs one hosted function as a supervised process (see the module docs).
pub struct ProcessDriver {
    options: Arc<ProcessOptions>,
    function: Option<FunctionSpec>,
    slices: Vec<Slice>,
    running: Slot,
    /// Node GPUs on which the executor holds a copy of the weights now.
    copies: BTreeSet<u32>,
}

impl std::fmt::Debug for ProcessDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessDriver")
            .field("runtime", &self.options.template.runtime)
            .field("pid", &self.pid())
            .finish()
    }
}

impl ProcessDriver {
    /// A stopped driver for the runtime of `options`.
    pub fn new(options: Arc<ProcessOptions>) -> Self {
        Self {
            options,
            function: None,
            slices: Vec::new(),
            running: Slot::default(),
            copies: BTreeSet::new(),
        }
    }

    /// The running process's pid (none while stopped or restarting).
    pub fn pid(&self) -> Option<u32> {
        self.running
            .borrow()
            .as_ref()
            .and_then(|r| r.instance.status().pid)
    }

    /// Which start of the process runs now (1 = the first; a crash and
    /// restart adds one); `None` while stopped.
    pub fn generation(&self) -> Option<u64> {
        self.running
            .borrow()
            .as_ref()
            .map(|r| r.instance.status().generation)
    }

    /// The node GPUs the running process is limited to.
    pub fn gpus(&self) -> Option<Vec<u32>> {
        self.running.borrow().as_ref().map(|r| r.gpus.clone())
    }

    /// Stops what runs in `slot`, then starts on `slices` into it.
    fn relaunch(
        &self,
        function: FunctionSpec,
        slices: Vec<Slice>,
    ) -> RuntimeFuture<Result<(), RuntimeError>> {
        let old = self.running.borrow_mut().take();
        let (options, slot) = (self.options.clone(), self.running.clone());
        Box::pin(async move {
            if let Some(r) = old {
                halt(r, options.counters.clone()).await;
            }
            let running = launch(options, function, slices).await?;
            *slot.borrow_mut() = Some(running);
            Ok(())
        })
    }
}

/// Copies the instance's counts into the node's counters on every status
/// change; ends once the instance is stopped, failed or gone.
async fn watch_counts(
    instance: Weak<ProcessInstance>,
    mut rx: watch::Receiver<super::process::Status>,
    counters: ProcessCounters,
) {
    let (mut crashes, mut restarts, mut failed) = (0, 0, 0);
    loop {
        let closed = rx.changed().await.is_err();
        let phase = rx.borrow_and_update().phase;
        if let Some(i) = instance.upgrade() {
            let (c, r, f) = (i.crashes(), i.restarts(), i.failed_starts());
            counters.add(c - crashes, r - restarts, f - failed);
            (crashes, restarts, failed) = (c, r, f);
        }
        if closed || matches!(phase, Phase::Stopped | Phase::Failed) {
            return;
        }
    }
}

/// Renders the template for `slices` and starts the process.
async fn launch(
    options: Arc<ProcessOptions>,
    function: FunctionSpec,
    slices: Vec<Slice>,
) -> Result<Running, RuntimeError> {
    let limits = SliceLimits::from_slices(&slices, options.gpu_memory_mib)
        .ok_or_else(|| RuntimeError::Failed("no GPU slice to run on".into()))?;
    let id = format!("{}-{}", function.tenant.0, function.name);
    let (spec, initrd) = match &options.vm {
        None => {
            let mut spec: ProcessSpec = ProcessSpec::from_template(
                &options.template,
                &id,
                FunctionArgs::of(&function),
                0,
                limits.clone(),
            )
            .map_err(|e| RuntimeError::Failed(format!("{id}: template: {e}")))?;
            spec.workdir = options.workdir.clone();
            (spec, None)
        }
        Some(vm) => {
            let (spec, initrd) = microvm::guest_spec(
                &options.template,
                options.workdir.as_deref(),
                vm,
                &id,
                FunctionArgs::of(&function),
                limits.clone(),
            )
            .map_err(|e| RuntimeError::Failed(format!("{id}: microvm: {e}")))?;
            (spec, Some(initrd))
        }
    };
    let log = options.log_dir.as_ref().and_then(|dir| {
        std::fs::create_dir_all(dir)
            .map_err(|e| tracing::warn!("{}: {e}; function output discarded", dir.display()))
            .ok()
            .map(|_| dir.join(format!("{id}.log")))
    });
    let spawned = std::time::Instant::now();
    let started = ProcessInstance::start_supervised(spec, log, options.ledger.clone()).await;
    let instance = match started {
        Ok(i) => Arc::new(i),
        Err(e) => {
            if let Some(path) = &initrd {
                let _ = std::fs::remove_file(path);
            }
            return Err(RuntimeError::Failed(e.to_string()));
        }
    };
    options.counters.started();
    let pid = instance.status().pid;
    let mut vm_guard = None;
    match &options.vm {
        None => tracing::info!(
            instance = %id,
            pid,
            gpus = %limits.gpu_list(),
            "function process ready"
        ),
        Some(vm) => {
            let boot = spawned.elapsed();
            let boot_us = u64::try_from(boot.as_micros()).unwrap_or(u64::MAX);
            match pid {
                Some(pid) => {
                    vm_guard = Some(options.counters.vm_ready(
                        function.runtime,
                        &function.tenant.0,
                        &function.name,
                        pid,
                        boot_us,
                    ));
                }
                None => options.counters.vm_booted(function.runtime, boot_us),
            }
            tracing::info!(
                instance = %id,
                pid,
                gpus = %limits.gpu_list(),
                accel = vm.accel.as_str(),
                boot_to_ready_ms = boot.as_millis() as u64,
                rss_mib = pid.and_then(microvm::rss_kib).map(|k| k / 1024),
                host_port = instance.spec().port,
                "function microvm ready"
            );
        }
    }
    let watcher = tokio::spawn(watch_counts(
        Arc::downgrade(&instance),
        instance.subscribe(),
        options.counters.clone(),
    ));
    Ok(Running {
        instance,
        gpus: limits.gpus,
        watcher,
        initrd,
        _vm: vm_guard,
    })
}

/// Stops the process (and its group) and settles the counters.
async fn halt(running: Running, counters: ProcessCounters) {
    let (instance, pid) = (
        running.instance.spec().instance.clone(),
        running.instance.status().pid,
    );
    running.instance.stop().await;
    tracing::info!(instance = %instance, pid, "function process stopped");
    if let Some(path) = &running.initrd {
        let _ = std::fs::remove_file(path);
    }
    let _ = running.watcher.await;
    counters.stopped();
}

/// `slices` moved to node GPU `gpu` (one slice; several GPUs stay as they are).
fn moved_to(slices: &[Slice], gpu: u32) -> Vec<Slice> {
    match slices {
        [one] => vec![Slice {
            gpu: GpuId {
                node: one.gpu.node.clone(),
                index: gpu,
            },
            ..one.clone()
        }],
        many => many.to_vec(),
    }
}

fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out: String = text.chars().take(ERROR_BODY_EXCERPT).collect();
    if text.chars().count() > ERROR_BODY_EXCERPT {
        out.push('…');
    }
    out
}

impl RuntimeDriver for ProcessDriver {
    fn start(
        &mut self,
        spec: &FunctionSpec,
        slices: &[Slice],
    ) -> RuntimeFuture<Result<(), RuntimeError>> {
        self.function = Some(spec.clone());
        self.slices = slices.to_vec();
        self.relaunch(spec.clone(), slices.to_vec())
    }

    fn invoke(
        &mut self,
        invocation: Invocation,
    ) -> RuntimeFuture<Result<FunctionReply, RuntimeError>> {
        let Some(instance) = self.running.borrow().as_ref().map(|r| r.instance.clone()) else {
            return Box::pin(async { Err(RuntimeError::NotRunning) });
        };
        // Time left now: the request may have waited in the actor's mailbox.
        let deadline = match (invocation.deadline, &self.function) {
            (Some(at), _) => at.saturating_duration_since(std::time::Instant::now()),
            (None, Some(f)) => Duration::from_millis(f.deadline_ms),
            (None, None) => Duration::from_secs(60),
        }
        .max(Duration::from_millis(1));
        Box::pin(async move {
            let transparent = invocation.http.is_some();
            let stream_to = invocation.stream_to;
            let answer = match &invocation.http {
                None => {
                    let call = FunctionCall {
                        method: "POST",
                        target: None,
                        headers: &[("content-type", b"application/json")],
                        body: invocation.body,
                    };
                    instance
                        .invoke_with(call, deadline)
                        .await
                        .map(|resp| (resp, None))
                }
                Some(http) => {
                    let headers: Vec<(&str, &[u8])> = http
                        .headers
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_slice()))
                        .collect();
                    let call = FunctionCall {
                        method: &http.method,
                        target: Some(&http.target),
                        headers: &headers,
                        body: invocation.body,
                    };
                    // A reply without a length (chunked, event streams)
                    // streams when the agent allows it; one with a length
                    // is read whole.
                    // The chunks pass through `tee`, which keeps the
                    // body's first bytes for the idempotency key.
                    let (tee_tx, tee_rx) = tokio::sync::oneshot::channel();
                    let on_head = |head: &ReplyHead| {
                        let sized = head.headers.iter().any(|(k, _)| k == "content-length");
                        let to = stream_to.filter(|_| !sized)?;
                        let (tx, chunks) = tokio::sync::mpsc::channel(STREAM_CHUNKS);
                        let (pump_tx, pump_rx) = tokio::sync::mpsc::channel(STREAM_CHUNKS);
                        let open = StreamOpen {
                            head: head.clone(),
                            chunks,
                        };
                        to.send(open).ok()?;
                        tee_tx.send((pump_rx, tx)).ok().map(|()| pump_tx)
                    };
                    let (answer, kept) = tokio::join!(
                        instance.invoke_streaming(call, deadline, on_head),
                        tee(tee_rx, tokio::time::Instant::now() + deadline)
                    );
                    answer.map(|resp| (resp, kept))
                }
            };
            match answer {
                // The transparent route passes every status on; a plain
                // invocation's answer is a 2xx body.
                Ok((resp, kept)) if transparent || (200..300).contains(&resp.status) => {
                    let (body, streamed) = match kept {
                        Some((first, streamed)) => (first, Some(streamed)),
                        None => (resp.body, None),
                    };
                    Ok(FunctionReply {
                        head: ReplyHead {
                            status: resp.status,
                            headers: resp.headers,
                        },
                        body,
                        streamed,
                    })
                }
                Ok((resp, _)) => Err(RuntimeError::Failed(format!(
                    "function answered HTTP {}: {}",
                    resp.status,
                    excerpt(&resp.body)
                ))),
                Err(e @ InvokeError::Crashed { .. }) => Err(RuntimeError::Crashed(e.to_string())),
                Err(e @ InvokeError::DeadlineExceeded { .. }) => {
                    Err(RuntimeError::DeadlineExceeded(e.to_string()))
                }
                Err(e) => Err(RuntimeError::Failed(e.to_string())),
            }
        })
    }

    fn stop(&mut self) -> RuntimeFuture<()> {
        let running = self.running.borrow_mut().take();
        let counters = self.options.counters.clone();
        Box::pin(async move {
            if let Some(r) = running {
                halt(r, counters).await;
            }
        })
    }

    fn place(&mut self, change: Placement) -> RuntimeFuture<Result<(), RuntimeError>> {
        let Some(function) = self.function.clone() else {
            return Box::pin(async { Err(RuntimeError::NotRunning) });
        };
        // One process per function, on a GPU that holds one of the
        // executor's copies: a second copy elsewhere does not disturb it
        // (it serves the requests routed to either copy); it moves when
        // the copy of its own GPU leaves and stops with the last copy.
        match change {
            Placement::Joined(gpu) => {
                self.copies.insert(gpu);
            }
            Placement::Left(gpu) => {
                self.copies.remove(&gpu);
            }
        }
        let Some(&target) = (match change {
            Placement::Joined(gpu) => Some(gpu),
            Placement::Left(_) => None,
        })
        .as_ref()
        .or_else(|| self.copies.iter().next()) else {
            return self.stop_for_swap();
        };
        // Keep a process that runs on a GPU holding a copy, unless its
        // supervisor gave up on it: a load is a chance to start over.
        let copies = &self.copies;
        let usable = self.running.borrow().as_ref().is_some_and(|r| {
            r.gpus.iter().any(|g| copies.contains(g)) && r.instance.status().phase != Phase::Failed
        });
        if usable {
            return Box::pin(async { Ok(()) });
        }
        let slices = moved_to(&self.slices, target);
        self.slices = slices.clone();
        self.relaunch(function, slices)
    }
}

impl ProcessDriver {
    fn stop_for_swap(&mut self) -> RuntimeFuture<Result<(), RuntimeError>> {
        let stop = self.stop();
        Box::pin(async move {
            stop.await;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests;
