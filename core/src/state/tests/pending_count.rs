//! The instances a decision to place more counts: applied plus pending
//! (planned and proposed, not applied yet), as the planner counts them
//! toward `max_instances`. Two wakes from zero of one function, the second
//! decided while the first one's placement commits, must see it.

use super::*;

fn policy(pending: Option<&PendingPlans>) -> PlacementPolicy<'_> {
    PlacementPolicy {
        ranking: &BestFit,
        options: PlanOptions::indexed(),
        pending,
        prefer: &[],
        avoid: &[],
    }
}

#[test]
fn a_pending_placement_counts_as_an_instance() {
    let mut s = region();
    let mut f = spec("acme", "f", Tier::Guaranteed, 250, 1_000);
    f.min_instances = 0;
    f.max_instances = 1;
    deploy(&mut s, f.clone());
    let (acme, name) = (t("acme"), "f");
    let mut pending = PendingPlans::default();
    assert_eq!(policy(Some(&pending)).instance_count(&s, &acme, name), 0);
    // The first wake's placement, reserved while it commits.
    let first = plan_placements(&s, &f, 1, &policy(Some(&pending)), T0).unwrap();
    let cmd = DomainCommand::InstancePlace {
        tenant: acme.clone(),
        function: name.into(),
        slices: first.placements().pop().unwrap(),
    };
    let tickets = pending.reserve_command(&s, &cmd);
    assert_eq!(tickets.len(), 1);
    // The view has none yet; the policy counts the pending one.
    assert_eq!(s.instance_count(&acme, name), 0);
    assert_eq!(policy(None).instance_count(&s, &acme, name), 0);
    assert_eq!(policy(Some(&pending)).instance_count(&s, &acme, name), 1);
    // Why the decision must read it: planning again is refused as full.
    let again = plan_placements(&s, &f, 1, &policy(Some(&pending)), T0).unwrap_err();
    assert_eq!(again.reason, RejectReason::MaxInstances { max: 1 });
    // Applied and released: counted once, from the view.
    ok(&mut s, cmd);
    for t in tickets {
        pending.release(&s, t);
    }
    assert_eq!(policy(Some(&pending)).instance_count(&s, &acme, name), 1);
}
