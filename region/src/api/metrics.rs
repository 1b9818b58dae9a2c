//! What the API keeps besides the replicated state: the replica's one
//! Prometheus registry (counters of placements, refusals and re-plans,
//! `gshare_build_info`; other modules register theirs through
//! [`ApiState::registry`]) and the topology file to reload; and [`ApiState::sample`], the series read from the
//! replicated state at scrape time.

use std::path::PathBuf;

use gshare_core::metrics::prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use gshare_core::metrics::{
    bytes_from_mib, ratio_from_milli, FunctionLabels, Sampler, Series, OTHER, TENANT_LABEL,
};
use gshare_core::model::PoolKind;
use gshare_core::state::RegionState;

/// Instances in the replicated state.
pub const INSTANCES: Series = Series::gauge(
    "gshare_region_instances",
    "Instances in the replicated state",
    &[],
);
/// Compute a tenant holds, in GPUs (was `gshare_region_tenant_compute_milli`).
pub const TENANT_COMPUTE: Series = Series::gauge(
    "gshare_region_tenant_compute_gpus",
    "Compute a tenant holds, in GPUs (1 = one whole GPU), per pool kind",
    &[TENANT_LABEL, "pool_kind"],
);
/// GPU memory a tenant holds (was `gshare_region_tenant_memory_mib`).
pub const TENANT_MEMORY: Series = Series::gauge(
    "gshare_region_tenant_memory_bytes",
    "GPU memory a tenant holds, bytes, per pool kind",
    &[TENANT_LABEL, "pool_kind"],
);
/// Instances a tenant holds.
pub const TENANT_INSTANCES: Series = Series::gauge(
    "gshare_region_tenant_instances",
    "Instances a tenant holds, per pool kind",
    &[TENANT_LABEL, "pool_kind"],
);
/// Instances of a function (bounded: [`FunctionLabels`]).
pub const FUNCTION_INSTANCES: Series = Series::gauge(
    "gshare_region_function_instances",
    "Instances of a function in the replicated state (functions past the label bound add up under function=\"_other\")",
    &[TENANT_LABEL, "function", "tier"],
);
/// The least instances a function asks for.
pub const FUNCTION_MIN_INSTANCES: Series = Series::gauge(
    "gshare_region_function_min_instances",
    "The min_instances a function was deployed with (summed under function=\"_other\" past the label bound)",
    &[TENANT_LABEL, "function", "tier"],
);
/// A node's committed liveness (one series per state: 1 for its state).
pub const NODE_STATE: Series = Series::gauge(
    "gshare_region_node_state",
    "A node's committed liveness: 1 for the state it is in (pending, ready, not_ready), 0 for the others",
    &["pool", "node", "state"],
);
/// Whether the operator drains a node.
pub const NODE_DRAINING: Series = Series::gauge(
    "gshare_region_node_draining",
    "1 while the operator drains the node (no new placements), else 0",
    &["pool", "node"],
);
/// Nodes per committed liveness state.
pub const NODES: Series = Series::gauge(
    "gshare_region_nodes",
    "Nodes of the topology in each committed liveness state",
    &["state"],
);
/// Capacity of a GPU of the topology.
pub const GPU_MEMORY: Series = Series::gauge(
    "gshare_region_gpu_memory_bytes",
    "GPU memory of a GPU of the topology, bytes (0 while its agent did not find it)",
    &["pool", "node", "gpu"],
);
/// Compute reserved on a GPU.
pub const GPU_RESERVED_COMPUTE: Series = Series::gauge(
    "gshare_region_gpu_reserved_compute_ratio",
    "Compute the replicated state places on a GPU (reserved and burstable), ratio of the GPU (may exceed 1 when overcommitted)",
    &["pool", "node", "gpu"],
);
/// Memory reserved on a GPU.
pub const GPU_RESERVED_MEMORY: Series = Series::gauge(
    "gshare_region_gpu_reserved_memory_bytes",
    "GPU memory the replicated state reserves on a GPU (resident tiers), bytes",
    &["pool", "node", "gpu"],
);
/// Instances placed on a GPU.
pub const GPU_INSTANCES: Series = Series::gauge(
    "gshare_region_gpu_instances",
    "Instances the replicated state places on a GPU",
    &["pool", "node", "gpu"],
);

