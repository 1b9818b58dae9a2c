//! The UDP fault proxy, checked with a UDP echo pair on loopback and with
//! QUIC (mutual TLS) to a real `gshare-region` replica.

use gshare_region::tls;
use gshare_region::wire::{read_frame, write_frame, PeerReply, PeerRequest};
use gshare_tests::{Direction, FaultProxy, Faults, ProxyLimits, TestRegion};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::time::{timeout, Instant};

/// Quiet period after which a datagram counts as not coming back.
const QUIET: Duration = Duration::from_millis(300);

/// A UDP echo server; returns its address and how many datagrams it got.
async fn echo_server() -> (SocketAddr, Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    let task = tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = sock.recv_from(&mut buf).await {
            s.fetch_add(1, Ordering::Relaxed);
            let _ = sock.send_to(&buf[..n], from).await;
        }
    });
    (addr, seen, task)
}

async fn client(proxy: SocketAddr) -> UdpSocket {
    let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    c.connect(proxy).await.unwrap();
    c
}

/// Sends `msg` and returns the echo, or `None` if nothing came back.
async fn ping(c: &UdpSocket, msg: &str, wait: Duration) -> Option<String> {
    c.send(msg.as_bytes()).await.unwrap();
    let mut buf = [0u8; 2048];
    match timeout(wait, c.recv(&mut buf)).await {
        Ok(Ok(n)) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        _ => None,
    }
}

async fn wait_until(mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < until, "condition not reached in 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn forwards_both_ways_then_cut_and_heal() {
    let (echo, seen, _t) = echo_server().await;
    let proxy = FaultProxy::start(echo, 1).await.unwrap();
    let c = client(proxy.addr()).await;
    for i in 0..5 {
        let m = format!("hello {i}");
        assert_eq!(ping(&c, &m, Duration::from_secs(5)).await, Some(m));
    }
    assert_eq!(proxy.sessions(), 1);
    assert_eq!(proxy.stats(Direction::ToUpstream).forwarded, 5);
    assert_eq!(proxy.stats(Direction::ToClient).forwarded, 5);

    proxy.cut();
    for i in 0..3 {
        assert_eq!(ping(&c, &format!("cut {i}"), QUIET).await, None);
    }
    assert_eq!(proxy.stats(Direction::ToUpstream).dropped, 3);
    assert_eq!(
        seen.load(Ordering::Relaxed),
        5,
        "nothing reached the upstream"
    );

    proxy.heal();
    assert_eq!(proxy.faults(Direction::ToClient), Faults::default());
    let m = "healed".to_string();
    assert_eq!(ping(&c, &m, Duration::from_secs(5)).await, Some(m));
}

#[tokio::test]
async fn a_cut_of_one_direction_lets_the_other_through() {
    let (echo, seen, _t) = echo_server().await;
    let proxy = FaultProxy::start(echo, 2).await.unwrap();
    let c = client(proxy.addr()).await;
    proxy.set(
        Direction::ToClient,
        Faults {
            cut: true,
            ..Faults::default()
        },
    );
    for i in 0..4 {
        assert_eq!(ping(&c, &format!("one-way {i}"), QUIET).await, None);
    }
    wait_until(|| seen.load(Ordering::Relaxed) == 4).await;
    assert_eq!(proxy.stats(Direction::ToUpstream).forwarded, 4);
    wait_until(|| proxy.stats(Direction::ToClient).dropped == 4).await;
}

