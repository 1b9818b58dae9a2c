//! A remap in two phases: `InstanceSliceReserve` (the target slice,
//! re-checked by the same `fit` and quota as a placement) then
//! `InstanceSliceRelease` (the source). A refused reservation changes
//! nothing, so the agent does not move.

use super::*;

fn slice(node: &str, index: u32, compute_milli: u32, memory_mib: u64) -> Slice {
    Slice {
        gpu: gpu(node, index),
        compute_milli,
        memory_mib,
    }
}

fn place_on(s: &mut RegionState, tenant: &str, name: &str, slices: Vec<Slice>) -> InstanceId {
    let cmd = DomainCommand::InstancePlace {
        tenant: t(tenant),
        function: name.into(),
        slices,
    };
    match ok(s, cmd) {
        Applied::InstancePlaced { instance, .. } => instance,
        other => panic!("{other:?}"),
    }
}

fn reserve(instance: InstanceId, slice: Slice) -> DomainCommand {
    DomainCommand::InstanceSliceReserve { instance, slice }
}

fn release(instance: InstanceId, node: &str, index: u32) -> DomainCommand {
    DomainCommand::InstanceSliceRelease {
        instance,
        gpu: gpu(node, index),
    }
}

fn gpus_of(s: &RegionState, id: InstanceId) -> Vec<u32> {
    s.instance(id)
        .unwrap()
        .slices
        .iter()
        .map(|x| x.gpu.index)
        .collect()
}

#[test]
fn a_burstable_instance_moves_in_two_phases() {
    let mut s = region();
    deploy(&mut s, spec("acme", "b", Tier::Burstable, 300, 4_000));
    let id = place_on(&mut s, "acme", "b", vec![slice("c1", 0, 300, 4_000)]);
    let held = s.held(&t("acme"), PoolKind::Center);
    // Phase one: both slices are held (and counted on both GPUs).
    let r = ok(&mut s, reserve(id, slice("c1", 1, 300, 4_000)));
    assert_eq!(
        r,
        Applied::SliceReserved {
            instance: id,
            slices: vec![slice("c1", 0, 300, 4_000), slice("c1", 1, 300, 4_000)],
        }
    );
    let load = s.node_load(&NodeId("c1".into())).unwrap();
    assert_eq!(load.gpus[0].load.resident_mib, 4_000);
    assert_eq!(load.gpus[1].load.resident_mib, 4_000);
    assert_eq!(
        s.held(&t("acme"), PoolKind::Center).memory_mib,
        held.memory_mib + 4_000
    );
    // One move at a time.
    let e = refused(&mut s, reserve(id, slice("c1", 0, 300, 4_000)));
    assert_eq!(e.code(), "bad_remap", "{e}");
    // Phase two: the source goes, the target stays.
    let r = ok(&mut s, release(id, "c1", 0));
    assert_eq!(
        r,
        Applied::SliceReleased {
            instance: id,
            slices: vec![slice("c1", 1, 300, 4_000)],
        }
    );
    let load = s.node_load(&NodeId("c1".into())).unwrap();
    assert_eq!(load.gpus[0].load.resident_mib, 0);
    assert_eq!(load.gpus[0].instances, Vec::<InstanceId>::new());
    assert_eq!(load.gpus[1].instances, vec![id]);
    assert_eq!(s.held(&t("acme"), PoolKind::Center), held);
    // Its only slice is its placement, not a move's.
    let e = refused(&mut s, release(id, "c1", 1));
    assert_eq!(e.code(), "bad_remap", "{e}");
    // An abort releases the target instead.
    ok(&mut s, reserve(id, slice("c1", 0, 300, 4_000)));
    ok(&mut s, release(id, "c1", 0));
    assert_eq!(gpus_of(&s, id), vec![1]);
}

/// A remap of an instance sharing its GPUs with higher-numbered ones keeps
/// each GPU's instance list as a rebuild from the instances has it (in id
/// order): `check_invariants`, run after every command here, failed with
/// "look-up tables differ from a rebuild" once the reserve re-added the
/// moving instance at the end of its source GPU's list.
#[test]
fn a_remap_among_other_instances_keeps_the_look_up_tables_as_a_rebuild() {
    let mut s = region();
    deploy(&mut s, spec("acme", "b", Tier::Burstable, 300, 4_000));
    let x = place_on(&mut s, "acme", "b", vec![slice("c1", 0, 300, 4_000)]);
    let y = place_on(&mut s, "acme", "b", vec![slice("c1", 0, 300, 4_000)]);
    let z = place_on(&mut s, "acme", "b", vec![slice("c1", 1, 300, 4_000)]);
    assert!(x < y && y < z);
    ok(&mut s, reserve(x, slice("c1", 1, 300, 4_000)));
    ok(&mut s, release(x, "c1", 0));
    assert_eq!(gpus_of(&s, x), vec![1]);
    ok(&mut s, reserve(x, slice("c1", 0, 300, 4_000)));
    ok(&mut s, release(x, "c1", 1));
    assert_eq!(gpus_of(&s, x), vec![0]);
}

