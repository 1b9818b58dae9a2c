//! Invariants of the serving simulator, and the goals on the real
//! Alibaba GenAI trace (release builds; CI runs `cargo test --release`).

use gshare_core::sim::serving::{
    compute_time_min_gpus, demand_min_gpus, evaluate, ffd_memory_gpus, mandatory_min_gpus,
    memory_time_min_gpus, proven_min_gpus, simulate, BoundKind, GpuCount, LlmSpec, RunSpec,
    ServingParams, ServingPolicy, ServingTrace, SyntheticSpec, TARGET_ATTAINMENT,
};

fn params() -> ServingParams {
    ServingParams::from_toml(
        "topology.toml",
        include_str!("../../configs/examples/topology.toml"),
    )
    .unwrap()
}

fn spec(policy: ServingPolicy, gpus: u32) -> RunSpec {
    RunSpec {
        policy,
        static_slices: 2,
        gpus,
        slack: 4.0,
    }
}

fn small(seed: u64) -> ServingTrace {
    let mut s = SyntheticSpec::new(40, 4_000, seed);
    s.mean_interarrival_us = 400_000;
    s.generate()
}

#[test]
fn every_request_is_run_or_rejected_and_every_event_is_counted() {
    let p = params();
    for seed in 1..=3 {
        let trace = small(seed);
        let prefetches = (0..trace.functions.len() as u32)
            .filter(|f| trace.requests.iter().any(|r| r.function == *f))
            .count() as u64;
        for policy in ServingPolicy::ALL {
            for gpus in [1, 3, 8] {
                let r = simulate(&trace, &p, spec(policy, gpus));
                assert_eq!(
                    r.met + r.rejected,
                    r.requests,
                    "{policy} {gpus} seed {seed}"
                );
                // Arrivals + one finish per run + one completion per load +
                // prefetches (the bound's EDF estimate loads nothing).
                let prefetches = if policy == ServingPolicy::Bound {
                    0
                } else {
                    prefetches
                };
                assert_eq!(
                    r.events,
                    r.requests + r.met + r.swaps + r.cold_starts + prefetches,
                    "{policy} {gpus} seed {seed}"
                );
                assert!((0.0..=1.0).contains(&r.attainment()));
                assert!((0.0..=1.0).contains(&r.utilization()));
                assert!(r.p50_us <= r.p99_us);
                if policy == ServingPolicy::Bound {
                    assert_eq!(r.swaps + r.cold_starts + r.swap_outs + r.unloads, 0);
                }
                if matches!(policy, ServingPolicy::Exclusive | ServingPolicy::Static) {
                    assert_eq!(r.remaps + r.swaps + r.swap_outs, 0, "{policy}");
                }
                if policy == ServingPolicy::ExclusiveSwap {
                    assert_eq!(r.remaps, 0, "{policy}");
                }
            }
        }
    }
}

/// Long requests at slack 1.5: whole-GPU mandatory parts overlap.
fn long_requests(seed: u64) -> ServingTrace {
    let mut s = SyntheticSpec::new(30, 1_500, seed);
    s.mean_interarrival_us = 1_000_000;
    let mut t = s.generate();
    for f in &mut t.functions {
        f.profile.saturation_milli = 1000;
    }
    t
}

/// No policy of the simulator reaches the target on fewer GPUs than
/// `bound` (a proven lower bound) on `trace` at `slack`; `what` names the
/// case in a failure.
fn no_policy_reaches_the_target_below(
    trace: &ServingTrace,
    p: &ServingParams,
    slack: f64,
    bound: u32,
    what: &str,
) {
    for gpus in 1..bound {
        for policy in ServingPolicy::ALL {
            let r = simulate(
                trace,
                p,
                RunSpec {
                    slack,
                    ..spec(policy, gpus)
                },
            );
            assert!(
                r.attainment() < TARGET_ATTAINMENT,
                "{what}: {policy} reaches {} on {gpus} GPUs, below the bound {bound}",
                r.attainment()
            );
        }
    }
}

