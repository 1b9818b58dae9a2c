//! The region's scheduler on real processes: a deploy is an evaluation the
//! leader plans and commits as one entry (through a follower too), a
//! function larger than every GPU is `422 unsatisfiable` naming the largest
//! GPU, a dry run shows where instances would go and what was passed over,
//! the shipped example function deploys on the local region, and a deploy
//! that waits for `ready` answers invocations on the first try.

use gshare_region::http_client::{request, HttpReply};
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

/// A 3-replica local region with its tenants loaded; acme's token.
fn started() -> (TestRegion, String) {
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
        json_of(&r)
            .as_array()
            .is_some_and(|a| a.len() == 2)
            .then_some(r)
    });
    let r = until("token", || {
        let r = call(http, "POST", "/v1/tenants/acme/tokens", TOKEN, None);
        (r.status == 201).then_some(r)
    });
    let acme = json_of(&r)["token"].as_str().unwrap().to_string();
    // Every replica knows the token before the test uses any of them.
    for id in 1..=3 {
        until("token everywhere", || {
            let r = call(region.http(id), "GET", "/v1/functions", &acme, None);
            (r.status == 200).then_some(r)
        });
    }
    (region, acme)
}

fn follower(region: &TestRegion) -> u64 {
    let leader = region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    (1..=3).find(|&id| id != leader).unwrap()
}