#[test]
fn exclusive_and_guaranteed_instances_stay_where_the_region_placed_them() {
    let mut s = region();
    deploy(&mut s, spec("acme", "g", Tier::Guaranteed, 400, 3_000));
    let g = place_on(&mut s, "acme", "g", vec![slice("c1", 0, 400, 3_000)]);
    let e = refused(&mut s, reserve(g, slice("c1", 1, 400, 3_000)));
    assert_eq!(
        e,
        ApplyError::Pinned {
            instance: g,
            tier: Tier::Guaranteed
        }
    );
    assert_eq!(e.class(), ErrorClass::Conflict);
    deploy(&mut s, spec("globex", "x", Tier::Exclusive, 1000, 16_384));
    let x = place_on(&mut s, "globex", "x", vec![slice("c2", 0, 1000, 16_384)]);
    let e = refused(&mut s, reserve(x, slice("c2", 1, 1000, 16_384)));
    assert_eq!(e.code(), "pinned");
    let e = refused(&mut s, release(x, "c2", 0));
    assert_eq!(e.code(), "bad_remap");
    let e = refused(&mut s, reserve(InstanceId(999), slice("c1", 1, 400, 3_000)));
    assert_eq!(e.code(), "unknown_instance");
}

#[test]
fn a_reservation_is_rechecked_by_fit_and_quota() {
    let mut s = region();
    deploy(&mut s, spec("acme", "o", Tier::Oversubscribed, 200, 6_000));
    let o = place_on(&mut s, "acme", "o", vec![slice("c1", 0, 200, 6_000)]);
    // Malformed targets: other node, same GPU, other size, unknown GPU.
    for bad in [
        slice("c2", 1, 200, 6_000),
        slice("c1", 0, 200, 6_000),
        slice("c1", 1, 200, 5_999),
        slice("c1", 1, 201, 6_000),
    ] {
        let e = refused(&mut s, reserve(o, bad));
        assert_eq!(e.code(), "bad_remap", "{e}");
    }
    let e = refused(&mut s, reserve(o, slice("c1", 7, 200, 6_000)));
    assert_eq!(e.code(), "unknown_gpu", "{e}");
    // GPU 1 of c1 taken whole by globex's exclusive instance: fit refuses.
    deploy(&mut s, spec("globex", "x", Tier::Exclusive, 1000, 16_384));
    place_on(&mut s, "globex", "x", vec![slice("c1", 1, 1000, 16_384)]);
    let e = refused(&mut s, reserve(o, slice("c1", 1, 200, 6_000)));
    assert!(
        matches!(
            e,
            ApplyError::GpuFull {
                dimension: GpuDimension::HeldExclusive,
                ..
            }
        ),
        "{e}"
    );
    // The tenant's quota counts the reserved target too.
    let mut s = region();
    deploy(&mut s, spec("acme", "big", Tier::Burstable, 900, 10_000));
    let a = place_on(&mut s, "acme", "big", vec![slice("c1", 0, 900, 10_000)]);
    let b = place_on(&mut s, "acme", "big", vec![slice("c2", 0, 900, 10_000)]);
    let _ = place_on(&mut s, "acme", "big", vec![slice("c2", 1, 900, 10_000)]);
    let e = refused(&mut s, reserve(a, slice("c1", 1, 900, 10_000)));
    assert!(matches!(e, ApplyError::QuotaExceeded { .. }), "{e}");
    assert_eq!(gpus_of(&s, a), vec![0]);
    assert_eq!(gpus_of(&s, b), vec![0]);
}

#[test]
fn a_moving_instance_survives_a_snapshot_and_its_release() {
    let mut s = region();
    deploy(&mut s, spec("acme", "b", Tier::Burstable, 300, 4_000));
    let id = place_on(&mut s, "acme", "b", vec![slice("c1", 0, 300, 4_000)]);
    ok(&mut s, reserve(id, slice("c1", 1, 300, 4_000)));
    let json = serde_json::to_string(&s).unwrap();
    let back: RegionState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s);
    back.check_invariants().unwrap();
    // Releasing the instance frees both of its slices.
    ok(&mut s, DomainCommand::InstanceRelease { instance: id });
    let load = s.node_load(&NodeId("c1".into())).unwrap();
    assert_eq!(load.gpus[0].load, GpuLoad::default());
    assert_eq!(load.gpus[1].load, GpuLoad::default());
    assert_eq!(s.held(&t("acme"), PoolKind::Center), Quota::default());
}
