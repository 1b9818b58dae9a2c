//! The Raft log, vote and committed id in sled.
//!
//! `append` writes the entries into the `logs` tree and hands the flush
//! callback to a group-commit task: the task waits for every callback queued
//! so far, runs one `flush_async` (an fsync of everything written before it)
//! and only then reports the entries durable to openraft, in order.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote,
};
use tokio::sync::mpsc;

use crate::{decode, encode, StoreError, TypeConfig};

type StoreResult<T> = Result<T, StorageError<u64>>;

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";

/// openraft's log storage on sled.
#[derive(Debug)]
pub struct SledLogStore {
    db: sled::Db,
    logs: sled::Tree,
    meta: sled::Tree,
    flusher: Option<mpsc::UnboundedSender<LogFlushed<TypeConfig>>>,
}

/// A read-only view of the log, handed to openraft's replication tasks.
#[derive(Debug, Clone)]
pub struct SledLogReader {
    logs: sled::Tree,
}

impl SledLogStore {
    pub(crate) fn new(db: sled::Db) -> Result<Self, StoreError> {
        let logs = db.open_tree("logs").map_err(|source| StoreError::Tree {
            tree: "logs",
            source,
        })?;
        let meta = db.open_tree("meta").map_err(|source| StoreError::Tree {
            tree: "meta",
            source,
        })?;
        Ok(SledLogStore {
            db,
            logs,
            meta,
            flusher: None,
        })
    }

    fn read_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
    ) -> Result<Option<T>, StorageIOError<u64>> {
        match self
            .meta
            .get(key)
            .map_err(|e| StorageIOError::read(AnyError::new(&e)))?
        {
            None => Ok(None),
            Some(bytes) => decode(&bytes)
                .map(Some)
                .map_err(|e| StorageIOError::read(AnyError::new(&e))),
        }
    }

    fn write_meta<T: serde::Serialize>(
        &self,
        key: &[u8],
        value: &T,
    ) -> Result<(), StorageIOError<u64>> {
        let bytes = encode(value).map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        self.meta
            .insert(key, bytes)
            .map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        Ok(())
    }

    async fn flush(&self) -> Result<(), StorageIOError<u64>> {
        self.db
            .flush_async()
            .await
            .map(|_| ())
            .map_err(|e| StorageIOError::write(AnyError::new(&e)))
    }

    fn flusher(&mut self) -> &mpsc::UnboundedSender<LogFlushed<TypeConfig>> {
        let db = self.db.clone();
        self.flusher.get_or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(group_commit(db, rx));
            tx
        })
    }
}

/// Fsyncs once for every callback queued so far, then reports them in order.
async fn group_commit(db: sled::Db, mut rx: mpsc::UnboundedReceiver<LogFlushed<TypeConfig>>) {
    let mut waiting = Vec::new();
    while let Some(first) = rx.recv().await {
        waiting.push(first);
        while let Ok(next) = rx.try_recv() {
            waiting.push(next);
        }
        let result = db.flush_async().await;
        for callback in waiting.drain(..) {
            let r = match &result {
                Ok(_) => Ok(()),
                Err(e) => Err(io::Error::other(e.to_string())),
            };
            callback.log_io_completed(r);
        }
    }
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn read_range<RB: RangeBounds<u64>>(
    logs: &sled::Tree,
    range: RB,
) -> StoreResult<Vec<Entry<TypeConfig>>> {
    let start = match range.start_bound() {
        Bound::Included(i) => Bound::Included(index_key(*i)),
        Bound::Excluded(i) => Bound::Excluded(index_key(*i)),
        Bound::Unbounded => Bound::Unbounded,
    };
    let end = match range.end_bound() {
        Bound::Included(i) => Bound::Included(index_key(*i)),
        Bound::Excluded(i) => Bound::Excluded(index_key(*i)),
        Bound::Unbounded => Bound::Unbounded,
    };
    let mut out = Vec::new();
    for item in logs.range::<[u8; 8], _>((start, end)) {
        let (_, bytes) = item.map_err(|e| StorageIOError::read_logs(AnyError::new(&e)))?;
        let entry: Entry<TypeConfig> =
            decode(&bytes).map_err(|e| StorageIOError::read_logs(AnyError::new(&e)))?;
        out.push(entry);
    }
    Ok(out)
}

impl RaftLogReader<TypeConfig> for SledLogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        read_range(&self.logs, range)
    }
}

impl RaftLogReader<TypeConfig> for SledLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        read_range(&self.logs, range)
    }
}

impl RaftLogStorage<TypeConfig> for SledLogStore {
    type LogReader = SledLogReader;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        let last_purged_log_id: Option<LogId<u64>> = self.read_meta(LAST_PURGED)?;
        let last = match self
            .logs
            .last()
            .map_err(|e| StorageIOError::read_logs(AnyError::new(&e)))?
        {
            None => None,
            Some((_, bytes)) => {
                let entry: Entry<TypeConfig> =
                    decode(&bytes).map_err(|e| StorageIOError::read_logs(AnyError::new(&e)))?;
                Some(entry.log_id)
            }
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id: last.or(last_purged_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        SledLogReader {
            logs: self.logs.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> StoreResult<()> {
        self.write_meta(VOTE, vote)
            .map_err(|e| StorageIOError::write_vote(AnyError::new(&e)))?;
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_vote(AnyError::new(&e)))?;
        Ok(())
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<u64>>> {
        Ok(self
            .read_meta(VOTE)
            .map_err(|e| StorageIOError::read_vote(AnyError::new(&e)))?)
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> StoreResult<()> {
        // Not flushed here: a committed id read back lower than the truth is
        // safe (openraft re-learns it); the next log flush persists it.
        self.write_meta(COMMITTED, &committed)?;
        Ok(())
    }

    async fn read_committed(&mut self) -> StoreResult<Option<LogId<u64>>> {
        Ok(self.read_meta::<Option<LogId<u64>>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for entry in entries {
            let bytes = encode(&entry)
                .map_err(|e| StorageIOError::write_log_entry(entry.log_id, AnyError::new(&e)))?;
            batch.insert(&index_key(entry.log_id.index), bytes);
        }
        self.logs
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(AnyError::new(&e)))?;
        if self.flusher().send(callback).is_err() {
            // The group-commit task is gone (runtime shutting down): flush here.
            return Err(StorageIOError::write_logs(AnyError::error("log flusher stopped")).into());
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> StoreResult<()> {
        let keys: Vec<sled::IVec> = self
            .logs
            .range(index_key(log_id.index)..)
            .keys()
            .collect::<Result<_, _>>()
            .map_err(|e| StorageIOError::write_logs(AnyError::new(&e)))?;
        let mut batch = sled::Batch::default();
        for k in keys {
            batch.remove(k);
        }
        self.logs
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(AnyError::new(&e)))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> StoreResult<()> {
        self.write_meta(LAST_PURGED, &log_id)?;
        self.flush().await?;
        let keys: Vec<sled::IVec> = self
            .logs
            .range(..=index_key(log_id.index))
            .keys()
            .collect::<Result<_, _>>()
            .map_err(|e| StorageIOError::write_logs(AnyError::new(&e)))?;
        let mut batch = sled::Batch::default();
        for k in keys {
            batch.remove(k);
        }
        self.logs
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(AnyError::new(&e)))?;
        Ok(())
    }
}
