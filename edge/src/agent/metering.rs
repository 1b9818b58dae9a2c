//! Metering in the agent: the [`UsageMeter`] fed by the [`NodeAgent`], and
//! the group commit that journals usage before results are released.
//!
//! ```text
//!   Run started ─▶ key (tenant, function, tier, GPU model, pool kind)
//!   Done        ─▶ meter.invocation(…) ─▶ reply waits ─┐
//!   stream head ─▶ meter.invocation(start‥head) ─▶ head and chunks wait ─┤
//!   stream end  ─▶ meter.accrue_busy(head‥end) (rides with the next write)
//!   loads / releases of weights ─▶ resident_start / stop│
//!   interval tick, instance released ─▶ memory due      │
//!                                                       ▼
//!   no write in flight? ─▶ drafts = take_busy | take_all(now) ─▶ spawn_blocking(journal.append)
//!                                                       │  (one append + fsync per group)
//!                          Written{Ok}  ─▶ replies released, RegionLink woken
//!                          Written{Err} ─▶ replies become `usage_not_recorded` (fail closed)
//! ```
//!
//! While one write is in flight, completions queue for the next write, so a
//! burst costs one fsync per group, not per invocation; the actor's thread
//! never waits on the disk.
//!
//! [`NodeAgent`]: super::NodeAgent

use crate::journal::UsageJournal;
use gshare_core::metering::UsageMeter;
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
    /// What its key stores (a keyed run that answered), stamped when
    /// journaled; also what the calls that joined it get, when it is a
    /// transparent one.
    pub(super) stored: Option<crate::journal::KeyedOutcome>,
}

/// A streamed reply's start, held until the usage of its run so far (and,
/// when keyed, its start under the key) is journaled.
pub(super) struct HeldStream {
    /// The request.
    pub(super) request: gshare_core::executor::RequestId,
    /// Where its start goes.
    pub(super) tx: oneshot::Sender<super::ReplyStart>,
    /// Its start.
    pub(super) start: super::ReplyStart,
    /// What its key stores until the stream ends: the head, not complete.
    pub(super) stored: Option<crate::journal::KeyedOutcome>,
}

/// The agent's metering state.
pub(super) struct MeterState {
    pub(super) setup: Metering,
    pub(super) meter: UsageMeter,
    /// Replies whose usage is in the meter, waiting for the next write.
    pub(super) waiting: Vec<HeldReply>,
    /// Streamed replies whose usage so far is in the meter, waiting for
    /// the next write before their first byte goes out.
    pub(super) streams: Vec<HeldStream>,
    /// A journal write is in flight.
    pub(super) writing: bool,
    /// Resident memory should be journaled with the next write.
    pub(super) memory_due: bool,
    /// The agent is stopping: residency was journaled up to the final
    /// flush (its function processes are stopped); the interval tick no
    /// longer adds any.
    pub(super) flushed: bool,
    /// Unix µs at the agent's clock zero.
    pub(super) unix_base_us: u64,
}

impl MeterState {
    pub(super) fn new(setup: Metering, unix_base_us: u64) -> Self {
        Self {
            setup,
            meter: UsageMeter::new(),
            waiting: Vec::new(),
            streams: Vec::new(),
            writing: false,
            memory_due: false,
            flushed: false,
            unix_base_us,
        }
    }
}
