//! Deploy-and-place as one command, and idempotency keys: a replay returns
//! the first outcome and changes nothing; a refusal records nothing.

use super::*;

fn slice(node: &str, index: u32, compute_milli: u32, memory_mib: u64) -> Slice {
    Slice {
        gpu: gpu(node, index),
        compute_milli,
        memory_mib,
    }
}

fn create(name: &str, placements: Vec<Vec<Slice>>) -> DomainCommand {
    let mut f = spec("acme", name, Tier::Guaranteed, 400, 3_000);
    f.min_instances = placements.len() as u32;
    DomainCommand::FunctionCreate {
        spec: f,
        placements,
    }
}

fn keyed(key: &str, fingerprint: &str, command: DomainCommand) -> DomainCommand {
    DomainCommand::Keyed {
        tenant: t("acme"),
        key: key.into(),
        fingerprint: fingerprint.into(),
        command: Box::new(command),
    }
}

#[test]
fn a_create_places_every_instance_or_changes_nothing() {
    let mut s = region();
    let two = vec![
        vec![slice("c1", 0, 400, 3_000)],
        vec![slice("c1", 1, 400, 3_000)],
    ];
    match ok(&mut s, create("f", two)) {
        Applied::FunctionCreated {
            version, instances, ..
        } => {
            assert_eq!(version, 1);
            assert_eq!(instances.len(), 2);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.instance_count(&t("acme"), "f"), 2);

    // The second placement cannot be made: neither the deploy nor the first
    // placement may remain, and the next instance id is not consumed.
    let bad = vec![
        vec![slice("c2", 0, 400, 3_000)],
        vec![slice("c9", 0, 400, 3_000)],
    ];
    let e = refused(&mut s, create("g", bad));
    assert_eq!(e.code(), "unknown_node");
    assert!(s.function(&t("acme"), "g").is_err());
    // Over quota (acme's center memory is 32 GiB: 2 × 3,000 held, 9 more × 3,000 is over).
    let many: Vec<Vec<Slice>> = (0..9).map(|i| vec![slice("c2", i % 2, 1, 3_000)]).collect();
    let mut f = spec("acme", "h", Tier::Guaranteed, 1, 3_000);
    f.min_instances = 9;
    f.max_instances = 9;
    let e = refused(
        &mut s,
        DomainCommand::FunctionCreate {
            spec: f,
            placements: many,
        },
    );
    assert!(matches!(e.code(), "quota_exceeded" | "gpu_full"), "{e}");
    // No placements: a plain deploy.
    match ok(&mut s, create("empty", vec![])) {
        Applied::FunctionCreated { instances, .. } => assert!(instances.is_empty()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_keyed_command_applies_once_and_a_replay_returns_the_first_outcome() {
    let mut s = region();
    let cmd = keyed(
        "k1",
        "fp-a",
        create("f", vec![vec![slice("c1", 0, 400, 3_000)]]),
    );
    let first = ok(&mut s, cmd.clone());
    let before = s.clone();
    // The same request again (a retry after a lost answer): same outcome, no change.
    assert_eq!(ok(&mut s, cmd.clone()), first);
    assert_eq!(s, before);
    assert_eq!(s.instance_count(&t("acme"), "f"), 1);
    // The same key for another request is refused and changes nothing.
    let other = keyed("k1", "fp-b", create("g", vec![]));
    assert_eq!(refused(&mut s, other).code(), "idempotency_key_reused");
    // Without a key a second deploy of the name is a conflict (what a
    // retried deploy used to answer).
    assert_eq!(
        refused(&mut s, create("f", vec![])).code(),
        "duplicate_name"
    );

    // A keyed delete: the replay answers as the delete did, not "unknown function".
    let del = keyed(
        "k2",
        "fp-del",
        DomainCommand::FunctionDelete {
            tenant: t("acme"),
            name: "f".into(),
        },
    );
    let deleted = ok(&mut s, del.clone());
    assert!(
        matches!(deleted, Applied::FunctionDeleted { ref released, .. } if released.len() == 1)
    );
    let before = s.clone();
    assert_eq!(ok(&mut s, del), deleted);
    assert_eq!(s, before);

    // Past the window the key is free again.
    let late = DomainCommand::Keyed {
        tenant: t("acme"),
        key: "k1".into(),
        fingerprint: "fp-c".into(),
        command: Box::new(create("late", vec![])),
    };
    let r = s.apply(late, T0 + KEY_WINDOW_MS + 1);
    assert!(matches!(r, Ok(Applied::FunctionCreated { .. })), "{r:?}");
    s.check_invariants().unwrap();
}

#[test]
fn a_refused_keyed_command_records_nothing_and_may_be_retried() {
    let mut s = region();
    let bad = keyed(
        "k",
        "fp",
        create("f", vec![vec![slice("c9", 0, 400, 3_000)]]),
    );
    refused(&mut s, bad);
    assert!(s.idempotency().is_empty());
    // The retry under the same key (the refusal meant nothing happened) applies.
    let good = keyed(
        "k",
        "fp",
        create("f", vec![vec![slice("c1", 0, 400, 3_000)]]),
    );
    assert!(matches!(ok(&mut s, good), Applied::FunctionCreated { .. }));
    assert_eq!(s.idempotency().len(&t("acme")), 1);
}

#[test]
fn keys_are_checked_and_belong_to_the_commands_tenant() {
    let mut s = region();
    for key in ["", "with space", &"k".repeat(MAX_KEY_LEN + 1)] {
        let e = refused(&mut s, keyed(key, "fp", create("f", vec![])));
        assert_eq!(e.code(), "invalid_idempotency_key", "{key:?}");
    }
    // Another tenant's command under acme's key.
    let globex = DomainCommand::FunctionDelete {
        tenant: t("globex"),
        name: "x".into(),
    };
    assert_eq!(
        refused(&mut s, keyed("k", "fp", globex)).code(),
        "invalid_idempotency_key"
    );
    // Only function commands take a key.
    let set = DomainCommand::QuotaSet {
        tenant: t("acme"),
        pool_kind: PoolKind::Center,
        quota: quota(1, 1, 1),
    };
    assert_eq!(
        refused(&mut s, keyed("k", "fp", set)).code(),
        "invalid_idempotency_key"
    );
    let fp = "f".repeat(MAX_FINGERPRINT_LEN + 1);
    assert_eq!(
        refused(&mut s, keyed("k", &fp, create("f", vec![]))).code(),
        "invalid_idempotency_key"
    );
}

#[test]
fn recorded_keys_survive_a_snapshot_round_trip() {
    let mut s = region();
    ok(
        &mut s,
        keyed(
            "k1",
            "fp",
            create("f", vec![vec![slice("c1", 0, 400, 3_000)]]),
        ),
    );
    let config = bincode::config::standard().with_limit::<{ 64 << 20 }>();
    let bytes = bincode::serde::encode_to_vec(&s, config).unwrap();
    let (mut back, _): (RegionState, usize) =
        bincode::serde::decode_from_slice(&bytes, config).unwrap();
    assert_eq!(back, s);
    let json: RegionState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(json, s);
    // The restored state still replays the key.
    let before = back.clone();
    ok(
        &mut back,
        keyed(
            "k1",
            "fp",
            create("f", vec![vec![slice("c1", 0, 400, 3_000)]]),
        ),
    );
    assert_eq!(back, before);
    for c in [
        keyed(
            "k",
            "fp",
            create("f", vec![vec![slice("c1", 0, 400, 3_000)]]),
        ),
        create("g", vec![]),
    ] {
        let b = bincode::serde::encode_to_vec(&c, config).unwrap();
        let (d, _): (DomainCommand, usize) = bincode::serde::decode_from_slice(&b, config).unwrap();
        assert_eq!(d, c);
    }
}
