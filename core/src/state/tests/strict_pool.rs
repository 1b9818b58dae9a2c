//! `strict_pool`: a strict preference (`strict:edge:<p>`, `strict:center`)
//! never leaves its pools. A full pool is the ordinary capacity rejection
//! (nothing placed; a later plan finds room when some frees up), a
//! function larger than every GPU of its pools is `unsatisfiable` naming
//! their largest, a strict pool the topology lacks is `unknown_pool`, and
//! apply refuses slices outside the pools whoever planned them.

use super::*;

/// acme's edge quota raised so that quota never decides here.
fn roomy() -> RegionState {
    let mut s = region();
    for kind in [PoolKind::Edge, PoolKind::Center] {
        ok(
            &mut s,
            DomainCommand::QuotaSet {
                tenant: t("acme"),
                pool_kind: kind,
                quota: quota(100_000, 1_000_000, 100),
            },
        );
    }
    s
}

/// 600 milli-GPU: one per GPU.
fn near(name: &str, pool: PoolPreference) -> FunctionSpec {
    let mut f = spec("acme", name, Tier::Guaranteed, 600, 4_096);
    f.pool = pool;
    f
}

/// Both planners (full scan and index) agree on `f`; the outcome.
fn both(s: &RegionState, f: &FunctionSpec) -> Result<Proposal, Box<PlanRejection>> {
    let full = plan_spec_with(s, f, &BestFit, &PlanOptions::default());
    let indexed = plan_spec_with(s, f, &BestFit, &PlanOptions::indexed());
    assert_eq!(
        full.as_ref().map_err(|r| r.to_string()),
        indexed.as_ref().map_err(|r| r.to_string()),
        "{f:?}"
    );
    full
}

#[test]
fn a_preference_spills_and_a_strict_pool_is_refused_when_its_pool_is_full() {
    let mut s = roomy();
    deploy(&mut s, near("loose", PoolPreference::Edge("edge-a".into())));
    deploy(
        &mut s,
        near("strict", PoolPreference::EdgeOnly("edge-a".into())),
    );
    // Room in edge-a: the strict one goes there.
    let p = both(&s, &s.function(&t("acme"), "strict").unwrap().spec).unwrap();
    assert_eq!(
        (p.pool.as_str(), &p.slices[0].gpu),
        ("edge-a", &gpu("ea1", 0))
    );
    ok(&mut s, p.command());
    // edge-a is full (600 + 600 > 1000): the preference spills to the
    // other edge pool, then to the center ...
    let loose = s.function(&t("acme"), "loose").unwrap().spec.clone();
    let p = both(&s, &loose).unwrap();
    assert_eq!(p.pool, "edge-b");
    ok(&mut s, p.command());
    let p = both(&s, &loose).unwrap();
    assert_eq!(p.pool_kind, PoolKind::Center);
    ok(&mut s, p.command());
    // ... the strict one is the capacity rejection of its pool alone:
    // one node, one GPU evaluated, nothing placed.
    let strict = s.function(&t("acme"), "strict").unwrap().spec.clone();
    let r = both(&s, &strict).unwrap_err();
    assert_eq!(r.code(), "gpu_full", "{r}");
    assert_eq!(
        r.reason,
        RejectReason::Gpu {
            gpu: gpu("ea1", 0),
            dimension: GpuDimension::Compute,
        }
    );
    assert_eq!((r.nodes_evaluated, r.gpus_evaluated), (1, 1), "{r}");
    assert_eq!(s.instance_count(&t("acme"), "strict"), 1);
    // The strict instance leaves: the next plan (an autoscaler's tick)
    // places in edge-a again.
    let id = s.instances_of(&t("acme"), "strict").next().unwrap().id;
    ok(&mut s, DomainCommand::InstanceRelease { instance: id });
    let p = both(&s, &strict).unwrap();
    assert_eq!(p.pool, "edge-a");
}

#[test]
fn a_strict_center_never_goes_to_the_edge() {
    let mut s = roomy();
    let mut f = near("central", PoolPreference::CenterOnly);
    f.max_instances = 10;
    deploy(&mut s, f.clone());
    // Four center GPUs take one each; then the center is full.
    for _ in 0..4 {
        let p = both(&s, &f).unwrap();
        assert_eq!(p.pool, "dc");
        ok(&mut s, p.command());
    }
    let r = both(&s, &f).unwrap_err();
    assert_eq!(r.code(), "gpu_full", "{r}");
    assert_eq!(r.nodes_evaluated, 2, "{r}");
    // The preference would go to the edge.
    f.pool = PoolPreference::Center;
    assert_eq!(both(&s, &f).unwrap().pool_kind, PoolKind::Edge);
}

