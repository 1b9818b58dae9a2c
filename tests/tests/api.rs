//! The domain API on real replica processes: auth and isolation, bad input,
//! exactly-once usage and bills, topology reload draining a node, and
//! concurrent deploys across a leader kill that never break quota or GPU
//! capacity (checked with core's invariants on every replica's state).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gshare_core::model::PoolKind;
use gshare_core::state::RegionState;
use gshare_region::http_client::{request, HttpReply};
use gshare_tests::raw_http::{assert_error, raw_request};
use gshare_tests::{TestRegion, TOKEN};
use serde_json::{json, Value};

static SERIAL: Mutex<()> = Mutex::new(());

/// method, path, token, body, expected status, expected error code.
type BadCase<'a> = (
    &'a str,
    &'a str,
    Option<&'a str>,
    Option<String>,
    u16,
    &'a str,
);
const T: Duration = Duration::from_secs(10);

fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> HttpReply {
    request(addr, method, path, token, body, T).unwrap_or_else(|e| HttpReply {
        status: 0,
        body: e.to_string(),
        ..HttpReply::default()
    })
}

fn json_of(r: &HttpReply) -> Value {
    serde_json::from_str(&r.body).unwrap_or(Value::Null)
}

fn code(r: &HttpReply) -> String {
    json_of(r)["error"]["code"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Retries while the answer is 503 (no leader / outcome unknown) or no answer.
fn call_retry(
    region: &TestRegion,
    ids: &[u64],
    method: &str,
    path: &str,
    token: &str,
    body: Option<&str>,
) -> HttpReply {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut i = 0;
    loop {
        let r = call(
            region.http(ids[i % ids.len()]),
            method,
            path,
            Some(token),
            body,
        );
        if !(r.status == 0 || r.status == 503) || Instant::now() > deadline {
            return r;
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn started(n: u64) -> TestRegion {
    started_with(n, "", |_| {})
}

/// [`started`] with `extra` config lines, after `prepare` (e.g. writing a
/// file the configs name) and before the first start.
fn started_with(n: u64, extra: &str, prepare: impl FnOnce(&TestRegion)) -> TestRegion {
    let mut region = TestRegion::with_config(n, extra).expect("region");
    prepare(&region);
    for id in 1..=n {
        region.start(id, id == 1).expect("start");
    }
    let ids: Vec<u64> = (1..=n).collect();
    region
        .wait_leader(&ids, Duration::from_secs(15))
        .expect("leader");
    // --init proposes the topology and tenants files once a leader exists.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = call(region.http(1), "GET", "/v1/tenants", Some(TOKEN), None);
        if json_of(&r).as_array().is_some_and(|a| a.len() == 2) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "--init did not load the tenants: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    region
}

fn issue_token(region: &TestRegion, tenant: &str) -> String {
    let r = call_retry(
        region,
        &[1],
        "POST",
        &format!("/v1/tenants/{tenant}/tokens"),
        TOKEN,
        None,
    );
    assert_eq!(r.status, 201, "{r:?}");
    json_of(&r)["token"].as_str().expect("token").to_string()
}

fn state_of(region: &TestRegion, id: u64) -> RegionState {
    let r = call(
        region.http(id),
        "GET",
        "/v1/cluster/state",
        Some(TOKEN),
        None,
    );
    assert_eq!(r.status, 200, "{r:?}");
    serde_json::from_str(&r.body).expect("state decodes")
}

/// Waits until every replica in `ids` has the same domain state, checks core's
/// invariants on it, and returns it.
fn converged(region: &TestRegion, ids: &[u64]) -> RegionState {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let states: Vec<RegionState> = ids.iter().map(|id| state_of(region, *id)).collect();
        if states.windows(2).all(|w| w[0] == w[1]) {
            for (id, s) in ids.iter().zip(&states) {
                s.check_invariants()
                    .unwrap_or_else(|e| panic!("replica {id} breaks an invariant: {e}"));
            }
            return states.into_iter().next().expect("one state");
        }
        assert!(Instant::now() < deadline, "replicas did not converge");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn function(name: &str, min: u32) -> String {
    json!({
        "name": name, "runtime": "pytorch", "memory_mib": 3000, "compute_milli": 400,
        "tier": "guaranteed", "deadline_ms": 200, "pool": "center", "min_instances": min,
    })
    .to_string()
}

#[test]
fn tenants_are_isolated_bad_input_changes_nothing_usage_is_billed_once_and_reload_drains() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let region = started(3);
    let a = region.http(1);
    let acme = issue_token(&region, "acme");
    let globex = issue_token(&region, "globex");

    // A deploy places min_instances and says where.
    let r = call_retry(
        &region,
        &[1],
        "POST",
        "/v1/functions",
        &acme,
        Some(&function("f1", 1)),
    );
    assert_eq!(r.status, 201, "{r:?}");
    let placed = json_of(&r);
    let node = placed["instances"][0]["slices"][0]["gpu"]["node"]
        .as_str()
        .expect("node")
        .to_string();

    // gsharectl speaks the same API (tables by default, --json on demand).
    let at = format!("http://{a}");
    let (ok, out) = region
        .gsharectl(&["function", "ls", "--region", &at, "--token", &acme])
        .expect("gsharectl");
    assert!(
        ok && out.contains("f1") && out.contains("guaranteed"),
        "{out}"
    );
    let (ok, out) = region
        .gsharectl(&[
            "tenant", "ls", "--json", "--region", &at, "--token", &globex,
        ])
        .expect("gsharectl");
    assert!(!ok && out.contains("403 forbidden"), "{out}");

    // ---- bad input: clear 4xx, JSON error codes, nothing changes.
    let before = converged(&region, &[1, 2, 3]);
    let huge = format!("{{\"name\":\"{}\"}}", "x".repeat(2 << 20));
    let cases: Vec<BadCase> = vec![
        (
            "POST",
            "/v1/functions",
            None,
            Some(function("g", 1)),
            401,
            "unauthorized",
        ),
        (
            "POST",
            "/v1/functions",
            Some("not-a-token"),
            Some(function("g", 1)),
            401,
            "unauthorized",
        ),
        (
            "POST",
            "/v1/functions",
            Some(&acme),
            Some("{\"name\": ".into()),
            400,
            "malformed_body",
        ),
        (
            "POST",
            "/v1/functions",
            Some(&acme),
            Some(function("g", 1).replace("\"tier\"", "\"gpus\":1,\"tier\"")),
            400,
            "malformed_body",
        ),
        (
            "POST",
            "/v1/functions",
            Some(&acme),
            Some(huge),
            413,
            "body_too_large",
        ),
        (
            "POST",
            "/v1/tenants",
            Some(&acme),
            Some("{\"name\":\"evil\"}".into()),
            403,
            "forbidden",
        ),
        (
            "GET",
            "/v1/cluster/state",
            Some(&globex),
            None,
            403,
            "forbidden",
        ),
        (
            "GET",
            "/v1/tenants/acme/bill",
            Some(&globex),
            None,
            403,
            "forbidden",
        ),
        (
            "GET",
            "/v1/functions/f1",
            Some(&globex),
            None,
            404,
            "unknown_function",
        ),
        (
            "DELETE",
            "/v1/functions/f1",
            Some(&globex),
            None,
            404,
            "unknown_function",
        ),
        (
            "POST",
            "/v1/functions",
            Some(&acme),
            Some(function("f1", 1)),
            409,
            "duplicate_name",
        ),
        (
            "POST",
            "/v1/functions",
            Some(&acme),
            Some(
                function("g", 2)
                    .replace("\"min_instances\"", "\"max_instances\":1,\"min_instances\""),
            ),
            422,
            "invalid_spec",
        ),
        (
            "PUT",
            "/v1/tenants/acme/quotas/center",
            Some(TOKEN),
            Some("{\"compute_milli\":0,\"memory_mib\":0,\"instances\":0}".into()),
            409,
            "quota_below_held",
        ),
        // The reported overflow: u64::MAX MiB would wrap the quota and GPU
        // sums; refused as out of bounds before anything is proposed.
        (
            "POST",
            "/v1/functions",
            Some(&acme),
            Some(function("wrap", 1).replace("3000", &u64::MAX.to_string())),
            422,
            "invalid_spec",
        ),
        (
            "POST",
            "/v1/functions",
            Some(&acme),
            Some(function("wrap", 1).replace("3000", &(1u64 << 63).to_string())),
            422,
            "invalid_spec",
        ),
        (
            "PUT",
            "/v1/tenants/acme/quotas/center",
            Some(TOKEN),
            Some(format!(
                "{{\"compute_milli\":0,\"memory_mib\":{},\"instances\":0}}",
                u64::MAX
            )),
            422,
            "invalid_spec",
        ),
    ];
    for (method, path, token, body, status, want) in &cases {
        let r = call(a, method, path, *token, body.as_deref());
        assert_eq!(
            (r.status, code(&r).as_str()),
            (*status, *want),
            "{method} {path}: {}",
            &r.body[..r.body.len().min(300)]
        );
    }
    assert_eq!(
        converged(&region, &[1, 2, 3]),
        before,
        "refused requests changed the state"
    );
    // Over quota: acme may hold 8 instances and 3000 milli in the center pool.
    // The deploy is rolled back (only the instance counter moved).
    let r = call(
        a,
        "POST",
        "/v1/functions",
        Some(&acme),
        Some(
            &json!({
        "name": "many", "runtime": "pytorch", "memory_mib": 1000, "compute_milli": 400,
        "tier": "guaranteed", "deadline_ms": 200, "pool": "center", "min_instances": 9,
        "max_instances": 9 })
            .to_string(),
        ),
    );
    assert_eq!(r.status, 409, "{r:?}");
    assert!(
        ["quota_exceeded", "gpu_full"].contains(&code(&r).as_str()),
        "{r:?}"
    );
    let after = converged(&region, &[1, 2, 3]);
    assert_eq!(after.instances().count(), before.instances().count());
    assert_eq!(after.functions().count(), before.functions().count());
    assert_eq!(
        call(a, "GET", "/v1/functions/many", Some(&acme), None).status,
        404
    );
    // The owner still sees its function; the other tenant's list is empty.
    assert_eq!(
        call(a, "GET", "/v1/functions/f1", Some(&acme), None).status,
        200
    );
    assert_eq!(
        json_of(&call(a, "GET", "/v1/functions", Some(&globex), None)),
        json!([])
    );

    // ---- usage: the same batch sent twice and to two other replicas is billed once.
    let r = call_retry(
        &region,
        &[1],
        "POST",
        "/v1/agents",
        TOKEN,
        Some(&json!({"agent": "ag1", "node": node, "version": "t"}).to_string()),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let hour = 3_600_000u64;
    let end = 1_000 * hour + 5;
    let batch = json!({"agent": "ag1", "records": (1..=3).map(|seq| json!({
        "seq": seq, "tenant": "acme", "function": "f1", "tier": "guaranteed",
        "gpu_model": "sim-gpu-16g", "pool_kind": "center",
        "compute_milli_gpu_ms": 400 * 3_600_000u64, "memory_mib_ms": 3000 * 3_600_000u64, "invocations": 7, "end_ms": end,
    })).collect::<Vec<_>>()}).to_string();
    let mut applied = 0;
    let mut duplicates = 0;
    for via in [1, 1, 2, 3] {
        let r = call_retry(&region, &[via], "POST", "/v1/usage", TOKEN, Some(&batch));
        assert_eq!(r.status, 200, "{r:?}");
        let u = &json_of(&r)["UsageApplied"];
        applied += u["applied"].as_u64().expect("applied");
        duplicates += u["duplicates"].as_u64().expect("duplicates");
    }
    assert_eq!((applied, duplicates), (3, 9));
    converged(&region, &[1, 2, 3]);
    let period = format!("/v1/bill?from={}&to={}", 1_000 * hour, 1_001 * hour);
    let bill = json_of(&call(region.http(3), "GET", &period, Some(&acme), None));
    assert_eq!(
        bill["functions"][0]["usage"]["compute_milli_gpu_ms"],
        json!(3 * 400 * 3_600_000u64),
        "{bill}"
    );
    assert_eq!(
        bill["functions"][0]["usage"]["invocations"],
        json!(3 * 7),
        "{bill}"
    );
    // By hand: 1.2 GPU-hours × 500_000 × 0.85 = 510_000; 9000 MiB-hours =
    // 8.7890625 GiB-hours × 10_000 × 0.85 = 74_707.03 → 74_707 (micro-USD).
    assert_eq!(bill["total"], json!(510_000 + 74_707), "{bill}");
    let other = json_of(&call(a, "GET", &period, Some(&globex), None));
    assert_eq!(
        (other["tenant"].as_str(), other["total"].as_u64()),
        (Some("globex"), Some(0)),
        "{other}"
    );

    // ---- topology reload without acme's node drains it and releases f1's instance.
    let text = gshare_tests::test_region::LOCAL_TOPOLOGY;
    let block = format!("[[pools.nodes]]\nname = \"{node}\"");
    let start = text.find(&block).expect("node block");
    let rest = &text[start + block.len()..];
    let stop = rest
        .find("[[pools")
        .map_or(text.len(), |i| start + block.len() + i);
    let reduced = format!("{}{}", &text[..start], &text[stop..]);
    std::fs::write(region.path("topology.toml"), reduced).expect("write topology");
    let r = call_retry(&region, &[2], "POST", "/v1/topology/reload", TOKEN, None);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        json_of(&r)["TopologyLoaded"]["drained"],
        json!([node]),
        "{r:?}"
    );
    let s = converged(&region, &[1, 2, 3]);
    assert!(s.drained().keys().any(|n| n.0 == node));
    assert_eq!(
        s.instances()
            .filter(|i| i.slices.iter().any(|x| x.gpu.node.0 == node))
            .count(),
        0
    );
    // The leader's placement loop places f1 again, elsewhere.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let f1 = json_of(&call(a, "GET", "/v1/functions/f1", Some(&acme), None));
        if let Some(i) = f1["instances"].as_array().filter(|i| i.len() == 1) {
            assert_ne!(i[0]["slices"][0]["gpu"]["node"], json!(node), "{f1}");
            break;
        }
        assert!(Instant::now() < deadline, "f1 was not placed again: {f1}");
        std::thread::sleep(Duration::from_millis(200));
    }
    converged(&region, &[1, 2, 3]);
    // Tenant series only with a token; the rest is open.
    let metrics = call(a, "GET", "/metrics", Some(TOKEN), None).body;
    assert!(
        metrics.contains("gshare_region_placement_rejections_total{reason="),
        "{metrics}"
    );
    assert!(
        metrics.contains("gshare_region_tenant_instances{tenant=\"acme\""),
        "{metrics}"
    );
    let open = call(a, "GET", "/metrics", None, None).body;
    assert!(
        open.contains("gshare_region_placement_rejections_total{reason="),
        "{open}"
    );
    assert!(!open.contains("tenant="), "{open}");
}

#[test]
fn concurrent_deploys_across_a_leader_kill_keep_quota_and_gpu_capacity() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut region = started(3);
    let tokens = [issue_token(&region, "acme"), issue_token(&region, "globex")];
    let leader = region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    let survivors: Vec<u64> = (1..=3).filter(|i| *i != leader).collect();
    let addrs: Vec<SocketAddr> = (1..=3).map(|i| region.http(i)).collect();
    // Center: acme may hold 3000 milli (7 × 400), globex 2000 (5 × 400), and
    // the pool has 4 GPUs (8 × 400): quota and capacity both bind. `center`
    // spills to the edge pools (2 GPUs; acme 2, globex 1 instance of quota).
    let outcomes = std::thread::scope(|s| {
        let handles: Vec<_> = tokens
            .iter()
            .enumerate()
            .map(|(c, tok)| {
                let addrs = addrs.clone();
                s.spawn(move || {
                    let mut codes = Vec::new();
                    for i in 0..12 {
                        let body = function(&format!("c{c}-{i}"), 1);
                        let deadline = Instant::now() + Duration::from_secs(20);
                        let mut k = i;
                        loop {
                            let r = call(
                                addrs[k % addrs.len()],
                                "POST",
                                "/v1/functions",
                                Some(tok),
                                Some(&body),
                            );
                            if (r.status == 0 || r.status == 503) && Instant::now() < deadline {
                                k += 1;
                                std::thread::sleep(Duration::from_millis(100));
                                continue;
                            }
                            codes.push(if r.status == 201 {
                                "ok".to_string()
                            } else {
                                code(&r)
                            });
                            break;
                        }
                    }
                    codes
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(600));
        region.kill9(leader).expect("kill leader");
        handles
            .into_iter()
            .map(|h| h.join().expect("client"))
            .collect::<Vec<_>>()
    });
    let all: Vec<&String> = outcomes.iter().flatten().collect();
    let kinds: BTreeSet<&str> = all.iter().map(|s| s.as_str()).collect();
    assert!(kinds.contains("ok"), "no deploy succeeded: {outcomes:?}");
    assert!(
        kinds.contains("quota_exceeded") || kinds.contains("gpu_full"),
        "no deploy was refused for capacity or quota: {outcomes:?}"
    );
    let s = converged(&region, &survivors);
    // check_invariants (in `converged`) re-checks every GPU with fit and every
    // tenant's holdings against its quota; the sums below say the same plainly.
    for kind in [PoolKind::Center, PoolKind::Edge] {
        let gpus = if kind == PoolKind::Center { 4 } else { 2 };
        let held: u64 = s
            .instances()
            .filter(|i| i.pool_kind == kind)
            .map(|i| {
                i.slices
                    .iter()
                    .map(|x| u64::from(x.compute_milli))
                    .sum::<u64>()
            })
            .sum();
        assert!(
            held <= gpus * 1000,
            "{held} milli placed on {gpus} {kind:?} GPUs"
        );
        for t in s.tenants() {
            let (h, q) = (s.held(&t.id, kind), t.quota(kind));
            assert!(
                h.compute_milli <= q.compute_milli
                    && h.memory_mib <= q.memory_mib
                    && h.instances <= q.instances,
                "{} holds {h:?} over {q:?} in {kind:?}",
                t.id
            );
        }
    }
}

/// `call` with a raw `Authorization` header value (or none).
fn call_raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: &str,
) -> HttpReply {
    call_declared(addr, method, path, auth, body, body.len())
}

/// `call_raw` declaring `content_length` bytes while sending only `body`.
fn call_declared(
    addr: SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: &str,
    content_length: usize,
) -> HttpReply {
    let headers: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
    raw_request(
        addr,
        method,
        path,
        &headers,
        body.as_bytes(),
        content_length,
    )
}

#[test]
fn every_error_has_one_shape_and_open_endpoints_leak_no_tenant_data() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let region = started_with(3, "metrics_token_file = \"metrics.token\"", |r| {
        std::fs::write(r.path("metrics.token"), "scrape-me\n").unwrap();
    });
    let leader = region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    let a = region.http(leader);
    let follower = region.http(if leader == 1 { 2 } else { 1 });
    let acme = issue_token(&region, "acme");

    // Unknown routes and methods, and the retired key/value route.
    for (method, path) in [
        ("GET", "/v1/nope"),
        ("DELETE", "/v1/tenants"),
        ("PATCH", "/healthz"),
        ("POST", "/v1/kv"),
        ("GET", "/v1/kv?prefix="),
    ] {
        let r = call(a, method, path, Some(TOKEN), Some("{}"));
        assert_error(&r, 404, "unknown_route", false);
    }
    // API errors carry the header too.
    let r = call(a, "GET", "/v1/functions/nope", Some(&acme), None);
    assert_error(&r, 404, &code(&r), false);
    let r = call(a, "GET", "/v1/tenants", None, None);
    assert_error(&r, 401, "unauthorized", false);
    // One strict bearer rule: nothing inside the header is trimmed.
    for auth in [
        format!("Bearer  {TOKEN}"),
        format!("Bearer\t{TOKEN}"),
        format!("bearer {TOKEN}"),
    ] {
        let r = call_raw(a, "GET", "/v1/tenants", Some(&auth), "");
        assert_error(&r, 401, "unauthorized", false);
    }
    assert_eq!(
        call_raw(
            a,
            "GET",
            "/v1/tenants",
            Some(&format!("Bearer {TOKEN}")),
            ""
        )
        .status,
        200
    );
    // A follower's refusal of a membership change names the leader.
    let r = call(
        follower,
        "DELETE",
        "/v1/cluster/replicas/9",
        Some(TOKEN),
        None,
    );
    assert_error(&r, 421, "not_leader", true);
    assert_eq!(json_of(&r)["error"]["leader_http"], a.to_string(), "{r:?}");
    // The invoke route: errors have `retryable`; the token is checked
    // before the body's size.
    let big = 5 << 20;
    let bearer_acme = format!("Bearer {acme}");
    let invoke = "/v1/invoke/acme/f";
    let r = call_declared(a, "POST", invoke, Some("Bearer nobody"), "", big);
    assert_error(&r, 401, "unauthorized", false);
    let r = call_declared(a, "POST", invoke, None, "", big);
    assert_error(&r, 401, "unauthorized", false);
    let r = call_declared(a, "POST", invoke, Some(&bearer_acme), "", big);
    assert_error(&r, 413, "body_too_large", false);
    // A body over the old 256 KiB default but within the limit is read.
    let mid = "x".repeat(300 << 10);
    let r = call_raw(a, "POST", invoke, Some(&bearer_acme), &mid);
    assert_error(&r, 404, "unknown_function", false);
    let r = call(a, "POST", "/v1/invoke/acme/f", Some(&acme), Some("{}"));
    assert_error(&r, 404, "unknown_function", false);
    let r = call(a, "POST", "/v1/invoke/globex/f", Some(&acme), Some("{}"));
    assert_error(&r, 401, "unauthorized", false);
    // API bodies too: the token first, then the size.
    let huge = 2 << 20;
    let r = call_declared(a, "POST", "/v1/tenants", None, "", huge);
    assert_error(&r, 401, "unauthorized", false);
    let bearer_op = format!("Bearer {TOKEN}");
    let r = call_declared(a, "POST", "/v1/tenants", Some(&bearer_op), "", huge);
    assert_error(&r, 413, "body_too_large", false);

    // /metrics: tenant series only with the metrics or operator token.
    let r = call_retry(
        &region,
        &[leader],
        "POST",
        "/v1/functions",
        &acme,
        Some(&function("m1", 1)),
    );
    assert!(r.status == 201 || r.status == 200, "{r:?}");
    for id in 1..=3 {
        let addr = region.http(id);
        let open = call(addr, "GET", "/metrics", None, None);
        assert_eq!(open.status, 200, "{open:?}");
        assert!(open.body.contains("gshare_region_raft_term "), "{open:?}");
        assert!(
            !open.body.contains("tenant=")
                && !open.body.contains("acme")
                && !open.body.contains("globex"),
            "replica {id} shows tenant data without a token: {}",
            open.body
        );
        for token in ["scrape-me", TOKEN] {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let full = call(addr, "GET", "/metrics", Some(token), None);
                assert_eq!(full.status, 200, "{full:?}");
                if full.body.contains(
                    "gshare_region_tenant_instances{tenant=\"acme\",pool_kind=\"center\"} 1",
                ) {
                    break;
                }
                assert!(Instant::now() < deadline, "replica {id}: {}", full.body);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let r = call(addr, "GET", "/metrics", Some("wrong"), None);
        assert_error(&r, 401, "unauthorized", false);
        let r = call(addr, "GET", "/metrics", Some(&acme), None);
        assert_error(&r, 401, "unauthorized", false);
    }
    // The open endpoints keep answering without a token.
    assert_eq!(call(a, "GET", "/healthz", None, None).status, 200);
    assert_eq!(call(a, "GET", "/v1/cluster", None, None).status, 200);
}
