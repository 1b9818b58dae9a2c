//! Defragmentation across nodes: `plan_defragment` moves at most two
//! burstable or oversubscribed instances of other functions off one GPU,
//! to another node of their pool, when the room for a placement is there
//! only in sum; it waits while such moves are in progress, and never moves
//! a guaranteed or an operator-placed instance.

use super::*;
use crate::state::{
    plan_defragment, plan_placements, DefragPlan, Defragment, MigrationCause, NoDefrag,
    PlacementPolicy, DEFRAG_VICTIM_MIN_AGE_MS,
};

/// When the plans are made: the instances placed at `T0` are old enough
/// to move.
const LATER: u64 = T0 + DEFRAG_VICTIM_MIN_AGE_MS;

fn policy() -> PlacementPolicy<'static> {
    best_fit()
}

/// The region of the other tests plus tenant `big` (quota for anything).
fn roomy() -> RegionState {
    let mut s = region();
    ok(
        &mut s,
        DomainCommand::TenantCreate {
            tenant: t("big"),
            display_name: None,
            quotas: BTreeMap::from([
                (PoolKind::Center, quota(8_000, 262_144, 64)),
                (PoolKind::Edge, quota(2_000, 32_768, 8)),
            ]),
        },
    );
    s
}

/// Deploys `tenant/name` (`tier`, 250 milli, `mib`) and places one
/// instance on `node`'s GPU `index`.
fn put(
    s: &mut RegionState,
    tenant: &str,
    name: &str,
    tier: Tier,
    at: (&str, u32),
    mib: u64,
) -> InstanceId {
    if s.function(&t(tenant), name).is_err() {
        deploy(s, spec(tenant, name, tier, 250, mib));
    }
    let cmd = DomainCommand::InstancePlace {
        tenant: t(tenant),
        function: name.into(),
        slices: vec![Slice {
            gpu: gpu(at.0, at.1),
            compute_milli: 250,
            memory_mib: mib,
        }],
    };
    match ok(s, cmd) {
        Applied::InstancePlaced { instance, .. } => instance,
        other => panic!("{other:?}"),
    }
}

/// acme/b: guaranteed, 250 milli, `mib`, center pools only, deployed
/// without an instance.
fn beneficiary(s: &mut RegionState, mib: u64) -> FunctionSpec {
    let mut b = spec("acme", "b", Tier::Guaranteed, 250, mib);
    b.pool = PoolPreference::CenterOnly;
    deploy(s, b.clone());
    b
}

/// Free GPU memory in the center: c1/0 4 GiB (big/g1 8 GiB guaranteed,
/// globex/s 4 GiB burstable), c1/1 4 GiB, c2/0 and c2/1 6 GiB each.
fn split(s_tier: Tier) -> (RegionState, InstanceId) {
    let mut s = roomy();
    put(&mut s, "big", "g1", Tier::Guaranteed, ("c1", 0), 8_192);
    let victim = put(&mut s, "globex", "s", s_tier, ("c1", 0), 4_096);
    put(&mut s, "big", "g2", Tier::Guaranteed, ("c1", 1), 12_288);
    put(&mut s, "big", "g3", Tier::Guaranteed, ("c2", 0), 10_240);
    put(&mut s, "big", "g3", Tier::Guaranteed, ("c2", 1), 10_240);
    (s, victim)
}

fn the_move(d: Defragment) -> DefragPlan {
    match d {
        Defragment::Move(p) => p,
        other => panic!("expected a move, got {other:?}"),
    }
}

