//! Node liveness: the leader's rule ([`liveness_changes`]) as data in and
//! changes out, and what a committed `not_ready` or drain does to
//! placements (the planner skips the node, apply refuses it, an
//! `InstanceReplace` moves an instance off it in one step).

use super::*;

const RULES: LivenessRules = LivenessRules {
    join_grace_ms: 60_000,
    ready_grace_ms: 3_000,
    replace_grace_ms: 2_000,
};

/// Drains `node` (`drain`) or marks it not ready.
fn drain_or_lose(s: &mut RegionState, node: &NodeId, drain: bool) {
    if drain {
        ok(
            s,
            DomainCommand::NodeDrainSet {
                node: node.clone(),
                drain: true,
            },
        );
    } else {
        mark(s, &node.0, false, T0);
    }
}

fn n(name: &str) -> NodeId {
    NodeId(name.into())
}

fn changes(s: &RegionState, heard: &[(&str, u64)], since: u64, now: u64) -> Vec<LivenessChange> {
    let heard = heard.iter().map(|(k, v)| (n(k), *v)).collect();
    liveness_changes(s, &heard, since, now, &RULES)
}

fn mark(s: &mut RegionState, node: &str, ready: bool, at: u64) {
    s.apply(
        DomainCommand::NodeReadySet {
            node: n(node),
            ready,
        },
        at,
    )
    .unwrap();
    s.check_invariants().unwrap();
}

#[test]
fn a_node_is_pending_until_heard_and_not_ready_after_its_join_grace() {
    let s = region();
    for node in ["c1", "c2", "ea1", "eb1"] {
        assert_eq!(s.node_state(&n(node)), NodeState::Pending);
        assert!(s.takes_placements(&n(node)));
    }
    // Heard c1: ready. Nothing else changes within the join grace.
    assert_eq!(
        changes(&s, &[("c1", T0 + 10)], T0, T0 + 1_000),
        vec![LivenessChange::Ready(n("c1"))]
    );
    // After the join grace, every node never heard is not ready.
    let late = T0 + RULES.join_grace_ms + 1;
    assert_eq!(
        changes(&s, &[("c1", late - 100)], T0, late),
        vec![
            LivenessChange::Ready(n("c1")),
            LivenessChange::NotReady(n("c2")),
            LivenessChange::NotReady(n("ea1")),
            LivenessChange::NotReady(n("eb1")),
        ]
    );
    // A committed registration counts as heard.
    let mut s = s;
    register(&mut s, "c2", "c2");
    assert!(changes(&s, &[], T0, T0 + 10).contains(&LivenessChange::Ready(n("c2"))));
}

#[test]
fn a_silent_node_goes_not_ready_then_its_instances_are_replaced_elsewhere() {
    let mut s = region();
    deploy(&mut s, spec("acme", "chat", Tier::Guaranteed, 300, 4_000));
    let id = place(&mut s, "acme", "chat");
    let node = s.instance(id).unwrap().slices[0].gpu.node.clone();
    mark(&mut s, &node.0, true, T0);
    let heard = [(node.0.as_str(), T0)];
    // Within the ready grace: nothing.
    assert_eq!(changes(&s, &heard, T0, T0 + RULES.ready_grace_ms), vec![]);
    // Silent past it: not ready.
    let t1 = T0 + RULES.ready_grace_ms + 1;
    assert_eq!(
        changes(&s, &heard, T0, t1),
        vec![LivenessChange::NotReady(node.clone())]
    );
    // A new leader (watching since t1) gives a fresh grace.
    assert_eq!(changes(&s, &heard, t1, t1 + 1), vec![]);
    mark(&mut s, &node.0, false, t1);
    assert_eq!(s.node_state(&node), NodeState::NotReady);
    assert!(!s.takes_placements(&node));
    // Not ready: the planner passes it over, apply refuses it.
    let slices = s.instance(id).unwrap().slices.clone();
    let e = refused(
        &mut s,
        DomainCommand::InstancePlace {
            tenant: t("acme"),
            function: "chat".into(),
            slices: slices.clone(),
        },
    );
    assert_eq!(e.code(), "node_not_ready");
    assert!(e.may_succeed_on_replan());
    let p = plan(&s, &t("acme"), "chat", &BestFit).unwrap();
    assert_ne!(p.slices[0].gpu.node, node);
    // Before the replace grace: no replacement; after it: replace.
    assert_eq!(changes(&s, &heard, T0, t1 + 1), vec![]);
    let t2 = t1 + RULES.replace_grace_ms;
    assert_eq!(
        changes(&s, &heard, T0, t2),
        vec![LivenessChange::Replace(node.clone())]
    );
    // The replacement moves the instance in one step (same count).
    let r = ok(
        &mut s,
        DomainCommand::InstanceReplace {
            instance: id,
            slices: p.slices.clone(),
        },
    );
    let Applied::InstanceReplaced {
        released, instance, ..
    } = r
    else {
        panic!("{r:?}")
    };
    assert_eq!(released, id);
    assert!(s.instance(id).is_none());
    assert_eq!(s.instance(instance).unwrap().slices, p.slices);
    assert_eq!(s.instance_count(&t("acme"), "chat"), 1);
    assert_eq!(s.instances_on(&node).count(), 0);
    // Nothing left on it: no more replacements; heard again: ready.
    assert_eq!(changes(&s, &heard, T0, t2 + 10), vec![]);
    assert_eq!(
        changes(&s, &[(node.0.as_str(), t2 + 5)], T0, t2 + 10),
        vec![LivenessChange::Ready(node.clone())]
    );
}

