//! The cluster view: nodes with CPU, memory and GPUs (each with milli-GPU
//! left), and the fractional tasks bound to each GPU so that they can be
//! remapped inside their node.

use super::plan::{GpuSet, Remap};
use super::request::PodRequest;

/// Most GPUs one node may have (the openb trace has at most 8).
pub const MAX_GPUS_PER_NODE: usize = 16;

/// Identifier of a task bound to the cluster (the caller's choice, e.g. its
/// index in the pod list).
pub type TaskId = u32;

/// Interned GPU model names (`"G2"`, `"T4"`, …); a model's id is its index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuModels {
    names: Vec<String>,
}

impl GpuModels {
    /// The id of `name`, interning it if new. At most 64 models are kept
    /// (a [`super::GpuSpec`] is a 64-bit mask); beyond that `None`.
    pub fn intern(&mut self, name: &str) -> Option<u8> {
        if let Some(id) = self.id(name) {
            return Some(id);
        }
        if self.names.len() >= 64 {
            return None;
        }
        self.names.push(name.to_string());
        Some((self.names.len() - 1) as u8)
    }

    /// The id of a known model name.
    pub fn id(&self, name: &str) -> Option<u8> {
        self.names.iter().position(|n| n == name).map(|i| i as u8)
    }

    /// The name of model `id`.
    pub fn name(&self, id: u8) -> &str {
        &self.names[id as usize]
    }

    /// Number of models known.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True when no model is known.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// A node's fixed capacity, as in the node list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Node name (`sn` in the openb node list).
    pub name: String,
    /// CPU capacity in milli-CPU.
    pub cpu_milli: u32,
    /// Host memory in MiB.
    pub memory_mib: u64,
    /// Number of GPUs (each 1000 milli-GPU).
    pub gpus: u8,
    /// GPU model id (into [`GpuModels`]); `None` for a CPU-only node.
    pub model: Option<u8>,
}

/// A fractional task bound to one GPU of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FracTask {
    pub(crate) id: TaskId,
    pub(crate) gpu: u8,
    pub(crate) milli: u16,
}

/// A node and what is left of it.
#[derive(Debug, Clone)]
pub struct Node {
    pub(crate) spec: NodeSpec,
    pub(crate) cpu_left: u32,
    pub(crate) mem_left: u64,
    pub(crate) gpu_left: [u16; MAX_GPUS_PER_NODE],
    /// GPU-task counts by kind: index 0 = fractional, k = k whole GPUs.
    pub(crate) affinity: [u16; MAX_GPUS_PER_NODE + 1],
    pub(crate) tasks: Vec<FracTask>,
    pub(crate) epoch: u64,
    pub(crate) tie_rank: u32,
}

impl Node {
    fn new(spec: NodeSpec) -> Self {
        let mut gpu_left = [0u16; MAX_GPUS_PER_NODE];
        for g in gpu_left.iter_mut().take(spec.gpus as usize) {
            *g = 1000;
        }
        Self {
            cpu_left: spec.cpu_milli,
            mem_left: spec.memory_mib,
            gpu_left,
            affinity: [0; MAX_GPUS_PER_NODE + 1],
            tasks: Vec::new(),
            epoch: 0,
            tie_rank: 0,
            spec,
        }
    }

    /// The node's capacity.
    pub fn spec(&self) -> &NodeSpec {
        &self.spec
    }

    /// Milli-CPU left.
    pub fn cpu_left(&self) -> u32 {
        self.cpu_left
    }

    /// Memory left, MiB.
    pub fn mem_left(&self) -> u64 {
        self.mem_left
    }

    /// Milli-GPU left on each GPU, by device index.
    pub fn gpu_left(&self) -> &[u16] {
        &self.gpu_left[..self.spec.gpus as usize]
    }

    /// Sum of milli-GPU left over the node's GPUs.
    pub fn gpu_left_total(&self) -> u32 {
        self.gpu_left().iter().map(|&g| g as u32).sum()
    }

    /// Number of GPUs with nothing allocated.
    pub fn free_gpus(&self) -> u32 {
        self.gpu_left().iter().filter(|&&g| g == 1000).count() as u32
    }

    /// Changes each time the node's allocation changes (for caches).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Tie-break rank: among equal scores the lowest rank wins (the FGD
    /// simulator breaks ties by node name, names prefixed by a seeded
    /// permutation).
    pub fn tie_rank(&self) -> u32 {
        self.tie_rank
    }