#[test]
fn a_burstable_instance_moves_to_another_node_to_make_room_that_exists_only_in_sum() {
    let (mut s, victim) = split(Tier::Burstable);
    let b = beneficiary(&mut s, 8_192);
    let rejected = plan_placements(&s, &b, 1, &policy(), T0).unwrap_err();
    assert_eq!(rejected.code(), "gpu_full");
    let plan = the_move(plan_defragment(&s, &b, &policy(), LATER));
    assert_eq!(plan.gpu, gpu("c1", 0));
    assert_eq!(plan.pool, "dc");
    assert_eq!(
        (plan.free_mib, plan.largest_free_mib),
        (4_096 + 4_096 + 6_144 + 6_144, 6_144)
    );
    assert_eq!(plan.moves.len(), 1);
    let m = &plan.moves[0];
    assert_eq!(
        (m.instance, m.tier, m.memory_mib),
        (victim, Tier::Burstable, 4_096)
    );
    assert_eq!(m.slices.len(), 1);
    assert_eq!(m.slices[0].gpu.node, NodeId("c2".into()));
    assert_eq!(m.slices[0].memory_mib, 4_096);
    let said = plan.to_string();
    assert!(said.contains("acme/b"), "{said}");
    assert!(said.contains("20480 MiB"), "{said}");
    assert!(said.contains("makes room on c1/gpu0"), "{said}");

    // Started: while the old side is leaving, nothing more moves.
    ok(
        &mut s,
        DomainCommand::InstanceMigrate {
            instance: victim,
            slices: m.slices.clone(),
            cause: MigrationCause::Defragment,
        },
    );
    assert_eq!(
        plan_defragment(&s, &b, &policy(), LATER),
        Defragment::Waiting { gpu: gpu("c1", 0) }
    );
    // Completed: the placement fits on the GPU that was made room on.
    ok(&mut s, DomainCommand::InstanceRelease { instance: victim });
    let placed = plan_placements(&s, &b, 1, &policy(), T0).unwrap();
    assert_eq!(placed.instances[0].slices[0].gpu, gpu("c1", 0));
}

#[test]
fn two_small_instances_move_when_one_is_not_enough_and_three_never() {
    // c1/0: big/g 6 GiB guaranteed + globex/s1 and globex/s2, 3 GiB
    // burstable each (4 GiB free); c1/1 and both GPUs of c2: 8 GiB free.
    let mut s = roomy();
    put(&mut s, "big", "g", Tier::Guaranteed, ("c1", 0), 6_144);
    let s1 = put(&mut s, "globex", "s1", Tier::Burstable, ("c1", 0), 3_072);
    let s2 = put(&mut s, "globex", "s2", Tier::Burstable, ("c1", 0), 3_072);
    put(&mut s, "big", "h", Tier::Guaranteed, ("c1", 1), 8_192);
    put(&mut s, "big", "h", Tier::Guaranteed, ("c2", 0), 8_192);
    put(&mut s, "big", "h", Tier::Guaranteed, ("c2", 1), 8_192);
    let b = beneficiary(&mut s, 10_240);
    let plan = the_move(plan_defragment(&s, &b, &policy(), LATER));
    assert_eq!(plan.gpu, gpu("c1", 0));
    let moved: Vec<InstanceId> = plan.moves.iter().map(|m| m.instance).collect();
    assert_eq!(moved, vec![s1, s2]);
    // Each is planned around the one before it, both off c1: both moves
    // and then the placement apply.
    for m in &plan.moves {
        assert_eq!(m.slices[0].gpu.node, NodeId("c2".into()));
        ok(
            &mut s,
            DomainCommand::InstanceMigrate {
                instance: m.instance,
                slices: m.slices.clone(),
                cause: MigrationCause::Defragment,
            },
        );
    }
    assert_eq!(
        plan_defragment(&s, &b, &policy(), LATER),
        Defragment::Waiting { gpu: gpu("c1", 0) }
    );
    for m in &plan.moves {
        ok(
            &mut s,
            DomainCommand::InstanceRelease {
                instance: m.instance,
            },
        );
    }
    let placed = plan_placements(&s, &b, 1, &policy(), T0).unwrap();
    assert_eq!(placed.instances[0].slices[0].gpu, gpu("c1", 0));

    // One move started, the next evaluation plans only the second.
    let mut s = roomy();
    put(&mut s, "big", "g", Tier::Guaranteed, ("c1", 0), 6_144);
    let s1 = put(&mut s, "globex", "s1", Tier::Burstable, ("c1", 0), 3_072);
    let s2 = put(&mut s, "globex", "s2", Tier::Burstable, ("c1", 0), 3_072);
    put(&mut s, "big", "h", Tier::Guaranteed, ("c1", 1), 8_192);
    put(&mut s, "big", "h", Tier::Guaranteed, ("c2", 0), 8_192);
    put(&mut s, "big", "h", Tier::Guaranteed, ("c2", 1), 8_192);
    let b = beneficiary(&mut s, 10_240);
    let first = the_move(plan_defragment(&s, &b, &policy(), LATER));
    ok(
        &mut s,
        DomainCommand::InstanceMigrate {
            instance: s1,
            slices: first.moves[0].slices.clone(),
            cause: MigrationCause::Defragment,
        },
    );
    let rest = the_move(plan_defragment(&s, &b, &policy(), LATER));
    let moved: Vec<InstanceId> = rest.moves.iter().map(|m| m.instance).collect();
    assert_eq!((rest.gpu.clone(), moved), (gpu("c1", 0), vec![s2]));

    // Three would be needed: c1/0 has 3 GiB free behind three 2 GiB ones.
    let mut s = roomy();
    put(&mut s, "big", "g", Tier::Guaranteed, ("c1", 0), 7_168);
    for name in ["s1", "s2", "s3"] {
        put(&mut s, "globex", name, Tier::Burstable, ("c1", 0), 2_048);
    }
    put(&mut s, "big", "h", Tier::Guaranteed, ("c1", 1), 8_192);
    put(&mut s, "big", "h", Tier::Guaranteed, ("c2", 0), 8_192);
    put(&mut s, "big", "h", Tier::Guaranteed, ("c2", 1), 8_192);
    let b = beneficiary(&mut s, 9_216);
    assert_eq!(
        plan_defragment(&s, &b, &policy(), LATER),
        Defragment::Nothing(NoDefrag::NoMoves)
    );
}

