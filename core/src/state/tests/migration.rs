//! Make-before-break migrations: `InstanceMigrate` places the new side
//! beside the old (fit and quota count both, `max_instances` counts once),
//! a release of either side ends it, refusals change nothing, and
//! `migration_steps` completes a ready one and gives up a late one.

use super::*;
use crate::state::{
    give_up_after, migration_steps, note_migrations_seen, plan_move, plan_returns, MigrationCause,
    MigrationStep, MoveError, MoveTarget,
};

fn slice(node: &str, index: u32, compute_milli: u32, memory_mib: u64) -> Slice {
    Slice {
        gpu: gpu(node, index),
        compute_milli,
        memory_mib,
    }
}

fn place_at(s: &mut RegionState, tenant: &str, name: &str, sl: Slice) -> InstanceId {
    let cmd = DomainCommand::InstancePlace {
        tenant: t(tenant),
        function: name.into(),
        slices: vec![sl],
    };
    match ok(s, cmd) {
        Applied::InstancePlaced { instance, .. } => instance,
        other => panic!("{other:?}"),
    }
}

fn migrate(instance: InstanceId, sl: Slice, cause: MigrationCause) -> DomainCommand {
    DomainCommand::InstanceMigrate {
        instance,
        slices: vec![sl],
        cause,
    }
}

/// acme/f (guaranteed, 250 milli, 4 GiB, max 1) on c1.
fn one_on_c1() -> (RegionState, InstanceId) {
    let mut s = region();
    let mut f = spec("acme", "f", Tier::Guaranteed, 250, 4_096);
    f.max_instances = 1;
    deploy(&mut s, f);
    let old = place_at(&mut s, "acme", "f", slice("c1", 0, 250, 4_096));
    (s, old)
}

#[test]
fn a_migration_holds_both_sides_and_counts_the_function_once() {
    let (mut s, old) = one_on_c1();
    let held_before = s.held(&t("acme"), PoolKind::Center);
    let new = match ok(
        &mut s,
        migrate(old, slice("c2", 1, 250, 4_096), MigrationCause::Return),
    ) {
        Applied::InstanceMigrating {
            from,
            instance,
            slices,
        } => {
            assert_eq!(from, old);
            assert_eq!(slices, vec![slice("c2", 1, 250, 4_096)]);
            instance
        }
        other => panic!("{other:?}"),
    };
    // Both serve and hold their slices; max_instances = 1 counts them once.
    assert_eq!(s.instances_of(&t("acme"), "f").count(), 2);
    assert_eq!(s.instance_count(&t("acme"), "f"), 1);
    assert!(s.migrating(&t("acme"), "f"));
    assert_eq!(s.migration_of(old).map(|m| m.to), Some(new));
    assert_eq!(s.migration_of(new).map(|m| m.from), Some(old));
    let held = s.held(&t("acme"), PoolKind::Center);
    assert_eq!(held.instances, held_before.instances + 1);
    assert_eq!(held.compute_milli, held_before.compute_milli + 250);
    assert_eq!(
        s.node_load(&NodeId("c2".into())).unwrap().gpus[1]
            .load
            .resident_mib,
        4_096
    );
    // No second placement on the count: max_instances still holds.
    assert_eq!(
        refused(
            &mut s,
            DomainCommand::InstancePlace {
                tenant: t("acme"),
                function: "f".into(),
                slices: vec![slice("c2", 0, 250, 4_096)],
            }
        )
        .code(),
        "max_instances"
    );
    // The old one released: the migration is done, the new one stays.
    ok(&mut s, DomainCommand::InstanceRelease { instance: old });
    assert_eq!(s.migrations().count(), 0);
    assert!(!s.migrating(&t("acme"), "f"));
    let left: Vec<_> = s.instances_of(&t("acme"), "f").map(|i| i.id).collect();
    assert_eq!(left, vec![new]);
    assert_eq!(s.instance_count(&t("acme"), "f"), 1);
    assert!(
        !s.operator_placed(new),
        "a return is not an operator's move"
    );
}

