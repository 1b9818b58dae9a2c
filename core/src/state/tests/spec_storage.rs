//! A tenant's stored function specs are bounded: deploys with
//! `min_instances = 0` hold no quota, so without this bound a tenant could
//! grow the replicated state (and every replica's memory and snapshot)
//! without limit.

use super::*;
use crate::bounds::{spec_bytes, MAX_TENANT_SPEC_BYTES};
use crate::serving::{MAX_ARGS, MAX_ARG_LEN, MAX_ENV, MAX_ENV_VALUE_LEN};

/// The largest spec the bounds accept, nearly: every argument and
/// environment value at its longest.
fn big(tenant: &str, name: &str) -> FunctionSpec {
    let mut f = spec(tenant, name, Tier::Guaranteed, 100, 1_000);
    f.min_instances = 0;
    f.args = (0..MAX_ARGS)
        .map(|i| format!("--a{i}={}", "x".repeat(MAX_ARG_LEN - 8)))
        .collect();
    f.env = (0..MAX_ENV)
        .map(|i| (format!("VAR_{i}"), "v".repeat(MAX_ENV_VALUE_LEN)))
        .collect();
    f
}

fn storage_refusal(e: &ApplyError) -> (u64, u64) {
    match e {
        ApplyError::SpecStorageExceeded {
            stored,
            adding,
            limit,
            ..
        } => {
            assert_eq!(*limit, MAX_TENANT_SPEC_BYTES);
            (*stored, *adding)
        }
        other => panic!("expected spec_storage_exceeded, got {other:?}"),
    }
}

#[test]
fn a_tenants_stored_specs_are_bounded_and_deletes_free_room() {
    let mut s = region();
    let one = spec_bytes(&big("acme", "f0000"));
    assert!(one > 300_000, "{one}");
    let fit = MAX_TENANT_SPEC_BYTES / one;
    for i in 0..fit {
        deploy(&mut s, big("acme", &format!("f{i:04}")));
    }
    assert_eq!(s.stored_spec_bytes(&t("acme")), fit * one);
    // One more would pass the limit: refused, nothing changes.
    let e = refused(
        &mut s,
        DomainCommand::FunctionDeploy {
            spec: big("acme", "extra"),
        },
    );
    assert_eq!(e.code(), "spec_storage_exceeded");
    assert_eq!(e.class(), ErrorClass::Conflict);
    assert!(!e.may_succeed_on_replan());
    assert_eq!(storage_refusal(&e), (fit * one, one));
    s.check_invariants().unwrap();
    // The scheduler's and the dry run's check says the same before planning.
    let pre = s.check_spec_room(&big("acme", "extra")).unwrap_err();
    assert_eq!(pre, e);
    // A small function still fits in what is left, and another tenant is
    // not affected.
    let small = spec("acme", "small", Tier::Guaranteed, 100, 1_000);
    assert!(MAX_TENANT_SPEC_BYTES - fit * one >= spec_bytes(&small));
    deploy(&mut s, small);
    deploy(&mut s, big("globex", "g"));
    // A delete frees its bytes.
    ok(
        &mut s,
        DomainCommand::FunctionDelete {
            tenant: t("acme"),
            name: "f0000".into(),
        },
    );
    deploy(&mut s, big("acme", "extra"));
    // A snapshot restores the same count (the look-up tables are rebuilt;
    // check_invariants compares them with a rebuild after every apply).
    let restored: RegionState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(
        restored.stored_spec_bytes(&t("acme")),
        s.stored_spec_bytes(&t("acme"))
    );
    // A forced tenant delete forgets all of it.
    ok(
        &mut s,
        DomainCommand::TenantDelete {
            tenant: t("acme"),
            force: true,
        },
    );
    assert_eq!(s.stored_spec_bytes(&t("acme")), 0);
}