#[test]
fn guaranteed_and_operator_placed_instances_never_move() {
    let (mut s, _) = split(Tier::Guaranteed);
    let b = beneficiary(&mut s, 8_192);
    assert_eq!(
        plan_defragment(&s, &b, &policy(), LATER),
        Defragment::Nothing(NoDefrag::NoMoves)
    );

    // globex/s moved onto c1/0 by an operator stays there.
    let mut s = roomy();
    put(&mut s, "big", "g1", Tier::Guaranteed, ("c1", 0), 8_192);
    let before = put(&mut s, "globex", "s", Tier::Burstable, ("c2", 1), 4_096);
    ok(
        &mut s,
        DomainCommand::InstanceMigrate {
            instance: before,
            slices: vec![Slice {
                gpu: gpu("c1", 0),
                compute_milli: 250,
                memory_mib: 4_096,
            }],
            cause: MigrationCause::Operator,
        },
    );
    ok(&mut s, DomainCommand::InstanceRelease { instance: before });
    put(&mut s, "big", "g2", Tier::Guaranteed, ("c1", 1), 12_288);
    put(&mut s, "big", "g3", Tier::Guaranteed, ("c2", 0), 10_240);
    put(&mut s, "big", "g3", Tier::Guaranteed, ("c2", 1), 10_240);
    let b = beneficiary(&mut s, 8_192);
    assert_eq!(
        plan_defragment(&s, &b, &policy(), LATER),
        Defragment::Nothing(NoDefrag::NoMoves)
    );
}

#[test]
fn a_victim_never_moves_within_its_node_and_a_full_pool_is_not_fragmented() {
    // c1/1 has room for globex/s, c2 has none: moving s within c1 would
    // be no migration (apply refuses one on the same node).
    let mut s = roomy();
    put(&mut s, "big", "g1", Tier::Guaranteed, ("c1", 0), 8_192);
    put(&mut s, "globex", "s", Tier::Burstable, ("c1", 0), 4_096);
    put(&mut s, "big", "g2", Tier::Guaranteed, ("c1", 1), 10_240);
    put(&mut s, "big", "g3", Tier::Guaranteed, ("c2", 0), 13_312);
    put(&mut s, "big", "g3", Tier::Guaranteed, ("c2", 1), 13_312);
    let b = beneficiary(&mut s, 8_192);
    assert_eq!(
        plan_defragment(&s, &b, &policy(), LATER),
        Defragment::Nothing(NoDefrag::NoMoves)
    );
    // 4 + 6 + 3 + 3 GiB free: a 20 GiB instance needs no defragmentation,
    // the pool is full for it (and no GPU is that large anyway).
    let huge = FunctionSpec {
        memory_mib: 16_384 + 4_096,
        name: "huge".into(),
        ..b
    };
    assert_eq!(
        plan_defragment(&s, &huge, &policy(), LATER),
        Defragment::Nothing(NoDefrag::Full {
            free_mib: 16_384,
            free_compute_milli: 4 * (1_000 - 250),
        })
    );
}

