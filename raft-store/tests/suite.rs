//! openraft's storage conformance suite against the sled store.

use gshare_raft_store::{SledLogStore, SledStateMachine, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;

struct TempStore;

impl StoreBuilder<TypeConfig, SledLogStore, SledStateMachine, tempfile::TempDir> for TempStore {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, SledLogStore, SledStateMachine), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let (log, sm) = gshare_raft_store::open(dir.path()).expect("open store");
        Ok((dir, log, sm))
    }
}

#[test]
fn sled_store_passes_openraft_suite() {
    if let Err(e) = Suite::test_all(TempStore) {
        panic!("openraft storage suite failed: {e}");
    }
}

/// The simulation's store (`gshare_raft_store::mem`), so that what the
/// deterministic simulation runs on keeps openraft's contract too.
struct SimDisk;

impl
    StoreBuilder<
        TypeConfig,
        gshare_raft_store::mem::MemLogStore,
        gshare_raft_store::StateMachine<gshare_raft_store::mem::MemSnapshots>,
        (),
    > for SimDisk
{
    async fn build(
        &self,
    ) -> Result<
        (
            (),
            gshare_raft_store::mem::MemLogStore,
            gshare_raft_store::StateMachine<gshare_raft_store::mem::MemSnapshots>,
        ),
        StorageError<u64>,
    > {
        let disk = gshare_raft_store::mem::MemDisk::new(std::time::Duration::from_micros(50));
        let (log, sm) = disk.open().expect("open store");
        Ok(((), log, sm))
    }
}

#[test]
fn simulated_disk_store_passes_openraft_suite() {
    if let Err(e) = Suite::test_all(SimDisk) {
        panic!("openraft storage suite failed: {e}");
    }
}
