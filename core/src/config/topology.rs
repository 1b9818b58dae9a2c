//! The validated topology of a region: GPU models, pools, nodes, GPUs,
//! cold-start and swap costs, and the price list, with look-ups.

use super::error::ConfigError;
use super::gpu_model::GpuModel;
use super::node::{GpuGroup, Node};
use super::pool::Pool;
use super::pricing::{Charge, PriceList, PricingError, Usage};
use super::topology_file::parse_topology;
use crate::model::{GpuId, Mib, Micros, Tier};
use std::collections::HashMap;

/// A region's topology, checked: names are unique, every GPU refers to a
/// known model, every (GPU model, pool kind) in use has a price, and every
/// node's cold-start and swap costs are resolved.
///
/// Built only by [`Topology::from_toml`]; read-only afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    gpu_models: Vec<GpuModel>,
    pools: Vec<Pool>,
    pricing: PriceList,
    /// Node name -> (pool index, node index in the pool).
    node_index: HashMap<String, (usize, usize)>,
}

impl Topology {
    /// Parses and validates a topology file; `file` names it in messages.
    /// On failure the error lists every problem of the file.
    pub fn from_toml(file: &str, src: &str) -> Result<Topology, ConfigError> {
        parse_topology(file, src)
    }

    /// Assembles a topology from parts already validated together.
    pub(crate) fn new(gpu_models: Vec<GpuModel>, pools: Vec<Pool>, pricing: PriceList) -> Self {
        let mut node_index = HashMap::new();
        for (p, pool) in pools.iter().enumerate() {
            for (n, node) in pool.nodes.iter().enumerate() {
                node_index.insert(node.name.0.clone(), (p, n));
            }
        }
        Self {
            gpu_models,
            pools,
            pricing,
            node_index,
        }
    }

    /// The GPU model catalog, sorted by name.
    pub fn gpu_models(&self) -> &[GpuModel] {
        &self.gpu_models
    }

    /// A GPU model by name.
    pub fn gpu_model(&self, name: &str) -> Option<&GpuModel> {
        self.gpu_models.iter().find(|m| m.name == name)
    }

    /// The pools, in file order.
    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// A pool by name.
    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// Every node, pool by pool, in file order.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> + '_ {
        self.pools.iter().flat_map(|p| p.nodes.iter())
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<&Node> {
        let &(p, n) = self.node_index.get(name)?;
        Some(&self.pools[p].nodes[n])
    }

    /// The pool a node belongs to.
    pub fn pool_of(&self, node: &str) -> Option<&Pool> {
        let &(p, _) = self.node_index.get(node)?;
        Some(&self.pools[p])
    }

    /// Every GPU of a node with its id (empty for an unknown node).
    pub fn gpus_of<'a>(&'a self, node: &str) -> impl Iterator<Item = (GpuId, &'a GpuGroup)> + 'a {
        self.node(node).into_iter().flat_map(|n| n.gpus())
    }

    /// Every GPU of the region with its id.
    pub fn gpus(&self) -> impl Iterator<Item = (GpuId, &GpuGroup)> + '_ {
        self.nodes().flat_map(|n| n.gpus())
    }

    /// The GPU with this id, if it exists.
    pub fn gpu(&self, id: &GpuId) -> Option<&GpuGroup> {
        self.node(&id.node.0)?.gpu(id.index)
    }

    /// Number of GPUs in the region.
    pub fn total_gpus(&self) -> u32 {
        self.pools.iter().map(Pool::gpu_count).sum()
    }

    /// Time to swap `weights_mib` into (or out of) GPU `id`.
    pub fn swap_us(&self, id: &GpuId, weights_mib: Mib) -> Option<Micros> {
        self.node(&id.node.0)?.swap_us(id.index, weights_mib)
    }

    /// Time to cold-start `weights_mib` of weights on `node`.
    pub fn cold_start_us(&self, node: &str, weights_mib: Mib) -> Option<Micros> {
        Some(self.node(node)?.cold_start_us(weights_mib))
    }

    /// The price list.
    pub fn pricing(&self) -> &PriceList {
        &self.pricing
    }

    /// What `usage` on GPU `id` at `tier` costs (the GPU's model and its
    /// pool's kind select the price). `None` for an unknown GPU.
    pub fn quote(
        &self,
        id: &GpuId,
        tier: Tier,
        usage: &Usage,
    ) -> Option<Result<Charge, PricingError>> {
        let node = self.node(&id.node.0)?;
        let gpu = node.gpu(id.index)?;
        Some(self.pricing.quote(&gpu.model, node.kind, tier, usage))
    }
}
