//! Reading and validating a topology file into a [`Topology`].
//!
//! Two passes over one [`Issues`] sink, so that every mistake of the file
//! comes out at once:
//!
//! ```text
//!   TableReader ──▶ raw structs (Field<T>: value or None, key path, span)
//!        │ unknown / missing keys, wrong types, integers that do not fit
//!        ▼
//!   validate ──▶ Topology
//!          ranges, names, duplicates, GPU model references, pool kinds,
//!          tier discounts, prices for every (GPU model, pool kind) in use
//! ```
//!
//! A value that failed the first pass is `None` in the second and is not
//! checked again, so each mistake is reported once.

use super::error::{ConfigError, IssueKind};
use super::gpu_model::GpuModel;
use super::loading::{ColdStart, SwapCost};
use super::names::check_name;
use super::node::{GpuGroup, Node};
use super::pool::Pool;
use super::pricing::{Price, PriceList, BP_PER_WHOLE, MAX_PRICE};
use super::reader::{check_range, parse_document, quote, Field, Issues, Loc, TableReader};
use super::topology::Topology;
use crate::bounds::{MAX_GPU_MEMORY_MIB, MAX_UNITS_PER_CURRENCY};
use crate::model::{Micros, NodeId, PoolKind, RegionPolicy, Tier};
use std::collections::{BTreeMap, HashMap};

/// Largest bandwidth accepted (host-to-device or storage), MiB/s (~1 TiB/s).
const MAX_BANDWIDTH_MIB_PER_S: u64 = 1 << 20;
/// Largest fixed setup time accepted, µs (one hour).
const MAX_SETUP_US: Micros = 3_600_000_000;
/// Most GPUs in one group of one node.
const MAX_GPUS_PER_GROUP: u32 = 64;
/// Largest host resource accepted: CPU milli-cores or RAM MiB (2^40).
const MAX_HOST: u64 = 1 << 40;

struct RawModel {
    name: Field<String>,
    memory_mib: Field<u64>,
    h2d_mib_per_s: Field<u64>,
}

/// Cold-start and swap settings at one level (region, pool or node); at
/// pool and node level every key is optional and overrides the level above.
#[derive(Default)]
struct RawLoading {
    cold_setup_us: Option<Field<u64>>,
    storage_mib_per_s: Option<Field<u64>>,
    swap_setup_us: Option<Field<u64>>,
}

struct RawGroup {
    at: Loc,
    model: Field<String>,
    count: Field<u32>,
    memory_mib: Field<u64>,
    h2d_mib_per_s: Field<u64>,
}

struct RawNode {
    name: Field<String>,
    cpu_milli: Field<u64>,
    memory_mib: Field<u64>,
    swap_mib: Field<u64>,
    gpus: Vec<RawGroup>,
    loading: RawLoading,
}

struct RawPool {
    name: Field<String>,
    kind: Field<String>,
    nodes: Vec<RawNode>,
    /// Where `nodes` is; `None` when the key is absent (already reported).
    nodes_at: Option<Loc>,
    loading: RawLoading,
}

struct RawPrice {
    gpu_model: Field<String>,
    pool_kind: Field<String>,
    gpu_hour: Field<u64>,
    memory_gib_hour: Field<u64>,
}

struct RawPricing {
    currency: Field<String>,
    unit: Field<String>,
    units_per_currency: Field<u64>,
    discounts: Vec<(Tier, Field<u32>)>,
    prices: Vec<RawPrice>,
    prices_at: Loc,
}

struct RawTopology {
    models: Vec<RawModel>,
    loading: RawLoading,
    pools: Vec<RawPool>,
    /// Where `pools` is; `None` when the key is absent (already reported).
    pools_at: Option<Loc>,
    pricing: Option<RawPricing>,
    /// `[placement] policy`, when given.
    placement: Option<Field<String>>,
}