/// Sends `n` datagrams through a fresh proxy with drop probability `p` on
/// the way up and returns the indices of those that reached the upstream.
async fn delivered_with_drop(seed: u64, p: f64, n: u64) -> Vec<u64> {
    let up = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let proxy = FaultProxy::start(up.local_addr().unwrap(), seed)
        .await
        .unwrap();
    proxy.set(
        Direction::ToUpstream,
        Faults {
            drop_probability: p,
            ..Faults::default()
        },
    );
    let c = client(proxy.addr()).await;
    for i in 0..n {
        c.send(&i.to_be_bytes()).await.unwrap();
        // Keep the socket buffers small: let the proxy catch up now and then.
        if i % 50 == 49 {
            wait_until(|| {
                let s = proxy.stats(Direction::ToUpstream);
                s.forwarded + s.dropped == i + 1
            })
            .await;
        }
    }
    wait_until(|| {
        let s = proxy.stats(Direction::ToUpstream);
        s.forwarded + s.dropped == n
    })
    .await;
    let forwarded = proxy.stats(Direction::ToUpstream).forwarded;
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while (got.len() as u64) < forwarded {
        let k = timeout(Duration::from_secs(5), up.recv(&mut buf))
            .await
            .expect("forwarded datagram arrives")
            .unwrap();
        got.push(u64::from_be_bytes(buf[..k].try_into().unwrap()));
    }
    got
}

#[tokio::test]
async fn seeded_drops_are_random_but_reproducible() {
    let a = delivered_with_drop(42, 0.5, 400).await;
    let b = delivered_with_drop(42, 0.5, 400).await;
    let c = delivered_with_drop(43, 0.5, 400).await;
    // Binomial(400, 0.5): mean 200, sd 10.
    assert!((120..=280).contains(&a.len()), "{} delivered", a.len());
    assert_eq!(a, b, "same seed, same datagrams dropped");
    assert_ne!(a, c, "another seed drops others");
    assert_eq!(delivered_with_drop(7, 0.0, 100).await.len(), 100);
    assert_eq!(delivered_with_drop(7, 1.0, 100).await.len(), 0);
}

#[tokio::test]
async fn delay_holds_datagrams_at_least_that_long() {
    let (echo, _seen, _t) = echo_server().await;
    let proxy = FaultProxy::start(echo, 3).await.unwrap();
    let c = client(proxy.addr()).await;
    let delay = Duration::from_millis(100);
    proxy.set(
        Direction::ToUpstream,
        Faults {
            delay,
            ..Faults::default()
        },
    );
    let t0 = Instant::now();
    let m = "slow".to_string();
    assert_eq!(ping(&c, &m, Duration::from_secs(10)).await, Some(m));
    // A lower bound only: a delay is never cut short (a slow machine only adds).
    assert!(t0.elapsed() >= delay, "echo came back before the delay");
    // Both directions delayed: order is kept within a direction.
    proxy.set_delay(delay);
    for i in 0..10u8 {
        c.send(&[i]).await.unwrap();
    }
    let mut order = Vec::new();
    let mut buf = [0u8; 8];
    for _ in 0..10 {
        let n = timeout(Duration::from_secs(10), c.recv(&mut buf))
            .await
            .unwrap()
            .unwrap();
        order.push(buf[..n][0]);
    }
    assert_eq!(order, (0..10).collect::<Vec<u8>>());
}

#[tokio::test]
async fn bounded_sessions_and_queue() {
    let (echo, _seen, _t) = echo_server().await;
    let limits = ProxyLimits {
        max_sessions: 2,
        queue_datagrams: 4,
    };
    let proxy = FaultProxy::start_with("127.0.0.1:0".parse().unwrap(), echo, 4, limits)
        .await
        .unwrap();
    let (a, b, extra) = (
        client(proxy.addr()).await,
        client(proxy.addr()).await,
        client(proxy.addr()).await,
    );
    assert!(ping(&a, "a", Duration::from_secs(5)).await.is_some());
    assert!(ping(&b, "b", Duration::from_secs(5)).await.is_some());
    assert_eq!(ping(&extra, "c", QUIET).await, None, "third client refused");
    assert_eq!(proxy.sessions(), 2);
    assert_eq!(proxy.stats(Direction::ToUpstream).overflowed, 1);

    // Four datagrams fit in the delay queue; the rest overflow.
    proxy.set(
        Direction::ToUpstream,
        Faults {
            delay: Duration::from_secs(30),
            ..Faults::default()
        },
    );
    for i in 0..10u8 {
        a.send(&[i]).await.unwrap();
    }
    wait_until(|| proxy.stats(Direction::ToUpstream).overflowed == 1 + 6).await;
}

