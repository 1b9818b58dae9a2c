//! Unit tests of the domain state machine and its planner, as data in and
//! results out: exactly-once usage, bills, isolation, tokens, the re-check
//! on apply, draining, snapshots, and a seeded random run with two leaders
//! planning on stale views.

use super::*;
use crate::config::{PriceList, Topology, Usage};
use crate::model::{
    FunctionSpec, GpuId, LatencyProfile, NodeId, PoolKind, PoolPreference, Quota, QuotaDimension,
    RegionPolicy, Runtime, Slice, TenantId, Tier,
};
use crate::rng::Rng;
use std::collections::BTreeMap;

/// Center pool `dc` (two nodes of two 16 GiB GPUs), edge pools `edge-a`
/// and `edge-b` (one node of one GPU each). `PRICES` is appended.
const NODES: &str = r#"
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
swap_mib = 8_192
gpus = [{ model = "g16", count = 2 }]

[[pools]]
name = "edge-a"
kind = "edge"

[[pools.nodes]]
name = "ea1"
cpu_milli = 4_000
memory_mib = 16_384
swap_mib = 4_096
gpus = [{ model = "g16", count = 1 }]

[[pools]]
name = "edge-b"
kind = "edge"

[[pools.nodes]]
name = "eb1"
cpu_milli = 4_000
memory_mib = 16_384
swap_mib = 4_096
gpus = [{ model = "g16", count = 1 }]
"#;

/// Center GPU-hour 500_000 µUSD, GiB-hour 10_000; edge dearer.
const PRICES: &str = r#"
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

mod defragment;
mod explained;
mod indexed;
mod keyed;
mod liveness;
mod migration;
mod pending_count;
mod remap;
mod rolling_update;
mod scale_in;
mod spec_storage;
mod spread;
mod strict_pool;
mod tenant_delete;
mod warm_preference;

const T0: u64 = 1_800_000_000_000;

fn topology(text: &str) -> Topology {
    Topology::from_toml("test.toml", text).unwrap_or_else(|e| panic!("{e}"))
}

fn full_topology() -> Topology {
    topology(&format!("{NODES}{PRICES}"))
}

fn t(name: &str) -> TenantId {
    TenantId(name.into())
}

fn quota(compute_milli: u64, memory_mib: u64, instances: u32) -> Quota {
    Quota {
        compute_milli,
        memory_mib,
        instances,
    }
}

fn ok(state: &mut RegionState, cmd: DomainCommand) -> Applied {
    let kind = cmd.kind();
    let r = state
        .apply(cmd, T0)
        .unwrap_or_else(|e| panic!("{kind}: {e}"));
    state.check_invariants().unwrap();
    r
}

/// Applies `cmd`, expects a refusal, and checks nothing changed.
fn refused(state: &mut RegionState, cmd: DomainCommand) -> ApplyError {
    let before = state.clone();
    let e = state.apply(cmd, T0).expect_err("command should be refused");
    assert_eq!(*state, before, "a refused command changed the state");
    // (`==` compares the replicated data; the look-up tables too:)
    state.check_invariants().unwrap();
    e
}

/// Topology plus tenants `acme` (center 3 GPUs / 32 GiB / 8, edge 1 / 16 GiB / 4)
/// and `globex` (center 2 / 16 GiB / 6, edge 0.5 / 8 GiB / 2).
fn region() -> RegionState {
    let mut s = RegionState::default();
    ok(
        &mut s,
        DomainCommand::TopologyLoad {
            topology: full_topology(),
        },
    );
    for (name, center, edge) in [
        ("acme", quota(3_000, 32_768, 8), quota(1_000, 16_384, 4)),
        ("globex", quota(2_000, 16_384, 6), quota(500, 8_192, 2)),
    ] {
        ok(
            &mut s,
            DomainCommand::TenantCreate {
                tenant: t(name),
                display_name: None,
                quotas: BTreeMap::from([(PoolKind::Center, center), (PoolKind::Edge, edge)]),
            },
        );
    }
    s
}

fn spec(tenant: &str, name: &str, tier: Tier, compute_milli: u32, memory_mib: u64) -> FunctionSpec {
    FunctionSpec {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        tenant: t(tenant),
        name: name.into(),
        runtime: Runtime::Vllm,
        memory_mib,
        compute_milli,
        tier,
        deadline_ms: 500,
        pool: PoolPreference::Any,
        min_instances: 1,
        max_instances: 8,
        idle_timeout_s: 60,
        latency: LatencyProfile {
            full_gpu_us: 20_000,
            saturation_milli: 1000,
        },
    }
}

/// Best fit, no pending plans, no preference.
fn best_fit() -> PlacementPolicy<'static> {
    PlacementPolicy {
        ranking: &BestFit,
        options: PlanOptions::default(),
        pending: None,
        prefer: &[],
        avoid: &[],
    }
}

fn deploy(s: &mut RegionState, f: FunctionSpec) {
    ok(s, DomainCommand::FunctionDeploy { spec: f });
}

fn place(s: &mut RegionState, tenant: &str, name: &str) -> InstanceId {
    let p = plan(s, &t(tenant), name, &BestFit).unwrap_or_else(|r| panic!("{r}"));
    match ok(s, p.command()) {
        Applied::InstancePlaced { instance, .. } => instance,
        other => panic!("{other:?}"),
    }
}

fn gpu(node: &str, index: u32) -> GpuId {
    GpuId {
        node: NodeId(node.into()),
        index,
    }
}

fn register(s: &mut RegionState, agent: &str, node: &str) {
    ok(
        s,
        DomainCommand::AgentRegister {
            agent: AgentId(agent.into()),
            node: NodeId(node.into()),
            version: "0.1.0".into(),
        },
    );
}

/// One GPU-hour of compute and one GiB-hour of memory in `edge`/`center`.
fn hour_record(seq: u64, tenant: &str, tier: Tier, kind: PoolKind) -> UsageRecord {
    UsageRecord {
        seq,
        tenant: t(tenant),
        function: "chat".into(),
        tier,
        gpu_model: "g16".into(),
        pool_kind: kind,
        compute_milli_gpu_ms: 1_000 * 3_600_000,
        memory_mib_ms: 1_024 * 3_600_000,
        invocations: 1,
        end_ms: T0 + 10,
    }
}

fn batch(agent: &str, records: Vec<UsageRecord>) -> DomainCommand {
    DomainCommand::UsageBatch {
        agent: AgentId(agent.into()),
        records,
    }
}

fn whole_day_bill(s: &RegionState, tenant: &str) -> Bill {
    let day = T0 - T0 % (24 * HOUR_MS);
    s.bill(&t(tenant), day, day + 24 * HOUR_MS).unwrap()
}

#[test]
fn a_usage_batch_sent_twice_is_billed_once() {
    let mut s = region();
    register(&mut s, "agent-c1", "c1");
    let records = vec![
        hour_record(1, "acme", Tier::Guaranteed, PoolKind::Center),
        hour_record(2, "acme", Tier::Guaranteed, PoolKind::Center),
    ];
    let first = ok(&mut s, batch("agent-c1", records.clone()));
    assert_eq!(
        first,
        Applied::UsageApplied {
            applied: 2,
            duplicates: 0
        }
    );
    let second = ok(&mut s, batch("agent-c1", records));
    assert_eq!(
        second,
        Applied::UsageApplied {
            applied: 0,
            duplicates: 2
        }
    );
    let bill = whole_day_bill(&s, "acme");
    // Two GPU-hours at 500_000 and two GiB-hours at 10_000, 15 % off.
    assert_eq!(bill.lines.len(), 1);
    assert_eq!(bill.lines[0].charge.compute, 2 * 425_000);
    assert_eq!(bill.lines[0].charge.memory, 2 * 8_500);
    assert_eq!(bill.total, 867_000);
    assert_eq!(bill.currency, "USD");
    assert_eq!(bill.functions[0].function, "chat");
    // The other tenant pays nothing; the period outside pays nothing.
    assert_eq!(whole_day_bill(&s, "globex").total, 0);
    let later = s
        .bill(&t("acme"), T0 + 2 * HOUR_MS, T0 + 10 * HOUR_MS)
        .unwrap();
    assert_eq!(later.total, 0);
}

