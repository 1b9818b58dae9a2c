//! Request bodies stream through a replica: 3 real `gshare-region`
//! replicas and a real `gshare-edge` agent linked to replica 1 (the
//! `process` driver running `tests/fixtures/upload_server.py`, which
//! answers `got N` on its streamed reply as the body's bytes arrive).
//!
//! - A chunked upload's first part reaches the function before the client
//!   sends the second, through replica 1 (its QUIC stream to the agent:
//!   `InvokeStreamed`, `InvokeBodyChunk`s, `InvokeBodyEnd`) and through
//!   replica 2 (its HTTP hand-over to replica 1, the body chunked).
//! - `max_request_bytes` is a running count on the replica: a length
//!   announced over it is refused at once; a chunked body that passes it
//!   aborts the call, and the answer (`413 body_too_large`) says how much
//!   had been passed on.
//! - An agent whose cap is below the replica's answers a body between the
//!   two `413 body_too_large` too (its cap, how much it had passed on),
//!   and the replica passes that on; an upload that stalls past the
//!   replica's `body_idle_timeout_ms` is `408 body_timeout`.

use gshare_tests::openai::header;
use gshare_tests::raw_http::upload_in_two_parts;
use gshare_tests::{call, json_of, until, AgentProcess, TestRegion, TOKEN};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const UPLOAD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/upload_server.py");
const PATH: &str = "/v1/invoke/acme/upload/in";

/// Sends `head` then, after a pause, `rest` to `addr`; the answer's status,
/// headers and body.
fn two_writes(addr: SocketAddr, head: &str, rest: &str) -> (u16, Vec<(String, String)>, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let _ = s.write_all(rest.as_bytes());
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(n @ 1..) = s.read(&mut chunk) {
        raw.extend_from_slice(&chunk[..n]);
    }
    let out = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

/// A region of `replicas` replicas (each with `replica_config`) and an
/// agent (with `agent_config`) linked to replica 1, running the upload
/// function as `acme/upload`: the region, the tenant's token and the agent.
fn region_with_upload(
    replicas: u64,
    replica_config: &str,
    agent_config: &str,
) -> (TestRegion, String, AgentProcess) {
    let mut region = TestRegion::with_config(replicas, replica_config).expect("region");
    let ids: Vec<u64> = (1..=replicas).collect();
    for &id in &ids {
        region.start(id, id == 1).expect("start");
    }
    region
        .wait_leader(&ids, Duration::from_secs(15))
        .expect("leader");
    let http = region.http(1);
    let r = until("token", 30, || {
        let r = call(http, "POST", "/v1/tenants/acme/tokens", TOKEN, None);
        (r.status == 201).then_some(r)
    });
    let acme = json_of(&r)["token"].as_str().unwrap().to_string();
    let f = json!({
        "name": "upload", "runtime": "custom",
        "memory_mib": 3000, "compute_milli": 400, "tier": "guaranteed",
        "deadline_ms": 20000, "pool": "center", "min_instances": 1, "max_instances": 1,
        "latency": {"full_gpu_us": 2000, "saturation_milli": 400},
    })
    .to_string();
    let r = until("deploy", 30, || {
        let r = call(http, "POST", "/v1/functions", &acme, Some(&f));
        (r.status != 0 && r.status != 503).then_some(r)
    });
    assert!(r.status == 200 || r.status == 201, "{r:?}");
    let node = until("placed", 30, || {
        let r = call(http, "GET", "/v1/cluster/state", TOKEN, None);
        let instances = json_of(&r)["instances"].to_string();
        ["local-c1", "local-c2"]
            .into_iter()
            .find(|n| instances.contains(&format!("\"{n}\"")))
    });
    let template = region.root().join("upload.toml");
    std::fs::write(
        &template,
        format!(
            r#"runtime = "custom"
command = ["python3", {UPLOAD:?}, "--port", "{{port}}"]
health_path = "/health"
invoke_path = "/upload"
startup_timeout_s = 20
stop_grace_s = 5
"#
        ),
    )
    .unwrap();
    let extra = format!(
        "[metering]\ninterval_ms = 200\n[runtimes.custom]\ndriver = \"process\"\ntemplate = {:?}\n",
        template.to_string_lossy()
    );
    let quic = [region.replicas[&1].raft_addr];
    let (config, _ingress) = region
        .sim_agent_config_via(node, &quic, "center", "center", 2, &extra)
        .expect("agent config");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{agent_config}{text}")).unwrap();
    let agent = AgentProcess::start(&config);
    (region, acme, agent)
}

#[test]
fn a_request_body_streams_through_a_replica_to_the_function() {
    let cap = "max_request_bytes = 4096\n";
    let (region, acme, _agent) = region_with_upload(3, cap, cap);
    let http = region.http(1);

    // Through replica 1 (QUIC to the agent), then replica 2 (HTTP to
    // replica 1): part 1 is acknowledged before part 2 is sent.
    for replica in [1, 2] {
        let addr = region.http(replica);
        let (acked, raw) = until("an upload through the replica", 60, || {
            let (acked, raw) = upload_in_two_parts(addr, PATH, &acme, b"hello", b"world!!");
            if !raw.starts_with("HTTP/1.1 200") {
                eprintln!("not yet: {raw}");
                std::thread::sleep(Duration::from_millis(200));
                return None;
            }
            Some((acked, raw))
        });
        assert!(
            acked,
            "replica {replica}: the function did not see part 1 before part 2 was sent: {raw}"
        );
        assert!(
            raw.contains("got 12\n") && raw.contains("done 12\n"),
            "{raw}"
        );
        assert!(raw.ends_with("0\r\n\r\n"), "{raw}");
        assert!(header_of(&raw, "idempotency-key").is_some(), "{raw}");
    }
    // A request without a body (no length, not chunked) has none: it goes
    // whole (so it could be retried on another node), not as a chunked
    // stream of nothing, through the peer hand-over too.
    let (status, _, body) = two_writes(
        region.http(2),
        &format!(
            "DELETE {PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {acme}\r\n\
             Connection: close\r\n\r\n"
        ),
        "",
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("done 0\n") && !body.contains("framing chunked"),
        "{body}"
    );
    // A body larger than the replica would take whole in one frame goes in
    // chunk frames: 3 KiB then 1 KiB, the cap exactly.
    let (acked, raw) = upload_in_two_parts(http, PATH, &acme, &[b'a'; 3072], &[b'b'; 1024]);
    assert!(acked && raw.contains("done 4096\n"), "{raw}");

    // Announced over the cap: refused before anything is read.
    let (status, headers, body) = two_writes(
        http,
        &format!(
            "POST {PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {acme}\r\n\
             Content-Length: 5000\r\nConnection: close\r\n\r\n"
        ),
        "",
    );
    assert_eq!(status, 413, "{body}");
    assert_eq!(header(&headers, "x-gshare-error"), Some("body_too_large"));

    // Over the cap while it streams to a function that answers at the
    // body's end: the call is aborted and the answer says how far it got.
    let (status, headers, body) = two_writes(
        http,
        &format!(
            "POST {PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {acme}\r\n\
             X-Reply-After-Body: 1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
             c00\r\n{}\r\n",
            "a".repeat(3072)
        ),
        &format!("800\r\n{}\r\n0\r\n\r\n", "b".repeat(2048)),
    );
    assert_eq!(status, 413, "{headers:?} {body}");
    assert_eq!(header(&headers, "x-gshare-error"), Some("body_too_large"));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("the call was aborted after") && message.contains("passed on"),
        "{message}"
    );
}

