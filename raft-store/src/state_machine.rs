//! The replicated state machine: [`RegionState`] in memory, snapshots on a
//! [`SnapshotStore`] (sled in a replica, the simulated disk in `mem`).

use std::io::Cursor;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use crate::{decode, encode, BatchOutcome, RegionState, ReplicaNode, StoreError, TypeConfig};

type StoreResult<T> = Result<T, StorageError<u64>>;

const CURRENT: &[u8] = b"current";
/// The index of the last entry the snapshot under [`CURRENT`] covers
/// (u64 big-endian), written with it.
const CURRENT_INDEX: &[u8] = b"current_index";

/// The state machine's applied state: consistent as one unit.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AppliedState {
    /// The last log entry applied.
    pub last_applied: Option<LogId<u64>>,
    /// The last membership applied.
    pub membership: StoredMembership<u64, ReplicaNode>,
    /// The region's data.
    pub region: RegionState,
}

/// A snapshot as kept by a [`SnapshotStore`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredSnapshot {
    meta: SnapshotMeta<u64, ReplicaNode>,
    data: Vec<u8>,
}

/// Where the state machine keeps its current snapshot, durably.
pub trait SnapshotStore: Clone + Send + Sync + 'static {
    /// The current snapshot, if one was saved.
    fn load(&self) -> StoreResult<Option<StoredSnapshot>>;
    /// Replaces the current snapshot, unless the current one covers more
    /// of the log (a build that began before a newer snapshot was
    /// installed must not replace it: the log before that one may be
    /// purged); returns once the current snapshot is durable.
    fn save(
        &self,
        snap: &StoredSnapshot,
    ) -> impl std::future::Future<Output = StoreResult<()>> + Send;
}

/// Whether `new` may replace a snapshot covering the log up to index
/// `current` (`None`: none saved, or saved before the index was kept).
pub(crate) fn replaces(current: Option<u64>, new: &StoredSnapshot) -> bool {
    current.is_none_or(|c| new.last_index().is_some_and(|n| n >= c))
}

impl StoredSnapshot {
    /// The index of the last log entry it covers.
    pub(crate) fn last_index(&self) -> Option<u64> {
        self.meta.last_log_id.map(|l| l.index)
    }
}

/// The `snapshot` tree of a replica's sled database.
#[derive(Debug, Clone)]
pub struct SledSnapshots {
    tree: sled::Tree,
    /// Held from the comparison with the current snapshot to its
    /// replacement (a build and an install may save at once).
    saving: Arc<std::sync::Mutex<()>>,
}

impl SnapshotStore for SledSnapshots {
    fn load(&self) -> StoreResult<Option<StoredSnapshot>> {
        let bytes = self
            .tree
            .get(CURRENT)
            .map_err(|e| StorageIOError::read_snapshot(None, AnyError::new(&e)))?;
        match bytes {
            None => Ok(None),
            Some(b) => Ok(Some(decode(&b).map_err(|e| {
                StorageIOError::read_snapshot(None, AnyError::new(&e))
            })?)),
        }
    }

    async fn save(&self, snap: &StoredSnapshot) -> StoreResult<()> {
        let sig = Some(snap.meta.signature());
        let err = |e: &dyn std::error::Error| {
            StorageIOError::write_snapshot(sig.clone(), AnyError::error(e.to_string()))
        };
        let bytes = encode(snap).map_err(|e| err(&e))?;
        {
            let _one = self.saving.lock().unwrap_or_else(|p| p.into_inner());
            let current = self
                .tree
                .get(CURRENT_INDEX)
                .map_err(|e| err(&e))?
                .and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok())
                .map(u64::from_be_bytes);
            if replaces(current, snap) {
                let mut batch = sled::Batch::default();
                batch.insert(CURRENT, bytes);
                if let Some(i) = snap.last_index() {
                    batch.insert(CURRENT_INDEX, &i.to_be_bytes());
                }
                self.tree.apply_batch(batch).map_err(|e| err(&e))?;
            }
        }
        self.tree
            .flush_async()
            .await
            .map_err(|e| StorageIOError::write_snapshot(sig, AnyError::new(&e)))?;
        Ok(())
    }
}

