use super::*;
use crate::placement::{parse_node_csv, parse_pod_csv, GpuModels};
use crate::sim::synthetic::default_workload;

/// The openb default trace from `../shared/data` beside the checkout, if present.
fn openb_default() -> Option<(Vec<NodeSpec>, Vec<PodRequest>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let csv = ["../../shared/data", "../../../shared/data"]
        .iter()
        .map(|r| dir.join(r).join("alibaba-gpu-v2023/csv"))
        .find(|d| d.join("openb_pod_list_default.csv").is_file())?;
    let mut models = GpuModels::default();
    let nodes = std::fs::read_to_string(csv.join("openb_node_list_gpu_node.csv")).ok()?;
    let nodes = parse_node_csv(&nodes, &mut models).ok()?;
    let pods = std::fs::read_to_string(csv.join("openb_pod_list_default.csv")).ok()?;
    Some((nodes, parse_pod_csv(&pods, &models).ok()?))
}

fn workloads() -> Vec<(&'static str, Vec<NodeSpec>, Vec<PodRequest>)> {
    let synth = default_workload(2023);
    let mut out = vec![("synthetic", synth.nodes, synth.pods)];
    match openb_default() {
        Some((n, p)) => out.push(("openb default", n, p)),
        None => eprintln!(
            "openb default trace not under ../shared/data: checking the synthetic workload only"
        ),
    }
    out
}

fn by_name(mut pods: Vec<PodRequest>) -> Vec<PodRequest> {
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    pods
}

#[test]
fn every_grid_point_hits_its_target_share_and_keeps_the_rest() {
    for (what, nodes, pods) in workloads() {
        let src = mix(&pods);
        let max_cpu = pods
            .iter()
            .map(|p| u64::from(p.cpu_milli))
            .filter(|_| true)
            .max()
            .unwrap_or(0);
        let gpu_tasks = pods.iter().filter(|p| p.wants_gpu()).count();
        for v in Variant::grid() {
            let out = derive(&pods, &nodes, &v, 7).unwrap_or_else(|e| panic!("{what} {v}: {e}"));
            let m = mix(&out);
            let names: std::collections::HashSet<&str> =
                out.iter().map(|p| p.name.as_str()).collect();
            assert_eq!(names.len(), out.len(), "{what} {v}: names are unique");
            if let Some(p) = v.get(Knob::Cpu) {
                let target = src.cpu_only_cpu_milli * u64::from(p) / 100;
                assert!(
                    m.cpu_only_cpu_milli.abs_diff(target) <= max_cpu / 2 + 1,
                    "{what} {v}: CPU-only demand {} vs target {target}",
                    m.cpu_only_cpu_milli
                );
                assert_eq!(
                    m.gpu_milli, src.gpu_milli,
                    "{what} {v}: GPU tasks unchanged"
                );
            } else {
                assert_eq!(m.cpu_only_cpu_milli, src.cpu_only_cpu_milli, "{what} {v}");
            }
            if let Some(p) = v.get(Knob::GpuShare) {
                assert!(
                    (m.gpushare_pct - f64::from(p)).abs() < 0.5,
                    "{what} {v}: {m:?}"
                );
            }
            if let Some(p) = v.get(Knob::MultiGpu) {
                assert!(
                    (m.multigpu_pct - f64::from(p)).abs() < 0.5,
                    "{what} {v}: {m:?}"
                );
            }
            if v.get(Knob::GpuShare).is_some() || v.get(Knob::MultiGpu).is_some() {
                let dev = m.gpu_milli.abs_diff(src.gpu_milli) as f64 / src.gpu_milli as f64;
                assert!(
                    dev < 0.005,
                    "{what} {v}: total GPU milli {} vs {}",
                    m.gpu_milli,
                    src.gpu_milli
                );
            }
            if let Some(p) = v.get(Knob::GpuSpec) {
                let step = 100.0 / gpu_tasks as f64;
                assert!(
                    (m.gpuspec_pct - f64::from(p)).abs() <= step,
                    "{what} {v}: {m:?}"
                );
                assert_eq!(
                    by_name(out.clone())
                        .iter()
                        .map(|p| (p.cpu_milli, p.total_milli()))
                        .collect::<Vec<_>>(),
                    by_name(pods.clone())
                        .iter()
                        .map(|p| (p.cpu_milli, p.total_milli()))
                        .collect::<Vec<_>>(),
                    "{what} {v}: only constraints change"
                );
                for p in out.iter().filter(|p| !p.gpu_spec.is_any()) {
                    assert!(
                        holds(&nodes, p, p.gpu_spec),
                        "{what} {v}: {} fits some node",
                        p.name
                    );
                }
            }
        }
    }
}