/// Per-replica API state shared by the handlers.
#[derive(Debug)]
pub struct ApiState {
    /// The operator's topology file (`POST /v1/topology/reload` without a body).
    pub topology_file: Option<PathBuf>,
    /// Instances placed through this replica.
    pub placements: IntCounter,
    /// Placements refused, by reason code.
    pub rejections: IntCounterVec,
    /// Re-plans (by the leader's scheduler) of deploys answered here,
    /// after apply refused a plan made on a changed view.
    pub replans: IntCounter,
    registry: Registry,
}

impl Default for ApiState {
    fn default() -> Self {
        ApiState::new(None)
    }
}

impl ApiState {
    /// API state reloading topology from `topology_file`, with the
    /// replica's registry and its counters registered.
    pub fn new(topology_file: Option<PathBuf>) -> Self {
        let registry = Registry::new();
        let placements = IntCounter::new(
            "gshare_region_placements_total",
            "Instances placed through this replica",
        )
        .expect("valid metric");
        let replans = IntCounter::new(
            "gshare_region_replans_total",
            "Re-plans after a stale-view refusal",
        )
        .expect("valid metric");
        let rejections = IntCounterVec::new(
            Opts::new(
                "gshare_region_placement_rejections_total",
                "Placements refused, by reason",
            ),
            &["reason"],
        )
        .expect("valid metric");
        for c in [placements.clone(), replans.clone()] {
            registry.register(Box::new(c)).expect("one registration");
        }
        registry
            .register(Box::new(rejections.clone()))
            .expect("one registration");
        gshare_core::metrics::register_build_info(&registry, "region").expect("one registration");
        ApiState {
            topology_file,
            placements,
            rejections,
            replans,
            registry,
        }
    }

    /// The replica's one registry: register a counter or histogram here
    /// once (at start) and `/metrics` shows it.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Counts a refused placement.
    pub fn reject(&self, code: &'static str) {
        self.rejections.with_label_values(&[code]).inc();
    }

