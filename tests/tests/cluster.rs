//! Real `gshare-region` processes on loopback: failover, restart, membership.
//!
//! Tests run one at a time (a shared lock): each starts 3–4 processes and the
//! machines these run on are small.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gshare_tests::test_region::{acknowledged, write_at};
use gshare_tests::{TestRegion, TOKEN};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const LEADER_WAIT: Duration = Duration::from_secs(15);
const CATCH_UP: Duration = Duration::from_secs(15);

fn started(n: u64) -> anyhow::Result<(TestRegion, u64)> {
    started_with(n, "")
}

fn started_with(n: u64, extra: &str) -> anyhow::Result<(TestRegion, u64)> {
    let mut region = TestRegion::with_config(n, extra)?;
    for id in 1..=n {
        region.start(id, id == 1)?;
    }
    let ids: Vec<u64> = (1..=n).collect();
    let leader = region.wait_leader(&ids, LEADER_WAIT)?;
    Ok((region, leader))
}

fn write_many(
    region: &TestRegion,
    prefix: &str,
    range: std::ops::Range<u32>,
    acked: &mut BTreeMap<String, String>,
) {
    for i in range {
        let (k, v) = (format!("{prefix}{i:05}"), format!("v{i}"));
        region
            .write(&k, &v, Duration::from_secs(20))
            .expect("write acknowledged");
        acked.insert(k, v);
    }
}

fn assert_all_on(region: &TestRegion, ids: &[u64], prefix: &str, acked: &BTreeMap<String, String>) {
    for id in ids {
        let missing = region.wait_entries(*id, prefix, acked, CATCH_UP);
        assert!(
            missing.is_empty(),
            "replica {id} lacks {} of {} acknowledged writes, e.g. {:?}",
            missing.len(),
            acked.len(),
            missing.iter().take(5).collect::<Vec<_>>()
        );
    }
}

/// An acknowledged write: value, when its successful attempt was sent, when it was acknowledged.
type Ack = (String, Instant, Instant);

