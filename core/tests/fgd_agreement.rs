//! The live planner (`state::plan` with `FragmentationAware`, full scan and
//! indexed) and the trace simulator's FGD (`placement::policies::Fgd`) on
//! the same state: the same GPUs, the same sharing tasks already on them,
//! the same typical shapes, the same request. Where the two FGD rules agree
//! they must choose the same GPU; where their rules differ (how equal FGD
//! scores are broken, FGD's integer sigmoid buckets, whole GPUs) the cases below pin
//! what each one does, so that making them one FGD shows up here. A seeded
//! sweep of random states checks that every difference is a tie in the
//! simulator's own score.
//!
//! The simulator has no GPU memory, so every task here asks for 64 MiB of
//! a 16 GiB GPU (memory never binds), and its node has CPU to spare.

use gshare_core::config::Topology;
use gshare_core::placement::policies::Fgd;
use gshare_core::placement::{
    Cluster, FragModel, GpuModels, GpuSet, GpuSpec, NodeSpec, PlacementPolicy, PodRequest,
};
use gshare_core::rng::Rng;
use gshare_core::state::{
    plan_spec_with, DomainCommand, FragmentationAware, PlanOptions, RegionState,
};
use gshare_core::{
    FunctionSpec, GpuId, LatencyProfile, NodeId, PoolKind, PoolPreference, Quota, Runtime, Slice,
    TenantId, Tier,
};
use std::collections::BTreeMap;

/// GPU memory every task asks for (MiB).
const MEM: u64 = 64;

/// One case: milli-GPU already taken per GPU of each node (sharing tasks of
/// those sizes), the typical shapes (milli, weight), the request (milli).
struct Case {
    name: &'static str,
    nodes: Vec<Vec<Vec<u32>>>,
    shapes: Vec<(u32, u64)>,
    request: u32,
}