/// Parses and validates the topology file `file` whose text is `src`.
pub fn parse_topology(file: &str, src: &str) -> Result<Topology, ConfigError> {
    let mut issues = Issues::new(src);
    let Some(doc) = parse_document(src, &mut issues) else {
        return Err(issues.into_error(file));
    };
    let raw = read_topology(&mut issues, TableReader::root(&doc));
    let topology = validate(&mut issues, raw);
    match topology {
        Some(t) if issues.is_empty() => Ok(t),
        _ => Err(issues.into_error(file)),
    }
}

/// Parses and validates a file holding only a `[pricing]` table (same
/// schema as in a topology file). GPU model names are checked for form
/// only: there is no catalog to check them against, nor pools whose prices
/// must be present (see [`Topology::unpriced`]).
pub fn parse_price_list(file: &str, src: &str) -> Result<PriceList, ConfigError> {
    let mut is = Issues::new(src);
    let Some(doc) = parse_document(src, &mut is) else {
        return Err(is.into_error(file));
    };
    let mut root = TableReader::root(&doc);
    let raw = root
        .table(&mut is, "pricing", true)
        .map(|t| read_pricing(&mut is, t));
    root.finish(&mut is);
    let list = raw.map(|r| validate_pricing(&mut is, r, None, &BTreeMap::new()));
    match list {
        Some(l) if is.is_empty() => Ok(l),
        _ => Err(is.into_error(file)),
    }
}

// ---- first pass: shape and types -------------------------------------------

fn read_topology(is: &mut Issues<'_>, mut root: TableReader<'_, '_>) -> RawTopology {
    let models = root
        .tables(is, "gpu_models", true)
        .into_iter()
        .map(|mut t| {
            let m = RawModel {
                name: t.string(is, "name", true),
                memory_mib: t.uint(is, "memory_mib", true),
                h2d_mib_per_s: t.uint(is, "h2d_mib_per_s", true),
            };
            t.finish(is);
            m
        })
        .collect();
    let loading = read_loading(is, &mut root, true);
    let pools_at = root.has("pools").then(|| root.loc_of("pools"));
    let pools = root
        .tables(is, "pools", true)
        .into_iter()
        .map(|t| read_pool(is, t))
        .collect();
    let pricing = root.table(is, "pricing", true).map(|t| read_pricing(is, t));
    let placement = root.table(is, "placement", false).and_then(|mut t| {
        let policy = t.has("policy").then(|| t.string(is, "policy", true));
        t.finish(is);
        policy
    });
    root.finish(is);
    RawTopology {
        models,
        loading,
        pools,
        pools_at,
        pricing,
        placement,
    }
}

/// Reads `cold_start = { setup_us, storage_mib_per_s }` and `swap = { setup_us }`
/// of one level; `required` at the top (region defaults), optional below.
fn read_loading(is: &mut Issues<'_>, t: &mut TableReader<'_, '_>, required: bool) -> RawLoading {
    let mut out = RawLoading::default();
    // An absent optional key stays `None` (inherit); a present one is a
    // `Field` whose `v` is `None` only when its value was unusable.
    let key = |is: &mut Issues<'_>, t: &mut TableReader<'_, '_>, k: &'static str| {
        let f = t.uint(is, k, required);
        (required || t.has(k)).then_some(f)
    };
    if let Some(mut c) = t.table(is, "cold_start", required) {
        out.cold_setup_us = key(is, &mut c, "setup_us");
        out.storage_mib_per_s = key(is, &mut c, "storage_mib_per_s");
        c.finish(is);
    }
    if let Some(mut s) = t.table(is, "swap", required) {
        out.swap_setup_us = key(is, &mut s, "setup_us");
        s.finish(is);
    }
    out
}

fn read_pool(is: &mut Issues<'_>, mut t: TableReader<'_, '_>) -> RawPool {
    let name = t.string(is, "name", true);
    let kind = t.string(is, "kind", true);
    let loading = read_loading(is, &mut t, false);
    let nodes_at = t.has("nodes").then(|| t.loc_of("nodes"));
    let nodes = t
        .tables(is, "nodes", true)
        .into_iter()
        .map(|n| read_node(is, n))
        .collect();
    t.finish(is);
    RawPool {
        name,
        kind,
        nodes,
        nodes_at,
        loading,
    }
}

