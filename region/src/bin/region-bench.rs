//! `region-bench`: committed writes per second through a replica's HTTP API.
//!
//! With no arguments it runs, in this process, on loopback:
//! 1. a baseline: one replica alone (its own sled log, no peers);
//! 2. the measured region: three replicas (sled, Raft over QUIC + mTLS).
//!
//! The same load runs against the leader of each: `--clients` concurrent
//! clients, each on its own keep-alive HTTP connection, each write a separate
//! domain write, `POST /v1/tenants` (a new tenant whose display name is a
//! `--value-bytes` value), that returns once the write is committed and
//! applied (the leader batches concurrent proposals into Raft entries).
//! Latency is from send to the acknowledgement. The last stdout line is
//! `writes_per_sec=<N> p50_ms=<x> p99_ms=<y>` for the three replicas.
//!
//! `--placements` measures function deploys instead: a synthetic topology of
//! 1,000 nodes × 8 GPUs (80 GiB) and one tenant with a large quota are loaded
//! first; then every request is a separate `POST /v1/functions` (a new
//! function, `min_instances = 1`) that returns once the function is deployed
//! and its instance is placed: the leader's scheduler (`gshare_region::scheduler`)
//! plans it (core's planner, limited scan) with the other deploys queued
//! meanwhile, proposes the batch and answers once it is applied
//! (re-checked). The last line is
//! `placements_per_sec=<N> p50_ms=<x> p99_ms=<y>`.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use gshare_region::http::{self, HttpContext};
use gshare_region::replica::{Replica, ReplicaSpec};
use gshare_region::tls::{self, TlsPaths};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufStream};

const TOKEN: &str = "bench-token";

#[derive(Debug, Parser)]
#[command(
    name = "region-bench",
    version,
    about = "Measure committed writes/s of a 3-replica region against 1 replica"
)]
struct Args {
    /// Concurrent clients (one HTTP connection each).
    #[arg(long, default_value_t = 256)]
    clients: usize,
    /// Seconds measured per run (after a 1 s warm-up).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Bytes of each value (the tenant's display name, at most 256).
    #[arg(long, default_value_t = 64)]
    value_bytes: usize,
    /// Measure function deploys that each place one instance (see above).
    #[arg(long)]
    placements: bool,
    /// With `--placements`: spread the clients over every replica (followers
    /// forward each deploy to the leader's scheduler) instead of the leader.
    #[arg(long)]
    spread: bool,
    /// Also run the three replicas with their API over HTTPS and compare.
    #[arg(long)]
    https: bool,
}

/// A client connection, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

const TENANT_TOKEN: &str = "bench-tenant-token";

/// A topology of `nodes` nodes × 8 GPUs of 80 GiB in one center pool.
fn synthetic_topology(nodes: usize) -> String {
    let mut t = String::from(
        "[[gpu_models]]\nname = \"bench-80g\"\nmemory_mib = 81_920\nh2d_mib_per_s = 25_000\n\n\
         [cold_start]\nsetup_us = 500_000\nstorage_mib_per_s = 2_000\n\n[swap]\nsetup_us = 2_000\n\n\
         [[pools]]\nname = \"center\"\nkind = \"center\"\n",
    );
    for n in 0..nodes {
        t.push_str(&format!(
            "\n[[pools.nodes]]\nname = \"n{n:04}\"\ncpu_milli = 64_000\nmemory_mib = 524_288\nswap_mib = 262_144\n\
             gpus = [{{ model = \"bench-80g\", count = 8 }}]\n"
        ));
    }
    t.push_str(
        "\n[pricing]\ncurrency = \"USD\"\nunit = \"micro-USD\"\nunits_per_currency = 1_000_000\n\n\
         [pricing.tiers]\nexclusive = { discount_bp = 0 }\nguaranteed = { discount_bp = 1_500 }\n\
         burstable = { discount_bp = 3_500 }\noversubscribed = { discount_bp = 6_000 }\n\n\
         [[pricing.prices]]\ngpu_model = \"bench-80g\"\npool_kind = \"center\"\ngpu_hour = 2_000_000\nmemory_gib_hour = 10_000\n",
    );
    t
}