#[test]
fn no_policy_reaches_the_target_below_the_mandatory_part_bound() {
    let p = params();
    let mut binding = 0;
    for seed in 1..=3 {
        let trace = long_requests(seed);
        let (bound, _) = mandatory_min_gpus(&trace, 1.5, TARGET_ATTAINMENT);
        if bound > 1 {
            binding += 1;
        }
        no_policy_reaches_the_target_below(&trace, &p, 1.5, bound, &format!("seed {seed}"));
    }
    assert!(binding > 0, "the traces never make the bound bind");
}

#[test]
fn a_run_is_determined_by_its_seed() {
    let p = params();
    let a = simulate(&small(9), &p, spec(ServingPolicy::Gshare, 2));
    let b = simulate(&small(9), &p, spec(ServingPolicy::Gshare, 2));
    assert_eq!(a, b);
    let c = simulate(&small(10), &p, spec(ServingPolicy::Gshare, 2));
    assert_ne!(a, c);
}

#[test]
fn min_gpus_search_result_passes_and_one_fewer_fails() {
    let p = params();
    let trace = small(5);
    let o = evaluate(
        &trace,
        &p,
        ServingPolicy::Gshare,
        GpuCount::Min { max: 64 },
        4.0,
    );
    let n = o.min_gpus.flatten().expect("gshare serves the small trace");
    assert_eq!(o.report.gpus, n);
    assert!(o.report.attainment() >= 0.99);
    if n > 1 {
        let fewer = simulate(&trace, &p, spec(ServingPolicy::Gshare, n - 1));
        assert!(fewer.attainment() < 0.99);
    }
    assert!(o.events >= o.report.events);
}

/// The Alibaba GenAI trace from `../shared/data` beside the checkout (or
/// beside the worktree's parent).
fn genai_trace(p: &ServingParams) -> ServingTrace {
    let rel = "shared/data/alibaba-genai-serving-v2026/lora_request_trace.csv";
    let dir = env!("CARGO_MANIFEST_DIR");
    let candidates = [
        format!("{dir}/../../{rel}"),
        format!("{dir}/../../../{rel}"),
    ];
    let path = candidates
        .iter()
        .find(|c| std::path::Path::new(c).exists())
        .unwrap_or_else(|| {
            panic!("the Alibaba GenAI trace is required at ../{rel} beside the checkout")
        });
    let text = std::fs::read_to_string(path).expect("readable trace");
    ServingTrace::parse("lora_request_trace.csv", &text, p).unwrap()
}

