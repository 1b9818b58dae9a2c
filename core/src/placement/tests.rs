//! Unit tests for placement: feasibility and failure reasons, binding and
//! remapping, the baselines' choices on small clusters, remap planning, and
//! trace parsing.

use super::policies::{BestFit, Fgd, Gshare, Packing};
use super::*;
use crate::rng::Rng;

fn models() -> GpuModels {
    let mut m = GpuModels::default();
    m.intern("A");
    m.intern("B");
    m
}

fn node(name: &str, cpu: u32, mem: u64, gpus: u8, model: u8) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        cpu_milli: cpu,
        memory_mib: mem,
        gpus,
        model: Some(model),
    }
}

fn pod(cpu: u32, mem: u64, num: u8, milli: u16) -> PodRequest {
    PodRequest {
        name: "p".into(),
        cpu_milli: cpu,
        memory_mib: mem,
        num_gpu: num,
        gpu_milli: milli,
        gpu_spec: GpuSpec::ANY,
    }
}

fn cluster(specs: Vec<NodeSpec>) -> Cluster {
    let n = specs.len() as u32;
    let mut c = Cluster::new(specs, models());
    c.set_tie_ranks(&(0..n).collect::<Vec<_>>());
    c
}

#[test]
fn fit_names_the_dimension_that_ran_out() {
    let mut c = cluster(vec![node("n0", 8000, 1000, 2, 0)]);
    let n = &c.nodes()[0];
    let mut spec_b = pod(1000, 10, 1, 500);
    spec_b.gpu_spec = GpuSpec::only(&[1]);
    assert_eq!(
        feasibility::fit(n, &spec_b),
        Err(ResourceDimension::GpuModel)
    );
    assert_eq!(
        feasibility::fit(n, &pod(9000, 10, 0, 0)),
        Err(ResourceDimension::Cpu)
    );
    assert_eq!(
        feasibility::fit(n, &pod(1000, 2000, 0, 0)),
        Err(ResourceDimension::Memory)
    );
    assert_eq!(
        feasibility::fit(n, &pod(1000, 10, 4, 1000)),
        Err(ResourceDimension::GpuCount)
    );
    c.bind(1, &pod(100, 1, 1, 600), 0, GpuSet::one(0));
    c.bind(2, &pod(100, 1, 1, 600), 0, GpuSet::one(1));
    let n = &c.nodes()[0];
    assert_eq!(
        feasibility::fit(n, &pod(100, 1, 1, 500)),
        Err(ResourceDimension::GpuMilli)
    );
    assert_eq!(feasibility::fit(n, &pod(100, 1, 1, 400)), Ok(()));
    assert_eq!(
        feasibility::fit(n, &pod(100, 1, 1, 1000)),
        Err(ResourceDimension::GpuCount)
    );
}

#[test]
fn failure_metric_counts_nodes_per_dimension() {
    let c = cluster(vec![
        node("n0", 1000, 1000, 1, 0),
        node("n1", 64000, 1000, 1, 1),
        node("n2", 64000, 1000, 1, 0),
    ]);
    let mut p = pod(2000, 2000, 1, 1000);
    p.gpu_spec = GpuSpec::only(&[0]);
    let err = BestFit.place(&c, &p, &mut Rng::new(1)).unwrap_err();
    let m = err.metric;
    assert_eq!(m.nodes_evaluated, 3);
    assert_eq!(m.nodes_fit, 0);
    assert_eq!(m.filtered_by(ResourceDimension::Cpu), 1);
    assert_eq!(m.filtered_by(ResourceDimension::GpuModel), 1);
    assert_eq!(m.filtered_by(ResourceDimension::Memory), 1);
    let text = err.to_string();
    assert!(
        text.contains("1 lacked cpu") && text.contains("1 lacked memory"),
        "{text}"
    );
}

#[test]
fn bind_and_remap_keep_the_books() {
    let mut c = cluster(vec![node("n0", 8000, 1000, 2, 0)]);
    c.bind(7, &pod(1000, 100, 1, 300), 0, GpuSet::one(0));
    c.bind(8, &pod(1000, 100, 1, 500), 0, GpuSet::one(1));
    assert_eq!(c.used_milli(), 800);
    assert_eq!(c.nodes()[0].gpu_left(), &[700, 500]);
    assert_eq!(c.nodes()[0].cpu_left(), 6000);
    let ep = c.nodes()[0].epoch();
    // Moving 7 onto GPU 1 frees GPU 0 whole.
    assert!(c.remap(
        0,
        &[Remap {
            task: 7,
            from: 0,
            to: 1
        }]
    ));
    assert_eq!(c.nodes()[0].gpu_left(), &[1000, 200]);
    assert!(c.nodes()[0].epoch() > ep);
    assert_eq!(c.used_milli(), 800);
    // A task that is not there, or a layout over 1000 milli, changes nothing.
    assert!(!c.remap(
        0,
        &[Remap {
            task: 9,
            from: 0,
            to: 1
        }]
    ));
    c.bind(9, &pod(100, 1, 1, 900), 0, GpuSet::one(0));
    assert!(!c.remap(
        0,
        &[Remap {
            task: 9,
            from: 0,
            to: 1
        }]
    ));
    assert_eq!(c.nodes()[0].gpu_left(), &[100, 200]);
}