#[test]
fn releasing_the_new_side_gives_the_migration_up_and_keeps_the_old() {
    let (mut s, old) = one_on_c1();
    let Applied::InstanceMigrating { instance: new, .. } = ok(
        &mut s,
        migrate(old, slice("c2", 0, 250, 4_096), MigrationCause::Operator),
    ) else {
        panic!()
    };
    assert!(s.operator_placed(new));
    ok(&mut s, DomainCommand::InstanceRelease { instance: new });
    assert_eq!(s.migrations().count(), 0);
    assert!(!s.operator_placed(new));
    let left: Vec<_> = s.instances_of(&t("acme"), "f").map(|i| i.id).collect();
    assert_eq!(left, vec![old]);
}

#[test]
fn an_operator_move_is_remembered_until_the_instance_goes() {
    let (mut s, old) = one_on_c1();
    let Applied::InstanceMigrating { instance: new, .. } = ok(
        &mut s,
        migrate(old, slice("c2", 0, 250, 4_096), MigrationCause::Operator),
    ) else {
        panic!()
    };
    ok(&mut s, DomainCommand::InstanceRelease { instance: old });
    assert!(s.operator_placed(new));
    // It survives a snapshot.
    let config = bincode::config::standard();
    let bytes = bincode::serde::encode_to_vec(&s, config).unwrap();
    let (back, _): (RegionState, usize) =
        bincode::serde::decode_from_slice(&bytes, config).unwrap();
    assert_eq!(back, s);
    assert!(back.operator_placed(new));
    ok(
        &mut s,
        DomainCommand::FunctionDelete {
            tenant: t("acme"),
            name: "f".into(),
        },
    );
    assert!(!s.operator_placed(new));
}

#[test]
fn migrations_that_cannot_start_are_refused_and_change_nothing() {
    let (mut s, old) = one_on_c1();
    // On a node it holds: that is a remap.
    let e = refused(
        &mut s,
        migrate(old, slice("c1", 1, 250, 4_096), MigrationCause::Return),
    );
    assert_eq!(e.code(), "migration_conflict", "{e}");
    // Another size than the spec's slice.
    let e = refused(
        &mut s,
        migrate(old, slice("c2", 0, 500, 4_096), MigrationCause::Return),
    );
    assert_eq!(e.code(), "slice_mismatch", "{e}");
    // An unknown instance.
    let e = refused(
        &mut s,
        migrate(
            InstanceId(999),
            slice("c2", 0, 250, 4_096),
            MigrationCause::Return,
        ),
    );
    assert_eq!(e.code(), "unknown_instance", "{e}");
    // A node that takes no placements.
    ok(
        &mut s,
        DomainCommand::NodeDrainSet {
            node: NodeId("c2".into()),
            drain: true,
        },
    );
    let e = refused(
        &mut s,
        migrate(old, slice("c2", 0, 250, 4_096), MigrationCause::Return),
    );
    assert_eq!(e.code(), "node_not_ready", "{e}");
    ok(
        &mut s,
        DomainCommand::NodeDrainSet {
            node: NodeId("c2".into()),
            drain: false,
        },
    );
    // One migration at a time, from either side.
    let Applied::InstanceMigrating { instance: new, .. } = ok(
        &mut s,
        migrate(old, slice("c2", 0, 250, 4_096), MigrationCause::Return),
    ) else {
        panic!()
    };
    for side in [old, new] {
        let e = refused(
            &mut s,
            migrate(side, slice("ea1", 0, 250, 4_096), MigrationCause::Return),
        );
        assert_eq!(e.code(), "migration_conflict", "{e}");
    }
}

#[test]
fn the_quota_counts_both_sides_so_a_full_quota_moves_nothing() {
    let mut s = region();
    // globex may hold 500 milli-GPU at the edge: one 500 instance fills it.
    let mut f = spec("globex", "g", Tier::Guaranteed, 500, 4_096);
    f.pool = PoolPreference::Edge("edge-a".into());
    f.max_instances = 1;
    deploy(&mut s, f);
    let old = place_at(&mut s, "globex", "g", slice("ea1", 0, 500, 4_096));
    let e = refused(
        &mut s,
        migrate(old, slice("eb1", 0, 500, 4_096), MigrationCause::Operator),
    );
    assert_eq!(e.code(), "quota_exceeded", "{e}");
    // The center quota has room: a move there starts.
    ok(
        &mut s,
        migrate(old, slice("c1", 0, 500, 4_096), MigrationCause::Operator),
    );
}

