//! Overflow and bounds: the reported bypass (a `u64::MAX` MiB deploy
//! wrapping quota and GPU sums) as regression tests, and a property test
//! that applies random command sequences with extreme values (0, 1, 2^32,
//! 2^63, `u64::MAX`, ...) to a [`RegionState`] and checks after every step
//! that apply did not panic, that a refusal changed nothing, that
//! `check_invariants()` holds, and — recomputed here in `u128`, not with
//! the code under test — that no tenant passed its quota and no GPU its
//! capacity.
//!
//! The property runs 512 cases of up to 64 commands from a fixed seed by
//! default (well under a second in release). Long mode, more cases and a
//! fresh seed: `PROPTEST_CASES=20000 PROPTEST_RNG_SEED=$RANDOM cargo test
//! --release -p gshare-core --lib state::arith_tests` (a failure prints
//! the minimal command sequence; the seed reproduces it).

use super::*;
use crate::bounds::{MAX_FUNCTION_MEMORY_MIB, MAX_QUOTA};
use crate::config::{PriceList, Topology};
use crate::model::{
    FunctionSpec, GpuId, LatencyProfile, NodeId, PoolKind, PoolPreference, Quota, Runtime, Slice,
    TenantId, Tier, WHOLE_GPU,
};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use std::collections::BTreeMap;

const TOPOLOGY: &str = r#"
[[gpu_models]]
name = "g16"
memory_mib = 16_384
h2d_mib_per_s = 12_000

[cold_start]
setup_us = 500_000
storage_mib_per_s = 2_000

[swap]
setup_us = 2_000

[[pools]]
name = "dc"
kind = "center"

[[pools.nodes]]
name = "c1"
cpu_milli = 8_000
memory_mib = 65_536
swap_mib = 8_192
gpus = [{ model = "g16", count = 2 }]

[[pools.nodes]]
name = "c2"
cpu_milli = 8_000
memory_mib = 65_536
swap_mib = 0
gpus = [{ model = "g16", count = 1 }]

[[pools]]
name = "ea"
kind = "edge"

[[pools.nodes]]
name = "e1"
cpu_milli = 4_000
memory_mib = 16_384
swap_mib = 4_096
gpus = [{ model = "g16", count = 1 }]

[pricing]
currency = "USD"
unit = "micro-USD"
units_per_currency = 1_000_000

[pricing.tiers]
exclusive = { discount_bp = 0 }
guaranteed = { discount_bp = 1_500 }
burstable = { discount_bp = 3_500 }
oversubscribed = { discount_bp = 6_000 }

[[pricing.prices]]
gpu_model = "g16"
pool_kind = "center"
gpu_hour = 500_000
memory_gib_hour = 10_000

[[pricing.prices]]
gpu_model = "g16"
pool_kind = "edge"
gpu_hour = 625_000
memory_gib_hour = 12_500
"#;

const T0: u64 = 1_800_000_000_000;
const TENANTS: [&str; 2] = ["a", "b"];
const FUNCTIONS: [&str; 5] = ["f0", "f1", "f2", "w0", "w1"];
/// Names smuggled specs take (deployed through apply only by chance).
const WILD: [&str; 2] = ["w0", "w1"];
const NODES: [&str; 3] = ["c1", "c2", "e1"];

fn t(name: &str) -> TenantId {
    TenantId(name.into())
}

/// The report's tenant: 16,384 MiB of center memory.
fn report_quota() -> Quota {
    Quota {
        compute_milli: 4_000,
        memory_mib: 16_384,
        instances: 8,
    }
}

fn spec(tenant: &str, name: &str, tier: Tier, compute_milli: u32, memory_mib: u64) -> FunctionSpec {
    FunctionSpec {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        tenant: t(tenant),
        name: name.into(),
        runtime: Runtime::Pytorch,
        memory_mib,
        compute_milli,
        tier,
        deadline_ms: 200,
        pool: PoolPreference::Center,
        min_instances: 1,
        max_instances: 4,
        idle_timeout_s: 300,
        latency: LatencyProfile {
            full_gpu_us: 200_000,
            saturation_milli: 1000,
        },
    }
}

