//! `dotprod`: prefer the node whose free (CPU, total GPU) vector is least
//! aligned with the request, both normalised by the largest node
//! (`DotProductScore`, `-dimext merge -norm max`); best-fit GPU inside it
//! (with `merge` the simulator keeps `-gpusel best`).

use super::best_fit::{MAX_SPEC_CPU, MAX_SPEC_GPU};
use crate::placement::feasibility::{best_fit_gpus, best_node};
use crate::placement::{Cluster, Node, Placement, PlacementFailure, PlacementPolicy, PodRequest};
use crate::rng::Rng;

/// Dot product of free and requested resources.
#[derive(Debug, Clone, Copy, Default)]
pub struct DotProduct;

fn dot_score(node: &Node, pod: &PodRequest) -> i64 {
    let nc = node.cpu_left() as f64 / MAX_SPEC_CPU;
    let ng = node.gpu_left_total() as f64 / MAX_SPEC_GPU;
    let pc = pod.cpu_milli as f64 / MAX_SPEC_CPU;
    let pg = pod.total_milli() as f64 / MAX_SPEC_GPU;
    let dot = (nc * pc + ng * pg) / 2.0;
    (100.0 * (1.0 - dot)) as i64
}

impl PlacementPolicy for DotProduct {
    fn name(&self) -> &'static str {
        "dotprod"
    }

    fn place(
        &mut self,
        cluster: &Cluster,
        pod: &PodRequest,
        _rng: &mut Rng,
    ) -> Result<Placement, PlacementFailure> {
        let node = best_node(cluster, pod, |_, n| dot_score(n, pod))?;
        Ok(Placement {
            node,
            gpus: best_fit_gpus(&cluster.nodes()[node], pod),
            remaps: Vec::new(),
        })
    }
}
