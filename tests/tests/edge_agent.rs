//! The agent against a stand-in region: a quinn server with the operator
//! CA speaking core's protocol (the region replica's agent endpoint is not
//! built yet). Everything else is the real agent: RegionLink over QUIC +
//! mutual TLS, NodeAgent with core's executor, GpuActors, InstanceActors
//! with the sim driver, and the HTTP ingress. The last tests run the
//! `gshare-edge` binary as a process.

use gshare_core::config::AgentConfig;
use gshare_core::model::{
    FunctionSpec, GpuId, LatencyProfile, NodeId, PoolPreference, Runtime, Slice, TenantId, Tier,
};
use gshare_core::protocol::{
    AgentMessage, AgentMessageV1, AssignedInstance, Assignment, InvokeOutcome, InvokeRequest,
    RegionMessage, RegionMessageV1, TenantTokens, TokenDigests,
};
use gshare_core::state::InstanceId;
use gshare_edge::agent::{NodeAgent, NodeSetup, StatusQuery};
use gshare_edge::gpu::discover;
use gshare_edge::ingress;
use gshare_edge::region_link::RegionLink;
use gshare_edge::runtime::SimDriver;
use gshare_edge::token::token_digest;
use gshare_edge::wire::{read_frame, write_frame};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use gshare_tests::stand_in_region::{fake_region, issue, new_ca, Ca, FakeRegion};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

const TOKEN: &str = "s3cret";

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

struct Agent {
    ingress: SocketAddr,
    addr: actix::Addr<NodeAgent>,
    _dir: tempfile::TempDir,
}

fn start_agent(
    agent_ca: &Ca,
    trust_pem: &str,
    replicas: &[SocketAddr],
    gpus: u32,
    gpu_mib: u64,
) -> Agent {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = issue(agent_ca, "n1");
    std::fs::write(dir.path().join("ca.pem"), trust_pem).unwrap();
    std::fs::write(dir.path().join("n1.pem"), cert).unwrap();
    std::fs::write(dir.path().join("n1.key"), key).unwrap();
    let ingress_addr = free_port();
    let replicas: String = replicas
        .iter()
        .map(|a| format!("[[replicas]]\nquic_addr = \"{a}\"\n"))
        .collect();
    let text = format!(
        r#"node = "n1"
pool = "center"
pool_kind = "center"
data_dir = "data"
ingress_addr = "{ingress_addr}"
host_swap_mib = 131072
heartbeat_ms = 50
[gpus]
backend = "simulated"
[[gpus.simulated]]
model = "sim"
memory_mib = {gpu_mib}
h2d_mib_per_s = 600000
count = {gpus}
[load]
swap_setup_us = 2000
cold_setup_us = 20000
storage_mib_per_s = 100000
{replicas}
[tls]
ca_cert = "ca.pem"
cert = "n1.pem"
key = "n1.key"
"#
    );
    let config = AgentConfig::from_toml("agent.toml", &text).unwrap();
    let found = discover(&config.gpus).unwrap();
    let addr = actix::Actor::start(NodeAgent::new(NodeSetup {
        node: config.node.clone(),
        gpus: found.gpus.clone(),
        host_swap_mib: config.host_swap_mib,
        load: config.load,
        driver: Box::new(|_| Box::new(SimDriver::new())),
        process_counters: Default::default(),
        clock: gshare_core::clock::SystemClock::shared(),
    }));
    let server = ingress::serve(ingress_addr, addr.clone(), 1).unwrap();
    actix_rt::spawn(server);
    RegionLink::start_link(&config, dir.path(), &found, addr.clone()).unwrap();
    Agent {
        ingress: ingress_addr,
        addr,
        _dir: dir,
    }
}

fn spec(name: &str, tier: Tier, memory_mib: u64, full_gpu_us: u64) -> FunctionSpec {
    FunctionSpec {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        tenant: TenantId("acme".into()),
        name: name.into(),
        runtime: Runtime::Custom,
        memory_mib,
        compute_milli: 500,
        tier,
        deadline_ms: 5_000,
        pool: PoolPreference::Any,
        min_instances: 1,
        max_instances: 1,
        idle_timeout_s: 600,
        latency: LatencyProfile {
            full_gpu_us,
            saturation_milli: 500,
        },
    }
}

