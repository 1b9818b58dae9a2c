//! What the API keeps besides the replicated state: counters for
//! `/metrics` and the topology file to reload;
//! and [`public_series`], what `/metrics` shows a caller without a token.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use gshare_core::model::PoolKind;
use gshare_core::state::RegionState;

/// Per-replica API state shared by the handlers.
#[derive(Debug, Default)]
pub struct ApiState {
    /// The operator's topology file (`POST /v1/topology/reload` without a body).
    pub topology_file: Option<PathBuf>,
    /// Instances placed through this replica.
    pub placements: AtomicU64,
    /// Placements refused, by reason code.
    pub rejections: Mutex<BTreeMap<&'static str, u64>>,
    /// Re-plans (by the leader's scheduler) of deploys answered here,
    /// after apply refused a plan made on a changed view.
    pub replans: AtomicU64,
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

/// The Prometheus text `text` without any series that has a `tenant`
/// label (the samples, and the `# HELP`/`# TYPE` lines of families that
/// have such samples): what `/metrics` serves without a token.
pub fn public_series(text: &str) -> String {
    let family = |line: &str| -> String {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        line[..end].to_string()
    };
    let tenant_families: std::collections::BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && has_tenant_label(l))
        .map(family)
        .collect();
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let drop = match line
            .strip_prefix("# HELP ")
            .or(line.strip_prefix("# TYPE "))
        {
            Some(rest) => tenant_families.contains(&family(rest)),
            None => !line.starts_with('#') && has_tenant_label(line),
        };
        if !drop {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Whether the sample `line` (`name{a="x",b="y"} value`) has a label
/// named `tenant` (label values are read as quoted strings with escapes).
fn has_tenant_label(line: &str) -> bool {
    let Some(open) = line.find('{') else {
        return false;
    };
    if line.find(' ').is_some_and(|space| space < open) {
        return false;
    }
    let mut rest = &line[open + 1..];
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        let Some(eq) = rest.find('=') else {
            return false;
        };
        if rest[..eq].trim() == "tenant" {
            return true;
        }
        let Some(value) = rest[eq + 1..].strip_prefix('"') else {
            return false;
        };
        let mut escaped = false;
        let Some(close) = value.char_indices().find_map(|(i, c)| {
            let end = c == '"' && !escaped;
            escaped = c == '\\' && !escaped;
            end.then_some(i)
        }) else {
            return false;
        };
        rest = &value[close + 1..];
        if rest.starts_with('}') {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_series_drop_every_tenant_label() {
        let text = "# HELP a_total A\n# TYPE a_total counter\na_total 3\n\
                    # HELP t_mib T\n# TYPE t_mib gauge\nt_mib{tenant=\"acme\",pool_kind=\"edge\"} 5\n\
                    t_mib{pool_kind=\"center\",tenant=\"globex\"} 6\n\
                    g{agent=\"n,tenant=\\\"x\",gpu=\"0\"} 1\n\
                    r{reason=\"quota\"} 2\n";
        let out = public_series(text);
        assert!(
            !out.contains("acme") && !out.contains("globex") && !out.contains("t_mib"),
            "{out}"
        );
        for kept in [
            "# TYPE a_total counter\n",
            "a_total 3\n",
            "r{reason=\"quota\"} 2\n",
            "gpu=\"0\"} 1\n",
        ] {
            assert!(out.contains(kept), "{kept} missing in {out}");
        }
    }

    #[test]
    fn the_region_render_has_tenant_series_and_the_public_view_none() {
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
        let full = ApiState::default().render(&st);
        assert!(full.contains("tenant=\"acme\""), "{full}");
        let public = public_series(&full);
        assert!(
            !public.contains("acme") && !public.contains("tenant="),
            "{public}"
        );
        assert!(public.contains("gshare_region_instances 0\n"), "{public}");
    }
}
