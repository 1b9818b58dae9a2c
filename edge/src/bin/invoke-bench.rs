//! `invoke-bench`: invocations through the agent's HTTP ingress to a `sim`
//! instance with zero service time, against the same calls on the sim
//! runtime in-process (the baseline), in one run.
//!
//! Starts everything itself: an in-process agent (NodeAgent + ingress on a
//! free loopback port, 2 simulated GPUs) fed the instance and token digest
//! the region would send. Latency: one request in flight, on one keep-alive
//! connection. Throughput: 32 keep-alive connections, one thread each.
//! Last line: `invocations_per_sec=<N> p50_added_us=<x> p99_added_us=<y>`.
//!
//! `--metering`: the ingress phases run twice in the same run, on an agent
//! without a usage journal and on one with a journal (sled, fsync per group
//! commit, in `--journal-dir` or a fresh directory under the system temp
//! dir), and the last line compares them:
//! `metering: throughput_ratio=<with/without> p99_ratio=<with/without> p99_added_us=<with − without>`.
//! With `--rounds N` (N > 1) both agents are measured N times, alternating,
//! each round with a fresh journal (under `--journal-dir`, `round-<k>`,
//! removed first), and the last line gives the medians and ranges:
//! `metering over N rounds (medians): throughput_ratio=… (range …) …`.
//! Each agent is stopped after its phases, so no earlier one runs beside
//! a later round.
//!
//! `--https-ca <ca.pem> --https-cert <c.pem> --https-key <c.key>` (files from
//! `gsharectl certs init` / `certs issue`; the certificate must be valid for
//! 127.0.0.1): the ingress phases run on a plain agent and on one serving
//! HTTPS (`[http_tls]`) in the same run, the clients on keep-alive TLS
//! connections, and the last line compares them:
//! `https: throughput_ratio=<https/http> p99_ratio=<https/http> p99_added_us=<https − http>`.

use anyhow::{bail, Context as _};
use clap::Parser;
use gshare_core::config::AgentLoadCosts;
use gshare_core::executor::RequestId;
use gshare_core::model::{
    FunctionSpec, GpuId, LatencyProfile, NodeId, PoolPreference, Runtime, Slice, TenantId, Tier,
};
use gshare_core::protocol::{AssignedInstance, Assignment, TenantTokens, TokenDigests};
use gshare_core::state::InstanceId;
use gshare_edge::agent::{ApplyAssignment, ApplyTokens, Metering, NodeAgent, NodeSetup};
use gshare_edge::gpu::GpuInfo;
use gshare_edge::ingress;
use gshare_edge::journal::UsageJournal;
use gshare_edge::runtime::{Invocation, RuntimeDriver, SimDriver};
use gshare_edge::token::token_digest;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Invocation benchmark of the node agent.
#[derive(Parser)]
#[command(name = "invoke-bench", version)]
struct Args {
    /// Seconds of the latency phase (one request in flight).
    #[arg(long, default_value_t = 3.0)]
    latency_secs: f64,
    /// Seconds of the throughput phase.
    #[arg(long, default_value_t = 3.0)]
    throughput_secs: f64,
    /// Keep-alive connections of the throughput phase.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Ingress worker threads.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Also measure an agent that journals usage, and compare.
    #[arg(long)]
    metering: bool,
    /// Where the metered agent's journal goes (default: a fresh temp dir).
    #[arg(long)]
    journal_dir: Option<std::path::PathBuf>,
    /// With `--metering`: how the journal makes an append durable, as the
    /// agent's `[metering] journal_sync`: `direct` (its log, O_DIRECT),
    /// `dsync` (its log, O_DIRECT | O_DSYNC) or `sled` (no log: sled's flush).
    #[arg(long, default_value = "direct", value_parser = ["direct", "dsync", "sled"])]
    journal_sync: String,
    /// With `--metering`: measure both agents this many times, alternating
    /// (without, with, without, …), and print each round's ratios and
    /// their medians. One round compares two phases run seconds apart, so
    /// on a shared machine one ratio says little.
    #[arg(
        long,
        default_value_t = 1,
        requires = "metering",
        conflicts_with = "https_ca",
        value_parser = clap::value_parser!(u32).range(1..=100)
    )]
    rounds: u32,
    /// Also measure the ingress over HTTPS: the CA the clients trust.
    #[arg(long, requires_all = ["https_cert", "https_key"])]
    https_ca: Option<std::path::PathBuf>,
    /// The ingress's certificate (valid for 127.0.0.1).
    #[arg(long, requires = "https_ca")]
    https_cert: Option<std::path::PathBuf>,
    /// Its key.
    #[arg(long, requires = "https_ca")]
    https_key: Option<std::path::PathBuf>,
}

