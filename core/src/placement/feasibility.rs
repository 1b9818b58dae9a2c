//! Feasibility: does a task fit on a node, and if not, which dimension ran
//! out. Mirrors the FGD simulator's filters: Kubernetes' CPU/memory fit and
//! the Open-GPU-Share filter (GPU model from `gpu_spec`, a GPU with enough
//! milli for a sharing task, enough whole GPUs otherwise).
//!
//! Also the in-node GPU choices the baselines use (`--gpu-sel-method`):
//! best fit, random fit, and the first free GPUs for whole-GPU tasks.

use super::cluster::{Cluster, Node};
use super::failure::{AllocMetric, PlacementFailure, ResourceDimension};
use super::plan::GpuSet;
use super::request::PodRequest;
use crate::rng::Rng;

/// Whether `pod` fits on `node` as it is; the first dimension lacking if not.
#[inline]
pub fn fit(node: &Node, pod: &PodRequest) -> Result<(), ResourceDimension> {
    if pod.wants_gpu() && (node.spec.gpus == 0 || !pod.gpu_spec.admits(node.spec.model)) {
        return Err(ResourceDimension::GpuModel);
    }
    if node.cpu_left < pod.cpu_milli {
        return Err(ResourceDimension::Cpu);
    }
    if node.mem_left < pod.memory_mib {
        return Err(ResourceDimension::Memory);
    }
    gpu_fit(node, pod)
}

/// The GPU part of [`fit`] alone.
#[inline]
pub fn gpu_fit(node: &Node, pod: &PodRequest) -> Result<(), ResourceDimension> {
    if !pod.wants_gpu() {
        return Ok(());
    }
    let enough = node
        .gpu_left()
        .iter()
        .filter(|&&l| l >= pod.gpu_milli)
        .count();
    if pod.is_fractional() {
        if enough == 0 {
            return Err(ResourceDimension::GpuMilli);
        }
    } else if enough < pod.num_gpu as usize {
        return Err(ResourceDimension::GpuCount);
    }
    Ok(())
}

/// Runs [`fit`] on every node, calling `on_fit` for each node that fits;
/// returns the metric (nodes evaluated, fit, filtered per dimension).
pub fn scan(
    cluster: &Cluster,
    pod: &PodRequest,
    mut on_fit: impl FnMut(usize, &Node),
) -> AllocMetric {
    let mut metric = AllocMetric::default();
    for (i, node) in cluster.nodes().iter().enumerate() {
        metric.nodes_evaluated += 1;
        match fit(node, pod) {
            Ok(()) => {
                metric.nodes_fit += 1;
                on_fit(i, node);
            }
            Err(d) => metric.filter(d),
        }
    }
    metric
}

/// The fitting node with the highest `score`; ties go to the lowest tie rank.
pub fn best_node(
    cluster: &Cluster,
    pod: &PodRequest,
    mut score: impl FnMut(usize, &Node) -> i64,
) -> Result<usize, PlacementFailure> {
    let mut best: Option<(i64, u32, usize)> = None;
    let metric = scan(cluster, pod, |i, node| {
        let s = score(i, node);
        let better = match best {
            None => true,
            Some((bs, br, _)) => s > bs || (s == bs && node.tie_rank < br),
        };
        if better {
            best = Some((s, node.tie_rank, i));
        }
    });
    best.map(|(_, _, i)| i).ok_or(PlacementFailure { metric })
}

/// The first `n` GPUs with nothing allocated, by index.
pub fn first_free_gpus(node: &Node, n: u8) -> GpuSet {
    let mut set = GpuSet::EMPTY;
    let mut need = n as usize;
    for (g, &l) in node.gpu_left().iter().enumerate() {
        if need == 0 {
            break;
        }
        if l == 1000 {
            set = set.with(g);
            need -= 1;
        }
    }
    set
}

/// Best fit: the GPU with the least milli left that still holds `milli`
/// (the lowest index among equals).
pub fn best_fit_gpu(node: &Node, milli: u16) -> Option<usize> {
    let mut best: Option<(u16, usize)> = None;
    for (g, &l) in node.gpu_left().iter().enumerate() {
        if l >= milli && best.is_none_or(|(bl, _)| l < bl) {
            best = Some((l, g));
        }
    }
    best.map(|(_, g)| g)
}

/// Random fit: a uniformly random GPU among those holding `milli`.
pub fn random_fit_gpu(node: &Node, milli: u16, rng: &mut Rng) -> Option<usize> {
    let mut chosen = None;
    let mut seen = 0u64;
    for (g, &l) in node.gpu_left().iter().enumerate() {
        if l >= milli {
            seen += 1;
            if rng.below(seen) == 0 {
                chosen = Some(g);
            }
        }
    }
    chosen
}

/// The GPUs for `pod` on `node` by best fit (sharing tasks) or the first
/// free GPUs (whole-GPU tasks); empty for CPU-only tasks.
pub fn best_fit_gpus(node: &Node, pod: &PodRequest) -> GpuSet {
    if !pod.wants_gpu() {
        GpuSet::EMPTY
    } else if pod.is_fractional() {
        best_fit_gpu(node, pod.gpu_milli).map_or(GpuSet::EMPTY, GpuSet::one)
    } else {
        first_free_gpus(node, pod.num_gpu)
    }
}