/// Read access to the applied state for the HTTP API and tests.
#[derive(Debug, Clone)]
pub struct StateReader {
    state: Arc<RwLock<AppliedState>>,
}

impl StateReader {
    /// Locks the applied state for reading; hold it briefly.
    pub fn read(&self) -> RwLockReadGuard<'_, AppliedState> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// openraft's state machine: [`RegionState`] in memory, snapshots in `S`.
#[derive(Debug)]
pub struct StateMachine<S> {
    state: Arc<RwLock<AppliedState>>,
    snapshots: S,
    builds: u64,
}

/// The state machine of a replica: snapshots in sled.
pub type SledStateMachine = StateMachine<SledSnapshots>;

/// Builds a snapshot from a copy of the state taken when openraft asked.
#[derive(Debug)]
pub struct SnapshotBuilder<S> {
    state: Arc<RwLock<AppliedState>>,
    snapshots: S,
    seq: u64,
}

impl SledStateMachine {
    pub(crate) fn new(db: sled::Db) -> Result<Self, StoreError> {
        let tree = db
            .open_tree("snapshot")
            .map_err(|source| StoreError::Tree {
                tree: "snapshot",
                source,
            })?;
        let snapshots = SledSnapshots {
            tree,
            saving: Arc::default(),
        };
        snapshots.keep_index()?;
        StateMachine::open(snapshots)
    }
}

impl SledSnapshots {
    /// Stores the index of the snapshot held, where a store written before
    /// the index was kept lacks it: the first save then compares with it
    /// too (without it, that save replaced whatever was there).
    fn keep_index(&self) -> Result<(), StoreError> {
        let tree = |source| StoreError::Tree {
            tree: "snapshot",
            source,
        };
        if self.tree.get(CURRENT_INDEX).map_err(tree)?.is_some() {
            return Ok(());
        }
        let held = self
            .load()
            .map_err(|e| StoreError::Snapshot(e.to_string()))?;
        if let Some(i) = held.and_then(|s| s.last_index()) {
            self.tree
                .insert(CURRENT_INDEX, &i.to_be_bytes())
                .map_err(tree)?;
            self.tree.flush().map_err(tree)?;
        }
        Ok(())
    }
}

impl<S: SnapshotStore> StateMachine<S> {
    /// Starts from the last snapshot in `snapshots` (openraft re-applies the
    /// committed entries after it).
    pub fn open(snapshots: S) -> Result<Self, StoreError> {
        let mut state = AppliedState::default();
        if let Some(stored) = snapshots
            .load()
            .map_err(|e| StoreError::Snapshot(e.to_string()))?
        {
            state.region = RegionState::decode_snapshot(&stored.data)
                .map_err(|e| StoreError::Snapshot(e.to_string()))?;
            state.last_applied = stored.meta.last_log_id;
            state.membership = stored.meta.last_membership;
        }
        Ok(StateMachine {
            state: Arc::new(RwLock::new(state)),
            snapshots,
            builds: 0,
        })
    }

    /// A handle that reads the applied state.
    pub fn reader(&self) -> StateReader {
        StateReader {
            state: self.state.clone(),
        }
    }
}

impl<S: SnapshotStore> RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder<S> {
    async fn build_snapshot(&mut self) -> StoreResult<Snapshot<TypeConfig>> {
        let (meta, data) = {
            let st = self.state.read().unwrap_or_else(|p| p.into_inner());
            let data = encode(&st.region)
                .map_err(|e| StorageIOError::read_state_machine(AnyError::new(&e)))?;
            let snapshot_id = match st.last_applied {
                Some(l) => format!(
                    "{}-{}-{}-{}",
                    l.leader_id.term, l.leader_id.node_id, l.index, self.seq
                ),
                None => format!("--{}", self.seq),
            };
            let meta = SnapshotMeta {
                last_log_id: st.last_applied,
                last_membership: st.membership.clone(),
                snapshot_id,
            };
            (meta, data)
        };
        let stored = StoredSnapshot { meta, data };
        self.snapshots.save(&stored).await?;
        Ok(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        })
    }
}