#[test]
fn out_of_order_sequence_numbers_each_apply_once() {
    let mut s = region();
    register(&mut s, "a1", "c1");
    let r = |seq| hour_record(seq, "acme", Tier::Burstable, PoolKind::Center);
    let applied = |s: &mut RegionState, seqs: &[u64]| match ok(
        s,
        batch("a1", seqs.iter().map(|&q| r(q)).collect()),
    ) {
        Applied::UsageApplied { applied, .. } => applied,
        other => panic!("{other:?}"),
    };
    assert_eq!(applied(&mut s, &[3, 1]), 2);
    assert_eq!(applied(&mut s, &[2, 3, 3]), 1);
    assert_eq!(applied(&mut s, &[1, 2, 3, 4]), 1);
    let cursor = &s.agent(&AgentId("a1".into())).unwrap().cursor;
    assert_eq!((cursor.contiguous, cursor.ahead.len()), (4, 0));
    // Four GPU-hours, burstable (35 % off): 4 × 325_000 + 4 × 6_500.
    assert_eq!(whole_day_bill(&s, "acme").total, 4 * 325_000 + 4 * 6_500);
    // A re-registered agent keeps its cursor and says what it expects next.
    let again = s
        .apply(
            DomainCommand::AgentRegister {
                agent: AgentId("a1".into()),
                node: NodeId("c2".into()),
                version: "0.1.1".into(),
            },
            T0,
        )
        .unwrap();
    assert_eq!(
        again,
        Applied::AgentRegistered {
            first_time: false,
            next_seq: 5
        }
    );
    // Too far ahead, zero, unknown agent: refused, nothing applied.
    let e = refused(
        &mut s,
        batch("a1", vec![r(5), r(4 + MAX_SEQUENCE_AHEAD + 1)]),
    );
    assert_eq!(e.code(), "sequence_out_of_window");
    assert_eq!(
        refused(&mut s, batch("a1", vec![r(0)])).code(),
        "sequence_out_of_window"
    );
    assert_eq!(
        refused(&mut s, batch("nobody", vec![r(1)])).code(),
        "unknown_agent"
    );
}

#[test]
fn a_batch_with_one_bad_record_applies_nothing() {
    let mut s = region();
    register(&mut s, "a1", "c1");
    let mut bad = hour_record(2, "initech", Tier::Guaranteed, PoolKind::Center);
    let e = refused(
        &mut s,
        batch(
            "a1",
            vec![
                hour_record(1, "acme", Tier::Guaranteed, PoolKind::Center),
                bad.clone(),
            ],
        ),
    );
    assert_eq!(e.code(), "unknown_tenant");
    bad.tenant = t("acme");
    bad.gpu_model = "h100".into();
    let e = refused(&mut s, batch("a1", vec![bad.clone()]));
    assert_eq!(
        e,
        ApplyError::NoPrice {
            gpu_model: "h100".into(),
            pool_kind: PoolKind::Center
        }
    );
    bad.gpu_model = "g16".into();
    bad.function = "no/slash".into();
    assert_eq!(
        refused(&mut s, batch("a1", vec![bad])).code(),
        "invalid_usage"
    );
    let mut huge = hour_record(1, "acme", Tier::Guaranteed, PoolKind::Center);
    huge.compute_milli_gpu_ms = u64::MAX;
    ok(&mut s, batch("a1", vec![huge.clone()]));
    huge.seq = 2;
    assert_eq!(refused(&mut s, batch("a1", vec![huge])).code(), "overflow");
}

#[test]
fn usage_is_priced_with_the_list_in_force_when_it_ended() {
    let mut s = region();
    register(&mut s, "a1", "ea1");
    let mut cheaper: PriceList = s.price_list().unwrap().clone();
    cheaper.prices.iter_mut().for_each(|p| p.gpu_hour /= 5);
    let mut early = hour_record(1, "acme", Tier::Exclusive, PoolKind::Edge);
    early.end_ms = T0 + 1_000;
    let mut late = hour_record(2, "acme", Tier::Exclusive, PoolKind::Edge);
    late.end_ms = T0 + 3_000;
    let set = s
        .apply(DomainCommand::PriceListSet { list: cheaper }, T0 + 2_000)
        .unwrap();
    assert_eq!(
        set,
        Applied::PriceListSet {
            epoch: 1,
            effective_from_ms: T0 + 2_000
        }
    );
    // Applied after the change, the early record still gets the old price.
    ok(&mut s, batch("a1", vec![late, early]));
    let bill = whole_day_bill(&s, "acme");
    let compute: Vec<(u32, u64)> = bill
        .lines
        .iter()
        .map(|l| (l.price_epoch, l.charge.compute))
        .collect();
    assert_eq!(compute, [(0, 625_000), (1, 125_000)]);
    assert_eq!(bill.total, 625_000 + 125_000 + 2 * 12_500);
    // A list in another unit: a period priced in both has no total (the
    // amounts do not add up); each side alone is billed in its own unit.
    let mut cents: PriceList = s.price_list().unwrap().clone();
    cents.unit = "cent".into();
    cents.units_per_currency = 100;
    ok(&mut s, DomainCommand::PriceListSet { list: cents });
    let mut cent_record = hour_record(3, "acme", Tier::Exclusive, PoolKind::Edge);
    cent_record.end_ms = T0 + 3_600_000 + 10;
    ok(&mut s, batch("a1", vec![cent_record]));
    let e = s.bill(&t("acme"), T0, T0 + 86_400_000).unwrap_err();
    assert_eq!(e.code(), "mixed_units", "{e}");
    assert!(e.to_string().contains("price epoch 2"), "{e}");
    let before = s.bill(&t("acme"), T0, T0 + 3_600_000).unwrap();
    assert_eq!(
        (before.unit.as_str(), before.total),
        ("micro-USD", 625_000 + 125_000 + 2 * 12_500)
    );
    let after = s.bill(&t("acme"), T0 + 3_600_000, T0 + 86_400_000).unwrap();
    assert_eq!(
        (
            after.unit.as_str(),
            after.units_per_currency,
            after.lines.len()
        ),
        ("cent", 100, 1)
    );
    // A list that does not price the topology is refused.
    let mut partial = s.price_list().unwrap().clone();
    partial.prices.retain(|p| p.pool_kind == PoolKind::Center);
    let e = refused(&mut s, DomainCommand::PriceListSet { list: partial });
    assert_eq!(
        e,
        ApplyError::Unpriced {
            missing: vec![("g16".into(), PoolKind::Edge)]
        }
    );
}

#[test]
fn a_tenant_cannot_see_or_touch_another_tenants_function() {
    let mut s = region();
    deploy(&mut s, spec("acme", "chat", Tier::Guaranteed, 500, 4_096));
    let id = place(&mut s, "acme", "chat");
    assert!(s.function(&t("acme"), "chat").is_ok());
    let e = s.function(&t("globex"), "chat").unwrap_err();
    assert_eq!(e.code(), "unknown_function");
    assert_eq!(
        e,
        QueryError::NotFound {
            kind: ObjectKind::Function,
            name: "chat".into()
        }
    );
    assert_eq!(s.functions_of(&t("globex")).count(), 0);
    assert_eq!(s.instances_of(&t("globex"), "chat").count(), 0);
    assert_eq!(s.instances_of(&t("acme"), "chat").count(), 1);
    let e = refused(
        &mut s,
        DomainCommand::FunctionDelete {
            tenant: t("globex"),
            name: "chat".into(),
        },
    );
    assert_eq!(e.code(), "unknown_function");
    assert_eq!(e.class(), ErrorClass::NotFound);
    // globex may use the same name for its own function.
    deploy(&mut s, spec("globex", "chat", Tier::Guaranteed, 500, 4_096));
    assert_eq!(
        s.function(&t("acme"), "chat").unwrap().spec.tenant,
        t("acme")
    );
    assert_eq!(s.instances_of(&t("globex"), "chat").count(), 0);
    assert_eq!(
        s.bill(&t("initech"), 0, 1).unwrap_err().code(),
        "unknown_tenant"
    );
    // Deleting acme's releases its instance and frees its quota.
    ok(
        &mut s,
        DomainCommand::FunctionDelete {
            tenant: t("acme"),
            name: "chat".into(),
        },
    );
    assert!(s.instance(id).is_none());
    assert_eq!(s.held(&t("acme"), PoolKind::Center), Quota::default());
    assert!(s.function(&t("globex"), "chat").is_ok());
}

