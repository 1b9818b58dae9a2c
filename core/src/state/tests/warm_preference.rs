//! A placement prefers a node that holds the function's weights in host
//! memory (warm resume), when that node fits, within its pool group.

use super::*;

fn policy<'a>(
    ranking: &'a dyn Ranking,
    options: PlanOptions,
    prefer: &'a [NodeId],
) -> PlacementPolicy<'a> {
    PlacementPolicy {
        ranking,
        options,
        pending: None,
        prefer,
        avoid: &[],
    }
}

fn node_of(p: &PlacementPlan) -> NodeId {
    p.instances[0].slices[0].gpu.node.clone()
}

fn center_spec(name: &str) -> FunctionSpec {
    let mut f = spec("acme", name, Tier::Guaranteed, 500, 4_000);
    f.pool = PoolPreference::Center;
    f
}

#[test]
fn a_fitting_node_with_a_host_copy_wins_over_a_better_scored_one() {
    let mut s = region();
    let f = center_spec("f");
    deploy(&mut s, f.clone());
    let c2 = NodeId("c2".into());
    for options in [PlanOptions::default(), PlanOptions::indexed()] {
        let plain = plan_placements(&s, &f, 1, &policy(&BestFit, options, &[]), T0).unwrap();
        // Without a preference the ranking picks c1 (the first of equals).
        assert_eq!(node_of(&plain), NodeId("c1".into()), "{options:?}");
        let warm = plan_placements(
            &s,
            &f,
            1,
            &policy(&BestFit, options, std::slice::from_ref(&c2)),
            T0,
        )
        .unwrap();
        assert_eq!(node_of(&warm), c2, "{options:?}");
        // A limited scan goes past its limit to reach it.
        let limited = PlanOptions {
            feasible_limit: Some(1),
            ..options
        };
        let warm = plan_placements(
            &s,
            &f,
            1,
            &policy(&BestFit, limited, std::slice::from_ref(&c2)),
            T0,
        )
        .unwrap();
        assert_eq!(node_of(&warm), c2, "{limited:?}");
    }
    // Only the first instance of a plan is preferred (one host copy).
    let two = plan_placements(
        &s,
        &f,
        2,
        &policy(&BestFit, PlanOptions::default(), std::slice::from_ref(&c2)),
        T0,
    )
    .unwrap();
    assert_eq!(node_of(&two), c2);
}

#[test]
fn a_preferred_node_that_does_not_fit_or_is_outside_the_pool_group_is_passed_over() {
    let mut s = region();
    // c2's GPUs are full (a whole-GPU guaranteed instance on each).
    let mut big = center_spec("big");
    big.memory_mib = 1_000;
    big.compute_milli = 1_000;
    deploy(&mut s, big.clone());
    for gpu_index in 0..2 {
        ok(
            &mut s,
            DomainCommand::InstancePlace {
                tenant: t("acme"),
                function: "big".into(),
                slices: vec![Slice {
                    gpu: gpu("c2", gpu_index),
                    compute_milli: 1_000,
                    memory_mib: 1_000,
                }],
            },
        );
    }
    let f = center_spec("f");
    deploy(&mut s, f.clone());
    let prefer = [NodeId("c2".into()), NodeId("ea1".into())];
    let p = plan_placements(
        &s,
        &f,
        1,
        &policy(&BestFit, PlanOptions::default(), &prefer),
        T0,
    )
    .unwrap();
    // c2 does not fit, ea1 is not in the asked (center) pool: c1.
    assert_eq!(node_of(&p), NodeId("c1".into()));
}