/// The tables of docs/serving.md on the Alibaba GenAI trace, pinned: the
/// exact `min_gpus` of every policy at slack 1.5, 2 and 4, the proven
/// bound and the EDF estimate; the bound and the estimate are at most
/// every policy's count; gshare needs at most `exclusive-swap`'s GPUs and
/// at most one more than the proven bound.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release-only: run with cargo test --release"
)]
fn genai_trace_tables() {
    use ServingPolicy::*;
    let p = params();
    let trace = genai_trace(&p);
    // (slack, exclusive, exclusive-swap, static, gshare, bound, EDF estimate).
    type Row = (
        f64,
        Option<u32>,
        Option<u32>,
        Option<u32>,
        Option<u32>,
        u32,
        u32,
    );
    let table: [Row; 3] = [
        (1.5, Some(70), Some(6), None, Some(5), 4, 5),
        (2.0, Some(51), Some(5), Some(64), Some(4), 3, 4),
        (4.0, Some(5), Some(4), Some(7), Some(3), 3, 3),
    ];
    for (slack, exclusive, swap, fixed, gshare, bound, edf) in table {
        let policies = [Exclusive, ExclusiveSwap, Static, Gshare, Bound];
        let outcomes: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = policies
                .iter()
                .map(|&policy| {
                    let (trace, p) = (&trace, &p);
                    s.spawn(move || evaluate(trace, p, policy, GpuCount::Min { max: 4096 }, slack))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let min = |i: usize| outcomes[i].min_gpus.flatten();
        assert_eq!(
            [min(0), min(1), min(2), min(3)],
            [exclusive, swap, fixed, gshare],
            "slack {slack}: exclusive, exclusive-swap, static, gshare"
        );
        let (proven, _) = outcomes[4].bound.expect("bound reports its bound");
        assert_eq!((proven, min(4)), (bound, Some(edf)), "slack {slack}: bound");
        for (i, policy) in policies[..4].iter().enumerate() {
            if let Some(n) = min(i) {
                assert!(proven <= n, "slack {slack}: bound {proven} > {policy} {n}");
                assert!(edf <= n, "slack {slack}: EDF estimate {edf} > {policy} {n}");
            }
        }
        assert!(gshare <= swap, "slack {slack}: gshare above exclusive-swap");
        assert!(
            gshare.is_some_and(|g| g <= proven + 1),
            "slack {slack}: gshare above the proven bound + 1"
        );
    }
}

/// The LLM workload: the Azure conversation trace over 50 models (seed 1).
fn llm_trace(p: &ServingParams, models: u32) -> ServingTrace {
    let rel = "shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv";
    let dir = env!("CARGO_MANIFEST_DIR");
    let path = [
        format!("{dir}/../../{rel}"),
        format!("{dir}/../../../{rel}"),
    ]
    .into_iter()
    .find(|c| std::path::Path::new(c).exists())
    .unwrap_or_else(|| panic!("the Azure LLM trace is required at ../{rel} beside the checkout"));
    let text = std::fs::read_to_string(path).expect("readable trace");
    LlmSpec { models, seed: 1 }
        .build("AzureLLMInferenceTrace_conv.csv", &text, p)
        .unwrap()
}

/// One row of the LLM table of docs/serving.md, pinned (M = 50, S = 2; the
/// other rows take minutes on a loaded machine): every policy's exact
/// `min_gpus`, the proven bound and the EDF estimate; the bound is at most
/// every policy's count; gshare needs at most half of `exclusive-swap`'s.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release-only: run with cargo test --release"
)]
fn llm_trace_table_row() {
    use ServingPolicy::*;
    let p = params();
    let trace = llm_trace(&p, 50);
    assert_eq!(trace.functions.len(), 50);
    let policies = [Exclusive, ExclusiveSwap, Static, Gshare, Bound];
    let outcomes: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = policies
            .iter()
            .map(|&policy| {
                let (trace, p) = (&trace, &p);
                s.spawn(move || evaluate(trace, p, policy, GpuCount::Min { max: 4096 }, 2.0))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let min = |i: usize| outcomes[i].min_gpus.flatten();
    assert_eq!(
        [min(0), min(1), min(2), min(3), min(4)],
        [Some(49), Some(48), Some(25), Some(8), Some(8)],
        "exclusive, exclusive-swap, static, gshare, EDF estimate"
    );
    let (proven, _) = outcomes[4].bound.expect("bound reports its bound");
    assert_eq!(proven, 1);
    for (i, policy) in policies[..4].iter().enumerate() {
        let n = min(i).expect("every policy reaches the target");
        assert!(proven <= n, "bound {proven} > {policy} {n}");
    }
    let (gshare, swap) = (min(3).unwrap(), min(1).unwrap());
    assert!(
        2 * gshare <= swap,
        "gshare {gshare} above half of exclusive-swap {swap}"
    );
}

/// gshare's `min_gpus` on every row of the LLM table of docs/serving.md
/// (M = 50 and 200, S = 1.5, 2 and 4), pinned: gshare alone searches all
/// six in seconds. Each is at most half of `exclusive-swap`'s (47 or more
/// at M = 50, 186 or more at M = 200, in the docs' table).
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release-only: run with cargo test --release"
)]
fn llm_trace_gshare_rows() {
    let p = params();
    for (models, pinned) in [(50, [9, 8, 6]), (200, [16, 17, 14])] {
        let trace = llm_trace(&p, models);
        for (slack, want) in [1.5, 2.0, 4.0].into_iter().zip(pinned) {
            let o = evaluate(
                &trace,
                &p,
                ServingPolicy::Gshare,
                GpuCount::Min { max: 4096 },
                slack,
            );
            assert_eq!(o.min_gpus.flatten(), Some(want), "M {models} S {slack}");
        }
    }
}

