//! Defragmentation across nodes on real processes: one replica, simulated
//! agents on the two center nodes (two 16 GiB GPUs each), the edge nodes
//! without agents. The center is filled so that every GPU has some room
//! and none has 6 GiB, while one GPU would have 8 GiB without a small
//! burstable instance of another tenant. Raising acme/b's `min_instances`
//! to 1 (6 GiB) finds no GPU (`gpu_full`); the leader moves the burstable
//! instance to the other node make-before-break, and then places acme/b on
//! the GPU it left. The moved function is invoked all along: not one
//! invocation fails. The move is counted in `/metrics` and explained in
//! the leader's log.

use gshare_region::http_client::request;
use gshare_tests::api_calls::{call, json_of, until, AgentProcess};
use gshare_tests::{TestRegion, TOKEN};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const GRACES: &str =
    "agent_join_grace_s = 3\nnode_ready_grace_ms = 1500\nnode_replace_grace_ms = 1000\n";

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

/// The GPUs `(node, index)` of `tenant/function`'s instances and whether
/// one of them migrates, in the replicated state.
fn gpus_of(region: &TestRegion, tenant: &str, function: &str) -> (BTreeSet<(String, u64)>, bool) {
    let v = json_of(&call(
        region.http(1),
        "GET",
        "/v1/cluster/state",
        TOKEN,
        None,
    ));
    let mut ids = BTreeSet::new();
    let mut gpus = BTreeSet::new();
    for (k, inst) in v["instances"].as_object().into_iter().flatten() {
        if inst["tenant"] == json!(tenant) && inst["function"] == json!(function) {
            ids.insert(k.clone());
            let g = &inst["slices"][0]["gpu"];
            if let (Some(n), Some(i)) = (g["node"].as_str(), g["index"].as_u64()) {
                gpus.insert((n.to_string(), i));
            }
        }
    }
    let migrating = v["migrations"]
        .as_object()
        .is_some_and(|m| m.keys().any(|k| ids.contains(k)));
    (gpus, migrating)
}

fn spec(name: &str, tier: &str, memory_mib: u64, min: u32, max: u32) -> String {
    json!({
        "name": name, "runtime": "pytorch", "memory_mib": memory_mib, "compute_milli": 250,
        "tier": tier, "deadline_ms": 5000, "pool": "center",
        "min_instances": min, "max_instances": max,
        "latency": {"full_gpu_us": 2000, "saturation_milli": 250},
    })
    .to_string()
}

fn token(region: &TestRegion, tenant: &str) -> String {
    let r = until("token", 30, || {
        let r = call(
            region.http(1),
            "POST",
            &format!("/v1/tenants/{tenant}/tokens"),
            TOKEN,
            None,
        );
        (r.status == 201).then_some(r)
    });
    json_of(&r)["token"].as_str().unwrap().to_string()
}

fn deploy(region: &TestRegion, token: &str, body: &str) -> Value {
    let r = call(
        region.http(1),
        "POST",
        "/v1/functions?wait=ready",
        token,
        Some(body),
    );
    assert_eq!(r.status, 201, "{r:?}");
    json_of(&r)
}

