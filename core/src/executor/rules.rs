//! The knobs that make one executor behave as gshare or as a baseline.
//!
//! Every policy of `gsharectl sim serving` is the same [`NodeExecutor`]
//! (EDF queues, prediction, early reject) with different rules:
//!
//! | policy      | memory          | compute per request      | evicted weights | remap | waits on resident copy | waits for memory      |
//! |-------------|-----------------|--------------------------|-----------------|-------|------------------------|-----------------------|
//! | `exclusive`      | 1 slot = 1 GPU  | whole GPU (reserved)     | dropped (LRU)   | no    | no (earliest finish)   | yes, within deadline  |
//! | `exclusive-swap` | 1 slot = 1 GPU  | whole GPU (reserved)     | kept in host    | no    | no (earliest finish)   | yes, within deadline  |
//! | `static`         | k fixed slots   | 1000/k per slot          | dropped (LRU)   | no    | no (earliest finish)   | yes, within deadline  |
//! | `gshare`         | packed by MiB   | saturation share, shared | kept in host    | yes   | yes, within deadline   | yes, within deadline  |
//!
//! Slotted rules (`exclusive`, `exclusive-swap`, `static`) pick the victim
//! across all GPUs: among GPUs that would finish a request equally early,
//! the load goes to the one whose victim comes first in the eviction order
//! (least recently used without a host cache), and a rejected request's
//! scale-out copy may evict that victim (`scale_out_evicts`).
//!
//! Under `gshare` a request below a whole GPU is right-sized beside other
//! functions' copies (it takes only the share that finishes it within 95 %
//! of the time left to its deadline, and at least 1/8 of its share; a
//! batch's first request plans for the joiners its function's mean
//! inter-arrival predicts; alone on its GPU it takes its whole share) and squeezed (started on the free compute when its share is
//! not free but the slower service still meets the deadline); see
//! `squeeze`. A request served on its copy later than alone on its share
//! spreads the function: another copy is loaded onto free memory and
//! compute for its next requests (`spread`). Every policy batches requests of one function on one
//! instance when its profile says so ([`super::FunctionProfile::batch_ppm`]).
//!
//! [`NodeExecutor`]: super::NodeExecutor

/// How a node's executor shares GPUs among functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecutorRules {
    /// `Some(k)`: each GPU is cut into `k` fixed slices of memory and compute
    /// (MIG/MPS-like); an instance holds whole slots and runs one request at a
    /// time on their compute. `None`: fine-grained memory packing and shared compute.
    pub slots_per_gpu: Option<u32>,
    /// Evicted weights stay in host memory (a later load is a swap-in, not a
    /// cold start), and only swappable tiers (`oversubscribed`) are evicted,
    /// chosen by tier, predicted next use and idleness. `false`: an idle
    /// instance of any tier is dropped least-recently-used first
    /// (scale-to-zero), and every load is a cold start.
    pub host_cache: bool,
    /// Every function is resident on every GPU at no cost (EDF order alone;
    /// the executor's unit tests use it).
    pub all_resident: bool,
    /// An idle instance may be moved to another GPU of the node instead of
    /// loading a second copy there.
    pub remap: bool,
    /// A delayable request waits for a GPU that already holds its function
    /// while its predicted finish meets its deadline, even if a load
    /// elsewhere would finish it earlier.
    pub wait_within_deadline: bool,
    /// A request that no GPU has memory for now waits on the node while
    /// busy or loading instances that may be evicted once idle will free
    /// enough memory in time for its deadline (load and service included);
    /// it is placed on the events that free memory. `false`: it is rejected
    /// with `NoCapacity` at once.
    pub wait_for_memory: bool,
    /// The extra copy a rejected request starts (scale-out) may evict idle
    /// instances, the eviction order's first; `false`: only free memory.
    pub scale_out_evicts: bool,
    /// A request below a whole GPU that starts a batch or runs alone takes
    /// only the share that finishes it within 95 % of the time left to its
    /// deadline, and when that share is not free it may start on the free
    /// compute if its slower service still meets its deadline (fine-grained
    /// sharing only).
    pub squeeze: bool,
    /// A request served on a resident copy later than alone on its full
    /// share (it waits, is squeezed or joins a batch) loads another copy of
    /// its function, for its next requests, on a GPU with that share free
    /// and nothing queued, and that memory free or held by idle spare
    /// copies (their function has another copy) predicted to be used later
    /// than this function: never evicting a sole copy, one load at a time,
    /// not for pinned functions, and only while the node's free memory
    /// stays at least the memory of the functions with requests and no copy.
    /// Making room then evicts an idle copy whose function has another
    /// before any sole copy of the same tier.
    pub spread: bool,
}

impl ExecutorRules {
    /// Whole GPUs, one instance each, LRU drop, cold start on miss.
    pub fn exclusive() -> Self {
        Self {
            slots_per_gpu: Some(1),
            host_cache: false,
            all_resident: false,
            remap: false,
            wait_within_deadline: false,
            wait_for_memory: true,
            scale_out_evicts: true,
            squeeze: false,
            spread: false,
        }
    }

    /// Whole GPUs, one instance each, with a host-memory weight cache: an
    /// evicted model's weights stay in host memory and come back by a
    /// swap-in over the host-to-device link (Torpor/FaaSwap-like dedicated
    /// serving), the strongest dedicated baseline.
    pub fn exclusive_swap() -> Self {
        Self {
            host_cache: true,
            ..Self::exclusive()
        }
    }

    /// `k` fixed fractional slices per GPU with the same LRU rule.
    pub fn static_slices(k: u32) -> Self {
        Self {
            slots_per_gpu: Some(k.max(1)),
            ..Self::exclusive()
        }
    }

    /// Slices + oversubscription + swap to host + remap + deadline-aware
    /// waiting (for a resident copy and for memory).
    pub fn gshare() -> Self {
        Self {
            slots_per_gpu: None,
            host_cache: true,
            all_resident: false,
            remap: true,
            wait_within_deadline: true,
            wait_for_memory: true,
            scale_out_evicts: false,
            squeeze: true,
            spread: true,
        }
    }

    /// Every model everywhere, free; deadline-aware order on the whole
    /// compute. Used by unit tests of the EDF order; the serving simulator's
    /// all-resident estimate is the central-queue `sim::serving::edf_simulate`.
    pub fn oracle() -> Self {
        Self {
            slots_per_gpu: None,
            host_cache: true,
            all_resident: true,
            remap: false,
            wait_within_deadline: false,
            wait_for_memory: false,
            scale_out_evicts: false,
            squeeze: false,
            spread: false,
        }
    }
}