#[test]
fn a_replacement_onto_a_node_without_room_changes_nothing() {
    let mut s = region();
    let mut f = spec("acme", "big", Tier::Guaranteed, 1_000, 16_000);
    f.max_instances = 1;
    deploy(&mut s, f);
    let id = place(&mut s, "acme", "big");
    let here = s.instance(id).unwrap().slices.clone();
    // Onto itself (taken by itself until released): allowed, as the old
    // one is released first; onto an unknown GPU: refused, nothing changed.
    let mut bad = here.clone();
    bad[0].gpu.index = 9;
    let e = refused(
        &mut s,
        DomainCommand::InstanceReplace {
            instance: id,
            slices: bad,
        },
    );
    assert_eq!(e.code(), "unknown_gpu");
    let e = refused(
        &mut s,
        DomainCommand::InstanceReplace {
            instance: InstanceId(999),
            slices: here.clone(),
        },
    );
    assert_eq!(e.code(), "unknown_instance");
    // max_instances = 1 does not block a move.
    ok(
        &mut s,
        DomainCommand::InstanceReplace {
            instance: id,
            slices: here,
        },
    );
    assert_eq!(s.instance_count(&t("acme"), "big"), 1);
}

#[test]
fn a_drained_node_takes_nothing_until_undrained() {
    let mut s = region();
    for node in ["c2", "ea1", "eb1"] {
        ok(
            &mut s,
            DomainCommand::NodeDrainSet {
                node: n(node),
                drain: true,
            },
        );
    }
    deploy(&mut s, spec("acme", "chat", Tier::Guaranteed, 300, 4_000));
    let p = plan(&s, &t("acme"), "chat", &BestFit).unwrap();
    assert_eq!(p.slices[0].gpu.node, n("c1"));
    // The index over free capacity skips them too (the scheduler's path).
    let f = s.function(&t("acme"), "chat").unwrap().spec.clone();
    let (indexed, _) = plan_on(&s, None, &f, &BestFit, &PlanOptions::indexed()).unwrap();
    assert_eq!(indexed.slices, p.slices);
    ok(
        &mut s,
        DomainCommand::NodeDrainSet {
            node: n("c1"),
            drain: true,
        },
    );
    let r = plan(&s, &t("acme"), "chat", &BestFit).unwrap_err();
    assert_eq!(r.code(), "no_ready_nodes");
    assert_eq!(r.nodes_not_ready, 4);
    let r = plan_on(&s, None, &f, &BestFit, &PlanOptions::indexed()).unwrap_err();
    assert_eq!((r.code(), r.nodes_not_ready), ("no_ready_nodes", 4));
    let e = refused(&mut s, p.command());
    assert_eq!(e.code(), "node_not_ready");
    let e = refused(
        &mut s,
        DomainCommand::NodeDrainSet {
            node: n("nowhere"),
            drain: true,
        },
    );
    assert_eq!(e.code(), "unknown_node");
    let r = ok(
        &mut s,
        DomainCommand::NodeDrainSet {
            node: n("c1"),
            drain: false,
        },
    );
    assert_eq!(
        r,
        Applied::NodeDrainSet {
            node: n("c1"),
            draining: false,
            changed: true
        }
    );
    ok(&mut s, p.command());
    // A snapshot keeps the statuses.
    let back: RegionState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(back, s);
    assert!(!back.takes_placements(&n("c2")));
}

