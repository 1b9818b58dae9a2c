//! Node liveness on real processes: three replicas, agents on the two
//! center nodes of the local topology and none on the edge nodes, with
//! small graces. A node whose agent never came is `not_ready` after its
//! join grace and takes nothing; an agent killed with SIGKILL under load
//! makes its node `not_ready` and its functions serve again from the
//! other node (the time from the kill to the first success is printed,
//! not asserted); the agent restarted is reconciled (it holds exactly
//! the region's instances of its node, and no instance is held twice);
//! a drain moves everything off a node and an undrain lets placements
//! back.

use gshare_region::http_client::{request, HttpReply};
use gshare_tests::{TestRegion, TOKEN};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Graces small enough for a quick test (the defaults are 60 s, 3 s, 2 s).
const GRACES: &str =
    "agent_join_grace_s = 6\nnode_ready_grace_ms = 1500\nnode_replace_grace_ms = 1000\n";
/// With `GSHARE_LIVENESS_DEFAULTS=1`: the default ready and replace graces
/// (only the join grace is shortened), to measure kill → serving as
/// shipped.
const DEFAULT_GRACES: &str = "agent_join_grace_s = 6\n";
const NODES: [&str; 2] = ["local-c1", "local-c2"];

/// What the load saw: when, which function, the HTTP status.
type Log = Arc<Mutex<Vec<(Instant, &'static str, u16)>>>;

fn call(addr: SocketAddr, method: &str, path: &str, token: &str, body: Option<&str>) -> HttpReply {
    request(
        addr,
        method,
        path,
        Some(token),
        body,
        Duration::from_secs(20),
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

/// One agent process of the test, restartable with the same config.
struct Agent {
    config: PathBuf,
    ingress: SocketAddr,
    child: Option<Child>,
}

impl Agent {
    fn start(&mut self) {
        let child = Command::new(gshare_tests::binary("gshare-edge"))
            .arg("--config")
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start agent");
        self.child = Some(child);
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The instance ids the agent holds (`None` while it does not answer).
    fn holds(&self) -> Option<BTreeSet<u64>> {
        let r = call(self.ingress, "GET", "/v1/agent/placement", "-", None);
        let v = json_of(&r);
        let functions = v["functions"].as_array()?;
        Some(
            functions
                .iter()
                .flat_map(|f| f["instances"].as_array().cloned().unwrap_or_default())
                .filter_map(|i| i[0].as_u64())
                .collect(),
        )
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn agent(region: &TestRegion, node: &str) -> Agent {
    let (config, ingress) = region.sim_agent_config(node, &[]).expect("agent config");
    let mut a = Agent {
        config,
        ingress,
        child: None,
    };
    a.start();
    a
}

/// `GET /v1/nodes` on replica `id`, by node name.
fn nodes(region: &TestRegion, id: u64) -> BTreeMap<String, Value> {
    let r = call(region.http(id), "GET", "/v1/nodes", TOKEN, None);
    json_of(&r)
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| (n["node"].as_str().unwrap_or("").to_string(), n.clone()))
        .collect()
}

fn state_of(region: &TestRegion, id: u64, node: &str) -> String {
    nodes(region, id)
        .get(node)
        .and_then(|n| n["state"].as_str().map(String::from))
        .unwrap_or_default()
}

/// The replicated instances on every node: node → instance ids; and the
/// instances of each function (by name).
fn placement(
    region: &TestRegion,
    id: u64,
) -> (BTreeMap<String, BTreeSet<u64>>, BTreeMap<String, Vec<u64>>) {
    let r = call(region.http(id), "GET", "/v1/cluster/state", TOKEN, None);
    let v = json_of(&r);
    let mut by_node: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let mut by_function: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (k, inst) in v["instances"].as_object().into_iter().flatten() {
        let id: u64 = k.parse().unwrap_or(0);
        let node = inst["slices"][0]["gpu"]["node"].as_str().unwrap_or("");
        by_node.entry(node.to_string()).or_default().insert(id);
        let f = inst["function"].as_str().unwrap_or("").to_string();
        by_function.entry(f).or_default().push(id);
    }
    (by_node, by_function)
}

fn node_of(region: &TestRegion, function: &str) -> Option<String> {
    let (by_node, by_function) = placement(region, 1);
    let ids = by_function.get(function)?;
    by_node
        .iter()
        .find(|(_, set)| ids.iter().any(|i| set.contains(i)))
        .map(|(n, _)| n.clone())
}

#[test]
fn liveness_moves_work_off_dead_and_drained_nodes_and_reconciles_a_returning_agent() {
    let graces = if std::env::var_os("GSHARE_LIVENESS_DEFAULTS").is_some() {
        DEFAULT_GRACES
    } else {
        GRACES
    };
    let mut region = TestRegion::with_config(3, graces).expect("region");
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
    // Before any agent: every node is pending.
    let before = nodes(&region, 2);
    assert_eq!(before.len(), 4, "{before:?}");
    assert!(
        before.values().all(|n| n["state"] == json!("pending")),
        "{before:?}"
    );

    let mut agents: BTreeMap<&str, Agent> = NODES.iter().map(|n| (*n, agent(&region, n))).collect();
    for node in NODES {
        until(&format!("{node} ready"), 30, || {
            (state_of(&region, 1, node) == "ready").then_some(())
        });
    }
    // The edge nodes never get an agent: not_ready after the join grace,
    // seen from every replica, and they take nothing (an edge-preferring
    // function spills to the center).
    for id in 1..=3 {
        for node in ["local-ea1", "local-eb1"] {
            until(&format!("{node} not_ready on replica {id}"), 30, || {
                (state_of(&region, id, node) == "not_ready").then_some(())
            });
        }
    }
    let edge = json!({
        "name": "edgy", "runtime": "pytorch", "memory_mib": 1000, "compute_milli": 100,
        "tier": "guaranteed", "deadline_ms": 5000, "pool": "edge:edge-a",
        "latency": {"full_gpu_us": 2000, "saturation_milli": 100},
    })
    .to_string();
    let r = call(http, "POST", "/v1/functions?wait=ready", &acme, Some(&edge));
    assert_eq!(r.status, 201, "{r:?}");
    let on = json_of(&r)["instances"][0]["slices"][0]["gpu"]["node"].clone();
    assert!(on == json!("local-c1") || on == json!("local-c2"), "{r:?}");

    // Two functions, both on the center nodes; `f` at its max_instances.
    for (name, max) in [("f", 1), ("g", 2)] {
        let spec = json!({
            "name": name, "runtime": "pytorch", "memory_mib": 2000, "compute_milli": 200,
            "tier": "guaranteed", "deadline_ms": 5000, "pool": "center",
            "min_instances": 1, "max_instances": max,
            "latency": {"full_gpu_us": 2000, "saturation_milli": 100},
        })
        .to_string();
        let r = call(http, "POST", "/v1/functions?wait=ready", &acme, Some(&spec));
        assert_eq!(r.status, 201, "{r:?}");
    }
    for name in ["f", "g"] {
        until(&format!("{name} serves"), 30, || {
            let r = call(
                http,
                "POST",
                &format!("/v1/invoke/acme/{name}"),
                &acme,
                Some("{}"),
            );
            (r.status == 200).then_some(())
        });
    }

    // Load: invocations of `f` and `g` through replica 2, all along.
    let stop = Arc::new(AtomicBool::new(false));
    let log: Log = Arc::default();
    let load = {
        let (stop, log, acme) = (stop.clone(), log.clone(), acme.clone());
        let via = region.http(2);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for name in ["f", "g"] {
                    let r = request(
                        via,
                        "POST",
                        &format!("/v1/invoke/acme/{name}"),
                        Some(&acme),
                        Some("{}"),
                        Duration::from_secs(5),
                    );
                    let status = r.map_or(0, |r| r.status);
                    log.lock().unwrap().push((Instant::now(), name, status));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };

    // Kill -9 the agent hosting `f`.
    let victim = node_of(&region, "f").expect("f placed");
    let other = NODES.iter().find(|n| **n != victim).unwrap().to_string();
    let killed_at = Instant::now();
    agents.get_mut(victim.as_str()).unwrap().kill9();
    until(&format!("{victim} not_ready"), 30, || {
        (state_of(&region, 3, &victim) == "not_ready").then_some(())
    });
    println!(
        "kill -9 of {victim}'s agent → not_ready in {} ms",
        killed_at.elapsed().as_millis()
    );
    until("f re-placed elsewhere", 30, || {
        (node_of(&region, "f").as_deref() == Some(other.as_str())).then_some(())
    });
    until("f served again after the kill", 30, || {
        log.lock()
            .unwrap()
            .iter()
            .find(|(at, name, status)| *at > killed_at && *name == "f" && *status == 200)
            .map(|(at, _, _)| {
                println!(
                    "kill -9 of {victim}'s agent → first successful invocation of f from {other} in {} ms",
                    at.duration_since(killed_at).as_millis()
                );
            })
    });
    // The dead node takes nothing: everything is on `other`.
    let (by_node, _) = placement(&region, 1);
    assert!(
        by_node.get(&victim).is_none_or(BTreeSet::is_empty),
        "{by_node:?}"
    );

    // The agent comes back: ready again, and reconciled — it holds exactly
    // the region's instances of its node (none of the ones moved away),
    // and no instance is held by both agents.
    agents.get_mut(victim.as_str()).unwrap().start();
    until(&format!("{victim} ready again"), 30, || {
        (state_of(&region, 1, &victim) == "ready").then_some(())
    });
    let reconciled = |region: &TestRegion, agents: &BTreeMap<&str, Agent>| {
        let (by_node, _) = placement(region, 1);
        NODES.iter().all(|n| {
            let want = by_node.get(*n).cloned().unwrap_or_default();
            agents[n].holds() == Some(want)
        })
    };
    until(
        "both agents hold exactly the region's instances",
        30,
        || reconciled(&region, &agents).then_some(()),
    );
    let a = agents[NODES[0]].holds().unwrap_or_default();
    let b = agents[NODES[1]].holds().unwrap_or_default();
    assert!(a.is_disjoint(&b), "an instance is held twice: {a:?} {b:?}");

    // Drain `other`: everything moves to `victim` (g: a new one first).
    let target = format!("http://{}", region.http(2));
    let (ok, out) = region
        .gsharectl(&[
            "node", "drain", &other, "--region", &target, "--token", TOKEN,
        ])
        .unwrap();
    assert!(ok, "{out}");
    until(&format!("{other} drained"), 60, || {
        let (by_node, by_function) = placement(&region, 3);
        let empty = by_node.get(&other).is_none_or(BTreeSet::is_empty);
        let all_there = ["f", "g", "edgy"]
            .iter()
            .all(|f| by_function.get(*f).is_some_and(|v| !v.is_empty()));
        (empty && all_there).then_some(())
    });
    assert_eq!(node_of(&region, "f").as_deref(), Some(victim.as_str()));
    until("f and g serve from the drained node's peer", 30, || {
        ["f", "g"]
            .iter()
            .all(|name| {
                call(
                    http,
                    "POST",
                    &format!("/v1/invoke/acme/{name}"),
                    &acme,
                    Some("{}"),
                )
                .status
                    == 200
            })
            .then_some(())
    });
    let (ok, out) = region
        .gsharectl(&["node", "ls", "--region", &target, "--token", TOKEN])
        .unwrap();
    assert!(
        ok && out.contains("STATE") && out.contains("not_ready"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with(other.as_str()) && l.contains("yes")),
        "{out}"
    );
    // Undrain it and drain `victim`: placements go back onto `other`.
    let (ok, out) = region
        .gsharectl(&[
            "node", "undrain", &other, "--region", &target, "--token", TOKEN,
        ])
        .unwrap();
    assert!(ok, "{out}");
    let (ok, out) = region
        .gsharectl(&[
            "node", "drain", &victim, "--region", &target, "--token", TOKEN,
        ])
        .unwrap();
    assert!(ok, "{out}");
    until("everything back on the undrained node", 60, || {
        let (by_node, _) = placement(&region, 1);
        by_node
            .get(&victim)
            .is_none_or(BTreeSet::is_empty)
            .then_some(())
    });
    assert_eq!(node_of(&region, "f").as_deref(), Some(other.as_str()));
    stop.store(true, Ordering::Relaxed);
    let _ = load.join();

    // The node states are on /metrics.
    let m = call(http, "GET", "/metrics", TOKEN, None).body;
    assert!(
        m.contains(
            "gshare_region_node_state{pool=\"edge-a\",node=\"local-ea1\",state=\"not_ready\"} 1"
        ),
        "{m}"
    );
    assert!(m.contains("gshare_region_nodes{state=\"ready\"} 2"), "{m}");
    assert!(
        m.contains(&format!(
            "gshare_region_node_draining{{pool=\"center\",node=\"{victim}\"}} 1"
        )),
        "{m}"
    );
}
