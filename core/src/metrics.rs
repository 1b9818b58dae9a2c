//! Prometheus exposition shared by the replica and the agent (cargo
//! feature `metrics`, off by default so the core stays pure).
//!
//! ```text
//!   process: one prometheus::Registry ── counters, histograms, gshare_build_info
//!                     │ gather()
//!   scrape:  Sampler ─┼─ figures read from the state at scrape time (gauges,
//!                     │  counters kept elsewhere as atomics), with HELP/TYPE
//!                     ▼  from their `Series`
//!            exposition(): sorted, empty families dropped, tenant-labelled
//!                          families dropped unless the caller may see them
//! ```
//!
//! Conventions: base units (`_seconds`, `_bytes`, `_ratio`), counters end in
//! `_total` and are typed `counter`, every family has `# HELP` and `# TYPE`
//! ([`check_exposition`] says where a text breaks them). Label sets are
//! bounded: [`FunctionLabels`] keeps at most [`FunctionLabels::MAX_FUNCTIONS`]
//! (tenant, function) pairs and [`FunctionLabels::MAX_TENANTS`] tenants;
//! beyond, the pair is counted under function [`OTHER`] (and tenant
//! [`OTHER`]).

pub use prometheus;

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{IntGaugeVec, Opts, Registry};
use std::collections::{BTreeMap, BTreeSet};

/// The label value that collects what is past a bound (names cannot
/// start with `_`, so it is never a real tenant or function).
pub const OTHER: &str = "_other";

/// The label naming a tenant; families that carry it follow the metrics
/// token rule ([`exposition`]'s `with_tenants`).
pub const TENANT_LABEL: &str = "tenant";

/// Buckets of invocation latency and queue wait, seconds (0.5 ms to 60 s).
pub const LATENCY_BUCKETS_SECONDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Buckets of cold-start and swap-in time, seconds (1 ms to 120 s).
pub const LOAD_BUCKETS_SECONDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Bytes in a MiB (for `_bytes` series of figures kept in MiB).
pub const MIB: f64 = 1_048_576.0;

/// Micro-seconds to seconds.
pub fn seconds_from_us(us: u64) -> f64 {
    us as f64 / 1e6
}

/// Milli-GPU to a ratio of one GPU (`1000` → `1.0`).
pub fn ratio_from_milli(milli: u64) -> f64 {
    milli as f64 / 1000.0
}

/// MiB to bytes.
pub fn bytes_from_mib(mib: u64) -> f64 {
    mib as f64 * MIB
}

/// Whether a sampled series counts up or goes both ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows (reset on restart); the name ends in `_total`.
    Counter,
    /// A figure that goes up and down.
    Gauge,
}

/// A family read from the state at scrape time: its name, help, type and
/// label names (in the order [`Sampler::add`] takes the values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Series {
    /// Full name, with unit suffix.
    pub name: &'static str,
    /// `# HELP` text.
    pub help: &'static str,
    /// `# TYPE`.
    pub kind: Kind,
    /// Label names.
    pub labels: &'static [&'static str],
}

impl Series {
    /// A counter series.
    pub const fn counter(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Series {
            name,
            help,
            kind: Kind::Counter,
            labels,
        }
    }

    /// A gauge series.
    pub const fn gauge(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Series {
            name,
            help,
            kind: Kind::Gauge,
            labels,
        }
    }
}

/// Collects the samples of [`Series`] during one scrape.
#[derive(Debug, Default)]
pub struct Sampler {
    families: BTreeMap<&'static str, MetricFamily>,
}

impl Sampler {
    /// An empty sampler.
    pub fn new() -> Self {
        Self::default()
    }

    /// One sample of `series` with `values` for its labels (extra or
    /// missing values are a bug of the caller: the shorter list wins).
    pub fn add(&mut self, series: &Series, values: &[&str], value: f64) {
        let family = self.families.entry(series.name).or_insert_with(|| {
            let mut f = MetricFamily::default();
            f.set_name(series.name.to_string());
            f.set_help(series.help.to_string());
            f.set_field_type(match series.kind {
                Kind::Counter => MetricType::COUNTER,
                Kind::Gauge => MetricType::GAUGE,
            });
            f
        });
        debug_assert_eq!(series.labels.len(), values.len(), "{}", series.name);
        let labels = series
            .labels
            .iter()
            .zip(values)
            .map(|(n, v)| {
                let mut l = LabelPair::default();
                l.set_name((*n).to_string());
                l.set_value((*v).to_string());
                l
            })
            .collect();
        let mut m = Metric::from_label(labels);
        match series.kind {
            Kind::Counter => {
                let mut c = Counter::default();
                c.set_value(value);
                m.set_counter(c);
            }
            Kind::Gauge => {
                let mut g = Gauge::default();
                g.set_value(value);
                m.set_gauge(g);
            }
        }
        family.mut_metric().push(m);
    }

