//! A reshaping update's roll: the old instances stay outgoing (serving,
//! holding their slices and quota) while new-version ones are placed
//! beside them; `max_instances` counts only the current version; where
//! quota leaves no room for both, the replacement is a one-step move.

use super::*;

fn policy() -> PlacementPolicy<'static> {
    best_fit()
}

fn replacement(s: &RegionState, i: InstanceId) -> Replacement {
    plan_replacement(s, i, &policy(), T0).unwrap_or_else(|r| panic!("{r}"))
}

/// Carries out `r` for `i`; the instance it placed, if any.
fn carry_out(s: &mut RegionState, i: InstanceId, r: &Replacement) -> Option<InstanceId> {
    let cmd = r.command(s, i).expect("a command");
    match ok(s, cmd) {
        Applied::InstanceMigrating { instance, .. }
        | Applied::InstanceReplaced { instance, .. } => Some(instance),
        _ => None,
    }
}

/// `acme/f` (guaranteed, 100 milli-GPU, 1000 MiB, `max` instances), with
/// `n` instances placed, then updated to 2000 MiB.
fn reshaped(s: &mut RegionState, n: u32, max: u32) -> (FunctionSpec, Vec<InstanceId>) {
    let mut f = spec("acme", "f", Tier::Guaranteed, 100, 1_000);
    f.min_instances = n;
    f.max_instances = max;
    deploy(s, f.clone());
    let old: Vec<InstanceId> = (0..n).map(|_| place(s, "acme", "f")).collect();
    f.memory_mib = 2_000;
    let r = ok(s, DomainCommand::FunctionUpdate { spec: f.clone() });
    assert!(matches!(
        r,
        Applied::FunctionUpdated { version: 2, ref released, ref replacing, .. }
            if released.is_empty() && replacing == &old
    ));
    (f, old)
}

/// `all_outgoing`, checked against its definition: every instance whose
/// version is not its function's, in id order.
fn all_outgoing(s: &RegionState) -> Vec<InstanceId> {
    let got: Vec<InstanceId> = s.all_outgoing().map(|i| i.id).collect();
    let want: Vec<InstanceId> = s
        .instances()
        .filter(|i| {
            s.function(&i.tenant, &i.function)
                .is_ok_and(|f| f.version != i.version)
        })
        .map(|i| i.id)
        .collect();
    assert_eq!(got, want);
    got
}

#[test]
fn outgoing_instances_keep_their_slices_and_spec_until_replaced_one_by_one() {
    let mut s = region();
    let (_, old) = reshaped(&mut s, 2, 2);
    let (a, b) = (old[0], old[1]);
    // Both still serve, on their old spec, and hold what they held.
    assert_eq!(s.instance_count(&t("acme"), "f"), 0);
    assert_eq!(
        s.outgoing(&t("acme"), "f")
            .map(|i| i.id)
            .collect::<Vec<_>>(),
        old
    );
    assert!(s.underplaced().is_empty(), "outgoing ones count for min");
    assert_eq!(all_outgoing(&s), old);
    assert_eq!(
        s.instance_spec(a).map(|(f, v)| (f.memory_mib, v)),
        Some((1_000, 1))
    );
    assert_eq!(s.held(&t("acme"), PoolKind::Center), quota(200, 2_000, 2));

    let r = replacement(&s, a);
    assert!(
        matches!(&r, Replacement::Migrate(sl, MigrationCause::Roll) if sl[0].memory_mib == 2_000),
        "{r:?}"
    );
    let c = carry_out(&mut s, a, &r).unwrap();
    // The overlap: old and new both hold their slices and quota; the new
    // one counts (the outgoing one does not). It is a migration in the
    // state: a leader elected now plans nothing more for `a`.
    assert_eq!(
        s.instance_spec(c).map(|(f, v)| (f.memory_mib, v)),
        Some((2_000, 2))
    );
    assert_eq!(s.held(&t("acme"), PoolKind::Center), quota(300, 4_000, 3));
    assert_eq!(s.instance_count(&t("acme"), "f"), 1);
    let m = s.migration_of(a).expect("a roll migration");
    assert_eq!((m.from, m.to, m.cause), (a, c, MigrationCause::Roll));
    assert_eq!(replacement(&s, a), Replacement::Nothing);
    // The migration tick ends it once `c` is ready. No agent ever
    // registered for `a`'s node: `a` serves nothing there, and goes after
    // MUST_FINISH_AFTER_MS (without agents a roll would never end).
    let none = BTreeMap::new();
    let at = T0 + MUST_FINISH_AFTER_MS;
    assert_eq!(
        migration_steps(&s, &|_| false, at - 1, 60_000, &none),
        vec![]
    );
    assert_eq!(
        migration_steps(&s, &|_| false, at, 60_000, &none),
        vec![MigrationStep::Complete { from: a, to: c }]
    );
    // With agents on the nodes, `a` serves on past MUST_FINISH_AFTER_MS,
    // even while no report says so (a report can be missing for a moment;
    // its node is not leaving), and the roll is given up after the
    // general wait.
    with_agents(&mut s);
    assert_eq!(migration_steps(&s, &|_| false, at, 60_000, &none), vec![]);
    assert_eq!(
        migration_steps(&s, &|_| false, T0 + 60_000, 60_000, &none),
        vec![MigrationStep::Abort { from: a, to: c }]
    );
    assert_eq!(
        migration_steps(&s, &|i| i.id == c, T0 + 1, 60_000, &none),
        vec![MigrationStep::Complete { from: a, to: c }]
    );
    ok(&mut s, DomainCommand::InstanceRelease { instance: a });
    assert!(s.migration_of(c).is_none());
    assert!(s.function(&t("acme"), "f").unwrap().older.contains_key(&1));
    assert_eq!(all_outgoing(&s), vec![b]);

    let r = replacement(&s, b);
    let d = carry_out(&mut s, b, &r).unwrap();
    ok(&mut s, DomainCommand::InstanceRelease { instance: b });
    let rec = s.function(&t("acme"), "f").unwrap();
    assert!(rec.older.is_empty(), "the last old one took its spec along");
    assert_eq!(s.instance_count(&t("acme"), "f"), 2);
    assert_eq!(s.outgoing(&t("acme"), "f").count(), 0);
    assert!(all_outgoing(&s).is_empty());
    assert_eq!(s.held(&t("acme"), PoolKind::Center), quota(200, 4_000, 2));
    assert_eq!(replacement(&s, c), Replacement::Nothing);
    assert_eq!(replacement(&s, d), Replacement::Nothing);
    assert_eq!(replacement(&s, a), Replacement::Nothing);
}

