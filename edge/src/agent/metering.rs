//! Metering in the agent: the [`UsageMeter`] fed by the [`NodeAgent`], and
//! the group commit that journals usage before results are released.
//!
//! ```text
//!   Run started ─▶ key (tenant, function, tier, GPU model, pool kind)
//!   Done        ─▶ meter.invocation(…) ─▶ reply waits (tagged with the open group) ─┐
//!   stream head ─▶ meter.invocation(start‥head) ─▶ head and chunks wait ────────────┤
//!   stream end  ─▶ meter.accrue_busy(head‥end) (rides with the next write)          │
//!   loads / releases of weights ─▶ resident_start / stop                            │
//!   interval tick, instance released ─▶ memory due                                  │
//!                                                                                   ▼
//!   writer thread: group g = take_busy | take_all(now) ─▶ journal.append (one insert | batch + flush)
//!                          Written{g, Ok}  ─▶ replies released, RegionLink woken
//!                          Written{g, Err} ─▶ replies become `usage_not_recorded` (fail closed)
//! ```
//!
//! While one write is in flight, completions gather in the next group,
//! which the writer takes as soon as that write returns, so a burst costs
//! one flush per group, not per invocation; the actor's thread never waits
//! on the disk (see [`super::group_commit`]).
//!
//! [`NodeAgent`]: super::NodeAgent
//! [`UsageMeter`]: gshare_core::metering::UsageMeter

use super::group_commit::GroupCommit;
use crate::journal::UsageJournal;
use gshare_core::model::PoolKind;
use gshare_core::protocol::InvokeOutcome;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, Notify};

/// What the agent needs to meter: its journal and how to wake the sender.
#[derive(Clone)]
pub struct Metering {
    /// The durable journal (in the config's `data_dir`).
    pub journal: Arc<UsageJournal>,
    /// Notified after every successful append (the region link's sender waits on it).
    pub appended: Arc<Notify>,
    /// How often resident memory is journaled.
    pub interval: Duration,
    /// The node's pool kind (part of every record).
    pub pool_kind: PoolKind,
}

/// The (tenant, idempotency key) of a keyed invocation.
pub(super) type InvocationKey = (gshare_core::model::TenantId, String);

/// A reply held until its usage (and, when keyed, its outcome under the
/// key) is journaled.
pub(super) struct HeldReply {
    /// Where its outcome goes.
    pub(super) tx: oneshot::Sender<InvokeOutcome>,
    /// Its outcome.
    pub(super) outcome: InvokeOutcome,
    /// Its idempotency key.
    pub(super) key: Option<InvocationKey>,
    /// What its key stores (a keyed run that answered; a copy went into
    /// the group with its usage, stamped when journaled); also what the
    /// calls that joined it get, when it is a transparent one.
    pub(super) stored: Option<crate::journal::KeyedOutcome>,
}

/// A streamed reply's start, held until the usage of its run so far (and,
/// when keyed, its start under the key: the head, not complete, which went
/// into the same group as that usage) is journaled.
pub(super) struct HeldStream {
    /// The request.
    pub(super) request: gshare_core::executor::RequestId,
    /// Where its start goes.
    pub(super) tx: oneshot::Sender<super::ReplyStart>,
    /// Its start.
    pub(super) start: super::ReplyStart,
}

/// The agent's metering state.
pub(super) struct MeterState {
    pub(super) setup: Metering,
    /// The meter and the open group, shared with the writer thread.
    pub(super) groups: Arc<GroupCommit>,
    /// Replies whose usage is in the meter, each with the group whose
    /// write releases it.
    pub(super) waiting: Vec<(u64, HeldReply)>,
    /// Streamed replies whose usage so far is in the meter, waiting for
    /// their group's write before their first byte goes out.
    pub(super) streams: Vec<(u64, HeldStream)>,
    /// Runs that ended while their stream's start was still in `streams`
    /// (a short stream: the function was done before the write that sends
    /// its first byte returned), with when they ended: answered once that
    /// write has, since a failed one makes the outcome `usage_not_recorded`.
    pub(super) ended: Vec<(gshare_core::model::Micros, super::messages::RequestDone)>,
    /// The agent is stopping: residency was journaled up to the final
    /// flush (its function processes are stopped); the interval tick no
    /// longer adds any.
    pub(super) flushed: bool,
    /// Unix µs at the agent's clock zero.
    pub(super) unix_base_us: u64,
}

impl MeterState {
    pub(super) fn new(setup: Metering, groups: GroupCommit, unix_base_us: u64) -> Self {
        Self {
            setup,
            groups: Arc::new(groups),
            waiting: Vec::new(),
            streams: Vec::new(),
            ended: Vec::new(),
            flushed: false,
            unix_base_us,
        }
    }
}

impl Drop for MeterState {
    /// The writer thread ends with the agent.
    fn drop(&mut self) {
        self.groups.close();
    }
}
