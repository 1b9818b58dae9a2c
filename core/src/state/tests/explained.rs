//! The planner explains itself: a function larger than every GPU is
//! unsatisfiable (naming the largest GPU), and a plan that finds a place
//! says what it passed over.

use super::*;

#[test]
fn a_function_larger_than_every_gpu_is_unsatisfiable_naming_the_largest() {
    let s = region();
    // 18 GiB on a region of 16 GiB GPUs: no load could ever take it.
    let f = spec("acme", "big", Tier::Guaranteed, 500, 18_432);
    let r = plan_spec(&s, &f, &BestFit).unwrap_err();
    assert_eq!(r.code(), "unsatisfiable", "{r}");
    match &r.reason {
        RejectReason::Unsatisfiable {
            gpu: g,
            model,
            memory_mib,
        } => {
            assert_eq!(
                (g, model.as_str(), *memory_mib),
                (&gpu("c1", 0), "g16", 16_384)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(r.to_string().contains("c1/gpu0"), "{r}");
    // Exactly a GPU's size is satisfiable.
    let f = spec("acme", "edge-of", Tier::Guaranteed, 500, 16_384);
    assert!(unsatisfiable(s.topology().unwrap(), &f).is_none());
    // Exclusive: two whole GPUs of one node hold 32 GiB, three GPUs no node has.
    let two = spec("acme", "two", Tier::Exclusive, 2_000, 32_768);
    assert!(unsatisfiable(s.topology().unwrap(), &two).is_none());
    let more = spec("acme", "more", Tier::Exclusive, 2_000, 32_769);
    assert!(unsatisfiable(s.topology().unwrap(), &more).is_some());
    let three = spec("acme", "three", Tier::Exclusive, 3_000, 1_000);
    assert!(unsatisfiable(s.topology().unwrap(), &three).is_some());
}

#[test]
fn a_full_region_is_not_unsatisfiable() {
    let mut s = region();
    ok(
        &mut s,
        DomainCommand::QuotaSet {
            tenant: t("acme"),
            pool_kind: PoolKind::Center,
            quota: quota(100_000, 1_000_000, 100),
        },
    );
    let mut f = spec("acme", "fat", Tier::Guaranteed, 100, 15_000);
    f.pool = PoolPreference::Center;
    deploy(&mut s, f);
    // Until nothing is left (quota or capacity) ...
    let mut placed = 0;
    while let Ok(p) = plan(&s, &t("acme"), "fat", &BestFit) {
        ok(&mut s, p.command());
        placed += 1;
    }
    assert!(placed >= 4, "{placed}");
    // ... busy GPUs are a 409 of capacity or quota, never 422: the function
    // could fit later.
    let r = plan(&s, &t("acme"), "fat", &BestFit).unwrap_err();
    assert!(matches!(r.code(), "gpu_full" | "quota_exceeded"), "{r}");
}

#[test]
fn a_plan_that_finds_a_place_says_what_it_passed_over() {
    let mut s = region();
    ok(
        &mut s,
        DomainCommand::QuotaSet {
            tenant: t("acme"),
            pool_kind: PoolKind::Center,
            quota: quota(100_000, 1_000_000, 100),
        },
    );
    let mut f = spec("acme", "fat", Tier::Guaranteed, 100, 15_000);
    f.pool = PoolPreference::Center;
    deploy(&mut s, f);
    for _ in 0..3 {
        place(&mut s, "acme", "fat");
    }
    // One center GPU is left: the other three are rejected for memory.
    let f = s.function(&t("acme"), "fat").unwrap().spec.clone();
    let (p, metric) = plan_spec_explained(&s, &f, &BestFit, &PlanOptions::default())
        .unwrap_or_else(|r| panic!("{r}"));
    assert_eq!(p.pool, "dc");
    assert_eq!(metric.nodes_evaluated, 2);
    assert_eq!(metric.gpus_evaluated, 4);
    assert_eq!(metric.exhausted.get(&GpuDimension::Memory), Some(&3));
    // The same plan without the metric.
    assert_eq!(plan_spec(&s, &f, &BestFit).unwrap(), p);
}
