//! `bestfit`: the node whose CPU and GPU left after placing are smallest,
//! each normalised by the largest node (128 CPUs, 8 GPUs) and weighted ½
//! (`BestFitScore`); best-fit GPU inside it.

use crate::placement::feasibility::{best_fit_gpus, best_node};
use crate::placement::{Cluster, Node, Placement, PlacementFailure, PlacementPolicy, PodRequest};
use crate::rng::Rng;

/// Largest node's CPU, milli (the simulator's `MaxSpecCpu`).
pub(crate) const MAX_SPEC_CPU: f64 = 128_000.0;
/// Largest node's GPU, milli (`MaxSpecGpu`).
pub(crate) const MAX_SPEC_GPU: f64 = 8_000.0;

/// Best fit over (CPU, total GPU).
#[derive(Debug, Clone, Copy, Default)]
pub struct BestFit;

pub(crate) fn best_fit_score(node: &Node, pod: &PodRequest) -> i64 {
    let cpu = (node.cpu_left() as f64 - pod.cpu_milli as f64) / MAX_SPEC_CPU * 0.5;
    let gpu = (node.gpu_left_total() as f64 - pod.total_milli() as f64) / MAX_SPEC_GPU * 0.5;
    ((1.0 - (cpu + gpu)) * 100.0) as i64
}

impl PlacementPolicy for BestFit {
    fn name(&self) -> &'static str {
        "bestfit"
    }

    fn place(
        &mut self,
        cluster: &Cluster,
        pod: &PodRequest,
        _rng: &mut Rng,
    ) -> Result<Placement, PlacementFailure> {
        let node = best_node(cluster, pod, |_, n| best_fit_score(n, pod))?;
        Ok(Placement {
            node,
            gpus: best_fit_gpus(&cluster.nodes()[node], pod),
            remaps: Vec::new(),
        })
    }
}
