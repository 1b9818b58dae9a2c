//! An answer must not lie: function deploys and deletes under idempotency
//! keys, on real replica processes.
//!
//! - `a_retried_deploy_or_delete_answers_as_the_first_did`: the same deploy
//!   or delete sent again with its `Idempotency-Key` answers what the first
//!   did (not `duplicate_name` / `unknown_function`), a key reused for
//!   another request is refused, and a key is assigned when none is sent.
//! - `deploys_to_paused_and_killed_replicas_answer_what_happened`: clients
//!   deploy (2 instances each, against a quota that runs out) and delete
//!   through every replica while one replica is SIGSTOPped ~5.7 s, then the
//!   leader is, then a replica is killed with SIGKILL; every answer is
//!   checked against the final replicated state: a definite refusal left no
//!   function, a success left it with the instances it named (one of them
//!   may be moving back from the edge pool it spilled to: the new side of
//!   that migration is allowed beside it), a delete removed it.
//! - `a_token_is_good_on_every_replica_once_issued`: a token issued while a
//!   follower is paused works on that follower the moment it resumes (the
//!   replica catches up with the leader before a definite 401); a token
//!   never issued is still refused.
//!
//! No timing is asserted.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gshare_core::model::TenantId;
use gshare_core::state::{InstanceId, RegionState};
use gshare_region::http_client::{request, request_with, HttpReply};
use gshare_tests::{TestRegion, TOKEN};
use serde_json::{json, Value};

static SERIAL: Mutex<()> = Mutex::new(());

/// Each socket operation of a client call; longer than the pauses, so a
/// request to a paused replica is answered once it resumes.
const T: Duration = Duration::from_secs(10);

type Headers = Vec<(String, String)>;

fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    key: Option<&str>,
    body: Option<&str>,
) -> (HttpReply, Headers) {
    let headers: Vec<(&str, &str)> = key.map(|k| ("Idempotency-Key", k)).into_iter().collect();
    request_with(addr, method, path, Some(token), &headers, body, T).unwrap_or_else(|e| {
        (
            HttpReply {
                status: 0,
                body: e.to_string(),
                ..HttpReply::default()
            },
            Vec::new(),
        )
    })
}

fn header<'a>(h: &'a Headers, name: &str) -> Option<&'a str> {
    h.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
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

fn started(n: u64) -> TestRegion {
    let mut region = TestRegion::new(n).expect("region");
    for id in 1..=n {
        region.start(id, id == 1).expect("start");
    }
    let ids: Vec<u64> = (1..=n).collect();
    region
        .wait_leader(&ids, Duration::from_secs(15))
        .expect("leader");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = request(region.http(1), "GET", "/v1/tenants", Some(TOKEN), None, T);
        if r.is_ok_and(|r| json_of(&r).as_array().is_some_and(|a| a.len() == 2)) {
            break;
        }
        assert!(Instant::now() < deadline, "--init did not load the tenants");
        std::thread::sleep(Duration::from_millis(200));
    }
    region
}

fn token(region: &TestRegion, tenant: &str) -> String {
    token_at(region, 1, tenant)
}

