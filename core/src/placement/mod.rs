//! GPU-sharing placement: which node, and which GPU(s) inside it, a task lands on.
//!
//! The shape follows Nomad's scheduler: a read-only [`Cluster`] view,
//! a feasibility check per node ([`feasibility`]) that records why nodes were
//! filtered ([`AllocMetric`]), a ranking per policy, then a [`Placement`] plan
//! that the caller applies with [`Cluster::bind`].
//!
//! ```text
//!   PodRequest ──▶ feasibility (model, cpu, memory, gpu count, gpu milli)
//!                      │ fit nodes                 │ filtered counts
//!                      ▼                           ▼
//!                 policy score/rank ──▶ Placement   PlacementFailure (AllocMetric)
//!                      │
//!                      ▼
//!                 Cluster::bind (and, for `gshare`, Cluster::remap first)
//! ```
//!
//! The baselines (`random`, `dotprod`, `clustering`, `packing`, `bestfit`,
//! `fgd`) follow the FGD paper's public simulator (USENIX ATC'23, "Beware of
//! Fragmentation"); `gshare` and `gshare-noremap` are ours (see
//! `docs/placement.md`).

mod cluster;
mod failure;
pub mod feasibility;
mod frag;
mod hashing;
mod plan;
pub mod policies;
mod policy;
mod request;
mod trace;

pub use cluster::{Cluster, GpuModels, Node, NodeSpec, TaskId, MAX_GPUS_PER_NODE};
pub use failure::{AllocMetric, PlacementFailure, ResourceDimension};
pub use frag::{fgd_bucket, FragModel, HoleQuality, TypicalPod};
pub use plan::{GpuSet, Placement, Remap};
pub use policy::{
    canonical_policy_name, policy_by_name, PlacementPolicy, UnknownPolicy, POLICY_NAMES,
};
pub use request::{GpuSpec, PodRequest};
pub use trace::{parse_gpu_spec, parse_node_csv, parse_pod_csv, TraceError};

#[cfg(test)]
mod tests;
