//! What the store persists survives closing and reopening it.

use std::io::Cursor;
use std::time::Duration;

use gshare_core::command::RegionCommand;
use gshare_core::model::TenantId;
use gshare_core::state::DomainCommand;
use gshare_raft_store::{CommandBatch, RegionState, TypeConfig};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, SnapshotMeta, Vote};

fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// A domain write: create tenant `name`.
fn create(name: &str) -> RegionCommand {
    RegionCommand::domain(DomainCommand::TenantCreate {
        tenant: TenantId(name.into()),
        display_name: None,
        quotas: Default::default(),
    })
}

fn put(term: u64, index: u64, key: &str) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(CommandBatch(vec![create(key)])),
    }
}

/// Reopens after the group-commit task (which holds a database handle) ends.
async fn reopen(
    dir: &std::path::Path,
) -> (
    gshare_raft_store::SledLogStore,
    gshare_raft_store::SledStateMachine,
) {
    for _ in 0..100 {
        if let Ok(s) = gshare_raft_store::open(dir) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("store at {} did not reopen", dir.display());
}

#[tokio::test]
async fn log_vote_committed_and_snapshot_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, mut sm) = gshare_raft_store::open(dir.path()).unwrap();
        log.save_vote(&Vote::new_committed(2, 1)).await.unwrap();
        log.blocking_append((1..=5).map(|i| put(2, i, &format!("k{i}"))))
            .await
            .unwrap();
        log.save_committed(Some(log_id(2, 5))).await.unwrap();
        log.purge(log_id(2, 2)).await.unwrap();

        // A snapshot of state holding k1..k3 at index 3.
        let mut region = RegionState::default();
        for i in 1..=3 {
            region.apply(create(&format!("k{i}")));
        }
        let meta = SnapshotMeta {
            last_log_id: Some(log_id(2, 3)),
            last_membership: Default::default(),
            snapshot_id: "snap-3".into(),
        };
        let data = gshare_raft_store::encode(&region).unwrap();
        sm.install_snapshot(&meta, Box::new(Cursor::new(data)))
            .await
            .unwrap();
    }
    let (mut log, mut sm) = reopen(dir.path()).await;
    assert_eq!(
        log.read_vote().await.unwrap(),
        Some(Vote::new_committed(2, 1))
    );
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(2, 5)));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(2, 2)));
    assert_eq!(state.last_log_id, Some(log_id(2, 5)));
    let entries = log.try_get_log_entries(0..10).await.unwrap();
    assert_eq!(
        entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
        vec![3, 4, 5]
    );

    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(2, 3)));
    let st = sm.reader();
    assert_eq!(st.read().region.domain().tenants().count(), 3);
    assert!(st.read().region.domain().tenants().any(|t| t.id.0 == "k3"));
    let snap = sm
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("snapshot kept");
    assert_eq!(snap.meta.snapshot_id, "snap-3");

    // Re-applying the committed tail rebuilds the rest of the state.
    let tail = log.try_get_log_entries(4..=5).await.unwrap();
    sm.apply(tail).await.unwrap();
    assert_eq!(sm.reader().read().region.domain().tenants().count(), 5);
}

/// A log entry and a snapshot as the binary before topologies had a
/// `[placement]` policy wrote them (`tests/fixtures/*_v1.bin`, written by
/// commit 93efe05 from the example topology, a tenant and a function): the
/// entry still decodes and applies, the snapshot still installs and
/// survives a reopen, and both give the same state, with the default
/// policy.
#[tokio::test]
async fn an_older_binarys_log_entry_and_snapshot_still_load() {
    use gshare_core::command::{CommandOutcome, CommandV1};
    use gshare_core::model::RegionPolicy;

    let entry_bytes = include_bytes!("fixtures/log_entry_v1.bin");
    let snapshot_bytes = include_bytes!("fixtures/snapshot_v1.bin");

    let entry: Entry<TypeConfig> = gshare_raft_store::decode(entry_bytes).unwrap();
    assert_eq!(entry.log_id, log_id(3, 7));
    let EntryPayload::Normal(CommandBatch(batch)) = entry.payload else {
        panic!("not a normal entry: {:?}", entry.payload);
    };
    assert_eq!(batch.len(), 3);
    assert!(
        matches!(
            &batch[0],
            RegionCommand::V1(CommandV1::Domain {
                command: DomainCommand::TopologyLoadV1 { .. },
                ..
            })
        ),
        "{:?}",
        batch[0]
    );
    let mut applied = RegionState::default();
    for c in batch {
        let out = applied.apply(c);
        assert!(matches!(out, CommandOutcome::Domain(Ok(_))), "{out:?}");
    }
    assert_eq!(applied.domain().placement_policy(), RegionPolicy::Gshare);
    assert!(applied.domain().topology().is_some());
    assert!(applied
        .domain()
        .function(&TenantId("acme".into()), "rank")
        .is_ok());

    // The current form alone does not read it: the fallback does.
    assert!(gshare_raft_store::decode::<RegionState>(snapshot_bytes).is_err());
    let decoded = RegionState::decode_snapshot(snapshot_bytes).unwrap();
    assert_eq!(decoded, applied);

    let dir = tempfile::tempdir().unwrap();
    {
        let (_log, mut sm) = gshare_raft_store::open(dir.path()).unwrap();
        let meta = SnapshotMeta {
            last_log_id: Some(log_id(3, 7)),
            last_membership: Default::default(),
            snapshot_id: "v1".into(),
        };
        sm.install_snapshot(&meta, Box::new(Cursor::new(snapshot_bytes.to_vec())))
            .await
            .unwrap();
    }
    let (_log, mut sm) = reopen(dir.path()).await;
    let (last, _) = sm.applied_state().await.unwrap();
    assert_eq!(last, Some(log_id(3, 7)));
    assert_eq!(sm.reader().read().region, applied);
}
