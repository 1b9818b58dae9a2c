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
//! `writes_per_sec=<N> p50_ms=<x> p99_ms=<y>` for the three replicas. Each
//! run's line also says the CPU this process used over the measured
//! seconds (`cpu_cores`, replicas and clients together, from
//! `/proc/self/stat`) and that CPU per acknowledged write
//! (`cpu_us_per_write`): on a machine whose cores are all busy, the rate is
//! the cores over that CPU per write.
//!
//! `--placements` measures function deploys instead: a synthetic topology of
//! `--nodes` nodes (default 1,000) × 8 GPUs (80 GiB) and one tenant with a
//! large quota are loaded first; then every request is a separate
//! `POST /v1/functions` (a new function, `min_instances = 1`, of one of four
//! shapes in turn: 2 GiB/100 guaranteed, 4 GiB/250 burstable, 8 GiB/500
//! guaranteed, 20 GiB/300 oversubscribed) that returns once the function is
//! deployed and its instance is placed: the leader's scheduler
//! (`gshare_region::scheduler`) plans it (core's planner, through the index
//! over free capacity) with the other deploys queued meanwhile, proposes
//! the batch and answers once it is applied (re-checked). After every
//! `--delete-every` deploys (default 4) a client deletes its oldest
//! function (`DELETE`, not timed). At the end the acknowledged deploys and deletes are replayed,
//! in acknowledgement order, on a fresh state with the kept full-scan
//! planner (same ranking), and the GPUs in use are compared. The last line
//! is `placements_per_sec=<N> p50_ms=<x> p99_ms=<y> gpus_used=<G>
//! gpus_used_full_scan=<F>` for the three replicas.

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
    /// With `--placements`: nodes of the synthetic topology (8 GPUs each).
    #[arg(long, default_value_t = 1_000)]
    nodes: usize,
    /// With `--placements`: a client deletes its oldest function after
    /// every this many deploys (0: never).
    #[arg(long, default_value_t = 4)]
    delete_every: u64,
    /// With `--placements`: the synthetic topology's `[placement] policy`
    /// (bestfit, fgd, gshare).
    #[arg(long, default_value_t = gshare_core::model::RegionPolicy::Gshare)]
    policy: gshare_core::model::RegionPolicy,
}

/// The deploys' shapes, in turn: (memory MiB, compute milli, tier).
const SHAPES: [(u64, u32, &str); 4] = [
    (2_048, 100, "guaranteed"),
    (4_096, 250, "burstable"),
    (8_192, 500, "guaranteed"),
    (20_480, 300, "oversubscribed"),
];

/// The body of the `i`-th deploy of a client.
fn deploy_body(name: &str, i: u64) -> String {
    let (m, c, tier) = SHAPES[(i % SHAPES.len() as u64) as usize];
    format!(
        "{{\"name\":\"{name}\",\"runtime\":\"pytorch\",\"memory_mib\":{m},\
         \"compute_milli\":{c},\"tier\":\"{tier}\",\"deadline_ms\":100}}"
    )
}

/// What a client saw acknowledged, in acknowledgement order.
#[derive(Debug, Clone)]
enum Event {
    /// A deploy: its body.
    Create(String),
    /// A delete of this function.
    Delete(String),
}

type Events = std::sync::Arc<std::sync::Mutex<Vec<Event>>>;

/// The bench tenant's quota (the same in the region and the replay).
fn bench_quota() -> gshare_core::model::Quota {
    gshare_core::model::Quota {
        compute_milli: gshare_core::bounds::MAX_QUOTA,
        memory_mib: gshare_core::bounds::MAX_QUOTA,
        instances: u32::MAX / 2,
    }
}

/// GPUs with at least one instance.
fn gpus_used(state: &gshare_core::state::RegionState) -> usize {
    state
        .node_loads()
        .iter()
        .flat_map(|n| &n.gpus)
        .filter(|g| g.load.instances > 0)
        .count()
}