fn read_node(is: &mut Issues<'_>, mut t: TableReader<'_, '_>) -> RawNode {
    let name = t.string(is, "name", true);
    let cpu_milli = t.uint(is, "cpu_milli", true);
    let memory_mib = t.uint(is, "memory_mib", true);
    let swap_mib = t.uint(is, "swap_mib", true);
    let loading = read_loading(is, &mut t, false);
    let gpus = t
        .tables(is, "gpus", false)
        .into_iter()
        .map(|mut g| {
            let group = RawGroup {
                at: g.loc().clone(),
                model: g.string(is, "model", true),
                count: g.uint(is, "count", true),
                memory_mib: g.uint(is, "memory_mib", false),
                h2d_mib_per_s: g.uint(is, "h2d_mib_per_s", false),
            };
            g.finish(is);
            group
        })
        .collect();
    t.finish(is);
    RawNode {
        name,
        cpu_milli,
        memory_mib,
        swap_mib,
        gpus,
        loading,
    }
}

fn read_pricing(is: &mut Issues<'_>, mut t: TableReader<'_, '_>) -> RawPricing {
    let currency = t.string(is, "currency", true);
    let unit = t.string(is, "unit", true);
    let units_per_currency = t.uint(is, "units_per_currency", true);
    let mut discounts = Vec::new();
    if let Some(mut tiers) = t.table(is, "tiers", true) {
        for tier in Tier::ALL {
            if let Some(mut one) = tiers.table(is, tier.as_str(), true) {
                discounts.push((tier, one.uint(is, "discount_bp", true)));
                one.finish(is);
            }
        }
        tiers.finish(is);
    }
    let prices_at = t.loc_of("prices");
    let prices = t
        .tables(is, "prices", true)
        .into_iter()
        .map(|mut p| {
            let price = RawPrice {
                gpu_model: p.string(is, "gpu_model", true),
                pool_kind: p.string(is, "pool_kind", true),
                gpu_hour: p.uint(is, "gpu_hour", true),
                memory_gib_hour: p.uint(is, "memory_gib_hour", true),
            };
            p.finish(is);
            price
        })
        .collect();
    t.finish(is);
    RawPricing {
        currency,
        unit,
        units_per_currency,
        discounts,
        prices,
        prices_at,
    }
}

// ---- second pass: meaning ----------------------------------------------------

/// Cold-start and swap values in force at one level (`None`: unusable, reported).
#[derive(Clone, Copy)]
struct Loading {
    cold_setup_us: Option<u64>,
    storage_mib_per_s: Option<u64>,
    swap_setup_us: Option<u64>,
}

impl Loading {
    /// This level's values, each overridden by `raw` where it sets one.
    fn overridden(self, is: &mut Issues<'_>, raw: &RawLoading) -> Loading {
        let pick = |is: &mut Issues<'_>, f: &Option<Field<u64>>, lo, hi, above| match f {
            Some(f) if f.v.is_some() => check_range(is, f, lo, hi),
            Some(_) => None,
            None => above,
        };
        Loading {
            cold_setup_us: pick(is, &raw.cold_setup_us, 0, MAX_SETUP_US, self.cold_setup_us),
            storage_mib_per_s: pick(
                is,
                &raw.storage_mib_per_s,
                1,
                MAX_BANDWIDTH_MIB_PER_S,
                self.storage_mib_per_s,
            ),
            swap_setup_us: pick(is, &raw.swap_setup_us, 0, MAX_SETUP_US, self.swap_setup_us),
        }
    }
}