    /// The families sampled.
    pub fn into_families(self) -> Vec<MetricFamily> {
        self.families.into_values().collect()
    }
}

/// Whether any sample of `family` has a [`TENANT_LABEL`].
pub fn has_tenant_label(family: &MetricFamily) -> bool {
    family
        .get_metric()
        .iter()
        .any(|m| m.get_label().iter().any(|l| l.name() == TENANT_LABEL))
}

/// The Prometheus text of `registry`'s families and `sampled`, sorted by
/// name; families without samples are left out, and so is every family
/// with a tenant label (samples, `# HELP` and `# TYPE`) unless
/// `with_tenants`.
pub fn exposition(
    registry: &Registry,
    sampled: Vec<MetricFamily>,
    with_tenants: bool,
) -> Result<String, prometheus::Error> {
    let mut families = registry.gather();
    families.extend(sampled);
    families.retain(|f| !f.get_metric().is_empty() && (with_tenants || !has_tenant_label(f)));
    families.sort_by(|a, b| a.name().cmp(b.name()));
    prometheus::TextEncoder::new().encode_to_string(&families)
}

/// Registers `gshare_build_info{component, version}` (always 1) in `registry`.
pub fn register_build_info(registry: &Registry, component: &str) -> prometheus::Result<()> {
    let g = IntGaugeVec::new(
        Opts::new(
            "gshare_build_info",
            "Always 1; the labels say which gshare process and version this is",
        ),
        &["component", "version"],
    )?;
    g.with_label_values(&[component, env!("CARGO_PKG_VERSION")])
        .set(1);
    registry.register(Box::new(g))
}

/// The bounded set of (tenant, function) label pairs of one process.
///
/// The first [`Self::MAX_FUNCTIONS`] distinct pairs seen keep their own
/// labels; a later pair is labelled (tenant, [`OTHER`]), and a tenant past
/// the first [`Self::MAX_TENANTS`] becomes ([`OTHER`], [`OTHER`]). So a
/// histogram family by tenant, function and tier has at most
/// `(MAX_FUNCTIONS + MAX_TENANTS + 1) × 4` label sets, whatever tenants deploy.
#[derive(Debug, Clone, Default)]
pub struct FunctionLabels {
    kept: BTreeSet<(String, String)>,
    tenants: BTreeSet<String>,
}

impl FunctionLabels {
    /// Distinct (tenant, function) pairs with their own labels.
    pub const MAX_FUNCTIONS: usize = 200;
    /// Distinct tenants with their own label.
    pub const MAX_TENANTS: usize = 100;

    /// No pair seen yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The (tenant, function) label values for `tenant`'s `function`.
    pub fn label<'a>(&mut self, tenant: &'a str, function: &'a str) -> (&'a str, &'a str) {
        let key = (tenant.to_string(), function.to_string());
        if self.kept.contains(&key) {
            return (tenant, function);
        }
        let tenant_known = self.tenants.contains(tenant);
        if !tenant_known && self.tenants.len() >= Self::MAX_TENANTS {
            return (OTHER, OTHER);
        }
        if !tenant_known {
            self.tenants.insert(tenant.to_string());
        }
        if self.kept.len() >= Self::MAX_FUNCTIONS {
            return (tenant, OTHER);
        }
        self.kept.insert(key);
        (tenant, function)
    }
}

/// Where the Prometheus text `text` breaks the conventions: a sample
/// whose family has no `# HELP` or `# TYPE`, a counter whose name does not
/// end in `_total`, a `_total` series not typed counter, a family typed
/// twice, or a line that is not a sample. Empty when it keeps them.
pub fn check_exposition(text: &str) -> Vec<String> {
    let mut help = BTreeSet::new();
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut problems = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            help.insert(name.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let (name, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            if types.insert(name.to_string(), kind.to_string()).is_some() {
                problems.push(format!("{name}: typed twice"));
            }
            if kind == "counter" && !name.ends_with("_total") {
                problems.push(format!(
                    "{name}: a counter whose name does not end in _total"
                ));
            }
            if name.ends_with("_total") && kind != "counter" {
                problems.push(format!("{name}: ends in _total but is typed {kind}"));
            }
        } else if line.starts_with('#') {
            continue;
        } else {
            let Some(sample) = sample_name(line) else {
                problems.push(format!("not a sample: {line}"));
                continue;
            };
            let family = family_of(sample, &types);
            if !types.contains_key(family) {
                problems.push(format!("{sample}: no # TYPE before its samples"));
            }
            if !help.contains(family) {
                problems.push(format!("{sample}: no # HELP before its samples"));
            }
        }
    }
    problems.dedup();
    problems
}

/// The family a sample name belongs to (`x_bucket`, `x_sum`, `x_count` of
/// a histogram `x`).
fn family_of<'a>(sample: &'a str, types: &BTreeMap<String, String>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = sample.strip_suffix(suffix) {
            if types
                .get(base)
                .is_some_and(|k| k == "histogram" || k == "summary")
            {
                return base;
            }
        }
    }
    sample
}