#[test]
fn same_seed_same_list_other_seed_other_list() {
    let w = default_workload(2023);
    for v in [
        "cpu=250",
        "gpushare=60",
        "gpuspec=20",
        "multigpu=40",
        "cpu=50,gpushare=80,gpuspec=10",
    ] {
        let v = Variant::parse(v).unwrap();
        let a = derive(&w.pods, &w.nodes, &v, 42).unwrap();
        assert_eq!(a, derive(&w.pods, &w.nodes, &v, 42).unwrap(), "{v}");
        assert_ne!(a, derive(&w.pods, &w.nodes, &v, 43).unwrap(), "{v}");
    }
}

#[test]
fn a_knob_at_the_source_value_gives_back_the_source() {
    let w = default_workload(2023);
    let out = derive(&w.pods, &w.nodes, &Variant::one(Knob::Cpu, 100), 1).unwrap();
    assert_eq!(by_name(out), by_name(w.pods.clone()));
}

#[test]
fn bad_knobs_and_values_name_the_flag_and_the_value() {
    for (s, want) in [
        ("gpushar=40", "unknown knob \"gpushar\""),
        ("cpu=abc", "cpu=\"abc\""),
        (
            "cpu=1001",
            "cpu=\"1001\": expected a whole percentage 0..=1000",
        ),
        ("gpushare=101", "gpushare=\"101\""),
        ("multigpu=-5", "multigpu=\"-5\""),
        ("gpuspec=12.5", "gpuspec=\"12.5\""),
        ("gpushare", "\"gpushare\" is not <knob>=<pct>"),
        ("cpu=50,cpu=60", "cpu given twice"),
        ("", "empty value"),
    ] {
        let e = Variant::parse(s).expect_err(s).to_string();
        assert!(e.starts_with("--variant"), "{s}: {e}");
        assert!(e.contains(want), "{s}: {e}");
    }
    let w = default_workload(2023);
    let v = Variant::parse("gpushare=60,multigpu=50").unwrap();
    let e = derive(&w.pods, &w.nodes, &v, 1).unwrap_err().to_string();
    assert!(
        e.contains("--variant gpushare=60,multigpu=50") && e.contains("110 %"),
        "{e}"
    );
}

#[test]
fn labels_are_canonical_and_the_grid_has_22_points() {
    assert_eq!(
        Variant::parse(" multigpu=30 , cpu=0").unwrap().to_string(),
        "cpu=0,multigpu=30"
    );
    let g = Variant::grid();
    assert_eq!(g.len(), 22);
    assert_eq!(g[0].to_string(), "cpu=0");
    assert_eq!(g[21].to_string(), "multigpu=50");
}

#[test]
fn constraints_come_from_the_source_mix_when_it_has_one() {
    let w = default_workload(2023);
    let spec = GpuSpec::only(&[w.models.id("T4").expect("T4")]);
    let mut pods = w.pods.clone();
    for p in pods
        .iter_mut()
        .filter(|p| p.wants_gpu() && p.num_gpu <= 2)
        .take(50)
    {
        p.gpu_spec = spec;
    }
    let out = derive(&pods, &w.nodes, &Variant::one(Knob::GpuSpec, 10), 3).unwrap();
    let constrained: Vec<&PodRequest> = out.iter().filter(|p| !p.gpu_spec.is_any()).collect();
    assert!(!constrained.is_empty());
    // Tasks T4 nodes can hold all draw the only constraint the source has.
    for p in constrained {
        if holds(&w.nodes, p, spec) {
            assert_eq!(p.gpu_spec, spec, "{}", p.name);
        }
    }
}
