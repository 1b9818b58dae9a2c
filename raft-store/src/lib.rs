//! `gshare-raft-store`: the region's Raft log and state machine on sled.
//!
//! openraft drives two halves, both backed by one sled database per replica:
//!
//! ```text
//!              openraft RaftCore
//!             /                 \
//!   SledLogStore               SledStateMachine
//!   tree "logs":  index → entry   in memory: RegionState + last applied + membership
//!   tree "meta":  vote, committed, last purged      │ build_snapshot: serialize a consistent copy
//!   (append acknowledged only after fsync)          ▼
//!                                  tree "snapshot": the current snapshot (meta + bytes)
//! ```
//!
//! The state machine lives in memory and is made durable by the log and the
//! snapshot: on start it loads the last snapshot and openraft re-applies the
//! committed entries after it (the committed log id is saved too). sled has no
//! snapshot reads, so a snapshot is a serialized copy of the in-memory state
//! taken under its lock, which is consistent with the last applied log id.
//!
//! A log entry carries a [`CommandBatch`]: the leader may put several client
//! commands into one entry, and [`BatchOutcome`] answers each in order.

// openraft fixes the error type of every storage method (`StorageError`, ~224
// bytes); boxing it in private helpers would only move the conversion.
#![allow(clippy::result_large_err)]

mod codec;
mod error;
mod log_store;
pub mod mem;
mod region_state;
mod replica_node;
mod runtime;
mod state_machine;
mod type_config;

pub use codec::{decode, encode, encoded_len, MAX_RECORD_BYTES};
pub use error::StoreError;
pub use log_store::SledLogStore;
pub use region_state::RegionState;
pub use replica_node::ReplicaNode;
pub use runtime::{seed_thread_rng, GshareRuntime, ThreadRng};
pub use state_machine::{
    AppliedState, SledSnapshots, SledStateMachine, SnapshotBuilder, SnapshotStore, StateMachine,
    StateReader, StoredSnapshot,
};
pub use type_config::{BatchOutcome, CommandBatch, TypeConfig};

/// Opens (or creates) the store in `dir` and returns its two halves.
pub fn open(dir: &std::path::Path) -> Result<(SledLogStore, SledStateMachine), StoreError> {
    let db = sled::Config::new()
        .path(dir)
        .mode(sled::Mode::HighThroughput)
        .open()
        .map_err(|source| StoreError::Open {
            path: dir.display().to_string(),
            source,
        })?;
    let log = SledLogStore::new(db.clone())?;
    let sm = SledStateMachine::new(db)?;
    Ok((log, sm))
}