fn token_at(region: &TestRegion, via: u64, tenant: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (r, _) = call(
            region.http(via),
            "POST",
            &format!("/v1/tenants/{tenant}/tokens"),
            TOKEN,
            None,
            None,
        );
        if r.status == 201 {
            return json_of(&r)["token"].as_str().expect("token").to_string();
        }
        assert!(Instant::now() < deadline, "no token: {r:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn state_of(region: &TestRegion, id: u64) -> Option<RegionState> {
    let (r, _) = call(
        region.http(id),
        "GET",
        "/v1/cluster/state",
        TOKEN,
        None,
        None,
    );
    (r.status == 200).then(|| serde_json::from_str(&r.body).expect("state decodes"))
}

/// Waits until every replica in `ids` holds the same state; checks core's
/// invariants on it.
fn converged(region: &TestRegion, ids: &[u64]) -> RegionState {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let states: Vec<Option<RegionState>> = ids.iter().map(|id| state_of(region, *id)).collect();
        if states.iter().all(Option::is_some) && states.windows(2).all(|w| w[0] == w[1]) {
            let s = states.into_iter().next().flatten().expect("one state");
            s.check_invariants().expect("invariants");
            return s;
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

fn instance_ids(v: &Value) -> Vec<u64> {
    v["instances"]
        .as_array()
        .map(|a| a.iter().filter_map(|i| i["instance"].as_u64()).collect())
        .unwrap_or_default()
}

#[test]
fn a_retried_deploy_or_delete_answers_as_the_first_did() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let region = started(3);
    let acme = token(&region, "acme");
    let body = function("retried", 2);
    let (first, h) = call(
        region.http(2),
        "POST",
        "/v1/functions",
        &acme,
        Some("deploy-1"),
        Some(&body),
    );
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(header(&h, "idempotency-key"), Some("deploy-1"));
    let placed = instance_ids(&json_of(&first));
    assert_eq!(placed.len(), 2, "{first:?}");
    // The same request again, through every replica: the first answer.
    for id in 1..=3 {
        let (again, _) = call(
            region.http(id),
            "POST",
            "/v1/functions",
            &acme,
            Some("deploy-1"),
            Some(&body),
        );
        assert_eq!(again.status, 201, "replica {id}: {again:?}");
        assert_eq!(instance_ids(&json_of(&again)), placed, "replica {id}");
    }
    // The key for another request: refused, nothing deployed.
    let (reused, _) = call(
        region.http(1),
        "POST",
        "/v1/functions",
        &acme,
        Some("deploy-1"),
        Some(&function("other", 1)),
    );
    assert_eq!(
        (reused.status, code(&reused).as_str()),
        (422, "idempotency_key_reused"),
        "{reused:?}"
    );
    // Without a key the answer names the one the replica assigned.
    let (fresh, h) = call(
        region.http(1),
        "POST",
        "/v1/functions",
        &acme,
        None,
        Some(&function("fresh", 1)),
    );
    assert_eq!(fresh.status, 201, "{fresh:?}");
    let assigned = header(&h, "idempotency-key")
        .expect("assigned key")
        .to_string();
    assert!(assigned.starts_with("r1-"), "{assigned}");
    // A malformed key is refused before anything happens.
    let (bad, _) = call(
        region.http(1),
        "POST",
        "/v1/functions",
        &acme,
        Some("has space"),
        Some(&function("bad-key", 1)),
    );
    assert_eq!(code(&bad), "invalid_idempotency_key", "{bad:?}");

    // A delete retried with its key answers as the first did.
    let (del, _) = call(
        region.http(3),
        "DELETE",
        "/v1/functions/retried",
        &acme,
        Some("delete-1"),
        None,
    );
    assert_eq!(del.status, 200, "{del:?}");
    let (again, _) = call(
        region.http(1),
        "DELETE",
        "/v1/functions/retried",
        &acme,
        Some("delete-1"),
        None,
    );
    assert_eq!(
        (again.status, again.body.as_str()),
        (200, del.body.as_str())
    );
    // Without the key the name is gone.
    let (gone, _) = call(
        region.http(1),
        "DELETE",
        "/v1/functions/retried",
        &acme,
        None,
        None,
    );
    assert_eq!(gone.status, 404, "{gone:?}");

    let s = converged(&region, &[1, 2, 3]);
    let acme_id = TenantId("acme".into());
    assert!(s.function(&acme_id, "retried").is_err());
    assert!(s.function(&acme_id, "other").is_err());
    assert!(s.function(&acme_id, "bad-key").is_err());
    assert!(s.function(&acme_id, "fresh").is_ok());
    assert_eq!(
        s.idempotency().len(&acme_id),
        3,
        "deploy-1, delete-1, assigned"
    );
}

/// What a client finally heard for one operation.
#[derive(Debug, Clone)]
enum Heard {
    /// 201 with these instance ids (deploy) / 200 (delete).
    Done(Vec<u64>),
    /// A definite refusal: this code.
    Refused(String),
    /// No definite answer before the client gave up.
    Unknown(String),
}

/// Sends one operation under `key` until a definite answer (retrying, with
/// the same key, on no answer, 502 and 503, through the next replica).
fn until_definite(
    addrs: &[SocketAddr],
    start: usize,
    method: &str,
    path: &str,
    token: &str,
    key: &str,
    body: Option<&str>,
) -> Heard {
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut last = String::new();
    let mut k = start;
    while Instant::now() < deadline {
        let (r, h) = call(addrs[k % addrs.len()], method, path, token, Some(key), body);
        match r.status {
            200 | 201 => return Heard::Done(instance_ids(&json_of(&r))),
            0 | 502 | 503 => {
                if r.status == 502 {
                    assert_eq!(code(&r), "outcome_unknown", "{r:?}");
                    assert_eq!(json_of(&r)["error"]["retryable"], json!(true));
                    assert_eq!(json_of(&r)["error"]["idempotency_key"], json!(key));
                    assert_eq!(header(&h, "idempotency-key"), Some(key));
                }
                last = format!("{} {}", r.status, r.body);
                k += 1;
                std::thread::sleep(Duration::from_millis(150));
            }
            _ => return Heard::Refused(code(&r)),
        }
    }
    Heard::Unknown(last)
}

#[test]
fn deploys_to_paused_and_killed_replicas_answer_what_happened() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut region = started(3);
    let acme = token(&region, "acme");
    let addrs: Vec<SocketAddr> = (1..=3).map(|i| region.http(i)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    // name → (deploy heard, delete heard if one was sent)
    type Log = BTreeMap<String, (Heard, Option<Heard>)>;
    let log: Arc<Mutex<Log>> = Arc::default();
    let clients: Vec<_> = (0..3)
        .map(|c| {
            let (addrs, acme, stop, log) = (addrs.clone(), acme.clone(), stop.clone(), log.clone());
            std::thread::spawn(move || {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("c{c}-{i}");
                    let deployed = until_definite(
                        &addrs,
                        c + i,
                        "POST",
                        "/v1/functions",
                        &acme,
                        &format!("{name}-deploy"),
                        Some(&function(&name, 2)),
                    );
                    // Every other success is deleted again, so the quota
                    // (3,000 milli-GPU = 3 functions of 2 × 400 in the
                    // center) keeps running out and freeing up.
                    let deleted = (matches!(deployed, Heard::Done(_)) && i % 2 == 0).then(|| {
                        until_definite(
                            &addrs,
                            c + i + 1,
                            "DELETE",
                            &format!("/v1/functions/{name}"),
                            &acme,
                            &format!("{name}-delete"),
                            None,
                        )
                    });
                    log.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(name, (deployed, deleted));
                    i += 1;
                }
            })
        })
        .collect();

    std::thread::sleep(Duration::from_millis(800));
    let leader = region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    let follower = (1..=3).find(|i| *i != leader).expect("a follower");
    region.signal(follower, "STOP").expect("pause follower");
    std::thread::sleep(Duration::from_millis(5_700));
    region.signal(follower, "CONT").expect("resume follower");
    std::thread::sleep(Duration::from_secs(2));
    let leader = region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    region.signal(leader, "STOP").expect("pause leader");
    std::thread::sleep(Duration::from_millis(5_700));
    region.signal(leader, "CONT").expect("resume leader");
    std::thread::sleep(Duration::from_secs(2));
    let victim = region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    region.kill9(victim).expect("kill the leader");
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("client");
    }
    let survivors: Vec<u64> = (1..=3).filter(|i| *i != victim).collect();
    let s = converged(&region, &survivors);
    let acme_id = TenantId("acme".into());
    let log = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut tally: BTreeMap<String, u32> = BTreeMap::new();
    for (name, (deployed, deleted)) in &log {
        let exists = s.function(&acme_id, name).is_ok();
        let have: Vec<u64> = s.instances_of(&acme_id, name).map(|i| i.id.0).collect();
        let what = match (deployed, deleted) {
            (Heard::Done(ids), None) => {
                assert!(
                    exists,
                    "{name}: deploy answered 201, the function is missing"
                );
                // An instance spilled to an edge pool (the center full
                // with other deploys' plans) may be on its way back: the
                // new side of a migration in progress is the answer's
                // instance that moves, not one more.
                let (moving_in, kept): (Vec<u64>, Vec<u64>) = have.iter().partition(|id| {
                    s.migration_of(InstanceId(**id))
                        .is_some_and(|m| m.to.0 == **id)
                });
                assert_eq!(
                    &kept, ids,
                    "{name}: instances differ from the answer ({have:?})"
                );
                for id in &moving_in {
                    let from = s.migration_of(InstanceId(*id)).map(|m| m.from.0);
                    assert!(
                        from.is_some_and(|f| ids.contains(&f)),
                        "{name}: {id} moves in for {from:?}, not one of {ids:?}"
                    );
                }
                if moving_in.is_empty() {
                    "deployed"
                } else {
                    "deployed+moving"
                }
            }
            (Heard::Done(_), Some(Heard::Done(_))) => {
                assert!(!exists, "{name}: delete answered 200, the function exists");
                "deployed+deleted"
            }
            (Heard::Done(_), Some(Heard::Refused(c))) => {
                panic!("{name}: a delete of a deployed function was refused: {c}")
            }
            (Heard::Done(_), Some(Heard::Unknown(last))) | (Heard::Unknown(last), _) => {
                println!("{name}: no definite answer; last {last}");
                "unknown"
            }
            (Heard::Refused(c), _) => {
                assert!(
                    !exists,
                    "{name}: deploy answered {c}, yet the function exists with {have:?}"
                );
                "refused"
            }
        };
        *tally.entry(what.to_string()).or_default() += 1;
        if let Heard::Refused(c) = deployed {
            *tally.entry(format!("refused:{c}")).or_default() += 1;
        }
    }
    // Nothing exists that no client deployed.
    for f in s.functions_of(&acme_id) {
        assert!(log.contains_key(&f.spec.name), "unexpected {}", f.spec.name);
    }
    println!("deploy outcomes across pauses and a kill: {tally:?}");
    assert!(tally.get("deployed").copied().unwrap_or(0) > 0, "{tally:?}");
    assert!(
        tally.get("refused").copied().unwrap_or(0) > 0,
        "the quota never ran out: {tally:?}"
    );
}

