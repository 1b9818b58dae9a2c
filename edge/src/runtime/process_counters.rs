//! Counters of the node's function processes, for `/metrics`, and the
//! measured boot-to-ready of its microVMs (for `/metrics` and for the
//! executor's timing of their loads), and the microVMs running now, each
//! with the boot-to-ready measured when it started.

use gshare_core::executor::StartTimes;
use gshare_core::model::{Micros, Runtime};
use std::collections::{BTreeMap, HashMap};
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

/// One microVM started by a driver and not stopped yet.
#[derive(Debug, Clone)]
struct RunningVm {
    tenant: String,
    function: String,
    pid: u32,
    boot_us: Micros,
}

/// A running microVM as `/metrics` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmFigures {
    /// Its function's tenant.
    pub tenant: String,
    /// Its function.
    pub function: String,
    /// QEMU's pid.
    pub pid: u32,
    /// Its boot-to-ready (QEMU spawned → first healthy answer), µs.
    pub boot_us: Micros,
    /// QEMU's resident memory now, KiB.
    pub rss_kib: u64,
}

#[derive(Debug, Default)]
struct VmStarts {
    /// Per microVM runtime (registered by the driver set).
    by_runtime: HashMap<Runtime, StartTimes>,
    /// All of the node's boots, last first out.
    node: Option<StartTimes>,
    /// The microVMs started and not stopped, by [`ProcessCounters::vm_ready`]'s key.
    running: BTreeMap<u64, RunningVm>,
    /// The next key.
    next_key: u64,
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

    /// `vm_booted`, and the VM (QEMU `pid`, serving `tenant`'s `function`)
    /// is running until the returned guard is dropped.
    pub(crate) fn vm_ready(
        &self,
        runtime: Runtime,
        tenant: &str,
        function: &str,
        pid: u32,
        us: Micros,
    ) -> VmGuard {
        self.vm_booted(runtime, us);
        let mut vm = self.vm();
        let key = vm.next_key;
        vm.next_key += 1;
        vm.running.insert(
            key,
            RunningVm {
                tenant: tenant.to_string(),
                function: function.to_string(),
                pid,
                boot_us: us,
            },
        );
        VmGuard {
            counters: self.clone(),
            key,
        }
    }

    /// The microVMs running now whose QEMU is alive, each with the
    /// boot-to-ready measured when it started and its RSS read now from
    /// `/proc`. A VM its supervisor restarted after a crash is not among
    /// them (its boot was not measured; its first QEMU is gone).
    pub fn running_vms(&self) -> Vec<VmFigures> {
        let running: Vec<RunningVm> = self.vm().running.values().cloned().collect();
        running
            .into_iter()
            .filter_map(|v| {
                Some(VmFigures {
                    rss_kib: super::microvm::rss_kib(v.pid)?,
                    tenant: v.tenant,
                    function: v.function,
                    pid: v.pid,
                    boot_us: v.boot_us,
                })
            })
            .collect()
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

/// A microVM counted as running by [`ProcessCounters::vm_ready`]; dropping
/// it (the VM stopped, or its driver went) ends that.
#[derive(Debug)]
pub(crate) struct VmGuard {
    counters: ProcessCounters,
    key: u64,
}

impl Drop for VmGuard {
    fn drop(&mut self) {
        self.counters.vm().running.remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_vm_is_listed_with_its_boot_and_rss_until_its_guard_drops() {
        let c = ProcessCounters::new();
        c.register_vm_runtime(Runtime::Custom, false, 3_000_000);
        // This test process stands in for a live QEMU; a pid above Linux's
        // maximum for one that is gone (a crashed VM).
        let me = std::process::id();
        let live = c.vm_ready(Runtime::Custom, "acme", "echo", me, 6_000_000);
        let dead = c.vm_ready(Runtime::Custom, "acme", "gone", 4_194_305, 5_000_000);
        assert_eq!(c.vm_boots(), 2, "both boots are measured");
        let vms = c.running_vms();
        assert_eq!(vms.len(), 1, "{vms:?}");
        assert_eq!(
            (vms[0].tenant.as_str(), vms[0].function.as_str(), vms[0].pid),
            ("acme", "echo", me)
        );
        assert_eq!(vms[0].boot_us, 6_000_000);
        assert!(vms[0].rss_kib > 0);
        drop(dead);
        drop(live);
        assert!(c.running_vms().is_empty());
        assert_eq!(c.vm_boots(), 2);
    }
}
