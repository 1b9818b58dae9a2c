//! The demo workload of `gsharectl up`: functions of the two tenants of
//! `configs/local/tenants.toml` on all four tiers, some pinned to the edge
//! pools and some to the center, sized to the local topology and quotas.
//!
//! `edge-a` (one 16 GiB GPU, 4 GiB of host memory for swapped-out
//! weights) gets a burstable function and two oversubscribed ones of
//! 16.5 GiB together: its agent swaps the oversubscribed ones in and out
//! (each fits in the host memory) while the load runs.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gshare_core::model::{Runtime, Tier};
use serde_json::{json, Value};

use super::api_client::ApiClient;
use crate::api::functions::{FunctionBody, LatencyBody};
use gshare_core::model::PoolPreference;

/// One demo function and the load it gets.
#[derive(Debug, Clone)]
pub struct DemoFunction {
    /// Owning tenant.
    pub tenant: &'static str,
    /// Name.
    pub name: &'static str,
    /// Tier.
    pub tier: Tier,
    /// `center` or `edge:<pool>`.
    pub pool: &'static str,
    /// Compute slice, milli-GPU.
    pub compute_milli: u32,
    /// GPU memory, MiB.
    pub memory_mib: u64,
    /// Per-request deadline, ms.
    pub deadline_ms: u64,
    /// Service time on a whole GPU, µs.
    pub full_gpu_us: u64,
    /// Concurrent clients during the load.
    pub clients: u32,
    /// Mean pause of a client between two invocations, ms.
    pub think_ms: u64,
    /// `min_instances`, `max_instances`.
    pub instances: (u32, u32),
    /// Idle time before the autoscaler scales it in (or to zero), s.
    pub idle_timeout_s: u64,
}

const fn f(
    tenant: &'static str,
    name: &'static str,
    tier: Tier,
    pool: &'static str,
    (compute_milli, memory_mib): (u32, u64),
    (deadline_ms, full_gpu_us): (u64, u64),
    (clients, think_ms): (u32, u64),
) -> DemoFunction {
    DemoFunction {
        tenant,
        name,
        tier,
        pool,
        compute_milli,
        memory_mib,
        deadline_ms,
        full_gpu_us,
        clients,
        think_ms,
        instances: (1, 1),
        idle_timeout_s: 3600,
    }
}

/// [`f`] with an instance range and an idle timeout: the autoscaler
/// changes its count.
const fn scaled(f: DemoFunction, instances: (u32, u32), idle_timeout_s: u64) -> DemoFunction {
    DemoFunction {
        instances,
        idle_timeout_s,
        ..f
    }
}

/// The demo functions. Per tenant and pool kind they stay within the
/// quotas of `configs/local/tenants.toml`; an exclusive instance holds its
/// whole GPU's memory (acme center 2000/3000 milli, 26624/32768 MiB; acme
/// edge 750/1000, 13312/16384; globex center 1750/2000, 23552/32768;
/// globex edge 500/500, 5632/8192; with `caption` at its maximum and
/// `digest` placed: acme center 2500/3000, 28672/32768; acme edge
/// 1000/1000, 15360/16384). While the demo moves [`MOVED`] (`acme/chat`)
/// both its instances count: acme center 2750/3000, 31744/32768.
///
/// Two of them show the autoscaler: `acme/caption` (1–2 instances; its
/// clients keep about five requests at once in it, above one instance's
/// target of 2.1 — `floor(300 ms / 100 ms) × 0.7`) scales out during the
/// load, and `acme/digest` (`min_instances = 0`, 2 s idle timeout) starts
/// with no instance, is brought up by its first request and goes back to
/// zero once the load has ended.
pub const DEMO: [DemoFunction; 13] = [
    f(
        "acme",
        "classify",
        Tier::Exclusive,
        "center",
        (1000, 6144),
        (150, 20_000),
        (2, 40),
    ),
    f(
        "acme",
        "chat",
        Tier::Guaranteed,
        "center",
        (250, 3072),
        (300, 40_000),
        (3, 30),
    ),
    f(
        "acme",
        "rank",
        Tier::Burstable,
        "center",
        (500, 3072),
        (250, 30_000),
        (3, 20),
    ),
    f(
        "acme",
        "embed",
        Tier::Oversubscribed,
        "center",
        (250, 4096),
        (1500, 20_000),
        (1, 300),
    ),
    f(
        "acme",
        "detect",
        Tier::Burstable,
        "edge:edge-a",
        (500, 9728),
        (300, 30_000),
        (2, 40),
    ),
    f(
        "acme",
        "tag",
        Tier::Oversubscribed,
        "edge:edge-a",
        (250, 3584),
        (2000, 20_000),
        (1, 700),
    ),
    f(
        "globex",
        "vision",
        Tier::Exclusive,
        "center",
        (1000, 4096),
        (150, 25_000),
        (2, 40),
    ),
    f(
        "globex",
        "summarize",
        Tier::Burstable,
        "center",
        (500, 3072),
        (400, 60_000),
        (3, 20),
    ),
    f(
        "globex",
        "rerank",
        Tier::Oversubscribed,
        "center",
        (250, 4096),
        (1500, 20_000),
        (1, 300),
    ),
    f(
        "globex",
        "translate",
        Tier::Guaranteed,
        "edge:edge-b",
        (250, 2048),
        (200, 30_000),
        (2, 30),
    ),
    scaled(
        f(
            "acme",
            "caption",
            Tier::Guaranteed,
            "center",
            (250, 1024),
            (300, 100_000),
            (6, 20),
        ),
        (1, 2),
        5,
    ),
    scaled(
        f(
            "acme",
            "digest",
            Tier::Guaranteed,
            "edge:edge-b",
            (250, 2048),
            (1000, 50_000),
            (1, 100),
        ),
        (0, 1),
        2,
    ),
    f(
        "globex",
        "ocr",
        Tier::Oversubscribed,
        "edge:edge-a",
        (250, 3584),
        (2000, 20_000),
        (1, 700),
    ),
];