/// A tenant at its quota: the view still counts the instance on the lost
/// node, but its one-step move (apply releases it first) fits the quota.
#[test]
fn a_tenant_at_its_quota_still_has_its_instances_moved_off_a_lost_or_drained_node() {
    let policy = best_fit();
    // globex: 2 000 milli of center compute; its edge quota (500) takes
    // none of these.
    let at_quota = || {
        let mut s = region();
        deploy(
            &mut s,
            spec("globex", "chat", Tier::Guaranteed, 1_000, 4_000),
        );
        let ids = [
            place(&mut s, "globex", "chat"),
            place(&mut s, "globex", "chat"),
        ];
        let node = s.instance(ids[0]).unwrap().slices[0].gpu.node.clone();
        (s, ids[0], node)
    };
    for drain in [false, true] {
        let (mut s, id, node) = at_quota();
        // At its quota: one more instance is refused.
        let r = plan(&s, &t("globex"), "chat", &BestFit).unwrap_err();
        assert_eq!(r.code(), "quota_exceeded", "{r}");
        drain_or_lose(&mut s, &node, drain);
        // A drain would place first but the quota has no room for both:
        // it moves in one step too.
        let decided = plan_evacuation(&s, id, drain, &policy, T0).unwrap_or_else(|r| panic!("{r}"));
        let Replacement::Move(slices) = decided.clone() else {
            panic!("drain {drain}: {decided:?}");
        };
        assert_ne!(slices[0].gpu.node, node);
        let command = decided.command(&s, id).expect("a command");
        let r = ok(&mut s, command);
        assert!(
            matches!(r, Applied::InstanceReplaced { released, .. } if released == id),
            "{r:?}"
        );
        assert_eq!(s.instance_count(&t("globex"), "chat"), 2);
        assert!(s.instances_on(&node).all(|i| i.id != id));
    }
    // Two of the tenant's instances on a drained node, quota room for one
    // more (600 milli each of 2 000): the first places first; the second waits (its quota is held
    // by that replacement for a moment) instead of moving in one step.
    let mut s = region();
    deploy(&mut s, spec("globex", "a", Tier::Guaranteed, 600, 4_000));
    deploy(&mut s, spec("globex", "b", Tier::Guaranteed, 600, 4_000));
    let (a, b) = (place(&mut s, "globex", "a"), place(&mut s, "globex", "b"));
    let node = s.instance(a).unwrap().slices[0].gpu.node.clone();
    assert_eq!(s.instance(b).unwrap().slices[0].gpu.node, node);
    drain_or_lose(&mut s, &node, true);
    let first = plan_evacuation(&s, a, true, &policy, T0).unwrap_or_else(|r| panic!("{r}"));
    assert!(
        matches!(first, Replacement::Migrate(_, MigrationCause::Drain)),
        "{first:?}"
    );
    let command = first.command(&s, a).unwrap();
    ok(&mut s, command);
    let second = plan_evacuation(&s, b, true, &policy, T0).unwrap_err();
    assert_eq!(second.code(), "quota_exceeded", "{second}");
    // Once the first's old instance is released, the second places first.
    ok(&mut s, DomainCommand::InstanceRelease { instance: a });
    let second = plan_evacuation(&s, b, true, &policy, T0).unwrap_or_else(|r| panic!("{r}"));
    assert!(
        matches!(second, Replacement::Migrate(_, MigrationCause::Drain)),
        "{second:?}"
    );
    // With room in the quota, a drain still places first.
    let mut s = region();
    deploy(&mut s, spec("globex", "chat", Tier::Guaranteed, 500, 4_000));
    let id = place(&mut s, "globex", "chat");
    let node = s.instance(id).unwrap().slices[0].gpu.node.clone();
    drain_or_lose(&mut s, &node, true);
    let decided = plan_evacuation(&s, id, true, &policy, T0).unwrap_or_else(|r| panic!("{r}"));
    assert!(
        matches!(decided, Replacement::Migrate(_, MigrationCause::Drain)),
        "{decided:?}"
    );
}

