//! Scale-in candidates: each instance's tier, its fullest GPU and whether
//! it is the last one on a node with requests waiting.

use super::*;
use crate::autoscale::pick_scale_in;
use std::collections::BTreeSet;

fn place_on(
    s: &mut RegionState,
    tenant: &str,
    name: &str,
    node: &str,
    index: u32,
    mib: u64,
) -> InstanceId {
    let cmd = DomainCommand::InstancePlace {
        tenant: t(tenant),
        function: name.into(),
        slices: vec![Slice {
            gpu: gpu(node, index),
            compute_milli: 250,
            memory_mib: mib,
        }],
    };
    match ok(s, cmd) {
        Applied::InstancePlaced { instance, .. } => instance,
        other => panic!("{other:?}"),
    }
}

#[test]
fn candidates_report_the_fullest_gpu_and_protect_the_last_copy_where_requests_wait() {
    let mut s = region();
    let mut f = spec("acme", "f", Tier::Guaranteed, 250, 4_096);
    f.min_instances = 0;
    deploy(&mut s, f);
    let mut g = spec("globex", "g", Tier::Guaranteed, 250, 8_192);
    g.min_instances = 0;
    deploy(&mut s, g);
    let a = place_on(&mut s, "acme", "f", "c1", 0, 4_096);
    let b = place_on(&mut s, "acme", "f", "c1", 0, 4_096);
    let c = place_on(&mut s, "acme", "f", "c2", 1, 4_096);
    place_on(&mut s, "globex", "g", "c2", 1, 8_192);
    s.check_invariants().unwrap();

    let none = BTreeSet::new();
    let got = s.scale_in_candidates(&t("acme"), "f", &none);
    let by_id: BTreeMap<_, _> = got.iter().map(|c| (c.id, c)).collect();
    assert_eq!(by_id.len(), 3);
    // c1/0 holds 8 GiB of 16; c2/1 holds 12 GiB of 16.
    assert_eq!(by_id[&a].gpu_used_ppm, 500_000);
    assert_eq!(by_id[&b].gpu_used_ppm, 500_000);
    assert_eq!(by_id[&c].gpu_used_ppm, 750_000);
    assert!(got
        .iter()
        .all(|c| !c.last_on_node_with_waiting && c.tier == Tier::Guaranteed));
    // The emptiest GPU first, then the lowest id.
    assert_eq!(pick_scale_in(&got).map(|c| c.id), Some(a));

    // Requests wait on c2, where `c` is the only copy: it is protected.
    let c2 = BTreeSet::from([NodeId("c2".into())]);
    let got = s.scale_in_candidates(&t("acme"), "f", &c2);
    let protected: Vec<_> = got
        .iter()
        .filter(|c| c.last_on_node_with_waiting)
        .map(|c| c.id)
        .collect();
    assert_eq!(protected, vec![c]);
    // On c1 there are two copies: neither is the last.
    let c1 = BTreeSet::from([NodeId("c1".into())]);
    let got = s.scale_in_candidates(&t("acme"), "f", &c1);
    assert!(got.iter().all(|c| !c.last_on_node_with_waiting));
    // Another tenant's function has no candidates under this name.
    assert!(s.scale_in_candidates(&t("globex"), "f", &none).is_empty());
}

fn load(concurrency: u32) -> crate::protocol::RegionLoad {
    crate::protocol::RegionLoad {
        arrivals: u64::from(concurrency),
        concurrency,
        ..Default::default()
    }
}