#[test]
fn tokens_are_stored_as_digests_and_can_be_revoked() {
    let mut s = region();
    let digest = "ab".repeat(32);
    let issue = |tenant: &str, id: &str, digest: &str| DomainCommand::TokenIssue {
        tenant: t(tenant),
        token_id: id.into(),
        digest: digest.into(),
    };
    ok(&mut s, issue("acme", "ci", &digest));
    assert_eq!(s.token_owner(&digest), Some((&t("acme"), "ci")));
    assert_eq!(
        refused(&mut s, issue("globex", "x", &digest)).code(),
        "duplicate_name"
    );
    assert_eq!(
        refused(&mut s, issue("acme", "ci", &"cd".repeat(32))).code(),
        "duplicate_name"
    );
    assert_eq!(
        refused(&mut s, issue("acme", "y", &"AB".repeat(32))).code(),
        "invalid_token_digest"
    );
    assert_eq!(
        refused(&mut s, issue("acme", "y", "abc")).code(),
        "invalid_token_digest"
    );
    assert_eq!(
        refused(&mut s, issue("nobody", "y", &"cd".repeat(32))).code(),
        "unknown_tenant"
    );
    ok(
        &mut s,
        DomainCommand::TokenRevoke {
            tenant: t("acme"),
            token_id: "ci".into(),
        },
    );
    assert_eq!(s.token_owner(&digest), None);
    let e = refused(
        &mut s,
        DomainCommand::TokenRevoke {
            tenant: t("acme"),
            token_id: "ci".into(),
        },
    );
    assert_eq!(e.code(), "unknown_token");
}

#[test]
fn apply_rechecks_what_a_stale_leader_planned() {
    let mut s = region();
    deploy(&mut s, spec("acme", "big", Tier::Guaranteed, 600, 10_000));
    deploy(&mut s, spec("globex", "big", Tier::Guaranteed, 600, 10_000));
    // Both plan on the same view: the same empty GPU.
    let a = plan(&s, &t("acme"), "big", &BestFit).unwrap();
    let g = plan(&s, &t("globex"), "big", &BestFit).unwrap();
    assert_eq!(a.slices[0].gpu, g.slices[0].gpu);
    ok(&mut s, a.command());
    let e = refused(&mut s, g.command());
    assert_eq!(
        e,
        ApplyError::GpuFull {
            gpu: a.slices[0].gpu.clone(),
            dimension: GpuDimension::Compute
        }
    );
    assert_eq!(e.class(), ErrorClass::Exhausted);
    // Quota: globex may hold two instances in the center and none at the
    // edge; it holds one. Two plans on the same view cannot both land.
    let p = plan(&s, &t("globex"), "big", &BestFit).unwrap();
    ok(&mut s, p.command());
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
    deploy(&mut s, spec("globex", "mid", Tier::Burstable, 300, 1_000));
    let p1 = plan(&s, &t("globex"), "mid", &BestFit).unwrap();
    let p2 = plan(&s, &t("globex"), "mid", &BestFit).unwrap();
    ok(&mut s, p1.command());
    let e = refused(&mut s, p2.command());
    assert_eq!(
        e,
        ApplyError::QuotaExceeded {
            tenant: t("globex"),
            pool_kind: PoolKind::Center,
            dimension: QuotaDimension::Instances
        }
    );
    // The planner itself now says the quota ran out, in both kinds.
    let r = plan(&s, &t("globex"), "mid", &BestFit).unwrap_err();
    assert_eq!(r.code(), "quota_exceeded");
    assert_eq!(
        r.quota_exhausted.get(&PoolKind::Center),
        Some(&QuotaDimension::Instances)
    );
    assert_eq!(
        r.quota_exhausted.get(&PoolKind::Edge),
        Some(&QuotaDimension::Compute)
    );
}

#[test]
fn placements_check_their_slices_against_the_spec() {
    let mut s = region();
    deploy(&mut s, spec("acme", "f", Tier::Guaranteed, 500, 4_096));
    let place = |slices: Vec<Slice>| DomainCommand::InstancePlace {
        tenant: t("acme"),
        function: "f".into(),
        slices,
    };
    let slice = |g: GpuId, c, m| Slice {
        gpu: g,
        compute_milli: c,
        memory_mib: m,
    };
    let e = refused(&mut s, place(vec![slice(gpu("c1", 0), 400, 4_096)]));
    assert_eq!(e.code(), "slice_mismatch");
    let e = refused(&mut s, place(vec![slice(gpu("c1", 7), 500, 4_096)]));
    assert_eq!(e.code(), "unknown_gpu");
    let e = refused(&mut s, place(vec![slice(gpu("zz", 0), 500, 4_096)]));
    assert_eq!(e.code(), "unknown_node");
    let e = refused(&mut s, place(vec![]));
    assert_eq!(e.code(), "slice_mismatch");
    // Exclusive: whole GPUs of one node, each with all its memory.
    deploy(&mut s, spec("acme", "x2", Tier::Exclusive, 2_000, 20_000));
    let x2 = |slices| DomainCommand::InstancePlace {
        tenant: t("acme"),
        function: "x2".into(),
        slices,
    };
    let e = refused(
        &mut s,
        x2(vec![
            slice(gpu("c1", 0), 1000, 16_384),
            slice(gpu("c2", 0), 1000, 16_384),
        ]),
    );
    assert_eq!(e.code(), "slice_mismatch");
    let e = refused(
        &mut s,
        x2(vec![
            slice(gpu("c1", 0), 1000, 16_384),
            slice(gpu("c1", 0), 1000, 16_384),
        ]),
    );
    assert_eq!(e.code(), "slice_mismatch");
    let p = plan(&s, &t("acme"), "x2", &BestFit).unwrap();
    assert_eq!(p.slices.len(), 2);
    ok(&mut s, p.command());
    assert_eq!(
        s.held(&t("acme"), PoolKind::Center),
        quota(2_000, 2 * 16_384, 1)
    );
    // A second one would pass acme's center quota (3 GPUs, 32 GiB).
    let r = plan(&s, &t("acme"), "x2", &BestFit).unwrap_err();
    assert_eq!(r.code(), "quota_exceeded");
}

