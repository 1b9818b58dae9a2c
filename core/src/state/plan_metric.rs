//! What a plan looked at (Nomad's `AllocMetric`), for a plan that found a
//! place as much as for one that did not (a dry run shows it).

use super::fit::GpuDimension;
use super::plan_rejection::PlanRejection;
use crate::model::{PoolKind, QuotaDimension};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How many candidates a plan evaluated and why the ones it passed over
/// were rejected.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanMetric {
    /// Nodes looked at.
    pub nodes_evaluated: u32,
    /// GPUs looked at.
    pub gpus_evaluated: u32,
    /// How many candidates failed on each GPU dimension.
    pub exhausted: BTreeMap<GpuDimension, u32>,
    /// Pool kinds whose quota refused a candidate that had room.
    pub quota_exhausted: BTreeMap<PoolKind, QuotaDimension>,
}

impl From<&PlanRejection> for PlanMetric {
    fn from(r: &PlanRejection) -> Self {
        PlanMetric {
            nodes_evaluated: r.nodes_evaluated,
            gpus_evaluated: r.gpus_evaluated,
            exhausted: r.exhausted.clone(),
            quota_exhausted: r.quota_exhausted.clone(),
        }
    }
}
