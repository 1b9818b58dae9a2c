//! The validated topology of a region: GPU models, pools, nodes, GPUs,
//! cold-start and swap costs, and the price list, with look-ups.

use super::error::ConfigError;
use super::gpu_model::GpuModel;
use super::loading::{ColdStart, SwapCost};
use super::node::{GpuGroup, Node};
use super::pool::Pool;
use super::pricing::{Charge, PriceList, PricingError, Usage};
use super::topology_file::parse_topology;
use crate::model::{GpuId, Mib, Micros, PoolKind, RegionPolicy, Tier};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A region's topology, checked: names are unique, every GPU refers to a
/// known model, every (GPU model, pool kind) in use has a price, and every
/// node's cold-start and swap costs are resolved.
///
/// Built by [`Topology::from_toml`]; read-only afterwards. It serializes
/// (e.g. into a Raft snapshot) as its catalog, defaults, pools and price
/// list; deserializing trusts its input (it rebuilds the look-up index but
/// does not validate again), so parse operator input with `from_toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "TopologyData", from = "TopologyData")]
pub struct Topology {
    gpu_models: Vec<GpuModel>,
    cold_start: ColdStart,
    swap: SwapCost,
    pools: Vec<Pool>,
    pricing: PriceList,
    /// The region's placement ranking (`[placement] policy`).
    placement: RegionPolicy,
    /// Look-ups built from the pools (boxed: a topology travels inside
    /// Raft commands, whose size is their largest variant's).
    derived: Box<Derived>,
}

/// What [`Topology::new`] builds from the pools.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Derived {
    /// Node name -> (pool index, node index in the pool).
    node_index: HashMap<String, (usize, usize)>,
    /// Per pool (same order), its largest GPUs ([`PoolCapacity`]).
    capacity: Vec<PoolCapacity>,
}

/// What the largest GPUs of one pool hold: what a spec is checked against
/// before it is planned (no load could take a spec larger than every GPU),
/// kept so that the check costs a step per pool, not per node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolCapacity {
    /// The pool's largest GPU by memory, the first in file order:
    /// (node index in the pool, its GPU index on the node, its group index
    /// in the node's `gpus`); `None` when no node has a GPU.
    pub largest: Option<(usize, u32, usize)>,
    /// `whole[k]`: the most memory `k` GPUs of one node hold together,
    /// over the pool's nodes with at least `k` GPUs (`whole[0]` = 0; the
    /// vector ends at the largest GPU count of a node).
    pub whole: Vec<Mib>,
}

impl PoolCapacity {
    fn of(pool: &Pool) -> Self {
        let mut largest: Option<(usize, u32, usize, Mib)> = None;
        let mut whole: Vec<Mib> = Vec::new();
        let mut sizes: Vec<Mib> = Vec::new();
        for (n, node) in pool.nodes.iter().enumerate() {
            let mut index = 0u32;
            sizes.clear();
            for (g, group) in node.gpus.iter().enumerate() {
                if largest.is_none_or(|l| group.memory_mib > l.3) {
                    largest = Some((n, index, g, group.memory_mib));
                }
                index = index.saturating_add(group.count);
                sizes.extend(std::iter::repeat_n(group.memory_mib, group.count as usize));
            }
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            let mut sum: Mib = 0;
            for k in 0..=sizes.len() {
                if k > 0 {
                    sum = sum.saturating_add(sizes[k - 1]);
                }
                match whole.get_mut(k) {
                    Some(best) => *best = (*best).max(sum),
                    None => whole.push(sum),
                }
            }
        }
        Self {
            largest: largest.map(|(n, i, g, _)| (n, i, g)),
            whole,
        }
    }
}

impl Topology {
    /// Parses and validates a topology file; `file` names it in messages.
    /// On failure the error lists every problem of the file.
    pub fn from_toml(file: &str, src: &str) -> Result<Topology, ConfigError> {
        parse_topology(file, src)
    }

    /// Assembles a topology from parts already validated together.
    pub(crate) fn new(
        gpu_models: Vec<GpuModel>,
        (cold_start, swap): (ColdStart, SwapCost),
        pools: Vec<Pool>,
        pricing: PriceList,
    ) -> Self {
        let mut node_index = HashMap::new();
        for (p, pool) in pools.iter().enumerate() {
            for (n, node) in pool.nodes.iter().enumerate() {
                node_index.insert(node.name.0.clone(), (p, n));
            }
        }
        let capacity = pools.iter().map(PoolCapacity::of).collect();
        Self {
            gpu_models,
            cold_start,
            swap,
            pools,
            pricing,
            placement: RegionPolicy::default(),
            derived: Box::new(Derived {
                node_index,
                capacity,
            }),
        }
    }

    /// What the largest GPUs of each pool hold, in the order of
    /// [`Topology::pools`].
    pub fn pool_capacity(&self) -> &[PoolCapacity] {
        &self.derived.capacity
    }

    /// This topology with the placement ranking `placement`.
    pub fn with_placement(mut self, placement: RegionPolicy) -> Self {
        self.placement = placement;
        self
    }