fn apply_ok(s: &mut RegionState, cmd: DomainCommand) -> Applied {
    let kind = cmd.kind();
    let r = s.apply(cmd, T0).unwrap_or_else(|e| panic!("{kind}: {e}"));
    s.check_invariants()
        .unwrap_or_else(|e| panic!("{kind}: {e}"));
    r
}

/// Topology, tenants `a` (center: the report's quota; edge: 1 GPU) and
/// `b`, and an agent on `c1`.
fn base() -> RegionState {
    let mut s = RegionState::default();
    let topology = Topology::from_toml("t.toml", TOPOLOGY).unwrap_or_else(|e| panic!("{e}"));
    apply_ok(&mut s, DomainCommand::TopologyLoad { topology });
    for name in TENANTS {
        apply_ok(
            &mut s,
            DomainCommand::TenantCreate {
                tenant: t(name),
                display_name: None,
                quotas: [
                    (PoolKind::Center, report_quota()),
                    (
                        PoolKind::Edge,
                        Quota {
                            compute_milli: 1_000,
                            memory_mib: 16_384,
                            instances: 4,
                        },
                    ),
                ]
                .into(),
            },
        );
    }
    apply_ok(
        &mut s,
        DomainCommand::AgentRegister {
            agent: AgentId("ag1".into()),
            node: NodeId("c1".into()),
            version: "1".into(),
        },
    );
    s
}

/// The report's starting point: tenant `a` holds a 12 GiB guaranteed
/// instance on `c1/gpu0`.
fn with_twelve_gib() -> RegionState {
    let mut s = base();
    apply_ok(
        &mut s,
        DomainCommand::FunctionDeploy {
            spec: spec("a", "big", Tier::Guaranteed, 400, 12_288),
        },
    );
    apply_ok(
        &mut s,
        DomainCommand::InstancePlace {
            tenant: t("a"),
            function: "big".into(),
            slices: vec![slice("c1", 0, 400, 12_288)],
        },
    );
    s
}

fn slice(node: &str, index: u32, compute_milli: u32, memory_mib: u64) -> Slice {
    Slice {
        gpu: GpuId {
            node: NodeId(node.into()),
            index,
        },
        compute_milli,
        memory_mib,
    }
}