#[test]
fn bestfit_prefers_the_fuller_node_and_the_tighter_gpu() {
    let mut c = cluster(vec![
        node("n0", 64000, 1 << 20, 2, 0),
        node("n1", 64000, 1 << 20, 2, 0),
    ]);
    c.bind(1, &pod(1000, 1, 1, 300), 1, GpuSet::one(1));
    let p = BestFit
        .place(&c, &pod(1000, 1, 1, 500), &mut Rng::new(3))
        .unwrap();
    assert_eq!(p.node, 1);
    assert_eq!(p.gpus, GpuSet::one(1));
}

#[test]
fn packing_prefers_a_partly_used_gpu_over_idle_ones() {
    let mut c = cluster(vec![
        node("n0", 64000, 1 << 20, 8, 0),
        node("n1", 64000, 1 << 20, 8, 0),
    ]);
    c.bind(1, &pod(1000, 1, 1, 200), 1, GpuSet::one(5));
    let p = Packing
        .place(&c, &pod(1000, 1, 1, 500), &mut Rng::new(3))
        .unwrap();
    assert_eq!((p.node, p.gpus), (1, GpuSet::one(5)));
}

#[test]
fn fgd_fills_the_gpu_that_keeps_fragmentation_lowest() {
    // Typical tasks: half 500-milli, half whole GPUs.
    let typical = vec![pod(1000, 1, 1, 500), pod(1000, 1, 1, 1000)];
    let frag = FragModel::from_pods(&typical);
    assert_eq!(frag.typical().len(), 2);
    assert!((frag.typical().iter().map(|t| t.freq).sum::<f64>() - 1.0).abs() < 1e-9);
    let mut c = cluster(vec![node("n0", 64000, 1 << 20, 2, 0)]);
    c.bind(1, &pod(1000, 1, 1, 500), 0, GpuSet::one(1));
    // A 500 task on GPU 1 leaves GPU 0 whole (no fragment); on GPU 0 it would
    // leave two 500 halves, useless to whole-GPU tasks.
    let p = Fgd::new(frag.clone())
        .place(&c, &pod(1000, 1, 1, 500), &mut Rng::new(1))
        .unwrap();
    assert_eq!(p.gpus, GpuSet::one(1));
    assert_eq!(frag.node_frag(64000, Some(0), &[1000, 500]), 0.5 * 500.0);
}

#[test]
fn gshare_remaps_only_when_the_task_fits_nowhere() {
    let frag = FragModel::from_pods(&[pod(1000, 1, 1, 400), pod(1000, 1, 1, 1000)]);
    let mut c = cluster(vec![node("n0", 64000, 1 << 20, 2, 0)]);
    c.bind(1, &pod(1000, 1, 1, 400), 0, GpuSet::one(0));
    c.bind(2, &pod(1000, 1, 1, 400), 0, GpuSet::one(1));
    let whole = pod(1000, 1, 1, 1000);
    // Without remap it fails on GPU count; with remap task 1 or 2 moves.
    let err = Gshare::new(frag.clone(), false)
        .place(&c, &whole, &mut Rng::new(1))
        .unwrap_err();
    assert_eq!(err.metric.exhausted(), Some(ResourceDimension::GpuCount));
    let plan = Gshare::new(frag.clone(), true)
        .place(&c, &whole, &mut Rng::new(1))
        .unwrap();
    assert_eq!(plan.remaps.len(), 1);
    assert!(c.remap(plan.node, &plan.remaps));
    assert_eq!(feasibility::gpu_fit(&c.nodes()[0], &whole), Ok(()));
    assert_eq!(
        c.nodes()[0].gpu_left()[plan.gpus.iter().next().unwrap()],
        1000
    );
    // A task that fits as is never triggers a remap.
    let small = pod(1000, 1, 1, 200);
    let plan = Gshare::new(frag, true)
        .place(&c, &small, &mut Rng::new(1))
        .unwrap();
    assert!(plan.remaps.is_empty());
}