    /// The region's placement ranking (`[placement] policy`, default
    /// `gshare`).
    pub fn placement_policy(&self) -> RegionPolicy {
        self.placement
    }

    /// The region-wide cold-start default (`[cold_start]`); each node has
    /// its own resolved copy in [`Node::cold_start`].
    pub fn default_cold_start(&self) -> ColdStart {
        self.cold_start
    }

    /// The region-wide swap default (`[swap]`); each node has its own
    /// resolved copy in [`Node::swap`].
    pub fn default_swap(&self) -> SwapCost {
        self.swap
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
        let &(p, n) = self.derived.node_index.get(name)?;
        Some(&self.pools[p].nodes[n])
    }

    /// The pool a node belongs to.
    pub fn pool_of(&self, node: &str) -> Option<&Pool> {
        let &(p, _) = self.derived.node_index.get(node)?;
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

    /// The (GPU model, pool kind) pairs in use that `list` has no price
    /// for (empty when `list` could replace this topology's price list).
    pub fn unpriced(&self, list: &PriceList) -> Vec<(String, PoolKind)> {
        let mut missing: Vec<(String, PoolKind)> = Vec::new();
        for node in self.nodes() {
            for g in &node.gpus {
                let pair = (g.model.clone(), node.kind);
                if list.price(&g.model, node.kind).is_none() && !missing.contains(&pair) {
                    missing.push(pair);
                }
            }
        }
        missing
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

/// The serialized form of a [`Topology`] (everything but the index).
#[derive(Serialize, Deserialize)]
struct TopologyData {
    gpu_models: Vec<GpuModel>,
    cold_start: ColdStart,
    swap: SwapCost,
    pools: Vec<Pool>,
    pricing: PriceList,
    placement: RegionPolicy,
}

impl From<Topology> for TopologyData {
    fn from(t: Topology) -> Self {
        Self {
            gpu_models: t.gpu_models,
            cold_start: t.cold_start,
            swap: t.swap,
            pools: t.pools,
            pricing: t.pricing,
            placement: t.placement,
        }
    }
}

impl From<TopologyData> for Topology {
    fn from(d: TopologyData) -> Self {
        Topology::new(d.gpu_models, (d.cold_start, d.swap), d.pools, d.pricing)
            .with_placement(d.placement)
    }
}

/// A [`Topology`] in the serialized form written before `[placement]`
/// existed (no placement policy: it reads as the default). Only the Raft
/// log's older `TopologyLoad` entries hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "TopologyDataV1", from = "TopologyDataV1")]
pub struct LegacyTopology(pub Topology);

/// The serialized form of a [`LegacyTopology`].
#[derive(Serialize, Deserialize)]
struct TopologyDataV1 {
    gpu_models: Vec<GpuModel>,
    cold_start: ColdStart,
    swap: SwapCost,
    pools: Vec<Pool>,
    pricing: PriceList,
}

impl From<LegacyTopology> for TopologyDataV1 {
    fn from(LegacyTopology(t): LegacyTopology) -> Self {
        Self {
            gpu_models: t.gpu_models,
            cold_start: t.cold_start,
            swap: t.swap,
            pools: t.pools,
            pricing: t.pricing,
        }
    }
}

impl From<TopologyDataV1> for LegacyTopology {
    fn from(d: TopologyDataV1) -> Self {
        LegacyTopology(Topology::new(
            d.gpu_models,
            (d.cold_start, d.swap),
            d.pools,
            d.pricing,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::pricing::Usage;
    use crate::model::NodeId;

    /// Two pools; node `c0` has two GPU groups; overrides at pool and node level.
    const SMALL: &str = r#"
[[gpu_models]]
name = "big"
memory_mib = 80_000
h2d_mib_per_s = 20_000

[[gpu_models]]
name = "small"
memory_mib = 16_000
h2d_mib_per_s = 10_000

[cold_start]
setup_us = 1_000_000
storage_mib_per_s = 1_000

[swap]
setup_us = 5_000

[[pools]]
name = "dc"
kind = "center"

[[pools.nodes]]
name = "c0"
cpu_milli = 64_000
memory_mib = 512_000
swap_mib = 256_000
gpus = [{ model = "big", count = 2 }, { model = "small", count = 1, h2d_mib_per_s = 5_000 }]

[[pools.nodes]]
name = "c1"
cpu_milli = 8_000
memory_mib = 64_000
swap_mib = 0

[[pools]]
name = "edge-x"
kind = "edge"
cold_start = { storage_mib_per_s = 100 }
swap = { setup_us = 7_000 }

[[pools.nodes]]
name = "e0"
cpu_milli = 8_000
memory_mib = 32_000
swap_mib = 16_000
cold_start = { setup_us = 2_000_000 }
gpus = [{ model = "small", count = 1 }]

[pricing]
currency = "USD"
unit = "micro-USD"
units_per_currency = 1_000_000

[pricing.tiers]
exclusive = { discount_bp = 0 }
guaranteed = { discount_bp = 1000 }
burstable = { discount_bp = 1000 }
oversubscribed = { discount_bp = 5000 }

[[pricing.prices]]
gpu_model = "big"
pool_kind = "center"
gpu_hour = 2_000_000
memory_gib_hour = 0

[[pricing.prices]]
gpu_model = "small"
pool_kind = "center"
gpu_hour = 1_000_000
memory_gib_hour = 0

[[pricing.prices]]
gpu_model = "small"
pool_kind = "edge"
gpu_hour = 1_500_000
memory_gib_hour = 0
"#;

    fn small() -> Topology {
        Topology::from_toml("small.toml", SMALL).unwrap_or_else(|e| panic!("{e}"))
    }

    fn gpu(node: &str, index: u32) -> GpuId {
        GpuId {
            node: NodeId(node.into()),
            index,
        }
    }

    #[test]
    fn each_pool_keeps_its_first_largest_gpu_and_the_most_k_gpus_of_a_node_hold() {
        let t = small();
        let c = t.pool_capacity();
        assert_eq!(c.len(), t.pools().len());
        // dc: c0's first 80 GB GPU (the second is no larger); c1 has none.
        assert_eq!(c[0].largest, Some((0, 0, 0)));
        assert_eq!(c[0].whole, vec![0, 80_000, 160_000, 176_000]);
        assert_eq!(c[1].largest, Some((0, 0, 0)));
        assert_eq!(c[1].whole, vec![0, 16_000]);
        // Rebuilt when read back (a snapshot).
        let back: Topology = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back.pool_capacity(), c);
    }

    #[test]
    fn look_ups_find_nodes_pools_and_gpus() {
        let t = small();
        assert_eq!(t.total_gpus(), 4);
        assert_eq!(t.nodes().count(), 3);
        assert_eq!(t.pool_of("e0").unwrap().name, "edge-x");
        assert_eq!(t.pool_of("c1").unwrap().kind, PoolKind::Center);
        assert!(t.node("nope").is_none() && t.pool_of("nope").is_none());
        let ids: Vec<_> = t
            .gpus_of("c0")
            .map(|(id, g)| (id.index, g.model.clone()))
            .collect();
        assert_eq!(
            ids,
            [
                (0, "big".to_string()),
                (1, "big".into()),
                (2, "small".into())
            ]
        );
        assert_eq!(t.gpus_of("c1").count(), 0);
        assert_eq!(t.gpus_of("nope").count(), 0);
        assert_eq!(t.gpu(&gpu("c0", 2)).unwrap().model, "small");
        assert!(t.gpu(&gpu("c0", 3)).is_none());
        assert_eq!(t.gpus().count(), 4);
        assert_eq!(t.gpu_model("big").unwrap().memory_mib, 80_000);
        assert_eq!(t.pool("dc").unwrap().gpu_count(), 3);
    }

    #[test]
    fn node_and_pool_overrides_beat_the_region_defaults() {
        let t = small();
        // Region defaults on c0; its small GPU has its own h2d bandwidth.
        assert_eq!(t.cold_start_us("c0", 1_000), Some(1_000_000 + 1_000_000));
        assert_eq!(t.swap_us(&gpu("c0", 0), 20_000), Some(5_000 + 1_000_000));
        assert_eq!(t.swap_us(&gpu("c0", 2), 5_000), Some(5_000 + 1_000_000));
        assert_eq!(t.gpu(&gpu("c0", 2)).unwrap().memory_mib, 16_000);
        // e0: storage from its pool, setup from the node, swap setup from the pool.
        assert_eq!(t.cold_start_us("e0", 100), Some(2_000_000 + 1_000_000));
        assert_eq!(t.swap_us(&gpu("e0", 0), 0), Some(7_000));
        assert_eq!(t.swap_us(&gpu("e0", 1), 0), None);
        assert_eq!(t.default_cold_start().setup_us, 1_000_000);
        assert_eq!(t.default_swap().setup_us, 5_000);
    }

    #[test]
    fn quotes_use_the_gpu_model_and_pool_kind_of_the_gpu() {
        let t = small();
        let hour = Usage {
            compute_milli_gpu_ms: 1_000 * 3_600_000,
            memory_mib_ms: 0,
            invocations: 0,
        };
        let q = |id: GpuId, tier| t.quote(&id, tier, &hour).unwrap().unwrap().total;
        assert_eq!(q(gpu("c0", 0), Tier::Exclusive), 2_000_000);
        assert_eq!(q(gpu("c0", 2), Tier::Guaranteed), 900_000);
        assert_eq!(q(gpu("e0", 0), Tier::Oversubscribed), 750_000);
        assert!(t.quote(&gpu("e0", 9), Tier::Exclusive, &hour).is_none());
        assert!(t.unpriced(t.pricing()).is_empty());
        let mut fewer = t.pricing().clone();
        fewer.prices.retain(|p| p.pool_kind == PoolKind::Center);
        assert_eq!(t.unpriced(&fewer), [("small".to_string(), PoolKind::Edge)]);
    }

    #[test]
    fn serialization_round_trips_and_rebuilds_the_index() {
        let t = small();
        let text = toml::to_string(&t).unwrap();
        let back: Topology = toml::from_str(&text).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.pool_of("e0").unwrap().name, "edge-x");
    }
}