#[test]
fn an_outgoing_instance_is_the_rolls_not_a_migrations() {
    let (mut s, old) = one_on_c1();
    let mut f = s.function(&t("acme"), "f").unwrap().spec.clone();
    f.memory_mib = 2_048; // reshaping: `old` is outgoing
    ok(&mut s, DomainCommand::FunctionUpdate { spec: f });
    let e = refused(
        &mut s,
        migrate(old, slice("c2", 0, 250, 2_048), MigrationCause::Return),
    );
    assert_eq!(e.code(), "migration_conflict", "{e}");
}

/// `one_on_c1`'s instance `old` returning to c2 as `new` (a migration).
fn returning_to_c2() -> (RegionState, InstanceId, InstanceId) {
    let (mut s, old) = one_on_c1();
    let Applied::InstanceMigrating { instance: new, .. } = ok(
        &mut s,
        migrate(old, slice("c2", 0, 250, 4_096), MigrationCause::Return),
    ) else {
        panic!()
    };
    (s, old, new)
}

/// The migration wait these tests pass: longer than twice the predicted
/// cold start of their 4,096 MiB on c2 (0.5 s + 4,096 MiB at 2,000 MiB/s),
/// which a shorter wait gives way to ([`give_up_after`]; tested below).
const WAIT: u64 = 10_000;

#[test]
fn steps_complete_a_ready_migration_and_give_up_a_late_one() {
    let (mut s, old, new) = returning_to_c2();
    let never = |_: &Instance| false;
    let always = |_: &Instance| true;
    assert_eq!(
        migration_steps(&s, &never, T0 + WAIT - 1, WAIT, &BTreeMap::new()),
        vec![]
    );
    assert_eq!(
        migration_steps(&s, &never, T0 + WAIT, WAIT, &BTreeMap::new()),
        vec![MigrationStep::Abort { from: old, to: new }]
    );
    let steps = migration_steps(&s, &always, T0 + 10, WAIT, &BTreeMap::new());
    assert_eq!(steps, vec![MigrationStep::Complete { from: old, to: new }]);
    assert_eq!(steps[0].releases(), old);
    // The new side's node stops taking placements: given up at once.
    ok(
        &mut s,
        DomainCommand::NodeReadySet {
            node: NodeId("c2".into()),
            ready: false,
        },
    );
    assert_eq!(
        migration_steps(&s, &always, T0 + 10, WAIT, &BTreeMap::new()),
        vec![MigrationStep::Abort { from: old, to: new }]
    );
}

/// A new leader whose clock runs ahead of the one that started a
/// migration counts its age from when it first saw the migration: it gives
/// up nothing early (without that, it gave this one up at once).
#[test]
fn a_leader_whose_clock_runs_ahead_ends_no_migration_early() {
    let (mut s, old, new) = returning_to_c2();
    let never = |_: &Instance| false;
    let abort = vec![MigrationStep::Abort { from: old, to: new }];
    // The new leader's clock reads 30 s past the start's stamp at its first look.
    let ahead = T0 + 30_000;
    let mut seen = BTreeMap::new();
    note_migrations_seen(&s, &mut seen, ahead);
    assert_eq!(seen, BTreeMap::from([(new, ahead)]));
    assert_eq!(
        migration_steps(&s, &never, ahead, WAIT, &BTreeMap::new()),
        abort
    );
    assert_eq!(
        migration_steps(&s, &never, ahead + WAIT - 1, WAIT, &seen),
        vec![]
    );
    assert_eq!(
        migration_steps(&s, &never, ahead + WAIT, WAIT, &seen),
        abort
    );
    // The leader that started it (first sight at or before the stamp, its
    // clock behind) ages it from the stamp, as before.
    let behind = BTreeMap::from([(new, T0 - 5_000)]);
    assert_eq!(migration_steps(&s, &never, T0 + WAIT, WAIT, &behind), abort);
    // A later look keeps the first sight; an ended migration is forgotten.
    note_migrations_seen(&s, &mut seen, ahead + 500);
    assert_eq!(seen, BTreeMap::from([(new, ahead)]));
    ok(&mut s, DomainCommand::InstanceRelease { instance: new });
    note_migrations_seen(&s, &mut seen, ahead + 600);
    assert!(seen.is_empty());
}