/// A tenant without quota to make first, with two instances on a drained
/// node, the lower-numbered of which fits nowhere else: the other one
/// moves in one step, where it waited for that one's turn forever before.
/// It still waits while a plan holding the quota is being committed (and
/// while a sibling makes its replacement first: the test above).
#[test]
fn a_drained_instance_does_not_wait_for_a_sibling_that_cannot_move() {
    let policy = best_fit();
    let mut s = region();
    ok(
        &mut s,
        DomainCommand::TenantCreate {
            tenant: t("tiny"),
            display_name: None,
            quotas: BTreeMap::from([
                (PoolKind::Center, quota(1_700, 16_384, 4)),
                (PoolKind::Edge, quota(0, 0, 0)),
            ]),
        },
    );
    let at = |node: &str, index, compute_milli, memory_mib| Slice {
        gpu: gpu(node, index),
        compute_milli,
        memory_mib,
    };
    let mut place_at = |tenant: &str, name: &str, slice: Slice| {
        let f = spec(
            tenant,
            name,
            Tier::Guaranteed,
            slice.compute_milli,
            slice.memory_mib,
        );
        deploy(&mut s, f);
        let cmd = DomainCommand::InstancePlace {
            tenant: t(tenant),
            function: name.into(),
            slices: vec![slice],
        };
        match ok(&mut s, cmd) {
            Applied::InstancePlaced { instance, .. } => instance,
            other => panic!("{other:?}"),
        }
    };
    // tiny near its quota on c2: `big` (1 000 milli, 12 GiB) and `small`
    // (500 milli) leave 200 milli, too little for `small` to make first.
    let big = place_at("tiny", "big", at("c2", 0, 1_000, 12_288));
    let small = place_at("tiny", "small", at("c2", 1, 500, 2_048));
    assert!(big < small);
    // c1 keeps room for `small` only (500 milli, 6 GiB on GPU 1).
    place_at("acme", "x", at("c1", 0, 1_000, 4_096));
    place_at("acme", "y", at("c1", 1, 500, 10_240));
    drain_or_lose(&mut s, &n("c2"), true);
    // `big` fits nowhere (no GPU has 1 000 milli free, no edge quota).
    assert!(plan_evacuation(&s, big, true, &policy, T0).is_err());
    // While a plan of a batch being committed holds tiny's center quota,
    // `small` waits a tick (that quota may free); one holding its edge
    // quota does not hold it back.
    let other = spec("tiny", "other", Tier::Guaranteed, 100, 512);
    for (node, waits) in [("c1", true), ("ea1", false)] {
        let mut pending = PendingPlans::default();
        pending.reserve(&s, &other, &[at(node, 0, 100, 512)]);
        let with_pending = PlacementPolicy {
            pending: Some(&pending),
            ..best_fit()
        };
        let decided = plan_evacuation(&s, small, true, &with_pending, T0);
        match decided {
            Err(r) => assert!(waits, "{node}: {r}"),
            Ok(d) => assert!(!waits && matches!(d, Replacement::Move(_)), "{node}: {d:?}"),
        }
    }
    // `small` cannot make first (the quota), and `big` is not making
    // its replacement first: it moves in one step now.
    let decided = plan_evacuation(&s, small, true, &policy, T0).unwrap_or_else(|r| panic!("{r}"));
    let Replacement::Move(slices) = &decided else {
        panic!("{decided:?}");
    };
    assert_eq!(slices[0].gpu, gpu("c1", 1));
    let cmd = decided.command(&s, small).expect("a command");
    ok(&mut s, cmd);
    assert!(s.instances_on(&n("c2")).all(|i| i.id != small));
}