#[test]
fn the_autoscalers_scale_a_loaded_function_out_and_an_idle_one_in() {
    use crate::autoscale::{Autoscalers, Params, Rule, ScaleAction};
    let mut s = region();
    // 250 milli of a GPU saturating at 1000: 80 ms a request, a 500 ms
    // deadline: 6 at once, target 4.2 at 70 %.
    deploy(&mut s, spec("acme", "f", Tier::Burstable, 250, 1_024));
    let first = place(&mut s, "acme", "f");
    let p = Params::default();
    let key = (t("acme"), "f".to_string());
    let mut a = Autoscalers::default();
    let none = BTreeMap::new();
    let no_wait: BTreeMap<_, BTreeSet<NodeId>> = BTreeMap::new();
    let t0 = T0;

    // No report: nothing to do.
    let steps = a.step(&p, &s, &none, &no_wait, t0);
    assert_eq!(steps.len(), 1);
    assert_eq!(
        (steps[0].decision.rule, steps[0].action.clone()),
        (Rule::NoSignal, None)
    );

    // 20 requests at once: ceil(20 / 4.2) = 5 instances, in panic.
    let busy = BTreeMap::from([(key.clone(), load(20))]);
    let steps = a.step(&p, &s, &busy, &no_wait, t0 + 1_000);
    assert_eq!(steps[0].decision.target_milli, 4_200);
    assert_eq!(steps[0].decision.desired, 5);
    assert!(steps[0].decision.panic);
    assert_eq!(steps[0].action, Some(ScaleAction::Out { desired: 5 }));

    // Placed: five instances, and then the load stops.
    let mut ids = vec![first];
    for _ in 0..4 {
        ids.push(place(&mut s, "acme", "f"));
    }
    let idle = BTreeMap::from([(key.clone(), load(0))]);
    let mut at = t0 + 2_000;
    // Panic mode holds for a stable window (60 s) after its condition last
    // held (at 1 s, so until 61 s), and recommends no fewer than there are;
    // the scale-in delay (idle_timeout_s = 60 s) then holds the last of
    // those (at 60 s) until 120 s: five throughout.
    while at <= t0 + 120_000 {
        let steps = a.step(&p, &s, &idle, &no_wait, at);
        assert_eq!(steps[0].decision.desired, 5, "at {at}");
        assert_eq!(steps[0].action, None);
        at += 1_000;
    }
    // Past both: at most halve, releasing the candidate pick_scale_in
    // ranks first.
    let steps = a.step(&p, &s, &idle, &no_wait, t0 + 121_000);
    assert_eq!(steps[0].decision.desired, 3);
    assert_eq!(steps[0].decision.rule, Rule::ScaleDownRate);
    let expected =
        crate::autoscale::pick_scale_in(&s.scale_in_candidates(&t("acme"), "f", &BTreeSet::new()))
            .map(|c| c.id)
            .unwrap();
    assert_eq!(
        steps[0].action,
        Some(ScaleAction::In { instance: expected })
    );
    assert!(ids.contains(&expected));

    // Never below min_instances (1): with one instance left it keeps it.
    for id in ids.iter().filter(|i| **i != first) {
        ok(&mut s, DomainCommand::InstanceRelease { instance: *id });
    }
    let steps = a.step(&p, &s, &idle, &no_wait, t0 + 400_000);
    assert_eq!(steps[0].decision.desired, 1);
    assert_eq!(steps[0].action, None);

    // A function with a fixed count has no autoscaler and no step.
    let mut fixed = spec("acme", "fixed", Tier::Burstable, 250, 1_024);
    fixed.max_instances = fixed.min_instances;
    deploy(&mut s, fixed);
    let steps = a.step(&p, &s, &idle, &no_wait, T0 + 400_500);
    assert_eq!(
        steps.iter().map(|s| s.key.1.as_str()).collect::<Vec<_>>(),
        vec!["f"]
    );
    ok(
        &mut s,
        DomainCommand::FunctionDelete {
            tenant: t("acme"),
            name: "fixed".into(),
        },
    );

    // A deleted function's autoscaler is forgotten.
    ok(
        &mut s,
        DomainCommand::FunctionDelete {
            tenant: t("acme"),
            name: "f".into(),
        },
    );
    assert!(a.step(&p, &s, &idle, &no_wait, t0 + 401_000).is_empty());
    assert!(a.is_empty());
}

#[test]
fn an_outgoing_instance_is_not_a_scale_in_candidate() {
    let mut s = region();
    let f = spec("acme", "f", Tier::Guaranteed, 250, 1_024);
    deploy(&mut s, f.clone());
    let old = place(&mut s, "acme", "f");
    // A reshaping update (more memory) leaves `old` outgoing.
    let mut g = f;
    g.memory_mib = 2_048;
    ok(&mut s, DomainCommand::FunctionUpdate { spec: g });
    assert_eq!(
        s.outgoing(&t("acme"), "f")
            .map(|i| i.id)
            .collect::<Vec<_>>(),
        vec![old]
    );
    assert!(s
        .scale_in_candidates(&t("acme"), "f", &BTreeSet::new())
        .is_empty());
    let new = place(&mut s, "acme", "f");
    let ids: Vec<_> = s
        .scale_in_candidates(&t("acme"), "f", &BTreeSet::new())
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(ids, vec![new]);
}

