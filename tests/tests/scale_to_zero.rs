//! To zero and from zero on real processes: a replica and one simulated
//! agent; a function deployed with `min_instances = 0` starts with no
//! instance. Requests arriving together are held at the replica while one
//! wake places one instance, then served; idle for `idle_timeout_s` the
//! leader's autoscaler releases the last instance; the next request wakes
//! it again; a request whose deadline cannot cover a cold start is
//! answered `503 no_instance` (retryable) and nothing runs. With two
//! agents, a function back from zero goes to the node whose agent reports
//! its weights still in host memory, not where the ranking alone puts it.

use gshare_tests::raw_http::{assert_error, raw_request};
use gshare_tests::{call, json_of, until, AgentProcess, TestRegion, TOKEN};
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn instances(http: SocketAddr, token: &str) -> usize {
    nodes_of(http, token).len()
}

/// The node of each instance of `sleepy` (its first slice's GPU's).
fn nodes_of(http: SocketAddr, token: &str) -> Vec<String> {
    let r = call(http, "GET", "/v1/functions/sleepy", token, None);
    json_of(&r)["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            i["slices"][0]["gpu"]["node"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

/// The nodes whose agent reports a host copy of `sleepy`.
fn host_copy_nodes(http: SocketAddr) -> Vec<String> {
    let r = call(http, "GET", "/v1/cluster/agents", TOKEN, None);
    json_of(&r)
        .as_array()
        .cloned()
        .into_iter()
        .flatten()
        .filter(|a| {
            a["host_copies"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["function"] == "sleepy"))
        })
        .map(|a| a["node"].as_str().unwrap_or("").to_string())
        .collect()
}

/// A function of 1000 MiB, half a GPU, 10 ms a request on its slice, a
/// 10 s deadline (room for a cold start), scaling between 0 and 2.
fn sleepy_spec() -> String {
    json!({
        "name": "sleepy", "runtime": "pytorch", "memory_mib": 1000, "compute_milli": 500,
        "tier": "guaranteed", "deadline_ms": 10000, "pool": "center",
        "min_instances": 0, "max_instances": 2, "idle_timeout_s": 3,
        "latency": {"full_gpu_us": 5000, "saturation_milli": 500},
    })
    .to_string()
}

/// A tenant token for acme on `http`.
fn acme_token(http: SocketAddr) -> String {
    let r = until("token", 30, || {
        let r = call(http, "POST", "/v1/tenants/acme/tokens", TOKEN, None);
        (r.status == 201).then_some(r)
    });
    json_of(&r)["token"].as_str().unwrap().to_string()
}

/// The leader's count of scale-out evaluations, whatever their outcome.
fn scale_outs(http: SocketAddr) -> u64 {
    call(http, "GET", "/metrics", TOKEN, None)
        .body
        .lines()
        .filter(|l| l.starts_with("gshare_region_scheduler_evaluations_total{kind=\"scale_out\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn an_idle_function_goes_to_zero_and_a_request_brings_it_back() {
    let mut region = TestRegion::new(1).expect("region");
    region.start(1, true).expect("start");
    region
        .wait_leader(&[1], Duration::from_secs(15))
        .expect("leader");
    let http = region.http(1);
    let acme = acme_token(http);
    let (config, _) = region.sim_agent_config("local-c1", &[]).expect("agent");
    let _agent = AgentProcess::start(&config);
    // A few requests at once are far below one instance's target, so only
    // the wake places an instance.
    let spec = sleepy_spec();
    let r = until("deployed", 60, || {
        let r = call(http, "POST", "/v1/functions", &acme, Some(&spec));
        (r.status == 201 || r.status == 409).then_some(r)
    });
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(instances(http, &acme), 0);
    until("the agent registered", 30, || {
        let r = call(http, "GET", "/v1/cluster/agents", TOKEN, None);
        r.body.contains("local-c1").then_some(())
    });
    let before = scale_outs(http);

    // From zero: four requests together are held, one placement, all served.
    let started = Instant::now();
    let clients: Vec<_> = (0..4)
        .map(|k| {
            let acme = acme.clone();
            std::thread::spawn(move || {
                let body = format!("wake {k}");
                let r = call(http, "POST", "/v1/invoke/acme/sleepy", &acme, Some(&body));
                (r, started.elapsed())
            })
        })
        .collect();
    for c in clients {
        let (r, took) = c.join().unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        eprintln!("from zero: served after {took:?}");
    }
    assert_eq!(instances(http, &acme), 1);
    assert_eq!(
        scale_outs(http) - before,
        1,
        "one wake for requests together"
    );

    // Idle: the autoscaler releases the last instance.
    let idle = Instant::now();
    until("to zero", 20, || {
        (instances(http, &acme) == 0).then_some(())
    });
    eprintln!("to zero {:?} after the last request", idle.elapsed());
    // And it stays there: the autoscaler's windows still hold the load
    // from before, which must not bring an instance back by itself.
    let outs = scale_outs(http);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(instances(http, &acme), 0, "no request, no instance");
    assert_eq!(
        scale_outs(http),
        outs,
        "no scale-out at zero without a request"
    );

    // From zero again.
    let started = Instant::now();
    let r = call(http, "POST", "/v1/invoke/acme/sleepy", &acme, Some("again"));
    assert_eq!((r.status, r.body.as_str()), (200, "again"), "{r:?}");
    eprintln!("from zero again: served after {:?}", started.elapsed());
    until("to zero again", 20, || {
        (instances(http, &acme) == 0).then_some(())
    });

    // A deadline no cold start can meet: held no longer than it, refused,
    // retryable; nothing ran (no usage for its key).
    let bearer = format!("Bearer {acme}");
    let headers = [
        ("Authorization", bearer.as_str()),
        ("X-Gshare-Deadline-Ms", "1"),
        ("Idempotency-Key", "too-short-1"),
    ];
    let r = raw_request(http, "POST", "/v1/invoke/acme/sleepy", &headers, b"{}", 2);
    assert_error(&r, 503, "no_instance", true);
    assert_eq!(r.header("idempotency-key"), Some("too-short-1"), "{r:?}");
}

#[test]
fn a_function_back_from_zero_goes_to_the_node_holding_its_weights() {
    // local-c1 gets no agent at first: not_ready after the join grace, so
    // the first wake goes to local-c2. Then local-c1's agent comes; on two
    // empty center nodes the ranking alone picks local-c1 (the first), so
    // only the preference for the host copy brings the function back to
    // local-c2.
    let mut region = TestRegion::with_config(1, "agent_join_grace_s = 2\n").expect("region");
    region.start(1, true).expect("start");
    region
        .wait_leader(&[1], Duration::from_secs(15))
        .expect("leader");
    let http = region.http(1);
    let acme = acme_token(http);
    let (c2, _) = region.sim_agent_config("local-c2", &[]).expect("agent");
    let _c2 = AgentProcess::start(&c2);
    let node_state = |node: &str| {
        let r = call(http, "GET", "/v1/nodes", TOKEN, None);
        json_of(&r)
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["node"] == node)
            .and_then(|n| n["state"].as_str().map(String::from))
            .unwrap_or_default()
    };
    until("local-c1 not_ready, local-c2 ready", 30, || {
        (node_state("local-c1") == "not_ready" && node_state("local-c2") == "ready").then_some(())
    });
    let spec = sleepy_spec();
    let r = until("deployed", 60, || {
        let r = call(http, "POST", "/v1/functions", &acme, Some(&spec));
        (r.status == 201 || r.status == 409).then_some(r)
    });
    assert_eq!(r.status, 201, "{r:?}");
    let r = call(http, "POST", "/v1/invoke/acme/sleepy", &acme, Some("first"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(nodes_of(http, &acme), vec!["local-c2".to_string()]);

    let (c1, _) = region.sim_agent_config("local-c1", &[]).expect("agent");
    let _c1 = AgentProcess::start(&c1);
    until("local-c1 ready", 30, || {
        (node_state("local-c1") == "ready").then_some(())
    });
    until("to zero", 20, || {
        (instances(http, &acme) == 0).then_some(())
    });
    until("local-c2 reports the host copy", 20, || {
        (host_copy_nodes(http) == vec!["local-c2".to_string()]).then_some(())
    });
    // The tenant sees it too, in its function's view.
    let r = call(http, "GET", "/v1/functions/sleepy", &acme, None);
    assert_eq!(
        json_of(&r)["host_copies"],
        json!(["local-c2"]),
        "GET /v1/functions/sleepy: {r:?}"
    );

    // At once: the wake reads the host copies afresh, not the tick's.
    let started = Instant::now();
    let r = call(http, "POST", "/v1/invoke/acme/sleepy", &acme, Some("warm"));
    assert_eq!((r.status, r.body.as_str()), (200, "warm"), "{r:?}");
    eprintln!(
        "from zero on the host copy's node: served after {:?}",
        started.elapsed()
    );
    assert_eq!(
        nodes_of(http, &acme),
        vec!["local-c2".to_string()],
        "the function back from zero is placed where its weights wait"
    );
}
