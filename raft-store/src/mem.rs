//! A simulated disk for the deterministic simulation (`tests/src/sim`):
//! openraft's log storage on it, and the state machine's snapshots.
//!
//! The disk keeps two copies of everything: what the process sees (written)
//! and what survives a crash (flushed). A flush takes the disk's fsync
//! latency of simulated time and makes durable what was written before it
//! started; [`MemDisk::crash`] throws away what was not flushed (all of it,
//! or all but a prefix that a background flush took) and fences
//! the stores of the crashed process (their later writes fail). Appends are
//! reported durable to openraft only after their flush, as in
//! [`crate::SledLogStore`], whose own code (sled, its group commit) this
//! module does not exercise: that is covered by the storage suite
//! (`tests/suite.rs`), the reopen tests and the nemesis suite's kill -9.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote,
};

use crate::state_machine::{SnapshotStore, StoredSnapshot};
use crate::{StateMachine, StoreError, TypeConfig};

type StoreResult<T> = Result<T, StorageError<u64>>;

/// The contents of a disk.
#[derive(Debug, Clone, Default)]
struct Contents {
    vote: Option<Vote<u64>>,
    committed: Option<LogId<u64>>,
    last_purged: Option<LogId<u64>>,
    logs: BTreeMap<u64, Entry<TypeConfig>>,
    snapshot: Option<StoredSnapshot>,
}

/// One write, kept until a flush makes it durable.
#[derive(Debug, Clone)]
enum Write {
    Vote(Vote<u64>),
    Committed(Option<LogId<u64>>),
    Purged(LogId<u64>),
    Put(Entry<TypeConfig>),
    /// Removes every entry with an index ≥ this.
    TruncateFrom(u64),
    /// Removes every entry with an index ≤ this.
    PurgeTo(u64),
    Snapshot(StoredSnapshot),
}

impl Contents {
    fn apply(&mut self, w: Write) {
        match w {
            Write::Vote(v) => self.vote = Some(v),
            Write::Committed(c) => self.committed = c,
            Write::Purged(p) => self.last_purged = Some(p),
            Write::Put(e) => {
                self.logs.insert(e.log_id.index, e);
            }
            Write::TruncateFrom(i) => {
                self.logs.split_off(&i);
            }
            Write::PurgeTo(i) => {
                self.logs = self.logs.split_off(&(i + 1));
            }
            Write::Snapshot(s) => self.snapshot = Some(s),
        }
    }
}

#[derive(Debug, Default)]
struct DiskState {
    /// What the running process sees.
    written: Contents,
    /// What survives a crash.
    flushed: Contents,
    /// Writes not yet durable, in order; `flushed` plus these is `written`.
    unflushed: std::collections::VecDeque<Write>,
    /// Writes issued so far, and made durable so far (positions in one
    /// sequence: `unflushed` holds the ones in between).
    issued: u64,
    durable: u64,
    /// Raised by each crash; a store opened before it is fenced.
    epoch: u64,
    /// Crashes so far, flushes completed, and writes crashes threw away
    /// (for the report).
    crashes: u64,
    flushes: u64,
    lost: u64,
}

/// A simulated disk shared by one replica's stores; it outlives a crash.
#[derive(Debug, Clone)]
pub struct MemDisk {
    state: Arc<Mutex<DiskState>>,
    fsync: Duration,
}

/// A fenced handle: it works while the disk has not crashed since it opened.
#[derive(Debug, Clone)]
struct Handle {
    disk: MemDisk,
    epoch: u64,
}

fn fenced() -> StorageIOError<u64> {
    StorageIOError::write(AnyError::error("the simulated process crashed"))
}

impl MemDisk {
    /// An empty disk whose fsync takes `fsync` of (simulated) time.
    pub fn new(fsync: Duration) -> MemDisk {
        MemDisk {
            state: Arc::new(Mutex::new(DiskState::default())),
            fsync,
        }
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes issued and not yet durable.
    pub fn unflushed(&self) -> usize {
        self.lock().unflushed.len()
    }

    /// The process crashed: of the writes not flushed, the first `keep`
    /// reached the disk anyway (a background flush, as sled's, may have
    /// taken any prefix of them) and the rest are lost; the stores it had
    /// open fail from now on.
    pub fn crash(&self, keep: usize) {
        let mut st = self.lock();
        let keep = keep.min(st.unflushed.len());
        let kept: Vec<Write> = st.unflushed.drain(..keep).collect();
        for w in kept {
            st.flushed.apply(w);
        }
        st.lost += st.unflushed.len() as u64;
        st.written = st.flushed.clone();
        st.unflushed.clear();
        st.durable = st.issued;
        st.epoch += 1;
        st.crashes += 1;
    }

    /// Writes thrown away by crashes so far.
    pub fn lost_writes(&self) -> u64 {
        self.lock().lost
    }

    /// Flushes completed so far.
    pub fn flushes(&self) -> u64 {
        self.lock().flushes
    }

    /// Opens the log store and the state machine on this disk, as a process
    /// starting on it would.
    pub fn open(&self) -> Result<(MemLogStore, StateMachine<MemSnapshots>), StoreError> {
        let h = Handle {
            disk: self.clone(),
            epoch: self.lock().epoch,
        };
        let sm = StateMachine::open(MemSnapshots { h: h.clone() })?;
        Ok((MemLogStore { h }, sm))
    }

    /// The last committed log id on disk, as it survives a crash.
    pub fn durable_committed(&self) -> Option<LogId<u64>> {
        self.lock().flushed.committed
    }

    /// The log ids that survive a crash now.
    pub fn durable_log_ids(&self) -> Vec<LogId<u64>> {
        self.lock()
            .flushed
            .logs
            .values()
            .map(|e| e.log_id)
            .collect()
    }
}

impl Handle {
    fn with<T>(&self, f: impl FnOnce(&mut DiskState) -> T) -> Result<T, StorageIOError<u64>> {
        let mut st = self.disk.lock();
        if st.epoch != self.epoch {
            return Err(fenced());
        }
        Ok(f(&mut st))
    }