#[test]
fn a_victim_placed_or_moved_lately_stays() {
    let (mut s, _) = split(Tier::Burstable);
    let b = beneficiary(&mut s, 8_192);
    assert_eq!(
        plan_defragment(&s, &b, &policy(), LATER - 1),
        Defragment::Nothing(NoDefrag::NoMoves)
    );
    assert!(matches!(
        plan_defragment(&s, &b, &policy(), LATER),
        Defragment::Move(_)
    ));
}

#[test]
fn a_victim_in_a_pool_of_one_node_stays() {
    // Every GPU has 6 GiB free; ea1 would have 10 without globex/x, but
    // edge-a has no other node to take it.
    let mut s = roomy();
    for (name, at) in [
        ("c10", ("c1", 0)),
        ("c11", ("c1", 1)),
        ("c20", ("c2", 0)),
        ("c21", ("c2", 1)),
    ] {
        put(&mut s, "big", name, Tier::Guaranteed, at, 10_240);
    }
    put(&mut s, "big", "e1", Tier::Guaranteed, ("ea1", 0), 6_144);
    put(&mut s, "globex", "x", Tier::Burstable, ("ea1", 0), 4_096);
    put(&mut s, "big", "e2", Tier::Guaranteed, ("eb1", 0), 10_240);
    let b = spec("acme", "b", Tier::Guaranteed, 250, 8_192);
    deploy(&mut s, b.clone());
    assert_eq!(
        plan_placements(&s, &b, 1, &policy(), LATER)
            .unwrap_err()
            .code(),
        "gpu_full"
    );
    assert_eq!(
        plan_defragment(&s, &b, &policy(), LATER),
        Defragment::Nothing(NoDefrag::NoMoves)
    );
}

#[test]
fn victims_never_go_to_a_node_another_defragmentation_clears() {
    // c1/0 is being cleared (globex/s1 leaving it, cause defragment, to
    // c2/1); acme/b2 (8 GiB) would fit c2/0 without globex/t, and t's only
    // place off c2 is c1/1.
    let setup = |cause| {
        let mut s = roomy();
        put(&mut s, "big", "g", Tier::Guaranteed, ("c1", 0), 6_144);
        let s1 = put(&mut s, "globex", "s1", Tier::Burstable, ("c1", 0), 3_072);
        put(&mut s, "big", "s2", Tier::Guaranteed, ("c1", 0), 3_072);
        put(&mut s, "big", "h", Tier::Guaranteed, ("c1", 1), 11_264);
        put(&mut s, "big", "k", Tier::Guaranteed, ("c2", 0), 8_192);
        let t_ = put(&mut s, "globex", "t", Tier::Burstable, ("c2", 0), 4_096);
        put(&mut s, "big", "m", Tier::Guaranteed, ("c2", 1), 12_288);
        ok(
            &mut s,
            DomainCommand::InstanceMigrate {
                instance: s1,
                slices: vec![Slice {
                    gpu: gpu("c2", 1),
                    compute_milli: 250,
                    memory_mib: 3_072,
                }],
                cause,
            },
        );
        let mut b2 = spec("acme", "b2", Tier::Guaranteed, 250, 8_192);
        b2.pool = PoolPreference::CenterOnly;
        deploy(&mut s, b2.clone());
        (s, b2, t_)
    };
    let (s, b2, _) = setup(MigrationCause::Defragment);
    assert_eq!(
        plan_defragment(&s, &b2, &policy(), LATER),
        Defragment::Nothing(NoDefrag::NoMoves)
    );
    // The same state with a return leaving c1/0 instead: t goes to c1.
    let (s, b2, t_) = setup(MigrationCause::Return);
    let plan = the_move(plan_defragment(&s, &b2, &policy(), LATER));
    assert_eq!(plan.gpu, gpu("c2", 0));
    assert_eq!(plan.moves[0].instance, t_);
    assert_eq!(plan.moves[0].slices[0].gpu.node, NodeId("c1".into()));
}
