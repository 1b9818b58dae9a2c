//! `random`: a uniformly random fitting node, a random fitting GPU inside it
//! (`RandomScore` with `--gpu-sel-method random`).

use crate::placement::feasibility::{first_free_gpus, random_fit_gpu, scan};
use crate::placement::{Cluster, GpuSet, Placement, PlacementFailure, PlacementPolicy, PodRequest};
use crate::rng::Rng;

/// Random node, random GPU.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomFit;

impl PlacementPolicy for RandomFit {
    fn name(&self) -> &'static str {
        "random"
    }

    fn place(
        &mut self,
        cluster: &Cluster,
        pod: &PodRequest,
        rng: &mut Rng,
    ) -> Result<Placement, PlacementFailure> {
        let mut fits: Vec<usize> = Vec::new();
        let metric = scan(cluster, pod, |i, _| fits.push(i));
        if fits.is_empty() {
            return Err(PlacementFailure { metric });
        }
        let node_ix = fits[rng.below(fits.len() as u64) as usize];
        let node = &cluster.nodes()[node_ix];
        let gpus = if !pod.wants_gpu() {
            GpuSet::EMPTY
        } else if pod.is_fractional() {
            random_fit_gpu(node, pod.gpu_milli, rng).map_or(GpuSet::EMPTY, GpuSet::one)
        } else {
            first_free_gpus(node, pod.num_gpu)
        };
        Ok(Placement {
            node: node_ix,
            gpus,
            remaps: Vec::new(),
        })
    }
}
