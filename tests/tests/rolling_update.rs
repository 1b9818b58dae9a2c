//! A reshaping `function update` on real processes is make-before-break:
//! one replica, simulated agents on the two center nodes, a function of
//! two instances under steady invocations; the update changes its memory,
//! the roll replaces each instance (new one placed, resident, then the old
//! one released), and no invocation fails meanwhile. The function never
//! has fewer than its two instances, and at some moment it has an old and
//! a new one side by side.

use gshare_tests::{call, json_of, until, AgentProcess, TestRegion, TOKEN};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const NODES: [&str; 2] = ["local-c1", "local-c2"];

fn spec(memory_mib: u64) -> String {
    json!({
        "name": "f", "runtime": "pytorch", "memory_mib": memory_mib, "compute_milli": 200,
        "tier": "guaranteed", "deadline_ms": 5000, "pool": "center",
        "min_instances": 2, "max_instances": 2,
        "latency": {"full_gpu_us": 2000, "saturation_milli": 100},
    })
    .to_string()
}

/// `(instance, version, outgoing)` of one instance in a function view.
type Seen = (u64, u64, bool);

/// Each instance in a function view.
fn instances(v: &Value) -> Vec<Seen> {
    v["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            (
                i["instance"].as_u64().unwrap_or(0),
                i["version"].as_u64().unwrap_or(0),
                i["outgoing"] == json!(true),
            )
        })
        .collect()
}

#[test]
fn a_reshaping_update_replaces_instances_while_every_invocation_succeeds() {
    let mut region = TestRegion::new(1).expect("region");
    region.start(1, true).expect("start");
    region
        .wait_leader(&[1], Duration::from_secs(15))
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
    let _agents: Vec<AgentProcess> = NODES
        .iter()
        .map(|node| {
            let (config, _) = region.sim_agent_config(node, &[]).expect("agent config");
            AgentProcess::start(&config)
        })
        .collect();
    for node in NODES {
        until(&format!("{node} ready"), 30, || {
            let r = call(http, "GET", "/v1/nodes", TOKEN, None);
            json_of(&r)
                .as_array()
                .into_iter()
                .flatten()
                .any(|n| n["node"] == json!(node) && n["state"] == json!("ready"))
                .then_some(())
        });
    }
    let r = call(
        http,
        "POST",
        "/v1/functions?wait=ready",
        &acme,
        Some(&spec(2000)),
    );
    assert_eq!(r.status, 201, "{r:?}");
    until("f serves", 30, || {
        let r = call(http, "POST", "/v1/invoke/acme/f", &acme, Some("{}"));
        (r.status == 200).then_some(())
    });
    let before = instances(&json_of(&call(http, "GET", "/v1/functions/f", &acme, None)));
    assert_eq!(before.len(), 2, "{before:?}");

    // Invocations all along, and the function's instances as seen between them.
    let stop = Arc::new(AtomicBool::new(false));
    let statuses: Arc<Mutex<Vec<(u16, String)>>> = Arc::default();
    let seen: Arc<Mutex<Vec<Vec<Seen>>>> = Arc::default();
    let load = {
        let (stop, statuses, seen, acme) =
            (stop.clone(), statuses.clone(), seen.clone(), acme.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let r = call(http, "POST", "/v1/invoke/acme/f", &acme, Some("{}"));
                statuses.lock().unwrap().push((r.status, r.body));
                let v = json_of(&call(http, "GET", "/v1/functions/f", &acme, None));
                seen.lock().unwrap().push(instances(&v));
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let r = call(
        http,
        "PUT",
        "/v1/functions/f?wait=ready&ready_timeout_ms=60000",
        &acme,
        Some(&spec(3000)),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let u = json_of(&r);
    assert_eq!(u["version"], 2, "{u}");
    assert_eq!(u["released"], json!([]), "{u}");
    let old: Vec<u64> = before.iter().map(|i| i.0).collect();
    assert_eq!(u["replacing"], json!(old), "{u}");
    assert_eq!(u["function"]["ready"], json!(true), "{u}");
    let after = instances(&u["function"]);
    assert_eq!(after.len(), 2, "{u}");
    assert!(
        after
            .iter()
            .all(|i| i.1 == 2 && !i.2 && !old.contains(&i.0)),
        "{u}"
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();

    // What make-before-break means, checked first: an old instance was
    // seen beside the new one that replaces it, so the function had more
    // than its two instances at some moment (one-step moves keep two
    // throughout, old and new mixed), and never fewer than two.
    let seen = seen.lock().unwrap();
    let most = seen.iter().map(Vec::len).max().unwrap_or(0);
    assert!(
        most >= 3,
        "never saw an old instance beside its replacement (at most {most} at once)"
    );
    assert!(
        seen.iter()
            .any(|v| v.iter().any(|i| i.2) && v.iter().any(|i| i.1 == 2)),
        "never saw an old and a new instance side by side"
    );
    let fewest = seen.iter().map(Vec::len).min().unwrap_or(0);
    assert!(
        fewest >= 2,
        "the function had {fewest} instance(s) at some moment"
    );
    let statuses = statuses.lock().unwrap();
    let failed: Vec<&(u16, String)> = statuses.iter().filter(|(s, _)| *s != 200).collect();
    println!(
        "{} invocations during the roll, {} failed",
        statuses.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "failed invocations: {failed:?}");
    assert!(
        statuses.len() >= 10,
        "too few invocations: {}",
        statuses.len()
    );
}