#[test]
fn invalid_specs_and_names_are_refused() {
    let mut s = region();
    let mut bad = |f: FunctionSpec| refused(&mut s, DomainCommand::FunctionDeploy { spec: f });
    assert_eq!(
        bad(spec("acme", "a b", Tier::Guaranteed, 500, 1)).code(),
        "invalid_name"
    );
    assert_eq!(
        bad(spec("acme", "f", Tier::Guaranteed, 1_001, 1)).code(),
        "invalid_spec"
    );
    assert_eq!(
        bad(spec("acme", "f", Tier::Exclusive, 1_500, 1)).code(),
        "invalid_spec"
    );
    assert_eq!(
        bad(spec("acme", "f", Tier::Burstable, 500, 0)).code(),
        "invalid_spec"
    );
    assert_eq!(
        bad(spec("nobody", "f", Tier::Burstable, 500, 1)).code(),
        "unknown_tenant"
    );
    let mut f = spec("acme", "f", Tier::Burstable, 500, 1);
    f.min_instances = 9;
    assert_eq!(bad(f.clone()).code(), "invalid_spec");
    f.min_instances = 1;
    f.pool = PoolPreference::Edge("dc".into());
    assert_eq!(bad(f.clone()).code(), "unknown_pool");
    f.pool = PoolPreference::Edge("edge-a".into());
    ok(&mut s, DomainCommand::FunctionDeploy { spec: f.clone() });
    let e = refused(&mut s, DomainCommand::FunctionDeploy { spec: f });
    assert_eq!(
        (e.code(), e.class()),
        ("duplicate_name", ErrorClass::Conflict)
    );
    let e = refused(
        &mut s,
        DomainCommand::TenantCreate {
            tenant: t("acme"),
            display_name: None,
            quotas: BTreeMap::new(),
        },
    );
    assert_eq!(e.code(), "duplicate_name");
    let e = refused(
        &mut s,
        DomainCommand::TenantCreate {
            tenant: t("initech"),
            display_name: Some("x".repeat(MAX_LABEL_LEN + 1)),
            quotas: BTreeMap::new(),
        },
    );
    assert_eq!(e.code(), "invalid_spec");
}

#[test]
fn the_planner_prefers_the_asked_pool_and_spills() {
    let mut s = region();
    ok(
        &mut s,
        DomainCommand::QuotaSet {
            tenant: t("acme"),
            pool_kind: PoolKind::Edge,
            quota: quota(2_000, 40_000, 4),
        },
    );
    let mut f = spec("acme", "near", Tier::Guaranteed, 600, 4_096);
    f.pool = PoolPreference::Edge("edge-b".into());
    deploy(&mut s, f);
    let p = plan(&s, &t("acme"), "near", &BestFit).unwrap();
    assert_eq!(
        (p.pool.as_str(), p.slices[0].gpu.clone()),
        ("edge-b", gpu("eb1", 0))
    );
    ok(&mut s, p.command());
    // edge-b is full (600 + 600 > 1000): the other edge pool is next ...
    let p = plan(&s, &t("acme"), "near", &BestFit).unwrap();
    assert_eq!(p.pool, "edge-a");
    ok(&mut s, p.command());
    // ... then the center, as both edge GPUs are full.
    let p = plan(&s, &t("acme"), "near", &BestFit).unwrap();
    assert_eq!(p.pool_kind, PoolKind::Center);
    let mut c = spec("acme", "central", Tier::Burstable, 100, 1_000);
    c.pool = PoolPreference::Center;
    deploy(&mut s, c);
    let p = plan(&s, &t("acme"), "central", &BestFit).unwrap();
    assert_eq!(p.pool, "dc");
}

#[test]
fn rejections_name_what_ran_out_on_the_best_candidate() {
    let mut s = region();
    ok(
        &mut s,
        DomainCommand::QuotaSet {
            tenant: t("acme"),
            pool_kind: PoolKind::Center,
            quota: quota(100_000, 1_000_000, 100),
        },
    );
    // 15 GiB guaranteed instances: one per GPU of the center.
    let mut f = spec("acme", "fat", Tier::Guaranteed, 100, 15_000);
    f.pool = PoolPreference::Center;
    f.max_instances = 10;
    deploy(&mut s, f);
    for _ in 0..4 {
        place(&mut s, "acme", "fat");
    }
    // The edge quota (16 GiB) admits one more at the edge ...
    place(&mut s, "acme", "fat");
    // ... then capacity runs out: every center GPU has 1_384 MiB free, and
    // the edge quota would pass.
    let r = plan(&s, &t("acme"), "fat", &BestFit).unwrap_err();
    assert_eq!(r.code(), "quota_exceeded", "{r}");
    ok(
        &mut s,
        DomainCommand::QuotaSet {
            tenant: t("acme"),
            pool_kind: PoolKind::Edge,
            quota: quota(100_000, 1_000_000, 100),
        },
    );
    place(&mut s, "acme", "fat");
    let r = plan(&s, &t("acme"), "fat", &BestFit).unwrap_err();
    assert!(
        matches!(
            r.reason,
            RejectReason::Gpu {
                dimension: GpuDimension::Memory,
                ..
            }
        ),
        "{r}"
    );
    assert_eq!(r.gpus_evaluated, 6);
    assert_eq!(r.nodes_evaluated, 4);
    assert_eq!(r.exhausted.get(&GpuDimension::Memory), Some(&6));
    // Max instances is said before capacity.
    let mut f = s.function(&t("acme"), "fat").unwrap().spec.clone();
    f.max_instances = 5;
    let r = plan_spec(&s, &f, &BestFit).unwrap_err();
    assert_eq!(r.code(), "max_instances");
    // A quota below what is held is refused.
    let e = refused(
        &mut s,
        DomainCommand::QuotaSet {
            tenant: t("acme"),
            pool_kind: PoolKind::Center,
            quota: quota(100_000, 1_000, 100),
        },
    );
    assert_eq!(e.code(), "quota_below_held");
}

#[test]
fn oversubscribed_instances_fill_free_memory_then_host_swap() {
    let mut s = region();
    ok(
        &mut s,
        DomainCommand::QuotaSet {
            tenant: t("acme"),
            pool_kind: PoolKind::Edge,
            quota: quota(100_000, 1_000_000, 100),
        },
    );
    let mut f = spec("acme", "lazy", Tier::Oversubscribed, 500, 8_192);
    f.pool = PoolPreference::Edge("edge-a".into());
    f.max_instances = 100;
    deploy(&mut s, f);
    // GPU 16 GiB + host swap 4 GiB on each edge node: 2 + 0.5 → 2 per node
    // fit in the GPU, a third needs 8 GiB of swap (only 4): spill.
    let pools: Vec<String> = (0..4)
        .map(|_| {
            let p = plan(&s, &t("acme"), "lazy", &BestFit).unwrap();
            ok(&mut s, p.command());
            p.pool
        })
        .collect();
    assert_eq!(pools, ["edge-a", "edge-a", "edge-b", "edge-b"]);
    let r = plan(&s, &t("acme"), "lazy", &BestFit).unwrap();
    assert_eq!(r.pool_kind, PoolKind::Center);
    let edge = s.node_load(&NodeId("ea1".into())).unwrap();
    assert_eq!(edge.gpus[0].load.oversub_mib, 16_384);
    assert_eq!(edge.swap_need(), 0);
}

