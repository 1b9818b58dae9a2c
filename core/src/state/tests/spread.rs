//! A function's instances spread over GPUs: a GPU that holds no instance
//! of the function wins over one that does, within the pool group (the
//! agent keeps one copy of a function per GPU, so a second instance on
//! the same GPU would add no capacity).

use super::*;
use std::collections::BTreeSet;

fn policy<'a>(options: PlanOptions, pending: Option<&'a PendingPlans>) -> PlacementPolicy<'a> {
    PlacementPolicy {
        ranking: &BestFit,
        options,
        pending,
        prefer: &[],
        avoid: &[],
    }
}

fn center_spec(name: &str) -> FunctionSpec {
    let mut f = spec("acme", name, Tier::Guaranteed, 250, 1_000);
    f.pool = PoolPreference::Center;
    f
}

fn gpus_of(p: &PlacementPlan) -> Vec<GpuId> {
    p.instances
        .iter()
        .map(|i| i.slices[0].gpu.clone())
        .collect()
}

const OPTIONS: [PlanOptions; 3] = [
    PlanOptions {
        feasible_limit: None,
        start: 0,
        indexed: false,
    },
    PlanOptions {
        feasible_limit: None,
        start: 0,
        indexed: true,
    },
    PlanOptions {
        feasible_limit: Some(1),
        start: 0,
        indexed: false,
    },
];

#[test]
fn a_second_instance_goes_to_another_gpu_where_best_fit_would_stack_it() {
    let mut s = region();
    deploy(&mut s, center_spec("f"));
    let first = place(&mut s, "acme", "f");
    assert_eq!(s.instance(first).unwrap().slices[0].gpu, gpu("c1", 0));
    let f = s.function(&t("acme"), "f").unwrap().spec.clone();
    for options in OPTIONS {
        let p = plan_placements(&s, &f, 1, &policy(options, None), T0).unwrap();
        // c1/0 is the best fit, but it holds f already: the next best.
        assert_eq!(gpus_of(&p), [gpu("c1", 1)], "{options:?}");
    }
    // Another function's instance still stacks on the fullest GPU.
    let g = center_spec("g");
    deploy(&mut s, g.clone());
    for options in OPTIONS {
        let p = plan_placements(&s, &g, 1, &policy(options, None), T0).unwrap();
        assert_eq!(gpus_of(&p), [gpu("c1", 0)], "{options:?}");
    }
}

#[test]
fn a_plan_of_several_instances_and_pending_plans_spread_over_gpus() {
    let s = region();
    let f = center_spec("f");
    for options in OPTIONS {
        let p = plan_placements(&s, &f, 4, &policy(options, None), T0).unwrap();
        let gpus = gpus_of(&p);
        let apart: BTreeSet<&GpuId> = gpus.iter().collect();
        assert_eq!(apart.len(), 4, "{options:?}: {gpus:?}");
    }
    // A plan reserved but not applied yet counts as a sibling too.
    let mut pending = PendingPlans::default();
    let one = plan_placements(&s, &f, 1, &policy(OPTIONS[0], None), T0).unwrap();
    pending.reserve(&s, &f, &one.instances[0].slices);
    for options in OPTIONS {
        let p = plan_placements(&s, &f, 1, &policy(options, Some(&pending)), T0).unwrap();
        assert_ne!(gpus_of(&p), gpus_of(&one), "{options:?}");
    }
}

#[test]
fn with_every_gpu_of_the_group_taken_an_instance_shares_one_before_spilling() {
    let mut s = region();
    deploy(&mut s, center_spec("f"));
    let mut seen = BTreeSet::new();
    for _ in 0..4 {
        let i = place(&mut s, "acme", "f");
        seen.insert(s.instance(i).unwrap().slices[0].gpu.clone());
    }
    // The four center GPUs, one instance each.
    assert_eq!(seen.len(), 4, "{seen:?}");
    let f = s.function(&t("acme"), "f").unwrap().spec.clone();
    for options in OPTIONS {
        let p = plan_placements(&s, &f, 1, &policy(options, None), T0).unwrap();
        // The pool preference comes first: a center GPU again, not the edge.
        assert_eq!(p.instances[0].pool, "dc", "{options:?}");
    }
}