#[test]
fn gshare_keeps_holes_that_common_sizes_can_still_fill() {
    // Common sizes 470 and 320: a 530 hole beside a 470 takes another 470
    // (60 left); a 320 there would leave 210, which nothing common fills.
    let mut pods = vec![pod(1000, 1, 1, 470); 5];
    pods.extend(vec![pod(1000, 1, 1, 320); 5]);
    // Half the demand is whole GPUs, so FGD's fragmentation alone would
    // keep GPU 1 whole and put the 320 beside the 470.
    pods.extend(vec![pod(1000, 1, 1, 1000); 10]);
    let frag = FragModel::from_pods(&pods);
    let mut c = cluster(vec![node("n0", 64000, 1 << 20, 2, 0)]);
    c.bind(1, &pod(1000, 1, 1, 470), 0, GpuSet::one(0));
    let p = Fgd::new(frag.clone())
        .place(&c, &pod(1000, 1, 1, 320), &mut Rng::new(1))
        .unwrap();
    assert_eq!(p.gpus, GpuSet::one(0));
    let mut g = Gshare::new(frag, false);
    let p = g
        .place(&c, &pod(1000, 1, 1, 320), &mut Rng::new(1))
        .unwrap();
    assert_eq!(p.gpus, GpuSet::one(1));
    let p = g
        .place(&c, &pod(1000, 1, 1, 470), &mut Rng::new(1))
        .unwrap();
    assert_eq!(p.gpus, GpuSet::one(0));
}

#[test]
fn gshare_repacks_a_node_to_fit_a_large_sharing_task() {
    let frag = FragModel::from_pods(&[pod(1000, 1, 1, 300)]);
    let mut c = cluster(vec![node("n0", 64000, 1 << 20, 2, 0)]);
    c.bind(1, &pod(1000, 1, 1, 600), 0, GpuSet::one(0));
    c.bind(2, &pod(1000, 1, 1, 300), 0, GpuSet::one(1));
    let big = pod(1000, 1, 1, 800);
    let plan = Gshare::new(frag, true)
        .place(&c, &big, &mut Rng::new(1))
        .unwrap();
    // One move suffices: put the 300 task beside the 600 one, or vice versa.
    assert_eq!(plan.remaps.len(), 1);
    assert!(c.remap(0, &plan.remaps));
    let g = plan.gpus.iter().next().unwrap();
    assert_eq!(c.nodes()[0].gpu_left()[g], 1000);
    c.bind(3, &big, 0, plan.gpus);
    let mut left = c.nodes()[0].gpu_left().to_vec();
    left.sort();
    assert_eq!(left, vec![100, 200]);
}

#[test]
fn every_policy_is_deterministic_per_seed() {
    let mut specs = Vec::new();
    for i in 0..12 {
        specs.push(node(
            &format!("n{i}"),
            32000,
            1 << 18,
            1 + (i % 4) as u8,
            (i % 2) as u8,
        ));
    }
    let pods: Vec<PodRequest> = (0..60)
        .map(|i| {
            pod(
                1000 + 500 * (i % 5),
                1024,
                (i % 3) as u8,
                [0, 300, 1000][(i % 3) as usize],
            )
        })
        .map(|mut p| {
            if p.num_gpu == 0 {
                p.gpu_milli = 0;
            }
            p
        })
        .collect();
    let frag = FragModel::from_pods(&pods);
    for name in POLICY_NAMES {
        let run = |seed| {
            let mut c = cluster(specs.clone());
            let mut pol = policy_by_name(name, &frag).unwrap();
            let mut rng = Rng::new(seed);
            let mut out = Vec::new();
            for (t, p) in pods.iter().enumerate() {
                match pol.place(&c, p, &mut rng) {
                    Ok(pl) => {
                        assert!(c.remap(pl.node, &pl.remaps));
                        assert_eq!(feasibility::fit(&c.nodes()[pl.node], p), Ok(()), "{name}");
                        c.bind(t as u32, p, pl.node, pl.gpus);
                        out.push(Some((pl.node, pl.gpus)));
                    }
                    Err(_) => out.push(None),
                }
            }
            out
        };
        assert_eq!(run(5), run(5), "{name}");
    }
    assert!(policy_by_name("nope", &frag).is_err());
    assert_eq!(canonical_policy_name("06-FGD"), Ok("fgd"));
}

