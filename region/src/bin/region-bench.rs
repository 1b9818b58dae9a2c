//! `region-bench`: committed writes per second through a replica's HTTP API.
//!
//! With no arguments it runs, in this process, on loopback:
//! 1. a baseline: one replica alone (its own sled log, no peers);
//! 2. the measured region: three replicas (sled, Raft over QUIC + mTLS).
//!
//! The same load runs against the leader of each: `--clients` concurrent
//! clients, each on its own keep-alive HTTP connection, each write a separate
//! `POST /v1/kv` that returns once the write is committed and applied (the
//! leader batches concurrent proposals into Raft entries). Latency is from
//! send to the acknowledgement. The last stdout line is
//! `writes_per_sec=<N> p50_ms=<x> p99_ms=<y>` for the three replicas.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use gshare_region::http::{self, HttpContext};
use gshare_region::replica::{Replica, ReplicaSpec};
use gshare_region::tls::{self, TlsPaths};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufStream};

const TOKEN: &str = "bench-token";

#[derive(Debug, Parser)]
#[command(
    name = "region-bench",
    about = "Measure committed writes/s of a 3-replica region against 1 replica"
)]
struct Args {
    /// Concurrent clients (one HTTP connection each).
    #[arg(long, default_value_t = 256)]
    clients: usize,
    /// Seconds measured per run (after a 1 s warm-up).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Bytes of each value.
    #[arg(long, default_value_t = 64)]
    value_bytes: usize,
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
}

async fn start_region(dir: &std::path::Path, n: u64) -> anyhow::Result<Running> {
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
        };
        let replica = Replica::start(&spec).await?;
        let server = http::server(
            HttpContext {
                replica: replica.clone(),
                operator_token: TOKEN.into(),
                api: Default::default(),
            },
            http_addr,
            2,
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
    Ok(Running {
        replicas,
        servers,
        leader_http: https[&leader],
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
async fn post(conn: &mut BufStream<tokio::net::TcpStream>, body: &str) -> anyhow::Result<u16> {
    let head = format!(
        "POST /v1/kv HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
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

async fn drive(target: SocketAddr, args: &Args, label: &str) -> anyhow::Result<Figures> {
    let warmup = Duration::from_secs(1);
    let measure = Duration::from_secs(args.seconds);
    let begin = Instant::now();
    let (from, until) = (begin + warmup, begin + warmup + measure);
    let value = "x".repeat(args.value_bytes);
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let value = value.clone();
        let label = label.to_string();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            let mut conn = BufStream::new(tokio::net::TcpStream::connect(target).await?);
            conn.get_ref().set_nodelay(true)?;
            let mut seq = 0u64;
            loop {
                let sent = Instant::now();
                if sent >= until {
                    break;
                }
                let body = format!("{{\"key\":\"{label}-c{c}-{seq}\",\"value\":\"{value}\"}}");
                seq += 1;
                let status = post(&mut conn, &body).await?;
                let done = Instant::now();
                if sent >= from && done <= until {
                    if status == 200 {
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
        println!(
            "region-bench: {} clients, {} s measured after 1 s warm-up, {}-byte values, HTTP POST /v1/kv to the leader",
            args.clients, args.seconds, args.value_bytes
        );
        let one = start_region(dir.path(), 1).await?;
        let base = drive(one.leader_http, &args, "base").await?;
        stop_region(one).await;
        println!(
            "baseline (1 replica, no peers): writes_per_sec={:.0} p50_ms={:.2} p99_ms={:.2} errors={}",
            base.writes_per_sec, base.p50_ms, base.p99_ms, base.errors
        );
        let three = start_region(dir.path(), 3).await?;
        let region = drive(three.leader_http, &args, "region").await?;
        stop_region(three).await;
        println!(
            "region (3 replicas, QUIC+mTLS): writes_per_sec={:.0} p50_ms={:.2} p99_ms={:.2} errors={}",
            region.writes_per_sec, region.p50_ms, region.p99_ms, region.errors
        );
        println!(
            "ratio 3 replicas / 1 replica: throughput {:.2}x, p99 {:.2}x",
            region.writes_per_sec / base.writes_per_sec.max(1e-9),
            region.p99_ms / base.p99_ms.max(1e-9)
        );
        println!(
            "writes_per_sec={:.0} p50_ms={:.2} p99_ms={:.2}",
            region.writes_per_sec, region.p50_ms, region.p99_ms
        );
        anyhow::Ok(())
    })
}