/// A wait shorter than twice the predicted cold start of the new side's
/// weights on its node gives way to it: a load as slow as predicted is
/// not given up mid-way.
#[test]
fn a_migration_waits_at_least_twice_its_predicted_cold_start() {
    let (s, old, new) = returning_to_c2();
    let never = |_: &Instance| false;
    // 0.5 s + 4,096 MiB at 2,000 MiB/s = 2,548 ms, twice 5,096 ms.
    let to = s.instance(new).unwrap();
    assert_eq!(give_up_after(&s, to, 1_000), 5_096);
    assert_eq!(give_up_after(&s, to, 60_000), 60_000);
    assert_eq!(
        migration_steps(&s, &never, T0 + 5_095, 1_000, &BTreeMap::new()),
        vec![]
    );
    assert_eq!(
        migration_steps(&s, &never, T0 + 5_096, 1_000, &BTreeMap::new()),
        vec![MigrationStep::Abort { from: old, to: new }]
    );
}

#[test]
fn the_migration_entries_are_appended_variants() {
    let config = bincode::config::standard();
    let cmd = migrate(
        InstanceId(7),
        slice("c2", 0, 250, 4_096),
        MigrationCause::Return,
    );
    assert_eq!(bincode::serde::encode_to_vec(&cmd, config).unwrap()[0], 24);
    let e = ApplyError::Migration {
        instance: InstanceId(7),
        reason: "x".into(),
    };
    assert_eq!(bincode::serde::encode_to_vec(&e, config).unwrap()[0], 32);
    let a = Applied::InstanceMigrating {
        from: InstanceId(7),
        instance: InstanceId(8),
        slices: vec![],
    };
    assert_eq!(bincode::serde::encode_to_vec(&a, config).unwrap()[0], 21);
    let end = DomainCommand::MigrationEnd {
        from: InstanceId(7),
        to: InstanceId(8),
        complete: true,
    };
    assert_eq!(bincode::serde::encode_to_vec(&end, config).unwrap()[0], 25);
}

/// acme/f (max 1) on c1/0 migrating to c2/1: (state, old, new).
fn migrating() -> (RegionState, InstanceId, InstanceId) {
    let (mut s, old) = one_on_c1();
    let new = match ok(
        &mut s,
        migrate(old, slice("c2", 1, 250, 4_096), MigrationCause::Return),
    ) {
        Applied::InstanceMigrating { instance, .. } => instance,
        other => panic!("{other:?}"),
    };
    (s, old, new)
}

#[test]
fn a_migration_ends_only_while_it_is_in_progress() {
    // Completed: the old side goes, the new one stays.
    let (mut s, old, new) = migrating();
    let end = |complete| DomainCommand::MigrationEnd {
        from: old,
        to: new,
        complete,
    };
    assert_eq!(
        ok(&mut s, end(true)),
        Applied::InstanceReleased { instance: old }
    );
    assert!(s.instance(new).is_some());
    assert!(!s.migrating(&t("acme"), "f"));
    // Ended already: a second end (or a late give-up) changes nothing,
    // where a plain release of the new side would leave no instance.
    assert_eq!(refused(&mut s, end(false)).code(), "migration_conflict");
    assert_eq!(s.instance_count(&t("acme"), "f"), 1);

    // Given up: the new side goes; ended by another release first, the
    // give-up is refused.
    let (mut s, old, new) = migrating();
    ok(&mut s, DomainCommand::InstanceRelease { instance: new });
    let e = refused(
        &mut s,
        DomainCommand::MigrationEnd {
            from: old,
            to: new,
            complete: true,
        },
    );
    assert_eq!(e.code(), "migration_conflict");
    assert!(s.instance(old).is_some());
    // Wrong pairing.
    let (mut s, old, new) = migrating();
    let e = refused(
        &mut s,
        DomainCommand::MigrationEnd {
            from: new,
            to: old,
            complete: false,
        },
    );
    assert_eq!(e.code(), "migration_conflict");
}

