//! The planner and apply on a large region (1,000 nodes × 8 GPUs): every
//! proposal from the current state applies, the invariants hold at the
//! end, the index over free capacity picks what the full scan picks, and
//! the time per plan is printed (not asserted) for both rankings, scanning
//! every node, stopping after 16 feasible candidates, or indexed.
//!
//! `cargo test --release -p gshare-core --test plan_scale -- --nocapture`

use gshare_core::config::Topology;
use gshare_core::state::{
    plan_spec_with, BestFit, DomainCommand, FgdRanking, GshareRanking, PlanOptions, Ranking,
    RegionState,
};
use gshare_core::{
    FunctionSpec, LatencyProfile, PoolKind, PoolPreference, Quota, Runtime, TenantId, Tier,
};
use std::collections::BTreeMap;
use std::time::Instant;

fn region(nodes: usize) -> RegionState {
    let mut t = String::from(
        "[[gpu_models]]\nname = \"a100\"\nmemory_mib = 81_920\nh2d_mib_per_s = 20_000\n\
         [cold_start]\nsetup_us = 1\nstorage_mib_per_s = 1000\n[swap]\nsetup_us = 1\n\
         [[pools]]\nname = \"dc\"\nkind = \"center\"\n",
    );
    for i in 0..nodes {
        t += &format!(
            "[[pools.nodes]]\nname = \"n{i}\"\ncpu_milli = 64_000\nmemory_mib = 512_000\n\
             swap_mib = 256_000\ngpus = [{{ model = \"a100\", count = 8 }}]\n"
        );
    }
    t += "[pricing]\ncurrency = \"USD\"\nunit = \"micro-USD\"\nunits_per_currency = 1_000_000\n\
          [pricing.tiers]\nexclusive = { discount_bp = 0 }\nguaranteed = { discount_bp = 0 }\n\
          burstable = { discount_bp = 0 }\noversubscribed = { discount_bp = 0 }\n\
          [[pricing.prices]]\ngpu_model = \"a100\"\npool_kind = \"center\"\ngpu_hour = 1\nmemory_gib_hour = 1\n";
    let topology = Topology::from_toml("scale.toml", &t).unwrap_or_else(|e| panic!("{e}"));
    let mut s = RegionState::default();
    s.apply(DomainCommand::TopologyLoad { topology }, 0)
        .unwrap();
    let all = Quota {
        compute_milli: gshare_core::bounds::MAX_QUOTA,
        memory_mib: gshare_core::bounds::MAX_QUOTA,
        instances: u32::MAX / 4,
    };
    s.apply(
        DomainCommand::TenantCreate {
            tenant: TenantId("t".into()),
            display_name: None,
            quotas: BTreeMap::from([(PoolKind::Center, all)]),
        },
        0,
    )
    .unwrap();
    s
}

fn spec(i: usize) -> FunctionSpec {
    FunctionSpec {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        tenant: TenantId("t".into()),
        name: format!("f{i}"),
        runtime: Runtime::Vllm,
        memory_mib: [2_048, 4_096, 8_192, 20_480][i % 4],
        compute_milli: [100, 250, 500, 300][i % 4],
        tier: [
            Tier::Guaranteed,
            Tier::Burstable,
            Tier::Guaranteed,
            Tier::Oversubscribed,
        ][i % 4],
        deadline_ms: 100,
        pool: PoolPreference::Any,
        min_instances: 1,
        max_instances: 1,
        idle_timeout_s: 60,
        latency: LatencyProfile {
            full_gpu_us: 1_000,
            saturation_milli: 1_000,
        },
    }
}

#[test]
fn plans_on_eight_thousand_gpus_all_apply() {
    // The full size in release builds; a fifth of it in debug builds.
    let (nodes, n) = if cfg!(debug_assertions) {
        (200, 400)
    } else {
        (1_000, 2_000)
    };
    let mut base = region(nodes);
    for i in 0..n {
        base.apply(DomainCommand::FunctionDeploy { spec: spec(i) }, 0)
            .unwrap();
    }
    let fgd = FgdRanking::from_state(&base);
    let gshare = GshareRanking::from_state(&base);
    let full = PlanOptions::default();
    // (label, ranking, 0 full scan / 1 limited / 2 indexed)
    let runs: [(&str, &dyn Ranking, u8); 7] = [
        ("bestfit, full scan", &BestFit, 0),
        ("fgd, full scan", &fgd, 0),
        ("gshare, full scan", &gshare, 0),
        ("gshare, 16 feasible", &gshare, 1),
        ("bestfit, indexed", &BestFit, 2),
        ("fgd, indexed", &fgd, 2),
        ("gshare, indexed", &gshare, 2),
    ];
    let mut per_plan_us = Vec::new();
    let mut chosen: Vec<Vec<Vec<gshare_core::Slice>>> = Vec::new();
    for (label, ranking, how) in runs {
        let mut s = base.clone();
        let mut planning = 0u128;
        let mut slices = Vec::new();
        for i in 0..n {
            let options = match how {
                1 => PlanOptions {
                    feasible_limit: Some(16),
                    start: i * 7_919,
                    ..PlanOptions::default()
                },
                2 => PlanOptions::indexed(),
                _ => full,
            };
            let t0 = Instant::now();
            let p =
                plan_spec_with(&s, &spec(i), ranking, &options).unwrap_or_else(|r| panic!("{r}"));
            planning += t0.elapsed().as_nanos();
            slices.push(p.slices.clone());
            s.apply(p.command(), 1).unwrap_or_else(|e| panic!("{e}"));
        }
        chosen.push(slices);
        s.check_invariants().unwrap();
        assert_eq!(s.instances().count(), n);
        let us = planning as f64 / n as f64 / 1_000.0;
        per_plan_us.push(us);
        let used_gpus = s
            .node_loads()
            .iter()
            .flat_map(|l| &l.gpus)
            .filter(|g| g.load.instances > 0)
            .count();
        println!(
            "{label}: {n} plans on {nodes} nodes x 8 GPUs, {us:.1} us per plan ({:.0} plans/s on one core), {used_gpus} GPUs in use",
            1e6 / us
        );
    }
    println!(
        "time per plan relative to bestfit full scan: fgd {:.2}, gshare {:.2}, gshare limited {:.3}, indexed bestfit {:.3}, indexed fgd {:.3}, indexed gshare {:.3}",
        per_plan_us[1] / per_plan_us[0],
        per_plan_us[2] / per_plan_us[0],
        per_plan_us[3] / per_plan_us[0],
        per_plan_us[4] / per_plan_us[0],
        per_plan_us[5] / per_plan_us[0],
        per_plan_us[6] / per_plan_us[0]
    );
    // The index picks what the full scan of the same ranking picks, plan by plan.
    for (indexed, scan, label) in [(4, 0, "bestfit"), (5, 1, "fgd"), (6, 2, "gshare")] {
        assert!(
            chosen[indexed] == chosen[scan],
            "indexed {label} differs from its full scan"
        );
    }
}