/// TLS of the `--https-*` phase: the server's config and the clients'.
#[derive(Clone)]
struct Https {
    server: rustls::ServerConfig,
    client: Arc<rustls::ClientConfig>,
}

trait Io: Read + Write + Send {}
impl<T: Read + Write + Send> Io for T {}

const TOKEN: &str = "bench-token";

fn spec() -> FunctionSpec {
    FunctionSpec {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        tenant: TenantId("bench".into()),
        name: "zero".into(),
        runtime: Runtime::Custom,
        memory_mib: 1024,
        compute_milli: 100,
        tier: Tier::Guaranteed,
        deadline_ms: 10_000,
        pool: PoolPreference::Any,
        min_instances: 1,
        max_instances: 1,
        idle_timeout_s: 600,
        latency: LatencyProfile {
            full_gpu_us: 0,
            saturation_milli: 100,
        },
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Baseline: the sim runtime in-process, one call at a time.
fn baseline(secs: f64) -> (Vec<f64>, f64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut d = SimDriver::new();
        d.start(&spec(), &[]).await.expect("start");
        let mut lat = Vec::new();
        let begin = Instant::now();
        let mut n = 0u64;
        while begin.elapsed().as_secs_f64() < secs {
            let t = Instant::now();
            let body = d
                .invoke(Invocation {
                    request: RequestId(n),
                    gpu: 0,
                    compute_milli: 100,
                    service_us: 0,
                    deadline: None,
                    body: b"{}".to_vec().into(),
                    http: None,
                    stream_to: None,
                })
                .await
                .expect("sim invoke");
            std::hint::black_box(body);
            lat.push(t.elapsed().as_secs_f64() * 1e6);
            n += 1;
        }
        lat.sort_by(f64::total_cmp);
        let rate = n as f64 / begin.elapsed().as_secs_f64();
        (lat, rate)
    })
}

struct Client {
    stream: BufReader<Box<dyn Io>>,
    request: Vec<u8>,
}

impl Client {
    fn connect(addr: SocketAddr, tls: Option<&Arc<rustls::ClientConfig>>) -> anyhow::Result<Self> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let s: Box<dyn Io> = match tls {
            None => Box::new(s),
            Some(c) => {
                let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
                let conn = rustls::ClientConnection::new(c.clone(), name)?;
                Box::new(rustls::StreamOwned::new(conn, s))
            }
        };
        let body = b"{}";
        let mut request = format!(
            "POST /v1/invoke/bench/zero HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        Ok(Self {
            stream: BufReader::new(s),
            request,
        })
    }

    /// One invocation; returns the HTTP status.
    fn invoke(&mut self) -> anyhow::Result<u16> {
        self.stream.get_mut().write_all(&self.request)?;
        self.stream.get_mut().flush()?;
        let mut line = String::new();
        self.stream.read_line(&mut line)?;
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line {line:?}"))?;
        let mut len = 0usize;
        loop {
            line.clear();
            self.stream.read_line(&mut line)?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse()?;
                }
            }
        }
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body)?;
        Ok(status)
    }
}

/// An agent started by [`start_agent`], on its own thread and actix system.
struct Agent {
    addr: SocketAddr,
    server: actix_web::dev::ServerHandle,
    thread: std::thread::JoinHandle<()>,
}