/// Loads the synthetic topology and a tenant with a token through the leader.
async fn load_domain(r: &Running) -> anyhow::Result<()> {
    use gshare_core::command::{CommandOutcome, RegionCommand};
    use gshare_core::model::{PoolKind, Quota, TenantId};
    use gshare_core::state::DomainCommand;
    let topology = gshare_core::config::Topology::from_toml("synthetic", &synthetic_topology(1000))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let tenant = TenantId("bench".into());
    let quota = Quota {
        compute_milli: gshare_core::bounds::MAX_QUOTA,
        memory_mib: gshare_core::bounds::MAX_QUOTA,
        instances: u32::MAX / 2,
    };
    let commands = vec![
        DomainCommand::TopologyLoad { topology },
        DomainCommand::TenantCreate {
            tenant: tenant.clone(),
            display_name: None,
            quotas: [(PoolKind::Center, quota)].into_iter().collect(),
        },
        DomainCommand::TokenIssue {
            tenant,
            token_id: "bench".into(),
            digest: gshare_core::protocol::token_digest(TENANT_TOKEN),
        },
    ];
    for c in commands {
        match r.replicas[0]
            .proposer
            .propose(RegionCommand::domain(c))
            .await
        {
            Ok(CommandOutcome::Domain(Ok(_))) => {}
            other => bail!("loading the bench domain: {other:?}"),
        }
    }
    // Every replica serves tenant tokens from its own applied state.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}

struct Figures {
    writes_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
}

fn free_addrs() -> anyhow::Result<(SocketAddr, SocketAddr)> {
    Ok((
        UdpSocket::bind("127.0.0.1:0")?.local_addr()?,
        TcpListener::bind("127.0.0.1:0")?.local_addr()?,
    ))
}

struct Running {
    replicas: Vec<Replica>,
    servers: Vec<actix_web::dev::ServerHandle>,
    leader_http: SocketAddr,
    https: Vec<SocketAddr>,
    /// The clients' TLS config when the API is HTTPS.
    client_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

async fn start_region(dir: &std::path::Path, n: u64, over_tls: bool) -> anyhow::Result<Running> {
    let certs = dir.join("certs");
    if !certs.join("ca.pem").exists() {
        tls::init_ca(&certs)?;
    }
    let mut replicas = Vec::new();
    let mut servers = Vec::new();
    let mut https = BTreeMap::new();
    for id in 1..=n {
        let name = format!("n{n}-r{id}");
        let (cert, key) = tls::issue(&certs, &name, &tls::default_sans(&name))?;
        let (raft_addr, http_addr) = free_addrs()?;
        let spec = ReplicaSpec {
            id,
            raft_addr,
            http_addr,
            data_dir: dir.join(format!("n{n}/r{id}")),
            tls: TlsPaths {
                ca_cert: certs.join("ca.pem"),
                cert,
                key,
            },
            snapshot_every: gshare_region::config::DEFAULT_SNAPSHOT_EVERY,
            keep_logs: gshare_region::config::DEFAULT_KEEP_LOGS,
            // No agents run in the benchmark: its nodes stay pending, and
            // take placements for the whole run.
            liveness: gshare_core::state::LivenessRules {
                join_grace_ms: u64::MAX,
                ..Default::default()
            },
        };
        let server_tls = if over_tls {
            Some(tls::http_server_config(&spec.tls.cert, &spec.tls.key)?)
        } else {
            None
        };
        let replica = Replica::start(&spec).await?;
        let server = http::server(
            HttpContext {
                replica: replica.clone(),
                operator_token: TOKEN.into(),
                metrics_token: None,
                api: Default::default(),
                forward_tls: None,
            },
            http_addr,
            2,
            server_tls,
        )?;
        servers.push(server.handle());
        tokio::spawn(server);
        https.insert(id, http_addr);
        replicas.push(replica);
    }
    let members = replicas.iter().map(|r| (r.id, r.node.clone())).collect();
    replicas[0].initialize(members).await?;
    let deadline = Instant::now() + Duration::from_secs(15);
    let leader = loop {
        if let Some(l) = replicas[0].raft.metrics().borrow().current_leader {
            if replicas
                .iter()
                .all(|r| r.raft.metrics().borrow().current_leader == Some(l))
            {
                break l;
            }
        }
        if Instant::now() > deadline {
            bail!("no leader within 15 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let client_tls = if over_tls {
        Some(std::sync::Arc::new(tls::http_client_config(
            &certs.join("ca.pem"),
        )?))
    } else {
        None
    };
    Ok(Running {
        replicas,
        servers,
        leader_http: https[&leader],
        https: https.values().copied().collect(),
        client_tls,
    })
}

async fn stop_region(r: Running) {
    for s in r.servers {
        s.stop(false).await;
    }
    for rep in r.replicas {
        rep.shutdown().await;
    }
}

/// One keep-alive HTTP/1.1 POST; returns the status code.
async fn post<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut BufStream<S>,
    path: &str,
    token: &str,
    body: &str,
) -> anyhow::Result<u16> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body.as_bytes()).await?;
    conn.flush().await?;
    let mut line = String::new();
    conn.read_line(&mut line).await?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("status line")?;
    let mut len = 0usize;
    loop {
        line.clear();
        if conn.read_line(&mut line).await? == 0 {
            bail!("connection closed");
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse()?;
            }
        }
    }
    let mut body = vec![0u8; len];
    conn.read_exact(&mut body).await?;
    Ok(status)
}

