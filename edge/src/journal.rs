//! The agent's usage journal: metered usage, durable before it is sent.
//!
//! Every usage record the agent meters is appended here and is durable when
//! the append returns: written through the journal's write-ahead log
//! ([`crate::wal`]: one `O_DIRECT` write per append), then put into sled
//! unflushed; or, without the log (`[metering] journal_sync = "sled"`, a
//! file system without `O_DIRECT`, an append too large for the log), put
//! into sled and flushed (its log written and synced). Each record gets the
//! agent's next sequence number; `(agent, seq)` is what the region's state
//! machine dedupes on (`gshare_core::state`, "Usage: exactly once"), so a
//! batch sent twice, or re-sent after a crash, is applied once.
//!
//! ```text
//!   meter ─▶ append(records) ─▶ seq = next_seq.. ─▶ log entry (O_DIRECT) ─▶ durable ─▶ sled (unflushed) ─▶ Ok(seqs)
//!                                                                                                     │
//!   RegionLink ◀─ batch_after(sent, max) ◀─ records in seq order ◀─────────────────────────────────────┘
//!        │ UsageBatch { agent, records }  ──▶ region applies once per (agent, seq)
//!        └ acknowledged ─▶ ack(&batch) ─▶ records removed, flushed
//!   open ─▶ log entries sled lacks (after m:wal_applied) applied ─▶ checkpoint (sled flushed, new epoch)
//! ```
//!
//! Layout: one sled tree `usage`. Keys `r` ‖ seq (u64 big-endian) hold a
//! record (bincode 2, serde); `m:agent` holds the agent id the journal
//! belongs to, `m:format` its layout (2); `t` ‖ tenant holds the
//! [`TenantTotals`] of the tenant's records removed so far (acknowledged, or
//! found applied on reconcile), and `m:next_seq` (u64 big-endian) a number
//! above every one handed out when records were last removed.
//!
//! What an append writes is only its records (and keyed outcomes), and,
//! through the log, `m:wal_epoch` / `m:wal_applied` (the log's epoch and
//! where its entries applied to the tree end; see [`crate::wal`]). Without
//! the log a group of one record is a single sled insert (one log write), a
//! larger group or one with keyed outcomes one atomic batch. Removals (ack, reconcile) take
//! records out, add them to `t` ‖ tenant and write `m:next_seq` in one
//! atomic batch, so a record is counted in the stored totals exactly when it
//! is no longer held. On open the journal sums the held records: the
//! totals ("the agent's own count", every record ever appended) are stored
//! plus held, exactly the records that made it to disk, and the next number
//! is the larger of `m:next_seq` and the last held record's + 1, never below
//! one already handed out, even when every record was acknowledged and
//! removed. (A journal of the first layout, whose appends also wrote the
//! totals and `m:next_seq`, is converted on open in one batch.)
//!
//! Invocation idempotency keys: `k` ‖ tenant ‖ 0 ‖ key holds the
//! [`KeyedOutcome`] of an invocation completed under that key, written in
//! the same atomic batch as the usage record that bills it (so a key is on
//! disk exactly when its invocation is billed), and `x` ‖ at (u64 ms,
//! big-endian) ‖ tenant ‖ 0 ‖ key indexes it by age. Appends remove keys
//! older than the key window (agent config `invoke_key_window_s`).
//!
//! Guarantees: a record whose `append` returned is on disk (on the device;
//! with `journal_sync = "dsync"` past its volatile cache too); records come
//! back from [`UsageJournal::batch_after`] in sequence order until they are
//! acknowledged, across drops, restarts and `kill -9`, and only once they
//! are on disk (an append still flushing is not sent: were it applied by
//! the region and then lost in a crash, its number would be handed out
//! again and the region would drop the new record as a duplicate). An `append` that did
//! not return may or may not be on disk (the region then bills it or not,
//! but never twice).

use crate::wal::{Wal, WalError, WalOp, WalSync};
use gshare_core::metering::JournalSeqs;
use gshare_core::model::TenantId;
use gshare_core::state::{AgentId, DomainCommand, UsageRecord, MAX_USAGE_BATCH};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const TREE: &str = "usage";
const KEY_NEXT_SEQ: &[u8] = b"m:next_seq";
const KEY_AGENT: &[u8] = b"m:agent";
const KEY_FORMAT: &[u8] = b"m:format";
/// The write-ahead log's epoch ([`crate::wal`]): its entries of this epoch
/// are the journal's; a checkpoint raises it.
const KEY_WAL_EPOCH: &[u8] = b"m:wal_epoch";
/// Where the log's entries applied to the tree end (in `m:wal_epoch`),
/// written in the same batch as each entry's changes.
const KEY_WAL_APPLIED: &[u8] = b"m:wal_applied";
/// The layout `m:format` names: `t` ‖ tenant holds the totals of the
/// records removed (acknowledged) so far; those of the records still held
/// are summed from them on open. (A journal without the key is the first
/// layout, whose totals counted the held records too; open converts it.)
const FORMAT: u8 = 2;
const RECORD_PREFIX: u8 = b'r';
const TOTALS_PREFIX: u8 = b't';
const KEY_PREFIX: u8 = b'k';
const KEY_AGE_PREFIX: u8 = b'x';
/// How long an invocation's outcome is kept under its key by default (10 min).
pub const DEFAULT_KEY_WINDOW_MS: u64 = 10 * 60 * 1000;
/// Largest stored keyed outcome accepted when decoding: the body kept and
/// a function's head (at most the HTTP client's 64 KiB), with room.
const KEYED_LIMIT: usize = 4 * gshare_core::protocol::MAX_REPLAY_BODY;
/// Largest encoded record accepted when decoding (a record is ~100 bytes).
const RECORD_LIMIT: usize = 64 * 1024;

/// How long the journal's durable writes took (the log's `O_DIRECT`
/// write, or sled's flush without the log): what one metered reply waits
/// for at least. Buckets of 5 µs up to 1 ms, then of 1 ms up to 100 ms,
/// then one for the rest.
#[derive(Debug)]
pub struct WriteTimes {
    buckets: Vec<AtomicU64>,
}

/// A copy of [`WriteTimes`] at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteHistogram {
    counts: Vec<u64>,
}

const FINE_US: u64 = 5;
const FINE_BUCKETS: u64 = 200;
const COARSE_US: u64 = 1_000;
const COARSE_BUCKETS: u64 = 99;

impl WriteTimes {
    fn new() -> Self {
        let n = (FINE_BUCKETS + COARSE_BUCKETS + 1) as usize;
        Self {
            buckets: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn record(&self, took: std::time::Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let fine_end = FINE_US * FINE_BUCKETS;
        let i = if us < fine_end {
            us / FINE_US
        } else {
            (FINE_BUCKETS + (us - fine_end) / COARSE_US).min(FINE_BUCKETS + COARSE_BUCKETS)
        };
        self.buckets[i as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> WriteHistogram {
        WriteHistogram {
            counts: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
        }
    }
}

impl WriteHistogram {
    /// The writes since `earlier` (a snapshot of the same journal).
    pub fn since(&self, earlier: &WriteHistogram) -> WriteHistogram {
        WriteHistogram {
            counts: self
                .counts
                .iter()
                .zip(&earlier.counts)
                .map(|(now, then)| now.saturating_sub(*then))
                .collect(),
        }
    }

    /// Number of writes.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The upper edge of the bucket holding quantile `q` (0–1) of the
    /// writes, in µs (`None` without writes; `u64::MAX` past 100 ms).
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let i = i as u64;
                return Some(if i < FINE_BUCKETS {
                    (i + 1) * FINE_US
                } else if i < FINE_BUCKETS + COARSE_BUCKETS {
                    FINE_US * FINE_BUCKETS + (i - FINE_BUCKETS + 1) * COARSE_US
                } else {
                    u64::MAX
                });
            }
        }
        None
    }
}

/// Errors of the journal.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The underlying sled database failed.
    #[error("journal storage: {0}")]
    Storage(#[from] sled::Error),
    /// A record could not be encoded.
    #[error("journal: cannot encode record: {0}")]
    Encode(String),
    /// A stored entry could not be decoded.
    #[error("journal: corrupt entry {key}: {reason}")]
    Corrupt {
        /// The entry's key, printed.
        key: String,
        /// What was wrong.
        reason: String,
    },
    /// The journal on disk belongs to another agent.
    #[error("journal belongs to agent {stored:?}, not {given:?}")]
    AgentMismatch {
        /// The agent id stored in the journal.
        stored: String,
        /// The agent id it was opened with.
        given: String,
    },
    /// The sequence numbers ran out (u64).
    #[error("journal: sequence numbers exhausted")]
    SequenceExhausted,
    /// A tenant's totals would overflow u64.
    #[error("journal: tenant totals overflow")]
    TotalsOverflow,
    /// The write-ahead log failed.
    #[error(transparent)]
    Wal(#[from] WalError),
    /// An entry reached the log but not the tree: nothing more is appended
    /// until the agent restarts (and the entry is replayed from the log).
    #[error("journal: an appended entry is in the log but not applied ({0}); restart the agent to replay it")]
    Unapplied(String),
    /// The records are in the journal's tree with their numbers, but its
    /// flush failed: they may still reach the disk and the region.
    #[error("journal: flush failed, the records may still be kept: {0}")]
    Unflushed(sled::Error),
}

impl JournalError {
    /// Whether a failed append may have kept its records (they may still
    /// reach the region): then nothing of it may be journaled again. True
    /// of `Unflushed`, and of `Unapplied` (a log write failed and so did
    /// the checkpoint after it: the next open may replay the entry; the
    /// agent stops anyway); every other failed append kept nothing.
    pub fn may_have_kept(&self) -> bool {
        matches!(
            self,
            JournalError::Unflushed(_) | JournalError::Unapplied(_)
        )
    }
}

/// A group of journaled records to send as one `UsageBatch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalBatch {
    /// The agent the records belong to.
    pub agent: AgentId,
    /// The records, in sequence order (at most [`MAX_USAGE_BATCH`]).
    pub records: Vec<UsageRecord>,
}

impl JournalBatch {
    /// The first sequence number in the batch.
    pub fn first_seq(&self) -> u64 {
        self.records.first().map_or(0, |r| r.seq)
    }

    /// The last sequence number in the batch.
    pub fn last_seq(&self) -> u64 {
        self.records.last().map_or(0, |r| r.seq)
    }