/// A drain makes its replacement first as a migration recorded in the
/// replicated state: a leader elected mid-drain, planning on the same
/// state, finds it and places no second replacement; the migration ends
/// (the old instance released) once the new one is ready, or after the
/// drain's wait even if not; `max_instances` counts the pair once.
#[test]
fn a_drains_replacement_is_a_migration_a_new_leader_finds() {
    let policy = best_fit();
    let mut s = region();
    let mut f = spec("globex", "chat", Tier::Guaranteed, 500, 4_000);
    f.max_instances = 1;
    deploy(&mut s, f);
    let id = place(&mut s, "globex", "chat");
    let node = s.instance(id).unwrap().slices[0].gpu.node.clone();
    drain_or_lose(&mut s, &node, true);
    // At max_instances: still made first (the pair counts once).
    let decided = plan_evacuation(&s, id, true, &policy, T0).unwrap_or_else(|r| panic!("{r}"));
    let command = decided.command(&s, id).expect("a command");
    assert!(
        matches!(
            &command,
            DomainCommand::InstanceMigrate { instance, cause: MigrationCause::Drain, .. }
                if *instance == id
        ),
        "{command:?}"
    );
    let Applied::InstanceMigrating { instance: new, .. } = ok(&mut s, command) else {
        panic!("not a migration");
    };
    assert_eq!(s.instance_count(&t("globex"), "chat"), 1);
    // The old leader's task is gone; the new leader sees the migration in
    // the state (its worker skips a side of a migration), and apply
    // refuses a second one for the instance.
    let m = s.migration_of(id).expect("recorded");
    assert_eq!((m.from, m.to, m.cause), (id, new, MigrationCause::Drain));
    let again = plan_evacuation(&s, id, true, &policy, T0).unwrap_or_else(|r| panic!("{r}"));
    let cmd = again.command(&s, id).expect("a plan");
    let e = refused(&mut s, cmd);
    assert_eq!(e.code(), "migration_conflict", "{e}");
    // Not ready: nothing before the drain's wait, then completed all the
    // same; ready: completed at once.
    let never = |_: &Instance| false;
    let always = |_: &Instance| true;
    let wait = 60_000;
    let at = T0 + MUST_FINISH_AFTER_MS;
    assert_eq!(
        migration_steps(&s, &never, at - 1, wait, &BTreeMap::new()),
        vec![]
    );
    let done = MigrationStep::Complete { from: id, to: new };
    assert_eq!(
        migration_steps(&s, &always, T0 + 1, wait, &BTreeMap::new()),
        vec![done]
    );
    assert_eq!(
        migration_steps(&s, &never, at, wait, &BTreeMap::new()),
        vec![done]
    );
    // A new leader whose clock runs 20 s ahead forces it only
    // MUST_FINISH_AFTER_MS after its first sight of it.
    let ahead = T0 + 20_000;
    let seen = BTreeMap::from([(new, ahead)]);
    assert_eq!(migration_steps(&s, &never, ahead, wait, &seen), vec![]);
    assert_eq!(
        migration_steps(&s, &never, ahead + MUST_FINISH_AFTER_MS, wait, &seen),
        vec![done]
    );
    // Undrained meanwhile, the old one serves on until the new one is
    // ready (or is given up after the general wait).
    let mut undrained = s.clone();
    ok(
        &mut undrained,
        DomainCommand::NodeDrainSet {
            node: node.clone(),
            drain: false,
        },
    );
    assert_eq!(
        migration_steps(&undrained, &never, at, wait, &BTreeMap::new()),
        vec![]
    );
    assert_eq!(
        migration_steps(&undrained, &always, at, wait, &BTreeMap::new()),
        vec![done]
    );
    assert_eq!(
        migration_steps(&undrained, &never, T0 + wait, wait, &BTreeMap::new()),
        vec![MigrationStep::Abort { from: id, to: new }]
    );
    ok(
        &mut s,
        DomainCommand::InstanceRelease {
            instance: done.releases(),
        },
    );
    assert!(s.instances_on(&node).next().is_none());
    assert_eq!(s.instance_count(&t("globex"), "chat"), 1);
    assert!(s.migration_of(new).is_none());
}

/// A drained instance that a reshaping update has not replaced yet is
/// replaced by one of the current version: a roll's migration (a drain's
/// would be refused, its instance being outgoing), and the pair counts
/// as the roll's does.
#[test]
fn a_drained_outgoing_instance_is_replaced_by_the_current_version() {
    let policy = best_fit();
    let mut s = region();
    let mut f = spec("globex", "chat", Tier::Guaranteed, 500, 4_000);
    f.max_instances = 1;
    deploy(&mut s, f.clone());
    let id = place(&mut s, "globex", "chat");
    let node = s.instance(id).unwrap().slices[0].gpu.node.clone();
    f.memory_mib = 5_000;
    ok(&mut s, DomainCommand::FunctionUpdate { spec: f });
    drain_or_lose(&mut s, &node, true);
    let decided = plan_evacuation(&s, id, true, &policy, T0).unwrap_or_else(|r| panic!("{r}"));
    let Replacement::Migrate(slices, MigrationCause::Roll) = &decided else {
        panic!("{decided:?}");
    };
    assert_eq!(slices[0].memory_mib, 5_000);
    let cmd = decided.command(&s, id).unwrap();
    let Applied::InstanceMigrating { instance: new, .. } = ok(&mut s, cmd) else {
        panic!("not a migration");
    };
    assert_eq!(s.instance(new).map(|i| i.version), Some(2));
    assert_eq!(s.instance_count(&t("globex"), "chat"), 1);
    // The roll planned for it now finds the migration: nothing more.
    assert_eq!(
        plan_replacement(&s, id, &policy, T0).unwrap(),
        Replacement::Nothing
    );
    // Forced at the wait, as a drain's (the old version is leaving).
    assert_eq!(
        migration_steps(
            &s,
            &|_| false,
            T0 + MUST_FINISH_AFTER_MS,
            60_000,
            &BTreeMap::new()
        ),
        vec![MigrationStep::Complete { from: id, to: new }]
    );
}