/// A function asking for `compute_milli` of one GPU: a whole GPU is an
/// exclusive instance, anything less a guaranteed slice.
fn spec(name: &str, compute_milli: u32) -> FunctionSpec {
    FunctionSpec {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        tenant: TenantId("t".into()),
        name: name.into(),
        runtime: Runtime::Vllm,
        memory_mib: MEM,
        compute_milli,
        tier: if compute_milli >= 1_000 {
            Tier::Exclusive
        } else {
            Tier::Guaranteed
        },
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

/// The region: node `n<i>` with as many 16 GiB GPUs as `case.nodes[i]`,
/// each GPU holding one function per taken size.
fn region(case: &Case) -> RegionState {
    let mut t = String::from(
        "[[gpu_models]]\nname = \"g16\"\nmemory_mib = 16_384\nh2d_mib_per_s = 20_000\n\
         [cold_start]\nsetup_us = 1\nstorage_mib_per_s = 1000\n[swap]\nsetup_us = 1\n\
         [[pools]]\nname = \"dc\"\nkind = \"center\"\n",
    );
    for (i, gpus) in case.nodes.iter().enumerate() {
        t += &format!(
            "[[pools.nodes]]\nname = \"n{i}\"\ncpu_milli = 64_000\nmemory_mib = 512_000\n\
             swap_mib = 0\ngpus = [{{ model = \"g16\", count = {} }}]\n",
            gpus.len()
        );
    }
    t += "[pricing]\ncurrency = \"USD\"\nunit = \"micro-USD\"\nunits_per_currency = 1_000_000\n\
          [pricing.tiers]\nexclusive = { discount_bp = 0 }\nguaranteed = { discount_bp = 0 }\n\
          burstable = { discount_bp = 0 }\noversubscribed = { discount_bp = 0 }\n\
          [[pricing.prices]]\ngpu_model = \"g16\"\npool_kind = \"center\"\ngpu_hour = 1\nmemory_gib_hour = 1\n";
    let topology = Topology::from_toml("agreement.toml", &t).unwrap_or_else(|e| panic!("{e}"));
    let mut s = RegionState::default();
    s.apply(DomainCommand::TopologyLoad { topology }, 0)
        .unwrap();
    let all = Quota {
        compute_milli: gshare_core::bounds::MAX_QUOTA,
        memory_mib: gshare_core::bounds::MAX_QUOTA,
        instances: 1_000,
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
    let mut k = 0;
    for (i, gpus) in case.nodes.iter().enumerate() {
        for (g, taken) in gpus.iter().enumerate() {
            for &c in taken {
                let slice = Slice {
                    gpu: GpuId {
                        node: NodeId(format!("n{i}")),
                        index: g as u32,
                    },
                    compute_milli: c,
                    memory_mib: MEM,
                };
                s.apply(
                    DomainCommand::FunctionCreate {
                        spec: spec(&format!("pre{k}"), c),
                        placements: vec![vec![slice]],
                    },
                    0,
                )
                .unwrap_or_else(|e| panic!("{}: pre-allocation: {e}", case.name));
                k += 1;
            }
        }
    }
    s
}

fn pod(milli: u32) -> PodRequest {
    PodRequest {
        name: format!("p{milli}"),
        cpu_milli: 100,
        memory_mib: 0,
        num_gpu: 1,
        gpu_milli: u16::try_from(milli).expect("milli fits"),
        gpu_spec: GpuSpec::ANY,
    }
}

/// The same region as a simulator cluster, with the same tasks bound.
fn cluster(case: &Case) -> Cluster {
    let mut models = GpuModels::default();
    let model = models.intern("g16");
    let specs = case
        .nodes
        .iter()
        .enumerate()
        .map(|(i, gpus)| NodeSpec {
            name: format!("n{i}"),
            cpu_milli: 64_000,
            memory_mib: 512_000,
            gpus: u8::try_from(gpus.len()).expect("gpus fit"),
            model,
        })
        .collect();
    let mut c = Cluster::new(specs, models);
    let mut id = 0;
    for (i, gpus) in case.nodes.iter().enumerate() {
        for (g, taken) in gpus.iter().enumerate() {
            for &m in taken {
                c.bind(id, &pod(m), i, GpuSet::one(g));
                id += 1;
            }
        }
    }
    c
}

/// (node, GPU) the live planner picks, full scan and indexed.
fn live(case: &Case) -> [(String, u32); 2] {
    let s = region(case);
    let frag = FragmentationAware::from_shapes(case.shapes.iter().map(|&(c, w)| (c, MEM, w)));
    [PlanOptions::default(), PlanOptions::indexed()].map(|o| {
        let p = plan_spec_with(&s, &spec("req", case.request), &frag, &o)
            .unwrap_or_else(|r| panic!("{}: live planner: {r}", case.name));
        assert_eq!(p.slices.len(), 1);
        (p.slices[0].gpu.node.0.clone(), p.slices[0].gpu.index)
    })
}

/// (node, GPU) the simulator's FGD picks.
fn simulated(case: &Case) -> (String, u32) {
    let c = cluster(case);
    // The typical pods are the shapes, as many of each as its weight; every
    // shape must be kept (the model keeps the most popular 95 %).
    let pods: Vec<PodRequest> = case
        .shapes
        .iter()
        .flat_map(|&(m, w)| (0..w).map(move |_| pod(m)))
        .collect();
    let model = FragModel::from_pods(&pods);
    assert_eq!(
        model.typical().len(),
        case.shapes.len(),
        "{}: every shape typical",
        case.name
    );
    let p = Fgd::new(model)
        .place(&c, &pod(case.request), &mut Rng::new(42))
        .unwrap_or_else(|e| panic!("{}: simulator: {e:?}", case.name));
    let gpus: Vec<usize> = p.gpus.iter().collect();
    assert_eq!(gpus.len(), 1, "{}: one GPU", case.name);
    (format!("n{}", p.node), gpus[0] as u32)
}

#[test]
fn live_planner_and_simulator_choose_the_same_gpu_where_the_fgd_rules_agree() {
    let cases = [
        Case {
            // An exact fill removes a hole no typical shape fits: both take it.
            name: "exact fill of a small hole",
            nodes: vec![vec![vec![], vec![300], vec![600], vec![800]]],
            shapes: vec![(500, 1), (250, 1)],
            request: 200,
        },
        Case {
            // Shrinking the smallest hole cuts fragmentation most.
            name: "shrink the smallest hole",
            nodes: vec![vec![vec![], vec![300], vec![600], vec![800]]],
            shapes: vec![(500, 1), (250, 1)],
            request: 100,
        },
        Case {
            // Cutting 650 to 550 makes the 600 shape stop fitting there:
            // both avoid it and take the empty GPU.
            name: "avoid breaking a hole a shape still fits",
            nodes: vec![vec![vec![], vec![350]]],
            shapes: vec![(600, 9), (250, 1)],
            request: 100,
        },
        Case {
            // Across nodes: the exact fill is on the second node.
            name: "exact fill on another node",
            nodes: vec![vec![vec![], vec![500]], vec![vec![200, 500], vec![]]],
            shapes: vec![(500, 3), (250, 1)],
            request: 300,
        },
    ];
    let mut differ = Vec::new();
    for case in &cases {
        let [full, indexed] = live(case);
        let sim = simulated(case);
        eprintln!(
            "{}: live {full:?} (indexed {indexed:?}), simulator {sim:?}",
            case.name
        );
        assert_eq!(
            indexed, full,
            "{}: the index picks what the scan picks",
            case.name
        );
        if full != sim {
            differ.push(format!("{}: live {full:?}, simulator {sim:?}", case.name));
        }
    }
    assert!(differ.is_empty(), "the two FGDs differ: {differ:#?}");
}

#[test]
fn where_the_rules_differ_each_side_does_what_its_rule_says() {
    // Two GPUs left at 1000 and 600; a 100 request leaves every typical
    // shape fitting on both, so FGD's fragmentation grows by 0 either way.
    // The simulator's FGD (the paper's) takes the lowest GPU index among
    // equal scores; the live ranking breaks the tie by best fit (least
    // compute and memory left over).
    let tie = Case {
        name: "equal FGD scores",
        nodes: vec![vec![vec![], vec![400]]],
        shapes: vec![(250, 1), (100, 1)],
        request: 100,
    };
    let [full, indexed] = live(&tie);
    assert_eq!(full, indexed);
    assert_eq!(full, ("n0".to_string(), 1), "live: best fit among equals");
    assert_eq!(
        simulated(&tie),
        ("n0".to_string(), 0),
        "simulator: lowest index"
    );

    // The simulator scores a node ⌊100 × sigmoid(Δ/1000)⌋ (Δ: the fall of
    // its fragmentation), so a gain of up to 40 milli lands in the same
    // bucket (50) as no gain; the live ranking counts every milli. GPU 0 is
    // empty, GPU 1 has a 130 hole no shape fits: a 10 request there shrinks
    // that hole by 10 (live: growth −10, the better GPU), while the
    // simulator sees 50 on both GPUs and takes the lowest index.
    let bucket = Case {
        name: "gain below one sigmoid bucket",
        nodes: vec![vec![vec![], vec![870]]],
        shapes: vec![(250, 9), (200, 1)],
        request: 10,
    };
    let [full, indexed] = live(&bucket);
    assert_eq!(full, indexed);
    assert_eq!(
        full,
        ("n0".to_string(), 1),
        "live: every milli of gain counts"
    );
    assert_eq!(
        simulated(&bucket),
        ("n0".to_string(), 0),
        "simulator: same bucket, lowest index"
    );

    // A whole GPU: the live ranking keeps whole nodes whole (the node left
    // with the fewest empty GPUs); the simulator's FGD scores the node's
    // fragmentation, which taking an empty GPU next to two holes every
    // shape still fits leaves at 0 on both nodes: a tie, the first node.
    let whole = Case {
        name: "a whole GPU",
        nodes: vec![vec![vec![], vec![]], vec![vec![], vec![500]]],
        shapes: vec![(500, 1), (250, 1)],
        request: 1_000,
    };
    let [full, indexed] = live(&whole);
    assert_eq!(full, indexed);
    assert_eq!(full, ("n1".to_string(), 0), "live: keep whole nodes whole");
    assert_eq!(
        simulated(&whole),
        ("n0".to_string(), 0),
        "simulator: equal scores, first node"
    );
}

/// The simulator's score of a sharing `request` on GPU `g` of a node whose
/// GPUs have `left` milli free (its node score when it takes that GPU).
fn simulator_score(model: &FragModel, left: &[u16], g: usize, request: u16) -> i64 {
    let before = model.node_frag(64_000, Some(0), left);
    let mut after = left.to_vec();
    after[g] -= request;
    let after = model.node_frag(64_000 - 100, Some(0), &after);
    (100.0 / (1.0 + (-(before - after) / 1000.0).exp())) as i64
}

#[test]
fn on_random_states_every_difference_is_a_tie_in_the_simulators_score() {
    // Seeded random states of 1–3 nodes × 1–4 GPUs with sharing tasks on
    // them, 2–3 typical shapes, one sharing request. With single-GPU
    // shapes, CPU to spare and memory never binding, the simulator's node
    // fragmentation is the sum of its GPUs' (the live ranking's measure),
    // so where the two pick differently the simulator must score both
    // choices alike: the difference is its buckets and tie-break, not the
    // fragmentation they measure.
    const SIZES: [u32; 8] = [50, 100, 150, 200, 250, 300, 400, 500];
    let (mut same, mut tied) = (0, 0);
    for seed in 0..300u64 {
        let mut rng = Rng::new(seed);
        let mut pick = |n: u64| rng.below(n) as usize;
        let nodes: Vec<Vec<Vec<u32>>> = (0..1 + pick(3))
            .map(|_| {
                (0..1 + pick(4))
                    .map(|_| {
                        let mut taken = Vec::new();
                        let mut used = 0;
                        for _ in 0..pick(4) {
                            let c = SIZES[pick(SIZES.len() as u64)];
                            if used + c <= 1_000 {
                                taken.push(c);
                                used += c;
                            }
                        }
                        taken
                    })
                    .collect()
            })
            .collect();
        let mut shapes: Vec<(u32, u64)> = Vec::new();
        for _ in 0..2 + pick(2) {
            let c = SIZES[pick(SIZES.len() as u64)];
            if shapes.iter().all(|s| s.0 != c) {
                shapes.push((c, 1 + pick(5) as u64));
            }
        }
        let request = SIZES[pick(SIZES.len() as u64)];
        let left: Vec<Vec<u16>> = nodes
            .iter()
            .map(|n| {
                n.iter()
                    .map(|t| 1_000 - t.iter().sum::<u32>() as u16)
                    .collect()
            })
            .collect();
        if !left.iter().flatten().any(|&l| u32::from(l) >= request) {
            continue;
        }
        let case = Case {
            name: "random",
            nodes,
            shapes,
            request,
        };
        let [full, indexed] = live(&case);
        assert_eq!(
            full, indexed,
            "seed {seed}: the index picks what the scan picks"
        );
        let sim = simulated(&case);
        if full == sim {
            same += 1;
            continue;
        }
        let pods: Vec<PodRequest> = case
            .shapes
            .iter()
            .flat_map(|&(m, w)| (0..w).map(move |_| pod(m)))
            .collect();
        let model = FragModel::from_pods(&pods);
        let node = |name: &str| name[1..].parse::<usize>().expect("node index");
        let r = u16::try_from(request).expect("request fits");
        let score =
            |(n, g): &(String, u32)| simulator_score(&model, &left[node(n)], *g as usize, r);
        assert_eq!(
            score(&full),
            score(&sim),
            "seed {seed}: live {full:?} and simulator {sim:?} differ by more than a tie \
             (left {left:?}, shapes {:?}, request {request})",
            case.shapes
        );
        tied += 1;
    }
    eprintln!("{same} states: the same GPU; {tied}: different GPUs the simulator scores alike");
    assert!(same > 100, "too few comparable states ({same})");
}