#[test]
fn max_instances_counts_only_the_current_version() {
    let mut s = region();
    let (f, old) = reshaped(&mut s, 1, 1);
    let a = old[0];
    let r = replacement(&s, a);
    let c = carry_out(&mut s, a, &r).unwrap();
    // Migrating: nothing more for `a` (the migration tick ends it); the
    // new one counts (the outgoing one does not), so one more is refused.
    assert_eq!(replacement(&s, a), Replacement::Nothing);
    assert_eq!(s.instance_count(&t("acme"), "f"), 1);
    let used: Vec<GpuId> = s
        .instances()
        .flat_map(|i| i.slices.iter().map(|sl| sl.gpu.clone()))
        .collect();
    let free = [gpu("c1", 0), gpu("c1", 1), gpu("c2", 0), gpu("c2", 1)]
        .into_iter()
        .find(|g| !used.contains(g))
        .unwrap();
    let e = refused(
        &mut s,
        DomainCommand::InstancePlace {
            tenant: t("acme"),
            function: "f".into(),
            slices: vec![Slice {
                gpu: free,
                compute_milli: f.compute_milli,
                memory_mib: f.memory_mib,
            }],
        },
    );
    assert_eq!(e.code(), "max_instances");
    // The migration given up (`c` released) and a current instance placed
    // meanwhile: one current instance of at most one, the old one just goes.
    ok(
        &mut s,
        DomainCommand::MigrationEnd {
            from: a,
            to: c,
            complete: false,
        },
    );
    assert!(s.instance(c).is_none());
    let d = place(&mut s, "acme", "f");
    assert_eq!(replacement(&s, a), Replacement::Release);
    assert_eq!(carry_out(&mut s, a, &Replacement::Release), None);
    assert!(s.instance(a).is_none());
    assert!(s.instance(d).is_some());
}