/// `globex/chat` (max 2) with two instances `a`, `b`, then reshaped (more
/// memory) with `max_instances = max`: both outgoing.
fn two_outgoing(max: u32) -> (RegionState, InstanceId, InstanceId) {
    let mut s = region();
    let mut f = spec("globex", "chat", Tier::Guaranteed, 300, 4_000);
    f.max_instances = 2;
    deploy(&mut s, f.clone());
    let (a, b) = (
        place(&mut s, "globex", "chat"),
        place(&mut s, "globex", "chat"),
    );
    f.memory_mib = 5_000;
    f.max_instances = max;
    ok(&mut s, DomainCommand::FunctionUpdate { spec: f });
    (s, a, b)
}

/// A drained or lost outgoing instance of a function that already has
/// `max_instances` current ones just goes, as the roll would release it
/// (a replacement would be refused on `max_instances` every tick).
#[test]
fn a_drained_or_lost_outgoing_instance_at_max_instances_is_released() {
    let policy = best_fit();
    // A reshape that also lowers max_instances to one: both outgoing.
    let (mut s, a, b) = two_outgoing(1);
    let c = place(&mut s, "globex", "chat");
    assert_eq!(s.instance_count(&t("globex"), "chat"), 1);
    let node = s.instance(b).unwrap().slices[0].gpu.node.clone();
    for drain in [true, false] {
        let mut s = s.clone();
        drain_or_lose(&mut s, &node, drain);
        let decided = plan_evacuation(&s, b, drain, &policy, T0).unwrap_or_else(|r| panic!("{r}"));
        assert_eq!(decided, Replacement::Release, "drain {drain}");
        let cmd = decided.command(&s, b).unwrap();
        ok(&mut s, cmd);
        assert!(s.instance(b).is_none());
        assert!(s.instance(a).is_some() && s.instance(c).is_some());
    }
}

/// The release of a drained outgoing instance is decided on the view
/// alone: a pending move of a current instance (which keeps the count)
/// does not make it look as if `max_instances` current ones existed.
#[test]
fn a_pending_move_does_not_release_a_drained_outgoing_instance() {
    let (mut s, a, b) = two_outgoing(2);
    let r = place(&mut s, "globex", "chat");
    ok(&mut s, DomainCommand::InstanceRelease { instance: a });
    assert_eq!(s.instance_count(&t("globex"), "chat"), 1);
    // A drain of `r` is being planned in the same batch: pending.
    let mut pending = PendingPlans::default();
    let slices = s.instance(r).unwrap().slices.clone();
    pending.reserve_command(
        &s,
        &DomainCommand::InstanceMigrate {
            instance: r,
            slices,
            cause: MigrationCause::Drain,
        },
    );
    assert_eq!(pending.count(&t("globex"), "chat"), 1);
    let node = s.instance(b).unwrap().slices[0].gpu.node.clone();
    drain_or_lose(&mut s, &node, true);
    let policy = PlacementPolicy {
        pending: Some(&pending),
        ..best_fit()
    };
    // Not released: the planner, counting the pending plan, finds no
    // room under max_instances this time (planned again next tick).
    let decided = plan_evacuation(&s, b, true, &policy, T0);
    let e = decided.expect_err("no release");
    assert_eq!(e.code(), "max_instances", "{e}");
    let rolled = plan_replacement(&s, b, &policy, T0);
    assert!(!matches!(rolled, Ok(Replacement::Release)), "{rolled:?}");
    // Without the pending plan: a roll migration.
    let decided = plan_evacuation(&s, b, true, &best_fit(), T0).unwrap();
    assert!(
        matches!(decided, Replacement::Migrate(_, MigrationCause::Roll)),
        "{decided:?}"
    );
}
