//! Counters of the node's function processes, for `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, Default)]
struct Counts {
    starts: AtomicU64,
    crashes: AtomicU64,
    restarts: AtomicU64,
    failed_starts: AtomicU64,
    running: AtomicU64,
}

/// Shared by every [`super::ProcessDriver`] of a node (clones count into
/// the same numbers).
#[derive(Debug, Clone, Default)]
pub struct ProcessCounters(Arc<Counts>);

impl ProcessCounters {
    /// Fresh counters, all zero.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn started(&self) {
        self.0.starts.fetch_add(1, Ordering::Relaxed);
        self.0.running.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stopped(&self) {
        self.0.running.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn add(&self, crashes: u64, restarts: u64, failed_starts: u64) {
        self.0.crashes.fetch_add(crashes, Ordering::Relaxed);
        self.0.restarts.fetch_add(restarts, Ordering::Relaxed);
        self.0
            .failed_starts
            .fetch_add(failed_starts, Ordering::Relaxed);
    }

    /// Processes started by a driver (placement, swap-in, move), not
    /// counting the supervisor's restarts.
    pub fn starts(&self) -> u64 {
        self.0.starts.load(Ordering::Relaxed)
    }

    /// Processes that exited without being asked to.
    pub fn crashes(&self) -> u64 {
        self.0.crashes.load(Ordering::Relaxed)
    }

    /// Restarts after a crash that became healthy.
    pub fn restarts(&self) -> u64 {
        self.0.restarts.load(Ordering::Relaxed)
    }

    /// Restart attempts that failed (exited or unhealthy while starting).
    pub fn failed_starts(&self) -> u64 {
        self.0.failed_starts.load(Ordering::Relaxed)
    }

    /// Instances started and not stopped yet (running or restarting).
    pub fn running(&self) -> u64 {
        self.0.running.load(Ordering::Relaxed)
    }
}