#[test]
fn a_decision_to_zero_releases_the_last_instance_and_a_wake_is_not_released_at_once() {
    use crate::autoscale::{Autoscalers, Params, Rule, ScaleAction};
    let mut s = region();
    let mut f = spec("acme", "f", Tier::Burstable, 250, 1_024);
    f.min_instances = 0;
    deploy(&mut s, f);
    let i = place(&mut s, "acme", "f");
    let key = (t("acme"), "f".to_string());
    let idle = BTreeMap::from([(key.clone(), load(0))]);
    let no_wait: BTreeMap<_, BTreeSet<NodeId>> = BTreeMap::new();
    let mut a = Autoscalers::default();
    let p = Params::default();
    // idle_timeout_s = 60: idle from the first tick, to zero 60 s later.
    for at in (0..60).map(|k| T0 + k * 1_000) {
        let steps = a.step(&p, &s, &idle, &no_wait, at);
        assert_ne!(steps[0].decision.rule, Rule::ToZero, "at {at}");
        assert_eq!(steps[0].action, None, "at {at}");
    }
    let steps = a.step(&p, &s, &idle, &no_wait, T0 + 60_000);
    assert_eq!(steps[0].decision.rule, Rule::ToZero);
    assert_eq!(steps[0].decision.desired, 0);
    assert_eq!(steps[0].action, Some(ScaleAction::In { instance: i }));
    ok(&mut s, DomainCommand::InstanceRelease { instance: i });
    assert_eq!(s.instance_count(&t("acme"), "f"), 0);

    // At zero nothing reports it: the autoscaler asks for nothing.
    let none = BTreeMap::new();
    let steps = a.step(&p, &s, &none, &no_wait, T0 + 100_000);
    assert_eq!(
        (steps[0].decision.desired, steps[0].action.clone()),
        (0, None)
    );

    // A held request wakes it at T1. Until its agent reports (the ticks
    // see no load, or an old idle one) the instance is not released: its
    // placement counts as activity for idle_timeout_s.
    let t1 = T0 + 120_000;
    let cmd = plan(&s, &t("acme"), "f", &BestFit).unwrap().command();
    let woken = match s.apply(cmd, t1).unwrap() {
        Applied::InstancePlaced { instance, .. } => instance,
        other => panic!("{other:?}"),
    };
    for at in (1..60).map(|k| t1 + k * 1_000) {
        let loads = if at < t1 + 5_000 { &none } else { &idle };
        let steps = a.step(&p, &s, loads, &no_wait, at);
        assert_ne!(steps[0].decision.rule, Rule::ToZero, "at {at}");
        assert_eq!(steps[0].action, None, "at {at}");
    }
    // Idle for idle_timeout_s after the wake: to zero again.
    let steps = a.step(&p, &s, &idle, &no_wait, t1 + 60_000);
    assert_eq!(steps[0].decision.rule, Rule::ToZero);
    assert_eq!(steps[0].action, Some(ScaleAction::In { instance: woken }));
}

#[test]
fn a_drain_or_replacement_under_way_holds_the_autoscaler() {
    use crate::autoscale::{Autoscalers, Params, ScaleAction};
    let mut s = region();
    deploy(&mut s, spec("acme", "f", Tier::Burstable, 250, 1_024));
    let i = place(&mut s, "acme", "f");
    let node = s.instance(i).unwrap().slices[0].gpu.node.clone();
    let key = (t("acme"), "f".to_string());
    let busy = BTreeMap::from([(key, load(20))]);
    let no_wait: BTreeMap<_, BTreeSet<NodeId>> = BTreeMap::new();
    let p = Params::default();
    let mut a = Autoscalers::default();
    assert_eq!(
        a.step(&p, &s, &busy, &no_wait, T0 + 1_000)[0].action,
        Some(ScaleAction::Out { desired: 5 })
    );
    // Its node is drained: the drain places one more and releases the old
    // one; the autoscaler keeps out of it.
    ok(
        &mut s,
        DomainCommand::NodeDrainSet {
            node: node.clone(),
            drain: true,
        },
    );
    let steps = a.step(&p, &s, &busy, &no_wait, T0 + 2_000);
    assert_eq!(steps[0].decision.desired, 5);
    assert_eq!(steps[0].action, None);
    ok(&mut s, DomainCommand::NodeDrainSet { node, drain: false });
    assert_eq!(
        a.step(&p, &s, &busy, &no_wait, T0 + 3_000)[0].action,
        Some(ScaleAction::Out { desired: 5 })
    );
}