#[test]
fn without_quota_for_the_overlap_the_replacement_is_a_one_step_move() {
    let mut s = region();
    ok(
        &mut s,
        DomainCommand::QuotaSet {
            tenant: t("acme"),
            pool_kind: PoolKind::Center,
            quota: quota(100, 2_000, 1),
        },
    );
    ok(
        &mut s,
        DomainCommand::QuotaSet {
            tenant: t("acme"),
            pool_kind: PoolKind::Edge,
            quota: quota(0, 0, 0),
        },
    );
    let (_, old) = reshaped(&mut s, 1, 2);
    let a = old[0];
    let r = replacement(&s, a);
    let Replacement::Move(slices) = &r else {
        panic!("{r:?}")
    };
    // A make-first placement would pass the quota.
    let e = refused(
        &mut s,
        DomainCommand::InstancePlace {
            tenant: t("acme"),
            function: "f".into(),
            slices: slices.clone(),
        },
    );
    assert_eq!(e.code(), "quota_exceeded");
    let c = carry_out(&mut s, a, &r).unwrap();
    assert!(s.instance(a).is_none());
    assert_eq!(
        s.instance_spec(c).map(|(f, v)| (f.memory_mib, v)),
        Some((2_000, 2))
    );
    assert!(s.function(&t("acme"), "f").unwrap().older.is_empty());
    assert_eq!(s.held(&t("acme"), PoolKind::Center), quota(100, 2_000, 1));
}

#[test]
fn a_refused_move_of_an_outgoing_instance_changes_nothing() {
    let mut s = region();
    let (f, old) = reshaped(&mut s, 1, 2);
    // `refused` checks the state (the kept spec of version 1 included) is
    // exactly as before.
    let e = refused(
        &mut s,
        DomainCommand::InstanceReplace {
            instance: old[0],
            slices: vec![Slice {
                gpu: gpu("c1", 9),
                compute_milli: f.compute_milli,
                memory_mib: f.memory_mib,
            }],
        },
    );
    assert_eq!(e.code(), "unknown_gpu");
    assert!(s.function(&t("acme"), "f").unwrap().older.contains_key(&1));
}

#[test]
fn an_update_that_keeps_the_shape_mid_roll_moves_only_the_current_ones() {
    let mut s = region();
    let (mut f, old) = reshaped(&mut s, 1, 2);
    let a = old[0];
    let r = replacement(&s, a);
    let c = carry_out(&mut s, a, &r).unwrap();
    f.deadline_ms = 700;
    let r = ok(&mut s, DomainCommand::FunctionUpdate { spec: f });
    assert!(matches!(
        r,
        Applied::FunctionUpdated { version: 3, ref released, ref replacing, .. }
            if released.is_empty() && replacing.is_empty()
    ));
    assert_eq!(s.instance(a).map(|i| i.version), Some(1));
    assert_eq!(s.instance(c).map(|i| i.version), Some(3));
    assert_eq!(s.instance_spec(c).map(|(f, _)| f.deadline_ms), Some(700));
    assert_eq!(s.instance_spec(a).map(|(f, _)| f.deadline_ms), Some(500));
}

#[test]
fn a_state_mid_roll_round_trips_through_json_and_bincode() {
    let mut s = region();
    let (_, old) = reshaped(&mut s, 1, 2);
    let r = replacement(&s, old[0]);
    carry_out(&mut s, old[0], &r).unwrap();
    let json = serde_json::to_string(&s).unwrap();
    let back: RegionState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s);
    let config = bincode::config::standard().with_limit::<{ 64 << 20 }>();
    let bytes = bincode::serde::encode_to_vec(&s, config).unwrap();
    let (back, _): (RegionState, usize) =
        bincode::serde::decode_from_slice(&bytes, config).unwrap();
    assert_eq!(back, s);
    back.check_invariants().unwrap();
    assert_eq!(
        back.instance_spec(old[0]).map(|(f, v)| (f.memory_mib, v)),
        Some((1_000, 1))
    );
}

#[test]
fn a_change_of_model_args_or_env_is_a_reshape_and_a_bad_model_is_refused_on_apply() {
    let mut s = region();
    let mut f = spec("acme", "f", Tier::Guaranteed, 100, 1_000);
    f.min_instances = 1;
    deploy(&mut s, f.clone());
    let old = place(&mut s, "acme", "f");
    // What the process runs is fixed at its start: a new model replaces it.
    f.model = Some("org/model".into());
    let r = ok(&mut s, DomainCommand::FunctionUpdate { spec: f.clone() });
    assert!(
        matches!(&r, Applied::FunctionUpdated { replacing, .. } if replacing == &vec![old]),
        "{r:?}"
    );
    // A change of anything else keeps the instances (the max here).
    f.max_instances = 3;
    let r = ok(&mut s, DomainCommand::FunctionUpdate { spec: f.clone() });
    assert!(
        matches!(&r, Applied::FunctionUpdated { replacing, .. } if replacing.is_empty()),
        "{r:?}"
    );
    for bad in [
        FunctionSpec {
            model: Some("/etc/passwd".into()),
            ..f.clone()
        },
        FunctionSpec {
            env: [("LD PRELOAD".to_string(), "x".to_string())].into(),
            ..f.clone()
        },
    ] {
        let e = s
            .apply(DomainCommand::FunctionUpdate { spec: bad }, T0)
            .unwrap_err();
        assert!(matches!(e, ApplyError::InvalidSpec { .. }), "{e}");
    }
}