impl<S: SnapshotStore> RaftStateMachine<TypeConfig> for StateMachine<S> {
    type SnapshotBuilder = SnapshotBuilder<S>;

    async fn applied_state(
        &mut self,
    ) -> StoreResult<(Option<LogId<u64>>, StoredMembership<u64, ReplicaNode>)> {
        let st = self.state.read().unwrap_or_else(|p| p.into_inner());
        Ok((st.last_applied, st.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StoreResult<Vec<BatchOutcome>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut st = self.state.write().unwrap_or_else(|p| p.into_inner());
        let mut replies = Vec::new();
        for entry in entries {
            st.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => replies.push(BatchOutcome::default()),
                EntryPayload::Normal(batch) => {
                    let outcomes = batch.0.into_iter().map(|c| st.region.apply(c)).collect();
                    replies.push(BatchOutcome(outcomes));
                }
                EntryPayload::Membership(m) => {
                    st.membership = StoredMembership::new(Some(entry.log_id), m);
                    replies.push(BatchOutcome::default());
                }
            }
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.builds += 1;
        SnapshotBuilder {
            state: self.state.clone(),
            snapshots: self.snapshots.clone(),
            seq: self.builds,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StoreResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, ReplicaNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StoreResult<()> {
        let data = snapshot.into_inner();
        let region = RegionState::decode_snapshot(&data).map_err(|e| {
            StorageIOError::read_snapshot(Some(meta.signature()), AnyError::new(&e))
        })?;
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        self.snapshots.save(&stored).await?;
        let mut st = self.state.write().unwrap_or_else(|p| p.into_inner());
        st.region = region;
        st.last_applied = meta.last_log_id;
        st.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StoreResult<Option<Snapshot<TypeConfig>>> {
        Ok(self.snapshots.load()?.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn snapshot(index: u64) -> StoredSnapshot {
        StoredSnapshot {
            meta: SnapshotMeta {
                last_log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), index)),
                last_membership: StoredMembership::default(),
                snapshot_id: format!("s{index}"),
            },
            data: vec![index as u8],
        }
    }

    /// A build that read the state before a newer snapshot was installed
    /// saves after it: the newer one stays (the log before it may be
    /// purged, and a restart from the older one would find entries
    /// missing).
    #[tokio::test]
    async fn an_older_snapshot_never_replaces_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let store = SledSnapshots {
            tree: db.open_tree("snapshot").unwrap(),
            saving: Arc::default(),
        };
        let index = |s: &SledSnapshots| s.load().unwrap().and_then(|c| c.last_index());
        store.save(&snapshot(10)).await.unwrap();
        store.save(&snapshot(5)).await.unwrap();
        assert_eq!(index(&store), Some(10));
        store.save(&snapshot(12)).await.unwrap();
        assert_eq!(index(&store), Some(12));
        store.save(&snapshot(12)).await.unwrap();
        assert_eq!(index(&store), Some(12));
    }

    /// A store written before the index was kept holds a snapshot but no
    /// index: opened, it gets one, so an older build's first save does not
    /// replace the newer snapshot either.
    #[tokio::test]
    async fn a_store_without_the_index_keeps_its_newer_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let tree = db.open_tree("snapshot").unwrap();
        // What a replica saved then: a snapshot of a (here empty) region
        // state applied up to index 10.
        let mut held = snapshot(10);
        held.data = encode(&RegionState::default()).unwrap();
        tree.insert(CURRENT, encode(&held).unwrap()).unwrap();
        let sm = SledStateMachine::new(db.clone()).expect("opens");
        assert_eq!(
            tree.get(CURRENT_INDEX).unwrap().as_deref(),
            Some(&10u64.to_be_bytes()[..])
        );
        sm.snapshots.save(&snapshot(5)).await.unwrap();
        let held = sm.snapshots.load().unwrap().and_then(|c| c.last_index());
        assert_eq!(held, Some(10));
    }
}