    fn write(&self, w: Write) -> Result<(), StorageIOError<u64>> {
        self.with(|st| {
            st.written.apply(w.clone());
            st.unflushed.push_back(w);
            st.issued += 1;
        })
    }

    /// Waits the fsync latency, then makes durable what was written before
    /// the call.
    async fn flush(&self) -> Result<(), StorageIOError<u64>> {
        let upto = self.with(|st| st.issued)?;
        tokio::time::sleep(self.disk.fsync).await;
        self.with(|st| {
            while st.durable < upto {
                let Some(w) = st.unflushed.pop_front() else {
                    break;
                };
                st.flushed.apply(w);
                st.durable += 1;
            }
            st.flushes += 1;
        })
    }
}

/// openraft's log storage on a [`MemDisk`].
#[derive(Debug)]
pub struct MemLogStore {
    h: Handle,
}

/// A read-only view of the log for openraft's replication tasks.
#[derive(Debug, Clone)]
pub struct MemLogReader {
    h: Handle,
}

fn read_range<RB: RangeBounds<u64>>(h: &Handle, range: RB) -> StoreResult<Vec<Entry<TypeConfig>>> {
    Ok(h.with(|st| {
        st.written
            .logs
            .range(range)
            .map(|(_, e)| e.clone())
            .collect()
    })?)
}

impl RaftLogReader<TypeConfig> for MemLogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        read_range(&self.h, range)
    }
}

impl RaftLogReader<TypeConfig> for MemLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        read_range(&self.h, range)
    }
}

impl RaftLogStorage<TypeConfig> for MemLogStore {
    type LogReader = MemLogReader;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        Ok(self.h.with(|st| {
            let last_purged_log_id = st.written.last_purged;
            let last = st.written.logs.values().next_back().map(|e| e.log_id);
            LogState {
                last_purged_log_id,
                last_log_id: last.or(last_purged_log_id),
            }
        })?)
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        MemLogReader { h: self.h.clone() }
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> StoreResult<()> {
        self.h.write(Write::Vote(*vote))?;
        self.h.flush().await?;
        Ok(())
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<u64>>> {
        Ok(self.h.with(|st| st.written.vote)?)
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> StoreResult<()> {
        // Not flushed, as in the sled store.
        self.h.write(Write::Committed(committed))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> StoreResult<Option<LogId<u64>>> {
        Ok(self.h.with(|st| st.written.committed)?)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        for entry in entries {
            self.h.write(Write::Put(entry))?;
        }
        // Reported durable only after the flush, from a task of its own
        // (openraft goes on while the disk syncs).
        let h = self.h.clone();
        tokio::spawn(async move {
            let r = h
                .flush()
                .await
                .map_err(|e| std::io::Error::other(e.to_string()));
            callback.log_io_completed(r);
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> StoreResult<()> {
        self.h.write(Write::TruncateFrom(log_id.index))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> StoreResult<()> {
        self.h.write(Write::Purged(log_id))?;
        self.h.flush().await?;
        self.h.write(Write::PurgeTo(log_id.index))?;
        Ok(())
    }
}

/// The state machine's snapshot on a [`MemDisk`].
#[derive(Debug, Clone)]
pub struct MemSnapshots {
    h: Handle,
}

impl SnapshotStore for MemSnapshots {
    fn load(&self) -> StoreResult<Option<StoredSnapshot>> {
        Ok(self
            .h
            .with(|st| st.written.snapshot.clone())
            .map_err(|e| StorageIOError::read_snapshot(None, AnyError::new(&e)))?)
    }

    async fn save(&self, snap: &StoredSnapshot) -> StoreResult<()> {
        let current = self.load()?.and_then(|c| c.last_index());
        if crate::state_machine::replaces(current, snap) {
            self.h.write(Write::Snapshot(snap.clone()))?;
        }
        self.h.flush().await?;
        Ok(())
    }
}