    /// The region command that carries this batch.
    pub fn command(&self) -> DomainCommand {
        DomainCommand::UsageBatch {
            agent: self.agent.clone(),
            records: self.records.clone(),
        }
    }
}

/// One tenant's usage as journaled by this agent, summed exactly over every
/// record ever appended (durable; survives acknowledgement and restarts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TenantTotals {
    /// Invocations completed.
    pub invocations: u64,
    /// Busy compute, milli-GPU × ms.
    pub compute_milli_gpu_ms: u64,
    /// Resident GPU memory, MiB × ms.
    pub memory_mib_ms: u64,
    /// Usage records journaled.
    pub records: u64,
}

impl TenantTotals {
    fn plus(&self, o: &TenantTotals) -> Option<TenantTotals> {
        Some(TenantTotals {
            invocations: self.invocations.checked_add(o.invocations)?,
            compute_milli_gpu_ms: self
                .compute_milli_gpu_ms
                .checked_add(o.compute_milli_gpu_ms)?,
            memory_mib_ms: self.memory_mib_ms.checked_add(o.memory_mib_ms)?,
            records: self.records.checked_add(o.records)?,
        })
    }

    fn minus(&self, o: &TenantTotals) -> Option<TenantTotals> {
        Some(TenantTotals {
            invocations: self.invocations.checked_sub(o.invocations)?,
            compute_milli_gpu_ms: self
                .compute_milli_gpu_ms
                .checked_sub(o.compute_milli_gpu_ms)?,
            memory_mib_ms: self.memory_mib_ms.checked_sub(o.memory_mib_ms)?,
            records: self.records.checked_sub(o.records)?,
        })
    }

    fn add(&mut self, r: &UsageRecord) -> Result<(), JournalError> {
        let sum = |a: u64, b: u64| a.checked_add(b).ok_or(JournalError::TotalsOverflow);
        self.invocations = sum(self.invocations, r.invocations)?;
        self.compute_milli_gpu_ms = sum(self.compute_milli_gpu_ms, r.compute_milli_gpu_ms)?;
        self.memory_mib_ms = sum(self.memory_mib_ms, r.memory_mib_ms)?;
        self.records = sum(self.records, 1)?;
        Ok(())
    }
}

/// The stored answer of an invocation completed under an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyedOutcome {
    /// The tenant.
    pub tenant: TenantId,
    /// The key.
    pub key: String,
    /// When it completed (Unix ms).
    pub at_ms: u64,
    /// The first [`gshare_core::protocol::MAX_REPLAY_BODY`] bytes of the body.
    pub body: Vec<u8>,
    /// The original body's length (as far as it was sent, when it streamed).
    pub body_len: u64,
    /// A transparent invocation's status and headers (`None`: a plain one,
    /// replayed as `200`).
    pub head: Option<gshare_core::protocol::ReplyHead>,
    /// The body ended: `false` for a streamed reply stored when it started
    /// (its first byte waits for this record) and not stored again since,
    /// or one cut before its end; replayed as truncated.
    pub complete: bool,
    /// The function it called (`None` in a record stored before keys named
    /// their function: then the key is not checked against it).
    pub function: Option<String>,
}

/// [`KeyedOutcome`] as the journal stored it before keyed outcomes named
/// their function (read with `function: None`).
#[derive(Deserialize)]
struct KeyedOutcomeV2 {
    tenant: TenantId,
    key: String,
    at_ms: u64,
    body: Vec<u8>,
    body_len: u64,
    head: Option<gshare_core::protocol::ReplyHead>,
    complete: bool,
}

/// [`KeyedOutcome`] as the journal stored it before transparent
/// invocations kept their status and headers (read as a plain, complete one).
#[derive(Deserialize)]
struct KeyedOutcomeV1 {
    tenant: TenantId,
    key: String,
    at_ms: u64,
    body: Vec<u8>,
    body_len: u64,
}

impl KeyedOutcome {
    /// The record of a completed invocation's `body` (kept up to the replay size).
    pub fn new(tenant: TenantId, key: String, at_ms: u64, body: &[u8]) -> Self {
        Self::kept(tenant, key, at_ms, None, body, body.len() as u64, true)
    }

    /// A transparent invocation's answer: its `head`, and `body` (the
    /// first bytes of a streamed one) of `body_len` bytes in all.
    pub fn http(
        tenant: TenantId,
        key: String,
        at_ms: u64,
        head: gshare_core::protocol::ReplyHead,
        body: &[u8],
        body_len: u64,
        complete: bool,
    ) -> Self {
        Self::kept(tenant, key, at_ms, Some(head), body, body_len, complete)
    }

    /// The record, its body kept up to the replay size.
    fn kept(
        tenant: TenantId,
        key: String,
        at_ms: u64,
        head: Option<gshare_core::protocol::ReplyHead>,
        body: &[u8],
        body_len: u64,
        complete: bool,
    ) -> Self {
        let keep = body.len().min(gshare_core::protocol::MAX_REPLAY_BODY);
        Self {
            tenant,
            key,
            at_ms,
            body: body[..keep].to_vec(),
            body_len: body_len.max(keep as u64),
            head,
            complete,
            function: None,
        }
    }

    /// The record, naming the function its invocation called (a repeat of
    /// the key for another function is refused, not replayed).
    pub fn of_function(mut self, function: &str) -> Self {
        self.function = Some(function.to_string());
        self
    }

    /// Whether the stored body is shorter than the original, or the body
    /// never ended.
    pub fn truncated(&self) -> bool {
        self.body_len > self.body.len() as u64 || !self.complete
    }

    /// The outcome a replay of the key answers.
    pub fn replay(&self) -> gshare_core::protocol::InvokeOutcome {
        use gshare_core::protocol::InvokeOutcome;
        let truncated = self.truncated();
        let body = if truncated {
            Vec::new()
        } else {
            self.body.clone()
        };
        match &self.head {
            None => InvokeOutcome::Replayed {
                body,
                body_len: self.body_len,
                truncated,
            },
            Some(head) => InvokeOutcome::ReplayedHttp {
                head: head.clone(),
                body,
                body_len: self.body_len,
                truncated,
            },
        }
    }

    /// Decodes a stored outcome, of this layout or one before it.
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        let cfg = bincode::config::standard().with_limit::<KEYED_LIMIT>();
        let e = match bincode::serde::decode_from_slice::<Self, _>(bytes, cfg) {
            Ok((o, n)) if n == bytes.len() => return Ok(o),
            Ok(_) => "trailing bytes".to_string(),
            Err(e) => e.to_string(),
        };
        if let Ok((o, n)) = bincode::serde::decode_from_slice::<KeyedOutcomeV2, _>(bytes, cfg) {
            if n == bytes.len() {
                return Ok(Self {
                    tenant: o.tenant,
                    key: o.key,
                    at_ms: o.at_ms,
                    body: o.body,
                    body_len: o.body_len,
                    head: o.head,
                    complete: o.complete,
                    function: None,
                });
            }
        }
        match bincode::serde::decode_from_slice::<KeyedOutcomeV1, _>(bytes, cfg) {
            Ok((o, n)) if n == bytes.len() => Ok(Self {
                tenant: o.tenant,
                key: o.key,
                at_ms: o.at_ms,
                body: o.body,
                body_len: o.body_len,
                head: None,
                complete: true,
                function: None,
            }),
            _ => Err(e),
        }
    }
}

fn keyed_key(tenant: &TenantId, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + tenant.0.len() + key.len());
    k.push(KEY_PREFIX);
    k.extend_from_slice(tenant.0.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

fn age_key(at_ms: u64, tenant: &TenantId, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(10 + tenant.0.len() + key.len());
    k.push(KEY_AGE_PREFIX);
    k.extend_from_slice(&at_ms.to_be_bytes());
    k.extend_from_slice(tenant.0.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

/// Where the journal stands (for `GET /v1/agent/journal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalStatus {
    /// The number the next record will get.
    pub next_seq: u64,
    /// Records journaled and not yet acknowledged by the region.
    pub pending_records: u64,
    /// Highest sequence number the region acknowledged since this process
    /// started (0: none yet).
    pub acked_through: u64,
    /// The region's next expected number at the last registration (0: not
    /// registered since this process started).
    pub region_next_seq: u64,
}

/// What [`UsageJournal::reconcile`] did with the region's view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconciled {
    /// Records below the region's next expected number, removed (already applied).
    pub removed: usize,
    /// Whether the journal's next number was raised to the region's.
    pub advanced: bool,
}

/// What appends change, under one lock.
#[derive(Debug)]
struct Appending {
    /// The numbering: the next number, the end of the durable ones
    /// ([`JournalSeqs`], shared with the deterministic simulation).
    seqs: JournalSeqs,
    /// Every tenant's totals: the stored (acknowledged) part plus every
    /// record still held. Only appends change them.
    totals: BTreeMap<TenantId, TenantTotals>,
}

/// The durable usage journal of one agent.
pub struct UsageJournal {
    db: sled::Db,
    tree: sled::Tree,
    /// The journal's directory (sled's files and the log).
    dir: std::path::PathBuf,
    agent: AgentId,
    /// The next sequence number and the totals (guarded: appends are serialized).
    state: Mutex<Appending>,
    /// Serializes the removals of records (ack, reconcile) that fold them
    /// into the stored totals, so a record is folded once.
    folding: Mutex<()>,
    acked_through: AtomicU64,
    region_next_seq: AtomicU64,
    key_window_ms: AtomicU64,
    /// The write-ahead log appends go through (`None` where the file
    /// system takes no `O_DIRECT`: each append flushes sled then).
    wal: Option<Mutex<Logged>>,
    /// Entries of the log applied at open (appends that had returned but
    /// were not yet in sled's files: a crash, or a kill -9).
    replayed: usize,
    /// How long the durable writes of appends took.
    write_times: WriteTimes,
}

/// The write-ahead log and what its last writes left.
#[derive(Debug)]
struct Logged {
    wal: Wal,
    /// A write failed: part of an entry may be in the file, so the next
    /// entry goes into a new epoch (checkpoint first).
    torn: bool,
    /// An entry is in the log but its changes could not be applied to the
    /// tree: appends are refused until a restart replays it.
    unapplied: Option<String>,
}

/// An append's changes, computed under the state lock.
struct Prepared {
    seqs: Range<u64>,
    ops: Vec<WalOp>,
    /// The totals of the tenants it bills, after it.
    totals: Vec<(TenantId, TenantTotals)>,
}

impl std::fmt::Debug for UsageJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageJournal")
            .field("agent", &self.agent)
            .field("next_seq", &self.next_seq())
            .finish()
    }
}