/// The memory-time bound on the LLM workload (M = 50 and 200, S = 1.5 and
/// 2), pinned as in docs/serving.md: no policy reaches the target on fewer
/// GPUs. The EDF estimate's memory constraint (first-fit decreasing) is
/// pinned too.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release-only: run with cargo test --release"
)]
fn no_policy_reaches_the_target_below_the_memory_time_bound() {
    let p = params();
    let mut binding = 0;
    // (models, FFD GPUs, bound at S = 1.5, bound at S = 2).
    for (models, ffd, b15, b2) in [(50, 5, 2, 1), (200, 13, 2, 2)] {
        let trace = llm_trace(&p, models);
        assert_eq!(ffd_memory_gpus(&trace, p.gpu_memory_mib), ffd, "M {models}");
        for (slack, pinned) in [(1.5, b15), (2.0, b2)] {
            let bound = memory_time_min_gpus(&trace, &p, slack, TARGET_ATTAINMENT);
            assert_eq!(bound, pinned, "M {models} S {slack}");
            if bound > 1 {
                binding += 1;
            }
            let what = format!("M {models} S {slack}");
            no_policy_reaches_the_target_below(&trace, &p, slack, bound, &what);
        }
    }
    assert!(binding > 0, "the memory-time bound never binds");
}

/// The compute-time bound on the LLM workload (M = 50 and 200; S = 1.5,
/// where mandatory parts exist), pinned as in docs/serving.md: it is the
/// proven bound there, and no policy reaches the target on fewer GPUs, so
/// it is at most every policy's `min_gpus`. At S = 2 it is the trivial 1.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release-only: run with cargo test --release"
)]
fn no_policy_reaches_the_target_below_the_compute_time_bound() {
    let p = params();
    for models in [50, 200] {
        let trace = llm_trace(&p, models);
        assert_eq!(compute_time_min_gpus(&trace, 2.0, TARGET_ATTAINMENT), 1);
        let bound = compute_time_min_gpus(&trace, 1.5, TARGET_ATTAINMENT);
        assert_eq!(bound, 3, "M {models}");
        assert_eq!(
            proven_min_gpus(&trace, &p, 1.5, TARGET_ATTAINMENT),
            (3, BoundKind::ComputeTime),
            "M {models}"
        );
        no_policy_reaches_the_target_below(&trace, &p, 1.5, bound, &format!("M {models}"));
    }
}

/// The demand bound on the GenAI trace (S = 2 and 4, where no mandatory
/// part exists), pinned as in docs/serving.md: 3 GPUs, and no policy
/// reaches the target on fewer. On the LLM workload the bound is the
/// trivial 1: a batch joiner may take no compute of its own.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release-only: run with cargo test --release"
)]
fn no_policy_reaches_the_target_below_the_demand_bound() {
    let p = params();
    let trace = genai_trace(&p);
    assert_eq!(demand_min_gpus(&trace, 1.5, TARGET_ATTAINMENT), 3);
    for slack in [2.0, 4.0] {
        let bound = demand_min_gpus(&trace, slack, TARGET_ATTAINMENT);
        assert_eq!(bound, 3, "S {slack}");
        assert_eq!(
            proven_min_gpus(&trace, &p, slack, TARGET_ATTAINMENT),
            (3, BoundKind::Demand),
            "S {slack}"
        );
        no_policy_reaches_the_target_below(&trace, &p, slack, bound, &format!("S {slack}"));
    }
    assert_eq!(
        demand_min_gpus(&llm_trace(&p, 50), 1.5, TARGET_ATTAINMENT),
        1
    );
}
