//! Migration between pools on real processes: three replicas, agents on
//! the two center nodes, the edge-a node's agent started late, small
//! graces. An `edge:edge-a` function spilled to the center while edge-a
//! had no agent returns there once its agent is ready; an operator moves
//! it to the center (`gsharectl function move`) and the leader leaves it
//! there; a function at its `max_instances` moves to a named node; a move
//! into a pool without room is refused (`409 no_room`) and moves nothing.
//! Every move is make-before-break under a steady load through another
//! replica: not one invocation fails. The moves are on the leader's
//! `/metrics`.

use gshare_region::http_client::{request, HttpReply};
use gshare_tests::{TestRegion, TOKEN};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the load saw: the function, the HTTP status, the body.
type Log = Arc<Mutex<Vec<(&'static str, u16, String)>>>;

const GRACES: &str =
    "agent_join_grace_s = 4\nnode_ready_grace_ms = 1500\nnode_replace_grace_ms = 1000\n";

fn call(addr: SocketAddr, method: &str, path: &str, token: &str, body: Option<&str>) -> HttpReply {
    request(
        addr,
        method,
        path,
        Some(token),
        body,
        Duration::from_secs(90),
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

fn until<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(r) = f() {
            return r;
        }
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn agent(region: &TestRegion, node: &str) -> Agent {
    let (config, _) = if node.starts_with("local-e") {
        region.sim_agent_config_in(node, &[], "edge-a", "edge", 1)
    } else {
        region.sim_agent_config(node, &[])
    }
    .expect("agent config");
    Agent(
        Command::new(gshare_tests::binary("gshare-edge"))
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start agent"),
    )
}

fn node_state(region: &TestRegion, node: &str) -> String {
    let r = call(region.http(1), "GET", "/v1/nodes", TOKEN, None);
    json_of(&r)
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["node"] == json!(node))
        .and_then(|n| n["state"].as_str().map(String::from))
        .unwrap_or_default()
}

/// The nodes of `function`'s instances and whether it migrates, in the
/// replicated state on replica 1.
fn where_is(region: &TestRegion, function: &str) -> (BTreeSet<String>, bool) {
    let r = call(region.http(1), "GET", "/v1/cluster/state", TOKEN, None);
    let v = json_of(&r);
    let mut ids = BTreeSet::new();
    let mut nodes = BTreeSet::new();
    for (k, inst) in v["instances"].as_object().into_iter().flatten() {
        if inst["function"] == json!(function) {
            ids.insert(k.clone());
            if let Some(n) = inst["slices"][0]["gpu"]["node"].as_str() {
                nodes.insert(n.to_string());
            }
        }
    }
    let migrating = v["migrations"]
        .as_object()
        .is_some_and(|m| m.keys().any(|k| ids.contains(k)));
    (nodes, migrating)
}

/// The replicas' log lines about migrations (on a failure).
fn dump(region: &TestRegion) {
    for id in 1..=3 {
        for l in region.stderr(id, 1).lines().filter(|l| {
            l.contains("migrat")
                || l.contains("return")
                || l.contains("Migrate")
                || l.contains("edgy")
        }) {
            println!("r{id}: {l}");
        }
    }
}

fn settled_on(region: &TestRegion, function: &str, node: &str) -> bool {
    let (nodes, migrating) = where_is(region, function);
    !migrating && nodes == BTreeSet::from([node.to_string()])
}

#[test]
fn functions_move_between_pools_make_before_break_without_a_failed_invocation() {
    let mut region = TestRegion::with_config(3, GRACES).expect("region");
    for id in 1..=3 {
        region.start(id, id == 1).expect("start");
    }
    region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    let http = region.http(1);
    until("tenants loaded", 30, || {
        let r = call(http, "GET", "/v1/tenants", TOKEN, None);
        json_of(&r)
            .as_array()
            .is_some_and(|a| a.len() == 2)
            .then_some(())
    });
    let r = until("token", 30, || {
        let r = call(http, "POST", "/v1/tenants/acme/tokens", TOKEN, None);
        (r.status == 201).then_some(r)
    });
    let acme = json_of(&r)["token"].as_str().unwrap().to_string();
    let _c1 = agent(&region, "local-c1");
    let _c2 = agent(&region, "local-c2");
    for node in ["local-c1", "local-c2"] {
        until(&format!("{node} ready"), 30, || {
            (node_state(&region, node) == "ready").then_some(())
        });
    }
    until("local-ea1 not_ready (no agent)", 30, || {
        (node_state(&region, "local-ea1") == "not_ready").then_some(())
    });
    // `edgy` prefers edge-a, which has no agent: it spills to the center.
    // `f` is at its max_instances (1).
    for (name, pool) in [("edgy", "edge:edge-a"), ("f", "center")] {
        let spec = json!({
            "name": name, "runtime": "pytorch", "memory_mib": 1000, "compute_milli": 100,
            "tier": "guaranteed", "deadline_ms": 5000, "pool": pool,
            "min_instances": 1, "max_instances": 1,
            "latency": {"full_gpu_us": 2000, "saturation_milli": 100},
        })
        .to_string();
        let r = call(http, "POST", "/v1/functions?wait=ready", &acme, Some(&spec));
        assert_eq!(r.status, 201, "{r:?}");
    }
    let (spilled, _) = where_is(&region, "edgy");
    assert!(
        spilled.iter().all(|n| n.starts_with("local-c")),
        "{spilled:?}"
    );

    // Load on both through replica 2 from now on.
    let stop = Arc::new(AtomicBool::new(false));
    let log: Log = Arc::default();
    let load = {
        let (stop, log, acme) = (stop.clone(), log.clone(), acme.clone());
        let via = region.http(2);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for name in ["edgy", "f"] {
                    let r = request(
                        via,
                        "POST",
                        &format!("/v1/invoke/acme/{name}"),
                        Some(&acme),
                        Some("{}"),
                        Duration::from_secs(10),
                    );
                    let (status, body) =
                        r.map_or_else(|e| (0, e.to_string()), |r| (r.status, r.body));
                    log.lock().unwrap().push((name, status, body));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    // edge-a's agent arrives: `edgy` returns there.
    let _ea1 = agent(&region, "local-ea1");
    let started = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !settled_on(&region, "edgy", "local-ea1") {
        if Instant::now() > deadline {
            dump(&region);
            panic!(
                "edgy not back on local-ea1: {:?}",
                where_is(&region, "edgy")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "edge-a's agent started -> edgy back on local-ea1 in {} ms",
        started.elapsed().as_millis()
    );

    // The operator moves it to the center; the leader leaves it there.
    let target = format!("http://{}", region.http(3));
    let (ok, out) = region
        .gsharectl(&[
            "function", "move", "edgy", "--tenant", "acme", "--to", "center", "--region", &target,
            "--token", TOKEN,
        ])
        .unwrap();
    assert!(ok, "{out}");
    assert!(out.contains("completed"), "{out}");
    let (nodes, migrating) = where_is(&region, "edgy");
    assert!(!migrating, "{nodes:?}");
    let center = nodes.iter().next().cloned().unwrap_or_default();
    assert!(center.starts_with("local-c"), "{nodes:?}");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        settled_on(&region, "edgy", &center),
        "moved back: {:?}",
        where_is(&region, "edgy")
    );

    // `f`, at its max_instances, moves to the other center node.
    let (f_nodes, _) = where_is(&region, "f");
    let from = f_nodes.iter().next().cloned().unwrap();
    let to = if from == "local-c1" {
        "local-c2"
    } else {
        "local-c1"
    };
    let r = call(
        region.http(2),
        "POST",
        "/v1/tenants/acme/functions/f/move",
        TOKEN,
        Some(&json!({"to": format!("node:{to}")}).to_string()),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let v = json_of(&r);
    assert_eq!(v["moves"][0]["outcome"], json!("completed"), "{v}");
    assert_eq!(v["moves"][0]["node"], json!(to), "{v}");
    assert!(settled_on(&region, "f", to), "{:?}", where_is(&region, "f"));

    // edge-b has no agent: no room there, nothing moves.
    let r = call(
        http,
        "POST",
        "/v1/tenants/acme/functions/edgy/move",
        TOKEN,
        Some(&json!({"to": "edge-b"}).to_string()),
    );
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(json_of(&r)["error"]["code"], json!("no_room"), "{r:?}");
    assert!(settled_on(&region, "edgy", &center));
    // A word that is no pool or node.
    let r = call(
        http,
        "POST",
        "/v1/tenants/acme/functions/edgy/move",
        TOKEN,
        Some(&json!({"to": "nowhere"}).to_string()),
    );
    assert_eq!(r.status, 400, "{r:?}");
    // A tenant's token cannot move.
    let r = call(
        http,
        "POST",
        "/v1/tenants/acme/functions/edgy/move",
        &acme,
        Some(&json!({"to": "center"}).to_string()),
    );
    assert_eq!(r.status, 403, "{r:?}");

    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let _ = load.join();
    let log = log.lock().unwrap();
    let failed: Vec<_> = log.iter().filter(|(_, s, _)| *s != 200).collect();
    println!(
        "invocations during the moves: {} ({} failed)",
        log.len(),
        failed.len()
    );
    assert!(log.len() > 50, "too little load: {}", log.len());
    assert!(failed.is_empty(), "failed invocations: {failed:?}");

    // The leader counted them.
    let metrics = (1..=3)
        .map(|id| call(region.http(id), "GET", "/metrics", TOKEN, None).body)
        .collect::<Vec<_>>()
        .join("\n");
    for (cause, at_least) in [("return", 1), ("operator", 2)] {
        let line =
            format!("gshare_region_migrations_total{{cause=\"{cause}\",outcome=\"completed\"}} ");
        let n: f64 = metrics
            .lines()
            .filter_map(|l| l.strip_prefix(&line))
            .filter_map(|v| v.trim().parse::<f64>().ok())
            .sum();
        assert!(n >= f64::from(at_least), "{cause}: {n} in\n{metrics}");
    }
}