/// Reports a second use of `name` (first seen at `first`).
fn check_unique(
    is: &mut Issues<'_>,
    seen: &mut HashMap<String, String>,
    name: &str,
    f: &Field<String>,
    what: &str,
) -> bool {
    if let Some(first) = seen.get(name) {
        is.report(
            &f.at,
            IssueKind::Duplicate,
            format!("duplicate {what} name, first defined at {first}"),
            Some(quote(name)),
        );
        false
    } else {
        seen.insert(name.to_string(), f.at.path.clone());
        true
    }
}

fn parse_kind(is: &mut Issues<'_>, f: &Field<String>) -> Option<PoolKind> {
    let s = f.v.as_ref()?;
    match s.parse::<PoolKind>() {
        Ok(k) => Some(k),
        Err(_) => {
            is.report(
                &f.at,
                IssueKind::Invalid,
                "unknown pool kind (expected one of: center, edge)".to_string(),
                Some(quote(s)),
            );
            None
        }
    }
}

fn parse_placement(is: &mut Issues<'_>, f: &Field<String>) -> Option<RegionPolicy> {
    let s = f.v.as_ref()?;
    s.parse::<RegionPolicy>()
        .map_err(|message| is.report(&f.at, IssueKind::Invalid, message, Some(quote(s))))
        .ok()
}

