//! A snapshot of the node for heartbeats and `/metrics`.

use gshare_core::protocol::{GpuStatus, InstanceStatus};

/// Counters and per-GPU state of the node.
#[derive(Debug, Clone, Default, PartialEq, Eq, actix::MessageResponse)]
pub struct NodeStatus {
    /// Per GPU.
    pub gpus: Vec<GpuStatus>,
    /// Per hosted instance: where its weights are.
    pub instances: Vec<InstanceStatus>,
    /// Invocations accepted and not answered yet.
    pub in_flight: u32,
    /// Functions hosted.
    pub functions: u32,
    /// Released functions whose weights are kept in host memory (warm
    /// resume; at most `MAX_PARKED`).
    pub parked: u32,
    /// Invocations answered with a result.
    pub served: u64,
    /// Invocations answered with an explicit error.
    pub failed: u64,
    /// Invocations answered with the stored answer of their idempotency key.
    pub replayed: u64,
    /// Invocations dropped before they ran because their caller went away
    /// (its connection closed; unkeyed calls only): never run, never billed.
    pub abandoned: u64,
    /// Swap-ins from host memory.
    pub swap_ins: u64,
    /// Swap-outs to host memory.
    pub swap_outs: u64,
    /// Cold starts.
    pub cold_starts: u64,
    /// Moves between GPUs (remaps).
    pub moves: u64,
    /// Loads the backend's accounting refused (must stay 0).
    pub accounting_errors: u64,
    /// Function processes started by the `process` driver (placements,
    /// swap-ins, moves; not the restarts after a crash).
    pub process_starts: u64,
    /// Function processes that exited without being asked to.
    pub process_crashes: u64,
    /// Restarts after a crash that became healthy.
    pub process_restarts: u64,
    /// Restart attempts that failed.
    pub process_failed_starts: u64,
    /// Function processes started and not stopped.
    pub process_running: u64,
    /// How the node's microVMs are accelerated (`"kvm"` or `"tcg"`);
    /// `None` without a `microvm` runtime.
    pub vm_accel: Option<&'static str>,
    /// MicroVM boots measured (spawn to the first healthy answer).
    pub vm_boots: u64,
    /// The last microVM boot-to-ready, µs (0 before the first).
    pub vm_boot_last_us: u64,
    /// The median of the recent microVM boots, µs: what the executor times
    /// a microVM load by (the template's default before the first boot).
    pub vm_boot_median_us: u64,
    /// The microVMs running now (boot-to-ready as measured at their start,
    /// RSS now).
    pub vms: Vec<crate::runtime::VmFigures>,
    /// Usage journal appends that succeeded.
    pub usage_writes: u64,
    /// Usage records journaled.
    pub usage_records: u64,
    /// Usage journal appends that failed.
    pub usage_write_failures: u64,
    /// Successful results withheld (answered `usage_not_recorded`) because
    /// their usage could not be journaled.
    pub usage_withheld: u64,
    /// Results waiting for their usage to be journaled now.
    pub usage_waiting: u64,
    /// When the snapshot was taken, Unix ms on the agent's clock.
    pub at_ms: u64,
}
