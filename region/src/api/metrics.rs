//! What the API keeps besides the replicated state: counters for
//! `/metrics`, the topology file to reload, and the planner's ranking cache.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gshare_core::model::PoolKind;
use gshare_core::state::{FragmentationAware, RegionState};

/// How long a cached [`FragmentationAware`] ranking (the shapes of the
/// deployed functions) is reused before it is rebuilt from the state.
const RANKING_TTL: Duration = Duration::from_secs(1);

/// Per-replica API state shared by the handlers.
#[derive(Debug, Default)]
pub struct ApiState {
    /// The operator's topology file (`POST /v1/topology/reload` without a body).
    pub topology_file: Option<PathBuf>,
    /// Instances placed through this replica.
    pub placements: AtomicU64,
    /// Placements refused, by reason code.
    pub rejections: Mutex<BTreeMap<&'static str, u64>>,
    /// Re-plans after apply refused a proposal planned on a stale view.
    pub replans: AtomicU64,
    /// Rotates where limited plans start scanning.
    pub plan_start: AtomicUsize,
    ranking: Mutex<Option<(Instant, Arc<FragmentationAware>)>>,
}

impl ApiState {
    /// API state reloading topology from `topology_file`.
    pub fn new(topology_file: Option<PathBuf>) -> Self {
        ApiState {
            topology_file,
            ..ApiState::default()
        }
    }

    /// Counts a refused placement.
    pub fn reject(&self, code: &'static str) {
        let mut r = self.rejections.lock().unwrap_or_else(|p| p.into_inner());
        *r.entry(code).or_default() += 1;
    }

    /// The fragmentation-aware ranking, rebuilt at most every [`RANKING_TTL`].
    pub fn ranking(&self, state: &RegionState) -> Arc<FragmentationAware> {
        let mut cache = self.ranking.lock().unwrap_or_else(|p| p.into_inner());
        match &*cache {
            Some((at, r)) if at.elapsed() < RANKING_TTL => r.clone(),
            _ => {
                let r = Arc::new(FragmentationAware::from_state(state));
                *cache = Some((Instant::now(), r.clone()));
                r
            }
        }
    }

    /// Prometheus text: placements, rejections by reason, and per-tenant
    /// usage (held compute, memory and instances per pool kind).
    pub fn render(&self, state: &RegionState) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP gshare_region_placements_total Instances placed through this replica"
        );
        let _ = writeln!(out, "# TYPE gshare_region_placements_total counter");
        let _ = writeln!(
            out,
            "gshare_region_placements_total {}",
            self.placements.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP gshare_region_replans_total Re-plans after a stale-view refusal"
        );
        let _ = writeln!(out, "# TYPE gshare_region_replans_total counter");
        let _ = writeln!(
            out,
            "gshare_region_replans_total {}",
            self.replans.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP gshare_region_placement_rejections_total Placements refused, by reason"
        );
        let _ = writeln!(
            out,
            "# TYPE gshare_region_placement_rejections_total counter"
        );
        for (code, n) in self
            .rejections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "gshare_region_placement_rejections_total{{reason=\"{code}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP gshare_region_instances Instances in the replicated state"
        );
        let _ = writeln!(out, "# TYPE gshare_region_instances gauge");
        let _ = writeln!(out, "gshare_region_instances {}", state.instances().count());
        for (name, help) in [
            (
                "gshare_region_tenant_compute_milli",
                "Compute (milli-GPU) a tenant holds",
            ),
            (
                "gshare_region_tenant_memory_mib",
                "GPU memory (MiB) a tenant holds",
            ),
            ("gshare_region_tenant_instances", "Instances a tenant holds"),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}, per pool kind");
            let _ = writeln!(out, "# TYPE {name} gauge");
            for t in state.tenants() {
                for kind in [PoolKind::Center, PoolKind::Edge] {
                    let h = state.held(&t.id, kind);
                    let v = match name {
                        "gshare_region_tenant_compute_milli" => h.compute_milli,
                        "gshare_region_tenant_memory_mib" => h.memory_mib,
                        _ => u64::from(h.instances),
                    };
                    let _ = writeln!(
                        out,
                        "{name}{{tenant=\"{}\",pool_kind=\"{}\"}} {v}",
                        t.id,
                        kind.as_str()
                    );
                }
            }
        }
        out
    }
}