#[test]
fn a_guaranteed_deploy_of_u64_max_mib_is_refused_naming_the_field_and_bound() {
    let mut s = with_twelve_gib();
    let before = s.clone();
    let e = s
        .apply(
            DomainCommand::FunctionDeploy {
                spec: spec("a", "wrap", Tier::Guaranteed, 400, u64::MAX),
            },
            T0,
        )
        .expect_err("a u64::MAX MiB deploy must be refused");
    assert_eq!(e.code(), "invalid_spec");
    match &e {
        ApplyError::InvalidSpec { field, reason } => {
            assert_eq!(field, "memory_mib");
            assert!(
                reason.contains(&MAX_FUNCTION_MEMORY_MIB.to_string()),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s, before);
    // 2^63 likewise, and the largest in-bound value passes the bound (and
    // then cannot be placed: no GPU and no quota has that much).
    let e = s
        .apply(
            DomainCommand::FunctionDeploy {
                spec: spec("a", "wrap", Tier::Guaranteed, 400, 1 << 63),
            },
            T0,
        )
        .unwrap_err();
    assert_eq!(e.code(), "invalid_spec");
    apply_ok(
        &mut s,
        DomainCommand::FunctionDeploy {
            spec: spec("a", "max", Tier::Guaranteed, 400, MAX_FUNCTION_MEMORY_MIB),
        },
    );
    let r = plan(&s, &t("a"), "max", &BestFit).unwrap_err();
    assert_eq!(r.code(), "unsatisfiable", "{r}");
    assert_eq!(s.held(&t("a"), PoolKind::Center).memory_mib, 12_288);
}

#[test]
fn a_placement_of_a_spec_past_the_bounds_cannot_wrap_the_gpu_or_the_quota() {
    // A state from before the bounds (e.g. a snapshot) holding a function
    // of u64::MAX MiB: placing it must still be refused, not wrapped.
    let s = with_twelve_gib();
    let mut v = serde_json::to_value(&s).unwrap();
    let wrap = serde_json::to_value(spec("a", "wrap", Tier::Guaranteed, 400, u64::MAX)).unwrap();
    v["functions"]["a"]["wrap"] = serde_json::json!({
        "spec": wrap, "version": 1, "deployed_at": T0, "updated_at": T0,
    });
    let mut s: RegionState = serde_json::from_value(v).unwrap();
    assert_eq!(
        s.function(&t("a"), "wrap").unwrap().spec.memory_mib,
        u64::MAX
    );
    let before = s.clone();
    for gpu in [0, 1] {
        let e = s
            .apply(
                DomainCommand::InstancePlace {
                    tenant: t("a"),
                    function: "wrap".into(),
                    slices: vec![slice("c1", gpu, 400, u64::MAX)],
                },
                T0,
            )
            .expect_err("u64::MAX MiB must not fit");
        assert_eq!(
            e,
            ApplyError::GpuFull {
                gpu: GpuId {
                    node: NodeId("c1".into()),
                    index: gpu,
                },
                dimension: GpuDimension::Memory,
            }
        );
        assert_eq!(s, before);
    }
    // The planner finds no place either (and says why: larger than every GPU).
    let r = plan(&s, &t("a"), "wrap", &BestFit).unwrap_err();
    assert_eq!(r.code(), "unsatisfiable", "{r}");
    s.check_invariants().unwrap();
}

#[test]
fn fit_refuses_sums_that_would_overflow() {
    let s = with_twelve_gib();
    let load = s.node_load(&NodeId("c1".into())).unwrap();
    let caps = *s.caps();
    for (tier, compute, memory, dim) in [
        (Tier::Guaranteed, 1, u64::MAX, GpuDimension::Memory),
        (Tier::Burstable, 1, u64::MAX - 12_287, GpuDimension::Memory),
        (Tier::Guaranteed, u32::MAX, 1, GpuDimension::Compute),
        (Tier::Burstable, u32::MAX, 1, GpuDimension::BurstCompute),
        (Tier::Oversubscribed, 1, u64::MAX, GpuDimension::Memory),
    ] {
        let d = Demand {
            tier,
            compute_milli: compute,
            memory_mib: memory,
        };
        let e = fit(&caps, load, &[(0, d)]).unwrap_err();
        assert_eq!(e.dimension, dim, "{tier} {compute} {memory}");
    }
    // The load itself refuses to wrap.
    let l = load.gpus[0].load;
    let d = Demand {
        tier: Tier::Guaranteed,
        compute_milli: 1,
        memory_mib: u64::MAX,
    };
    assert_eq!(l.checked_with(&d), Err(GpuDimension::Memory));
    assert_eq!(l.with(&d), GpuLoad::SATURATED);
}

#[test]
fn quotas_and_prices_past_their_bounds_are_refused_in_apply() {
    let mut s = base();
    let before = s.clone();
    let huge = Quota {
        compute_milli: 1,
        memory_mib: u64::MAX,
        instances: 1,
    };
    for cmd in [
        DomainCommand::QuotaSet {
            tenant: t("a"),
            pool_kind: PoolKind::Edge,
            quota: huge,
        },
        DomainCommand::TenantUpdate {
            tenant: t("a"),
            display_name: None,
            quotas: Some([(PoolKind::Edge, huge)].into()),
        },
        DomainCommand::TenantCreate {
            tenant: t("c"),
            display_name: None,
            quotas: [(PoolKind::Edge, huge)].into(),
        },
    ] {
        match s.apply(cmd, T0).unwrap_err() {
            ApplyError::InvalidSpec { field, reason } => {
                assert_eq!(field, "quotas.edge.memory_mib");
                assert!(reason.contains(&MAX_QUOTA.to_string()), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s, before);
    }
    let mut list: PriceList = s.price_list().unwrap().clone();
    list.prices[1].memory_gib_hour = u64::MAX;
    match s
        .apply(DomainCommand::PriceListSet { list }, T0)
        .unwrap_err()
    {
        ApplyError::InvalidSpec { field, .. } => {
            assert_eq!(field, "pricing.prices[1].memory_gib_hour")
        }
        other => panic!("{other:?}"),
    }
    let mut list: PriceList = s.price_list().unwrap().clone();
    list.units_per_currency = 0;
    assert_eq!(
        s.apply(DomainCommand::PriceListSet { list }, T0)
            .unwrap_err()
            .code(),
        "invalid_spec"
    );
    assert_eq!(s, before);
}

// ----- the property -----

/// Values that break naive arithmetic (most weight on those that wrap a
/// sum with anything already held), and a few ordinary ones.
fn u64_extreme() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(0u64),
        1 => Just(1),
        1 => Just(2),
        1 => Just(4_096),
        1 => Just(16_384),
        1 => Just(1 << 32),
        1 => Just(MAX_QUOTA),
        2 => Just(1 << 63),
        4 => Just(u64::MAX),
        2 => (0..16_384u64).prop_map(|k| u64::MAX - k),
        1 => any::<u64>(),
    ]
}

fn u32_extreme() -> impl Strategy<Value = u32> {
    prop_oneof![
        1 => Just(0u32),
        1 => Just(1),
        1 => Just(2),
        1 => Just(1_000),
        1 => Just(2_000),
        1 => Just(1 << 31),
        4 => Just(u32::MAX),
        2 => (0..2_000u32).prop_map(|k| u32::MAX - k),
        1 => any::<u32>(),
    ]
}

fn tier() -> impl Strategy<Value = Tier> {
    prop::sample::select(Tier::ALL.to_vec())
}

fn pool_kind() -> impl Strategy<Value = PoolKind> {
    prop_oneof![Just(PoolKind::Center), Just(PoolKind::Edge)]
}

fn quota_strategy() -> impl Strategy<Value = Quota> {
    (u64_extreme(), u64_extreme(), u32_extreme()).prop_map(|(c, m, i)| Quota {
        compute_milli: c,
        memory_mib: m,
        instances: i,
    })
}

/// Mostly ordinary values (so that deploys and placements happen), one
/// time in four an extreme one.
fn u64_mostly(ordinary: &'static [u64]) -> impl Strategy<Value = u64> {
    prop_oneof![3 => prop::sample::select(ordinary), 1 => u64_extreme()]
}

fn u32_mostly(ordinary: &'static [u32]) -> impl Strategy<Value = u32> {
    prop_oneof![3 => prop::sample::select(ordinary), 1 => u32_extreme()]
}

/// Ordinary values, one time in ten an extreme one.
fn u64_rarely(ordinary: &'static [u64]) -> impl Strategy<Value = u64> {
    prop_oneof![9 => prop::sample::select(ordinary), 1 => u64_extreme()]
}

fn u32_rarely(ordinary: &'static [u32]) -> impl Strategy<Value = u32> {
    prop_oneof![9 => prop::sample::select(ordinary), 1 => u32_extreme()]
}

fn spec_strategy() -> impl Strategy<Value = FunctionSpec> {
    (
        (
            prop::sample::select(TENANTS.to_vec()),
            prop::sample::select(FUNCTIONS.to_vec()),
            tier(),
            u32_mostly(&[100, 400, 1_000, 2_000]),
            u64_mostly(&[1, 1_024, 4_096, 12_288, 16_384]),
        ),
        (
            u64_rarely(&[200]),
            u32_rarely(&[0, 1, 2]),
            u32_rarely(&[1, 2, 4]),
            u64_rarely(&[300]),
            u64_rarely(&[200_000]),
            u32_rarely(&[500, 1_000]),
            prop_oneof![
                Just(PoolPreference::Any),
                Just(PoolPreference::Center),
                Just(PoolPreference::Edge("ea".into())),
            ],
        ),
    )
        .prop_map(
            |(
                (tenant, name, tier, compute, memory),
                (deadline, min, max, idle, full_gpu_us, sat, pool),
            )| FunctionSpec {
                deadline_ms: deadline,
                min_instances: min,
                max_instances: max,
                idle_timeout_s: idle,
                latency: LatencyProfile {
                    full_gpu_us,
                    saturation_milli: sat,
                },
                pool,
                ..spec(tenant, name, tier, compute, memory)
            },
        )
}

/// A spec with any values at all (what a state from before the bounds,
/// or a bug, could hold).
fn wild_spec_strategy() -> impl Strategy<Value = FunctionSpec> {
    (
        prop::sample::select(TENANTS.to_vec()),
        prop::sample::select(WILD.to_vec()),
        tier(),
        u32_extreme(),
        u64_extreme(),
    )
        .prop_map(|(tenant, name, tier, compute, memory)| FunctionSpec {
            max_instances: u32::MAX,
            ..spec(tenant, name, tier, compute, memory)
        })
}

/// One step of a random run.
#[derive(Debug, Clone)]
enum Step {
    /// Apply a command as generated.
    Command(DomainCommand),
    /// Plan one more instance of a function and apply the proposal.
    Plan {
        tenant: &'static str,
        name: &'static str,
    },
    /// Place an instance of a function with the slices its spec asks for
    /// on a GPU chosen here (fit and quota decide).
    PlaceAt {
        tenant: &'static str,
        name: &'static str,
        node: &'static str,
        gpu: u32,
    },
    /// Put a function into the state as a snapshot would, past the API's
    /// and apply's spec bounds (a state from before them).
    Smuggle(FunctionSpec),
}

fn step_strategy() -> impl Strategy<Value = Step> {
    let tenant = || prop::sample::select(TENANTS.to_vec());
    let function = || prop::sample::select(FUNCTIONS.to_vec());
    let slice_s = (
        prop::sample::select(NODES.to_vec()),
        prop_oneof![Just(0u32), Just(1), Just(u32::MAX)],
        u32_extreme(),
        u64_extreme(),
    )
        .prop_map(|(n, i, c, m)| slice(n, i, c, m));
    let record = (
        prop_oneof![Just(1u64), Just(2), Just(3), Just(1 << 16), Just(u64::MAX)],
        tenant(),
        tier(),
        pool_kind(),
        (u64_extreme(), u64_extreme(), u64_extreme()),
        prop_oneof![Just(T0), Just(0u64), Just(u64::MAX)],
    )
        .prop_map(
            |(seq, tenant, tier, pool_kind, (c, m, i), end_ms)| UsageRecord {
                seq,
                tenant: t(tenant),
                function: "f0".into(),
                tier,
                gpu_model: "g16".into(),
                pool_kind,
                compute_milli_gpu_ms: c,
                memory_mib_ms: m,
                invocations: i,
                end_ms,
            },
        );
    let price = (u64_extreme(), u64_extreme(), u32_extreme(), u64_extreme());
    prop_oneof![
        3 => spec_strategy().prop_map(|spec| Step::Command(DomainCommand::FunctionDeploy { spec })),
        1 => spec_strategy().prop_map(|spec| Step::Command(DomainCommand::FunctionUpdate { spec })),
        1 => (tenant(), function()).prop_map(|(tn, n)| Step::Command(DomainCommand::FunctionDelete {
            tenant: t(tn),
            name: n.into(),
        })),
        4 => (tenant(), function()).prop_map(|(tenant, name)| Step::Plan { tenant, name }),
        4 => (tenant(), function(), prop::sample::select(NODES.to_vec()), 0..3u32).prop_map(
            |(tenant, name, node, gpu)| Step::PlaceAt { tenant, name, node, gpu }
        ),
        2 => wild_spec_strategy().prop_map(Step::Smuggle),
        3 => (tenant(), function(), prop::collection::vec(slice_s, 1..3)).prop_map(
            |(tn, n, slices)| Step::Command(DomainCommand::InstancePlace {
                tenant: t(tn),
                function: n.into(),
                slices,
            })
        ),
        1 => prop_oneof![Just(0u64), Just(1), Just(2), Just(3), Just(u64::MAX)].prop_map(|i| {
            Step::Command(DomainCommand::InstanceRelease {
                instance: InstanceId(i),
            })
        }),
        1 => prop_oneof![Just(0u64), Just(1), Just(2), Just(3), Just(u64::MAX)].prop_map(|i| {
            Step::Command(DomainCommand::InstanceScaleIn {
                instance: InstanceId(i),
            })
        }),
        2 => (tenant(), pool_kind(), quota_strategy()).prop_map(|(tn, kind, quota)| {
            Step::Command(DomainCommand::QuotaSet {
                tenant: t(tn),
                pool_kind: kind,
                quota,
            })
        }),
        1 => (tenant(), quota_strategy(), quota_strategy()).prop_map(|(tn, c, e)| {
            Step::Command(DomainCommand::TenantUpdate {
                tenant: t(tn),
                display_name: None,
                quotas: Some(BTreeMap::from([(PoolKind::Center, c), (PoolKind::Edge, e)])),
            })
        }),
        2 => prop::collection::vec(record, 1..4).prop_map(|records| {
            Step::Command(DomainCommand::UsageBatch {
                agent: AgentId("ag1".into()),
                records,
            })
        }),
        1 => price.prop_map(|(gpu_hour, memory_gib_hour, bp, units)| {
            let mut list = Topology::from_toml("t.toml", TOPOLOGY)
                .unwrap_or_else(|e| panic!("{e}"))
                .pricing()
                .clone();
            list.prices[0].gpu_hour = gpu_hour;
            list.prices[0].memory_gib_hour = memory_gib_hour;
            list.discounts_bp[3] = bp;
            list.units_per_currency = units;
            Step::Command(DomainCommand::PriceListSet { list })
        }),
    ]
}

/// Quota and capacity recomputed from the instances in `u128` (not with
/// the sums under test).
fn independent_checks(s: &RegionState) -> Result<(), String> {
    let mut held: BTreeMap<(TenantId, PoolKind), (u128, u128, u128)> = BTreeMap::new();
    // (reserved compute, guaranteed + burstable compute, resident MiB, exclusive, instances)
    let mut gpus: BTreeMap<GpuId, (u128, u128, u128, bool, u128)> = BTreeMap::new();
    for inst in s.instances() {
        let h = held
            .entry((inst.tenant.clone(), inst.pool_kind))
            .or_default();
        h.2 += 1;
        for sl in &inst.slices {
            h.0 += u128::from(sl.compute_milli);
            h.1 += u128::from(sl.memory_mib);
            let g = gpus.entry(sl.gpu.clone()).or_default();
            g.4 += 1;
            let c = u128::from(sl.compute_milli);
            match inst.tier {
                Tier::Exclusive | Tier::Guaranteed => {
                    g.0 += c;
                    g.1 += c;
                    g.2 += u128::from(sl.memory_mib);
                    g.3 |= inst.tier == Tier::Exclusive;
                }
                Tier::Burstable => {
                    g.1 += c;
                    g.2 += u128::from(sl.memory_mib);
                }
                Tier::Oversubscribed => {}
            }
        }
    }
    for ((tenant, kind), (c, m, n)) in &held {
        let q = s.tenant(tenant).map(|r| r.quota(*kind)).unwrap_or_default();
        if *c > u128::from(q.compute_milli)
            || *m > u128::from(q.memory_mib)
            || *n > u128::from(q.instances)
        {
            return Err(format!(
                "{tenant} holds ({c}, {m}, {n}) in {kind} pools past {q:?}"
            ));
        }
    }
    let topology = s.topology().expect("loaded");
    let burst = u128::from(s.caps().burst_compute_milli.max(WHOLE_GPU));
    for (gpu, (reserved, committed, resident, exclusive, n)) in &gpus {
        let cap = topology
            .node(&gpu.node.0)
            .and_then(|node| node.gpu(gpu.index))
            .map(|g| u128::from(g.memory_mib))
            .ok_or_else(|| format!("{gpu} is not in the topology"))?;
        if *resident > cap
            || *reserved > u128::from(WHOLE_GPU)
            || *committed > burst
            || (*exclusive && *n > 1)
        {
            return Err(format!(
                "{gpu} holds {resident} MiB of {cap}, {reserved} reserved milli, {committed} committed, {n} instances"
            ));
        }
    }
    Ok(())
}

/// The command placing `spec`'s slices on `node`, from GPU `gpu` on.
fn place_at(spec: &FunctionSpec, node: &str, gpu: u32) -> DomainCommand {
    let slices = if spec.tier == Tier::Exclusive {
        let k = (spec.compute_milli / WHOLE_GPU).clamp(1, 4);
        (0..k)
            .map(|i| slice(node, gpu.saturating_add(i), WHOLE_GPU, 16_384))
            .collect()
    } else {
        vec![slice(node, gpu, spec.compute_milli, spec.memory_mib)]
    };
    DomainCommand::InstancePlace {
        tenant: spec.tenant.clone(),
        function: spec.name.clone(),
        slices,
    }
}

/// `s` with `spec` deployed behind apply's back (through a snapshot's
/// JSON), unless that name is taken.
fn smuggle(s: &RegionState, spec: FunctionSpec) -> RegionState {
    if s.function(&spec.tenant, &spec.name).is_ok() {
        return s.clone();
    }
    let mut v = serde_json::to_value(s).expect("state encodes");
    let (tenant, name) = (spec.tenant.0.clone(), spec.name.clone());
    let functions = &mut v["functions"];
    if functions.get(&tenant).is_none() {
        functions[&tenant] = serde_json::json!({});
    }
    functions[&tenant][&name] = serde_json::json!({
        "spec": spec, "version": 1, "deployed_at": T0, "updated_at": T0,
    });
    serde_json::from_value(v).expect("state decodes")
}

/// [`base`] with a function of each sharing tier deployed, and three
/// instances placed (so sums start from something held).
fn seeded() -> RegionState {
    let mut s = base();
    for f in [
        spec("a", "f0", Tier::Guaranteed, 400, 4_096),
        spec("b", "f0", Tier::Oversubscribed, 100, 8_192),
        spec("a", "f1", Tier::Burstable, 500, 4_096),
        spec("b", "f2", Tier::Exclusive, 1_000, 16_384),
    ] {
        apply_ok(&mut s, DomainCommand::FunctionDeploy { spec: f });
    }
    for (tenant, name, node) in [("a", "f0", "c1"), ("b", "f0", "c1"), ("a", "f1", "c2")] {
        let spec = s.function(&t(tenant), name).unwrap().spec.clone();
        apply_ok(&mut s, place_at(&spec, node, 0));
    }
    s
}

/// 512 cases from a fixed seed, unless `PROPTEST_CASES` / `PROPTEST_RNG_SEED`
/// say otherwise (the long mode; proptest reads both).
fn config() -> ProptestConfig {
    let default = ProptestConfig::default();
    let set = |var: &str| std::env::var_os(var).is_some();
    ProptestConfig {
        cases: if set("PROPTEST_CASES") {
            default.cases
        } else {
            512
        },
        rng_seed: if set("PROPTEST_RNG_SEED") {
            default.rng_seed
        } else {
            RngSeed::Fixed(SEED)
        },
        failure_persistence: None,
        ..default
    }
}

/// The normal suite's seed.
const SEED: u64 = 0x5eed_0f0a_417b;

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_commands_with_extreme_values_never_break_quota_or_capacity(
        steps in prop::collection::vec(step_strategy(), 1..48)
    ) {
        let mut s = seeded();
        for (i, step) in steps.into_iter().enumerate() {
            let cmd = match step {
                Step::Command(cmd) => Some(cmd),
                Step::Plan { tenant, name } => {
                    plan(&s, &t(tenant), name, &BestFit).ok().map(|p| p.command())
                }
                Step::PlaceAt { tenant, name, node, gpu } => {
                    s.function(&t(tenant), name).ok().map(|f| place_at(&f.spec, node, gpu))
                }
                Step::Smuggle(spec) => {
                    s = smuggle(&s, spec);
                    s.check_invariants().map_err(|e| TestCaseError::fail(format!("step {i} smuggle: {e}")))?;
                    None
                }
            };
            let Some(cmd) = cmd else { continue };
            let kind = cmd.kind();
            let before = s.clone();
            let r = s.apply(cmd, T0);
            {
                use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
                static N: [AtomicU64; 4] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
                let k = match &r { Ok(Applied::InstancePlaced{..}) => 0, Ok(Applied::FunctionDeployed{..}) => 1, Ok(_) => 2, Err(_) => 3 };
                N[k].fetch_add(1, Relaxed);
                if i == 0 { eprintln!("placed {} deployed {} other-ok {} err {}", N[0].load(Relaxed), N[1].load(Relaxed), N[2].load(Relaxed), N[3].load(Relaxed)); }
            }
            if let Err(e) = r {
                prop_assert_eq!(&s, &before, "step {} {}: refused ({}) but changed the state", i, kind, e);
            }
            s.check_invariants().map_err(|e| TestCaseError::fail(format!("step {i} {kind}: {e}")))?;
            independent_checks(&s).map_err(|e| TestCaseError::fail(format!("step {i} {kind}: {e}")))?;
            for tenant in TENANTS {
                // Reads never panic either: a bill is a bill or an error.
                let _ = s.bill(&t(tenant), 0, u64::MAX);
            }
        }
    }
}