#[test]
fn a_token_is_good_on_every_replica_once_issued() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let region = started(3);
    let leader = region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    // The follower misses the token's entry: it is committed by the others.
    region.signal(follower, "STOP").expect("pause follower");
    let issued = token_at(&region, leader, "acme");
    region.signal(follower, "CONT").expect("resume follower");
    let (r, _) = call(
        region.http(follower),
        "GET",
        "/v1/functions",
        &issued,
        None,
        None,
    );
    assert_eq!(
        r.status, 200,
        "replica {follower} right after resuming: {r:?}"
    );
    // Issued and used at once, on every replica in turn.
    for round in 0..6u64 {
        let fresh = token(&region, "acme");
        let id = round % 3 + 1;
        let (r, _) = call(region.http(id), "GET", "/v1/functions", &fresh, None, None);
        assert_eq!(r.status, 200, "round {round}, replica {id}: {r:?}");
    }
    // A well-formed token nobody issued, and a malformed one: 401.
    let never = format!("gst_{}", "ab".repeat(32));
    for bad in [never.as_str(), "not-a-token"] {
        for id in 1..=3 {
            let (r, _) = call(region.http(id), "GET", "/v1/functions", bad, None, None);
            assert_eq!(
                (r.status, code(&r).as_str()),
                (401, "unauthorized"),
                "{bad} at replica {id}: {r:?}"
            );
        }
    }
}