#[test]
fn neither_side_of_a_migration_is_replaced_or_scaled_in() {
    let (mut s, old, new) = migrating();
    for id in [old, new] {
        let e = refused(
            &mut s,
            DomainCommand::InstanceReplace {
                instance: id,
                slices: vec![slice("c2", 0, 250, 4_096)],
            },
        );
        assert_eq!(e.code(), "migration_conflict", "{id}");
        let e = refused(&mut s, DomainCommand::InstanceScaleIn { instance: id });
        assert_eq!(e.code(), "migration_conflict", "{id}");
    }
}

#[test]
fn lowering_max_instances_keeps_a_migration_whole() {
    // acme/f at 2 (max 3): a on c1/0 migrating to c2/1, b on c1/1.
    let mut s = region();
    let mut f = spec("acme", "f", Tier::Guaranteed, 250, 4_096);
    f.max_instances = 3;
    deploy(&mut s, f.clone());
    let a = place_at(&mut s, "acme", "f", slice("c1", 0, 250, 4_096));
    let b = place_at(&mut s, "acme", "f", slice("c1", 1, 250, 4_096));
    let a2 = match ok(
        &mut s,
        migrate(a, slice("c2", 1, 250, 4_096), MigrationCause::Operator),
    ) {
        Applied::InstanceMigrating { instance, .. } => instance,
        other => panic!("{other:?}"),
    };
    // max 2: nothing over it (the migration's sides count once).
    f.max_instances = 2;
    f.deadline_ms = 600;
    match ok(&mut s, DomainCommand::FunctionUpdate { spec: f.clone() }) {
        Applied::FunctionUpdated { released, .. } => assert_eq!(released, vec![]),
        other => panic!("{other:?}"),
    }
    assert!(s.migrating(&t("acme"), "f"));
    // max 1: the one not migrating goes, the migration stays whole.
    f.max_instances = 1;
    match ok(&mut s, DomainCommand::FunctionUpdate { spec: f.clone() }) {
        Applied::FunctionUpdated { released, .. } => assert_eq!(released, vec![b]),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.migration_of(a2).map(|m| m.from), Some(a));
    assert_eq!(s.instance_count(&t("acme"), "f"), 1);
}

fn policy() -> PlacementPolicy<'static> {
    best_fit()
}

/// ea1 (edge-a's one GPU, 16 GiB) holds globex/fill (8 GiB) and acme/big
/// (6 GiB); acme/e (4 GiB, `edge:edge-a`) spilled to edge-b.
fn spilled_to_edge_b() -> (RegionState, InstanceId, InstanceId) {
    let mut s = region();
    let mut fill = spec("globex", "fill", Tier::Guaranteed, 250, 8_192);
    fill.pool = PoolPreference::Edge("edge-a".into());
    deploy(&mut s, fill);
    let filler = place(&mut s, "globex", "fill");
    let mut big = spec("acme", "big", Tier::Guaranteed, 250, 6_144);
    big.pool = PoolPreference::Edge("edge-a".into());
    deploy(&mut s, big);
    place(&mut s, "acme", "big");
    let mut e = spec("acme", "e", Tier::Guaranteed, 250, 4_096);
    e.pool = PoolPreference::Edge("edge-a".into());
    deploy(&mut s, e);
    let spilled = place(&mut s, "acme", "e");
    assert_eq!(s.instance(spilled).unwrap().pool, "edge-b");
    (s, spilled, filler)
}

#[test]
fn a_spilled_instance_returns_once_its_pool_has_room_and_the_function_is_calm() {
    let (mut s, spilled, filler) = spilled_to_edge_b();
    let calm = |_: &TenantId, _: &str| true;
    let busy = |_: &TenantId, _: &str| false;
    assert_eq!(plan_returns(&s, &policy(), &calm, T0, 0, 8), vec![]);
    ok(&mut s, DomainCommand::InstanceRelease { instance: filler });
    let got = plan_returns(&s, &policy(), &calm, T0, 0, 8);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, spilled);
    assert_eq!(got[0].1[0].gpu, gpu("ea1", 0));
    // Too young: a spill does not bounce back at once.
    assert_eq!(plan_returns(&s, &policy(), &calm, T0, 1, 8), vec![]);
    assert_eq!(plan_returns(&s, &policy(), &calm, T0 + 1, 1, 8).len(), 1);
    // Busy (it spilled under load): it stays where it sheds to.
    assert_eq!(plan_returns(&s, &policy(), &busy, T0, 0, 8), vec![]);
    assert_eq!(plan_returns(&s, &policy(), &calm, T0, 0, 0), vec![]);
    // The return itself, then nothing more to return.
    let (id, slices) = got[0].clone();
    ok(
        &mut s,
        DomainCommand::InstanceMigrate {
            instance: id,
            slices,
            cause: MigrationCause::Return,
        },
    );
    assert_eq!(plan_returns(&s, &policy(), &calm, T0, 0, 8), vec![]);
    ok(&mut s, DomainCommand::InstanceRelease { instance: spilled });
    assert_eq!(plan_returns(&s, &policy(), &calm, T0, 0, 8), vec![]);
    let pools: Vec<_> = s
        .instances_of(&t("acme"), "e")
        .map(|i| i.pool.clone())
        .collect();
    assert_eq!(pools, vec!["edge-a".to_string()]);
}

