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