    /// Number of distinct GPU-task kinds on the node (fractional, 1-GPU,
    /// 2-GPU, …), and whether `kind` is among them.
    pub(crate) fn affinity_kinds(&self, kind: usize) -> (usize, bool) {
        let n = self.affinity.iter().filter(|&&c| c > 0).count();
        (n, self.affinity[kind] > 0)
    }
}

/// Allocation-kind index of a GPU request: 0 = fractional, k = k whole GPUs.
pub(crate) fn affinity_kind(pod: &PodRequest) -> Option<usize> {
    if pod.num_gpu == 0 || pod.gpu_milli == 0 {
        None
    } else if pod.is_fractional() {
        Some(0)
    } else {
        Some((pod.num_gpu as usize).min(MAX_GPUS_PER_NODE))
    }
}

/// The cluster: nodes plus running totals.
#[derive(Debug, Clone)]
pub struct Cluster {
    nodes: Vec<Node>,
    models: GpuModels,
    total_gpus: u32,
    used_milli: u64,
}

impl Cluster {
    /// A cluster of empty nodes. Nodes with more than
    /// [`MAX_GPUS_PER_NODE`] GPUs are clamped to it.
    pub fn new(specs: Vec<NodeSpec>, models: GpuModels) -> Self {
        let nodes: Vec<Node> = specs
            .into_iter()
            .map(|mut s| {
                s.gpus = s.gpus.min(MAX_GPUS_PER_NODE as u8);
                Node::new(s)
            })
            .collect();
        let total_gpus = nodes.iter().map(|n| n.spec.gpus as u32).sum();
        Self {
            nodes,
            models,
            total_gpus,
            used_milli: 0,
        }
    }

    /// All nodes, by index.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The GPU model names.
    pub fn models(&self) -> &GpuModels {
        &self.models
    }

    /// Total GPUs in the cluster.
    pub fn total_gpus(&self) -> u32 {
        self.total_gpus
    }

    /// Milli-GPU allocated over the whole cluster.
    pub fn used_milli(&self) -> u64 {
        self.used_milli
    }

    /// Sets the tie-break ranks (`ranks[i]` for node `i`).
    pub fn set_tie_ranks(&mut self, ranks: &[u32]) {
        for (n, &r) in self.nodes.iter_mut().zip(ranks) {
            n.tie_rank = r;
        }
    }

    /// Binds `pod` (task `id`) to `node`, on the GPUs in `gpus`. The caller
    /// has checked feasibility; amounts saturate rather than wrap.
    pub fn bind(&mut self, id: TaskId, pod: &PodRequest, node: usize, gpus: GpuSet) {
        let n = &mut self.nodes[node];
        n.cpu_left = n.cpu_left.saturating_sub(pod.cpu_milli);
        n.mem_left = n.mem_left.saturating_sub(pod.memory_mib);
        for g in gpus.iter() {
            let before = n.gpu_left[g];
            n.gpu_left[g] = before.saturating_sub(pod.gpu_milli);
            self.used_milli += (before - n.gpu_left[g]) as u64;
            if pod.is_fractional() {
                n.tasks.push(FracTask {
                    id,
                    gpu: g as u8,
                    milli: pod.gpu_milli,
                });
            }
        }
        if let Some(k) = affinity_kind(pod) {
            n.affinity[k] += 1;
        }
        n.epoch += 1;
    }

    /// Moves fractional tasks between GPUs of one node, as one plan (tasks
    /// are checkpointed and restored, so only the final layout must fit).
    /// Each remap must name a task on its `from` GPU and the final per-GPU
    /// totals must stay within 1000 milli; otherwise nothing changes and
    /// `false` is returned.
    pub fn remap(&mut self, node: usize, remaps: &[Remap]) -> bool {
        let n = &mut self.nodes[node];
        let gpus = n.spec.gpus as usize;
        let mut left = [0i32; MAX_GPUS_PER_NODE];
        for (l, &g) in left.iter_mut().zip(n.gpu_left.iter()) {
            *l = g as i32;
        }
        let mut tasks = n.tasks.clone();
        for r in remaps {
            let Some(t) = tasks.iter_mut().find(|t| t.id == r.task && t.gpu == r.from) else {
                return false;
            };
            if r.to as usize >= gpus {
                return false;
            }
            left[r.from as usize] += t.milli as i32;
            left[r.to as usize] -= t.milli as i32;
            t.gpu = r.to;
        }
        if left.iter().any(|&l| !(0..=1000).contains(&l)) {
            return false;
        }
        for (g, &l) in n.gpu_left.iter_mut().zip(left.iter()) {
            *g = l as u16;
        }
        n.tasks = tasks;
        n.epoch += 1;
        true
    }
}