/// Replays `events` on a fresh state of `nodes` nodes with the full-scan
/// planner and the region's ranking (its shapes rebuilt every 1,000
/// events, as the leader rebuilds it every second); returns the GPUs in
/// use at the end and the deploys that found no place.
fn replay_full_scan(
    nodes: usize,
    policy: gshare_core::model::RegionPolicy,
    events: &[Event],
) -> anyhow::Result<(usize, usize)> {
    use gshare_core::model::{PoolKind, TenantId};
    use gshare_core::state::{
        plan_spec_explained, DomainCommand, PlanOptions, RegionRanking, RegionState,
    };
    use gshare_region::api::functions::FunctionBody;
    let topology =
        gshare_core::config::Topology::from_toml("synthetic", &synthetic_topology(nodes, policy))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    let tenant = TenantId("bench".into());
    let mut s = RegionState::default();
    let setup = [
        DomainCommand::TopologyLoad { topology },
        DomainCommand::TenantCreate {
            tenant: tenant.clone(),
            display_name: None,
            quotas: [(PoolKind::Center, bench_quota())].into_iter().collect(),
        },
    ];
    for c in setup {
        s.apply(c, 0).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let mut ranking = RegionRanking::from_state(&s);
    let mut unplaced = 0;
    for (i, e) in events.iter().enumerate() {
        if i % 1_000 == 0 {
            ranking = RegionRanking::from_state(&s);
        }
        match e {
            Event::Create(body) => {
                let spec = serde_json::from_str::<FunctionBody>(body)?
                    .into_spec(tenant.clone())
                    .map_err(|e| anyhow::anyhow!("{}: {}", e.code, e.message))?;
                match plan_spec_explained(&s, &spec, &ranking, &PlanOptions::default()) {
                    Ok((p, _)) => {
                        let cmd = DomainCommand::FunctionCreate {
                            spec,
                            placements: vec![p.slices],
                        };
                        s.apply(cmd, 1)
                            .map_err(|e| anyhow::anyhow!("replay: {e}"))?;
                    }
                    Err(_) => unplaced += 1,
                }
            }
            Event::Delete(name) => {
                let cmd = DomainCommand::FunctionDelete {
                    tenant: tenant.clone(),
                    name: name.clone(),
                };
                // A delete of a deploy the replay could not place: nothing to do.
                let _ = s.apply(cmd, 1);
            }
        }
    }
    Ok((gpus_used(&s), unplaced))
}

/// A client connection, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

const TENANT_TOKEN: &str = "bench-tenant-token";

/// A topology of `nodes` nodes × 8 GPUs of 80 GiB in one center pool.
fn synthetic_topology(nodes: usize, policy: gshare_core::model::RegionPolicy) -> String {
    let mut t = format!("[placement]\npolicy = \"{policy}\"\n\n");
    t.push_str(
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
async fn load_domain(
    r: &Running,
    nodes: usize,
    policy: gshare_core::model::RegionPolicy,
) -> anyhow::Result<()> {
    use gshare_core::command::{CommandOutcome, RegionCommand};
    use gshare_core::model::{PoolKind, TenantId};
    use gshare_core::state::DomainCommand;
    let topology =
        gshare_core::config::Topology::from_toml("synthetic", &synthetic_topology(nodes, policy))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    let tenant = TenantId("bench".into());
    let quota = bench_quota();
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
    /// CPU this process used over the measured seconds (replicas and
    /// clients together), in cores; `None` where `/proc` cannot tell.
    cores: Option<f64>,
}

impl Figures {
    /// CPU microseconds this process spent per acknowledged write (the
    /// replicas, the clients and, with `--placements`, the untimed deletes).
    fn cpu_us_per_write(&self) -> Option<f64> {
        self.cores.map(|c| c * 1e6 / self.writes_per_sec.max(1e-9))
    }

    /// `cores=<c> cpu_us_per_write=<u>`, or nothing where unknown.
    fn cpu(&self) -> String {
        match (self.cores, self.cpu_us_per_write()) {
            (Some(c), Some(u)) => format!(" cpu_cores={c:.2} cpu_us_per_write={u:.0}"),
            _ => String::new(),
        }
    }
}

/// CPU time this process has used (user plus system), from
/// `/proc/self/stat` (in its clock ticks, 100 per second on Linux).
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces): state is
    // field 3, utime 14, stime 15.
    let rest = stat.get(stat.rfind(')')?.checked_add(1)?..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f
        .get(11)?
        .parse::<u64>()
        .ok()?
        .checked_add(f.get(12)?.parse::<u64>().ok()?)?;
    Some(Duration::from_millis(ticks.checked_mul(10)?))
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
        // A replica's certificate names it `r<id>` (the peer port takes no
        // other); the runs of every size share them.
        let name = format!("r{id}");
        let (cert, key) = match tls::issue(&certs, &name, &tls::default_sans(&name)) {
            Err(tls::TlsError::CertExists(_)) => (
                certs.join(format!("{name}.pem")),
                certs.join(format!("{name}.key")),
            ),
            other => other?,
        };
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
            autoscale: gshare_core::autoscale::Params::default(),
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
                body_limits: Default::default(),
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
    request(conn, "POST", path, token, body).await
}

/// One keep-alive HTTP/1.1 request; returns the status code.
async fn request<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut BufStream<S>,
    method: &str,
    path: &str,
    token: &str,
    body: &str,
) -> anyhow::Result<u16> {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
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
    events: &Events,
) -> anyhow::Result<Figures> {
    let warmup = Duration::from_secs(1);
    let measure = Duration::from_secs(args.seconds);
    let begin = Instant::now();
    let (from, until) = (begin + warmup, begin + warmup + measure);
    let value = "x".repeat(args.value_bytes);
    // The process's CPU over the measured seconds.
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(from.into()).await;
        let a = process_cpu();
        tokio::time::sleep_until(until.into()).await;
        let b = process_cpu();
        a.zip(b).and_then(|(a, b)| b.checked_sub(a))
    });
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let value = value.clone();
        let label = label.to_string();
        let target = targets[c % targets.len()];
        let placements = args.placements;
        let delete_every = args.delete_every;
        let client_tls = client_tls.clone();
        let events = events.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            let tcp = tokio::net::TcpStream::connect(target).await?;
            tcp.set_nodelay(true)?;
            let stream: Box<dyn Io> = match client_tls {
                None => Box::new(tcp),
                Some(c) => {
                    let name = rustls::pki_types::ServerName::IpAddress(target.ip().into());
                    Box::new(
                        tokio_rustls::TlsConnector::from(c)
                            .connect(name, tcp)
                            .await?,
                    )
                }
            };
            let mut conn = BufStream::new(stream);
            let mut seq = 0u64;
            let mut live = std::collections::VecDeque::new();
            loop {
                let sent = Instant::now();
                if sent >= until {
                    break;
                }
                let name = format!("{label}-c{c}-{seq}");
                let (path, token, body, ok) = if placements {
                    ("/v1/functions", TENANT_TOKEN, deploy_body(&name, seq), 201)
                } else {
                    let body = format!("{{\"name\":\"{name}\",\"display_name\":\"{value}\"}}");
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
                if placements && status == ok {
                    events
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(Event::Create(body));
                    live.push_back(name);
                    if delete_every > 0 && seq % delete_every == 0 {
                        if let Some(old) = live.pop_front() {
                            let path = format!("/v1/functions/{old}");
                            if request(&mut conn, "DELETE", &path, TENANT_TOKEN, "").await? == 200 {
                                events
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .push(Event::Delete(old));
                            }
                        }
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
    let cores = cpu
        .await
        .ok()
        .flatten()
        .map(|used| used.as_secs_f64() / measure.as_secs_f64());
    Ok(Figures {
        writes_per_sec: all.len() as f64 / measure.as_secs_f64(),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        errors,
        cores,
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
            let to = if args.spread { "spread over every replica" } else { "to the leader" };
            (format!(
                "function deploys placing 1 instance each (POST /v1/functions, 4 shapes, a delete after every {} (0: none)) on {} nodes x 8 GPUs, {to}",
                args.delete_every, args.nodes
            ), "placements_per_sec")
        } else {
            ("domain writes (HTTP POST /v1/tenants, one new tenant each) to the leader".to_string(), "writes_per_sec")
        };
        println!(
            "region-bench: {} clients, {} s measured after 1 s warm-up, {what}",
            args.clients, args.seconds
        );
        let mut figures = Vec::new();
        let mut packing = (0usize, 0usize);
        for n in [1u64, 3] {
            let running = start_region(dir.path(), n, false).await?;
            let targets = if args.placements {
                load_domain(&running, args.nodes, args.policy).await?;
                if args.spread {
                    running.https.clone()
                } else {
                    vec![running.leader_http]
                }
            } else {
                vec![running.leader_http]
            };
            let events: Events = Default::default();
            let f = drive(&targets, running.client_tls.clone(), &args, &format!("r{n}"), &events).await?;
            if args.placements {
                // Every replica applies what was acknowledged; give the last entries a moment.
                tokio::time::sleep(Duration::from_millis(500)).await;
                let used = {
                    let st = running.replicas[0].state.read();
                    let d = st.region.domain();
                    d.check_invariants().map_err(|e| anyhow::anyhow!("invariants: {e}"))?;
                    println!("  {n} replica(s): {} instances placed at the end, invariants hold", d.instances().count());
                    gpus_used(d)
                };
                if n == 3 {
                    let events = std::mem::take(&mut *events.lock().unwrap_or_else(|p| p.into_inner()));
                    let (nodes, policy) = (args.nodes, args.policy);
                    let t0 = Instant::now();
                    let (full, unplaced) = tokio::task::spawn_blocking(move || {
                        replay_full_scan(nodes, policy, &events)
                    })
                    .await??;
                    println!(
                        "  full-scan replay of the acknowledged deploys and deletes: {full} GPUs in use ({unplaced} unplaced), {:.1} s",
                        t0.elapsed().as_secs_f64()
                    );
                    packing = (used, full);
                }
            }
            stop_region(running).await;
            let label = if n == 1 { "baseline (1 replica, no peers)" } else { "region (3 replicas, QUIC+mTLS)" };
            println!(
                "{label}: {unit}={:.0} p50_ms={:.2} p99_ms={:.2} errors={}{}",
                f.writes_per_sec, f.p50_ms, f.p99_ms, f.errors, f.cpu()
            );
            figures.push(f);
        }
        if args.https {
            let tls_dir = tempfile::tempdir()?;
            let running = start_region(tls_dir.path(), 3, true).await?;
            let targets = if args.placements {
                load_domain(&running, args.nodes, args.policy).await?;
                if args.spread {
                    running.https.clone()
                } else {
                    vec![running.leader_http]
                }
            } else {
                vec![running.leader_http]
            };
            let f = drive(&targets, running.client_tls.clone(), &args, "tls", &Default::default()).await?;
            stop_region(running).await;
            let plain = &figures[1];
            println!(
                "region (3 replicas, API over HTTPS): {unit}={:.0} p50_ms={:.2} p99_ms={:.2} errors={}{}",
                f.writes_per_sec, f.p50_ms, f.p99_ms, f.errors, f.cpu()
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
        if let (Some(b), Some(r)) = (base.cpu_us_per_write(), region.cpu_us_per_write()) {
            println!("ratio 3 replicas / 1 replica: CPU per write {:.2}x", r / b.max(1e-9));
        }
        if args.placements {
            println!(
                "{unit}={:.0} p50_ms={:.2} p99_ms={:.2} gpus_used={} gpus_used_full_scan={}",
                region.writes_per_sec, region.p50_ms, region.p99_ms, packing.0, packing.1
            );
        } else {
            println!(
                "{unit}={:.0} p50_ms={:.2} p99_ms={:.2}",
                region.writes_per_sec, region.p50_ms, region.p99_ms
            );
        }
        anyhow::Ok(())
    })
}