#[test]
fn a_topology_reload_drains_a_removed_node() {
    let mut s = region();
    let mut f = spec("acme", "edge-fn", Tier::Guaranteed, 300, 2_048);
    f.pool = PoolPreference::Edge("edge-b".into());
    f.min_instances = 1;
    deploy(&mut s, f);
    let gone = place(&mut s, "acme", "edge-fn");
    assert_eq!(s.instance(gone).unwrap().slices[0].gpu, gpu("eb1", 0));
    let mut c = spec("acme", "center-fn", Tier::Burstable, 300, 2_048);
    c.pool = PoolPreference::Center;
    deploy(&mut s, c);
    let kept = place(&mut s, "acme", "center-fn");
    register(&mut s, "agent-eb1", "eb1");
    assert!(s.underplaced().is_empty());
    // Reload without edge-b's node (and without the edge-b pool).
    let without = NODES.replace(
        "[[pools]]\nname = \"edge-b\"\nkind = \"edge\"\n\n[[pools.nodes]]\nname = \"eb1\"",
        "[[pools]]\nname = \"edge-b\"\nkind = \"edge\"\n\n[[pools.nodes]]\nname = \"eb2\"",
    );
    let applied = ok(
        &mut s,
        DomainCommand::TopologyLoad {
            topology: topology(&format!("{without}{PRICES}")),
        },
    );
    assert_eq!(
        applied,
        Applied::TopologyLoaded {
            nodes: 4,
            drained: vec![NodeId("eb1".into())],
            restored: vec![],
            released: vec![gone],
            price_epoch: 0,
        }
    );
    let d = &s.drained()[&NodeId("eb1".into())];
    assert_eq!((d.since, d.released.clone()), (T0, vec![gone]));
    assert_eq!(d.node.pool, "edge-b");
    assert!(s.instance(gone).is_none() && s.instance(kept).is_some());
    assert_eq!(s.held(&t("acme"), PoolKind::Edge), Quota::default());
    assert_eq!(s.underplaced(), [(t("acme"), "edge-fn".to_string(), 1)]);
    // A drained node takes nothing and registers no agent.
    let e = refused(
        &mut s,
        DomainCommand::InstancePlace {
            tenant: t("acme"),
            function: "edge-fn".into(),
            slices: vec![Slice {
                gpu: gpu("eb1", 0),
                compute_milli: 300,
                memory_mib: 2_048,
            }],
        },
    );
    assert_eq!(e.code(), "node_draining");
    let e = refused(
        &mut s,
        DomainCommand::AgentRegister {
            agent: AgentId("agent-eb1".into()),
            node: NodeId("eb1".into()),
            version: "0.1.0".into(),
        },
    );
    assert_eq!(e.code(), "node_draining");
    // The leader re-places it: edge-b's new node.
    let p = plan(&s, &t("acme"), "edge-fn", &BestFit).unwrap();
    assert_eq!(p.slices[0].gpu, gpu("eb2", 0));
    // Bringing the node back restores it.
    let applied = ok(
        &mut s,
        DomainCommand::TopologyLoad {
            topology: full_topology(),
        },
    );
    assert!(matches!(
        applied,
        Applied::TopologyLoaded { ref restored, ref drained, .. }
            if restored == &[NodeId("eb1".into())] && drained == &[NodeId("eb2".into())]
    ));
    assert!(!s.drained().contains_key(&NodeId("eb1".into())));
}

#[test]
fn a_reload_that_shrinks_a_gpu_releases_the_newest_that_no_longer_fit() {
    let mut s = region();
    let mut f = spec("acme", "f", Tier::Guaranteed, 100, 6_000);
    f.pool = PoolPreference::Edge("edge-a".into());
    deploy(&mut s, f);
    let first = place(&mut s, "acme", "f");
    let second = place(&mut s, "acme", "f");
    let smaller = NODES.replace(
        "name = \"ea1\"\ncpu_milli = 4_000\nmemory_mib = 16_384\nswap_mib = 4_096\ngpus = [{ model = \"g16\", count = 1 }]",
        "name = \"ea1\"\ncpu_milli = 4_000\nmemory_mib = 16_384\nswap_mib = 4_096\ngpus = [{ model = \"g16\", count = 1, memory_mib = 8_192 }]",
    );
    assert_ne!(smaller, NODES);
    let applied = ok(
        &mut s,
        DomainCommand::TopologyLoad {
            topology: topology(&format!("{smaller}{PRICES}")),
        },
    );
    assert!(
        matches!(applied, Applied::TopologyLoaded { ref released, .. } if released == &[second])
    );
    assert!(s.instance(first).is_some());
    assert!(s.drained().is_empty());
}

#[test]
fn updates_that_lower_max_instances_release_the_newest_and_reshaping_ones_keep_them() {
    let mut s = region();
    let f = spec("acme", "f", Tier::Guaranteed, 100, 1_000);
    deploy(&mut s, f.clone());
    let a = place(&mut s, "acme", "f");
    let b = place(&mut s, "acme", "f");
    let mut g = f.clone();
    g.deadline_ms = 900;
    g.max_instances = 1;
    let r = ok(&mut s, DomainCommand::FunctionUpdate { spec: g.clone() });
    assert_eq!(
        r,
        Applied::FunctionUpdated {
            tenant: t("acme"),
            name: "f".into(),
            version: 2,
            released: vec![b],
            replacing: vec![],
        }
    );
    assert_eq!(s.instance(a).map(|i| i.version), Some(2));
    g.memory_mib = 2_000;
    let r = ok(&mut s, DomainCommand::FunctionUpdate { spec: g.clone() });
    assert!(matches!(
        r,
        Applied::FunctionUpdated { version: 3, ref released, ref replacing, .. }
            if released.is_empty() && replacing == &[a]
    ));
    assert_eq!(s.instance_count(&t("acme"), "f"), 0);
    assert_eq!(s.outgoing(&t("acme"), "f").count(), 1);
    g.tenant = t("globex");
    let e = refused(&mut s, DomainCommand::FunctionUpdate { spec: g });
    assert_eq!(e.code(), "unknown_function");
}

/// A rich state: topology, tenants, tokens, functions, instances, agents,
/// usage, a second price list, a drained node.
fn rich_state() -> RegionState {
    let mut s = region();
    ok(
        &mut s,
        DomainCommand::TokenIssue {
            tenant: t("acme"),
            token_id: "ci".into(),
            digest: "0f".repeat(32),
        },
    );
    let mut e = spec("acme", "e", Tier::Oversubscribed, 200, 3_000);
    e.pool = PoolPreference::Edge("edge-b".into());
    deploy(&mut s, e);
    place(&mut s, "acme", "e");
    deploy(&mut s, spec("globex", "x", Tier::Exclusive, 1_000, 10_000));
    place(&mut s, "globex", "x");
    deploy(&mut s, spec("acme", "g", Tier::Guaranteed, 250, 3_000));
    place(&mut s, "acme", "g");
    register(&mut s, "a1", "c1");
    ok(
        &mut s,
        batch(
            "a1",
            vec![
                hour_record(1, "acme", Tier::Guaranteed, PoolKind::Center),
                hour_record(3, "globex", Tier::Exclusive, PoolKind::Center),
            ],
        ),
    );
    let list = s.price_list().unwrap().clone();
    ok(&mut s, DomainCommand::PriceListSet { list });
    let without = NODES.replace("name = \"c2\"", "name = \"c3\"");
    ok(
        &mut s,
        DomainCommand::TopologyLoad {
            topology: topology(&format!("{without}{PRICES}")),
        },
    );
    s
}

#[test]
fn snapshots_round_trip_through_json_and_bincode() {
    let s = rich_state();
    assert!(!s.drained().is_empty());
    assert!(s.instances().count() >= 2);
    let json = serde_json::to_string(&s).unwrap();
    let back: RegionState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s);
    back.check_invariants().unwrap();
    for n in s.topology().unwrap().nodes() {
        assert_eq!(back.node_load(&n.name), s.node_load(&n.name));
    }
    assert_eq!(back.token_owner(&"0f".repeat(32)), Some((&t("acme"), "ci")));
    assert_eq!(whole_day_bill(&back, "acme"), whole_day_bill(&s, "acme"));

    let config = bincode::config::standard().with_limit::<{ 64 << 20 }>();
    let bytes = bincode::serde::encode_to_vec(&s, config).unwrap();
    let (back, used): (RegionState, usize) =
        bincode::serde::decode_from_slice(&bytes, config).unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(back, s);
    back.check_invariants().unwrap();
    // Commands and outcomes travel the same way.
    let cmds = DomainCommand::initial(
        s.topology().unwrap(),
        &crate::config::Tenants::from_toml(
            "t.toml",
            "[[tenants]]\nname = \"acme\"\n[tenants.quota.edge]\ncompute_milli = 1\nmemory_mib = 1\ninstances = 1\n",
        )
        .unwrap(),
    );
    assert_eq!(cmds.len(), 2);
    for c in cmds.iter().chain([&batch(
        "a1",
        vec![hour_record(9, "acme", Tier::Burstable, PoolKind::Edge)],
    )]) {
        let b = bincode::serde::encode_to_vec(c, config).unwrap();
        let (d, _): (DomainCommand, usize) = bincode::serde::decode_from_slice(&b, config).unwrap();
        assert_eq!(&d, c);
    }
    let e = ApplyError::GpuFull {
        gpu: gpu("c1", 0),
        dimension: GpuDimension::SwapSpace,
    };
    let b = bincode::serde::encode_to_vec(&e, config).unwrap();
    let (d, _): (ApplyError, usize) = bincode::serde::decode_from_slice(&b, config).unwrap();
    assert_eq!(d, e);
}

