//! Hostile peers: a foreign CA, bad frames, a storm of garbage datagrams.

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gshare_region::tls::{self, TlsPaths};
use gshare_region::wire::{encode_frame, read_frame, write_frame, PeerReply, PeerRequest};
use gshare_tests::TestRegion;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn started() -> (TestRegion, u64) {
    let mut region = TestRegion::new(3).expect("region");
    for id in 1..=3 {
        region.start(id, id == 1).expect("start");
    }
    let leader = region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    (region, leader)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A QUIC client endpoint presenting `paths`' certificate.
fn client(paths: &TlsPaths) -> quinn::Endpoint {
    let mut ep =
        quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("client endpoint");
    ep.set_default_client_config(tls::client_config(paths).expect("client config"));
    ep
}

fn vote_probe() -> PeerRequest {
    PeerRequest::Vote(openraft::raft::VoteRequest::new(
        openraft::Vote::new(0, 99),
        None,
    ))
}

/// Sends one request on a new stream; Err if the peer refuses at any step.
async fn exchange(
    ep: &quinn::Endpoint,
    addr: SocketAddr,
    req: &PeerRequest,
) -> Result<PeerReply, String> {
    let conn = ep
        .connect(addr, "127.0.0.1")
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    write_frame(&mut send, req)
        .await
        .map_err(|e| e.to_string())?;
    read_frame::<PeerReply>(&mut recv)
        .await
        .map_err(|e| e.to_string())
}

#[test]
fn replica_with_a_foreign_ca_certificate_is_refused() {
    let _g = serial();
    let (region, _) = started();
    let target = region.replicas[&1].raft_addr;
    let rt = runtime();

    // Control: a replica's certificate from the region's CA gets an answer.
    let certs = region.certs();
    let (_member_dir, good) = region.replica_probe(2).expect("r2 probe");
    let reply = rt.block_on(async { exchange(&client(&good), target, &vote_probe()).await });
    assert!(
        matches!(reply, Ok(PeerReply::Vote(_))),
        "control probe: {reply:?}"
    );

    // Any other certificate of the region's CA (an agent's names its node)
    // gets no peer request through: the peer requests write the state.
    tls::issue(&certs, "probe", &tls::default_sans("probe")).expect("issue probe cert");
    let agent_like = TlsPaths {
        ca_cert: certs.join("ca.pem"),
        cert: certs.join("probe.pem"),
        key: certs.join("probe.key"),
    };
    let reply = rt.block_on(async { exchange(&client(&agent_like), target, &vote_probe()).await });
    assert!(
        reply.is_err(),
        "a certificate that is no replica's got an answer: {reply:?}"
    );
    println!("non-replica peer refused: {}", reply.unwrap_err());

    // A replica whose certificate comes from another CA (it still trusts the region's CA).
    let foreign = tempfile::tempdir().expect("tmp");
    tls::init_ca(foreign.path()).expect("foreign CA");
    tls::issue(foreign.path(), "r9", &tls::default_sans("r9")).expect("foreign cert");
    let intruder = TlsPaths {
        ca_cert: certs.join("ca.pem"),
        cert: foreign.path().join("r9.pem"),
        key: foreign.path().join("r9.key"),
    };
    let reply = rt.block_on(async { exchange(&client(&intruder), target, &vote_probe()).await });
    assert!(
        reply.is_err(),
        "a foreign-CA certificate got an answer: {reply:?}"
    );
    println!("foreign-CA peer refused: {}", reply.unwrap_err());

    // And a client that trusts only the foreign CA refuses the replica.
    let lost = TlsPaths {
        ca_cert: foreign.path().join("ca.pem"),
        cert: foreign.path().join("r9.pem"),
        key: foreign.path().join("r9.key"),
    };
    let reply = rt.block_on(async { exchange(&client(&lost), target, &vote_probe()).await });
    assert!(
        reply.is_err(),
        "a client trusting another CA accepted the replica: {reply:?}"
    );
    region
        .write("after-intruder", "ok", Duration::from_secs(10))
        .expect("region still writes");
}

#[test]
fn bad_frames_close_only_their_connection() {
    let _g = serial();
    let (region, _) = started();
    let target = region.replicas[&2].raft_addr;
    let (_member_dir, paths) = region.replica_probe(2).expect("r2 probe");
    let rt = runtime();
    rt.block_on(async {
        let ep = client(&paths);
        let healthy = ep
            .connect(target, "127.0.0.1")
            .expect("connect")
            .await
            .expect("handshake");
        for (name, bytes) in [
            ("oversized", (u32::MAX).to_be_bytes().to_vec()),
            ("malformed", {
                let mut f = 6u32.to_be_bytes().to_vec();
                f.extend_from_slice(&[0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0xfa]);
                f
            }),
        ] {
            let bad = ep
                .connect(target, "127.0.0.1")
                .expect("connect")
                .await
                .expect("handshake");
            let (mut send, mut recv) = bad.open_bi().await.expect("stream");
            send.write_all(&bytes).await.expect("send bad frame");
            let _ = send.finish();
            let r = read_frame::<PeerReply>(&mut recv).await;
            assert!(r.is_err(), "{name} frame got a reply");
            let reason = tokio::time::timeout(Duration::from_secs(5), bad.closed())
                .await
                .expect("closed");
            println!("{name} frame: connection closed ({reason})");
            // The other connection still answers.
            let (mut s, mut rcv) = healthy
                .open_bi()
                .await
                .expect("stream on healthy connection");
            write_frame(&mut s, &vote_probe()).await.expect("send");
            let r = read_frame::<PeerReply>(&mut rcv).await;
            assert!(
                matches!(r, Ok(PeerReply::Vote(_))),
                "healthy connection after {name}: {r:?}"
            );
        }
        // A well-formed frame round-trips too (sanity of the encoder used above).
        assert!(encode_frame(&vote_probe()).expect("encode").len() > 4);
    });
    region
        .write("after-bad-frames", "ok", Duration::from_secs(10))
        .expect("region still writes");
}

#[test]
fn garbage_datagram_storm_changes_nothing() {
    let _g = serial();
    let (mut region, leader) = started();
    let mut acked = BTreeMap::new();
    for i in 0..30 {
        let (k, v) = (format!("g{i:04}"), format!("v{i}"));
        region
            .write(&k, &v, Duration::from_secs(20))
            .expect("write");
        acked.insert(k, v);
    }
    let term_before = region.status(leader).expect("status")["term"].as_u64();
    let targets: Vec<SocketAddr> = region.replicas.values().map(|r| r.raft_addr).collect();
    let sock = UdpSocket::bind("127.0.0.1:0").expect("udp");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let started_at = Instant::now();
    let mut sent = 0u64;
    let mut buf = vec![0u8; 1500];
    while started_at.elapsed() < Duration::from_secs(2) {
        for t in &targets {
            let len = 1 + (next() % 1400) as usize;
            for b in buf[..len].iter_mut() {
                *b = next() as u8;
            }
            // Every few packets, look like a QUIC long-header Initial.
            if sent % 4 == 0 {
                buf[0] = 0xc0 | (buf[0] & 0x0f);
                buf[1..5].copy_from_slice(&1u32.to_be_bytes());
            }
            let _ = sock.send_to(&buf[..len], t);
            sent += 1;
        }
    }
    println!(
        "sent {sent} garbage datagrams in {:.1} s",
        started_at.elapsed().as_secs_f64()
    );
    for id in 1..=3 {
        assert!(region.alive(id), "replica {id} died in the storm");
    }
    for i in 30..50 {
        let (k, v) = (format!("g{i:04}"), format!("v{i}"));
        region
            .write(&k, &v, Duration::from_secs(20))
            .expect("write after storm");
        acked.insert(k, v);
    }
    for id in 1..=3 {
        let missing = region.wait_entries(id, "g", &acked, Duration::from_secs(15));
        assert!(missing.is_empty(), "replica {id} lacks {missing:?}");
    }
    let leader_after = region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    let term_after = region.status(leader_after).expect("status")["term"].as_u64();
    println!("leader {leader} term {term_before:?} before; leader {leader_after} term {term_after:?} after");
}