/// The demo function `gsharectl up` moves to the other node of its pool
/// while the load runs (the operator's move, make-before-break).
pub const MOVED: (&str, &str) = ("acme", "chat");

/// The tenants the demo deploys for.
pub const TENANTS: [&str; 2] = ["acme", "globex"];

/// The demo functions named by `--functions` (`tenant/name`), in
/// [`DEMO`]'s order; all of them when `names` is empty. Every name that is
/// not a demo function is reported at once.
pub fn select(names: &[String]) -> anyhow::Result<Vec<DemoFunction>> {
    if names.is_empty() {
        return Ok(DEMO.to_vec());
    }
    let unknown: Vec<&str> = names
        .iter()
        .map(|n| n.trim())
        .filter(|n| !DEMO.iter().any(|f| f.id() == *n))
        .collect();
    if !unknown.is_empty() {
        bail!(
            "--functions: not demo functions: {}; the demo's are {}",
            unknown.join(", "),
            DEMO.iter()
                .map(DemoFunction::id)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(DEMO
        .iter()
        .filter(|f| names.iter().any(|n| n.trim() == f.id()))
        .cloned()
        .collect())
}

impl DemoFunction {
    /// The body of its `POST /v1/functions`.
    pub fn body(&self) -> anyhow::Result<FunctionBody> {
        Ok(FunctionBody {
            model: None,
            args: Vec::new(),
            env: Default::default(),
            name: self.name.to_string(),
            runtime: Runtime::Pytorch,
            memory_mib: self.memory_mib,
            compute_milli: self.compute_milli,
            tier: self.tier,
            deadline_ms: self.deadline_ms,
            pool: self
                .pool
                .parse::<PoolPreference>()
                .map_err(|e| anyhow::anyhow!("pool {}: {e}", self.pool))?,
            strict_pool: false,
            min_instances: self.instances.0,
            max_instances: Some(self.instances.1),
            idle_timeout_s: self.idle_timeout_s,
            latency: Some(LatencyBody {
                full_gpu_us: self.full_gpu_us,
                saturation_milli: self.compute_milli.min(1000),
            }),
        })
    }

    /// `tenant/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.tenant, self.name)
    }

    /// The autoscaler may change its instance count.
    pub fn scales(&self) -> bool {
        self.instances.0 < self.instances.1
    }
}

/// Deploys `f` with its tenant's `token`; returns the node its first
/// instance was placed on (`None` for a function deployed with
/// `min_instances = 0`, which starts with none).
pub fn deploy(api: &ApiClient, f: &DemoFunction, token: &str) -> anyhow::Result<Option<String>> {
    let v = deploy_body(api, &f.body()?, token).with_context(|| format!("deploying {}", f.id()))?;
    if f.instances.0 == 0 {
        return Ok(None);
    }
    node_of(&v)
        .map(Some)
        .with_context(|| format!("deploying {}: no instance in {v}", f.id()))
}

/// `POST /v1/functions` with `body`, retried for up to 30 s while the
/// answer says so; the answer.
pub fn deploy_body(api: &ApiClient, body: &FunctionBody, token: &str) -> anyhow::Result<Value> {
    let body = serde_json::to_value(body)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match api.call("POST", "/v1/functions", token, Some(&body)) {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() < deadline && e.retryable => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn node_of(v: &Value) -> anyhow::Result<String> {
    match v["instances"][0]["slices"][0]["gpu"]["node"].as_str() {
        Some(n) => Ok(n.to_string()),
        None => bail!("no placed instance"),
    }
}

/// Issues a token for `tenant` (operator).
pub fn issue_token(api: &ApiClient, operator: &str, tenant: &str) -> anyhow::Result<String> {
    let body = json!({ "token_id": "gsharectl-up" });
    let v = api
        .call_retrying(
            "POST",
            &format!("/v1/tenants/{tenant}/tokens"),
            operator,
            Some(&body),
        )
        .with_context(|| format!("issuing a token for {tenant}"))?;
    v["token"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("no token in {v}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn demo_covers_every_tier_for_both_tenants_and_fits_the_quotas() {
        let topology = gshare_core::config::Topology::from_toml(
            "topology.toml",
            super::super::layout::LOCAL_TOPOLOGY,
        )
        .unwrap();
        let mut held: BTreeMap<(&str, &str), (u64, u64, u32)> = BTreeMap::new();
        for f in &DEMO {
            f.body().unwrap();
            let kind = match f.pool.strip_prefix("edge:") {
                Some(p) => {
                    assert!(topology.pool(p).is_some(), "{p}");
                    "edge"
                }
                None => "center",
            };
            // At its maximum count.
            let n = f.instances.1;
            let h = held.entry((f.tenant, kind)).or_default();
            h.0 += u64::from(f.compute_milli) * u64::from(n);
            h.1 += u64::from(n)
                * if f.tier == Tier::Exclusive {
                    16_384 // the whole sim-gpu-16g
                } else {
                    f.memory_mib
                };
            h.2 += n;
        }
        let edge_a: u64 = DEMO
            .iter()
            .filter(|f| f.pool == "edge:edge-a")
            .map(|f| f.memory_mib)
            .sum();
        assert!(edge_a > 16_384, "edge-a's one GPU must be oversubscribed");
        // One function scales out under its load, one goes to zero.
        let target = |f: &DemoFunction| {
            let service_ms = f.full_gpu_us as f64 / 1000.0;
            ((f.deadline_ms as f64 / service_ms).floor() * 0.7).max(1.0)
        };
        let out = DEMO
            .iter()
            .find(|f| f.instances.0 >= 1 && f.scales())
            .expect("a function that scales out");
        let offered = f64::from(out.clients) * (out.full_gpu_us as f64 / 1000.0)
            / (out.full_gpu_us as f64 / 1000.0 + out.think_ms as f64);
        assert!(
            offered > target(out),
            "{}: {offered} ≤ {}",
            out.name,
            target(out)
        );
        assert!(DEMO
            .iter()
            .any(|f| f.instances.0 == 0 && f.idle_timeout_s <= 5));
        for t in TENANTS {
            for tier in Tier::ALL {
                assert!(
                    DEMO.iter().any(|f| f.tenant == t && f.tier == tier),
                    "{t} {tier:?}"
                );
            }
        }
        // The move of MOVED places its new instance beside the old one:
        // the quota holds both, at the maximum counts.
        let moved = DEMO
            .iter()
            .find(|f| (f.tenant, f.name) == MOVED)
            .expect("the moved function is a demo function");
        assert!(moved.pool == "center" && !moved.scales() && moved.tier != Tier::Exclusive);
        let (c, m, n) = held[&(moved.tenant, "center")];
        let quota = quota_of(moved.tenant, "center");
        assert!(
            c + u64::from(moved.compute_milli) <= quota.0
                && m + moved.memory_mib <= quota.1
                && n < quota.2,
            "the move of {}: {c} milli, {m} MiB, {n} instances + one more over {quota:?}",
            moved.id()
        );
        for ((tenant, kind), (c, m, n)) in held {
            let quota = quota_of(tenant, kind);
            assert!(
                c <= quota.0 && m <= quota.1 && n <= quota.2,
                "{tenant} {kind}: {c} milli, {m} MiB, {n} instances over {quota:?}"
            );
        }
    }

    #[test]
    fn select_keeps_the_demo_order_and_names_every_unknown_function() {
        assert_eq!(select(&[]).unwrap().len(), DEMO.len());
        let names = ["globex/translate".to_string(), " acme/rank".to_string()];
        let picked: Vec<String> = select(&names)
            .unwrap()
            .iter()
            .map(DemoFunction::id)
            .collect();
        assert_eq!(picked, ["acme/rank", "globex/translate"]);
        let e = select(&["acme/nope".into(), "acme/rank".into(), "x".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not demo functions: acme/nope, x;"), "{e}");
    }

    /// The quotas of configs/local/tenants.toml, read from the TOML text.
    fn quota_of(tenant: &str, kind: &str) -> (u64, u64, u32) {
        let v: toml::Value = toml::from_str(super::super::layout::LOCAL_TENANTS).unwrap();
        let t = v["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"].as_str() == Some(tenant))
            .unwrap();
        let q = &t["quota"][kind];
        (
            q["compute_milli"].as_integer().unwrap() as u64,
            q["memory_mib"].as_integer().unwrap() as u64,
            q["instances"].as_integer().unwrap() as u32,
        )
    }
}