/// A random function spec of `tenant`.
fn random_spec(rng: &mut Rng, tenant: &str, name: String) -> FunctionSpec {
    let tier = Tier::ALL[rng.below(4) as usize];
    let compute = match tier {
        Tier::Exclusive => 1_000 * (1 + rng.below(2) as u32),
        _ => [100, 250, 300, 500, 700][rng.below(5) as usize],
    };
    let memory = [1_000, 2_048, 4_096, 6_000, 9_000][rng.below(5) as usize];
    let mut f = spec(tenant, &name, tier, compute, memory);
    f.pool = match rng.below(4) {
        0 => PoolPreference::Any,
        1 => PoolPreference::Center,
        2 => PoolPreference::Edge("edge-a".into()),
        _ => PoolPreference::Edge("edge-b".into()),
    };
    f.min_instances = 0;
    f.max_instances = 1 + rng.below(4) as u32;
    f
}

/// Two leaders plan on views that go stale while the other's proposals,
/// deploys, updates, deletes, releases and quota changes are applied. After
/// every apply the invariants hold: no GPU over its tier rules, no tenant
/// over its quota, no function over its max, the look-up tables equal to a
/// rebuild, and a refused command changes nothing.
#[test]
fn random_commands_from_two_stale_leaders_never_over_allocate() {
    let tenants = ["acme", "globex"];
    let topologies = [
        full_topology(),
        topology(&format!("{}{PRICES}", NODES.replace("\"eb1\"", "\"eb2\""))),
        topology(&format!(
            "{}{PRICES}",
            NODES.replace(
                "swap_mib = 4_096\ngpus = [{ model = \"g16\", count = 1 }]\n\n[[pools]]\nname = \"edge-b\"",
                "swap_mib = 4_096\ngpus = [{ model = \"g16\", count = 1, memory_mib = 8_192 }]\n\n[[pools]]\nname = \"edge-b\"",
            )
        )),
    ];
    assert!(topologies[0] != topologies[1] && topologies[0] != topologies[2]);
    let mut recheck_refusals = 0u32;
    let mut placed = 0u32;
    let mut drained = 0u32;
    for seed in 0..24u64 {
        let mut rng = Rng::new(seed);
        let mut s = region();
        let mut views = [s.clone(), s.clone()];
        let mut pending: [Vec<DomainCommand>; 2] = [Vec::new(), Vec::new()];
        let mut names = 0u32;
        for step in 0..400u32 {
            let leader = rng.below(2) as usize;
            let cmd = match rng.below(20) {
                0..=2 => {
                    names += 1;
                    let tenant = tenants[rng.below(2) as usize];
                    DomainCommand::FunctionDeploy {
                        spec: random_spec(&mut rng, tenant, format!("f{names}")),
                    }
                }
                3..=9 => {
                    // Plan on this leader's (maybe stale) view; propose later.
                    let fs: Vec<_> = views[leader].functions().map(|f| f.spec.clone()).collect();
                    if fs.is_empty() {
                        continue;
                    }
                    let f = &fs[rng.below(fs.len() as u64) as usize];
                    let ranking = RegionRanking::from_state(&views[leader]);
                    if let Ok(p) = plan_spec(&views[leader], f, &ranking) {
                        pending[leader].push(p.command());
                    }
                    continue;
                }
                10..=13 => {
                    // Apply one of this leader's proposals.
                    if pending[leader].is_empty() {
                        continue;
                    }
                    let i = rng.below(pending[leader].len() as u64) as usize;
                    pending[leader].swap_remove(i)
                }
                14..=15 => {
                    let ids: Vec<_> = s.instances().map(|i| i.id).collect();
                    if ids.is_empty() {
                        continue;
                    }
                    let instance = ids[rng.below(ids.len() as u64) as usize];
                    if step % 2 == 0 {
                        DomainCommand::InstanceRelease { instance }
                    } else {
                        DomainCommand::InstanceScaleIn { instance }
                    }
                }
                16 => {
                    let fs: Vec<_> = s.functions().map(|f| f.spec.clone()).collect();
                    if fs.is_empty() {
                        continue;
                    }
                    let f = &fs[rng.below(fs.len() as u64) as usize];
                    if rng.below(2) == 0 {
                        DomainCommand::FunctionDelete {
                            tenant: f.tenant.clone(),
                            name: f.name.clone(),
                        }
                    } else {
                        DomainCommand::FunctionUpdate {
                            spec: random_spec(&mut rng, &f.tenant.0, f.name.clone()),
                        }
                    }
                }
                17 if rng.below(4) == 0 => DomainCommand::TopologyLoad {
                    // Reloads drain eb1 or shrink ea1's GPU, or restore both.
                    topology: topologies[rng.below(3) as usize].clone(),
                },
                17 => DomainCommand::QuotaSet {
                    tenant: t(tenants[rng.below(2) as usize]),
                    pool_kind: if rng.below(2) == 0 {
                        PoolKind::Center
                    } else {
                        PoolKind::Edge
                    },
                    quota: quota(rng.below(4_000), rng.below(40_000), rng.below(8) as u32),
                },
                _ => {
                    // This leader catches up.
                    views[leader] = s.clone();
                    continue;
                }
            };
            let before = s.clone();
            let is_place = matches!(cmd, DomainCommand::InstancePlace { .. });
            match s.apply(cmd, T0 + u64::from(step)) {
                Ok(Applied::TopologyLoaded { released, .. }) => drained += released.len() as u32,
                Ok(_) => placed += u32::from(is_place),
                Err(e) => {
                    assert_eq!(
                        s, before,
                        "seed {seed} step {step}: refused {e} changed state"
                    );
                    if matches!(
                        e,
                        ApplyError::GpuFull { .. }
                            | ApplyError::QuotaExceeded { .. }
                            | ApplyError::MaxInstances { .. }
                    ) {
                        recheck_refusals += 1;
                    }
                }
            }
            if let Err(e) = s.check_invariants() {
                panic!("seed {seed} step {step}: {e}");
            }
        }
        let json = serde_json::to_string(&s).unwrap();
        let back: RegionState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s, "seed {seed}");
    }
    // The run exercised both outcomes: stale plans landed, and stale plans
    // were caught by the re-check (including plans for drained nodes).
    assert!(placed > 200, "placed {placed}");
    assert!(recheck_refusals > 50, "refused {recheck_refusals}");
    assert!(drained > 5, "released by reloads {drained}");
}

#[test]
fn a_fresh_plan_always_applies() {
    // The planner and apply agree: with no other command in between, a
    // proposal from the current state is never refused.
    for seed in 0..8u64 {
        let mut rng = Rng::new(seed);
        let mut s = region();
        for tenant in ["acme", "globex"] {
            ok(
                &mut s,
                DomainCommand::TenantUpdate {
                    tenant: t(tenant),
                    display_name: None,
                    quotas: Some(BTreeMap::from([
                        (PoolKind::Center, quota(100_000, 1_000_000, 1_000)),
                        (PoolKind::Edge, quota(100_000, 1_000_000, 1_000)),
                    ])),
                },
            );
        }
        for i in 0..40 {
            let tenant = ["acme", "globex"][rng.below(2) as usize];
            let f = random_spec(&mut rng, tenant, format!("f{i}"));
            deploy(&mut s, f.clone());
            let ranking = RegionRanking::from_state(&s);
            match plan_spec(&s, &f, &ranking) {
                Ok(p) => {
                    ok(&mut s, p.command());
                }
                Err(r) => assert_eq!(r.code(), "gpu_full", "seed {seed}: {r}"),
            }
        }
    }
}

