//! Autoscaling on real processes: three replicas and two simulated agents;
//! a function deployed with `min_instances = 1`, `max_instances = 3` gets
//! more instances while clients keep it busy (the agents' load reports →
//! the leader's autoscaler → scale-out placements), never more than its
//! maximum; the leader's `/metrics` shows the decision, and a follower's
//! `GET /v1/functions/{name}` shows it too (asked of the leader).

use gshare_tests::{call, json_of, until, AgentProcess, TestRegion, TOKEN};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn instances(http: SocketAddr, token: &str) -> usize {
    let r = call(http, "GET", "/v1/functions/burst", token, None);
    json_of(&r)["instances"].as_array().map_or(0, Vec::len)
}

#[test]
fn a_busy_function_scales_out_to_its_maximum() {
    let mut region = TestRegion::new(3).expect("region");
    for id in 1..=3 {
        region.start(id, id == 1).expect("start");
    }
    let leader = region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    let http = region.http(leader);
    let follower = region.http(if leader == 1 { 2 } else { 1 });
    let r = until("token", 30, || {
        let r = call(http, "POST", "/v1/tenants/acme/tokens", TOKEN, None);
        (r.status == 201).then_some(r)
    });
    let acme = json_of(&r)["token"].as_str().unwrap().to_string();
    let _agents: Vec<AgentProcess> = ["local-c1", "local-c2"]
        .iter()
        .map(|node| {
            let (config, _) = region.sim_agent_config(node, &[]).expect("agent config");
            AgentProcess::start(&config)
        })
        .collect();
    // 100 ms a request on its 500-milli slice, a 300 ms deadline: three
    // fit in a deadline, the target is 2.1 requests at once per instance.
    let spec = json!({
        "name": "burst", "runtime": "pytorch", "memory_mib": 1000, "compute_milli": 500,
        "tier": "guaranteed", "deadline_ms": 300, "pool": "center",
        "min_instances": 1, "max_instances": 3,
        "latency": {"full_gpu_us": 100000, "saturation_milli": 500},
    })
    .to_string();
    let r = until("deployed and ready", 60, || {
        let r = call(http, "POST", "/v1/functions?wait=ready", &acme, Some(&spec));
        (r.status == 201 || r.status == 409).then_some(r)
    });
    assert_eq!(r.status, 201, "{r:?}");
    until("burst serves", 30, || {
        let r = call(http, "POST", "/v1/invoke/acme/burst", &acme, Some("{}"));
        (r.status == 200).then_some(())
    });
    assert_eq!(instances(http, &acme), 1);

    // Twelve clients back to back: far above one instance's target.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..12)
        .map(|_| {
            let (stop, served, acme) = (stop.clone(), served.clone(), acme.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let r = call(http, "POST", "/v1/invoke/acme/burst", &acme, Some("{}"));
                    if r.status == 200 {
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let started = Instant::now();
    until("scaled out to 3", 60, || {
        (instances(http, &acme) == 3).then_some(())
    });
    eprintln!("scaled out to 3 in {:?}", started.elapsed());
    // A follower's describe carries the leader's latest decision: three
    // wanted in panic mode (the panic window's mean far above one
    // instance's target; cut to max_instances when it asks for more).
    let block = until("the decision through a follower", 30, || {
        let r = call(follower, "GET", "/v1/functions/burst", &acme, None);
        let a = json_of(&r)["autoscale"].clone();
        let d = &a["decision"];
        (a["status"] == "decided" && d["desired"] == 3 && d["current"] == 3).then_some(a)
    });
    eprintln!("autoscale block through a follower: {block}");
    assert_eq!(block["leader"], leader, "{block}");
    // At 3 of 3 the load may be explained by either window: panic mode
    // (cut to max) or the stable mean (5.8 / 2.1 per instance → 3).
    let rule = block["decision"]["rule"].as_str().unwrap_or_default();
    assert!(["panic", "max", "stable"].contains(&rule), "{block}");
    assert_eq!(block["decision"]["target_milli"], 2_100, "{block}");
    assert!(block["age_ms"].as_u64().is_some(), "{block}");
    // Never past the maximum, while the load goes on.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(instances(http, &acme), 3);
    let metrics = call(http, "GET", "/metrics", TOKEN, None).body;
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("gshare_region_autoscale_desired_instances{")
                && l.contains("function=\"burst\"")
        })
        .unwrap_or_else(|| panic!("no decision for burst in {metrics}"))
        .to_string();
    assert!(line.ends_with(" 3"), "{line}");
    assert!(
        metrics.lines().any(|l| l.starts_with(
            "gshare_region_scheduler_evaluations_total{kind=\"scale_out\",outcome=\"committed\"} 2"
        )),
        "{metrics}"
    );
    assert!(
        metrics.lines().any(|l| l.starts_with(&format!(
            "gshare_region_autoscale_decisions_total{{rule=\"{rule}\"}} "
        ))),
        "{metrics}"
    );
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    assert!(served.load(Ordering::Relaxed) > 0);
}