impl Agent {
    /// Stops its ingress; its system ends with it, and with the system its
    /// actors and their timers (no more of its journal's writes beside the
    /// next round).
    fn stop(self) {
        // The stop is sent at once; the future only waits for it.
        drop(self.server.stop(false));
        let _ = self.thread.join();
    }
}

fn start_agent(
    workers: usize,
    journal: Option<Arc<UsageJournal>>,
    tls: Option<rustls::ServerConfig>,
) -> anyhow::Result<Agent> {
    let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = probe.local_addr()?;
    drop(probe);
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let system = actix_rt::System::new();
        system.block_on(async move {
            let node = NodeId("bench-node".into());
            let agent = NodeAgent::new(NodeSetup {
                node: node.clone(),
                gpus: (0..2)
                    .map(|index| GpuInfo {
                        index,
                        model: "sim-gpu-16g".into(),
                        memory_mib: 16_384,
                        h2d_mib_per_s: 12_000,
                    })
                    .collect(),
                host_swap_mib: 8_192,
                load: AgentLoadCosts {
                    swap_setup_us: 2_000,
                    cold_setup_us: 10_000,
                    storage_mib_per_s: 2_000,
                },
                driver: Box::new(|_| Box::new(SimDriver::new())),
                process_counters: Default::default(),
                clock: gshare_core::clock::SystemClock::shared(),
            });
            let agent = match &journal {
                Some(j) => agent.with_metering(Metering {
                    journal: j.clone(),
                    appended: Arc::default(),
                    interval: Duration::from_millis(1_000),
                    pool_kind: gshare_core::model::PoolKind::Center,
                }),
                None => agent,
            };
            let agent = actix::Actor::start(agent);
            agent.do_send(ApplyTokens(TokenDigests {
                applied_index: 1,
                tenants: vec![TenantTokens {
                    tenant: TenantId("bench".into()),
                    digests: vec![token_digest(TOKEN)],
                }],
            }));
            agent.do_send(ApplyAssignment(Assignment {
                applied_index: 1,
                instances: vec![AssignedInstance {
                    instance: InstanceId(1),
                    spec: spec(),
                    version: 1,
                    slices: vec![Slice {
                        gpu: GpuId { node, index: 0 },
                        compute_milli: 100,
                        memory_mib: 1024,
                    }],
                }],
            }));
            match ingress::serve_tls(addr, agent, workers, journal, tls) {
                Ok(server) => {
                    let _ = tx.send(Ok(server.handle()));
                    let _ = server.await;
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        });
    });
    let server = rx.recv()??;
    Ok(Agent {
        addr,
        server,
        thread,
    })
}

/// What one agent's ingress phases measured.
struct Measured {
    p50: f64,
    p99: f64,
    rate: f64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (base_lat, base_rate) = baseline(args.latency_secs.min(1.0));
    println!(
        "baseline (sim runtime in-process, 1 in flight): calls_per_sec={:.0} p50_us={:.2} p99_us={:.2}",
        base_rate,
        percentile(&base_lat, 0.5),
        percentile(&base_lat, 0.99)
    );