/// An agent whose `max_request_bytes` (4 KiB) is below the replica's (8
/// KiB): a body streamed through the replica that passes the agent's cap
/// but not the replica's is a definite `413 body_too_large` naming the
/// agent's cap and how much had been passed on (it was `502
/// instance_failed`). And a client that sends part of a chunked body
/// through the replica and then stalls is cut at the replica's
/// `body_idle_timeout_ms` (1 s here): `408 body_timeout` (the bound is a
/// hang guard, not a timing assert).
#[test]
fn an_agent_cap_below_the_replicas_is_a_413_and_a_stalled_upload_a_408() {
    let (region, acme, _agent) = region_with_upload(
        1,
        "max_request_bytes = 8192\nbody_idle_timeout_ms = 1000\n",
        "max_request_bytes = 4096\n",
    );
    let http = region.http(1);
    until("an upload through the replica", 60, || {
        let (_, raw) = upload_in_two_parts(http, PATH, &acme, b"hello", b"world!!");
        if !raw.starts_with("HTTP/1.1 200") {
            eprintln!("not yet: {raw}");
            std::thread::sleep(Duration::from_millis(200));
            return None;
        }
        Some(())
    });
    let head = |framing: &str| {
        format!(
            "POST {PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {acme}\r\n\
             X-Reply-After-Body: 1\r\n{framing}\r\nConnection: close\r\n\r\n"
        )
    };
    // 3 KiB, then 2 KiB: over the agent's cap, within the replica's.
    let (status, headers, body) = two_writes(
        http,
        &format!(
            "{}c00\r\n{}\r\n",
            head("Transfer-Encoding: chunked"),
            "a".repeat(3072)
        ),
        &format!("800\r\n{}\r\n0\r\n\r\n", "b".repeat(2048)),
    );
    assert_eq!(status, 413, "{headers:?} {body}");
    assert_eq!(header(&headers, "x-gshare-error"), Some("body_too_large"));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("over 4096 bytes")
            && message.contains("the call was aborted after")
            && message.contains("passed on to the function"),
        "{message}"
    );
    // Within both caps, the same upload goes through.
    let (status, _, body) = two_writes(
        http,
        &format!(
            "{}c00\r\n{}\r\n",
            head("Transfer-Encoding: chunked"),
            "a".repeat(3072)
        ),
        &format!("400\r\n{}\r\n0\r\n\r\n", "b".repeat(1024)),
    );
    assert!(status == 200 && body.contains("done 4096\n"), "{body}");

    // Part of a chunked body, then nothing.
    let started = std::time::Instant::now();
    let stalled = gshare_tests::raw_http::paced(
        http,
        &[format!("{}3\r\nabc\r\n", head("Transfer-Encoding: chunked")).as_bytes()],
        Duration::ZERO,
    );
    let took = started.elapsed();
    gshare_tests::raw_http::assert_error(&stalled, 408, "body_timeout", false);
    assert!(stalled.body.contains("after 3 bytes"), "{stalled:?}");
    assert!(took < Duration::from_secs(20), "answered after {took:?}");
}

/// A header of a raw answer (`name` lower-case).
fn header_of(raw: &str, name: &str) -> Option<String> {
    let head = raw.split("\r\n\r\n").next()?;
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_string())
}