async fn drive(
    targets: &[SocketAddr],
    client_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    args: &Args,
    label: &str,
) -> anyhow::Result<Figures> {
    let warmup = Duration::from_secs(1);
    let measure = Duration::from_secs(args.seconds);
    let begin = Instant::now();
    let (from, until) = (begin + warmup, begin + warmup + measure);
    let value = "x".repeat(args.value_bytes);
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let value = value.clone();
        let label = label.to_string();
        let target = targets[c % targets.len()];
        let placements = args.placements;
        let client_tls = client_tls.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            let tcp = tokio::net::TcpStream::connect(target).await?;
            tcp.set_nodelay(true)?;
            let stream: Box<dyn Io> = match client_tls {
                None => Box::new(tcp),
                Some(c) => {
                    let name = rustls::pki_types::ServerName::IpAddress(target.ip().into());
                    Box::new(tokio_rustls::TlsConnector::from(c).connect(name, tcp).await?)
                }
            };
            let mut conn = BufStream::new(stream);
            let mut seq = 0u64;
            loop {
                let sent = Instant::now();
                if sent >= until {
                    break;
                }
                let (path, token, body, ok) = if placements {
                    let body = format!(
                        "{{\"name\":\"{label}-c{c}-{seq}\",\"runtime\":\"pytorch\",\"memory_mib\":512,\
                         \"compute_milli\":50,\"tier\":\"guaranteed\",\"deadline_ms\":100}}"
                    );
                    ("/v1/functions", TENANT_TOKEN, body, 201)
                } else {
                    let body = format!(
                        "{{\"name\":\"{label}-c{c}-{seq}\",\"display_name\":\"{value}\"}}"
                    );
                    ("/v1/tenants", TOKEN, body, 201)
                };
                seq += 1;
                let status = post(&mut conn, path, token, &body).await?;
                let done = Instant::now();
                if sent >= from && done <= until {
                    if status == ok {
                        lat.push(done - sent);
                    } else {
                        errors += 1;
                    }
                }
            }
            anyhow::Ok((lat, errors))
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (lat, e) = t.await??;
        all.extend(lat);
        errors += e;
    }
    all.sort();
    let pct = |p: f64| {
        if all.is_empty() {
            return 0.0;
        }
        let i = ((all.len() as f64 - 1.0) * p).round() as usize;
        all[i].as_secs_f64() * 1e3
    };
    Ok(Figures {
        writes_per_sec: all.len() as f64 / measure.as_secs_f64(),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        errors,
    })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let dir = tempfile::tempdir()?;
        let (what, unit) = if args.placements {
            (if args.spread {
                "function deploys placing 1 instance each (POST /v1/functions) on 1,000 nodes x 8 GPUs, spread over every replica"
            } else {
                "function deploys placing 1 instance each (POST /v1/functions) on 1,000 nodes x 8 GPUs, to the leader"
            }, "placements_per_sec")
        } else {
            ("domain writes (HTTP POST /v1/tenants, one new tenant each) to the leader", "writes_per_sec")
        };
        println!(
            "region-bench: {} clients, {} s measured after 1 s warm-up, {what}",
            args.clients, args.seconds
        );
        let mut figures = Vec::new();
        for n in [1u64, 3] {
            let running = start_region(dir.path(), n, false).await?;
            let targets = if args.placements {
                load_domain(&running).await?;
                if args.spread {
                    running.https.clone()
                } else {
                    vec![running.leader_http]
                }
            } else {
                vec![running.leader_http]
            };
            let f = drive(&targets, running.client_tls.clone(), &args, &format!("r{n}")).await?;
            if args.placements {
                let st = running.replicas[0].state.read();
                let d = st.region.domain();
                d.check_invariants().map_err(|e| anyhow::anyhow!("invariants: {e}"))?;
                println!("  {n} replica(s): {} instances placed in all, invariants hold", d.instances().count());
            }
            stop_region(running).await;
            let label = if n == 1 { "baseline (1 replica, no peers)" } else { "region (3 replicas, QUIC+mTLS)" };
            println!(
                "{label}: {unit}={:.0} p50_ms={:.2} p99_ms={:.2} errors={}",
                f.writes_per_sec, f.p50_ms, f.p99_ms, f.errors
            );
            figures.push(f);
        }
        if args.https {
            let tls_dir = tempfile::tempdir()?;
            let running = start_region(tls_dir.path(), 3, true).await?;
            let targets = if args.placements {
                load_domain(&running).await?;
                if args.spread {
                    running.https.clone()
                } else {
                    vec![running.leader_http]
                }
            } else {
                vec![running.leader_http]
            };
            let f = drive(&targets, running.client_tls.clone(), &args, "tls").await?;
            stop_region(running).await;
            let plain = &figures[1];
            println!(
                "region (3 replicas, API over HTTPS): {unit}={:.0} p50_ms={:.2} p99_ms={:.2} errors={}",
                f.writes_per_sec, f.p50_ms, f.p99_ms, f.errors
            );
            println!(
                "https: throughput_ratio={:.3} p99_ratio={:.3} (http {:.0}/s p99 {:.2} ms; https {:.0}/s p99 {:.2} ms)",
                f.writes_per_sec / plain.writes_per_sec.max(1e-9),
                f.p99_ms / plain.p99_ms.max(1e-9),
                plain.writes_per_sec,
                plain.p99_ms,
                f.writes_per_sec,
                f.p99_ms
            );
        }
        let (base, region) = (&figures[0], &figures[1]);
        println!(
            "ratio 3 replicas / 1 replica: throughput {:.2}x, p99 {:.2}x",
            region.writes_per_sec / base.writes_per_sec.max(1e-9),
            region.p99_ms / base.p99_ms.max(1e-9)
        );
        println!(
            "{unit}={:.0} p50_ms={:.2} p99_ms={:.2}",
            region.writes_per_sec, region.p50_ms, region.p99_ms
        );
        anyhow::Ok(())
    })
}