#[test]
fn an_instance_an_operator_moved_is_not_moved_back() {
    let (mut s, spilled, filler) = spilled_to_edge_b();
    ok(&mut s, DomainCommand::InstanceRelease { instance: filler });
    let slices = plan_move(&s, spilled, &MoveTarget::Center, &policy(), T0).unwrap();
    let Applied::InstanceMigrating { instance: new, .. } = ok(
        &mut s,
        DomainCommand::InstanceMigrate {
            instance: spilled,
            slices,
            cause: MigrationCause::Operator,
        },
    ) else {
        panic!()
    };
    ok(&mut s, DomainCommand::InstanceRelease { instance: spilled });
    assert_eq!(s.instance(new).unwrap().pool_kind, PoolKind::Center);
    let calm = |_: &TenantId, _: &str| true;
    assert_eq!(plan_returns(&s, &policy(), &calm, T0, 0, 8), vec![]);
}

#[test]
fn moves_plan_inside_their_target_or_say_why_not() {
    let (s, spilled, _) = spilled_to_edge_b();
    let topo = s.topology().unwrap().clone();
    // Pool full: the planner's best place is elsewhere.
    let e = plan_move(
        &s,
        spilled,
        &MoveTarget::Pool("edge-a".into()),
        &policy(),
        T0,
    )
    .unwrap_err();
    assert!(matches!(e, MoveError::NoRoom { .. }), "{e}");
    assert!(e.to_string().contains("pool edge-a has no room"), "{e}");
    let e = plan_move(
        &s,
        spilled,
        &MoveTarget::Pool("edge-b".into()),
        &policy(),
        T0,
    )
    .unwrap_err();
    assert!(matches!(e, MoveError::AlreadyThere { .. }), "{e}");
    let to_c2 = MoveTarget::Node(NodeId("c2".into()));
    let slices = plan_move(&s, spilled, &to_c2, &policy(), T0).unwrap();
    assert_eq!(slices[0].gpu.node, NodeId("c2".into()));
    let slices = plan_move(&s, spilled, &MoveTarget::Center, &policy(), T0).unwrap();
    assert_eq!(
        topo.pool_of(&slices[0].gpu.node.0).map(|p| p.kind),
        Some(PoolKind::Center)
    );
    assert!(matches!(
        plan_move(&s, InstanceId(999), &MoveTarget::Center, &policy(), T0),
        Err(MoveError::Gone(_))
    ));
    // The words an operator writes.
    assert_eq!(MoveTarget::parse(&topo, "center"), Ok(MoveTarget::Center));
    assert_eq!(
        MoveTarget::parse(&topo, "edge-a"),
        Ok(MoveTarget::Pool("edge-a".into()))
    );
    assert_eq!(
        MoveTarget::parse(&topo, "pool:dc"),
        Ok(MoveTarget::Pool("dc".into()))
    );
    assert_eq!(
        MoveTarget::parse(&topo, "c1"),
        Ok(MoveTarget::Node(NodeId("c1".into())))
    );
    assert_eq!(
        MoveTarget::parse(&topo, "node:ea1"),
        Ok(MoveTarget::Node(NodeId("ea1".into())))
    );
    for bad in ["nope", "node:dc", "pool:c1", ""] {
        assert!(MoveTarget::parse(&topo, bad).is_err(), "{bad}");
    }
}