#[test]
fn apply_refuses_slices_outside_a_strict_pool() {
    let mut s = roomy();
    deploy(
        &mut s,
        near("strict", PoolPreference::EdgeOnly("edge-a".into())),
    );
    let place_on = |node: &str| DomainCommand::InstancePlace {
        tenant: t("acme"),
        function: "strict".into(),
        slices: vec![Slice {
            gpu: gpu(node, 0),
            compute_milli: 600,
            memory_mib: 4_096,
        }],
    };
    for node in ["eb1", "c1"] {
        let e = refused(&mut s, place_on(node));
        assert_eq!(e.code(), "slice_mismatch", "{e}");
        assert!(e.to_string().contains("strict pool edge:edge-a"), "{e}");
    }
    let placed = match ok(&mut s, place_on("ea1")) {
        Applied::InstancePlaced { instance, .. } => instance,
        other => panic!("{other:?}"),
    };
    // A migration (an operator's move, say) out of the pool is refused too.
    let e = refused(
        &mut s,
        DomainCommand::InstanceMigrate {
            instance: placed,
            slices: vec![Slice {
                gpu: gpu("c1", 0),
                compute_milli: 600,
                memory_mib: 4_096,
            }],
            cause: MigrationCause::Operator,
        },
    );
    assert_eq!(e.code(), "slice_mismatch", "{e}");
}

/// The region of `region()` with edge-a's GPU an 8 GiB one.
fn small_edge() -> RegionState {
    let mut s = roomy();
    let text = format!(
        "[[gpu_models]]\nname = \"g8\"\nmemory_mib = 8_192\nh2d_mib_per_s = 12_000\n{}{PRICES}\n\
         [[pricing.prices]]\ngpu_model = \"g8\"\npool_kind = \"edge\"\ngpu_hour = 625_000\n\
         memory_gib_hour = 12_500\n",
        NODES.replacen(
            "gpus = [{ model = \"g16\", count = 1 }]",
            "gpus = [{ model = \"g8\", count = 1 }]",
            1
        )
    );
    ok(
        &mut s,
        DomainCommand::TopologyLoad {
            topology: topology(&text),
        },
    );
    s
}

#[test]
fn a_strict_function_larger_than_every_gpu_of_its_pool_is_unsatisfiable() {
    let s = small_edge();
    // 12 GiB: more than edge-a's 8 GiB GPU, less than the others' 16 GiB.
    let mut f = spec("acme", "big", Tier::Guaranteed, 500, 12_288);
    f.pool = PoolPreference::EdgeOnly("edge-a".into());
    let r = both(&s, &f).unwrap_err();
    assert_eq!(r.code(), "unsatisfiable", "{r}");
    assert_eq!(
        r.reason,
        RejectReason::Unsatisfiable {
            gpu: gpu("ea1", 0),
            model: "g8".into(),
            memory_mib: 8_192,
        }
    );
    // The preference is satisfiable: it spills to a 16 GiB GPU.
    f.pool = PoolPreference::Edge("edge-a".into());
    assert!(unsatisfiable(s.topology().unwrap(), &f).is_none());
    assert_eq!(both(&s, &f).unwrap().pool, "edge-b");
    // Strict edge-b (16 GiB) is satisfiable, and so is strict center.
    f.pool = PoolPreference::EdgeOnly("edge-b".into());
    assert_eq!(both(&s, &f).unwrap().pool, "edge-b");
    f.pool = PoolPreference::CenterOnly;
    assert_eq!(both(&s, &f).unwrap().pool, "dc");
    // An exclusive strict function compares with its pool's GPUs too.
    let mut x = spec("acme", "whole", Tier::Exclusive, 1_000, 12_288);
    x.pool = PoolPreference::EdgeOnly("edge-a".into());
    assert_eq!(both(&s, &x).unwrap_err().code(), "unsatisfiable");
    x.pool = PoolPreference::Edge("edge-a".into());
    assert!(both(&s, &x).is_ok());
}

#[test]
fn a_strict_pool_the_topology_lacks_is_refused() {
    let mut s = roomy();
    let f = near("lost", PoolPreference::EdgeOnly("edge-z".into()));
    let r = both(&s, &f).unwrap_err();
    assert_eq!(r.code(), "unknown_pool", "{r}");
    assert_eq!(
        r.reason,
        RejectReason::NoSuchPool {
            pool: "edge:edge-z".into()
        }
    );
    // A center pool named as a strict edge pool is no edge pool.
    let f = near("lost", PoolPreference::EdgeOnly("dc".into()));
    assert_eq!(both(&s, &f).unwrap_err().code(), "unknown_pool");
    // The deploy is refused as for the preference: unknown edge pool.
    let e = refused(
        &mut s,
        DomainCommand::FunctionDeploy {
            spec: near("lost", PoolPreference::EdgeOnly("edge-z".into())),
        },
    );
    assert_eq!(e.code(), "unknown_pool", "{e}");
}