/// A spec of `name` that counts exactly `bytes` ([`spec_bytes`]), its
/// arguments making up the size (at most 64 KiB of them).
fn sized(tenant: &str, name: &str, bytes: u64) -> FunctionSpec {
    let mut f = spec(tenant, name, Tier::Guaranteed, 100, 1_000);
    f.min_instances = 0;
    let mut left = usize::try_from(bytes - spec_bytes(&f)).unwrap();
    assert!(left <= MAX_ARGS * MAX_ARG_LEN);
    while left > 0 {
        let n = left.min(MAX_ARG_LEN);
        f.args.push("x".repeat(n));
        left -= n;
    }
    assert_eq!(spec_bytes(&f), bytes);
    f
}

#[test]
fn updates_may_not_grow_a_full_tenants_specs_and_a_reshape_counts_the_kept_spec() {
    let mut s = region();
    let mut f = spec("acme", "svc", Tier::Guaranteed, 100, 1_000);
    f.max_instances = 2;
    deploy(&mut s, f.clone());
    place(&mut s, "acme", "svc");
    // Fill the tenant until 100 bytes are left.
    let chunk = spec_bytes(&sized("acme", "f0000", 65_000));
    let mut i = 0;
    let room = |s: &RegionState| MAX_TENANT_SPEC_BYTES - s.stored_spec_bytes(&t("acme"));
    while room(&s) > 100 {
        let bytes = (room(&s) - 100).min(chunk);
        let g = sized("acme", &format!("f{i:05}"), bytes);
        s.apply(DomainCommand::FunctionDeploy { spec: g }, T0)
            .unwrap();
        i += 1;
    }
    s.check_invariants().unwrap();
    assert_eq!(room(&s), 100);
    // A reshape keeps the old spec while its instance runs, so it adds the
    // whole new spec: refused, though the new spec is no larger.
    let mut reshaped = f.clone();
    reshaped.memory_mib = 2_000;
    let e = refused(&mut s, DomainCommand::FunctionUpdate { spec: reshaped });
    assert_eq!(
        storage_refusal(&e),
        (MAX_TENANT_SPEC_BYTES - 100, spec_bytes(&f))
    );
    s.check_invariants().unwrap();
    // A change that is no reshape (the instance moves to the new
    // version) and keeps the size passes.
    let mut same = f.clone();
    same.deadline_ms = 900;
    ok(&mut s, DomainCommand::FunctionUpdate { spec: same });
    // A function without instances keeps no old spec: an update that grows
    // it past the room is refused, one within the room passes, and at the
    // limit a shrink passes and frees room.
    let idle = sized("acme", "f00000", chunk);
    let mut grow = idle.clone();
    grow.args.last_mut().unwrap().push_str(&"y".repeat(101));
    let e = refused(&mut s, DomainCommand::FunctionUpdate { spec: grow });
    assert_eq!(storage_refusal(&e).1, 101);
    let mut within = idle.clone();
    within.args.last_mut().unwrap().push_str(&"y".repeat(100));
    ok(&mut s, DomainCommand::FunctionUpdate { spec: within });
    assert_eq!(room(&s), 0);
    ok(&mut s, DomainCommand::FunctionUpdate { spec: idle });
    assert_eq!(room(&s), 100);
}

#[test]
fn kept_specs_count_until_their_last_instance_goes() {
    let mut s = region();
    let mut f = spec("acme", "svc", Tier::Guaranteed, 100, 1_000);
    f.max_instances = 2;
    deploy(&mut s, f.clone());
    let old = place(&mut s, "acme", "svc");
    let before = s.stored_spec_bytes(&t("acme"));
    let mut reshaped = f.clone();
    reshaped.memory_mib = 2_000;
    reshaped.args = vec!["--longer".into()];
    ok(
        &mut s,
        DomainCommand::FunctionUpdate {
            spec: reshaped.clone(),
        },
    );
    assert_eq!(
        s.stored_spec_bytes(&t("acme")),
        spec_bytes(&f) + spec_bytes(&reshaped)
    );
    assert!(s.stored_spec_bytes(&t("acme")) > before);
    // The outgoing instance goes: its version's spec is forgotten.
    ok(&mut s, DomainCommand::InstanceRelease { instance: old });
    assert_eq!(s.stored_spec_bytes(&t("acme")), spec_bytes(&reshaped));
}
