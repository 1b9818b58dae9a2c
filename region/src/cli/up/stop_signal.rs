//! SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal closed), caught for
//! `gsharectl up` so that it can stop its children and print its summary
//! before it exits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

/// Set once SIGINT, SIGTERM or SIGHUP arrived; a watcher thread waits for them.
#[derive(Debug)]
pub struct StopSignal {
    flag: Arc<AtomicBool>,
    rx: Receiver<&'static str>,
    received: Option<&'static str>,
}

impl StopSignal {
    /// Installs the handlers (from then on the signals no longer end the
    /// process by themselves) and starts the watcher thread.
    pub fn install() -> anyhow::Result<StopSignal> {
        let flag = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let thread_flag = flag.clone();
        std::thread::Builder::new()
            .name("up-signals".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    use tokio::signal::unix::{signal, SignalKind};
                    let handlers = signal(SignalKind::interrupt()).and_then(|i| {
                        Ok((
                            i,
                            signal(SignalKind::terminate())?,
                            signal(SignalKind::hangup())?,
                        ))
                    });
                    let (mut int, mut term, mut hup) = match handlers {
                        Ok(h) => h,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    let name = tokio::select! {
                        _ = int.recv() => "SIGINT",
                        _ = term.recv() => "SIGTERM",
                        _ = hup.recv() => "SIGHUP",
                    };
                    thread_flag.store(true, Ordering::SeqCst);
                    let _ = tx.send(name);
                });
            })
            .context("starting the signal thread")?;
        ready_rx
            .recv()
            .context("signal thread")?
            .map_err(|e| anyhow::anyhow!("installing signal handlers: {e}"))?;
        Ok(StopSignal {
            flag,
            rx,
            received: None,
        })
    }

    /// A flag other threads can poll.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }

    /// Whether a signal has arrived.
    pub fn requested(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Waits up to `timeout` for a signal; returns whether one arrived.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        if self.received.is_some() {
            return true;
        }
        match self.rx.recv_timeout(timeout) {
            Ok(name) => {
                self.received = Some(name);
                true
            }
            Err(RecvTimeoutError::Timeout) => self.requested(),
            Err(RecvTimeoutError::Disconnected) => {
                // The watcher is gone (it only ends after a signal).
                std::thread::sleep(timeout);
                self.requested()
            }
        }
    }

    /// Waits until `until` (or forever with `None`) or a signal; returns
    /// whether a signal arrived.
    pub fn wait_until(&mut self, until: Option<Instant>) -> bool {
        loop {
            let step = match until {
                Some(t) => {
                    let now = Instant::now();
                    if now >= t {
                        return self.requested();
                    }
                    (t - now).min(Duration::from_secs(1))
                }
                None => Duration::from_secs(1),
            };
            if self.wait(step) {
                return true;
            }
        }
    }

    /// The signal that arrived, if one did.
    pub fn name(&mut self) -> Option<&'static str> {
        if self.received.is_none() {
            self.received = self.rx.try_recv().ok();
        }
        self.received
    }
}