    /// The series read from the replicated state `state`: instances, per
    /// tenant and pool kind what it holds, per function its instances
    /// (bounded by [`FunctionLabels`]), and per GPU of the topology its
    /// capacity and what is placed on it.
    pub fn sample(&self, state: &RegionState, out: &mut Sampler) {
        out.add(&INSTANCES, &[], state.instances().count() as f64);
        for t in state.tenants() {
            for kind in [PoolKind::Center, PoolKind::Edge] {
                let h = state.held(&t.id, kind);
                let labels = [t.id.0.as_str(), kind.as_str()];
                out.add(&TENANT_COMPUTE, &labels, ratio_from_milli(h.compute_milli));
                out.add(&TENANT_MEMORY, &labels, bytes_from_mib(h.memory_mib));
                out.add(&TENANT_INSTANCES, &labels, f64::from(h.instances));
            }
        }
        // Functions in a fixed order, so the same ones keep their labels
        // from one scrape to the next.
        let mut bound = FunctionLabels::new();
        let mut others: std::collections::BTreeMap<(&str, &str), (f64, f64)> = Default::default();
        let mut functions: Vec<_> = state.functions().map(|f| &f.spec).collect();
        functions.sort_by(|a, b| (&a.tenant.0, &a.name).cmp(&(&b.tenant.0, &b.name)));
        for f in functions {
            let count = f64::from(state.instance_count(&f.tenant, &f.name));
            let min = f64::from(f.min_instances);
            match bound.label(&f.tenant.0, &f.name) {
                (t, n) if n != OTHER => {
                    let labels = [t, n, f.tier.as_str()];
                    out.add(&FUNCTION_INSTANCES, &labels, count);
                    out.add(&FUNCTION_MIN_INSTANCES, &labels, min);
                }
                (t, _) => {
                    let e = others.entry((t, f.tier.as_str())).or_default();
                    e.0 += count;
                    e.1 += min;
                }
            }
        }
        for ((t, tier), (count, min)) in others {
            out.add(&FUNCTION_INSTANCES, &[t, OTHER, tier], count);
            out.add(&FUNCTION_MIN_INSTANCES, &[t, OTHER, tier], min);
        }
        let Some(topology) = state.topology() else {
            return;
        };
        let mut per_state = [0u32; gshare_core::state::NodeState::ALL.len()];
        for pool in topology.pools() {
            for node in &pool.nodes {
                let now = state.node_state(&node.name);
                for (i, s) in gshare_core::state::NodeState::ALL.into_iter().enumerate() {
                    let labels = [pool.name.as_str(), node.name.0.as_str(), s.as_str()];
                    out.add(&NODE_STATE, &labels, f64::from(u8::from(s == now)));
                    if s == now {
                        per_state[i] = per_state[i].saturating_add(1);
                    }
                }
                let draining = state.node_status(&node.name).is_some_and(|s| s.draining);
                out.add(
                    &NODE_DRAINING,
                    &[pool.name.as_str(), node.name.0.as_str()],
                    f64::from(u8::from(draining)),
                );
            }
        }
        for (s, n) in gshare_core::state::NodeState::ALL
            .into_iter()
            .zip(per_state)
        {
            out.add(&NODES, &[s.as_str()], f64::from(n));
        }
        for pool in topology.pools() {
            for node in &pool.nodes {
                let Some(load) = state.node_load(&node.name) else {
                    continue;
                };
                for (i, g) in load.gpus.iter().enumerate() {
                    let gpu = i.to_string();
                    let labels = [pool.name.as_str(), node.name.0.as_str(), gpu.as_str()];
                    let memory = if g.capacity.available {
                        g.capacity.memory_mib
                    } else {
                        0
                    };
                    out.add(&GPU_MEMORY, &labels, bytes_from_mib(memory));
                    let compute = if g.load.exclusive {
                        1000
                    } else {
                        u64::from(g.load.reserved_compute) + u64::from(g.load.burst_compute)
                    };
                    out.add(&GPU_RESERVED_COMPUTE, &labels, ratio_from_milli(compute));
                    out.add(
                        &GPU_RESERVED_MEMORY,
                        &labels,
                        bytes_from_mib(g.load.resident_mib),
                    );
                    out.add(&GPU_INSTANCES, &labels, g.instances.len() as f64);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gshare_core::metrics::{check_exposition, exposition};

    fn text(api: &ApiState, st: &RegionState, with_tenants: bool) -> String {
        let mut s = Sampler::new();
        api.sample(st, &mut s);
        exposition(api.registry(), s.into_families(), with_tenants).unwrap()
    }

    #[test]
    fn the_region_series_keep_the_conventions_and_the_public_view_has_no_tenant() {
        use gshare_core::model::{Quota, TenantId};
        use gshare_core::state::DomainCommand;
        let mut st = RegionState::default();
        st.apply(
            DomainCommand::TenantCreate {
                tenant: TenantId("acme".into()),
                display_name: None,
                quotas: [(PoolKind::Center, Quota::default())].into_iter().collect(),
            },
            1,
        )
        .unwrap();
        let api = ApiState::default();
        api.placements.inc_by(2);
        api.reject("quota_exceeded");
        let full = text(&api, &st, true);
        assert_eq!(check_exposition(&full), Vec::<String>::new(), "{full}");
        for want in [
            "gshare_region_tenant_memory_bytes{tenant=\"acme\",pool_kind=\"center\"} 0\n",
            "# TYPE gshare_region_placements_total counter\ngshare_region_placements_total 2\n",
            "gshare_region_placement_rejections_total{reason=\"quota_exceeded\"} 1\n",
            "gshare_build_info{component=\"region\",version=\"",
        ] {
            assert!(full.contains(want), "{want} missing in {full}");
        }
        let public = text(&api, &st, false);
        assert!(
            !public.contains("acme") && !public.contains("tenant="),
            "{public}"
        );
        assert!(public.contains("gshare_region_instances 0\n"), "{public}");
        assert_eq!(check_exposition(&public), Vec::<String>::new(), "{public}");
    }
}