/// One leader's roll of `acme/f` (three instances, reshaped), run every
/// half second from T0 for `until_ms` as the leader's ticks do: the
/// migration tick ends what `migration_steps` decides (`ready(new, age)`
/// says whether a new instance is ready `age` ms after it was placed),
/// then the liveness tick replaces each function's oldest outgoing
/// instance. After every tick the instances that serve (the old ones
/// left, and the new ones ready or beside a ready one of their version on
/// their node) are never fewer than three. Returns the
/// state at the end and how many roll steps were given up.
fn roll_for(until_ms: u64, ready: &dyn Fn(u64) -> bool) -> (RegionState, u32) {
    roll_in(region(), until_ms, ready)
}

/// An agent registered for every node of [`region`]'s topology.
fn with_agents(s: &mut RegionState) {
    for node in ["c1", "c2", "ea1", "eb1"] {
        register(s, &format!("agent-{node}"), node);
    }
}

/// [`roll_for`] on `s` (a [`region`], its topology changed or not), with
/// an agent on every node.
fn roll_in(mut s: RegionState, until_ms: u64, ready: &dyn Fn(u64) -> bool) -> (RegionState, u32) {
    const TICK_MS: u64 = 500;
    with_agents(&mut s);
    let (_, old) = reshaped(&mut s, 3, 3);
    let mut placed_at: BTreeMap<InstanceId, u64> = BTreeMap::new();
    let mut seen = BTreeMap::new();
    let mut given_up = 0u32;
    let mut now = T0;
    while now <= T0 + until_ms {
        note_migrations_seen(&s, &mut seen, now);
        let is_ready = |placed_at: &BTreeMap<InstanceId, u64>, i: &Instance| {
            placed_at
                .get(&i.id)
                .is_some_and(|at| ready(now.saturating_sub(*at)))
        };
        // The old instances serve (their agents report them).
        let steps = migration_steps(
            &s,
            &|i| old.contains(&i.id) || is_ready(&placed_at, i),
            now,
            60_000,
            &seen,
        );
        for step in steps {
            let (from, to, complete) = match step {
                MigrationStep::Complete { from, to } => (from, to, true),
                MigrationStep::Abort { from, to } => {
                    given_up += 1;
                    (from, to, false)
                }
            };
            let end = DomainCommand::MigrationEnd { from, to, complete };
            s.apply(end, now).unwrap_or_else(|e| panic!("{e}"));
        }
        let first = s.all_outgoing().next().map(|i| i.id);
        if let Some(first) = first {
            let r = plan_replacement(&s, first, &policy(), now).unwrap_or_else(|r| panic!("{r}"));
            if let Some(cmd) = r.command(&s, first) {
                assert!(
                    matches!(r, Replacement::Migrate(_, MigrationCause::Roll)),
                    "{r:?}"
                );
                match s.apply(cmd, now).unwrap_or_else(|e| panic!("{e}")) {
                    Applied::InstanceMigrating { instance, .. } => {
                        placed_at.insert(instance, now);
                    }
                    a => panic!("{a:?}"),
                }
            }
        }
        s.check_invariants().unwrap();
        // A new instance serves once ready, or beside a ready one on its
        // node (that node's agent serves the version from that copy).
        let serves = |i: &Instance| {
            is_ready(&placed_at, i)
                || s.instances_of(&t("acme"), "f").any(|o| {
                    o.id != i.id
                        && !old.contains(&o.id)
                        && o.slices[0].gpu.node == i.slices[0].gpu.node
                        && is_ready(&placed_at, o)
                })
        };
        let serving = s
            .instances_of(&t("acme"), "f")
            .filter(|i| old.contains(&i.id) || serves(i))
            .count();
        assert!(serving >= 3, "at {}: {serving} serve", now - T0);
        now += TICK_MS;
    }
    (s, given_up)
}

/// A new version that never loads (a bad model or args): the roll keeps
/// trying (each step given up after the wait, then planned again) and no
/// old instance is released; before, each step was completed after
/// MUST_FINISH_AFTER_MS all the same, and within about 30 s every working
/// instance was gone.
#[test]
fn a_roll_whose_new_instances_never_become_ready_releases_no_old_instance() {
    let (s, given_up) = roll_for(5 * 60_000, &|_| false);
    assert_eq!(s.outgoing(&t("acme"), "f").count(), 3);
    assert!(given_up >= 4, "given up {given_up} times");
    // Never more than one new instance at a time beside them.
    assert!(s.instance_count(&t("acme"), "f") <= 1);
}