#[test]
fn a_new_leaders_autoscaler_waits_out_the_scale_in_delay() {
    use crate::autoscale::{Autoscalers, Params, ScaleAction};
    let mut s = region();
    deploy(&mut s, spec("acme", "f", Tier::Burstable, 250, 1_024));
    for _ in 0..4 {
        place(&mut s, "acme", "f");
    }
    let key = (t("acme"), "f".to_string());
    let idle = BTreeMap::from([(key, load(0))]);
    let no_wait: BTreeMap<_, BTreeSet<NodeId>> = BTreeMap::new();
    let p = Params::default();
    // Taking over at T0 with four instances and no load: it keeps four for
    // idle_timeout_s (60 s), then halves.
    let mut a = Autoscalers::default();
    for at in (0..60).map(|k| T0 + k * 1_000) {
        let steps = a.step(&p, &s, &idle, &no_wait, at);
        assert_eq!(
            (steps[0].decision.desired, steps[0].action.clone()),
            (4, None),
            "at {at}"
        );
    }
    let steps = a.step(&p, &s, &idle, &no_wait, T0 + 61_000);
    assert_eq!(steps[0].decision.desired, 2);
    assert!(matches!(steps[0].action, Some(ScaleAction::In { .. })));
}

#[test]
fn the_tenants_quota_caps_a_scale_out_and_says_so() {
    use crate::autoscale::{Autoscalers, Params, Rule, ScaleAction};
    let mut s = region();
    // globex: two instances in center pools, none at the edge.
    for (kind, q) in [
        (PoolKind::Center, quota(2_000, 16_384, 2)),
        (PoolKind::Edge, quota(0, 0, 0)),
    ] {
        ok(
            &mut s,
            DomainCommand::QuotaSet {
                tenant: t("globex"),
                pool_kind: kind,
                quota: q,
            },
        );
    }
    let g = spec("globex", "g", Tier::Burstable, 250, 1_024);
    deploy(&mut s, g.clone());
    place(&mut s, "globex", "g");
    // Room for one more: compute 7, memory 15, instances 1.
    assert_eq!(s.quota_room(&g), 1);
    let key = (t("globex"), "g".to_string());
    let busy = BTreeMap::from([(key, load(20))]);
    let no_wait: BTreeMap<_, BTreeSet<NodeId>> = BTreeMap::new();
    let p = Params::default();
    let mut a = Autoscalers::default();
    // 20 at once wants 5; the quota leaves 2.
    let steps = a.step(&p, &s, &busy, &no_wait, T0 + 1_000);
    assert_eq!(
        (steps[0].decision.desired, steps[0].decision.rule),
        (2, Rule::Quota)
    );
    assert_eq!(steps[0].action, Some(ScaleAction::Out { desired: 2 }));
    // At the quota: the decision keeps two, no placement is asked for.
    place(&mut s, "globex", "g");
    assert_eq!(s.quota_room(&g), 0);
    let steps = a.step(&p, &s, &busy, &no_wait, T0 + 2_000);
    assert_eq!(
        (steps[0].decision.desired, steps[0].decision.rule),
        (2, Rule::Quota)
    );
    assert_eq!(steps[0].action, None);
    // Each pool kind has its own quota: the rooms of the kinds the
    // function may go to add up; an unknown tenant has none.
    ok(
        &mut s,
        DomainCommand::QuotaSet {
            tenant: t("globex"),
            pool_kind: PoolKind::Edge,
            quota: quota(1_000, 16_384, 3),
        },
    );
    assert_eq!(s.quota_room(&g), 3);
    ok(
        &mut s,
        DomainCommand::QuotaSet {
            tenant: t("globex"),
            pool_kind: PoolKind::Center,
            quota: quota(2_000, 16_384, 3),
        },
    );
    assert_eq!(s.quota_room(&g), 1 + 3, "center and edge rooms add up");
    let mut strict = g.clone();
    strict.pool = PoolPreference::CenterOnly;
    assert_eq!(s.quota_room(&strict), 1, "strict:center has no edge room");
    strict.pool = PoolPreference::EdgeOnly("hk-1".into());
    assert_eq!(s.quota_room(&strict), 3, "strict:edge has no center room");
    let mut stranger = g;
    stranger.tenant = t("nobody");
    assert_eq!(s.quota_room(&stranger), 0);
}