#[test]
fn deploys_are_planned_by_the_leader_and_explain_themselves() {
    let (region, acme) = started();
    let via = region.http(follower(&region));
    let f = json!({
        "name": "small", "runtime": "pytorch", "memory_mib": 2000, "compute_milli": 200,
        "tier": "guaranteed", "deadline_ms": 500, "min_instances": 2,
    })
    .to_string();
    // A dry run shows where the two instances would go, and deploys nothing.
    let r = call(via, "POST", "/v1/functions?dry_run=true", &acme, Some(&f));
    assert_eq!(r.status, 200, "{r:?}");
    let dry = json_of(&r);
    assert_eq!(dry["placeable"], json!(true), "{dry}");
    assert_eq!(dry["instances"].as_array().map(Vec::len), Some(2), "{dry}");
    assert!(
        dry["instances"][0]["metric"]["nodes_evaluated"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "{dry}"
    );
    let r = call(via, "GET", "/v1/functions/small", &acme, None);
    assert_eq!(r.status, 404, "a dry run deployed: {r:?}");
    // Through a follower: the leader's scheduler commits deploy + placements.
    let r = request(
        via,
        "POST",
        "/v1/functions",
        Some(&acme),
        Some(&f),
        Duration::from_secs(20),
    )
    .expect("deploy");
    assert_eq!(r.status, 201, "{r:?}");
    let created = json_of(&r);
    assert_eq!(
        created["instances"].as_array().map(Vec::len),
        Some(2),
        "{created}"
    );
    let key = r.header("idempotency-key").expect("key").to_string();
    // A retry under the same key answers the same instances (nothing new).
    let again = gshare_tests::raw_http::raw_request(
        region.http(1),
        "POST",
        "/v1/functions",
        &[
            ("Authorization", &format!("Bearer {acme}")),
            ("Idempotency-Key", &key),
            ("Content-Type", "application/json"),
        ],
        f.as_bytes(),
        f.len(),
    );
    assert_eq!(again.status, 201, "{again:?}");
    assert_eq!(
        json_of(&again)["instances"],
        created["instances"],
        "{again:?}"
    );
    // The name is taken now: the dry run says so too, once the follower
    // has applied the deploy (it reads its own state; the deploy was
    // answered by the leader, which may be ahead of it for a moment).
    let until = std::time::Instant::now() + Duration::from_secs(5);
    let r = loop {
        let r = call(via, "POST", "/v1/functions?dry_run=true", &acme, Some(&f));
        if json_of(&r)["code"] == json!("duplicate_name") || std::time::Instant::now() > until {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(json_of(&r)["code"], json!("duplicate_name"), "{r:?}");

    // Larger than every GPU of the region (16 GiB): 422 naming the largest.
    let huge = json!({
        "name": "huge", "runtime": "vllm", "memory_mib": 18_432, "compute_milli": 500,
        "tier": "guaranteed", "deadline_ms": 800,
    })
    .to_string();
    let r = call(via, "POST", "/v1/functions", &acme, Some(&huge));
    assert_eq!(r.status, 422, "{r:?}");
    let e = &json_of(&r)["error"];
    assert_eq!(e["code"], json!("unsatisfiable"), "{r:?}");
    let message = e["message"].as_str().unwrap_or("");
    assert!(
        message.contains("local-c1/gpu0") && message.contains("16384 MiB"),
        "{message}"
    );
    let r = call(
        via,
        "POST",
        "/v1/functions?dry_run=true",
        &acme,
        Some(&huge),
    );
    let dry = json_of(&r);
    assert_eq!(
        (dry["placeable"].clone(), dry["code"].clone()),
        (json!(false), json!("unsatisfiable")),
        "{dry}"
    );
    // A spec the deploy refuses as invalid (an exclusive function takes
    // whole GPUs): the dry run refuses it the same way, it does not plan it.
    let odd = json!({
        "name": "odd", "runtime": "vllm", "memory_mib": 4_000, "compute_milli": 1_500,
        "tier": "exclusive", "deadline_ms": 800,
    })
    .to_string();
    for path in ["/v1/functions?dry_run=true", "/v1/functions"] {
        let r = call(via, "POST", path, &acme, Some(&odd));
        assert_eq!(r.status, 422, "{path}: {r:?}");
        assert_eq!(
            json_of(&r)["error"]["code"],
            json!("invalid_spec"),
            "{path}: {r:?}"
        );
    }
    // A function that fits a GPU but not the free room: 409 with the counts.
    let wide = json!({
        "name": "wide", "runtime": "vllm", "memory_mib": 15_000, "compute_milli": 500,
        "tier": "guaranteed", "deadline_ms": 800, "min_instances": 3,
    })
    .to_string();
    let r = call(
        via,
        "POST",
        "/v1/functions?dry_run=true",
        &acme,
        Some(&wide),
    );
    let dry = json_of(&r);
    assert_eq!(dry["placeable"], json!(false), "{dry}");
    assert!(
        dry["rejection"]["nodes_evaluated"].as_u64() > Some(0),
        "{dry}"
    );
    let r = call(via, "POST", "/v1/functions", &acme, Some(&wide));
    assert!(r.status == 409, "{r:?}");

    // The shipped example deploys on this (the quick start's) region, and
    // gsharectl's dry run prints where it would go.
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/examples/function.toml");
    let example = example.to_str().unwrap();
    let target = format!("http://{via}");
    let ctl = |args: &[&str]| {
        let mut all = vec!["function"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--region", &target, "--token", &acme]);
        region.gsharectl(&all).expect("gsharectl")
    };
    let (ok, out) = ctl(&["deploy", "-f", example, "--dry-run"]);
    assert!(ok && out.contains("local-c1/gpu"), "{out}");
    let (ok, out) = ctl(&["deploy", "-f", example, "--no-wait"]);
    assert!(ok, "{out}");
    let (ok, out) = ctl(&["describe", "llama-8b-chat"]);
    assert!(
        ok && out.contains("STATE") && out.contains("placed"),
        "{out}"
    );
    let (ok, out) = ctl(&["deploy", "-f", example, "--dry-run"]);
    assert!(!ok && out.contains("duplicate_name"), "{out}");

    // The leader's scheduler counted its evaluations.
    let leader = region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .unwrap();
    let m = call(region.http(leader), "GET", "/metrics", TOKEN, None).body;
    assert!(
        m.contains(
            "gshare_region_scheduler_evaluations_total{kind=\"deploy\",outcome=\"committed\"}"
        ),
        "{m}"
    );
    assert!(
        m.contains(
            "gshare_region_scheduler_evaluations_total{kind=\"deploy\",outcome=\"rejected\"}"
        ),
        "{m}"
    );
}

#[test]
fn a_deploy_that_waits_for_ready_serves_its_first_invocation() {
    let (region, acme) = started();
    // One agent, on local-c1; the other center node (local-c2, which has
    // no agent) is taken out of the topology so that center deploys land
    // on local-c1.
    let node = "local-c1";
    let text = gshare_tests::test_region::LOCAL_TOPOLOGY;
    let block = "[[pools.nodes]]\nname = \"local-c2\"";
    let start = text.find(block).expect("local-c2 block");
    let rest = &text[start + block.len()..];
    let stop = rest
        .find("[[pools")
        .map_or(text.len(), |i| start + block.len() + i);
    std::fs::write(
        region.path("topology.toml"),
        format!("{}{}", &text[..start], &text[stop..]),
    )
    .expect("write topology");
    until("reload", || {
        let r = call(region.http(1), "POST", "/v1/topology/reload", TOKEN, None);
        (r.status == 200).then_some(r)
    });
    let (config, _ingress) = region.sim_agent_config(node, &[]).expect("agent config");
    let mut agent = Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The agent is registered (its node takes placements from then on).
    until("agent registered", || {
        let r = call(region.http(1), "GET", "/v1/cluster/state", TOKEN, None);
        r.body
            .contains(&format!("\"{node}\""))
            .then_some(r)
            .filter(|r| {
                json_of(r)["agents"]
                    .as_object()
                    .is_some_and(|a| !a.is_empty())
            })
    });
    for n in 0..4 {
        let f = json!({
            "name": format!("f{n}"), "runtime": "pytorch", "memory_mib": 2000, "compute_milli": 100,
            "tier": "guaranteed", "deadline_ms": 5000, "pool": "center",
            "latency": {"full_gpu_us": 2000, "saturation_milli": 100},
        })
        .to_string();
        let via = region.http(1 + n % 3);
        let r = call(via, "POST", "/v1/functions?wait=ready", &acme, Some(&f));
        assert_eq!(r.status, 201, "{r:?}");
        let v = json_of(&r);
        assert_eq!(
            v["instances"][0]["slices"][0]["gpu"]["node"],
            json!(node),
            "{v}"
        );
        assert_eq!(v["ready"], json!(true), "{v}");
        // The first invocation right after the deploy, through the replica
        // that answered it, succeeds; the other replicas serve it too.
        let path = format!("/v1/invoke/acme/f{n}");
        let r = call(via, "POST", &path, &acme, Some("{}"));
        assert_eq!(r.status, 200, "f{n}, first invocation: {r:?}");
        for id in 1..=3 {
            until("served through every replica", || {
                let r = call(region.http(id), "POST", &path, &acme, Some("{}"));
                (r.status == 200).then_some(r)
            });
        }
        let d = call(via, "GET", &format!("/v1/functions/f{n}"), &acme, None);
        let state = json_of(&d)["instances"][0]["state"].clone();
        assert!(
            state == json!("assigned") || state == json!("resident"),
            "{d:?}"
        );
    }
    let _ = agent.kill();
    let _ = agent.wait();
}