/// Syncs (`fsync`) every file of the journal's directory `dir` but the
/// write-ahead log, its subdirectories' files, and the directories.
fn sync_files(dir: &Path) -> Result<(), WalError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WalError::Io { path, source }
    };
    // sled removes files of its own (blobs, old snapshots) while this runs:
    // one gone since it was listed has nothing to sync.
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        let kind = match entry.file_type() {
            Ok(kind) => kind,
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(io(&path)(e)),
        };
        if kind.is_dir() {
            sync_files(&path)?;
        } else if kind.is_file()
            && !entry
                .file_name()
                .to_string_lossy()
                .starts_with(crate::wal::FILE_NAME)
        {
            match std::fs::File::open(&path).and_then(|f| f.sync_all()) {
                Err(e) if !gone(&e) => return Err(io(&path)(e)),
                _ => {}
            }
        }
    }
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

fn record_key(seq: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = RECORD_PREFIX;
    k[1..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn decode_u64(key: &[u8], bytes: &[u8]) -> Result<u64, JournalError> {
    let arr: [u8; 8] = bytes.try_into().map_err(|_| JournalError::Corrupt {
        key: String::from_utf8_lossy(key).into_owned(),
        reason: format!("expected 8 bytes, found {}", bytes.len()),
    })?;
    Ok(u64::from_be_bytes(arr))
}

fn encode_record(r: &UsageRecord) -> Result<Vec<u8>, JournalError> {
    bincode::serde::encode_to_vec(r, bincode::config::standard())
        .map_err(|e| JournalError::Encode(e.to_string()))
}

fn totals_key(tenant: &TenantId) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + tenant.0.len());
    k.push(TOTALS_PREFIX);
    k.extend_from_slice(tenant.0.as_bytes());
    k
}

fn encode_totals(t: &TenantTotals) -> Result<Vec<u8>, JournalError> {
    bincode::serde::encode_to_vec(t, bincode::config::standard())
        .map_err(|e| JournalError::Encode(e.to_string()))
}

fn decode_totals(bytes: &[u8]) -> Result<TenantTotals, JournalError> {
    let cfg = bincode::config::standard().with_limit::<RECORD_LIMIT>();
    bincode::serde::decode_from_slice(bytes, cfg)
        .map(|(t, _)| t)
        .map_err(|e| JournalError::Corrupt {
            key: "tenant totals".into(),
            reason: e.to_string(),
        })
}

fn decode_record(key: &[u8], bytes: &[u8]) -> Result<UsageRecord, JournalError> {
    let corrupt = |reason: String| JournalError::Corrupt {
        key: format!("record {key:?}"),
        reason,
    };
    let cfg = bincode::config::standard().with_limit::<RECORD_LIMIT>();
    let (r, used): (UsageRecord, usize) =
        bincode::serde::decode_from_slice(bytes, cfg).map_err(|e| corrupt(e.to_string()))?;
    if used != bytes.len() {
        return Err(corrupt(format!("{} trailing bytes", bytes.len() - used)));
    }
    Ok(r)
}