#[test]
fn csv_columns_by_header_and_optional_columns_missing() {
    let mut m = GpuModels::default();
    let nodes = parse_node_csv(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,32000,1024,0,\n",
        &mut m,
    )
    .unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[0].model, m.id("P100"));
    assert_eq!(nodes[1].model, None);
    // The multigpu lists have only five columns: no gpu_spec.
    let pods = parse_pod_csv("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,12000,16384,8,1000\np1,6000,12288,1,460\np2,1000,10,0,0\n", &m).unwrap();
    assert_eq!((pods[0].num_gpu, pods[0].gpu_milli), (8, 1000));
    assert!(pods[1].is_fractional() && pods[1].gpu_spec.is_any());
    assert!(!pods[2].wants_gpu());
    // Reordered columns and a GPU-model constraint.
    let pods = parse_pod_csv(
        "gpu_spec,name,num_gpu,cpu_milli,memory_mib,gpu_milli\nP100|V100,p0,1,1000,1,1000\n",
        &m,
    )
    .unwrap();
    assert!(pods[0].gpu_spec.admits(m.id("P100")));
    assert!(!pods[0].gpu_spec.admits(None));
    let err = parse_pod_csv("name,cpu_milli,num_gpu\np0,1,0\n", &m).unwrap_err();
    assert!(
        matches!(
            err,
            TraceError::MissingColumn {
                column: "memory_mib",
                ..
            }
        ),
        "{err}"
    );
    let err = parse_pod_csv(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,x,1,0,0\n",
        &m,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            TraceError::BadValue {
                line: 2,
                column: "cpu_milli",
                ..
            }
        ),
        "{err}"
    );
    assert!(parse_pod_csv(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,2,500\n",
        &m
    )
    .is_err());
}

#[test]
fn gshare_puts_cpu_only_tasks_beside_taken_gpus() {
    // n0 has more CPU per idle GPU, but its GPUs are still free; n1's
    // GPU is taken, so no GPU task needs its CPU.
    let frag = FragModel::from_pods(&[pod(4000, 1, 1, 1000), pod(2000, 1, 0, 0)]);
    let mut c = cluster(vec![
        node("n0", 64000, 1 << 20, 1, 0),
        node("n1", 8000, 1 << 20, 1, 0),
    ]);
    c.bind(1, &pod(4000, 1, 1, 1000), 1, GpuSet::one(0));
    let p = Gshare::new(frag, true)
        .place(&c, &pod(2000, 1, 0, 0), &mut Rng::new(1))
        .unwrap();
    assert_eq!(p.node, 1);
}

#[test]
fn gshare_keeps_unconstrained_tasks_off_a_model_constrained_tasks_oversubscribe() {
    // Half the typical GPU demand must run on model B, which is a quarter
    // of the GPUs: an unconstrained task goes to A while A has room, even
    // where the tie order (and everything else, the nodes being alike)
    // would pick B.
    let mut pods = vec![pod(1000, 1, 1, 1000); 2];
    let mut on_b = pod(1000, 1, 1, 1000);
    on_b.gpu_spec = GpuSpec::only(&[1]);
    pods.extend(vec![on_b.clone(); 2]);
    let frag = FragModel::from_pods(&pods);
    let specs = vec![
        node("b0", 16000, 1 << 20, 1, 1),
        node("a0", 16000, 1 << 20, 1, 0),
        node("a1", 16000, 1 << 20, 1, 0),
        node("a2", 16000, 1 << 20, 1, 0),
    ];
    let mut c = cluster(specs);
    // B is the model the rule names (A's constrained share is 0).
    assert_eq!(super::policies::oversubscribed_models(&frag, &c), 1 << 1);
    // At half of the GPUs B's half of the demand no longer oversubscribes it.
    let even = cluster(vec![
        node("b0", 16000, 1 << 20, 1, 1),
        node("a0", 16000, 1 << 20, 1, 0),
    ]);
    assert_eq!(super::policies::oversubscribed_models(&frag, &even), 0);
    let mut g = Gshare::new(frag.clone(), true);
    let p = g
        .place(&c, &pod(1000, 1, 1, 1000), &mut Rng::new(1))
        .unwrap();
    assert_ne!(p.node, 0);
    // The constrained one still goes to B.
    let p = g.place(&c, &on_b, &mut Rng::new(1)).unwrap();
    assert_eq!(p.node, 0);
    // When A is full the unconstrained task still takes B.
    for n in 1..4 {
        c.bind(n as TaskId, &pod(1000, 1, 1, 1000), n, GpuSet::one(0));
    }
    let p = Gshare::new(frag, true)
        .place(&c, &pod(1000, 1, 1, 1000), &mut Rng::new(1))
        .unwrap();
    assert_eq!(p.node, 0);
}