#[test]
fn leader_kill_during_writes_loses_no_acknowledged_write() {
    let _g = serial();
    let (mut region, leader) = started(3).expect("3-replica region");
    let addrs: Vec<(u64, std::net::SocketAddr)> = region
        .replicas
        .values()
        .map(|r| (r.id, r.http_addr))
        .collect();
    let acked = Arc::new(Mutex::new(BTreeMap::<String, Ack>::new()));
    let dead = Arc::new(Mutex::new(None::<u64>));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (acked, dead, stop, addrs) =
                (acked.clone(), dead.clone(), stop.clone(), addrs.clone());
            std::thread::spawn(move || {
                let mut seq = 0u32;
                let mut turn = w;
                while !stop.load(Ordering::Relaxed) {
                    let (k, v) = (format!("w{w}-{seq:05}"), format!("v{seq}"));
                    // Retry the same key until acknowledged (a lost answer
                    // shows as `duplicate_name` on the retry).
                    loop {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let (id, addr) = addrs[turn % addrs.len()];
                        turn += 1;
                        if *dead.lock().unwrap() == Some(id) {
                            continue;
                        }
                        let sent = Instant::now();
                        if let Ok(r) = write_at(addr, &k, &v) {
                            if acknowledged(&r) {
                                acked
                                    .lock()
                                    .unwrap()
                                    .insert(k.clone(), (v.clone(), sent, Instant::now()));
                                break;
                            }
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    seq += 1;
                }
            })
        })
        .collect();

    let until = Instant::now() + Duration::from_secs(20);
    while acked.lock().unwrap().len() < 200 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = acked.lock().unwrap().len();
    assert!(
        before >= 50,
        "only {before} writes acknowledged before the kill"
    );
    *dead.lock().unwrap() = Some(leader);
    let killed_at = Instant::now();
    region.kill9(leader).expect("kill -9 the leader");
    let live: Vec<u64> = region.running();
    let new_leader = region
        .wait_leader(&live, LEADER_WAIT)
        .expect("a new leader within 15 s");
    let elected = killed_at.elapsed();
    // Wait for 100 writes sent after the kill to be acknowledged.
    let until = Instant::now() + LEADER_WAIT;
    let first_after = loop {
        let after: Vec<Instant> = acked
            .lock()
            .unwrap()
            .values()
            .filter(|(_, sent, _)| *sent > killed_at)
            .map(|(_, _, at)| *at)
            .collect();
        if after.len() >= 100 {
            break after.into_iter().min().expect("non-empty");
        }
        assert!(
            Instant::now() < until,
            "fewer than 100 writes sent after the kill were acknowledged"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().expect("writer thread");
    }
    println!(
        "failover: killed leader {leader}; replica {new_leader} leads after {:.0} ms; \
         first write sent after the kill acknowledged at {:.0} ms",
        elected.as_secs_f64() * 1e3,
        (first_after - killed_at).as_secs_f64() * 1e3
    );
    let acked: BTreeMap<String, String> = acked
        .lock()
        .unwrap()
        .iter()
        .map(|(k, (v, _, _))| (k.clone(), v.clone()))
        .collect();
    println!(
        "acknowledged writes: {} ({before} before the kill)",
        acked.len()
    );
    assert_all_on(&region, &live, "w", &acked);
}

#[test]
fn full_restart_keeps_state_and_second_init_is_a_no_op() {
    let _g = serial();
    let (mut region, _) = started(3).expect("3-replica region");
    let mut acked = BTreeMap::new();
    write_many(&region, "r", 0..60, &mut acked);
    for id in 1..=3 {
        region.kill9(id).expect("kill");
    }
    for id in 1..=3 {
        region.start(id, id == 1).expect("restart");
    }
    region
        .wait_leader(&[1, 2, 3], LEADER_WAIT)
        .expect("leader after restart");
    let out = region.stdout(1, 2);
    assert!(
        out.contains("changed nothing"),
        "second --init should be a no-op, stdout was: {out}"
    );
    assert_all_on(&region, &[1, 2, 3], "r", &acked);
    write_many(&region, "r", 60..80, &mut acked);
    assert_all_on(&region, &[1, 2, 3], "r", &acked);
}

#[test]
fn add_a_fourth_replica_and_remove_one_keeps_every_write() {
    let _g = serial();
    // Snapshots every 16 entries and no log kept behind them: the new replica
    // can only catch up by installing a snapshot sent over QUIC.
    let (mut region, leader) =
        started_with(3, "snapshot_every = 16\nkeep_logs = 0").expect("3-replica region");
    let mut acked = BTreeMap::new();
    write_many(&region, "m", 0..40, &mut acked);
    let deadline = Instant::now() + Duration::from_secs(15);
    while region.status(leader).expect("status")["purged_index"]
        .as_u64()
        .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "the leader never purged its log after a snapshot"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    region.add_replica_config(4).expect("config of replica 4");
    region.start(4, false).expect("start replica 4");
    let r4 = &region.replicas[&4];
    let (raft4, http4) = (r4.raft_addr.to_string(), r4.http_addr.to_string());
    let at = region.http(1).to_string();
    let (ok, out) = region
        .gsharectl(&[
            "cluster",
            "add-replica",
            "--at",
            &at,
            "--token",
            TOKEN,
            "--id",
            "4",
            "--raft-addr",
            &raft4,
            "--http-addr",
            &http4,
        ])
        .expect("run gsharectl");
    assert!(ok, "add-replica failed: {out}");
    assert_all_on(&region, &[4], "m", &acked);
    let metrics = gshare_region::http_client::request(
        region.http(1),
        "GET",
        "/metrics",
        None,
        None,
        Duration::from_secs(5),
    )
    .expect("metrics");
    println!(
        "replica 1 after adding 4:\n{}",
        metrics
            .body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    );
    write_many(&region, "m", 40..70, &mut acked);

    // Remove a replica that is not the leader, then stop it.
    let victim = (1..=3).find(|id| *id != leader).expect("a follower");
    let (ok, out) = region
        .gsharectl(&[
            "cluster",
            "remove-replica",
            "--at",
            &at,
            "--token",
            TOKEN,
            "--id",
            &victim.to_string(),
        ])
        .expect("run gsharectl");
    assert!(ok, "remove-replica failed: {out}");
    region.kill9(victim).expect("stop removed replica");
    write_many(&region, "m", 70..100, &mut acked);
    let live = region.running();
    assert_eq!(live.len(), 3);
    assert_all_on(&region, &live, "m", &acked);
    let members: Vec<u64> = region.status(live[0]).expect("status")["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|m| m["id"].as_u64())
        .collect();
    assert_eq!(members, live, "membership after add and remove");
    let (ok, out) = region
        .gsharectl(&["cluster", "status", "--at", &at, "--json"])
        .expect("status");
    assert!(ok && out.contains("\"members\""), "{out}");

    // `cluster` takes the region like every other command: from
    // GSHARE_REGION (a replica on a non-default port), printed for a person.
    let other = live[live.len() - 1];
    let url = format!("http://{}", region.http(other));
    let out = std::process::Command::new(gshare_tests::binary("gsharectl"))
        .args(["cluster", "status"])
        .env("GSHARE_REGION", &url)
        .output()
        .expect("gsharectl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["id:", &other.to_string()]),
        "not replica {other}'s status:\n{text}"
    );
    assert!(text.contains("MEMBER HTTP_ADDR"), "{text}");
    assert!(!text.contains('{'), "human output, not JSON:\n{text}");
    let help = std::process::Command::new(gshare_tests::binary("gsharectl"))
        .args(["cluster", "status", "--help"])
        .output()
        .expect("gsharectl");
    assert!(String::from_utf8_lossy(&help.stdout).contains("--region"));
}

/// Regression: a leader cut off with writes in its log, whose majority
/// elected another leader and snapshotted past them meanwhile, installs that
/// snapshot when it rejoins; openraft then purges the writes' entries without
/// answering their clients. Each held one of the proposer's two in-flight
/// slots for ever, so with two of them every later write through that
/// replica hung. Now a write not committed within `COMMIT_WITHIN` is
/// answered `outcome_unknown` and frees its slot.
#[test]
fn a_rejoining_leader_whose_writes_a_snapshot_replaced_answers_them_and_writes_again() {
    use gshare_region::http_client::request;
    let _g = serial();
    let (region, old) =
        started_with(3, "snapshot_every = 16\nkeep_logs = 0").expect("3-replica region");
    let mut acked = BTreeMap::new();
    write_many(&region, "s", 0..3, &mut acked);
    let others: Vec<u64> = (1..=3).filter(|id| *id != old).collect();
    for id in &others {
        region.signal(*id, "STOP").expect("pause a follower");
    }
    // Two writes the leader appends but cannot commit, each its own batch
    // (the second is sent while the first holds a slot).
    let addr = region.http(old);
    let stuck: Vec<_> = (0..2)
        .map(|i| {
            let handle = std::thread::spawn(move || {
                let body = format!(r#"{{"name": "stuck{i}", "display_name": "v"}}"#);
                let sent = Instant::now();
                let r = request(
                    addr,
                    "POST",
                    "/v1/tenants",
                    Some(TOKEN),
                    Some(&body),
                    Duration::from_secs(90),
                );
                (r, sent.elapsed())
            });
            std::thread::sleep(Duration::from_millis(400));
            handle
        })
        .collect();
    // Both appended (the log stops growing): a snapshot past this index
    // finds no entry of the old leader's at its own, so installing it
    // purges the writes' entries instead of truncating them (which would
    // answer them).
    let last = || region.status(old).expect("status")["last_log_index"].as_u64();
    let mut appended = last().expect("a log");
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = last().expect("a log");
        if now == appended {
            break;
        }
        appended = now;
    }
    // The leader pauses with them; the majority elects another leader and
    // snapshots (purging its log) past them.
    region.signal(old, "STOP").expect("pause the leader");
    for id in &others {
        region.signal(*id, "CONT").expect("resume a follower");
    }
    let new = region
        .wait_leader(&others, LEADER_WAIT)
        .expect("a new leader");
    let mut i = 3;
    let deadline = Instant::now() + Duration::from_secs(60);
    while region.status(new).expect("status")["purged_index"]
        .as_u64()
        .is_none_or(|p| p <= appended + 1)
    {
        assert!(
            Instant::now() < deadline,
            "the new leader never purged past {appended}"
        );
        let (k, v) = (format!("s{i:05}"), format!("v{i}"));
        let r = write_at(region.http(new), &k, &v).expect("write through the new leader");
        assert!(acknowledged(&r), "{} {}", r.status, r.body);
        acked.insert(k, v);
        i += 1;
    }
    println!("purged past {appended} after {i} writes; resuming replica {old}");
    region.signal(old, "CONT").expect("resume the old leader");
    // The old replica catches up (by the snapshot) ...
    assert_all_on(&region, &[old], "s", &acked);
    // ... answers its two writes: one appended and purged, answered
    // unknown; one either the same, or (queued behind the two slots held,
    // the other by a write of the region's own) proposed once a slot was
    // freed, forwarded to the new leader and committed ...
    let mut committed = BTreeMap::new();
    for (i, h) in stuck.into_iter().enumerate() {
        let (r, took) = h.join().expect("writer thread");
        let r = r.expect("the stuck write is answered, not left to time out");
        println!("stuck{i}: {} after {took:?}: {}", r.status, r.body);
        match r.status {
            201 => {
                committed.insert(format!("stuck{i}"), "v".to_string());
            }
            _ => assert!(
                r.status == 502 && r.body.contains("outcome_unknown"),
                "{} {}",
                r.status,
                r.body
            ),
        }
        // Unknown: by the bound (a purged entry gets no other answer), or,
        // should the new leader's first append have reached the old one
        // before the snapshot (conflicting entries are truncated, and
        // answered), by the refusal rule.
        assert!(
            r.status == 201 || (r.status == 502 && r.body.contains("outcome_unknown")),
            "{} {}",
            r.status,
            r.body
        );
    }
    // ... and takes new writes.
    let r = write_at(addr, "after", "v").expect("a write through the old leader");
    assert!(acknowledged(&r), "{} {}", r.status, r.body);
    assert_all_on(&region, &[1, 2, 3], "stuck", &committed);
}

/// A membership change the region cannot commit (its followers paused) is
/// answered within `MEMBERSHIP_WITHIN`, as an unknown outcome, through the
/// operator's own command; it used to hold the request for ever (and
/// `gsharectl` gave up at its 30 s with no answer). With the followers back
/// the change either completes (the leader's task goes on with both of its
/// commits) or was dropped with a lost leadership; sending it again then
/// finishes it, as the answer says, and the region leads and writes.
#[test]
fn a_membership_change_without_a_quorum_is_answered_unknown_in_time() {
    let _g = serial();
    let (region, leader) = started(3).expect("3-replica region");
    let mut acked = BTreeMap::new();
    write_many(&region, "q", 0..3, &mut acked);
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let removed = others[0];
    for id in &others {
        region.signal(*id, "STOP").expect("pause a follower");
    }
    let remove = |at: u64| {
        region
            .gsharectl(&[
                "cluster",
                "remove-replica",
                "--at",
                &region.http(at).to_string(),
                "--token",
                TOKEN,
                "--id",
                &removed.to_string(),
            ])
            .expect("run gsharectl")
    };
    let sent = Instant::now();
    let (ok, out) = remove(leader);
    let took = sent.elapsed();
    println!("remove-replica answered after {took:?}: {out}");
    assert!(!ok, "a change without a quorum reported done: {out}");
    assert!(
        out.contains("outcome_unknown") && out.contains("not done within 25 s"),
        "{out}"
    );
    assert!(
        took < gshare_region::http::MEMBERSHIP_WITHIN + Duration::from_secs(4),
        "answered after {took:?}"
    );
    // The one that stays a member first, so that it does not start behind.
    for id in others.iter().rev() {
        region.signal(*id, "CONT").expect("resume a follower");
    }
    // Until a leader's view no longer has the removed replica, nor a joint
    // configuration: send the change again where it is not done.
    let stay: Vec<u64> = (1..=3).filter(|id| *id != removed).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut resent = 0;
    loop {
        let lead = (1..=3u64).find_map(|id| {
            region
                .status(id)
                .ok()
                .filter(|s| s["role"] == "leader")
                .map(|s| (id, s))
        });
        if let Some((id, s)) = &lead {
            let members: Vec<u64> = s["members"]
                .as_array()
                .map(|m| m.iter().filter_map(|m| m["id"].as_u64()).collect())
                .unwrap_or_default();
            if members == stay && s["joint"] != true {
                println!("removed after {:?} ({resent} sent again)", sent.elapsed());
                break;
            }
            if members != stay {
                // Dropped, or half done (`joint`): sent again, it finishes
                // (a change still under way answers 503, harmless).
                let (ok, out) = remove(*id);
                resent += 1;
                println!("sent again to {id}: {ok} {out}");
            }
        }
        assert!(
            Instant::now() < deadline,
            "replica {removed} still a member: {lead:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    region.wait_leader(&stay, LEADER_WAIT).expect("a leader");
    write_many(&region, "q", 3..6, &mut acked);
    assert_all_on(&region, &stay, "q", &acked);
}

/// Adding a replica that never catches up (nothing listens at its address)
/// is answered within `MEMBERSHIP_WITHIN`, saying it is not a voter; it is
/// then a learner, and removing it removes it (a learner used to be sent as
/// a voter removal, which changed nothing and answered 200).
#[test]
fn a_replica_that_never_catches_up_is_left_a_learner_and_can_be_removed() {
    let _g = serial();
    let (mut region, leader) = started(3).expect("3-replica region");
    region.add_replica_config(4).expect("config of replica 4");
    let r4 = &region.replicas[&4];
    let (raft4, http4) = (r4.raft_addr.to_string(), r4.http_addr.to_string());
    let at = region.http(leader).to_string();
    let members = |region: &TestRegion| -> Vec<(u64, bool)> {
        region.status(leader).expect("status")["members"]
            .as_array()
            .expect("members")
            .iter()
            .filter_map(|m| Some((m["id"].as_u64()?, m["voter"].as_bool()?)))
            .collect()
    };
    let sent = Instant::now();
    let (ok, out) = region
        .gsharectl(&[
            "cluster",
            "add-replica",
            "--at",
            &at,
            "--token",
            TOKEN,
            "--id",
            "4",
            "--raft-addr",
            &raft4,
            "--http-addr",
            &http4,
        ])
        .expect("run gsharectl");
    let took = sent.elapsed();
    println!("add-replica answered after {took:?}: {out}");
    assert!(!ok, "a replica that cannot catch up was added: {out}");
    assert!(
        out.contains("outcome_unknown") && out.contains("it is not a voter"),
        "{out}"
    );
    assert!(
        took < gshare_region::http::MEMBERSHIP_WITHIN + Duration::from_secs(4),
        "answered after {took:?}"
    );
    assert_eq!(
        members(&region),
        vec![(1, true), (2, true), (3, true), (4, false)],
        "replica 4 a learner"
    );
    let (ok, out) = region
        .gsharectl(&[
            "cluster",
            "remove-replica",
            "--at",
            &at,
            "--token",
            TOKEN,
            "--id",
            "4",
        ])
        .expect("run gsharectl");
    assert!(ok, "removing the learner failed: {out}");
    assert_eq!(
        members(&region),
        vec![(1, true), (2, true), (3, true)],
        "the learner removed"
    );
    let mut acked = BTreeMap::new();
    write_many(&region, "l", 0..3, &mut acked);
    assert_all_on(&region, &[1, 2, 3], "l", &acked);
}