fn validate(is: &mut Issues<'_>, raw: RawTopology) -> Option<Topology> {
    // GPU models.
    let mut models: BTreeMap<String, GpuModel> = BTreeMap::new();
    let mut seen = HashMap::new();
    for m in &raw.models {
        let name = check_name(is, &m.name);
        let memory_mib = check_range(is, &m.memory_mib, 1, MAX_GPU_MEMORY_MIB);
        let h2d = check_range(is, &m.h2d_mib_per_s, 1, MAX_BANDWIDTH_MIB_PER_S);
        let Some(name) = name else { continue };
        if !check_unique(is, &mut seen, &name, &m.name, "GPU model") {
            continue;
        }
        models.insert(
            name.clone(),
            GpuModel {
                name,
                memory_mib: memory_mib.unwrap_or(0),
                h2d_mib_per_s: h2d.unwrap_or(0),
            },
        );
    }
    let model_list = models.keys().cloned().collect::<Vec<_>>().join(", ");

    // Region-wide cold-start and swap defaults.
    let region = Loading {
        cold_setup_us: None,
        storage_mib_per_s: None,
        swap_setup_us: None,
    }
    .overridden(is, &raw.loading);

    // Pools, nodes, GPUs.
    if let (true, Some(at)) = (raw.pools.is_empty(), &raw.pools_at) {
        is.report(
            at,
            IssueKind::OutOfRange,
            "a region needs at least one pool".to_string(),
            None,
        );
    }
    let mut pools = Vec::new();
    let mut pool_names = HashMap::new();
    let mut node_names = HashMap::new();
    // (model, kind) -> path of its first use.
    let mut in_use: BTreeMap<(String, PoolKind), String> = BTreeMap::new();
    for p in &raw.pools {
        let name = check_name(is, &p.name);
        if let Some(n) = &name {
            check_unique(is, &mut pool_names, n, &p.name, "pool");
        }
        let kind = parse_kind(is, &p.kind);
        if let (true, Some(at)) = (p.nodes.is_empty(), &p.nodes_at) {
            is.report(
                at,
                IssueKind::OutOfRange,
                "a pool needs at least one node".to_string(),
                None,
            );
        }
        let pool_loading = region.overridden(is, &p.loading);
        let mut nodes = Vec::new();
        for n in &p.nodes {
            let node_name = check_name(is, &n.name);
            if let Some(nn) = &node_name {
                check_unique(is, &mut node_names, nn, &n.name, "node");
                if super::names::replica_id(nn).is_some() {
                    is.report(
                        &n.name.at,
                        IssueKind::Invalid,
                        "names `r<number>` are the replicas' (their certificates'): a node's agent certificate named so would speak the replicas' protocol".to_string(),
                        Some(quote(nn)),
                    );
                }
            }
            let cpu_milli = check_range(is, &n.cpu_milli, 1, MAX_HOST);
            let memory_mib = check_range(is, &n.memory_mib, 1, MAX_HOST);
            let swap_mib = check_range(is, &n.swap_mib, 0, MAX_HOST);
            if let (Some(mem), Some(swap)) = (memory_mib, swap_mib) {
                if swap > mem {
                    let got = is.written_or(&n.swap_mib.at, swap);
                    is.report(
                        &n.swap_mib.at,
                        IssueKind::Inconsistent,
                        format!("swap space cannot exceed the node's host memory_mib ({mem})"),
                        Some(got),
                    );
                }
            }
            let loading = pool_loading.overridden(is, &n.loading);
            let mut gpus = Vec::new();
            for g in &n.gpus {
                let count = check_range(is, &g.count, 1, MAX_GPUS_PER_GROUP);
                let mem = match g.memory_mib.v {
                    Some(_) => check_range(is, &g.memory_mib, 1, MAX_GPU_MEMORY_MIB),
                    None => None,
                };
                let h2d = match g.h2d_mib_per_s.v {
                    Some(_) => check_range(is, &g.h2d_mib_per_s, 1, MAX_BANDWIDTH_MIB_PER_S),
                    None => None,
                };
                let Some(model_name) = g.model.v.as_ref() else {
                    continue;
                };
                let Some(model) = models.get(model_name) else {
                    is.report(
                        &g.model.at,
                        IssueKind::UnknownReference,
                        format!("unknown GPU model (expected one of: {model_list})"),
                        Some(quote(model_name)),
                    );
                    continue;
                };
                if let Some(k) = kind {
                    in_use
                        .entry((model_name.clone(), k))
                        .or_insert_with(|| g.at.path.clone());
                }
                gpus.push(GpuGroup {
                    model: model_name.clone(),
                    count: count.unwrap_or(0),
                    memory_mib: mem.unwrap_or(model.memory_mib),
                    h2d_mib_per_s: h2d.unwrap_or(model.h2d_mib_per_s),
                });
            }
            nodes.push(Node {
                name: NodeId(node_name.unwrap_or_default()),
                pool: name.clone().unwrap_or_default(),
                kind: kind.unwrap_or(PoolKind::Center),
                cpu_milli: cpu_milli.unwrap_or(0),
                memory_mib: memory_mib.unwrap_or(0),
                swap_mib: swap_mib.unwrap_or(0),
                gpus,
                cold_start: ColdStart {
                    setup_us: loading.cold_setup_us.unwrap_or(0),
                    storage_mib_per_s: loading.storage_mib_per_s.unwrap_or(1),
                },
                swap: SwapCost {
                    setup_us: loading.swap_setup_us.unwrap_or(0),
                },
            });
        }
        pools.push(Pool {
            name: name.unwrap_or_default(),
            kind: kind.unwrap_or(PoolKind::Center),
            nodes,
        });
    }

    let placement = match &raw.placement {
        Some(f) => parse_placement(is, f),
        None => Some(RegionPolicy::default()),
    };
    let pricing = raw
        .pricing
        .map(|r| validate_pricing(is, r, Some((&models, &model_list)), &in_use));
    let pricing = pricing?;
    if !is.is_empty() {
        return None;
    }
    let defaults = (
        ColdStart {
            setup_us: region.cold_setup_us.unwrap_or(0),
            storage_mib_per_s: region.storage_mib_per_s.unwrap_or(1),
        },
        SwapCost {
            setup_us: region.swap_setup_us.unwrap_or(0),
        },
    );
    Some(
        Topology::new(models.into_values().collect(), defaults, pools, pricing)
            .with_placement(placement.unwrap_or_default()),
    )
}