    let mut plain = measure(&args, None, None)?;
    let Measured { p50, p99, rate } = plain;
    let p50_added = (p50 - percentile(&base_lat, 0.5)).max(0.0);
    let p99_added = (p99 - percentile(&base_lat, 0.99)).max(0.0);
    println!(
        "ratio agent/in-process: p50 {:.0}x, throughput {:.4}x",
        p50 / percentile(&base_lat, 0.5).max(1e-3),
        rate / base_rate.max(1.0)
    );
    if let (Some(ca), Some(cert), Some(key)) = (&args.https_ca, &args.https_cert, &args.https_key) {
        let https = Https {
            server: gshare_core::net::http_server_config(cert, key)?,
            client: Arc::new(gshare_core::net::http_client_config(ca)?),
        };
        println!("over https (TLS, keep-alive connections):");
        let tls = measure(&args, None, Some(https))?;
        println!(
            "https: throughput_ratio={:.3} p99_ratio={:.3} p99_added_us={:.1} (http: {:.0}/s p99 {:.1} us; https: {:.0}/s p99 {:.1} us)",
            tls.rate / plain.rate.max(1.0),
            tls.p99 / plain.p99.max(1e-3),
            tls.p99 - plain.p99,
            plain.rate,
            plain.p99,
            tls.rate,
            tls.p99
        );
        return Ok(());
    }
    if !args.metering {
        println!(
            "invocations_per_sec={rate:.0} p50_added_us={p50_added:.1} p99_added_us={p99_added:.1}"
        );
        return Ok(());
    }
    let sync = match args.journal_sync.as_str() {
        "dsync" => gshare_core::config::JournalSync::Dsync,
        "sled" => gshare_core::config::JournalSync::Sled,
        _ => gshare_core::config::JournalSync::Direct,
    };
    // (throughput ratio, p99 ratio, p99 added) of each round.
    let mut rounds = Vec::new();
    for round in 1..=args.rounds {
        if round > 1 {
            println!("round {round} of {}:", args.rounds);
            plain = measure(&args, None, None)?;
        }
        // A fresh journal each round, so that every round starts alike
        // (nothing ships the records here).
        let (dir, made) = match &args.journal_dir {
            Some(d) if args.rounds == 1 => (d.clone(), false),
            // Made afresh: a journal left by an earlier run holds records.
            Some(d) => {
                let dir = d.join(format!("round-{round}"));
                match std::fs::remove_dir_all(&dir) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(e).with_context(|| format!("removing {}", dir.display()));
                    }
                    _ => {}
                }
                (dir, false)
            }
            None => (
                std::env::temp_dir().join(format!(
                    "invoke-bench-journal-{}-{round}",
                    std::process::id()
                )),
                true,
            ),
        };
        let journal = Arc::new(
            UsageJournal::open_with(&dir, gshare_core::state::AgentId("bench-node".into()), sync)
                .with_context(|| format!("journal in {}", dir.display()))?,
        );
        println!(
            "with usage journal in {} (journal_sync {}, write-ahead log: {}):",
            dir.display(),
            args.journal_sync,
            if journal.logged() { "yes" } else { "no" }
        );
        let metered = measure(&args, Some(journal.clone()), None)?;
        let s = journal.status();
        println!(
            "journal: records={} pending={}",
            s.next_seq.saturating_sub(1),
            s.pending_records
        );
        if made {
            drop(journal);
            let _ = std::fs::remove_dir_all(&dir);
        }
        let r = (
            metered.rate / plain.rate.max(1.0),
            metered.p99 / plain.p99.max(1e-3),
            metered.p99 - plain.p99,
        );
        println!(
            "metering: throughput_ratio={:.3} p99_ratio={:.3} p99_added_us={:.1} (without: {:.0}/s p99 {:.1} us; with: {:.0}/s p99 {:.1} us)",
            r.0, r.1, r.2, plain.rate, plain.p99, metered.rate, metered.p99
        );
        rounds.push(r);
    }
    if rounds.len() > 1 {
        let median = |f: fn(&(f64, f64, f64)) -> f64| {
            let mut v: Vec<f64> = rounds.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            let (lo, hi) = (v[0], v[v.len() - 1]);
            let m = v.len() / 2;
            let mid = if v.len() % 2 == 0 {
                (v[m - 1] + v[m]) / 2.0
            } else {
                v[m]
            };
            (mid, lo, hi)
        };
        let (t, t_lo, t_hi) = median(|r| r.0);
        let (p, _, _) = median(|r| r.1);
        let (a, a_lo, a_hi) = median(|r| r.2);
        println!(
            "metering over {} rounds (medians): throughput_ratio={t:.3} (range {t_lo:.3}..{t_hi:.3}) p99_ratio={p:.3} p99_added_us={a:.1} (range {a_lo:.1}..{a_hi:.1})",
            rounds.len()
        );
    }
    Ok(())
}