/// A new version that loads slower than MUST_FINISH_AFTER_MS (but within
/// the wait): each old instance goes once its replacement is ready, and
/// the roll completes.
#[test]
fn a_roll_whose_new_instances_load_slowly_completes_once_they_are_ready() {
    let (s, given_up) = roll_for(3 * 60_000, &|age| age >= 25_000);
    assert_eq!(given_up, 0);
    assert_eq!(s.outgoing(&t("acme"), "f").count(), 0);
    assert_eq!(s.instance_count(&t("acme"), "f"), 3);
    assert!(s.function(&t("acme"), "f").unwrap().older.is_empty());
    // Ready at once, as fast as the ticks go.
    let (s, _) = roll_for(10_000, &|_| true);
    assert_eq!(s.outgoing(&t("acme"), "f").count(), 0);
}

/// A new version whose predicted cold start (2,000 MiB of weights at
/// 20 MiB/s: 100.5 s) is longer than the migration wait (60 s): each step
/// waits for twice the prediction before it is given up, so a load that
/// ends as predicted completes the roll (given up at 60 s, every step was
/// loaded from scratch again and the roll never ended).
#[test]
fn a_roll_whose_new_version_loads_longer_than_the_wait_completes() {
    let mut s = region();
    let slow = topology(
        &format!("{NODES}{PRICES}").replace("storage_mib_per_s = 2_000", "storage_mib_per_s = 20"),
    );
    ok(&mut s, DomainCommand::TopologyLoad { topology: slow });
    let (s, given_up) = roll_in(s, 8 * 60_000, &|age| age >= 101_000);
    assert_eq!(given_up, 0);
    assert_eq!(s.outgoing(&t("acme"), "f").count(), 0);
    assert_eq!(s.instance_count(&t("acme"), "f"), 3);
    // One that never loads is still given up, after twice the prediction.
    let mut s = region();
    let slow = topology(
        &format!("{NODES}{PRICES}").replace("storage_mib_per_s = 2_000", "storage_mib_per_s = 20"),
    );
    ok(&mut s, DomainCommand::TopologyLoad { topology: slow });
    let (s, given_up) = roll_in(s, 5 * 60_000, &|_| false);
    assert_eq!(given_up, 1, "once, at 201 s");
    assert_eq!(s.outgoing(&t("acme"), "f").count(), 3);
}

/// A roll's new instance placed on a node that already has a ready
/// instance of the new version: that node's agent serves the version from
/// that copy and loads none for the second instance until requests need
/// it, so the step completes after MUST_FINISH_AFTER_MS all the same
/// (waiting for its own copy, an idle function's roll would be given up
/// and planned again forever). Without a ready sibling there, it waits.
#[test]
fn a_roll_step_beside_a_ready_instance_of_its_version_on_its_node_completes() {
    let mut s = region();
    with_agents(&mut s);
    let (_, old) = reshaped(&mut s, 2, 2);
    let (a, b) = (old[0], old[1]);
    let r = replacement(&s, a);
    let c = carry_out(&mut s, a, &r).unwrap();
    ok(
        &mut s,
        DomainCommand::MigrationEnd {
            from: a,
            to: c,
            complete: true,
        },
    );
    // `b`'s replacement on the other GPU of `c`'s node.
    let Replacement::Migrate(mut slices, cause) = replacement(&s, b) else {
        panic!("not a migration");
    };
    let at_c = s.instance(c).unwrap().slices[0].gpu.clone();
    slices[0].gpu = GpuId {
        node: at_c.node.clone(),
        index: 1 - at_c.index,
    };
    let cmd = DomainCommand::InstanceMigrate {
        instance: b,
        slices,
        cause,
    };
    let Applied::InstanceMigrating { instance: d, .. } = ok(&mut s, cmd) else {
        panic!("not a migration");
    };
    let none = BTreeMap::new();
    let at = T0 + MUST_FINISH_AFTER_MS;
    // (`b`, the old side, serves.)
    let c_ready = |i: &Instance| i.id == c || i.id == b;
    assert_eq!(migration_steps(&s, &c_ready, at - 1, 60_000, &none), vec![]);
    assert_eq!(
        migration_steps(&s, &c_ready, at, 60_000, &none),
        vec![MigrationStep::Complete { from: b, to: d }]
    );
    assert_eq!(
        migration_steps(&s, &|i| i.id == b, at, 60_000, &none),
        vec![]
    );
}