/// How long `open` waits for a previous handle of the same journal, in this
/// process, to let go of sled's file lock.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Opens the sled database, waiting (bounded by [`LOCK_WAIT`]) while its file
/// lock is still held. sled 0.34 releases the lock from a background flusher
/// after the last handle is dropped, so a journal reopened in the same
/// process can find it briefly taken; another live process holding it is
/// still refused once the wait is over.
fn open_db(path: &Path) -> Result<sled::Db, sled::Error> {
    let start = std::time::Instant::now();
    loop {
        // No periodic flush of its own: the journal flushes sled where its
        // guarantees need it (a checkpoint of the log, removals, an append
        // without the log), so the files hold exactly what was flushed.
        match sled::Config::new().path(path).flush_every_ms(None).open() {
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && start.elapsed() < LOCK_WAIT =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

impl UsageJournal {
    /// Opens (or creates) the journal in directory `path` for `agent`.
    ///
    /// The next sequence number is recovered from disk (1 for a new journal).
    /// A journal created for another agent id is refused.
    pub fn open(path: &Path, agent: AgentId) -> Result<Self, JournalError> {
        Self::open_with(path, agent, WalSync::default())
    }

    /// [`UsageJournal::open`], its write-ahead log written with `sync`.
    pub fn open_with(path: &Path, agent: AgentId, sync: WalSync) -> Result<Self, JournalError> {
        let db = open_db(path)?;
        let tree = db.open_tree(TREE)?;
        let mut setup = sled::Batch::default();
        let mut changed = false;
        match tree.get(KEY_AGENT)? {
            Some(stored) if stored.as_ref() != agent.0.as_bytes() => {
                return Err(JournalError::AgentMismatch {
                    stored: String::from_utf8_lossy(&stored).into_owned(),
                    given: agent.0.clone(),
                });
            }
            Some(_) => {}
            None => {
                setup.insert(KEY_AGENT, agent.0.as_bytes());
                changed = true;
            }
        }
        // What the log holds beyond the tree goes in before anything is
        // counted from the tree.
        let (wal, replayed) = Self::replay(&db, &tree, path, sync)?;
        let stored_next = match tree.get(KEY_NEXT_SEQ)? {
            Some(b) => decode_u64(KEY_NEXT_SEQ, &b)?,
            None => 1,
        };
        // The records still held: their totals, and the number after the
        // last (appends do not write `m:next_seq`; removals do).
        let mut held: BTreeMap<TenantId, TenantTotals> = BTreeMap::new();
        let mut after_last = 1;
        for kv in tree.scan_prefix([RECORD_PREFIX]) {
            let (k, v) = kv?;
            let r = decode_record(&k, &v)?;
            held.entry(r.tenant.clone()).or_default().add(&r)?;
            after_last = decode_u64(&k, &k[1..])?.saturating_add(1);
        }
        let mut stored = BTreeMap::new();
        for kv in tree.scan_prefix([TOTALS_PREFIX]) {
            let (k, v) = kv?;
            let name = String::from_utf8_lossy(&k[1..]).into_owned();
            stored.insert(TenantId(name), decode_totals(&v)?);
        }
        match tree.get(KEY_FORMAT)? {
            Some(f) if f.as_ref() == [FORMAT] => {}
            Some(f) => {
                return Err(JournalError::Corrupt {
                    key: "m:format".into(),
                    reason: format!("unknown journal layout {f:?}"),
                })
            }
            None => {
                // The first layout's totals included the held records:
                // keep the removed records' part (one atomic batch).
                for (tenant, h) in &held {
                    let s: TenantTotals = stored.get(tenant).copied().unwrap_or_default();
                    let acked = s.minus(h).ok_or_else(|| JournalError::Corrupt {
                        key: format!("tenant totals {tenant:?}"),
                        reason: "below the records still held".into(),
                    })?;
                    setup.insert(totals_key(tenant), encode_totals(&acked)?);
                    stored.insert(tenant.clone(), acked);
                }
                setup.insert(KEY_FORMAT, &[FORMAT][..]);
                changed = true;
            }
        }
        if changed {
            tree.apply_batch(setup)?;
            tree.flush()?;
        }
        for (tenant, h) in held {
            let t = stored.entry(tenant).or_default();
            *t = t.plus(&h).ok_or(JournalError::TotalsOverflow)?;
        }
        Ok(Self {
            db,
            tree,
            dir: path.to_path_buf(),
            agent,
            state: Mutex::new(Appending {
                // What was found on disk is durable.
                seqs: JournalSeqs::opened(stored_next, after_last),
                totals: stored,
            }),
            folding: Mutex::new(()),
            acked_through: AtomicU64::new(0),
            region_next_seq: AtomicU64::new(0),
            key_window_ms: AtomicU64::new(DEFAULT_KEY_WINDOW_MS),
            wal,
            replayed,
            write_times: WriteTimes::new(),
        })
    }

    /// Applies the write-ahead log's entries in `path` that are not in the
    /// tree yet (those after `m:wal_applied` in `m:wal_epoch`), checkpoints
    /// (sled synced, a new epoch), and opens the log for appends at offset 0
    /// of that epoch. `None` with `journal_sync = "sled"` (a log left
    /// behind is removed once applied) or where the file system takes no
    /// `O_DIRECT` (appends flush sled). With the number of entries applied.
    fn replay(
        db: &sled::Db,
        tree: &sled::Tree,
        path: &Path,
        sync: WalSync,
    ) -> Result<(Option<Mutex<Logged>>, usize), JournalError> {
        let read = |key: &[u8]| -> Result<u64, JournalError> {
            match tree.get(key)? {
                Some(b) => decode_u64(key, &b),
                None => Ok(0),
            }
        };
        let (epoch, applied) = (read(KEY_WAL_EPOCH)?, read(KEY_WAL_APPLIED)?);
        let found = Wal::read(path, epoch, applied)?;
        let replayed = found.len();
        for (end, ops) in found {
            Self::apply_ops(tree, ops, Some(end))?;
        }
        let epoch = Self::checkpoint(db, tree, path, epoch)?;
        // The journal's own directory entry (a new journal's).
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::File::open(parent)
                .and_then(|d| d.sync_all())
                .map_err(|source| WalError::Io {
                    path: parent.to_path_buf(),
                    source,
                })?;
        }
        if replayed > 0 {
            tracing::info!(entries = replayed, "usage journal: replayed from its log");
        }
        let file = path.join(crate::wal::FILE_NAME);
        let without = |why: &str| -> Result<(Option<Mutex<Logged>>, usize), JournalError> {
            if why.is_empty() {
                tracing::info!("usage journal: no write-ahead log (journal_sync = \"sled\")");
            } else {
                tracing::warn!("usage journal: {why}; every append flushes sled instead");
            }
            match std::fs::remove_file(&file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(WalError::Io {
                    path: file.clone(),
                    source: e,
                }
                .into()),
                _ => Ok((None, replayed)),
            }
        };
        if sync == WalSync::Sled {
            return without("");
        }
        match Wal::open(path, epoch, sync) {
            Ok(wal) => Ok((
                Some(Mutex::new(Logged {
                    wal,
                    torn: false,
                    unapplied: None,
                })),
                replayed,
            )),
            Err(WalError::Io { path, source })
                if source.kind() == std::io::ErrorKind::InvalidInput =>
            {
                without(&format!(
                    "{} does not take O_DIRECT ({source})",
                    path.display()
                ))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Makes every change applied to the tree durable, then stores the log's
    /// next epoch (from `epoch`) with nothing applied, durably; returns it.
    /// sled's flush is `sync_file_range`, which commits no metadata (sled's
    /// files grow as it writes): each of its files and directories is
    /// synced after it, so the log's entries are durable elsewhere before
    /// the log is written over.
    fn checkpoint(
        db: &sled::Db,
        tree: &sled::Tree,
        dir: &Path,
        epoch: u64,
    ) -> Result<u64, JournalError> {
        db.flush()?;
        sync_files(dir)?;
        let next = epoch
            .checked_add(1)
            .ok_or(JournalError::SequenceExhausted)?;
        let mut b = sled::Batch::default();
        b.insert(KEY_WAL_EPOCH, &next.to_be_bytes()[..]);
        b.insert(KEY_WAL_APPLIED, &0u64.to_be_bytes()[..]);
        tree.apply_batch(b)?;
        db.flush()?;
        sync_files(dir)?;
        Ok(next)
    }

    /// [`UsageJournal::checkpoint`], then the log starts over in the new
    /// epoch. A checkpoint that fails leaves the journal refusing appends
    /// (`Unapplied`): the tree may already name the new epoch while the log
    /// writes the old one, and a retried `fsync` can report success for
    /// pages whose write was lost; a restart replays the log (its entries
    /// are all still there) and checkpoints afresh.
    fn restart_log(&self, logged: &mut Logged) -> Result<(), JournalError> {
        logged.torn = true;
        match Self::checkpoint(&self.db, &self.tree, &self.dir, logged.wal.epoch()) {
            Ok(next) => {
                logged.wal.restart(next);
                logged.torn = false;
                Ok(())
            }
            Err(e) => {
                let why = format!("a checkpoint of the log failed: {e}");
                tracing::error!("usage journal: {why}");
                logged.unapplied = Some(why.clone());
                Err(JournalError::Unapplied(why))
            }
        }
    }

    /// Applies `ops` to the tree in one atomic batch, with the log offset
    /// they end at (`applied`) when they came through the log. A single
    /// insert outside the log is a plain insert (one sled log write where a
    /// batch costs two).
    fn apply_ops(
        tree: &sled::Tree,
        ops: Vec<WalOp>,
        applied: Option<u64>,
    ) -> Result<(), sled::Error> {
        if let ([WalOp::Insert(..)], None) = (&ops[..], applied) {
            if let Some(WalOp::Insert(k, v)) = ops.into_iter().next() {
                tree.insert(k, v)?;
            }
            return Ok(());
        }
        let mut b = sled::Batch::default();
        for op in ops {
            match op {
                WalOp::Insert(k, v) => b.insert(k, v),
                WalOp::Remove(k) => b.remove(k),
            }
        }
        if let Some(end) = applied {
            b.insert(KEY_WAL_APPLIED, &end.to_be_bytes()[..]);
        }
        tree.apply_batch(b)
    }

    /// Applies the ops of an entry just written to the log, one by one, then
    /// `m:wal_applied` = `end`. Not a sled batch (a batch rolls sled's IO
    /// buffer, which costs as much as the log write): the log made the entry
    /// atomic, and re-applying it is harmless. sled recovers a prefix of its
    /// writes, so if `m:wal_applied` reached `end` so did every op before
    /// it; if not, the open applies the entry again. Its ops are inserts and
    /// removals of keys nothing else writes until the append returned
    /// (records, keyed outcomes, their age index), so the second
    /// application leaves what the first did.
    fn apply_logged(tree: &sled::Tree, ops: Vec<WalOp>, end: u64) -> Result<(), sled::Error> {
        for op in ops {
            match op {
                WalOp::Insert(k, v) => tree.insert(k, v)?,
                WalOp::Remove(k) => tree.remove(k)?,
            };
        }
        tree.insert(KEY_WAL_APPLIED, &end.to_be_bytes()[..])?;
        Ok(())
    }

    /// The agent this journal belongs to.
    pub fn agent(&self) -> &AgentId {
        &self.agent
    }

    /// How many of the log's entries were applied at open (0 after a
    /// clean stop).
    pub fn replayed(&self) -> usize {
        self.replayed
    }

    /// Whether appends go through the write-ahead log (else each flushes sled).
    pub fn logged(&self) -> bool {
        self.wal.is_some()
    }

    /// Tests: the next log write waits until the returned sender sends
    /// (or is dropped), then writes its entry and fails (`None`: no log).
    #[cfg(test)]
    pub(crate) fn stall_then_fail_next_write(&self) -> Option<std::sync::mpsc::Sender<()>> {
        let mut logged = self.wal.as_ref()?.lock().unwrap_or_else(|p| p.into_inner());
        let (tx, rx) = std::sync::mpsc::channel();
        logged.wal.stall_next_write = Some(rx);
        logged.wal.fail_next_write = true;
        Some(tx)
    }

    /// Tests: the journal takes no more appends, as after an entry that
    /// is in its log but could not be applied to its tree (`None`: no log).
    #[cfg(test)]
    pub(crate) fn refuse_appends(&self, why: &str) -> Option<()> {
        let mut logged = self.wal.as_ref()?.lock().unwrap_or_else(|p| p.into_inner());
        logged.unapplied = Some(why.to_string());
        Some(())
    }

    /// The sequence number the next appended record will get.
    pub fn next_seq(&self) -> u64 {
        self.state().seqs.next()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Appending> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends records durably: each gets the next sequence number (its
    /// `seq` field is overwritten), all are written in one atomic batch with
    /// the new next number, and the journal is flushed to disk before this
    /// returns. Returns the numbers assigned.
    pub fn append(&self, records: Vec<UsageRecord>) -> Result<Range<u64>, JournalError> {
        self.append_keyed(records, Vec::new(), 0)
    }

    /// How long invocation outcomes are kept under their keys.
    pub fn set_key_window(&self, window: std::time::Duration) {
        self.key_window_ms
            .store(window.as_millis() as u64, Ordering::Relaxed);
    }

    /// The stored outcome of `tenant`'s invocation under `key`, if it
    /// completed within the key window before `now_ms`.
    pub fn keyed(
        &self,
        tenant: &TenantId,
        key: &str,
        now_ms: u64,
    ) -> Result<Option<KeyedOutcome>, JournalError> {
        let Some(bytes) = self.tree.get(keyed_key(tenant, key))? else {
            return Ok(None);
        };
        let o = KeyedOutcome::decode(&bytes).map_err(|reason| JournalError::Corrupt {
            key: format!("invocation key {key:?}"),
            reason,
        })?;
        let window = self.key_window_ms.load(Ordering::Relaxed);
        Ok((o.at_ms.saturating_add(window) >= now_ms).then_some(o))
    }

    /// [`UsageJournal::append`], with the outcomes of the keyed invocations
    /// the records bill, in the same atomic batch; keys older than the
    /// window before `now_ms` are removed in it too.
    ///
    /// Through the write-ahead log: one entry written (`O_DIRECT`), then its
    /// changes applied to the tree unflushed; durable when the write
    /// returned. An entry too large for the log, or no log, goes the tree's
    /// way: one batch, then sled's flush.
    pub fn append_keyed(
        &self,
        records: Vec<UsageRecord>,
        keyed: Vec<KeyedOutcome>,
        now_ms: u64,
    ) -> Result<Range<u64>, JournalError> {
        self.append_keyed_then(records, keyed, now_ms, |_| {})
    }

    /// [`UsageJournal::append_keyed`], calling `durable` with the number of
    /// records as soon as they are durable: through the log, right after
    /// its write and before the tree gets them (what waits only for
    /// durability goes on meanwhile). If applying them to the tree then
    /// fails, this returns `Err(Unapplied)` though `durable` was called:
    /// they are durable, and the next open applies them.
    pub fn append_keyed_then(
        &self,
        records: Vec<UsageRecord>,
        keyed: Vec<KeyedOutcome>,
        now_ms: u64,
        durable: impl FnOnce(u64),
    ) -> Result<Range<u64>, JournalError> {
        let Some(wal) = &self.wal else {
            let seqs = self.write_unflushed(records, keyed, now_ms)?;
            let seqs = self.flush_to(seqs)?;
            durable(seqs.end - seqs.start);
            return Ok(seqs);
        };
        // Appends are serialized by the log's lock, then the state's (the
        // numbers and the entry's place in the log go together).
        let mut logged = wal.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &logged.unapplied {
            return Err(JournalError::Unapplied(why.clone()));
        }
        let mut st = self.state();
        let Some(p) = self.prepare(&st, records, keyed, now_ms)? else {
            let next = st.seqs.next();
            durable(0);
            return Ok(next..next);
        };
        if logged.torn {
            self.restart_log(&mut logged)?;
        }
        let mut place = logged.wal.prepare(&p.ops)?;
        if place == crate::wal::Prepared::CheckpointFirst {
            self.restart_log(&mut logged)?;
            place = logged.wal.prepare(&p.ops)?;
        }
        if place != crate::wal::Prepared::Fits {
            Self::apply_ops(&self.tree, p.ops, None)?;
            Self::commit(&mut st, p.totals, p.seqs.end);
            drop(st);
            let seqs = self.flush_to(p.seqs)?;
            durable(seqs.end - seqs.start);
            return Ok(seqs);
        }
        // From here the entry may reach the disk: its numbers are never
        // handed out again, and until its changes are in the tree the
        // journal takes no other append (a panic in between, caught by the
        // writer thread, leaves it so: a restart replays the entry).
        st.seqs.taken(p.seqs.end);
        logged.unapplied = Some("an append was interrupted after its log write".into());
        let began = std::time::Instant::now();
        let wrote = logged.wal.write();
        self.write_times.record(began.elapsed());
        match wrote {
            Ok(end) => {
                durable(p.seqs.end - p.seqs.start);
                if let Err(e) = Self::apply_logged(&self.tree, p.ops, end) {
                    // Durable in the log, not in the tree: nothing more goes
                    // in until a restart replays it.
                    let why = e.to_string();
                    logged.unapplied = Some(why.clone());
                    tracing::error!(
                        "usage journal: an entry in the log could not be applied: {why}"
                    );
                    return Err(JournalError::Unapplied(why));
                }
                logged.unapplied = None;
                Self::commit(&mut st, p.totals, p.seqs.end);
                st.seqs.flushed(p.seqs.end);
                Ok(p.seqs)
            }
            Err(e) => {
                // Part of it may be on disk, or all of it: a new epoch at
                // once, so it is never replayed (its answer was a definite
                // error) and no later entry lies behind a torn one; if the
                // checkpoint fails, the next append tries it first.
                logged.unapplied = None;
                let restarted = self.restart_log(&mut logged);
                // The entry's numbers go to the next records: a hole would
                // stop the region's window over this agent's numbers for
                // good. After a checkpoint nothing reads the entry back;
                // after a failed one the journal takes no more appends
                // here, and the next open either replays the entry (its
                // numbers then are the highest found) or does not.
                st.seqs.abandoned(p.seqs);
                match restarted {
                    Ok(()) => Err(e.into()),
                    // The journal refuses appends until a restart: the
                    // writer stops the agent now (it is `Unapplied`).
                    Err(stop) => Err(stop),
                }
            }
        }
    }

    /// Flushes sled, then counts `seqs` as durable.
    fn flush_to(&self, seqs: Range<u64>) -> Result<Range<u64>, JournalError> {
        // The flush runs without the lock. sled makes its log stable in
        // order (a flush returns once everything written before it is on
        // disk), so when it returns these records, and every one with a
        // lower number, are durable.
        let began = std::time::Instant::now();
        let flushed = self.db.flush();
        self.write_times.record(began.elapsed());
        flushed.map_err(JournalError::Unflushed)?;
        self.state().seqs.flushed(seqs.end);
        Ok(seqs)
    }

    /// The totals and numbers an append's records took, once in the tree.
    fn commit(st: &mut Appending, totals: Vec<(TenantId, TenantTotals)>, end: u64) {
        for (tenant, t) in totals {
            st.totals.insert(tenant, t);
        }
        st.seqs.taken(end);
    }

    /// The write half of [`UsageJournal::append_keyed`] without the log:
    /// numbers assigned and the records (and keyed outcomes) in the tree,
    /// not yet flushed, so not yet visible to [`UsageJournal::batch_after`].
    fn write_unflushed(
        &self,
        records: Vec<UsageRecord>,
        keyed: Vec<KeyedOutcome>,
        now_ms: u64,
    ) -> Result<Range<u64>, JournalError> {
        let mut st = self.state();
        let Some(p) = self.prepare(&st, records, keyed, now_ms)? else {
            let next = st.seqs.next();
            return Ok(next..next);
        };
        Self::apply_ops(&self.tree, p.ops, None)?;
        // The numbers are taken once the records are in the tree, even if
        // the flush fails: they may then still reach the disk and the
        // region, and a later append must not reuse (and overwrite) them.
        Self::commit(&mut st, p.totals, p.seqs.end);
        Ok(p.seqs)
    }

    /// What an append of `records` and `keyed` changes: its numbers, the
    /// tree's changes (records, keyed outcomes and their age index, keys
    /// past the window removed) and the totals after it; `None` when there
    /// is nothing to write. Nothing is taken or changed.
    fn prepare(
        &self,
        st: &Appending,
        records: Vec<UsageRecord>,
        keyed: Vec<KeyedOutcome>,
        now_ms: u64,
    ) -> Result<Option<Prepared>, JournalError> {
        if records.is_empty() && keyed.is_empty() {
            return Ok(None);
        }
        let seqs = st
            .seqs
            .numbers(records.len() as u64)
            .ok_or(JournalError::SequenceExhausted)?;
        let first = seqs.start;
        // The totals after this append (checked before anything is written;
        // a group has few tenants, usually one).
        let mut totals: Vec<(TenantId, TenantTotals)> = Vec::new();
        let mut ops = Vec::with_capacity(records.len().saturating_add(keyed.len() * 2));
        for (i, mut r) in records.into_iter().enumerate() {
            r.seq = first + i as u64;
            let at = match totals.iter().position(|(t, _)| *t == r.tenant) {
                Some(at) => at,
                None => {
                    let now = st.totals.get(&r.tenant).copied().unwrap_or_default();
                    totals.push((r.tenant.clone(), now));
                    totals.len() - 1
                }
            };
            totals[at].1.add(&r)?;
            ops.push(WalOp::Insert(
                record_key(r.seq).to_vec(),
                encode_record(&r)?,
            ));
        }
        self.expire_keys(&mut ops, &keyed, now_ms)?;
        for o in &keyed {
            let bytes = bincode::serde::encode_to_vec(o, bincode::config::standard())
                .map_err(|e| JournalError::Encode(e.to_string()))?;
            ops.push(WalOp::Insert(keyed_key(&o.tenant, &o.key), bytes));
            ops.push(WalOp::Insert(
                age_key(o.at_ms, &o.tenant, &o.key),
                Vec::new(),
            ));
        }
        Ok(Some(Prepared { seqs, ops, totals }))
    }

    /// Adds to `ops` the removal of the keys older than the window before
    /// `now_ms` (only when `keyed` has outcomes to store: keys expire on
    /// keyed writes).
    fn expire_keys(
        &self,
        ops: &mut Vec<WalOp>,
        keyed: &[KeyedOutcome],
        now_ms: u64,
    ) -> Result<(), JournalError> {
        if keyed.is_empty() {
            return Ok(());
        }
        let window = self.key_window_ms.load(Ordering::Relaxed);
        let horizon = age_key(now_ms.saturating_sub(window), &TenantId(String::new()), "");
        for kv in self.tree.range(vec![KEY_AGE_PREFIX]..horizon) {
            let (k, _) = kv?;
            if let Some(split) = k.get(9..).and_then(|r| r.iter().position(|b| *b == 0)) {
                let at = decode_u64(&k, &k[1..9])?;
                let tenant = TenantId(String::from_utf8_lossy(&k[9..9 + split]).into_owned());
                let key = String::from_utf8_lossy(&k[10 + split..]).into_owned();
                // Only the record this age entry was written with (a
                // key recorded again later has a newer one).
                let stored = self.keyed(&tenant, &key, 0)?;
                if stored.is_some_and(|o| o.at_ms == at) {
                    ops.push(WalOp::Remove(keyed_key(&tenant, &key)));
                }
            }
            ops.push(WalOp::Remove(k.to_vec()));
        }
        Ok(())
    }

    /// `tenant`'s totals over every record appended (zero when it has none):
    /// the stored part of the removed records plus the records still held,
    /// so exactly what is on disk.
    pub fn totals(&self, tenant: &TenantId) -> Result<TenantTotals, JournalError> {
        Ok(self.state().totals.get(tenant).copied().unwrap_or_default())
    }

    /// Every tenant's totals.
    pub fn all_totals(&self) -> Result<BTreeMap<TenantId, TenantTotals>, JournalError> {
        Ok(self.state().totals.clone())
    }

    /// Adds to `batch` the stored totals raised by `removed` (the totals of
    /// records the same batch removes), so records move from held to
    /// stored atomically. Called under `folding`.
    fn fold_into(
        &self,
        batch: &mut sled::Batch,
        removed: BTreeMap<TenantId, TenantTotals>,
    ) -> Result<(), JournalError> {
        for (tenant, r) in removed {
            let stored = match self.tree.get(totals_key(&tenant))? {
                Some(b) => decode_totals(&b)?,
                None => TenantTotals::default(),
            };
            let t = stored.plus(&r).ok_or(JournalError::TotalsOverflow)?;
            batch.insert(totals_key(&tenant), encode_totals(&t)?);
        }
        Ok(())
    }

    /// Why the journal takes no more appends (an entry is in its log but
    /// not in its tree, or a checkpoint failed), if so: only a restart,
    /// which replays the log, clears it.
    pub fn refusing(&self) -> Option<String> {
        let logged = self.wal.as_ref()?;
        let logged = logged.lock().unwrap_or_else(|p| p.into_inner());
        logged.unapplied.clone()
    }

    /// How long the durable writes of appends took so far.
    pub fn write_times(&self) -> WriteHistogram {
        self.write_times.snapshot()
    }

    /// Where the journal stands.
    pub fn status(&self) -> JournalStatus {
        JournalStatus {
            next_seq: self.next_seq(),
            pending_records: self.pending() as u64,
            acked_through: self.acked_through.load(Ordering::Relaxed),
            region_next_seq: self.region_next_seq.load(Ordering::Relaxed),
        }
    }

    /// Number of records not yet acknowledged.
    pub fn pending(&self) -> usize {
        self.tree.scan_prefix([RECORD_PREFIX]).count()
    }

    /// The oldest unacknowledged durable records with a sequence number
    /// above `after_seq`, at most `max_records` (and at most
    /// [`MAX_USAGE_BATCH`]), in order; `None` when there are none.
    /// `after_seq = 0` starts from the oldest: after a restart that re-sends
    /// everything not acknowledged. Records of an append still flushing are
    /// not returned (see [`JournalSeqs`]).
    pub fn batch_after(
        &self,
        after_seq: u64,
        max_records: usize,
    ) -> Result<Option<JournalBatch>, JournalError> {
        let max = max_records.clamp(1, MAX_USAGE_BATCH);
        let Some(Range { start, end }) = self.state().seqs.sendable_after(after_seq) else {
            return Ok(None);
        };
        let mut records = Vec::new();
        for kv in self
            .tree
            .range(record_key(start)..record_key(end))
            .take(max)
        {
            let (k, v) = kv?;
            records.push(decode_record(&k, &v)?);
        }
        if records.is_empty() {
            return Ok(None);
        }
        Ok(Some(JournalBatch {
            agent: self.agent.clone(),
            records,
        }))
    }

    /// Removes the records of an acknowledged batch (flushed before return).
    /// Returns how many were still held.
    pub fn ack(&self, batch: &JournalBatch) -> Result<usize, JournalError> {
        let _folding = self.folding.lock().unwrap_or_else(|p| p.into_inner());
        let mut removed = 0;
        let mut b = sled::Batch::default();
        let mut folded: BTreeMap<TenantId, TenantTotals> = BTreeMap::new();
        for r in &batch.records {
            let k = record_key(r.seq);
            if let Some(v) = self.tree.get(k)? {
                let held = decode_record(&k, &v)?;
                folded.entry(held.tenant.clone()).or_default().add(&held)?;
                b.remove(&k[..]);
                removed += 1;
            }
        }
        if removed > 0 {
            self.fold_into(&mut b, folded)?;
            // Above every number handed out, so a journal emptied by acks
            // still knows where to go on.
            let next = self.state().seqs.next();
            b.insert(KEY_NEXT_SEQ, &next.to_be_bytes()[..]);
            self.tree.apply_batch(b)?;
            self.db.flush()?;
        }
        self.acked_through
            .fetch_max(batch.last_seq(), Ordering::Relaxed);
        Ok(removed)
    }

    /// Aligns the journal with the next sequence number the region expects
    /// from this agent (the answer to `AgentRegister`): records below it were
    /// applied already and are removed; if the region expects more than the
    /// journal would assign (the journal was lost or replaced), the journal
    /// jumps ahead so new records are not taken for duplicates.
    pub fn reconcile(&self, region_next_seq: u64) -> Result<Reconciled, JournalError> {
        let _folding = self.folding.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = self.state();
        self.region_next_seq
            .store(region_next_seq, Ordering::Relaxed);
        let plan = st.seqs.reconcile(region_next_seq);
        let mut b = sled::Batch::default();
        let mut removed = 0;
        let mut folded: BTreeMap<TenantId, TenantTotals> = BTreeMap::new();
        for kv in self
            .tree
            .range(record_key(0)..record_key(plan.applied_below))
        {
            let (k, v) = kv?;
            let held = decode_record(&k, &v)?;
            folded.entry(held.tenant.clone()).or_default().add(&held)?;
            b.remove(k);
            removed += 1;
        }
        let advanced = plan.advanced;
        if removed > 0 || advanced {
            self.fold_into(&mut b, folded)?;
            b.insert(KEY_NEXT_SEQ, &plan.next.to_be_bytes()[..]);
            self.tree.apply_batch(b)?;
            self.db.flush()?;
        }
        st.seqs.taken(plan.next);
        Ok(Reconciled { removed, advanced })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gshare_core::model::{PoolKind, TenantId, Tier};
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    fn agent() -> AgentId {
        AgentId("agent-a".into())
    }

    fn rec(compute: u64) -> UsageRecord {
        UsageRecord {
            seq: 0,
            tenant: TenantId("acme".into()),
            function: "chat".into(),
            tier: Tier::Burstable,
            gpu_model: "A100-80G".into(),
            pool_kind: PoolKind::Edge,
            compute_milli_gpu_ms: compute,
            memory_mib_ms: compute * 3,
            invocations: 1,
            end_ms: 1_700_000_000_000 + compute,
        }
    }

    /// A directory on the build's file system (which takes `O_DIRECT`, where
    /// a tmpfs `/tmp` would not), so the write-ahead log is what is tested.
    fn disk_dir() -> tempfile::TempDir {
        tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")).unwrap()
    }

    /// A copy of a live journal's directory: what a crash of the process at
    /// this instant leaves (sled's files hold what it wrote, flushed or not;
    /// the log what was written).
    fn crash_copy(from: &Path) -> tempfile::TempDir {
        fn copy(from: &Path, to: &Path) {
            std::fs::create_dir_all(to).unwrap();
            for e in std::fs::read_dir(from).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    copy(&e.path(), &to.join(e.file_name()));
                } else {
                    std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
                }
            }
        }
        let to = disk_dir();
        copy(from, to.path());
        to
    }

    /// What a power loss can leave: sled's files as of `sled_at` (a copy
    /// taken right after the open, which flushed), and the log as written
    /// since (its writes reached the device; sled's later ones had not).
    fn power_loss(sled_at: &tempfile::TempDir, live: &Path) -> tempfile::TempDir {
        let to = crash_copy(sled_at.path());
        let log = crate::wal::FILE_NAME;
        std::fs::copy(live.join(log), to.path().join(log)).unwrap();
        to
    }

    /// A journal on disk that writes through its log, and a copy of its
    /// directory taken right after the open (sled's files as flushed);
    /// `None` on a file system that refuses `O_DIRECT`.
    fn logged_journal() -> Option<(tempfile::TempDir, UsageJournal, tempfile::TempDir)> {
        let dir = disk_dir();
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        if !j.logged() {
            eprintln!("no O_DIRECT on this file system: nothing to test");
            return None;
        }
        let opened = crash_copy(dir.path());
        Some((dir, j, opened))
    }

    /// A log write that fails (after writing its entry, the worst case:
    /// all of it may be on the device): its records are refused, the log
    /// starts a new epoch, and their numbers go to the next records, so
    /// the region sees no hole in the agent's numbers; a crash then brings
    /// back neither the failed entry nor a gap.
    #[test]
    fn a_failed_log_write_leaves_no_hole_in_the_numbers() {
        let Some((dir, j, _opened)) = logged_journal() else {
            return;
        };
        let acme = TenantId("acme".into());
        assert_eq!(j.append(vec![rec(1)]).unwrap(), 1..2);
        j.wal.as_ref().unwrap().lock().unwrap().wal.fail_next_write = true;
        assert!(j.append(vec![rec(2), rec(3)]).is_err());
        assert_eq!(j.append(vec![rec(4)]).unwrap(), 2..3);
        assert_eq!(seqs(&j), vec![1, 2]);
        assert_eq!(held(&j)[1].compute_milli_gpu_ms, 4);
        let killed = crash_copy(dir.path());
        let r = UsageJournal::open(killed.path(), agent()).unwrap();
        assert_eq!(seqs(&r), vec![1, 2]);
        assert_eq!(r.next_seq(), 3);
        assert_eq!(r.totals(&acme).unwrap().invocations, 2);
    }

    fn held(j: &UsageJournal) -> Vec<UsageRecord> {
        let mut held = Vec::new();
        let mut after = 0;
        while let Some(b) = j.batch_after(after, 1000).unwrap() {
            after = b.last_seq();
            held.extend(b.records);
        }
        held
    }

    fn seqs(j: &UsageJournal) -> Vec<u64> {
        held(j).iter().map(|r| r.seq).collect()
    }

    #[test]
    fn appends_through_the_log_survive_a_crash_and_are_replayed_once() {
        let Some((dir, j, opened)) = logged_journal() else {
            return;
        };
        let acme = TenantId("acme".into());
        let t0 = 1_700_000_000_000;
        assert_eq!(j.append(vec![rec(1)]).unwrap(), 1..2);
        assert_eq!(j.append(vec![rec(2), rec(3)]).unwrap(), 2..4);
        let k = KeyedOutcome::new(acme.clone(), "k1".into(), t0, b"hello");
        assert_eq!(j.append_keyed(vec![rec(4)], vec![k], t0).unwrap(), 4..5);
        // Durable as soon as written: sendable at once.
        assert_eq!(held(&j).len(), 4);
        let want = TenantTotals {
            invocations: 4,
            compute_milli_gpu_ms: 10,
            memory_mib_ms: 30,
            records: 4,
        };
        // Power lost: sled's files as flushed at the open, the three
        // appends in the log only.
        let lost = power_loss(&opened, dir.path());
        let r = UsageJournal::open(lost.path(), agent()).unwrap();
        assert_eq!(r.replayed(), 3);
        assert_eq!(seqs(&r), vec![1, 2, 3, 4]);
        assert_eq!(r.next_seq(), 5);
        assert_eq!(r.totals(&acme).unwrap(), want);
        assert!(r.keyed(&acme, "k1", t0 + 1).unwrap().is_some());
        // The process killed instead: whatever sled wrote of them, each is
        // there once.
        let killed = crash_copy(dir.path());
        let k = UsageJournal::open(killed.path(), agent()).unwrap();
        assert!(k.replayed() <= 3);
        assert_eq!(seqs(&k), vec![1, 2, 3, 4]);
        assert_eq!(k.totals(&acme).unwrap(), want);
        // Acknowledged after the replay, one more appended, then killed:
        // the replayed entries are not applied a second time (no removed
        // record comes back, the totals count each record once).
        let b = r.batch_after(0, 2).unwrap().unwrap();
        assert_eq!(r.ack(&b).unwrap(), 2);
        assert_eq!(r.append(vec![rec(5)]).unwrap(), 5..6);
        let again = crash_copy(lost.path());
        drop(r);
        let r = UsageJournal::open(again.path(), agent()).unwrap();
        assert!(
            r.replayed() <= 1,
            "only the append after the replay's checkpoint"
        );
        assert_eq!(seqs(&r), vec![3, 4, 5]);
        let want = TenantTotals {
            invocations: 5,
            compute_milli_gpu_ms: 15,
            memory_mib_ms: 45,
            records: 5,
        };
        assert_eq!(r.totals(&acme).unwrap(), want);
        drop(r);
        // A clean reopen replays nothing.
        let r = UsageJournal::open(again.path(), agent()).unwrap();
        assert_eq!(r.replayed(), 0);
        assert_eq!(r.totals(&acme).unwrap(), want);
    }

    #[test]
    fn an_append_interrupted_after_its_write_stops_the_journal_until_a_replay() {
        let Some((dir, j, opened)) = logged_journal() else {
            return;
        };
        let acme = TenantId("acme".into());
        // The writer thread catches a panic (here in the caller's callback,
        // after the entry is durable): the journal must not hand the
        // numbers out again, nor take appends the tree would be missing
        // an entry before.
        let interrupted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            j.append_keyed_then(vec![rec(10)], vec![], 0, |_| panic!("interrupted"))
        }));
        assert!(interrupted.is_err());
        assert!(matches!(
            j.append(vec![rec(20)]),
            Err(JournalError::Unapplied(_))
        ));
        assert!(j.refusing().is_some());
        assert_eq!(j.next_seq(), 2);
        // A power loss now: the interrupted entry is replayed, once.
        let lost = power_loss(&opened, dir.path());
        drop(j);
        let r = UsageJournal::open(lost.path(), agent()).unwrap();
        assert_eq!(r.replayed(), 1);
        assert_eq!(seqs(&r), vec![1]);
        assert_eq!(r.totals(&acme).unwrap().compute_milli_gpu_ms, 10);
        assert_eq!(r.append(vec![rec(20)]).unwrap(), 2..3);
        assert_eq!(r.refusing(), None);
    }

    #[test]
    fn write_times_count_each_durable_write_and_place_quantiles_in_buckets() {
        let t = WriteTimes::new();
        assert_eq!(t.snapshot().quantile_us(0.5), None);
        for us in [3, 42, 44, 47, 120, 999, 1_000, 2_500, 250_000] {
            t.record(std::time::Duration::from_micros(us));
        }
        let h = t.snapshot();
        assert_eq!(h.count(), 9);
        assert_eq!(h.quantile_us(0.0), Some(5));
        assert_eq!(h.quantile_us(0.3), Some(45));
        assert_eq!(h.quantile_us(0.5), Some(125));
        assert_eq!(h.quantile_us(0.7), Some(2_000));
        assert_eq!(h.quantile_us(0.8), Some(3_000));
        assert_eq!(h.quantile_us(1.0), Some(u64::MAX));
        t.record(std::time::Duration::from_micros(10));
        let later = t.snapshot().since(&h);
        assert_eq!((later.count(), later.quantile_us(0.99)), (1, Some(15)));
    }

    #[test]
    fn every_append_times_its_durable_write_through_the_log_or_sleds_flush() {
        for sync in [WalSync::default(), WalSync::Sled] {
            let dir = disk_dir();
            let j = UsageJournal::open_with(dir.path(), agent(), sync).unwrap();
            j.append(vec![rec(1)]).unwrap();
            j.append(vec![rec(2), rec(3)]).unwrap();
            let times = j.write_times();
            assert_eq!(times.count(), 2, "{sync:?}");
            assert!(times.quantile_us(1.0).is_some());
        }
    }

    #[test]
    fn a_torn_entry_ends_the_log_and_checkpoints_keep_everything() {
        let Some((dir, j, opened)) = logged_journal() else {
            return;
        };
        let acme = TenantId("acme".into());
        for c in 1..=3 {
            j.append(vec![rec(c)]).unwrap();
        }
        // The second entry torn (one byte of its payload lost): the first
        // is replayed, nothing after the tear.
        let lost = power_loss(&opened, dir.path());
        let log = lost.path().join(crate::wal::FILE_NAME);
        let mut bytes = std::fs::read(&log).unwrap();
        bytes[crate::wal::BLOCK + 30] ^= 0xff;
        std::fs::write(&log, &bytes).unwrap();
        let r = UsageJournal::open(lost.path(), agent()).unwrap();
        assert_eq!(r.replayed(), 1);
        assert_eq!(seqs(&r), vec![1]);
        assert_eq!(r.next_seq(), 2);
        assert_eq!(r.totals(&acme).unwrap().invocations, 1);
        drop(r);
        // Enough appends to fill the log past its checkpoint mark (one
        // 4 KiB entry each): the checkpoint flushed sled and started a new
        // epoch; a crash after it loses nothing and counts nothing twice.
        let n = (crate::wal::CAPACITY / crate::wal::BLOCK as u64) as usize;
        for c in 0..n {
            j.append(vec![rec(10 + c as u64)]).unwrap();
        }
        let killed = crash_copy(dir.path());
        let r = UsageJournal::open(killed.path(), agent()).unwrap();
        assert!(r.replayed() < n / 2, "replayed {}", r.replayed());
        assert_eq!(seqs(&r), (1..=3 + n as u64).collect::<Vec<_>>());
        assert_eq!(r.totals(&acme).unwrap().invocations, 3 + n as u64);
        drop(r);
        // Opened without the log (`journal_sync = "sled"`): a log left
        // behind is replayed first, then removed.
        j.append(vec![rec(99)]).unwrap();
        let killed = crash_copy(dir.path());
        let r = UsageJournal::open_with(killed.path(), agent(), WalSync::Sled).unwrap();
        assert!(!r.logged());
        assert!(!killed.path().join(crate::wal::FILE_NAME).exists());
        assert_eq!(seqs(&r).len(), 4 + n);
        assert_eq!(r.next_seq(), 5 + n as u64);
        assert_eq!(
            r.append(vec![rec(100)]).unwrap(),
            5 + n as u64..6 + n as u64
        );
        drop(r);
        let r = UsageJournal::open_with(killed.path(), agent(), WalSync::Sled).unwrap();
        assert_eq!(r.next_seq(), 6 + n as u64);
        assert_eq!(r.totals(&acme).unwrap().invocations, 5 + n as u64);
    }

    #[test]
    fn keyed_outcomes_are_stored_with_their_records_survive_reopen_and_expire() {
        let dir = tempfile::tempdir().unwrap();
        let acme = TenantId("acme".into());
        let t0 = 1_700_000_000_000;
        {
            let j = UsageJournal::open(dir.path(), agent()).unwrap();
            let big = vec![7u8; gshare_core::protocol::MAX_REPLAY_BODY + 1];
            let keyed = vec![
                KeyedOutcome::new(acme.clone(), "k1".into(), t0, b"hello"),
                KeyedOutcome::new(acme.clone(), "k2".into(), t0, &big),
            ];
            assert_eq!(j.append_keyed(vec![rec(10)], keyed, t0).unwrap(), 1..2);
            assert_eq!(j.totals(&acme).unwrap().invocations, 1);
        }
        // Reopened (as after kill -9: everything was flushed with the record).
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        let k1 = j.keyed(&acme, "k1", t0 + 1).unwrap().expect("k1 stored");
        assert_eq!(
            k1.replay(),
            gshare_core::protocol::InvokeOutcome::Replayed {
                body: b"hello".to_vec(),
                body_len: 5,
                truncated: false
            }
        );
        let k2 = j.keyed(&acme, "k2", t0 + 1).unwrap().expect("k2 stored");
        assert!(k2.truncated());
        assert!(matches!(
            k2.replay(),
            gshare_core::protocol::InvokeOutcome::Replayed { truncated: true, ref body, body_len }
                if body.is_empty() && body_len == gshare_core::protocol::MAX_REPLAY_BODY as u64 + 1
        ));
        // Another tenant's key of the same name is not the same key.
        assert_eq!(j.keyed(&TenantId("globex".into()), "k1", t0).unwrap(), None);
        // Past the window a key is unknown, and the next write removes it.
        j.set_key_window(std::time::Duration::from_secs(60));
        let later = t0 + 61_000;
        assert_eq!(j.keyed(&acme, "k1", later).unwrap(), None);
        let k3 = KeyedOutcome::new(acme.clone(), "k3".into(), later, b"x");
        j.append_keyed(vec![rec(20)], vec![k3], later).unwrap();
        assert_eq!(j.keyed(&acme, "k1", 0).unwrap(), None);
        assert_eq!(j.keyed(&acme, "k2", 0).unwrap(), None);
        assert!(j.keyed(&acme, "k3", later).unwrap().is_some());
        assert_eq!(j.tree.scan_prefix([KEY_PREFIX]).count(), 1);
        assert_eq!(j.tree.scan_prefix([KEY_AGE_PREFIX]).count(), 1);
    }

    #[test]
    fn transparent_keys_keep_the_head_and_keys_of_the_older_layout_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let acme = TenantId("acme".into());
        let t0 = 1_700_000_000_000;
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        let head = gshare_core::protocol::ReplyHead {
            status: 400,
            headers: vec![("content-type".into(), b"application/json".to_vec())],
        };
        let http = |key: &str, body: &[u8], len: u64, complete: bool| {
            KeyedOutcome::http(
                acme.clone(),
                key.into(),
                t0,
                head.clone(),
                body,
                len,
                complete,
            )
        };
        let keyed = vec![
            http("whole", b"{}", 2, true),
            http("started", b"", 0, false),
            http("long", b"abc", 100_000, true),
        ];
        j.append_keyed(vec![rec(10)], keyed, t0).unwrap();
        let replay = |key: &str| j.keyed(&acme, key, t0).unwrap().unwrap().replay();
        assert_eq!(
            replay("whole"),
            gshare_core::protocol::InvokeOutcome::ReplayedHttp {
                head: head.clone(),
                body: b"{}".to_vec(),
                body_len: 2,
                truncated: false,
            }
        );
        for cut in ["started", "long"] {
            assert!(matches!(
                replay(cut),
                gshare_core::protocol::InvokeOutcome::ReplayedHttp { truncated: true, ref body, .. }
                    if body.is_empty()
            ));
        }
        // A key as an agent of the layout before wrote it (no head, no
        // `complete`): read as a plain, complete answer.
        #[derive(Serialize)]
        struct Older<'a> {
            tenant: &'a TenantId,
            key: &'a str,
            at_ms: u64,
            body: &'a [u8],
            body_len: u64,
        }
        let older = Older {
            tenant: &acme,
            key: "old",
            at_ms: t0,
            body: b"hi",
            body_len: 2,
        };
        let bytes = bincode::serde::encode_to_vec(&older, bincode::config::standard()).unwrap();
        j.tree.insert(keyed_key(&acme, "old"), bytes).unwrap();
        assert_eq!(
            replay("old"),
            gshare_core::protocol::InvokeOutcome::Replayed {
                body: b"hi".to_vec(),
                body_len: 2,
                truncated: false,
            }
        );
        // A key as an agent of the layout before this one wrote it (a head
        // and `complete`, no function): read with no function.
        #[derive(Serialize)]
        struct Before<'a> {
            tenant: &'a TenantId,
            key: &'a str,
            at_ms: u64,
            body: &'a [u8],
            body_len: u64,
            head: Option<&'a gshare_core::protocol::ReplyHead>,
            complete: bool,
        }
        let before = Before {
            tenant: &acme,
            key: "before",
            at_ms: t0,
            body: b"{}",
            body_len: 2,
            head: Some(&head),
            complete: true,
        };
        let bytes = bincode::serde::encode_to_vec(&before, bincode::config::standard()).unwrap();
        j.tree.insert(keyed_key(&acme, "before"), bytes).unwrap();
        let read = j.keyed(&acme, "before", t0).unwrap().unwrap();
        assert_eq!(read.function, None);
        assert_eq!(read.replay(), replay("whole"));
        // This layout keeps the function.
        j.append_keyed(
            vec![rec(11)],
            vec![http("named", b"{}", 2, true).of_function("f")],
            t0,
        )
        .unwrap();
        let read = j.keyed(&acme, "named", t0).unwrap().unwrap();
        assert_eq!(read.function.as_deref(), Some("f"));
        assert_eq!(read.replay(), replay("whole"));
    }

    #[test]
    fn records_still_flushing_are_not_sent() {
        let dir = tempfile::tempdir().unwrap();
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        assert_eq!(j.append(vec![rec(10)]).unwrap(), 1..2);
        // An append whose flush has not returned: in the tree, not yet
        // durable, so not in a batch (the region would bill it, and a
        // crash now could hand its number out again).
        assert_eq!(j.write_unflushed(vec![rec(20)], vec![], 0).unwrap(), 2..3);
        let b = j.batch_after(0, 100).unwrap().unwrap();
        assert_eq!((b.first_seq(), b.last_seq()), (1, 1));
        assert!(j.batch_after(1, 100).unwrap().is_none());
        // The next append's flush covers it.
        assert_eq!(j.append(vec![rec(30)]).unwrap(), 3..4);
        let b = j.batch_after(0, 100).unwrap().unwrap();
        assert_eq!((b.first_seq(), b.last_seq()), (1, 3));
        drop(j);
        // After a restart everything held on disk is sent.
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        let b = j.batch_after(0, 100).unwrap().unwrap();
        assert_eq!((b.first_seq(), b.last_seq()), (1, 3));
    }

    #[test]
    fn append_assigns_consecutive_numbers_and_batches_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        assert_eq!(j.next_seq(), 1);
        assert_eq!(j.append(vec![rec(10), rec(20)]).unwrap(), 1..3);
        assert_eq!(j.append(vec![rec(30)]).unwrap(), 3..4);
        assert_eq!(j.append(vec![]).unwrap(), 4..4);
        assert_eq!(j.pending(), 3);
        let b = j.batch_after(0, 2).unwrap().unwrap();
        assert_eq!(b.agent, agent());
        assert_eq!((b.first_seq(), b.last_seq()), (1, 2));
        assert_eq!(b.records[1].compute_milli_gpu_ms, 20);
        let rest = j.batch_after(b.last_seq(), 100).unwrap().unwrap();
        assert_eq!(rest.records.len(), 1);
        assert_eq!(rest.records[0].seq, 3);
        assert!(j.batch_after(3, 100).unwrap().is_none());
        match b.command() {
            DomainCommand::UsageBatch { agent: a, records } => {
                assert_eq!(a, agent());
                assert_eq!(records, b.records);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn ack_removes_and_numbers_survive_reopen_after_drop() {
        let dir = tempfile::tempdir().unwrap();
        {
            let j = UsageJournal::open(dir.path(), agent()).unwrap();
            j.append((1..=5).map(rec).collect()).unwrap();
            let b = j.batch_after(0, 3).unwrap().unwrap();
            assert_eq!(j.ack(&b).unwrap(), 3);
            assert_eq!(j.ack(&b).unwrap(), 0, "a second ack removes nothing");
            assert_eq!(j.pending(), 2);
        }
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        assert_eq!(j.next_seq(), 6);
        let b = j.batch_after(0, 100).unwrap().unwrap();
        let seqs: Vec<u64> = b.records.iter().map(|r| r.seq).collect();
        assert_eq!(
            seqs,
            vec![4, 5],
            "unacknowledged records are re-sent in order"
        );
        j.ack(&b).unwrap();
        drop(j);
        // Everything acknowledged: the next number still comes from disk.
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        assert_eq!(j.pending(), 0);
        assert_eq!(j.next_seq(), 6);
        assert_eq!(j.append(vec![rec(7)]).unwrap(), 6..7);
    }

    #[test]
    fn totals_count_every_record_per_tenant_and_survive_acks_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let acme = TenantId("acme".into());
        let globex = TenantId("globex".into());
        {
            let j = UsageJournal::open(dir.path(), agent()).unwrap();
            let mut g = rec(100);
            g.tenant = globex.clone();
            g.invocations = 5;
            j.append(vec![rec(10), g, rec(20)]).unwrap();
            let b = j.batch_after(0, 10).unwrap().unwrap();
            j.ack(&b).unwrap();
            assert_eq!(
                j.status(),
                JournalStatus {
                    next_seq: 4,
                    pending_records: 0,
                    acked_through: 3,
                    region_next_seq: 0
                }
            );
        }
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        j.append(vec![rec(1)]).unwrap();
        let want = TenantTotals {
            invocations: 3,
            compute_milli_gpu_ms: 31,
            memory_mib_ms: 93,
            records: 3,
        };
        assert_eq!(j.totals(&acme).unwrap(), want);
        let all = j.all_totals().unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[&globex].invocations, 5);
        assert_eq!(all[&globex].records, 1);
        assert_eq!(
            j.totals(&TenantId("nobody".into())).unwrap(),
            TenantTotals::default()
        );
        j.reconcile(5).unwrap();
        assert_eq!(j.status().region_next_seq, 5);
        assert_eq!(j.status().pending_records, 0);
    }

    #[test]
    fn removals_fold_into_the_totals_once() {
        let dir = tempfile::tempdir().unwrap();
        let acme = TenantId("acme".into());
        let want = |n: u64, compute: u64| TenantTotals {
            invocations: n,
            compute_milli_gpu_ms: compute,
            memory_mib_ms: 3 * compute,
            records: n,
        };
        {
            let j = UsageJournal::open(dir.path(), agent()).unwrap();
            j.append((1..=4).map(rec).collect()).unwrap();
            let b = j.batch_after(0, 2).unwrap().unwrap();
            j.ack(&b).unwrap();
            // A second ack of the same records, and a reconcile that finds
            // them applied, move nothing again.
            assert_eq!(j.ack(&b).unwrap(), 0);
            assert_eq!(j.reconcile(3).unwrap().removed, 0);
            assert_eq!(j.totals(&acme).unwrap(), want(4, 10));
            // Stored on disk: exactly the removed records.
            let stored = decode_totals(&j.tree.get(totals_key(&acme)).unwrap().unwrap()).unwrap();
            assert_eq!(stored, want(2, 3));
            // Reconcile removes the third (applied, ack lost).
            assert_eq!(j.reconcile(4).unwrap().removed, 1);
            assert_eq!(j.totals(&acme).unwrap(), want(4, 10));
        }
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        assert_eq!(j.totals(&acme).unwrap(), want(4, 10));
        assert_eq!(j.pending(), 1);
        assert_eq!(j.next_seq(), 5);
    }

    #[test]
    fn a_journal_of_the_first_layout_is_converted_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let acme = TenantId("acme".into());
        // As the first layout left it: records 2 and 3 held, the totals
        // counting all three records appended, no format key.
        {
            let db = sled::Config::new().path(dir.path()).open().unwrap();
            let tree = db.open_tree(TREE).unwrap();
            tree.insert(KEY_AGENT, agent().0.as_bytes()).unwrap();
            tree.insert(KEY_NEXT_SEQ, &4u64.to_be_bytes()[..]).unwrap();
            for seq in 2..=3 {
                let mut r = rec(seq * 10);
                r.seq = seq;
                tree.insert(record_key(seq), encode_record(&r).unwrap())
                    .unwrap();
            }
            let all = TenantTotals {
                invocations: 3,
                compute_milli_gpu_ms: 60,
                memory_mib_ms: 180,
                records: 3,
            };
            tree.insert(totals_key(&acme), encode_totals(&all).unwrap())
                .unwrap();
            db.flush().unwrap();
        }
        for _ in 0..2 {
            let j = UsageJournal::open(dir.path(), agent()).unwrap();
            assert_eq!(j.totals(&acme).unwrap().compute_milli_gpu_ms, 60);
            assert_eq!(j.totals(&acme).unwrap().records, 3);
            assert_eq!(j.next_seq(), 4);
            assert_eq!(j.pending(), 2);
        }
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        let b = j.batch_after(0, 10).unwrap().unwrap();
        j.ack(&b).unwrap();
        drop(j);
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        assert_eq!(j.totals(&acme).unwrap().compute_milli_gpu_ms, 60);
        assert_eq!(j.next_seq(), 4);
    }

    #[test]
    fn batches_are_capped() {
        let dir = tempfile::tempdir().unwrap();
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        j.append((0..(MAX_USAGE_BATCH as u64 + 5)).map(rec).collect())
            .unwrap();
        let b = j.batch_after(0, usize::MAX).unwrap().unwrap();
        assert_eq!(b.records.len(), MAX_USAGE_BATCH);
        let b = j.batch_after(0, 0).unwrap().unwrap();
        assert_eq!(b.records.len(), 1);
    }

    #[test]
    fn another_agents_journal_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(UsageJournal::open(dir.path(), agent()).unwrap());
        let err = UsageJournal::open(dir.path(), AgentId("agent-b".into())).unwrap_err();
        assert!(matches!(err, JournalError::AgentMismatch { .. }), "{err}");
    }

    #[test]
    fn reconcile_drops_applied_and_jumps_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        j.append((1..=4).map(rec).collect()).unwrap();
        // The region applied 1..=2 (the ack was lost).
        let r = j.reconcile(3).unwrap();
        assert_eq!(
            r,
            Reconciled {
                removed: 2,
                advanced: false
            }
        );
        assert_eq!(j.batch_after(0, 10).unwrap().unwrap().first_seq(), 3);
        // The region knows more than this journal (it was wiped): jump.
        let r = j.reconcile(100).unwrap();
        assert_eq!(
            r,
            Reconciled {
                removed: 2,
                advanced: true
            }
        );
        drop(j);
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        assert_eq!(j.next_seq(), 100);
        assert_eq!(j.pending(), 0);
    }

    const CHILD_ENV: &str = "GSHARE_JOURNAL_KILL9_DIR";

    /// Child side of `kill9_loses_no_flushed_record`: appends one record at a
    /// time and prints each number once `append` returned (it is flushed).
    #[test]
    #[ignore = "run as a child process by kill9_loses_no_flushed_record"]
    fn kill9_child_writer() {
        let dir = std::env::var(CHILD_ENV).expect("child needs its directory");
        let j = UsageJournal::open(Path::new(&dir), agent()).unwrap();
        let mut out = std::io::stdout().lock();
        for i in 0..1_000_000u64 {
            let seqs = j.append(vec![rec(i)]).unwrap();
            use std::io::Write;
            writeln!(out, "flushed {}", seqs.start).unwrap();
            out.flush().unwrap();
        }
    }

    #[test]
    fn kill9_loses_no_flushed_record() {
        let dir = disk_dir();
        // Records from before: one acknowledged batch, two pending.
        {
            let j = UsageJournal::open(dir.path(), agent()).unwrap();
            j.append((1..=3).map(rec).collect()).unwrap();
            let b = j.batch_after(0, 1).unwrap().unwrap();
            j.ack(&b).unwrap();
        }
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "journal::tests::kill9_child_writer",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut flushed = Vec::new();
        while flushed.len() < 200 {
            let line = lines
                .next()
                .expect("child ended early")
                .expect("read child stdout");
            if let Some(n) = line.strip_prefix("flushed ") {
                flushed.push(n.parse::<u64>().unwrap());
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Lines the child printed before it died are flushed records too.
        for line in lines.map_while(Result::ok) {
            if let Some(n) = line.strip_prefix("flushed ") {
                if let Ok(n) = n.parse::<u64>() {
                    flushed.push(n);
                }
            }
        }
        let j = UsageJournal::open(dir.path(), agent()).unwrap();
        let mut held = Vec::new();
        let mut after = 0;
        while let Some(b) = j.batch_after(after, 1000).unwrap() {
            after = b.last_seq();
            held.extend(b.records.iter().map(|r| r.seq));
        }
        assert_eq!(&held[..2], &[2, 3], "older pending records kept");
        for s in &flushed {
            assert!(held.binary_search(s).is_ok(), "flushed record {s} lost");
        }
        assert!(held.windows(2).all(|w| w[1] == w[0] + 1), "no holes");
        assert!(j.next_seq() > *flushed.last().unwrap());
        assert_eq!(j.next_seq(), held.last().unwrap() + 1);
        // The totals were written with the records: exactly their sum.
        let k = j.next_seq() - 4; // records the child appended: rec(0)..rec(k-1)
        let t = j.totals(&TenantId("acme".into())).unwrap();
        assert_eq!(
            t,
            TenantTotals {
                invocations: 3 + k,
                compute_milli_gpu_ms: 6 + k * (k - 1) / 2,
                memory_mib_ms: 3 * (6 + k * (k - 1) / 2),
                records: 3 + k,
            }
        );
    }
}