#[tokio::test]
async fn dropping_the_proxy_stops_it() {
    let (echo, seen, _t) = echo_server().await;
    let proxy = FaultProxy::start(echo, 5).await.unwrap();
    let addr = proxy.addr();
    let c = client(addr).await;
    assert!(ping(&c, "x", Duration::from_secs(5)).await.is_some());
    drop(proxy);
    // Its socket is closed: the port can be bound again.
    let until = Instant::now() + Duration::from_secs(10);
    let rebound = loop {
        match UdpSocket::bind(addr).await {
            Ok(s) => break s,
            Err(_) if Instant::now() < until => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => panic!("proxy port still bound after drop: {e}"),
        }
    };
    drop(rebound);
    assert_eq!(ping(&c, "y", QUIET).await, None);
    assert_eq!(seen.load(Ordering::Relaxed), 1);
}

/// One request on a new stream of `conn`, bounded by `wait`.
async fn vote_probe(conn: &quinn::Connection, wait: Duration) -> Result<PeerReply, String> {
    let req = PeerRequest::Vote(openraft::raft::VoteRequest::new(
        openraft::Vote::new(0, 99),
        None,
    ));
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
        write_frame(&mut send, &req)
            .await
            .map_err(|e| e.to_string())?;
        read_frame::<PeerReply>(&mut recv)
            .await
            .map_err(|e| e.to_string())
    };
    timeout(wait, exchange)
        .await
        .map_err(|_| format!("no answer in {wait:?}"))?
}

async fn connect(
    ep: &quinn::Endpoint,
    addr: SocketAddr,
    wait: Duration,
) -> Result<quinn::Connection, String> {
    let connecting = ep.connect(addr, "127.0.0.1").map_err(|e| e.to_string())?;
    timeout(wait, connecting)
        .await
        .map_err(|_| format!("no handshake in {wait:?}"))?
        .map_err(|e| e.to_string())
}

#[test]
fn quic_to_a_replica_fails_while_cut_and_works_after_heal() {
    let mut region = TestRegion::new(1).expect("region");
    region.start(1, true).expect("start");
    region
        .wait_leader(&[1], Duration::from_secs(20))
        .expect("leader");
    let target = region.replicas[&1].raft_addr;
    // (The peer port takes only a replica's certificate.)
    let (_probe_dir, paths) = region.replica_probe(1).expect("r1 probe");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let proxy = FaultProxy::start(target, 11).await.unwrap();
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(tls::client_config(&paths).unwrap());
        let long = Duration::from_secs(10);
        let short = Duration::from_millis(700);

        let conn = connect(&ep, proxy.addr(), long)
            .await
            .expect("handshake through the proxy");
        let r = vote_probe(&conn, long).await;
        assert!(
            matches!(r, Ok(PeerReply::Vote(_))),
            "through the proxy: {r:?}"
        );

        proxy.cut();
        let r = vote_probe(&conn, short).await;
        assert!(r.is_err(), "a request went through a cut: {r:?}");
        let c = connect(&ep, proxy.addr(), short).await;
        assert!(c.is_err(), "a handshake went through a cut");
        assert!(proxy.stats(Direction::ToUpstream).dropped > 0);

        proxy.heal();
        let fresh = connect(&ep, proxy.addr(), long)
            .await
            .expect("handshake after heal");
        let r = vote_probe(&fresh, long).await;
        assert!(matches!(r, Ok(PeerReply::Vote(_))), "after heal: {r:?}");
        // The connection from before the cut carries on too (QUIC retransmits).
        let r = vote_probe(&conn, long).await;
        assert!(
            matches!(r, Ok(PeerReply::Vote(_))),
            "old connection after heal: {r:?}"
        );
    });
}