fn validate_pricing(
    is: &mut Issues<'_>,
    r: RawPricing,
    models: Option<(&BTreeMap<String, GpuModel>, &str)>,
    in_use: &BTreeMap<(String, PoolKind), String>,
) -> PriceList {
    if let Some(c) = &r.currency.v {
        let ok = (1..=16).contains(&c.len()) && c.chars().all(|ch| ch.is_ascii_alphanumeric());
        if !ok {
            is.report(
                &r.currency.at,
                IssueKind::Invalid,
                "a currency is 1 to 16 ASCII letters or digits, e.g. \"USD\"".to_string(),
                Some(quote(c)),
            );
        }
    }
    if let Some(u) = &r.unit.v {
        if u.trim().is_empty() || u.len() > 32 {
            is.report(
                &r.unit.at,
                IssueKind::Invalid,
                "a unit name is 1 to 32 characters, e.g. \"micro-USD\"".to_string(),
                Some(quote(u)),
            );
        }
    }
    let units_per_currency = check_range(is, &r.units_per_currency, 1, MAX_UNITS_PER_CURRENCY);

    // Discounts: each within 0..=10000 bp, never smaller than that of a
    // finer tier (compared with the last valid one above it).
    let mut discounts_bp = [0u32; 4];
    let mut previous: Option<(Tier, u32)> = None;
    for (tier, f) in &r.discounts {
        let Some(bp) = check_range(is, f, 0, BP_PER_WHOLE) else {
            continue;
        };
        discounts_bp[super::pricing::tier_index(*tier)] = bp;
        if let Some((prev_tier, prev_bp)) = previous {
            if bp < prev_bp {
                // The next tiers are compared with the larger discount.
                let got = is.written_or(&f.at, bp);
                is.report(
                    &f.at,
                    IssueKind::Inconsistent,
                    format!(
                        "a coarser tier may not cost more: discount must be at least {prev_tier}'s {prev_bp} bp"
                    ),
                    Some(got),
                );
                continue;
            }
        }
        previous = Some((*tier, bp));
    }

    // Prices.
    let mut prices = Vec::new();
    let mut seen: HashMap<(String, PoolKind), String> = HashMap::new();
    for p in &r.prices {
        let kind = parse_kind(is, &p.pool_kind);
        let gpu_hour = check_range(is, &p.gpu_hour, 0, MAX_PRICE);
        let memory = check_range(is, &p.memory_gib_hour, 0, MAX_PRICE);
        let Some(model) = p.gpu_model.v.as_ref() else {
            continue;
        };
        let unknown = models.and_then(|(m, list)| (!m.contains_key(model)).then_some(list));
        if models.is_none() && check_name(is, &p.gpu_model).is_none() {
            continue;
        }
        if let Some(model_list) = unknown {
            is.report(
                &p.gpu_model.at,
                IssueKind::UnknownReference,
                format!("unknown GPU model (expected one of: {model_list})"),
                Some(quote(model)),
            );
            continue;
        }
        let Some(kind) = kind else { continue };
        let key = (model.clone(), kind);
        if let Some(first) = seen.get(&key) {
            is.report(
                &p.gpu_model.at,
                IssueKind::Duplicate,
                format!("a second price for {model:?} in {kind} pools, first at {first}"),
                Some(quote(model)),
            );
            continue;
        }
        let parent = p
            .gpu_model
            .at
            .path
            .trim_end_matches(".gpu_model")
            .to_string();
        seen.insert(key, parent);
        prices.push(Price {
            gpu_model: model.clone(),
            pool_kind: kind,
            gpu_hour: gpu_hour.unwrap_or(0),
            memory_gib_hour: memory.unwrap_or(0),
        });
    }
    for ((model, kind), used_at) in in_use {
        if !seen.contains_key(&(model.clone(), *kind)) {
            is.report(
                &r.prices_at,
                IssueKind::MissingPrice,
                format!("no price for GPU model {model:?} in {kind} pools (used by {used_at})"),
                None,
            );
        }
    }
    PriceList {
        currency: r.currency.v.unwrap_or_default(),
        unit: r.unit.v.unwrap_or_default(),
        units_per_currency: units_per_currency.unwrap_or(1),
        discounts_bp,
        prices,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid one-pool topology that the tests below break one way each.
    const BASE: &str = r#"
[[gpu_models]]
name = "g"
memory_mib = 16_000
h2d_mib_per_s = 10_000

[cold_start]
setup_us = 1_000
storage_mib_per_s = 1_000

[swap]
setup_us = 10

[[pools]]
name = "p"
kind = "center"

[[pools.nodes]]
name = "n"
cpu_milli = 1_000
memory_mib = 1_000
swap_mib = 0
gpus = [{ model = "g", count = 1 }]

[pricing]
currency = "USD"
unit = "micro-USD"
units_per_currency = 1_000_000

[pricing.tiers]
exclusive = { discount_bp = 0 }
guaranteed = { discount_bp = 0 }
burstable = { discount_bp = 0 }
oversubscribed = { discount_bp = 0 }

[[pricing.prices]]
gpu_model = "g"
pool_kind = "center"
gpu_hour = 1
memory_gib_hour = 1
"#;

    /// The error lines of `BASE` with `from` replaced by `to`.
    fn errors_with(from: &str, to: &str) -> Vec<String> {
        assert!(BASE.contains(from), "{from}");
        let src = BASE.replacen(from, to, 1);
        match parse_topology("t.toml", &src) {
            Ok(_) => Vec::new(),
            Err(e) => e.to_string().lines().map(str::to_string).collect(),
        }
    }

    fn one_error(from: &str, to: &str, expected: &str) {
        let lines = errors_with(from, to);
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(lines[0].contains(expected), "{} !~ {expected}", lines[0]);
    }

    #[test]
    fn the_base_is_valid() {
        assert_eq!(errors_with("", ""), Vec::<String>::new());
    }

    #[test]
    fn shapes_and_types_are_checked() {
        one_error(
            "count = 1",
            "count = 1.5",
            "gpus[0].count: expected a non-negative integer, found a float (got 1.5)",
        );
        one_error(
            "count = 1",
            "count = 4_294_967_296",
            "gpus[0].count: must be from 0 to 4294967295 (got 4_294_967_296)",
        );
        one_error(
            "gpus = [{ model = \"g\", count = 1 }]",
            "gpus = [\"g\"]",
            "pools[0].nodes[0].gpus[0]: expected a table, found a string (got \"g\")",
        );
        one_error(
            "gpus = [{ model = \"g\", count = 1 }]",
            "gpus = 3",
            "pools[0].nodes[0].gpus: expected an array of tables, found an integer (got 3)",
        );
        let src = format!("swap = 10\n{}", BASE.replace("[swap]\nsetup_us = 10", ""));
        let e = parse_topology("t.toml", &src).unwrap_err().to_string();
        assert_eq!(
            e,
            "t.toml:1:8: swap: expected a table, found an integer (got 10)"
        );
        one_error(
            "kind = \"center\"",
            "kind = \"center\"\n\"my key\" = true",
            "pools[0].\"my key\": unknown key",
        );
    }

    #[test]
    fn the_placement_policy_is_optional_and_checked() {
        let base = parse_topology("t.toml", BASE).unwrap();
        assert_eq!(base.placement_policy(), RegionPolicy::Gshare);
        for (name, policy) in [
            ("bestfit", RegionPolicy::BestFit),
            ("fgd", RegionPolicy::Fgd),
            ("gshare", RegionPolicy::Gshare),
        ] {
            let src = format!("[placement]\npolicy = \"{name}\"\n{BASE}");
            let t = parse_topology("t.toml", &src).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(t.placement_policy(), policy);
        }
        // An unknown name, a typo in the key, and a mistake elsewhere: all
        // reported at once, each with its key path.
        let src = format!(
            "[placement]\npolicy = \"fgd2\"\npolcy = 1\n{}",
            BASE.replacen("count = 1", "count = 1.5", 1)
        );
        let e = parse_topology("t.toml", &src).unwrap_err().to_string();
        assert!(
            e.contains("t.toml:2:10: placement.policy: unknown placement policy (expected one of: bestfit, fgd, gshare) (got \"fgd2\")"),
            "{e}"
        );
        assert!(e.contains("placement.polcy: unknown key"), "{e}");
        assert!(e.contains("gpus[0].count"), "{e}");
        assert_eq!(e.lines().count(), 3, "{e}");
    }

    /// A replica's certificate is named `r<id>`, and an agent's its node:
    /// a node named so would get the replicas' protocol.
    #[test]
    fn a_node_may_not_take_a_replicas_name() {
        let src = BASE.replacen("name = \"n\"", "name = \"r2\"", 1);
        assert_ne!(src, BASE);
        let e = parse_topology("t.toml", &src).unwrap_err().to_string();
        assert!(e.contains("names `r<number>` are the replicas'"), "{e}");
        assert!(e.contains("(got \"r2\")"), "{e}");
        let src = BASE.replacen("name = \"n\"", "name = \"r2a\"", 1);
        parse_topology("t.toml", &src).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn empty_collections_are_refused() {
        let node = "[[pools.nodes]]\nname = \"n\"\ncpu_milli = 1_000\nmemory_mib = 1_000\nswap_mib = 0\ngpus = [{ model = \"g\", count = 1 }]";
        one_error(
            node,
            "nodes = []",
            "t.toml:18:9: pools[0].nodes: a pool needs at least one node",
        );
        let rest = BASE
            .replace("[[pools]]\nname = \"p\"\nkind = \"center\"\n", "")
            .replace(node, "");
        let src = format!("pools = []\n{rest}");
        let e = parse_topology("t.toml", &src).unwrap_err().to_string();
        assert!(e.contains("pools: a region needs at least one pool"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }

    #[test]
    fn names_and_references_are_checked() {
        one_error("name = \"p\"", "name = \"p q\"", "pools[0].name: a name is");
        one_error(
            "pool_kind = \"center\"",
            "pool_kind = \"edge\"",
            "no price for GPU model \"g\" in center pools (used by pools[0].nodes[0].gpus[0])",
        );
        one_error(
            "currency = \"USD\"",
            "currency = \"US Dollar\"",
            "pricing.currency: a currency is",
        );
        one_error("oversubscribed = { discount_bp = 0 }", "oversubscribed = { discount_bp = 0 }\ngold = { discount_bp = 0 }", "pricing.tiers.gold: unknown key (expected one of: exclusive, guaranteed, burstable, oversubscribed)");
        one_error(
            "oversubscribed = { discount_bp = 0 }",
            "",
            "pricing.tiers.oversubscribed: missing required key",
        );
        one_error(
            "swap_mib = 0",
            "swap_mib = 0\ncold_start = { storage_mib_per_s = 0 }",
            "pools[0].nodes[0].cold_start.storage_mib_per_s: must be from 1 to",
        );
    }

    #[test]
    fn a_second_price_for_the_same_pair_is_a_duplicate() {
        let dup = "[[pricing.prices]]\ngpu_model = \"g\"\npool_kind = \"center\"\ngpu_hour = 1\nmemory_gib_hour = 1\n";
        let src = format!("{BASE}{dup}");
        let e = parse_topology("t.toml", &src).unwrap_err();
        assert_eq!(e.issues.len(), 1, "{e}");
        assert_eq!(e.issues[0].kind, IssueKind::Duplicate);
        assert_eq!(e.issues[0].path, "pricing.prices[1].gpu_model");
        assert!(e.to_string().contains("first at pricing.prices[0]"), "{e}");
    }

    #[test]
    fn prices_above_the_cap_are_refused() {
        one_error(
            "gpu_hour = 1",
            "gpu_hour = 1_000_000_000_001",
            "pricing.prices[0].gpu_hour: must be from 0 to 1000000000000 (got 1_000_000_000_001)",
        );
    }
}