async fn push(conn: &quinn::Connection, msg: RegionMessageV1) {
    let mut send = conn.open_uni().await.unwrap();
    write_frame(&mut send, &RegionMessage::v1(msg))
        .await
        .unwrap();
}

async fn assign(conn: &quinn::Connection, specs: &[FunctionSpec]) {
    push(
        conn,
        RegionMessageV1::Tokens(TokenDigests {
            applied_index: 1,
            tenants: vec![TenantTokens {
                tenant: TenantId("acme".into()),
                digests: vec![token_digest(TOKEN)],
            }],
        }),
    )
    .await;
    let instances = specs
        .iter()
        .enumerate()
        .map(|(i, s)| AssignedInstance {
            instance: InstanceId(i as u64 + 1),
            spec: s.clone(),
            version: 1,
            slices: vec![Slice {
                gpu: GpuId {
                    node: NodeId("n1".into()),
                    index: 0,
                },
                compute_milli: 500,
                memory_mib: s.memory_mib,
            }],
        })
        .collect();
    push(
        conn,
        RegionMessageV1::Assignment(Assignment {
            applied_index: 1,
            instances,
        }),
    )
    .await;
}

/// Blocking HTTP/1.1 POST with `Connection: close`: (status, body).
fn post(addr: SocketAddr, path: &str, token: &str, extra: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n{extra}Content-Length: 2\r\nConnection: close\r\n\r\nhi"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

async fn invoke(addr: SocketAddr, name: &str) -> (u16, String) {
    let path = format!("/v1/invoke/acme/{name}");
    tokio::task::spawn_blocking(move || post(addr, &path, TOKEN, ""))
        .await
        .unwrap()
}

async fn wait_until_served(addr: SocketAddr, name: &str) {
    for _ in 0..200 {
        if invoke(addr, name).await.0 == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{name} never served");
}

async fn next_registration(region: &mut FakeRegion) -> quinn::Connection {
    tokio::time::timeout(Duration::from_secs(15), region.registered.recv())
        .await
        .expect("agent registers in time")
        .unwrap()
}

#[actix_rt::test]
async fn registers_receives_an_instance_and_serves_directly_and_forwarded() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let agent = start_agent(&ca, &ca.pem, &[region.addr], 2, 16_384);
    let conn = next_registration(&mut region).await;
    assign(&conn, &[spec("echo", Tier::Guaranteed, 1024, 1_000)]).await;
    wait_until_served(agent.ingress, "echo").await;

    let (status, body) = invoke(agent.ingress, "echo").await;
    assert_eq!((status, body.as_str()), (200, "hi"));
    // Wrong token, unknown function, unmeetable deadline: explicit answers.
    let ingress = agent.ingress;
    let (s, _) =
        tokio::task::spawn_blocking(move || post(ingress, "/v1/invoke/acme/echo", "nope", ""))
            .await
            .unwrap();
    assert_eq!(s, 401);
    let (s, b) = invoke(agent.ingress, "missing").await;
    assert_eq!(s, 404, "{b}");
    assert!(b.contains("unknown_function"), "{b}");
    let slow = spec("slow", Tier::Guaranteed, 1024, 2_000_000);
    assign(&conn, &[spec("echo", Tier::Guaranteed, 1024, 1_000), slow]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (s, b) = tokio::task::spawn_blocking(move || {
        post(
            ingress,
            "/v1/invoke/acme/slow",
            TOKEN,
            "X-Gshare-Deadline-Ms: 5\r\n",
        )
    })
    .await
    .unwrap();
    assert_eq!(s, 504, "{b}");
    assert!(b.contains("deadline_unreachable"), "{b}");

    // Forwarded by a replica over QUIC.
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let req = RegionMessage::v1(RegionMessageV1::Invoke(InvokeRequest {
        id: 7,
        tenant: TenantId("acme".into()),
        function: "echo".into(),
        deadline_ms: None,
        body: b"fwd".to_vec(),
    }));
    write_frame(&mut send, &req).await.unwrap();
    let AgentMessage::V1(AgentMessageV1::InvokeReply(r)) = read_frame(&mut recv).await.unwrap()
    else {
        panic!("not an invoke reply");
    };
    assert_eq!(r.id, 7);
    assert!(matches!(r.outcome, InvokeOutcome::Done { ref body, .. } if body == b"fwd"));
}

#[actix_rt::test]
async fn killing_the_replica_does_not_interrupt_invocations_and_the_agent_moves_on() {
    let ca = new_ca();
    let mut r1 = fake_region(&ca);
    let mut r2 = fake_region(&ca);
    let agent = start_agent(&ca, &ca.pem, &[r1.addr, r2.addr], 1, 16_384);
    let conn = next_registration(&mut r1).await;
    assign(&conn, &[spec("echo", Tier::Guaranteed, 1024, 2_000)]).await;
    wait_until_served(agent.ingress, "echo").await;
    let ingress = agent.ingress;
    let load = tokio::task::spawn_blocking(move || {
        (0..300)
            .map(|_| post(ingress, "/v1/invoke/acme/echo", TOKEN, "").0)
            .filter(|s| *s != 200)
            .count()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    r1.endpoint.close(0u32.into(), b"killed");
    drop(conn);
    let conn2 = next_registration(&mut r2).await;
    let failures = load.await.unwrap();
    assert_eq!(failures, 0, "invocations failed while the region was down");
    // The new replica's view reaches the agent too.
    assign(&conn2, &[spec("echo2", Tier::Guaranteed, 1024, 0)]).await;
    wait_until_served(agent.ingress, "echo2").await;
    assert_eq!(invoke(agent.ingress, "echo").await.0, 404);
}

/// A replica whose host is down (its datagrams vanish) costs the agent
/// its handshake bound (2 s), not QUIC's 30 s idle timeout: a node no
/// replica hears from for a few seconds is declared lost and its
/// instances are placed elsewhere.
#[actix_rt::test]
async fn a_replica_that_never_answers_is_passed_over_within_the_handshake_bound() {
    let ca = new_ca();
    // Bound and never read: no answer, and no "port unreachable" either.
    let hole = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut region = fake_region(&ca);
    let _agent = start_agent(
        &ca,
        &ca.pem,
        &[hole.local_addr().unwrap(), region.addr],
        1,
        16_384,
    );
    let asked = std::time::Instant::now();
    // `next_registration` waits 15 s: half QUIC's idle timeout.
    let _conn = next_registration(&mut region).await;
    println!(
        "registered with the second replica {} ms after the start",
        asked.elapsed().as_millis()
    );
}

#[actix_rt::test]
async fn an_agent_with_a_foreign_ca_certificate_is_refused() {
    let ca = new_ca();
    let foreign = new_ca();
    let mut region = fake_region(&ca);
    // Certificate from another CA, trusting the region's CA.
    let agent = start_agent(&foreign, &ca.pem, &[region.addr], 1, 16_384);
    let got = tokio::time::timeout(Duration::from_secs(2), region.registered.recv()).await;
    assert!(got.is_err(), "a foreign-CA agent registered");
    assert!(
        region.refused.load(Ordering::SeqCst) > 0,
        "the region saw no refused handshake"
    );
    // The agent itself is still up.
    let ingress = agent.ingress;
    let (s, _) = tokio::task::spawn_blocking(move || post(ingress, "/v1/invoke/acme/x", TOKEN, ""))
        .await
        .unwrap();
    assert_eq!(s, 401, "no tokens yet: unauthorized");
}

#[actix_rt::test]
async fn garbage_or_oversized_frames_close_the_link_and_the_agent_carries_on() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let agent = start_agent(&ca, &ca.pem, &[region.addr], 1, 16_384);
    let conn = next_registration(&mut region).await;
    assign(&conn, &[spec("echo", Tier::Guaranteed, 1024, 0)]).await;
    wait_until_served(agent.ingress, "echo").await;
    for bad in [vec![0xff, 0xff, 0xff, 0xff], vec![0, 0, 0, 3, 9, 9, 9]] {
        let conn = if bad[0] == 0xff {
            conn.clone()
        } else {
            next_registration(&mut region).await
        };
        let mut send = conn.open_uni().await.unwrap();
        send.write_all(&bad).await.unwrap();
        send.finish().unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(5), conn.closed())
            .await
            .expect("the agent closes the connection");
        assert!(
            matches!(reason, quinn::ConnectionError::ApplicationClosed(ref c) if c.error_code == 0x10u32.into()),
            "{reason:?}"
        );
        assert_eq!(invoke(agent.ingress, "echo").await.0, 200);
    }
    // It reconnects and registers again.
    let _ = next_registration(&mut region).await;
}

#[actix_rt::test]
async fn oversubscribed_functions_beyond_gpu_memory_all_serve_with_swaps() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    // 2 GPUs of 16 GiB; 8 oversubscribed functions of 6 GiB = 48 GiB.
    let agent = start_agent(&ca, &ca.pem, &[region.addr], 2, 16_384);
    let conn = next_registration(&mut region).await;
    let specs: Vec<_> = (0..8)
        .map(|i| spec(&format!("f{i}"), Tier::Oversubscribed, 6_144, 1_000))
        .collect();
    assign(&conn, &specs).await;
    wait_until_served(agent.ingress, "f0").await;
    for round in 0..3 {
        for s in &specs {
            let (status, body) = invoke(agent.ingress, &s.name).await;
            assert_eq!(status, 200, "round {round} {}: {body}", s.name);
        }
    }
    let st = agent.addr.send(StatusQuery).await.unwrap();
    assert!(st.swap_ins + st.moves > 0, "{st:?}");
    assert!(st.swap_outs > 0, "{st:?}");
    assert_eq!(st.accounting_errors, 0, "{st:?}");
    let resident_mib: u64 = st.gpus.iter().map(|g| g.memory_used_mib).sum();
    assert!(resident_mib <= 2 * 16_384, "{st:?}");
    // The swaps reach the region (reported after the next heartbeat).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let at_region = loop {
        let list = region.reports.list();
        let r = list.first().map(|a| (a.swaps, a.heartbeat.is_some()));
        if let Some((swaps, true)) = r {
            if swaps.swap_in + swaps.moves >= st.swap_ins + st.moves
                && swaps.swap_out >= st.swap_outs
            {
                break swaps;
            }
        }
        assert!(std::time::Instant::now() < deadline, "region saw {list:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        region.reports.list()[0]
            .heartbeat
            .as_ref()
            .map(|h| h.gpus.len()),
        Some(2)
    );
    // The per-function loads reach it too: summed over every report (each
    // counts since the previous one), exactly what happened.
    let per_function = |name: &str| {
        let all = region.loads.lock().unwrap().clone();
        let mine: Vec<_> = all.into_iter().filter(|l| l.function == name).collect();
        let sum =
            |f: fn(&gshare_core::protocol::FunctionLoad) -> u64| mine.iter().map(f).sum::<u64>();
        (
            sum(|l| l.arrivals),
            sum(|l| l.swaps),
            sum(|l| l.deadline_misses + l.early_rejects),
            mine.last().map(|l| (l.in_flight, l.waiting, l.idle_ms)),
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let swaps: u64 = specs.iter().map(|s| per_function(&s.name).1).sum();
        let arrivals: Vec<u64> = specs[1..].iter().map(|s| per_function(&s.name).0).collect();
        // A report taken while the last request still ran says so: wait
        // for one after it.
        let quiet = specs.iter().all(|s| {
            per_function(&s.name)
                .3
                .is_some_and(|(in_flight, waiting, _)| in_flight == 0 && waiting == 0)
        });
        if quiet && swaps >= st.swap_ins + st.moves && arrivals.iter().all(|&a| a >= 3) {
            assert_eq!(swaps, st.swap_ins + st.moves);
            assert_eq!(arrivals, vec![3; specs.len() - 1]);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "loads at the region: swaps {swaps} of {}, arrivals {arrivals:?}",
            st.swap_ins + st.moves
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for s in &specs[1..] {
        let (_, _, missed, last) = per_function(&s.name);
        assert_eq!(missed, 0, "{}: every request was served", s.name);
        let (_, _, idle_ms) = last.expect("reported");
        assert!(idle_ms < 60_000, "{}: invoked, idle {idle_ms} ms", s.name);
    }
    println!(
        "oversubscription: 8 x 6 GiB on 2 x 16 GiB: served={} swap_ins={} swap_outs={} cold_starts={} moves={} at the region: {at_region:?}",
        st.served, st.swap_ins, st.swap_outs, st.cold_starts, st.moves
    );
}

fn write_agent_files(dir: &std::path::Path, ca: &Ca, region: SocketAddr) -> SocketAddr {
    let (cert, key) = issue(ca, "n1");
    std::fs::write(dir.join("ca.pem"), &ca.pem).unwrap();
    std::fs::write(dir.join("n1.pem"), cert).unwrap();
    std::fs::write(dir.join("n1.key"), key).unwrap();
    let ingress = free_port();
    std::fs::write(
        dir.join("agent.toml"),
        format!(
            r#"node = "n1"
pool = "center"
pool_kind = "center"
data_dir = "data"
ingress_addr = "{ingress}"
host_swap_mib = 65536
heartbeat_ms = 100
[gpus]
backend = "nvml"
nvml_fallback = "simulated"
[[gpus.simulated]]
model = "sim"
memory_mib = 16384
h2d_mib_per_s = 600000
count = 1
[load]
cold_setup_us = 20000
[[replicas]]
quic_addr = "{region}"
[tls]
ca_cert = "ca.pem"
cert = "n1.pem"
key = "n1.key"
"#
        ),
    )
    .unwrap();
    ingress
}

/// The binary as a process: registers over QUIC, serves, and on SIGTERM
/// answers every invocation it had accepted before it exits 0.
#[actix_rt::test]
async fn agent_process_drains_accepted_invocations_on_sigterm() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let dir = tempfile::tempdir().unwrap();
    let ingress = write_agent_files(dir.path(), &ca, region.addr);
    let child = Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(dir.path().join("agent.toml"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let conn = next_registration(&mut region).await;
    // 0.5 s per request, two at a time on the GPU (saturation 500 milli).
    assign(&conn, &[spec("slow", Tier::Guaranteed, 1024, 500_000)]).await;
    wait_until_served(ingress, "slow").await;
    let calls: Vec<_> = (0..6)
        .map(|_| {
            tokio::task::spawn_blocking(move || post(ingress, "/v1/invoke/acme/slow", TOKEN, ""))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    for c in calls {
        let (status, body) = c.await.unwrap();
        assert_eq!(status, 200, "an accepted invocation was not served: {body}");
    }
    let exit = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let log = String::from_utf8_lossy(&exit.stderr);
    assert!(exit.status.success(), "exit {:?}: {log}", exit.status);
    assert!(log.contains("shutting down"), "{log}");
    // No NVIDIA driver here: the fallback took the simulated GPU (with a
    // driver, NVML's GPUs are used and there is no warning).
    if !log.contains("NVML unavailable") {
        eprintln!("NVML present: ran on real GPUs");
    }
}

#[test]
fn agent_process_refuses_a_bad_config_listing_every_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(
        &path,
        "node = \"n 1\"\npool = \"p\"\npool_kind = \"centre\"\nfoo = 1\n",
    )
    .unwrap();
    let out = Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for needle in [
        "node:",
        "pool_kind:",
        "foo: unknown key",
        "gpus: missing required key",
    ] {
        assert!(err.contains(needle), "{needle:?} missing in {err}");
    }
}

/// Token digests padded so that their frame is `payload` bytes long.
fn tokens_of_frame_size(payload: usize) -> RegionMessage {
    let with_pad = |n: usize| {
        RegionMessage::v1(RegionMessageV1::Tokens(TokenDigests {
            applied_index: 2,
            tenants: vec![
                TenantTokens {
                    tenant: TenantId("acme".into()),
                    digests: vec![token_digest(TOKEN)],
                },
                TenantTokens {
                    tenant: TenantId("padding".into()),
                    digests: vec!["0".repeat(n)],
                },
            ],
        }))
    };
    let probe = payload - 1024;
    let overhead = gshare_core::protocol::encode_frame(&with_pad(probe))
        .unwrap()
        .len()
        - 4
        - probe;
    with_pad(payload - overhead)
}

#[actix_rt::test]
async fn a_push_at_the_agent_wire_limit_is_accepted_and_one_byte_more_is_never_sent() {
    use gshare_core::protocol::{FrameError, AGENT_FRAME_BYTES};
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let agent = start_agent(&ca, &ca.pem, &[region.addr], 1, 16_384);
    let conn = next_registration(&mut region).await;
    push(
        &conn,
        RegionMessageV1::Assignment(Assignment {
            applied_index: 1,
            instances: vec![AssignedInstance {
                instance: InstanceId(1),
                spec: spec("echo", Tier::Guaranteed, 1024, 1_000),
                version: 1,
                slices: vec![Slice {
                    gpu: GpuId {
                        node: NodeId("n1".into()),
                        index: 0,
                    },
                    compute_milli: 500,
                    memory_mib: 1024,
                }],
            }],
        }),
    )
    .await;
    // No tokens yet: refused.
    assert_eq!(invoke(agent.ingress, "echo").await.0, 401);

    // The region's agent-wire writer (the one `gshare-region` uses) at
    // exactly the limit: the agent takes it.
    let at_limit = tokens_of_frame_size(AGENT_FRAME_BYTES);
    assert_eq!(
        gshare_core::protocol::encode_frame(&at_limit)
            .unwrap()
            .len(),
        4 + AGENT_FRAME_BYTES
    );
    let mut send = conn.open_uni().await.unwrap();
    gshare_core::net::write_frame(&mut send, &at_limit)
        .await
        .unwrap();
    wait_until_served(agent.ingress, "echo").await;

    // One byte more is refused by the writer, before anything is sent,
    // and the connection stays up.
    let mut send = conn.open_uni().await.unwrap();
    match gshare_core::net::write_frame(&mut send, &tokens_of_frame_size(AGENT_FRAME_BYTES + 1))
        .await
    {
        Err(gshare_core::net::WireError::Frame(FrameError::Oversized { len, limit })) => {
            assert_eq!((len, limit), (AGENT_FRAME_BYTES + 1, AGENT_FRAME_BYTES));
        }
        other => panic!("expected Oversized, got {other:?}"),
    }
    assert_eq!(invoke(agent.ingress, "echo").await.0, 200);
    assert!(conn.close_reason().is_none());
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = match TcpStream::connect(addr) {
        Ok(s) => s,
        Err(_) => return (0, String::new()),
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// A taken ingress port is a plain start-up error (exit 1, the address
/// named), never a panic.
#[test]
fn agent_process_with_its_ingress_port_taken_exits_with_an_error_not_a_panic() {
    let ca = new_ca();
    let dir = tempfile::tempdir().unwrap();
    let ingress = write_agent_files(dir.path(), &ca, "127.0.0.1:9".parse().unwrap());
    let _taken = std::net::TcpListener::bind(ingress).unwrap();
    let out = Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(dir.path().join("agent.toml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("binding ingress_addr {ingress}")),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A certificate file that does not exist fails the config check, at its
/// key and line, saying which `gsharectl certs` command makes it.
#[test]
fn agent_process_refuses_missing_certificate_files_at_their_keys() {
    let ca = new_ca();
    let dir = tempfile::tempdir().unwrap();
    write_agent_files(dir.path(), &ca, "127.0.0.1:9".parse().unwrap());
    std::fs::remove_file(dir.path().join("n1.pem")).unwrap();
    std::fs::remove_file(dir.path().join("ca.pem")).unwrap();
    let path = dir.path().join("agent.toml");
    let out = Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let file = path.display().to_string();
    assert!(
        err.contains(&format!("{file}:21:11: tls.ca_cert: "))
            && err.contains("gsharectl certs init"),
        "{err}"
    );
    assert!(
        err.contains(&format!("{file}:22:8: tls.cert: ")) && err.contains("gsharectl certs issue"),
        "{err}"
    );
    assert!(!err.contains("tls.key"), "{err}");
}

/// An agent whose region link fails its TLS handshake (the replica's
/// certificate is from another CA) says so on `/healthz` (503) and
/// `/metrics`, instead of `ok` while it retries.
#[actix_rt::test]
async fn an_agent_whose_link_fails_its_tls_handshake_shows_it_on_healthz_and_metrics() {
    let ca = new_ca();
    let other = new_ca();
    let region = fake_region(&other);
    let dir = tempfile::tempdir().unwrap();
    let ingress = write_agent_files(dir.path(), &ca, region.addr);
    let mut child = Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(dir.path().join("agent.toml"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut health = (0, String::new());
    for _ in 0..200 {
        health = tokio::task::spawn_blocking(move || get(ingress, "/healthz"))
            .await
            .unwrap();
        if health.0 == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = tokio::task::spawn_blocking(move || get(ingress, "/metrics"))
        .await
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(health.0, 503, "{health:?}");
    assert!(health.1.contains("TLS handshake failed"), "{health:?}");
    assert!(health.1.contains(&region.addr.to_string()), "{health:?}");
    assert!(
        metrics.1.contains("gshare_edge_region_link_tls_failing 1"),
        "{metrics:?}"
    );
}

/// Pushes an assignment with `applied_index` of `specs` (instance ids from `first`).
async fn assign_at(
    conn: &quinn::Connection,
    applied_index: u64,
    first: u64,
    specs: &[FunctionSpec],
) {
    let instances = specs
        .iter()
        .enumerate()
        .map(|(i, s)| AssignedInstance {
            instance: InstanceId(first + i as u64),
            spec: s.clone(),
            version: 1,
            slices: vec![Slice {
                gpu: GpuId {
                    node: NodeId("n1".into()),
                    index: 0,
                },
                compute_milli: 500,
                memory_mib: s.memory_mib,
            }],
        })
        .collect();
    push_assignment(conn, applied_index, instances).await;
}

async fn status_until(
    agent: &Agent,
    what: &str,
    ok: impl Fn(&gshare_edge::agent::NodeStatus) -> bool,
) -> gshare_edge::agent::NodeStatus {
    for _ in 0..300 {
        let st = agent.addr.send(StatusQuery).await.unwrap();
        if ok(&st) {
            return st;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: {:?}", agent.addr.send(StatusQuery).await.unwrap());
}

#[actix_rt::test]
async fn a_released_function_stays_parked_in_host_memory_and_resumes_with_a_swap_in() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let agent = start_agent(&ca, &ca.pem, &[region.addr], 1, 16_384);
    let conn = next_registration(&mut region).await;
    let f = spec("warm", Tier::Oversubscribed, 4_096, 1_000);
    assign(&conn, std::slice::from_ref(&f)).await;
    let started = std::time::Instant::now();
    wait_until_served(agent.ingress, "warm").await;
    let cold = started.elapsed();
    let st = agent.addr.send(StatusQuery).await.unwrap();
    assert_eq!(
        (st.cold_starts, st.swap_ins, st.parked),
        (1, 0, 0),
        "{st:?}"
    );
    // Released: nothing hosted, the weights parked; requests are refused.
    assign_at(&conn, 2, 1, &[]).await;
    let st = status_until(&agent, "parked", |s| s.functions == 0 && s.parked == 1).await;
    assert_eq!(st.gpus[0].memory_used_mib, 0, "{st:?}");
    assert_ne!(invoke(agent.ingress, "warm").await.0, 200);
    // Placed again with the same spec: the first request swaps in.
    assign_at(&conn, 3, 2, std::slice::from_ref(&f)).await;
    let started = std::time::Instant::now();
    wait_until_served(agent.ingress, "warm").await;
    let warm = started.elapsed();
    let st = agent.addr.send(StatusQuery).await.unwrap();
    assert_eq!(
        (st.cold_starts, st.swap_ins, st.parked),
        (1, 1, 0),
        "{st:?}"
    );
    // Released and placed with another spec (a deadline changed): a cold start.
    assign_at(&conn, 4, 3, &[]).await;
    status_until(&agent, "parked again", |s| s.parked == 1).await;
    let mut g = f.clone();
    g.deadline_ms = 4_000;
    assign_at(&conn, 5, 4, std::slice::from_ref(&g)).await;
    wait_until_served(agent.ingress, "warm").await;
    let st = agent.addr.send(StatusQuery).await.unwrap();
    assert_eq!(
        (st.cold_starts, st.swap_ins, st.parked),
        (2, 1, 0),
        "{st:?}"
    );
    println!("warm resume: first request after a cold start {cold:?}, after a swap-in {warm:?}");
}

/// An assignment whose instance holds two slices with no remap asked by
/// this agent (it restarted mid-move, or the reserve's answer was lost):
/// it serves on the last one, the target, and asks the region to release
/// the first, where it has no copy. Before, the source slice stayed
/// reserved for good (only a copy leaving a GPU asked for a release).
#[actix_rt::test]
async fn a_second_slice_left_by_an_interrupted_move_is_released() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let agent = start_agent(&ca, &ca.pem, &[region.addr], 2, 16_384);
    let conn = next_registration(&mut region).await;
    // Tokens first (the assignment's functions are acme's).
    assign(&conn, &[]).await;
    let f = spec("moving", Tier::Oversubscribed, 2_048, 1_000);
    let slice = |index| Slice {
        gpu: GpuId {
            node: NodeId("n1".into()),
            index,
        },
        compute_milli: 500,
        memory_mib: f.memory_mib,
    };
    push(
        &conn,
        RegionMessageV1::Assignment(Assignment {
            applied_index: 2,
            instances: vec![AssignedInstance {
                instance: InstanceId(1),
                spec: f.clone(),
                version: 1,
                slices: vec![slice(0), slice(1)],
            }],
        }),
    )
    .await;
    wait_until_served(agent.ingress, "moving").await;
    let source = (InstanceId(1), slice(0).gpu);
    let mut released = Vec::new();
    for _ in 0..200 {
        released = region
            .slice_releases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if released.contains(&source) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(released, vec![source], "the slices released");
    // It serves on the target GPU only.
    let st = agent.addr.send(StatusQuery).await.unwrap();
    assert_eq!(invoke(agent.ingress, "moving").await.0, 200, "{st:?}");
}

/// Two interrupted moves of one function crossing on a GPU: instance 1
/// moves 2 → 0, instance 2 moves 0 → 1. Each releases its own source
/// (1 on GPU 2, 2 on GPU 0). Before, the release for GPU 0 went to the
/// first instance with two slices there, instance 1, whose target that is.
#[actix_rt::test]
async fn crossing_interrupted_moves_release_each_instances_own_source() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let agent = start_agent(&ca, &ca.pem, &[region.addr], 3, 16_384);
    let conn = next_registration(&mut region).await;
    assign(&conn, &[]).await;
    let f = spec("moving", Tier::Oversubscribed, 2_048, 1_000);
    let slice = |index| on_n1(index, f.memory_mib);
    let instance = |id, slices| assigned(id, &f, slices);
    push_assignment(
        &conn,
        2,
        vec![
            instance(1, vec![slice(2), slice(0)]),
            instance(2, vec![slice(0), slice(1)]),
        ],
    )
    .await;
    wait_until_served(agent.ingress, "moving").await;
    let mut expected = vec![(InstanceId(1), slice(2).gpu), (InstanceId(2), slice(0).gpu)];
    expected.sort();
    let released = releases_once(&region, expected.len()).await;
    assert_eq!(released, expected, "the slices released");
}

/// A move's source slice on a GPU where the function stays pinned for
/// another of its instances, with a copy loaded there: released at once
/// (the copy never leaves, so the executor never asks). Before, it waited
/// for the executor's release, for good.
#[actix_rt::test]
async fn a_source_on_a_gpu_still_pinned_for_another_instance_is_released() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let agent = start_agent(&ca, &ca.pem, &[region.addr], 2, 16_384);
    let conn = next_registration(&mut region).await;
    assign(&conn, &[]).await;
    let f = spec("pinned", Tier::Oversubscribed, 2_048, 1_000);
    let slice = |index| on_n1(index, f.memory_mib);
    let instance = |id, slices| assigned(id, &f, slices);
    // A copy on GPU 0 first.
    push_assignment(&conn, 2, vec![instance(1, vec![slice(0)])]).await;
    wait_until_served(agent.ingress, "pinned").await;
    // Then a second instance moving 0 → 1, its reserve's answer lost.
    push_assignment(
        &conn,
        3,
        vec![
            instance(1, vec![slice(0)]),
            instance(2, vec![slice(0), slice(1)]),
        ],
    )
    .await;
    let source = (InstanceId(2), slice(0).gpu);
    let released = releases_once(&region, 1).await;
    assert_eq!(released, vec![source], "the slices released");
}

/// The slice releases `region` got, sorted, once there are at least `n`
/// (or after 5 s), read again 200 ms later: a release asked twice, or one
/// more arriving late, is in the answer.
async fn releases_once(region: &FakeRegion, n: usize) -> Vec<(InstanceId, GpuId)> {
    let read = || {
        let mut r = region
            .slice_releases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        r.sort();
        r
    };
    for _ in 0..200 {
        if read().len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    read()
}

/// A slice of GPU `index` of node `n1` (500 milli).
fn on_n1(index: u32, memory_mib: u64) -> Slice {
    Slice {
        gpu: GpuId {
            node: NodeId("n1".into()),
            index,
        },
        compute_milli: 500,
        memory_mib,
    }
}

/// Instance `id` of `spec` (version 1) holding `slices`.
fn assigned(id: u64, spec: &FunctionSpec, slices: Vec<Slice>) -> AssignedInstance {
    AssignedInstance {
        instance: InstanceId(id),
        spec: spec.clone(),
        version: 1,
        slices,
    }
}

/// Pushes an assignment of `instances` with `applied_index`.
async fn push_assignment(
    conn: &quinn::Connection,
    applied_index: u64,
    instances: Vec<AssignedInstance>,
) {
    push(
        conn,
        RegionMessageV1::Assignment(Assignment {
            applied_index,
            instances,
        }),
    )
    .await;
}
