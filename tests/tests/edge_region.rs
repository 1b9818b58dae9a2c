//! A real `gshare-edge` process against real `gshare-region` replicas: the
//! agent registers over QUIC + mutual TLS (ALPN `gshare-agent/1`), gets
//! the instance the leader placed for a deployed function and the tenant's
//! token digest, serves the invocation on its own ingress and through
//! every replica, and its heartbeats and swap reports show at the replica
//! holding its link (`GET /v1/cluster/agents`, `/metrics`). Errors from
//! the agent, the replicas and the replicas' forwards have one shape, and
//! a revoked token stops working at the agent's ingress within a bound.

use gshare_region::http_client::{request, HttpReply};
use gshare_tests::raw_http::{assert_error, raw_request};
use gshare_tests::{TestRegion, TOKEN};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn call(addr: SocketAddr, method: &str, path: &str, token: &str, body: Option<&str>) -> HttpReply {
    request(
        addr,
        method,
        path,
        Some(token),
        body,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| HttpReply {
        status: 0,
        body: e.to_string(),
        ..HttpReply::default()
    })
}

fn until(what: &str, mut f: impl FnMut() -> Option<HttpReply>) -> HttpReply {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(r) = f() {
            return r;
        }
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn agent_registers_with_the_region_and_serves_a_deployed_function() {
    let mut region = TestRegion::new(3).expect("region");
    for id in 1..=3 {
        region.start(id, id == 1).expect("start");
    }
    region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    let http = region.http(1);
    until("tenants loaded", || {
        let r = call(http, "GET", "/v1/tenants", TOKEN, None);
        let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        v.as_array().is_some_and(|a| a.len() == 2).then_some(r)
    });
    let r = until("token", || {
        let r = call(http, "POST", "/v1/tenants/acme/tokens", TOKEN, None);
        (r.status == 201).then_some(r)
    });
    let v: Value = serde_json::from_str(&r.body).unwrap();
    let acme = v["token"].as_str().unwrap().to_string();
    let acme_token_id = v["token_id"].as_str().unwrap().to_string();
    let f = json!({
        "name": "hello", "runtime": "pytorch", "memory_mib": 3000, "compute_milli": 400,
        "tier": "guaranteed", "deadline_ms": 2000, "pool": "center", "min_instances": 1,
        "latency": {"full_gpu_us": 2000, "saturation_milli": 400},
    })
    .to_string();
    let r = until("deploy", || {
        let r = call(http, "POST", "/v1/functions", &acme, Some(&f));
        (r.status != 0 && r.status != 503).then_some(r)
    });
    assert!(r.status == 200 || r.status == 201, "{r:?}");
    // Where did the leader place it? (A center node: local-c1 or local-c2.)
    let mut node = "";
    until("placed", || {
        let r = call(http, "GET", "/v1/cluster/state", TOKEN, None);
        let s: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        let instances = s["instances"].to_string();
        node = ["local-c1", "local-c2"]
            .into_iter()
            .find(|n| instances.contains(&format!("\"{n}\"")))?;
        Some(r)
    });
    let certs = region.certs();
    let (ok, out) = region
        .gsharectl(&[
            "certs",
            "issue",
            "--dir",
            certs.to_str().unwrap(),
            "--name",
            node,
        ])
        .unwrap();
    assert!(ok, "{out}");
    let ingress = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let replicas: String = region
        .replicas
        .values()
        .map(|r| format!("[[replicas]]\nquic_addr = \"{}\"\n", r.raft_addr))
        .collect();
    let config = region.root().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            r#"node = "{node}"
pool = "center"
pool_kind = "center"
data_dir = "data/agent"
ingress_addr = "{ingress}"
host_swap_mib = 8192
heartbeat_ms = 200
[gpus]
backend = "simulated"
[[gpus.simulated]]
model = "sim-gpu-16g"
memory_mib = 16384
h2d_mib_per_s = 12000
count = 2
[load]
cold_setup_us = 20000
{replicas}
[tls]
ca_cert = "certs/ca.pem"
cert = "certs/{node}.pem"
key = "certs/{node}.key"
"#
        ),
    )
    .unwrap();
    let mut agent = Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let served = until("served through the agent", || {
        let r = call(ingress, "POST", "/v1/invoke/acme/hello", &acme, Some("{}"));
        (r.status == 200).then_some(r)
    });
    assert_eq!(served.body, "{}");
    // The agent's own errors have the one shape, with `retryable` and the
    // `X-Gshare-Error` header; the token is checked before the body's size.
    let bearer = format!("Bearer {acme}");
    let hello = "/v1/invoke/acme/hello";
    let r = call(ingress, "GET", "/v1/nope", &acme, None);
    assert_error(&r, 404, "unknown_route", false);
    let r = call(ingress, "DELETE", hello, &acme, None);
    assert_error(&r, 404, "unknown_route", false);
    let r = call(ingress, "POST", "/v1/invoke/acme/nope", &acme, Some("x"));
    assert_error(&r, 404, "unknown_function", false);
    let r = call(ingress, "POST", hello, "nobody", Some("x"));
    assert_error(&r, 401, "unauthorized", false);
    let r = raw_request(
        ingress,
        "POST",
        hello,
        &[("Authorization", &format!("Bearer  {acme}"))],
        b"",
        0,
    );
    assert_error(&r, 401, "unauthorized", false);
    for auth in [None, Some("Bearer nobody")] {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
        let r = raw_request(ingress, "POST", hello, &headers, b"", 5 << 20);
        assert_error(&r, 401, "unauthorized", false);
    }
    let r = raw_request(
        ingress,
        "POST",
        hello,
        &[("Authorization", &bearer)],
        b"",
        5 << 20,
    );
    assert_error(&r, 413, "body_too_large", false);
    // A deadline the agent cannot meet (2 ms of service, 1 ms asked), at
    // the agent and through every replica: the replica holding the link
    // forwards over QUIC, the others pass a peer's answer on with its header.
    for addr in std::iter::once(ingress).chain((1..=3).map(|id| region.http(id))) {
        let headers = [
            ("Authorization", bearer.as_str()),
            ("X-Gshare-Deadline-Ms", "1"),
        ];
        let r = raw_request(addr, "POST", hello, &headers, b"{}", 2);
        assert_error(&r, 504, "deadline_unreachable", false);
        assert_eq!(
            r.header("content-type"),
            Some("application/json"),
            "{addr}: {r:?}"
        );
    }
    // Through every replica: the one the agent is connected to forwards
    // over QUIC, the others hand it to a peer over HTTP.
    for id in 1..=3 {
        let r = call(
            region.http(id),
            "POST",
            "/v1/invoke/acme/hello",
            &acme,
            Some("via"),
        );
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "via"),
            "replica {id}: {r:?}"
        );
        let r = call(
            region.http(id),
            "POST",
            "/v1/invoke/acme/nope",
            &acme,
            Some("x"),
        );
        assert_error(&r, 404, "unknown_function", false);
        let r = call(
            region.http(id),
            "POST",
            "/v1/invoke/acme/hello",
            TOKEN,
            Some("x"),
        );
        assert_error(&r, 401, "unauthorized", false);
    }
    // The replica holding the agent's link shows its latest heartbeat (both
    // GPUs) and the swap reports (the first call cold-started the instance).
    let (holder, report) = {
        let mut found = None;
        until("agent's reports at its replica", || {
            found = (1..=3).find_map(|id| {
                let r = call(region.http(id), "GET", "/v1/cluster/agents", TOKEN, None);
                let v: Value = serde_json::from_str(&r.body).ok()?;
                let a = v.as_array()?.iter().find(|a| a["node"] == node)?.clone();
                (a["heartbeat"]["gpus"]
                    .as_array()
                    .is_some_and(|g| g.len() == 2)
                    && a["swaps"]["cold_start"].as_u64() >= Some(1))
                .then_some((id, a))
            });
            found.as_ref().map(|_| HttpReply {
                status: 200,
                ..HttpReply::default()
            })
        });
        found.unwrap()
    };
    // Every replica lists it; `replica` names the one holding the link
    // (whose `/metrics` has its series).
    let holder = report["replica"].as_u64().unwrap_or(holder);
    assert_eq!(report["gpus"].as_array().map(Vec::len), Some(2), "{report}");
    let r = call(
        region.http(holder),
        "GET",
        "/v1/cluster/agents",
        &acme,
        None,
    );
    assert!(r.status == 401 || r.status == 403, "{r:?}");
    let metrics = call(region.http(holder), "GET", "/metrics", TOKEN, None).body;
    for line in [
        format!("gshare_region_agent_gpu_utilization_ratio{{agent=\"{node}\",pool=\"center\",node=\"{node}\",gpu=\"1\"}} "),
        format!("gshare_region_agent_swaps_total{{agent=\"{node}\",kind=\"cold_start\"}} "),
        format!("gshare_region_agent_process_crashes_total{{agent=\"{node}\"}} 0\n"),
        format!("gshare_region_agent_usage_pending_records{{agent=\"{node}\"}} "),
    ] {
        assert!(metrics.contains(&line), "{line} missing in {metrics}");
    }
    // Another tenant's token is refused by the agent itself.
    let r = call(ingress, "POST", "/v1/invoke/acme/hello", TOKEN, Some("{}"));
    assert_eq!(r.status, 401, "{r:?}");
    // The registration went through Raft: every replica's state has the agent.
    for id in 1..=3 {
        until("agent in every replica's state", || {
            let r = call(region.http(id), "GET", "/v1/cluster/state", TOKEN, None);
            let s: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
            s["agents"].to_string().contains(node).then_some(r)
        });
    }
    // Kill -9 the leader while invocations flow through the agent's ingress.
    let leader = region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    let acme2 = acme.clone();
    let load = std::thread::spawn(move || {
        (0..200)
            .map(|_| call(ingress, "POST", "/v1/invoke/acme/hello", &acme2, Some("{}")).status)
            .filter(|s| *s != 200)
            .count()
    });
    std::thread::sleep(Duration::from_millis(100));
    region.kill9(leader).expect("kill leader");
    assert_eq!(
        load.join().unwrap(),
        0,
        "invocations failed while the region lost its leader"
    );
    // Through every survivor (if the agent's replica died, it re-registers
    // with another one).
    for via in (1..=3).filter(|id| *id != leader) {
        let r = until("served via a surviving replica", || {
            let r = call(
                region.http(via),
                "POST",
                "/v1/invoke/acme/hello",
                &acme,
                Some("again"),
            );
            (r.status == 200).then_some(r)
        });
        assert_eq!(r.body, "again");
    }
    // Revocation reaches the agent's ingress within a bound: the region
    // pushes token digests when they change (polled every 200 ms), so
    // calls with the revoked token are served for a moment after the
    // revocation is acknowledged, then refused by the agent itself.
    let via = (1..=3).find(|id| *id != leader).unwrap();
    until("revoked", || {
        let r = call(
            region.http(via),
            "DELETE",
            &format!("/v1/tenants/acme/tokens/{acme_token_id}"),
            TOKEN,
            None,
        );
        (r.status == 200).then_some(r)
    });
    let revoked = Instant::now();
    let mut served_after = 0u32;
    loop {
        let r = call(ingress, "POST", hello, &acme, Some("{}"));
        if r.status == 401 {
            assert_error(&r, 401, "unauthorized", false);
            break;
        }
        assert_eq!(r.status, 200, "{r:?}");
        served_after += 1;
        assert!(
            revoked.elapsed() < Duration::from_secs(10),
            "the revoked token still works at the agent after {served_after} calls: {r:?}"
        );
    }
    println!(
        "revocation reached the agent's ingress {} ms after it was acknowledged ({served_after} calls served in between)",
        revoked.elapsed().as_millis()
    );
    let _ = agent.kill();
    let _ = agent.wait();
}
