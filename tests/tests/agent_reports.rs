//! Every replica knows the agents, and `?wait=ready` means the hosting
//! agents report the function's instances: a 3-replica region with one
//! agent on each center node, each linked to a different replica.
//!
//! - `GET /v1/cluster/agents` on each replica lists both agents with the
//!   replica holding the link and the report's age; `/v1/cluster/view`
//!   shows each node's agent; `/v1/cluster/state` stays the replicated
//!   state alone (identical on every replica at one applied index).
//! - A deploy with `?wait=ready` (through each replica in turn) answers
//!   `201` with every instance `resident`, and the first invocation
//!   through every replica right after it succeeds (no `404
//!   unknown_function`, no `503`); `GET /v1/functions/{name}` from a
//!   replica that does not hold the agent's link shows it `resident`.
//! - The agents' per-function load reports reach every replica: after the
//!   invocations `GET /v1/functions/{name}` from the replica holding no
//!   link shows a `load` block (an idle time: it was invoked; nothing in
//!   flight), and `/metrics` of a replica holding a link carries the
//!   function's load series for the operator, none without a token.
//! - A deploy onto a node whose agent never came answers `202 not_ready`
//!   after its `ready_timeout_ms`, saying the deploy committed.

use gshare_region::http_client::{request, HttpReply};
use gshare_tests::{TestRegion, TOKEN};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn call(addr: SocketAddr, method: &str, path: &str, token: &str, body: Option<&str>) -> HttpReply {
    request(
        addr,
        method,
        path,
        Some(token),
        body,
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| HttpReply {
        status: 0,
        body: e.to_string(),
        ..HttpReply::default()
    })
}

fn json_of(r: &HttpReply) -> Value {
    serde_json::from_str(&r.body).unwrap_or(Value::Null)
}

fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        if let Some(r) = f() {
            return r;
        }
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Starts `node`'s agent, listing replica `first` first (so it links there).
fn agent(region: &TestRegion, node: &str, first: u64) -> Child {
    let (config, _ingress) = region
        .sim_agent_config(node, &[first])
        .expect("agent config");
    Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn every_replica_knows_the_agents_and_ready_means_resident() {
    let mut region = TestRegion::new(3).expect("region");
    for id in 1..=3 {
        region.start(id, id == 1).expect("start");
    }
    region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    until("tenants loaded", || {
        let r = call(region.http(1), "GET", "/v1/tenants", TOKEN, None);
        json_of(&r)
            .as_array()
            .is_some_and(|a| a.len() == 2)
            .then_some(())
    });
    let r = until("token", || {
        let r = call(
            region.http(1),
            "POST",
            "/v1/tenants/acme/tokens",
            TOKEN,
            None,
        );
        (r.status == 201).then_some(r)
    });
    let acme = json_of(&r)["token"].as_str().unwrap().to_string();
    for id in 1..=3 {
        until("token everywhere", || {
            let r = call(region.http(id), "GET", "/v1/functions", &acme, None);
            (r.status == 200).then_some(())
        });
    }
    // local-c1's agent links to replica 1, local-c2's to replica 2; replica
    // 3 holds no link.
    let mut agents = [agent(&region, "local-c1", 1), agent(&region, "local-c2", 2)];

    // Every replica lists both agents, with the holder and the report's age.
    let mut holders = std::collections::BTreeMap::new();
    for id in 1..=3 {
        let list = until("both agents on every replica", || {
            let r = call(region.http(id), "GET", "/v1/cluster/agents", TOKEN, None);
            let v = json_of(&r);
            let a = v.as_array()?.clone();
            (a.len() == 2 && a.iter().all(|a| a["age_ms"].is_u64())).then_some(a)
        });
        for a in &list {
            let node = a["node"].as_str().unwrap().to_string();
            let holder = a["replica"].as_u64().expect("replica");
            assert!((1..=3).contains(&holder), "{a}");
            assert!(
                a["heartbeat"]["gpus"]
                    .as_array()
                    .is_some_and(|g| g.len() == 2),
                "{a}"
            );
            let age = a["age_ms"].as_u64().unwrap();
            // Heartbeats come every 200 ms; a report this old would be news
            // (a generous bound, not a timing assert on the machine's speed).
            assert!(age < 30_000, "report age {age} ms: {a}");
            let before = holders.insert(node.clone(), holder);
            assert!(
                before.is_none_or(|b| b == holder),
                "{node}: {before:?} vs {holder}"
            );
        }
        // Only the agents linked here with `scope=replica`.
        let r = call(
            region.http(id),
            "GET",
            "/v1/cluster/agents?scope=replica",
            TOKEN,
            None,
        );
        let local = json_of(&r).as_array().cloned().unwrap_or_default();
        assert!(local.iter().all(|a| a["replica"] == json!(id)), "{r:?}");
        // The view shows each center node's agent.
        let view = until("agents in the view", || {
            let r = call(region.http(id), "GET", "/v1/cluster/view", TOKEN, None);
            let v = json_of(&r);
            let nodes = v["nodes"].as_array()?;
            let with_agent = nodes
                .iter()
                .filter(|n| n["node"] == "local-c1" || n["node"] == "local-c2")
                .filter(|n| n["agent"]["report_age_ms"].is_u64())
                .count();
            (with_agent == 2).then_some(v)
        });
        assert_eq!(view["agent_replicas_missing"], json!([]), "{view}");
    }
    let no_link = (1..=3u64)
        .find(|id| !holders.values().any(|h| h == id))
        .expect("a replica holding no agent link");

    // Deploy, waiting for ready, through each replica in turn; invoke right
    // after through every replica: each first try succeeds.
    for n in 0..3u64 {
        let f = json!({
            "name": format!("f{n}"), "runtime": "pytorch", "memory_mib": 2000,
            "compute_milli": 100, "tier": "guaranteed", "deadline_ms": 5000, "pool": "center",
            "latency": {"full_gpu_us": 2000, "saturation_milli": 100},
        })
        .to_string();
        let via = region.http(1 + n % 3);
        let r = call(via, "POST", "/v1/functions?wait=ready", &acme, Some(&f));
        assert_eq!(r.status, 201, "{r:?}");
        let v = json_of(&r);
        assert_eq!(v["ready"], json!(true), "{v}");
        assert_eq!(v["instances"][0]["state"], json!("resident"), "{v}");
        let path = format!("/v1/invoke/acme/f{n}");
        for id in 1..=3 {
            let r = call(region.http(id), "POST", &path, &acme, Some("{}"));
            assert_eq!(r.status, 200, "f{n} through replica {id}, first try: {r:?}");
        }
        // Described from the replica holding no agent link: resident.
        let d = call(
            region.http(no_link),
            "GET",
            &format!("/v1/functions/f{n}"),
            &acme,
            None,
        );
        assert_eq!(d.status, 200, "{d:?}");
        assert_eq!(
            json_of(&d)["instances"][0]["state"],
            json!("resident"),
            "replica {no_link}: {d:?}"
        );
        // Its load, summed over the agents' latest reports, read there too:
        // invoked (a finite idle time), nothing in flight any more.
        let load = until("the function's load on the replica without links", || {
            let path = format!("/v1/functions/f{n}");
            let d = call(region.http(no_link), "GET", &path, &acme, None);
            let l = json_of(&d)["load"].clone();
            (l["idle_ms"].as_u64().is_some_and(|ms| ms < u64::MAX) && l["concurrency"] == json!(0))
                .then_some(l)
        });
        assert!(load["arrivals"].is_u64(), "{load}");
    }
    // The load series: on a replica holding a link, for the operator; never
    // without a token (tenant-labelled).
    let series = "gshare_region_function_load_concurrency{tenant=\"acme\",function=\"f0\"}";
    until("the load series on a replica holding a link", || {
        holders
            .values()
            .any(|&id| {
                call(region.http(id), "GET", "/metrics", TOKEN, None)
                    .body
                    .contains(series)
            })
            .then_some(())
    });
    for id in 1..=3 {
        let public = request(
            region.http(id),
            "GET",
            "/metrics",
            None,
            None,
            Duration::from_secs(30),
        )
        .expect("public metrics");
        assert_eq!(public.status, 200, "{public:?}");
        assert!(
            !public.body.contains("gshare_region_function_load"),
            "{}",
            public.body
        );
    }

    // The agents' reports never enter the replicated state: every replica
    // dumps the same state once they have applied the same index.
    until("identical state on every replica", || {
        let states: Vec<String> = (1..=3)
            .map(|id| call(region.http(id), "GET", "/v1/cluster/state", TOKEN, None).body)
            .collect();
        (states[0] == states[1] && states[1] == states[2]).then_some(())
    });
    let state = call(region.http(1), "GET", "/v1/cluster/state", TOKEN, None).body;
    assert!(!state.contains("age_ms"), "{state}");

    // A node whose agent never came: committed, not ready, and said so.
    let f = json!({
        "name": "far", "runtime": "pytorch", "memory_mib": 2000, "compute_milli": 100,
        "tier": "guaranteed", "deadline_ms": 5000, "pool": "edge:edge-a",
        "latency": {"full_gpu_us": 2000, "saturation_milli": 100},
    })
    .to_string();
    let r = call(
        region.http(no_link),
        "POST",
        "/v1/functions?wait=ready&ready_timeout_ms=1500",
        &acme,
        Some(&f),
    );
    assert_eq!(r.status, 202, "{r:?}");
    let v = json_of(&r);
    assert_eq!(v["ready"], json!(false), "{v}");
    assert_eq!(v["error"]["code"], json!("not_ready"), "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("committed") && message.contains("local-ea1"),
        "{message}"
    );
    assert_eq!(v["instances"][0]["state"], json!("placed"), "{v}");
    let r = call(region.http(1), "GET", "/v1/functions/far", &acme, None);
    assert_eq!(r.status, 200, "the deploy committed: {r:?}");

    for a in &mut agents {
        let _ = a.kill();
        let _ = a.wait();
    }
}