/// The metric name of a sample line (`name{labels} value` or `name value`).
fn sample_name(line: &str) -> Option<&str> {
    let end = line.find(['{', ' '])?;
    let name = &line[..end];
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    ok.then_some(name)
}

/// Every sample name in the Prometheus text `text` (histograms give
/// `x_bucket`, `x_sum` and `x_count`), and the family names typed in it.
pub fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            names.extend(rest.split(' ').next().map(str::to_string));
        } else if !line.starts_with('#') {
            names.extend(sample_name(line).map(str::to_string));
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{HistogramOpts, HistogramVec, IntCounter};

    const HELD: Series = Series::gauge("t_held_bytes", "held", &[TENANT_LABEL, "pool_kind"]);
    const SEEN: Series = Series::counter("t_seen_total", "seen", &[]);

    #[test]
    fn the_exposition_has_help_and_type_and_hides_tenant_families_without_leave() {
        let r = Registry::new();
        register_build_info(&r, "test").unwrap();
        let c = IntCounter::new("t_placed_total", "placed").unwrap();
        r.register(Box::new(c.clone())).unwrap();
        c.inc_by(3);
        let h = HistogramVec::new(
            HistogramOpts::new("t_latency_seconds", "latency")
                .buckets(LATENCY_BUCKETS_SECONDS.to_vec()),
            &[TENANT_LABEL, "function", "tier"],
        )
        .unwrap();
        r.register(Box::new(h.clone())).unwrap();
        h.with_label_values(&["acme", "hello", "guaranteed"])
            .observe(0.003);
        let sampled = || {
            let mut s = Sampler::new();
            s.add(&HELD, &["acme", "edge"], bytes_from_mib(2));
            s.add(&SEEN, &[], 7.0);
            s.into_families()
        };
        let full = exposition(&r, sampled(), true).unwrap();
        assert_eq!(check_exposition(&full), Vec::<String>::new(), "{full}");
        for want in [
            "# TYPE t_placed_total counter\nt_placed_total 3\n",
            "t_held_bytes{tenant=\"acme\",pool_kind=\"edge\"} 2097152\n",
            "# TYPE t_seen_total counter\nt_seen_total 7\n",
            "t_latency_seconds_bucket{function=\"hello\",tenant=\"acme\",tier=\"guaranteed\",le=\"0.005\"} 1\n",
            "gshare_build_info{component=\"test\",version=\"",
        ] {
            assert!(full.contains(want), "{want} missing in {full}");
        }
        let public = exposition(&r, sampled(), false).unwrap();
        assert_eq!(check_exposition(&public), Vec::<String>::new(), "{public}");
        assert!(
            !public.contains("acme") && !public.contains("tenant="),
            "{public}"
        );
        assert!(
            !public.contains("t_held_bytes") && !public.contains("t_latency"),
            "{public}"
        );
        assert!(public.contains("t_placed_total 3\n"), "{public}");
        let names = exported_names(&full);
        for n in [
            "t_latency_seconds_bucket",
            "t_latency_seconds_count",
            "t_held_bytes",
        ] {
            assert!(names.contains(n), "{n}: {names:?}");
        }
    }

    #[test]
    fn check_exposition_names_each_breach() {
        let bad = "# TYPE a_total gauge\na_total 1\n# HELP b b\n# TYPE b counter\nb 2\nc 3\n";
        let p = check_exposition(bad);
        let joined = p.join("\n");
        for want in [
            "a_total: ends in _total but is typed gauge",
            "a_total: no # HELP",
            "b: a counter whose name does not end in _total",
            "c: no # TYPE",
        ] {
            assert!(joined.contains(want), "{want} missing in {joined}");
        }
        assert!(check_exposition("# HELP x x\n# TYPE x gauge\nx{a=\"1\"} 2\n").is_empty());
    }

    #[test]
    fn function_labels_stay_within_their_bound() {
        let mut l = FunctionLabels::new();
        assert_eq!(l.label("acme", "f0"), ("acme", "f0"));
        let mut distinct = BTreeSet::new();
        for t in 0..150 {
            for f in 0..20 {
                let (t, f) = (format!("t{t}"), format!("f{f}"));
                let (tenant, function) = l.label(&t, &f);
                distinct.insert((tenant.to_string(), function.to_string()));
            }
        }
        assert!(
            distinct.len() <= FunctionLabels::MAX_FUNCTIONS + FunctionLabels::MAX_TENANTS + 1,
            "{}",
            distinct.len()
        );
        // Kept pairs stay kept; a new pair of a known tenant is `_other`.
        assert_eq!(l.label("acme", "f0"), ("acme", "f0"));
        assert_eq!(l.label("acme", "brand-new"), ("acme", OTHER));
        assert_eq!(l.label("tenant-past-the-bound", "f"), (OTHER, OTHER));
    }
}