/// The journal's durable writes during one phase: how many, how many
/// invocations each billed (the group commit's group: a group's usage is
/// one record per function), and how long they took (the device's write
/// latency, which a metered reply waits for at least).
struct Writes<'a> {
    journal: &'a UsageJournal,
    times: gshare_edge::journal::WriteHistogram,
    invocations: u64,
    began: Instant,
}

/// Invocations journaled so far, every tenant.
fn journaled(journal: &UsageJournal) -> u64 {
    journal
        .all_totals()
        .map(|t| t.values().map(|t| t.invocations).sum())
        .unwrap_or(0)
}

impl<'a> Writes<'a> {
    /// Counts from `began` (the snapshot is taken now: a phase's
    /// writes are those after it).
    fn start(journal: &'a UsageJournal, began: Instant) -> Self {
        Self {
            journal,
            times: journal.write_times(),
            invocations: journaled(journal),
            began,
        }
    }

    fn report(&mut self, phase: &str) {
        let times = self.journal.write_times().since(&self.times);
        let invocations = journaled(self.journal).saturating_sub(self.invocations);
        let writes = times.count();
        let secs = self.began.elapsed().as_secs_f64().max(1e-9);
        let us = |q| {
            times
                .quantile_us(q)
                .map_or("-".to_string(), |u| format!("{u}"))
        };
        println!(
            "journal writes ({phase}): writes={writes} writes_per_sec={:.0} invocations_per_write={:.2} write_p50_us<={} write_p99_us<={}",
            writes as f64 / secs,
            invocations as f64 / writes.max(1) as f64,
            us(0.5),
            us(0.99),
        );
    }
}

fn measure(
    args: &Args,
    journal: Option<Arc<UsageJournal>>,
    https: Option<Https>,
) -> anyhow::Result<Measured> {
    let client_tls = https.as_ref().map(|h| h.client.clone());
    let agent = start_agent(args.workers, journal.clone(), https.map(|h| h.server))?;
    let addr = agent.addr;
    // Warm-up: the first request cold-starts the instance.
    let mut c = Client::connect(addr, client_tls.as_ref())?;
    let warm = Instant::now();
    loop {
        match c.invoke()? {
            200 => break,
            s if warm.elapsed() > Duration::from_secs(10) => bail!("warm-up: status {s}"),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    for _ in 0..2000 {
        c.invoke()?;
    }

    let mut lat = Vec::new();
    let begin = Instant::now();
    let mut writes = journal.as_deref().map(|j| Writes::start(j, begin));
    let mut errors = 0u64;
    while begin.elapsed().as_secs_f64() < args.latency_secs {
        let t = Instant::now();
        if c.invoke()? != 200 {
            errors += 1;
        }
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
    println!(
        "agent ingress (1 in flight): invocations={} p50_us={p50:.1} p99_us={p99:.1} errors={errors}",
        lat.len()
    );
    if let Some(w) = writes.as_mut() {
        w.report("1 in flight");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for _ in 0..args.connections {
        let (stop, done, failed) = (stop.clone(), done.clone(), failed.clone());
        let mut c = Client::connect(addr, client_tls.as_ref())?;
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match c.invoke() {
                    Ok(200) => done.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(500));
    let d0 = done.load(Ordering::Relaxed);
    let t0 = Instant::now();
    if let (Some(w), Some(j)) = (writes.as_mut(), journal.as_deref()) {
        *w = Writes::start(j, t0);
    }
    std::thread::sleep(Duration::from_secs_f64(args.throughput_secs));
    let d1 = done.load(Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    if let Some(w) = writes.as_mut() {
        w.report(&format!("{} connections", args.connections));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let rate = (d1 - d0) as f64 / elapsed;
    agent.stop();
    println!(
        "agent ingress ({} keep-alive connections): invocations_per_sec={rate:.0} errors={}",
        args.connections,
        failed.load(Ordering::Relaxed)
    );
    Ok(Measured { p50, p99, rate })
}