fn metric(region: &TestRegion, line: &str) -> f64 {
    call(region.http(1), "GET", "/metrics", TOKEN, None)
        .body
        .lines()
        .filter_map(|l| l.strip_prefix(line))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

#[test]
fn a_small_burstable_instance_moves_to_another_node_to_make_room_without_a_failed_invocation() {
    let mut region = TestRegion::with_config(1, GRACES).expect("region");
    region.start(1, true).expect("start");
    region
        .wait_leader(&[1], Duration::from_secs(15))
        .expect("leader");
    until("tenants loaded", 30, || {
        let r = call(region.http(1), "GET", "/v1/tenants", TOKEN, None);
        json_of(&r)
            .as_array()
            .is_some_and(|a| a.len() == 2)
            .then_some(())
    });
    let acme = token(&region, "acme");
    let globex = token(&region, "globex");
    let (c1, _) = region.sim_agent_config("local-c1", &[]).expect("config");
    let _c1 = AgentProcess::start(&c1);
    until("local-c1 ready", 30, || {
        (node_state(&region, "local-c1") == "ready").then_some(())
    });
    for node in ["local-c2", "local-ea1", "local-eb1"] {
        until(&format!("{node} not_ready (no agent yet)"), 30, || {
            (node_state(&region, node) == "not_ready").then_some(())
        });
    }

    // local-c1 only: acme/a1 (8 GiB) and acme/a2 (14 GiB) take a GPU
    // each; globex/s (3 GiB, burstable) fits only beside a1 (5 GiB left).
    deploy(&region, &acme, &spec("a1", "guaranteed", 8_192, 1, 1));
    deploy(&region, &acme, &spec("a2", "guaranteed", 14_336, 1, 1));
    deploy(&region, &globex, &spec("s", "burstable", 3_072, 1, 1));
    let (a1, _) = gpus_of(&region, "acme", "a1");
    let (s_before, _) = gpus_of(&region, "globex", "s");
    assert_eq!(s_before, a1, "s beside a1");
    // local-c2: globex/g, two 12 GiB instances, one per GPU (4 GiB left each).
    let (c2, _) = region.sim_agent_config("local-c2", &[]).expect("config");
    let _c2 = AgentProcess::start(&c2);
    until("local-c2 ready", 30, || {
        (node_state(&region, "local-c2") == "ready").then_some(())
    });
    deploy(&region, &globex, &spec("g", "guaranteed", 12_288, 2, 2));
    let (g, _) = gpus_of(&region, "globex", "g");
    assert_eq!(g.len(), 2, "{g:?}");
    assert!(g.iter().all(|(n, _)| n == "local-c2"), "{g:?}");

    // acme/b (6 GiB) at min 0: deployed without an instance; no GPU has
    // 6 GiB (5, 2, 4, 4), the center has 15 in sum.
    deploy(&region, &acme, &spec("b", "guaranteed", 6_144, 0, 1));
    let dry = call(
        region.http(1),
        "POST",
        "/v1/functions?dry_run=true",
        &acme,
        Some(&spec("b2", "guaranteed", 6_144, 1, 1)),
    );
    assert_eq!(json_of(&dry)["code"], json!("gpu_full"), "{dry:?}");

    // Load on globex/s from now on.
    let stop = Arc::new(AtomicBool::new(false));
    let log: Arc<Mutex<Vec<(u16, String)>>> = Arc::default();
    let load = {
        let (stop, log, globex) = (stop.clone(), log.clone(), globex.clone());
        let via = region.http(1);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let r = request(
                    via,
                    "POST",
                    "/v1/invoke/globex/s",
                    Some(&globex),
                    Some("{}"),
                    Duration::from_secs(10),
                );
                let (status, body) = r.map_or_else(|e| (0, e.to_string()), |r| (r.status, r.body));
                log.lock().unwrap().push((status, body));
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));

    // acme/b needs one instance now: gpu_full, then a defragmentation.
    let started = Instant::now();
    let r = call(
        region.http(1),
        "PUT",
        "/v1/functions/b",
        &acme,
        Some(&spec("b", "guaranteed", 6_144, 1, 1)),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let placed = loop {
        let (b, _) = gpus_of(&region, "acme", "b");
        let (s, migrating) = gpus_of(&region, "globex", "s");
        if !b.is_empty() && !migrating {
            break (b, s);
        }
        if Instant::now() > deadline {
            for l in region.stderr(1, 1).lines().filter(|l| l.contains("defrag")) {
                println!("r1: {l}");
            }
            panic!("acme/b not placed: b {b:?}, s {s:?} (migrating: {migrating})");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    println!(
        "min_instances raised -> acme/b placed in {} ms",
        started.elapsed().as_millis()
    );
    let (b, s_after) = placed;
    assert_eq!(b, a1, "acme/b on the GPU globex/s left");
    assert_eq!(s_after.len(), 1, "{s_after:?}");
    assert!(
        s_after.iter().all(|(n, _)| n == "local-c2"),
        "globex/s moved to the other node: {s_after:?}"
    );

    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let _ = load.join();
    let log = log.lock().unwrap();
    let failed: Vec<_> = log.iter().filter(|(s, _)| *s != 200).collect();
    println!(
        "globex/s invocations during the defragmentation: {} ({} failed)",
        log.len(),
        failed.len()
    );
    assert!(log.len() > 20, "too little load: {}", log.len());
    assert!(failed.is_empty(), "failed invocations: {failed:?}");

    for outcome in ["started", "completed"] {
        let line = format!(
            "gshare_region_migrations_total{{cause=\"defragment\",outcome=\"{outcome}\"}} "
        );
        assert_eq!(metric(&region, &line), 1.0, "{line}");
    }
    let said: Vec<String> = region
        .stderr(1, 1)
        .lines()
        .filter(|l| l.contains("defragmentation: acme/b"))
        .map(String::from)
        .collect();
    println!("{}", said.first().map_or("", |l| l.as_str()));
    assert!(
        said.iter()
            .any(|l| l.contains("globex/s") && l.contains("makes room on")),
        "{said:?}"
    );
}