#[test]
fn fgd_and_gshare_rankings_keep_room_for_common_shapes() {
    // Typical shape: 500 milli / 4 GiB. A 500-milli request should go to a
    // GPU where the rest still fits the shape, not one it would strand.
    let cap = GpuCapacity {
        memory_mib: 16_384,
        available: true,
    };
    let fgd = FgdRanking::from_shapes([(500, 4_096, 10)]);
    let gshare = GshareRanking::from_shapes([(500, 4_096, 10)]);
    let half = GpuLoad::default().with(&Demand {
        tier: Tier::Guaranteed,
        compute_milli: 500,
        memory_mib: 4_096,
    });
    let odd = GpuLoad::default().with(&Demand {
        tier: Tier::Guaranteed,
        compute_milli: 300,
        memory_mib: 4_096,
    });
    let d = Demand {
        tier: Tier::Guaranteed,
        compute_milli: 500,
        memory_mib: 4_096,
    };
    // 700 milli and 12 GiB left: the shape fits, nothing is lost.
    assert_eq!(fgd.fragmentation(&cap, &odd), 0.0);
    // Memory counts: with 3 GiB left the shape cannot use the free compute.
    let full_memory = GpuLoad::default().with(&Demand {
        tier: Tier::Guaranteed,
        compute_milli: 100,
        memory_mib: 13_384,
    });
    assert_eq!(fgd.fragmentation(&cap, &full_memory), 900.0);
    for r in [&fgd as &dyn Ranking, &gshare] {
        // On `odd` the request leaves 200 milli nobody's shape can use.
        assert!(r.score_slice(&cap, &half, &d) < r.score_slice(&cap, &odd, &d));
        // Filling `half` exactly and taking half of an empty GPU both leave
        // every shape its room: equal scores (the earlier GPU wins), as in
        // the FGD paper's measure.
        assert_eq!(
            r.score_slice(&cap, &half, &d),
            r.score_slice(&cap, &GpuLoad::default(), &d)
        );
    }
    assert_eq!((fgd.name(), gshare.name()), ("fgd", "gshare"));
}

#[test]
fn burstable_functions_neither_shape_the_holes_nor_hide_a_spent_budget() {
    // The typical pods are the guaranteed functions' shapes: a burstable
    // function's compute is not reserved, so its shape is no hole size.
    let mut s = region();
    deploy(&mut s, spec("acme", "g", Tier::Guaranteed, 600, 1_000));
    deploy(&mut s, spec("acme", "b", Tier::Burstable, 300, 1_000));
    assert_eq!(deployed_shapes(&s), vec![(600, 1_000, 1)]);
    // With none guaranteed the burstable shapes stand in.
    let mut only_burst = region();
    deploy(
        &mut only_burst,
        spec("acme", "b", Tier::Burstable, 300, 1_000),
    );
    assert_eq!(deployed_shapes(&only_burst), vec![(300, 1_000, 1)]);

    // Under a 1.5-GPU overcommit budget, a GPU whose burstable slices hold
    // 1000 milli has only 500 left for a guaranteed slice, though nobody
    // reserved any: a 500-milli slice fills it exactly, and the empty GPU
    // keeps its whole room for the typical 600-milli shape.
    let caps = SharingCaps {
        burst_compute_milli: 1_500,
        oversubscribed_per_gpu: 8,
    };
    let cap = GpuCapacity {
        memory_mib: 16_384,
        available: true,
    };
    let burst = GpuLoad::default().with(&Demand {
        tier: Tier::Burstable,
        compute_milli: 1_000,
        memory_mib: 1_000,
    });
    let empty = GpuLoad::default().with(&Demand {
        tier: Tier::Guaranteed,
        compute_milli: 0,
        memory_mib: 1_000,
    });
    let d = Demand {
        tier: Tier::Guaranteed,
        compute_milli: 500,
        memory_mib: 1_000,
    };
    assert!(check_gpu(&caps, &cap, &burst.with(&d)).is_ok());
    let fgd = FgdRanking::from_shapes([(600, 1_000, 10)]).with_caps(caps);
    let gshare = GshareRanking::from_shapes([(600, 1_000, 10)]).with_caps(caps);
    assert_eq!(fgd.fragmentation(&cap, &burst), 500.0);
    assert_eq!(fgd.fragmentation(&cap, &empty), 0.0);
    for r in [&fgd as &dyn Ranking, &gshare] {
        assert!(
            r.score_slice(&cap, &burst, &d) < r.score_slice(&cap, &empty, &d),
            "{}",
            r.name()
        );
    }
    // Under the default budget (2 GPUs) the same burstable load leaves all
    // 1000 milli to a guaranteed slice.
    assert_eq!(
        FgdRanking::from_shapes([(600, 1_000, 10)]).fragmentation(&cap, &burst),
        0.0
    );
}

#[test]
fn the_region_ranks_by_its_topologys_placement_policy() {
    let mut s = RegionState::default();
    assert_eq!(s.placement_policy(), RegionPolicy::Gshare);
    let text = format!("{NODES}{PRICES}").replace(
        "[cold_start]",
        "[placement]\npolicy = \"fgd\"\n\n[cold_start]",
    );
    let loaded = topology(&text);
    assert_eq!(loaded.placement_policy(), RegionPolicy::Fgd);
    s.apply(DomainCommand::TopologyLoad { topology: loaded }, 0)
        .unwrap();
    assert_eq!(s.placement_policy(), RegionPolicy::Fgd);
    assert_eq!(RegionRanking::from_state(&s).name(), "fgd");
    // Snapshots keep it (the Raft store's encoding: bincode, standard).
    let config = bincode::config::standard();
    let bytes = bincode::serde::encode_to_vec(&s, config).unwrap();
    let (back, _): (RegionState, usize) =
        bincode::serde::decode_from_slice(&bytes, config).unwrap();
    assert_eq!(back.placement_policy(), RegionPolicy::Fgd);
    // A log entry written before `[placement]` existed (variant 6, the
    // older topology form) still decodes, and loads the default policy.
    let old = crate::config::LegacyTopology(topology(&format!("{NODES}{PRICES}")));
    let v1 = bincode::serde::encode_to_vec((6u32, old), config).unwrap();
    let (cmd, _): (DomainCommand, usize) = bincode::serde::decode_from_slice(&v1, config).unwrap();
    assert!(
        matches!(cmd, DomainCommand::TopologyLoadV1 { .. }),
        "{cmd:?}"
    );
    s.apply(cmd, 1).unwrap();
    assert_eq!(s.placement_policy(), RegionPolicy::Gshare);
    assert_eq!(RegionRanking::from_state(&s).name(), "gshare");
}

