//! `/metrics` by the conventions, on a real replica and a real agent: every
//! family has `# HELP` and `# TYPE`, counters end in `_total` and are typed
//! counter, the histograms by tenant, function and tier are there after a
//! load that cold-starts and swaps, tenant series need the metrics token,
//! and every PromQL expression of the Grafana dashboard
//! (`configs/grafana/gshare.json`) names only series the two processes export.

use gshare_core::metrics::{check_exposition, exported_names};
use gshare_region::http_client::{request, HttpReply};
use gshare_tests::{TestRegion, TOKEN};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const METRICS_TOKEN: &str = "scrape-me";
const DASHBOARD: &str = include_str!("../../configs/grafana/gshare.json");

fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> HttpReply {
    request(addr, method, path, token, body, Duration::from_secs(10)).unwrap_or_else(|e| {
        HttpReply {
            status: 0,
            body: e.to_string(),
            ..HttpReply::default()
        }
    })
}

fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `gshare_…` metric names a PromQL expression mentions.
fn promql_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts = (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'))
            && expr[i..].starts_with("gshare_");
        if starts {
            let end = expr[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(expr.len(), |n| i + n);
            names.insert(expr[i..end].to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    names
}

/// Every `expr` of the dashboard's panels (rows' panels included).
fn dashboard_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(e)) = m.get("expr") {
                out.push(e.clone());
            }
            for x in m.values() {
                dashboard_exprs(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| dashboard_exprs(x, out)),
        _ => {}
    }
}

#[test]
fn every_series_keeps_the_conventions_and_the_dashboard_names_only_exported_series() {
    let mut region =
        TestRegion::with_config(1, "metrics_token_file = \"metrics.token\"").expect("region");
    std::fs::write(region.path("metrics.token"), format!("{METRICS_TOKEN}\n")).unwrap();
    region.start(1, true).expect("start");
    region
        .wait_leader(&[1], Duration::from_secs(15))
        .expect("leader");
    let http = region.http(1);
    until("tenants loaded", || {
        let r = call(http, "GET", "/v1/tenants", Some(TOKEN), None);
        let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        v.as_array().is_some_and(|a| a.len() == 2).then_some(())
    });
    let token = |tenant: &str| -> String {
        let r = until("token", || {
            let r = call(
                http,
                "POST",
                &format!("/v1/tenants/{tenant}/tokens"),
                Some(TOKEN),
                None,
            );
            (r.status == 201).then_some(r)
        });
        let v: Value = serde_json::from_str(&r.body).unwrap();
        v["token"].as_str().unwrap().to_string()
    };
    let (acme, globex) = (token("acme"), token("globex"));
    // Three 8 GiB oversubscribed functions on the one 16 GiB GPU of edge
    // node local-ea1: serving them in turn swaps.
    let functions = [
        ("acme", "f1", &acme),
        ("acme", "f2", &acme),
        ("globex", "g1", &globex),
    ];
    for (_, name, t) in functions {
        let f = json!({
            "name": name, "runtime": "pytorch", "memory_mib": 8000, "compute_milli": 300,
            "tier": "oversubscribed", "deadline_ms": 20000, "pool": "edge:edge-a", "min_instances": 1,
            "latency": {"full_gpu_us": 2000, "saturation_milli": 300},
        })
        .to_string();
        let r = until("deploy", || {
            let r = call(http, "POST", "/v1/functions", Some(t), Some(&f));
            (r.status != 0 && r.status != 503).then_some(r)
        });
        assert!(r.status == 200 || r.status == 201, "{name}: {r:?}");
    }
    // Eight more instances for globex are past its quotas (2 edge and 6
    // center instances, one held): a refused placement
    // (`gshare_region_placement_rejections_total{reason}`).
    let over = json!({
        "name": "g2", "runtime": "pytorch", "memory_mib": 1000, "compute_milli": 100,
        "tier": "oversubscribed", "deadline_ms": 20000, "pool": "edge:edge-a",
        "min_instances": 8, "max_instances": 8,
        "latency": {"full_gpu_us": 2000, "saturation_milli": 100},
    })
    .to_string();
    let r = call(http, "POST", "/v1/functions", Some(&globex), Some(&over));
    assert!(r.status >= 400, "{r:?}");
    let certs = region.certs();
    let (ok, out) = region
        .gsharectl(&[
            "certs",
            "issue",
            "--dir",
            certs.to_str().unwrap(),
            "--name",
            "local-ea1",
        ])
        .unwrap();
    assert!(ok, "{out}");
    let ingress = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let raft = region.replicas[&1].raft_addr;
    std::fs::write(region.path("agent-metrics.token"), METRICS_TOKEN).unwrap();
    let config = region.root().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            r#"node = "local-ea1"
pool = "edge-a"
pool_kind = "edge"
data_dir = "data/agent"
ingress_addr = "{ingress}"
host_swap_mib = 24576
heartbeat_ms = 200
metrics_token_file = "agent-metrics.token"
[gpus]
backend = "simulated"
[[gpus.simulated]]
model = "sim-gpu-16g"
memory_mib = 16384
h2d_mib_per_s = 12000
count = 1
[load]
cold_setup_us = 20000
[[replicas]]
quic_addr = "{raft}"
[tls]
ca_cert = "certs/ca.pem"
cert = "certs/local-ea1.pem"
key = "certs/local-ea1.key"
"#
        ),
    )
    .unwrap();
    let _agent = Agent(
        Command::new(gshare_tests::binary("gshare-edge"))
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    for (tenant, name, t) in functions {
        until("served through the agent", || {
            let r = call(
                ingress,
                "POST",
                &format!("/v1/invoke/{tenant}/{name}"),
                Some(t),
                Some("{}"),
            );
            (r.status == 200).then_some(())
        });
    }
    // Round robin: each call needs weights another one pushed out.
    for _ in 0..3 {
        for (tenant, name, t) in functions {
            let r = call(
                ingress,
                "POST",
                &format!("/v1/invoke/{tenant}/{name}"),
                Some(t),
                Some("{}"),
            );
            assert_eq!(r.status, 200, "{tenant}/{name}: {r:?}");
        }
    }
    // Through the replica too (forwarded over the agent's link).
    let r = call(http, "POST", "/v1/invoke/acme/f1", Some(&acme), Some("via"));
    assert_eq!((r.status, r.body.as_str()), (200, "via"), "{r:?}");

    let scrape = |addr: SocketAddr, token: Option<&str>| {
        let r = call(addr, "GET", "/metrics", token, None);
        assert_eq!(r.status, 200, "{addr}: {r:?}");
        r.body
    };
    let agent_full = until("the agent's swap-in histogram", || {
        let t = scrape(ingress, Some(METRICS_TOKEN));
        t.contains("gshare_edge_swap_in_duration_seconds_count{")
            .then_some(t)
    });
    let region_full = until("the agent's heartbeat at the replica", || {
        let t = scrape(http, Some(METRICS_TOKEN));
        t.contains("gshare_region_agent_gpu_utilization_ratio{")
            .then_some(t)
    });
    for (what, text) in [
        ("region, metrics token", region_full.clone()),
        ("region, operator token", scrape(http, Some(TOKEN))),
        ("region, public", scrape(http, None)),
        ("agent, metrics token", agent_full.clone()),
        ("agent, public", scrape(ingress, None)),
    ] {
        assert_eq!(
            check_exposition(&text),
            Vec::<String>::new(),
            "{what}:\n{text}"
        );
        assert!(
            text.contains("gshare_build_info{component="),
            "{what}: {text}"
        );
        if what.ends_with("public") {
            for secret in ["tenant=", "acme", "globex", "\"f1\"", "\"g1\""] {
                assert!(!text.contains(secret), "{what} shows {secret}: {text}");
            }
        }
    }
    for series in [
        "gshare_edge_invocation_duration_seconds",
        "gshare_edge_invocation_queue_wait_seconds",
        "gshare_edge_cold_start_duration_seconds",
        "gshare_edge_swap_in_duration_seconds",
    ] {
        assert!(
            agent_full.contains(&format!("# TYPE {series} histogram\n")),
            "{series}: {agent_full}"
        );
    }
    assert!(
        agent_full.contains("tenant=\"acme\",tier=\"oversubscribed\"")
            && agent_full.contains("function=\"g1\",tenant=\"globex\""),
        "{agent_full}"
    );
    for want in [
        "gshare_region_tenant_memory_bytes{tenant=\"acme\",pool_kind=\"edge\"} 16777216000\n",
        "gshare_region_function_instances{tenant=\"globex\",function=\"g1\",tier=\"oversubscribed\"} 1\n",
        "gshare_region_gpu_memory_bytes{pool=\"edge-a\",node=\"local-ea1\",gpu=\"0\"} 17179869184\n",
    ] {
        assert!(region_full.contains(want), "{want} missing in {region_full}");
    }
    // A token that is neither refused at both.
    for addr in [http, ingress] {
        assert_eq!(
            call(addr, "GET", "/metrics", Some("wrong"), None).status,
            401
        );
    }
    assert_eq!(
        call(ingress, "GET", "/metrics", Some(&acme), None).status,
        401
    );

    // The dashboard: every expression names only exported series.
    let exported: BTreeSet<String> = exported_names(&region_full)
        .into_iter()
        .chain(exported_names(&agent_full))
        .collect();
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "{exprs:?}");
    let mut missing = Vec::new();
    for e in &exprs {
        let names = promql_names(e);
        assert!(
            !names.is_empty(),
            "an expression without a gshare series: {e}"
        );
        missing.extend(
            names
                .into_iter()
                .filter(|n| !exported.contains(n))
                .map(|n| format!("{n} (in {e})")),
        );
    }
    assert!(missing.is_empty(), "not exported: {missing:#?}");
    let titles = dashboard["panels"].to_string().to_lowercase();
    for row in ["cluster", "pools", "nodes", "gpus", "tenants", "functions"] {
        assert!(titles.contains(row), "no {row} panel");
    }
}