#[test]
fn apply_refuses_a_scale_in_below_min_instances() {
    let mut s = region();
    let mut f = spec("acme", "f", Tier::Guaranteed, 250, 4_096);
    f.min_instances = 1;
    deploy(&mut s, f.clone());
    let a = place_on(&mut s, "acme", "f", "c1", 0, 4_096);
    let b = place_on(&mut s, "acme", "f", "c2", 1, 4_096);

    // Two scale-ins decided on one view (2 > min 1 for both): the first
    // lands, the second is refused and changes nothing.
    ok(&mut s, DomainCommand::InstanceScaleIn { instance: a });
    let e = refused(&mut s, DomainCommand::InstanceScaleIn { instance: b });
    assert!(
        matches!(&e, ApplyError::MinInstances { function, min: 1 } if function == "f"),
        "{e:?}"
    );
    assert_eq!(e.code(), "min_instances");
    assert_eq!(s.instance_count(&t("acme"), "f"), 1);

    // One decided before min_instances was raised to 2 is refused too.
    let c = place_on(&mut s, "acme", "f", "c1", 0, 4_096);
    f.min_instances = 2;
    ok(&mut s, DomainCommand::FunctionUpdate { spec: f.clone() });
    let e = refused(&mut s, DomainCommand::InstanceScaleIn { instance: c });
    assert!(
        matches!(e, ApplyError::MinInstances { min: 2, .. }),
        "{e:?}"
    );

    // A plain release (a drain's old instance, its replacement placed) is
    // not a scale-in: no min check, as logs written before the scale-in
    // command applied it.
    let d = place_on(&mut s, "acme", "f", "c2", 1, 4_096);
    ok(&mut s, DomainCommand::InstanceRelease { instance: d });
    ok(&mut s, DomainCommand::InstanceRelease { instance: c });
    assert_eq!(s.instance_count(&t("acme"), "f"), 1);

    // At min 0 the last one goes (scale to zero).
    f.min_instances = 0;
    ok(&mut s, DomainCommand::FunctionUpdate { spec: f });
    ok(&mut s, DomainCommand::InstanceScaleIn { instance: b });
    assert_eq!(s.instance_count(&t("acme"), "f"), 0);
    let e = refused(&mut s, DomainCommand::InstanceScaleIn { instance: b });
    assert!(matches!(e, ApplyError::UnknownInstance { .. }), "{e:?}");
}

#[test]
fn an_outgoing_instance_scales_in_whatever_min_instances_says() {
    let mut s = region();
    let mut f = spec("acme", "f", Tier::Guaranteed, 250, 4_096);
    f.min_instances = 1;
    f.max_instances = 1;
    deploy(&mut s, f.clone());
    let old = place_on(&mut s, "acme", "f", "c1", 0, 4_096);
    // A reshaping update: `old` runs the earlier version, outgoing.
    f.memory_mib = 2_048;
    ok(&mut s, DomainCommand::FunctionUpdate { spec: f });
    assert_eq!(s.outgoing(&t("acme"), "f").count(), 1);
    assert_eq!(s.instance_count(&t("acme"), "f"), 0);
    ok(&mut s, DomainCommand::InstanceScaleIn { instance: old });
    assert_eq!(s.instances_of(&t("acme"), "f").count(), 0);
}

#[test]
fn the_scale_in_entry_and_its_refusal_are_appended_variants() {
    // Logs and peer frames are bincode: a variant's index is its encoding,
    // so new ones go last and the old ones keep theirs.
    let config = bincode::config::standard();
    let index = |bytes: Vec<u8>| bytes[0];
    let enc = |c: &DomainCommand| bincode::serde::encode_to_vec(c, config).unwrap();
    let id = InstanceId(7);
    assert_eq!(
        index(enc(&DomainCommand::InstanceRelease { instance: id })),
        11
    );
    assert_eq!(
        index(enc(&DomainCommand::InstanceScaleIn { instance: id })),
        23
    );
    let e = ApplyError::MinInstances {
        function: "f".into(),
        min: 1,
    };
    let bytes = bincode::serde::encode_to_vec(&e, config).unwrap();
    assert_eq!(index(bytes), 31);
}