/// Records sent in random, overlapping, reordered batches (some twice,
/// some to "another replica", i.e. again later) are billed exactly once.
#[test]
fn random_overlapping_batches_bill_every_record_once() {
    for seed in 0..16u64 {
        let mut rng = Rng::new(seed);
        let mut s = region();
        register(&mut s, "a1", "c1");
        let n = 300u64;
        let records: Vec<UsageRecord> = (1..=n)
            .map(|seq| {
                let mut r = hour_record(
                    seq,
                    ["acme", "globex"][rng.below(2) as usize],
                    Tier::ALL[rng.below(4) as usize],
                    PoolKind::Center,
                );
                r.compute_milli_gpu_ms = rng.below(5_000_000);
                r.memory_mib_ms = rng.below(5_000_000);
                r.invocations = rng.below(50);
                r.end_ms = T0 + rng.below(3 * HOUR_MS);
                r
            })
            .collect();
        let mut expected = [Usage::default(), Usage::default()];
        for r in &records {
            let i = usize::from(r.tenant.0 == "globex");
            expected[i] = expected[i]
                .checked_add(&Usage {
                    compute_milli_gpu_ms: r.compute_milli_gpu_ms,
                    memory_mib_ms: r.memory_mib_ms,
                    invocations: r.invocations,
                })
                .unwrap();
        }
        // Every record goes out at least once, a third of them twice.
        let mut sends: Vec<UsageRecord> = records.clone();
        sends.extend(records.iter().filter(|_| rng.below(3) == 0).cloned());
        rng.shuffle(&mut sends);
        let mut applied = 0u32;
        while !sends.is_empty() {
            let k = (1 + rng.below(20) as usize).min(sends.len());
            let chunk: Vec<UsageRecord> = sends.drain(..k).collect();
            match ok(&mut s, batch("a1", chunk)) {
                Applied::UsageApplied { applied: a, .. } => applied += a,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(u64::from(applied), n, "seed {seed}");
        let cursor = &s.agent(&AgentId("a1".into())).unwrap().cursor;
        assert_eq!(
            (cursor.contiguous, cursor.ahead.len()),
            (n, 0),
            "seed {seed}"
        );
        for (i, tenant) in ["acme", "globex"].into_iter().enumerate() {
            let bill = s.bill(&t(tenant), 0, u64::MAX / 2).unwrap();
            let mut got = Usage::default();
            for l in &bill.lines {
                got = got.checked_add(&l.usage).unwrap();
            }
            assert_eq!(got, expected[i], "seed {seed} {tenant}");
            let priced: u64 = bill.lines.iter().map(|l| l.charge.total).sum();
            assert_eq!(priced, bill.total);
        }
    }
}

#[test]
fn a_limited_plan_stops_early_and_rotates_its_start() {
    let mut s = region();
    let mut f = spec("acme", "small", Tier::Guaranteed, 100, 1_000);
    f.pool = PoolPreference::Center;
    deploy(&mut s, f.clone());
    let at = |start| {
        let options = PlanOptions {
            feasible_limit: Some(1),
            start,
            ..PlanOptions::default()
        };
        plan_spec_with(&s, &f, &BestFit, &options).unwrap()
    };
    // One node per start (c1, c2), its best GPU; the full scan ties to c1.
    assert_eq!(at(0).slices[0].gpu, gpu("c1", 0));
    assert_eq!(at(1).slices[0].gpu, gpu("c2", 0));
    assert_eq!(at(2).slices[0].gpu, gpu("c1", 0));
    let p = at(1);
    ok(&mut s, p.command());
    // A full scan now prefers the GPU already in use (best fit) for
    // another function, and one apart from it for `small` itself (spread).
    let mut other = f.clone();
    other.name = "other".into();
    deploy(&mut s, other);
    assert_eq!(
        plan(&s, &t("acme"), "other", &BestFit).unwrap().slices[0].gpu,
        gpu("c2", 0)
    );
    assert_eq!(
        plan(&s, &t("acme"), "small", &BestFit).unwrap().slices[0].gpu,
        gpu("c1", 0)
    );
    // Larger than every GPU: a limited plan says so before it scans.
    let mut huge = f.clone();
    huge.memory_mib = 20_000;
    let options = PlanOptions {
        feasible_limit: Some(1),
        start: 5,
        ..PlanOptions::default()
    };
    let r = plan_spec_with(&s, &huge, &BestFit, &options).unwrap_err();
    assert_eq!(r.code(), "unsatisfiable");
    assert_eq!(r.nodes_evaluated, 0);
    // With nothing feasible (c2/gpu0 holds 1 GiB; the rest are taken by
    // quota) a limited plan still says why.
    huge.memory_mib = 16_384;
    for (kind, q) in [
        (PoolKind::Center, quota(3_000, 2_000, 8)),
        (PoolKind::Edge, quota(0, 0, 0)),
    ] {
        ok(
            &mut s,
            DomainCommand::QuotaSet {
                tenant: t("acme"),
                pool_kind: kind,
                quota: q,
            },
        );
    }
    let r = plan_spec_with(&s, &huge, &BestFit, &options).unwrap_err();
    assert_eq!(r.code(), "quota_exceeded", "{r}");
}

fn register_gpus(node: &str, count: u32, memory_mib: u64, allow_fewer: bool) -> DomainCommand {
    DomainCommand::AgentRegisterGpus {
        agent: AgentId(node.into()),
        node: NodeId(node.into()),
        version: "0.1.0".into(),
        gpus: (0..count)
            .map(|index| crate::protocol::NodeGpu {
                index,
                model: "g16".into(),
                memory_mib,
            })
            .collect(),
        allow_fewer_gpus: allow_fewer,
    }
}

#[test]
fn registration_checks_the_gpus_and_fewer_leave_the_rest_unavailable() {
    let mut s = region();
    // Lies about the GPUs are refused and change nothing.
    let e = refused(&mut s, register_gpus("c1", 5, 81_920, true));
    assert_eq!(e.code(), "gpu_mismatch");
    assert!(e.to_string().contains("81920 MiB"), "{e}");
    let e = refused(&mut s, register_gpus("c1", 1, 16_384, false));
    assert!(e.to_string().contains("allow_fewer_gpus"), "{e}");
    assert_eq!(
        refused(&mut s, register_gpus("nowhere", 1, 16_384, true)).code(),
        "unknown_node"
    );
    // An exclusive instance on each of c1's GPUs, then c1's agent comes back
    // with one GPU: the instance on GPU 1 is released, GPU 1 unavailable.
    deploy(&mut s, spec("acme", "whole", Tier::Exclusive, 1000, 16_384));
    let on = |s: &RegionState, g: &GpuId| {
        s.instances()
            .filter(|i| i.slices.iter().any(|sl| &sl.gpu == g))
            .count()
    };
    ok(
        &mut s,
        DomainCommand::InstancePlace {
            tenant: t("acme"),
            function: "whole".into(),
            slices: vec![Slice {
                gpu: gpu("c1", 1),
                compute_milli: 1000,
                memory_mib: 16_384,
            }],
        },
    );
    assert_eq!(on(&s, &gpu("c1", 1)), 1);
    ok(&mut s, register_gpus("c1", 1, 16_384, true));
    assert_eq!(on(&s, &gpu("c1", 1)), 0);
    assert_eq!(
        s.unavailable_gpus().get(&NodeId("c1".into())),
        Some(&std::collections::BTreeSet::from([1]))
    );
    // Nothing is placed there, by the planner or by a stale plan.
    let e = refused(
        &mut s,
        DomainCommand::InstancePlace {
            tenant: t("acme"),
            function: "whole".into(),
            slices: vec![Slice {
                gpu: gpu("c1", 1),
                compute_milli: 1000,
                memory_mib: 16_384,
            }],
        },
    );
    assert_eq!(e.code(), "gpu_full");
    assert!(e.to_string().contains("unavailable"), "{e}");
    for _ in 0..2 {
        let p = plan(&s, &t("acme"), "whole", &BestFit).unwrap_or_else(|r| panic!("{r}"));
        assert_ne!(p.slices[0].gpu, gpu("c1", 1));
        ok(&mut s, p.command());
    }
    assert_eq!(on(&s, &gpu("c1", 1)), 0);
    // Snapshots keep the unavailable GPUs (and the index agrees).
    let bytes = bincode::serde::encode_to_vec(&s, bincode::config::standard()).unwrap();
    let (back, _): (RegionState, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
    assert_eq!(back, s);
    back.check_invariants().unwrap();
    // All GPUs reported again: available again.
    ok(&mut s, register_gpus("c1", 2, 16_384, false));
    assert!(s.unavailable_gpus().is_empty());
    let p = plan(&s, &t("acme"), "whole", &BestFit);
    assert!(p.is_err() || p.unwrap().slices[0].gpu == gpu("c1", 1));
}
