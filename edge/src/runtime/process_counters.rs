//! Counters of the node's function processes, for `/metrics`, and the
//! measured boot-to-ready of its microVMs (for `/metrics` and for the
//! executor's timing of their loads).

use gshare_core::executor::StartTimes;
use gshare_core::model::{Micros, Runtime};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
struct Counts {
    starts: AtomicU64,
    crashes: AtomicU64,
    restarts: AtomicU64,
    failed_starts: AtomicU64,
    running: AtomicU64,
    /// 0: no microVM runtime, 1: TCG, 2: KVM.
    vm_accel: AtomicU64,
    vm: Mutex<VmStarts>,
}

#[derive(Debug, Default)]
struct VmStarts {
    /// Per microVM runtime (registered by the driver set).
    by_runtime: HashMap<Runtime, StartTimes>,
    /// All of the node's boots, last first out.
    node: Option<StartTimes>,
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

    fn vm(&self) -> std::sync::MutexGuard<'_, VmStarts> {
        self.0.vm.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `runtime` runs in microVMs accelerated by `kvm` (else TCG); its
    /// start estimate is `default_us` until a boot is measured.
    pub(crate) fn register_vm_runtime(&self, runtime: Runtime, kvm: bool, default_us: Micros) {
        self.0
            .vm_accel
            .store(if kvm { 2 } else { 1 }, Ordering::Relaxed);
        let mut vm = self.vm();
        vm.by_runtime.insert(runtime, StartTimes::new(default_us));
        vm.node.get_or_insert_with(|| StartTimes::new(default_us));
    }

    /// A microVM of `runtime` booted and answered its health check after `us`.
    pub(crate) fn vm_booted(&self, runtime: Runtime, us: Micros) {
        let mut vm = self.vm();
        if let Some(t) = vm.by_runtime.get_mut(&runtime) {
            t.record(us);
        }
        if let Some(t) = vm.node.as_mut() {
            t.record(us);
        }
    }

    /// What the next load of a `runtime` function is expected to take: the
    /// median of its recent microVM boots (the driver's default before the
    /// first); `None` unless `runtime` runs in microVMs.
    pub fn start_estimate_us(&self, runtime: Runtime) -> Option<Micros> {
        self.vm()
            .by_runtime
            .get(&runtime)
            .map(StartTimes::estimate_us)
    }

    /// How the node's microVMs are accelerated: `None` without a microVM
    /// runtime, else `"kvm"` or `"tcg"`.
    pub fn vm_accel(&self) -> Option<&'static str> {
        match self.0.vm_accel.load(Ordering::Relaxed) {
            1 => Some("tcg"),
            2 => Some("kvm"),
            _ => None,
        }
    }

    /// MicroVM boots measured (placements, swap-ins, moves).
    pub fn vm_boots(&self) -> u64 {
        self.vm().node.as_ref().map_or(0, StartTimes::count)
    }

    /// The last microVM boot-to-ready, µs.
    pub fn vm_boot_last_us(&self) -> Option<Micros> {
        self.vm().node.as_ref().and_then(StartTimes::last_us)
    }

    /// The median of the node's recent microVM boots, µs (the default
    /// before the first); `None` without a microVM runtime.
    pub fn vm_boot_median_us(&self) -> Option<Micros> {
        self.vm().node.as_ref().map(StartTimes::estimate_us)
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
