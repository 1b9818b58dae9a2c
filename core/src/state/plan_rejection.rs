//! Why the planner found no place (after Nomad's `AllocMetric`).

use super::fit::GpuDimension;
use crate::model::{GpuId, PoolKind, QuotaDimension, TenantId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Why no instance can be placed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RejectReason {
    /// No such tenant.
    #[error("unknown tenant")]
    UnknownTenant,
    /// The tenant has no such function.
    #[error("unknown function")]
    UnknownFunction,
    /// No topology is loaded.
    #[error("no topology loaded")]
    NoTopology,
    /// The function has its most instances.
    #[error("already at max_instances ({max})")]
    MaxInstances {
        /// Its `max_instances`.
        max: u32,
    },
    /// A GPU had room but the tenant's quota did not.
    #[error("{pool_kind} quota of {dimension} exhausted")]
    Quota {
        /// The pool kind.
        pool_kind: PoolKind,
        /// What ran out.
        dimension: QuotaDimension,
    },
    /// No GPU has room; the best candidate ran out of `dimension`.
    #[error("no GPU has room; best candidate {gpu} ran out of {dimension}")]
    Gpu {
        /// The best candidate.
        gpu: GpuId,
        /// What ran out there.
        dimension: GpuDimension,
    },
    /// The function is larger than every GPU of the region (or, for
    /// `exclusive`, than the largest GPUs of any one node): no load could
    /// take it. Names the largest GPU. A strict pool preference counts
    /// only the GPUs of its pools.
    #[error("larger than every GPU: the largest, {gpu} ({model}), has {memory_mib} MiB")]
    Unsatisfiable {
        /// The largest GPU.
        gpu: GpuId,
        /// Its model.
        model: String,
        /// Its memory, MiB.
        memory_mib: crate::model::Mib,
    },
    /// A strict pool preference (`strict_pool`) whose pool the topology
    /// lacks (`edge:<p>` without an edge pool p, `center` without a
    /// center pool): nothing could ever take it. `pool` is the preference
    /// as written (`edge:<p>` or `center`).
    #[error(
        "strict pool {pool}: the topology has no such pool, and the function is placed only there"
    )]
    NoSuchPool {
        /// The preference, without `strict:`.
        pool: String,
    },
    /// The topology has no node to try.
    #[error("no nodes")]
    NoNodes,
    /// Every node that could take it is not ready or drained.
    #[error("no ready node: {not_ready} nodes not ready or drained")]
    NoReadyNodes {
        /// Nodes skipped.
        not_ready: u32,
    },
}

/// A plan that found no place, with what was tried (Nomad's `AllocMetric`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("cannot place {tenant}/{function}: {reason} ({nodes_evaluated} nodes, {gpus_evaluated} GPUs evaluated)")]
pub struct PlanRejection {
    /// Owner.
    pub tenant: TenantId,
    /// Function name.
    pub function: String,
    /// Nodes looked at.
    pub nodes_evaluated: u32,
    /// GPUs looked at.
    pub gpus_evaluated: u32,
    /// How many candidates failed on each GPU dimension.
    pub exhausted: BTreeMap<GpuDimension, u32>,
    /// Pool kinds whose quota refused a candidate that had room.
    pub quota_exhausted: BTreeMap<PoolKind, QuotaDimension>,
    /// Nodes skipped because they are not ready or drained.
    #[serde(default)]
    pub nodes_not_ready: u32,
    /// The reason (see the module docs).
    pub reason: RejectReason,
}

impl PlanRejection {
    /// The stable code (for API errors and the rejections-by-reason metric).
    pub fn code(&self) -> &'static str {
        match self.reason {
            RejectReason::UnknownTenant => "unknown_tenant",
            RejectReason::UnknownFunction => "unknown_function",
            RejectReason::NoTopology => "no_topology",
            RejectReason::MaxInstances { .. } => "max_instances",
            RejectReason::Quota { .. } => "quota_exceeded",
            RejectReason::Gpu { .. } => "gpu_full",
            RejectReason::NoNodes => "no_nodes",
            RejectReason::NoReadyNodes { .. } => "no_ready_nodes",
            RejectReason::Unsatisfiable { .. } => "unsatisfiable",
            RejectReason::NoSuchPool { .. } => "unknown_pool",
        }
    }
}
