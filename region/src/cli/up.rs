//! `gsharectl up [--for <seconds>]`: a whole local region on this machine.
//!
//! ```text
//!  gsharectl up
//!   ├─ temp dir gshare-up-XXXX: CA + certificates, configs, data, logs (layout.rs)
//!   ├─ gshare-region × 3 (r1 with --init: configs/local topology + tenants)  ── wait for a leader
//!   ├─ print `dashboard: http://<r1>/#token=<operator token>` (the live page)
//!   ├─ gshare-edge × 4 (one per node of configs/local/topology.toml, simulated GPUs;
//!   │  with --runtime microvm the demo's functions run in microVMs: microvm.rs)
//!   ├─ tenant tokens (acme, globex), demo functions on all four tiers (demo.rs;
//!   │  --functions picks some of them)
//!   ├─ warm-up (cold starts; with --runtime microvm: print each VM's boot-to-ready),
//!   │  then the invocation load (load.rs) while sampling GPUs (gpu_usage.rs);
//!   │  during it the operator's move of acme/chat to the other center node (moves.rs)
//!   ├─ print attainment, GPU utilization, bills, URLs
//!   ├─ stay up until Ctrl-C / SIGTERM, or until --for seconds have passed since the start
//!   └─ stop the agents, re-read bills, stop the replicas (children.rs),
//!      print `up: invocations=… attainment=… tenants_billed=…`
//! ```
//!
//! `gshare-region` and `gshare-edge` are taken from the directory of the
//! running `gsharectl` (e.g. `target/release/`). Children end with
//! `gsharectl up` however it ends (see `children.rs`), and so do the
//! agents' microVMs (`vm_reaper.rs`).

mod api_client;
mod binaries;
mod children;
mod demo;
mod gpu_usage;
mod instances;
mod layout;
mod load;
mod microvm;
mod moves;
mod report;
mod scenario;
mod stop_signal;
mod vm_reaper;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gshare_core::model::Tier;
use serde_json::Value;

pub use children::{exec_child, ChildArgs};
pub use vm_reaper::{run_vm_reaper, VmReaperArgs};

use api_client::ApiClient;
use binaries::Binaries;
use children::Children;
use demo::{DemoFunction, TENANTS};
use gpu_usage::{GpuSampler, GpuUsage};
use instances::InstanceWatch;
use layout::Layout;
use load::{LoadReport, Target};
use microvm::{DemoRuntime, MicrovmSetup, VmReport};
use moves::DemoMove;
use report::{print_attainment, print_bills, print_gpu_usage, print_indented};
pub use scenario::Scenario;
use stop_signal::StopSignal;
use vm_reaper::VmReaper;

const REPLICAS: u64 = 3;
/// How long the replicas may take to elect a leader and load the files.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the cold starts of the warm-up may take.
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the final bills wait for usage still on its way.
const BILL_SETTLE: Duration = Duration::from_secs(3);
/// Log lines shown when a child fails.
const TAIL_LINES: usize = 25;
/// The deadline of the request that brings a demo function up from zero.
const WAKE_DEADLINE_MS: u64 = 30_000;
/// How far into the load the demo moves [`demo::MOVED`] (at most a third
/// of the load).
const DEMO_MOVE_DELAY: Duration = Duration::from_secs(3);
/// `--load-s` when not given.
const DEFAULT_LOAD_S: u64 = 10;

/// The long help of `gsharectl up`.
pub const LONG_ABOUT: &str = "Start a whole gshare region on this machine and show it working.\n\n\
    Starts 3 replicas (gshare-region) and one agent (gshare-edge) per node of \
    configs/local/topology.toml (a center pool of two nodes, two edge pools of one node each; \
    simulated 16 GiB GPUs) in a fresh temporary directory on free loopback ports, deploys \
    demo functions of the tenants acme and globex on all four tiers, drives a short \
    invocation load (during which the operator API moves one function to another node, \
    make-before-break), and prints deadline attainment, GPU utilization, each tenant's bill and \
    the URLs and tokens to look with. It then stays up until Ctrl-C or SIGTERM (or until \
    --for seconds have passed), reads the bills once more, stops everything it started and \
    exits 0. Its last line is `up: invocations=<N> attainment=<x> tenants_billed=<K>`.\n\n\
    With --runtime microvm every instance of a demo function runs in its own QEMU microVM \
    (the agents' `microvm` runtime driver, docs/microvm.md) serving a small function server \
    from the guest; after the warm-up the report lists each running VM with its function, \
    node, QEMU pid, the boot-to-ready its agent measured (QEMU spawned to the first 200 from \
    the guest's /health) and its RSS, then `up: microvm boot-to-ready: vms=<n> \
    median_ms=<m> min_ms=<a> max_ms=<b>` over those VMs. It needs qemu-system-x86_64 and the \
    guest image that scripts/microvm-image.sh builds into target/microvm. Each VM holds about \
    300 MiB and boots in seconds (under TCG, where KVM is not real, 2-10 s each, CPU-bound): \
    --functions keeps the demo small.\n\n\
    The replicas and agents end with it however it ends (Ctrl-C, SIGTERM, a panic, even \
    kill -9). Their logs are in <dir>/logs/.\n\n\
    gshare-region and gshare-edge must sit next to this gsharectl: build them with \
    `cargo build --release` and run target/release/gsharectl up.";

/// `gsharectl up`
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
        cargo build --release && target/release/gsharectl up     # until Ctrl-C\n  \
        target/release/gsharectl up --for 60                     # exit 0 after 60 s\n  \
        target/release/gsharectl up --keep                       # keep certs, configs, logs\n  \
        scripts/microvm-image.sh                                 # the guest image, once\n  \
        target/release/gsharectl up --runtime microvm --functions acme/rank,globex/translate\n  \
                                                                 # two demo functions in microVMs")]
pub struct Args {
    /// Exit 0 once this many seconds have passed since the start (the demo
    /// always runs to its end first). Without it: run until Ctrl-C or SIGTERM.
    /// Ignored with --scenario.
    #[arg(long = "for", value_name = "SECONDS")]
    for_s: Option<u64>,
    /// Seconds of invocation load in the demo. Ignored with --scenario.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_LOAD_S)]
    load_s: u64,
    /// Instead of the demo, run the region through a scripted situation
    /// that ends by itself; the last line is `scenario: name=<n>
    /// invocations=<N> failed=<F> attainment=<x> <metric>=<value> …`, and
    /// the exit status is non-zero if the scenario's own check failed.
    /// Ignores --for and --load-s; honours --keep.
    #[arg(long, value_enum, value_name = "NAME")]
    scenario: Option<Scenario>,
    /// Keep the temporary directory (certificates, configs, data, logs) on
    /// exit; by default it is removed, except after a failure.
    #[arg(long)]
    keep: bool,
    /// Where the demo's functions run: `sim` (no process: the agent waits
    /// out the predicted service time) or `microvm` (each instance in its
    /// own QEMU microVM; needs qemu-system-x86_64 and the guest image of
    /// scripts/microvm-image.sh). Not with --scenario.
    #[arg(long, value_enum, value_name = "DRIVER", default_value_t = DemoRuntime::Sim)]
    runtime: DemoRuntime,
    /// The guest image for --runtime microvm [default:
    /// $GSHARE_MICROVM_IMAGE, else `microvm` beside the binaries'
    /// directory: target/microvm for target/release/gsharectl].
    #[arg(long, value_name = "DIR")]
    microvm_image: Option<PathBuf>,
    /// Deploy only these demo functions (`tenant/name`, comma-separated;
    /// default: all 13). Ignored with --scenario.
    #[arg(long, value_name = "TENANT/NAME,…", value_delimiter = ',')]
    functions: Vec<String>,
}

/// A signal arrived while the region was starting or the demo ran.
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
struct Interrupted;

/// The running region and what the demo set up.
struct Up {
    layout: Layout,
    children: Children,
    api: ApiClient,
    operator: String,
    tokens: BTreeMap<&'static str, String>,
    /// Demo function → the node of its first instance (`None`: deployed
    /// with `min_instances = 0`, none at deploy).
    placed: Vec<(DemoFunction, Option<String>)>,
    /// The load's figures, once it ran (even if a signal cut it short).
    report: Option<LoadReport>,
    /// The demo's scaling functions' instance counts, sampled from their
    /// deploy to the stop.
    scaling: Option<InstanceWatch>,
    /// When the demo load began, since `scaling` started.
    load_began: Option<Duration>,
    /// The demo functions to deploy (all of [`demo::DEMO`] unless --functions).
    demo: Vec<DemoFunction>,
    /// With --runtime microvm: kills the VMs if `up` is killed (after
    /// `children`: dropped once the agents stopped their VMs).
    vm_reaper: Option<VmReaper>,
}

/// Runs `gsharectl up`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut stop = StopSignal::install()?;
    let bins = Binaries::locate()?;
    if a.scenario.is_some() && a.runtime == DemoRuntime::Microvm {
        bail!("--runtime microvm runs the demo only, not a --scenario");
    }
    let demo = demo::select(&a.functions)?;
    let microvm = match a.runtime {
        DemoRuntime::Sim => None,
        DemoRuntime::Microvm => Some(MicrovmSetup::locate(
            a.microvm_image.as_deref(),
            bins.dir(),
        )?),
    };
    let tmp = tempfile::Builder::new()
        .prefix("gshare-up-")
        .tempdir()
        .context("creating a temporary directory")?;
    println!(
        "up: data directory {} ({} on exit; kept after a failure)",
        tmp.path().display(),
        if a.keep { "kept" } else { "removed" }
    );
    if a.scenario.is_some()
        && (a.for_s.is_some() || a.load_s != DEFAULT_LOAD_S || !a.functions.is_empty())
    {
        println!("up: --scenario ignores --for, --load-s and --functions");
    }
    let operator = crate::api::auth::new_secret().map_err(|e| anyhow!("{e}"))?;
    let layout = Layout::write(tmp.path(), REPLICAS, &operator, microvm)?;
    let vm_reaper = match &layout.microvm {
        Some(_) => Some(VmReaper::start(&bins.gsharectl, &layout.dir.join("data"))?),
        None => None,
    };
    let mut up = Up {
        api: ApiClient::new(layout.replicas.iter().map(|r| r.http_addr).collect()),
        layout,
        children: Children::new(bins.gsharectl.clone()),
        operator,
        tokens: BTreeMap::new(),
        placed: Vec::new(),
        report: None,
        scaling: None,
        load_began: None,
        demo,
        vm_reaper,
    };
    let ran = match a.scenario {
        None => up.start_and_demo(&bins, &mut stop, &a).map(|()| None),
        Some(s) => up
            .start(&bins, &mut stop)
            .and_then(|()| s.run(&mut up, &mut stop))
            .map(Some),
    };
    let outcome = match ran {
        Ok(o) => Ok(o),
        Err(e) if e.is::<Interrupted>() => Err(()),
        Err(e) => {
            up.children.stop();
            let kept = tmp.keep();
            eprintln!("gsharectl up: logs and configs kept in {}", kept.display());
            return Err(e);
        }
    };
    if let Ok(None) = outcome {
        let until = a.for_s.map(|s| started + Duration::from_secs(s));
        match (until, a.for_s) {
            (Some(t), Some(s)) if t > Instant::now() => println!(
                "up: running until {s} s after the start (--for {s}; {} s from now); \
                 Ctrl-C or SIGTERM stops it sooner",
                (t - Instant::now()).as_secs()
            ),
            (Some(_), Some(s)) => println!(
                "up: --for {s}: the demo took {} s; stopping",
                started.elapsed().as_secs()
            ),
            _ => println!("up: running; Ctrl-C or SIGTERM stops it"),
        }
        up.stay_up(&mut stop, until);
    }
    if let Some(s) = stop.name() {
        println!("up: {s} received, stopping");
    }
    let traces = up.finish_scaling();
    // Agents first (a stopping agent may still send its last usage), then
    // the bills, while the replicas still run, then the replicas.
    let mut killed = up.children.stop_where(|p| p.name.starts_with("agent "));
    let bills = up.final_bills();
    killed.extend(up.children.stop());
    drop(up.vm_reaper.take());
    if !killed.is_empty() {
        eprintln!(
            "gsharectl up: killed after {} s without exiting: {}",
            children::STOP_GRACE.as_secs(),
            killed.join(", ")
        );
    }
    println!("up: stopped the agents and replicas");
    print_bills(&bills, &up.layout);
    if a.scenario.is_none() {
        report::print_scaling(&up.scaling_functions(), &traces, up.load_began);
    }
    let failed = matches!(&outcome, Ok(Some(o)) if !o.problems.is_empty());
    if a.keep || failed {
        println!("up: kept {}", tmp.keep().display());
    } else {
        drop(tmp);
    }
    match (a.scenario, outcome) {
        (None, _) => {
            let (n, x) = up
                .report
                .as_ref()
                .map_or((0, 0.0), |r| (r.overall.invocations, r.overall.fraction()));
            let billed = bills.values().filter(|b| b.is_some_and(|t| t > 0)).count();
            println!("up: invocations={n} attainment={x:.3} tenants_billed={billed}");
            Ok(())
        }
        (Some(s), Err(())) => bail!("scenario {} interrupted before its end", s.name()),
        (Some(_), Ok(None)) => bail!("the scenario ended without an outcome"),
        (Some(_), Ok(Some(o))) => {
            println!("{}", o.line());
            if o.problems.is_empty() {
                Ok(())
            } else {
                bail!(
                    "scenario {} failed its check: {}",
                    o.name,
                    o.problems.join("; ")
                )
            }
        }
    }
}

impl Up {
    /// Starts the replicas and agents, issues the tenants' tokens and
    /// waits until every agent is registered.
    fn start(&mut self, bins: &Binaries, stop: &mut StopSignal) -> anyhow::Result<()> {
        self.start_replicas(bins, stop)?;
        println!(
            "dashboard: http://{}/#token={} ",
            self.layout.replicas[0].http_addr, self.operator
        );
        self.start_agents(bins)?;
        for t in TENANTS {
            let token = demo::issue_token(&self.api, &self.operator, t)?;
            self.tokens.insert(t, token);
        }
        self.check(stop)?;
        self.wait_agents(stop)
    }

    fn start_and_demo(
        &mut self,
        bins: &Binaries,
        stop: &mut StopSignal,
        a: &Args,
    ) -> anyhow::Result<()> {
        self.start(bins, stop)?;
        self.scaling = Some(InstanceWatch::start(
            self.api.replicas().to_vec(),
            self.operator.clone(),
            self.demo
                .iter()
                .filter(|f| f.scales())
                .map(|f| (f.tenant.to_string(), f.name.to_string()))
                .collect(),
        ));
        for f in self.demo.clone() {
            let token = &self.tokens[f.tenant];
            let node = demo::deploy(&self.api, &f, token)?;
            self.placed.push((f, node));
        }
        self.print_placements();
        let mut targets = self.targets()?;
        self.wake_from_zero(&mut targets, stop)?;
        println!(
            "up: warming up {} functions (cold starts: weights from storage at the pool's speed)",
            targets.len()
        );
        let cold = load::warm_up(&targets, WARM_UP_TIMEOUT, &stop.flag());
        self.check(stop)?;
        if !cold.is_empty() {
            eprintln!(
                "gsharectl up: not warm after {} s: {}",
                WARM_UP_TIMEOUT.as_secs(),
                cold.join(", ")
            );
        }
        if let Some(m) = &self.layout.microvm {
            let deployed: Vec<DemoFunction> = self.placed.iter().map(|(f, _)| f.clone()).collect();
            VmReport::scrape(&self.layout.agents, &m.metrics_token).print(&deployed);
        }
        let clients: u32 = targets.iter().map(|t| t.function.clients).sum();
        println!(
            "up: invocation load for {} s: {} functions, {clients} clients, half of them through \
             the agents' ingress and half through the replicas",
            a.load_s,
            targets.len()
        );
        let demo_move = self.start_demo_move(&mut targets, a, stop);
        self.load_began = self.scaling.as_ref().map(|w| w.started().elapsed());
        let sampler = GpuSampler::start(self.api.replicas().to_vec(), self.operator.clone());
        let report = load::run(
            &targets,
            self.api.replicas(),
            Duration::from_secs(a.load_s),
            &stop.flag(),
        );
        let usage = sampler.finish();
        print_attainment(&report);
        if let Some(m) = &self.layout.microvm {
            VmReport::scrape(&self.layout.agents, &m.metrics_token).print_boots();
        }
        if let Some(mut m) = demo_move {
            if let Some(moved) = m.finish() {
                self.print_demo_move(&m, &moved, &report);
            }
        }
        self.report = Some(report.clone());
        self.check(stop)?;
        print_gpu_usage(&usage, &self.layout);
        print_bills(&self.bills(), &self.layout);
        self.print_urls();
        Ok(())
    }

    /// Starts the demo's move of [`demo::MOVED`] to the other node of its
    /// pool, [`DEMO_MOVE_DELAY`] into the load (at most a third of it), in
    /// a thread. Its clients then all go through the replicas, which route
    /// to wherever it is (an agent's own ingress answers 404 for a function
    /// it does not host). `None`: it has no instance or no other node.
    fn start_demo_move(
        &self,
        targets: &mut [Target],
        a: &Args,
        stop: &StopSignal,
    ) -> Option<DemoMove> {
        let (tenant, name) = demo::MOVED;
        let from = instances::instances_of(&self.api, &self.operator, tenant, name)
            .ok()?
            .first()?
            .node
            .clone();
        let pool = &self.layout.agents.iter().find(|x| x.node == from)?.pool;
        let to = self
            .layout
            .agents
            .iter()
            .find(|x| x.pool == *pool && x.node != from)?
            .node
            .clone();
        for t in targets
            .iter_mut()
            .filter(|t| t.function.tenant == tenant && t.function.name == name)
        {
            t.ingress = None;
            t.traced = true;
        }
        let delay = DEMO_MOVE_DELAY.min(Duration::from_secs(a.load_s) / 3);
        println!(
            "up: {tenant}/{name} moves from {from} to {to} {:.1} s into the load (the operator's \
             POST /v1/tenants/{tenant}/functions/{name}/move; its clients all go through the \
             replicas)",
            delay.as_secs_f64()
        );
        Some(DemoMove::start(
            self.api.replicas()[0],
            self.operator.clone(),
            (tenant, name),
            from,
            to,
            delay,
            stop.flag(),
        ))
    }

    /// The demo's move in one line, with what its clients got meanwhile;
    /// the function's node is updated for the URLs.
    fn print_demo_move(&mut self, m: &DemoMove, moved: &moves::Moved, report: &LoadReport) {
        let function = m.function.as_str();
        let (from, to) = (m.from.as_str(), m.to.as_str());
        // Sent while the move ran, and after it.
        let (mut during, mut after) = (Vec::new(), Vec::new());
        for (_, sent, i) in report.traced.iter().filter(|(f, ..)| f == function) {
            match m.window() {
                Some((a, b)) if *sent >= a && *sent < b => during.push(i),
                Some((_, b)) if *sent >= b => after.push(i),
                _ => {}
            }
        }
        let tell = |is: &[&load::Invocation]| {
            let failed: Vec<u16> = is
                .iter()
                .filter(|i| i.status != 200)
                .map(|i| i.status)
                .collect();
            if failed.is_empty() {
                format!("{} served", is.len())
            } else {
                format!(
                    "{} of {} served, HTTP {failed:?}",
                    is.len() - failed.len(),
                    is.len()
                )
            }
        };
        if moved.completed() > 0 {
            let kept = during.iter().chain(&after).all(|i| i.status == 200);
            println!(
                "up: moved {function} from {from} to {to} (make-before-break, {:.1} s; {}: {} \
                 while it moved, {} after)",
                moved.took.as_secs_f64(),
                if kept {
                    "invocations kept being served"
                } else {
                    "some invocations failed"
                },
                tell(&during),
                tell(&after)
            );
            if let Some((_, node)) = self.placed.iter_mut().find(|(f, _)| f.id() == function) {
                *node = Some(to.to_string());
            }
        } else {
            println!(
                "up: the move of {function} from {from} to {to} did not complete after {:.1} s: {}",
                moved.took.as_secs_f64(),
                moved.describe()
            );
        }
    }

    /// Fails with [`Interrupted`] after a signal, or with the log of a
    /// child that exited.
    fn check(&mut self, stop: &StopSignal) -> anyhow::Result<()> {
        if stop.requested() {
            return Err(Interrupted.into());
        }
        if let Some((p, status)) = self.children.first_exited() {
            bail!(
                "{} (pid {}) exited ({status}); the end of its log {}:\n{}",
                p.name,
                p.pid(),
                p.log.display(),
                p.log_tail(TAIL_LINES)
            );
        }
        Ok(())
    }

    fn start_replicas(&mut self, bins: &Binaries, stop: &mut StopSignal) -> anyhow::Result<()> {
        for r in self.layout.replicas.clone() {
            let mut args = vec!["--config".to_string(), r.config.display().to_string()];
            if r.id == 1 {
                args.push("--init".into());
            }
            let p = self.children.spawn(
                &format!("replica r{}", r.id),
                &bins.region,
                &args,
                &self.layout.dir,
                &r.log,
            )?;
            println!(
                "up: replica r{} pid {} http {} raft(QUIC/UDP) {} log {}",
                r.id,
                p.pid(),
                r.http_addr,
                r.raft_addr,
                r.log.display()
            );
        }
        let deadline = Instant::now() + START_TIMEOUT;
        let leader = loop {
            self.check(stop)?;
            if let Some(l) = self.agreed_leader() {
                break l;
            }
            if Instant::now() > deadline {
                bail!(
                    "the replicas agreed on no leader within {} s; the end of r1's log {}:\n{}",
                    START_TIMEOUT.as_secs(),
                    self.layout.replicas[0].log.display(),
                    children::log_tail(&self.layout.replicas[0].log, TAIL_LINES)
                );
            }
            stop.wait(Duration::from_millis(100));
        };
        println!("up: replica r{leader} is the leader");
        loop {
            self.check(stop)?;
            let names: Vec<String> = match ApiClient::call_at(
                self.api.replicas()[0],
                "GET",
                "/v1/tenants",
                &self.operator,
                None,
            ) {
                Ok(Value::Array(ts)) => ts
                    .iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_string))
                    .collect(),
                _ => Vec::new(),
            };
            if TENANTS.iter().all(|t| names.iter().any(|n| n == t)) {
                println!("up: topology and tenants loaded ({})", names.join(", "));
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "tenants {TENANTS:?} not loaded within {} s (have {names:?}); r1's log {}:\n{}",
                    START_TIMEOUT.as_secs(),
                    self.layout.replicas[0].log.display(),
                    children::log_tail(&self.layout.replicas[0].log, TAIL_LINES)
                );
            }
            stop.wait(Duration::from_millis(100));
        }
    }

    /// The leader every replica names, if they agree and it says so itself.
    fn agreed_leader(&self) -> Option<u64> {
        let mut leader = None;
        let mut role_of = BTreeMap::new();
        for r in &self.layout.replicas {
            let v = ApiClient::call_at(r.http_addr, "GET", "/v1/cluster", "", None).ok()?;
            let l = v["leader"].as_u64()?;
            if leader.is_some_and(|x| x != l) {
                return None;
            }
            leader = Some(l);
            role_of.insert(r.id, v["role"].as_str().unwrap_or("").to_string());
        }
        let l = leader?;
        (role_of.get(&l).map(String::as_str) == Some("leader")).then_some(l)
    }

    fn start_agents(&mut self, bins: &Binaries) -> anyhow::Result<()> {
        for a in self.layout.agents.clone() {
            let args = vec!["--config".to_string(), a.config.display().to_string()];
            let p = self.children.spawn(
                &format!("agent {}", a.node),
                &bins.edge,
                &args,
                &self.layout.dir,
                &a.log,
            )?;
            println!(
                "up: agent {} (pool {}, {} simulated GPU{}{}) pid {} ingress {} log {}",
                a.node,
                a.pool,
                a.gpus,
                if a.gpus == 1 { "" } else { "s" },
                if self.layout.microvm.is_some() {
                    ", functions in microVMs"
                } else {
                    ""
                },
                p.pid(),
                a.ingress,
                a.log.display()
            );
        }
        Ok(())
    }

    /// Waits until every agent is registered with some replica.
    fn wait_agents(&mut self, stop: &mut StopSignal) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            self.check(stop)?;
            let listed = GpuUsage::listing(&self.api, &self.operator);
            let missing: Vec<&str> = self
                .layout
                .agents
                .iter()
                .map(|a| a.node.as_str())
                .filter(|n| !listed.iter().any(|r| r.node == *n))
                .collect();
            if missing.is_empty() {
                println!("up: all {} agents registered", self.layout.agents.len());
                return Ok(());
            }
            if Instant::now() > deadline {
                let a = self
                    .layout
                    .agents
                    .iter()
                    .find(|a| a.node == missing[0])
                    .map(|a| a.log.clone())
                    .unwrap_or_default();
                bail!(
                    "agents {missing:?} did not register within {} s; the end of {}:\n{}",
                    START_TIMEOUT.as_secs(),
                    a.display(),
                    children::log_tail(&a, TAIL_LINES)
                );
            }
            stop.wait(Duration::from_millis(200));
        }
    }

    fn ingress_of(&self, node: &str) -> anyhow::Result<SocketAddr> {
        self.layout
            .agents
            .iter()
            .find(|a| a.node == node)
            .map(|a| a.ingress)
            .ok_or_else(|| anyhow!("no agent for node {node}"))
    }

    fn targets(&self) -> anyhow::Result<Vec<Target>> {
        self.placed
            .iter()
            .map(|(f, node)| {
                Ok(Target {
                    function: f.clone(),
                    token: self.tokens[f.tenant].clone(),
                    ingress: node.as_deref().map(|n| self.ingress_of(n)).transpose()?,
                    traced: false,
                })
            })
            .collect()
    }

    /// Sends one request with a long deadline to each demo function that
    /// has no instance (deployed with `min_instances = 0`), through a
    /// replica: the region places one and holds the request meanwhile.
    /// A function not served is left out of the warm-up and the load.
    fn wake_from_zero(
        &mut self,
        targets: &mut Vec<Target>,
        stop: &mut StopSignal,
    ) -> anyhow::Result<()> {
        let mut woken = Vec::new();
        for t in targets.iter().filter(|t| t.ingress.is_none()) {
            self.check(stop)?;
            let f = &t.function;
            let i = load::invoke(
                self.api.replicas()[0],
                f.tenant,
                f.name,
                &t.token,
                WAKE_DEADLINE_MS,
            );
            if i.status == 200 {
                println!(
                    "up: {} (min_instances 0) served from zero in {} ms (the region placed an \
                     instance while it held the request)",
                    f.id(),
                    i.latency.as_millis()
                );
                woken.push(f.id());
            } else {
                println!(
                    "up: {} (min_instances 0) was not served from zero (HTTP {}); it is left out \
                     of the warm-up and the load",
                    f.id(),
                    i.status
                );
            }
        }
        targets.retain(|t| t.ingress.is_some() || woken.contains(&t.function.id()));
        Ok(())
    }

    /// The demo functions whose count the autoscaler may change.
    fn scaling_functions(&self) -> Vec<DemoFunction> {
        self.placed
            .iter()
            .map(|(f, _)| f.clone())
            .filter(DemoFunction::scales)
            .collect()
    }

    /// Stops sampling the scaling functions; their traces (`tenant/name`).
    fn finish_scaling(&mut self) -> BTreeMap<String, instances::Trace> {
        self.scaling
            .take()
            .map(InstanceWatch::finish)
            .unwrap_or_default()
    }

    fn print_placements(&self) {
        println!("up: deployed {} demo functions:", self.placed.len());
        let mut rows = vec![[
            "FUNCTION",
            "TIER",
            "POOL",
            "COMPUTE",
            "MEMORY MiB",
            "DEADLINE ms",
            "PLACED ON",
        ]
        .map(String::from)
        .to_vec()];
        for (f, node) in &self.placed {
            rows.push(vec![
                f.id(),
                f.tier.as_str().into(),
                f.pool.into(),
                f.compute_milli.to_string(),
                f.memory_mib.to_string(),
                f.deadline_ms.to_string(),
                match node {
                    Some(n) if f.scales() => {
                        format!("{n} (+ up to {} more)", f.instances.1 - 1)
                    }
                    Some(n) => n.clone(),
                    None => "none yet (min_instances 0)".into(),
                },
            ]);
        }
        print_indented(&rows);
    }

    /// Each tenant's bill total (smallest unit), `None` if it could not be read.
    fn bills(&self) -> BTreeMap<&'static str, Option<u64>> {
        TENANTS
            .iter()
            .map(|t| {
                let v = self
                    .api
                    .call(
                        "GET",
                        &format!("/v1/tenants/{t}/bill"),
                        &self.operator,
                        None,
                    )
                    .ok();
                (*t, v.and_then(|v| v["total"].as_u64()))
            })
            .collect()
    }

    /// The bills at exit: read until every tenant that was invoked has a
    /// bill above zero, for at most [`BILL_SETTLE`] (usage reaches the
    /// region after the invocations).
    fn final_bills(&self) -> BTreeMap<&'static str, Option<u64>> {
        let invoked: Vec<&str> = self.report.as_ref().map_or(Vec::new(), |r| {
            TENANTS
                .iter()
                .copied()
                .filter(|t| {
                    r.by_function
                        .iter()
                        .any(|(f, a)| f.starts_with(&format!("{t}/")) && a.invocations > 0)
                })
                .collect()
        });
        let deadline = Instant::now() + BILL_SETTLE;
        loop {
            let bills = self.bills();
            let settled = invoked
                .iter()
                .all(|t| bills.get(t).copied().flatten().is_some_and(|v| v > 0));
            if settled || Instant::now() >= deadline {
                return bills;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn print_urls(&self) {
        let r1 = self.layout.replicas[0].http_addr;
        println!("up: where to look:");
        for r in &self.layout.replicas {
            println!(
                "  replica r{id}: http://{a}/v1/cluster  http://{a}/metrics  http://{a}/healthz",
                id = r.id,
                a = r.http_addr,
            );
        }
        for a in &self.layout.agents {
            println!(
                "  agent {} ({}): http://{2}/metrics  http://{2}/healthz  (ingress http://{2}/v1/invoke/…)",
                a.node, a.pool, a.ingress
            );
        }
        if let (Some(m), Some(a)) = (&self.layout.microvm, self.layout.agents.first()) {
            println!(
                "  microVMs of agent {}: curl -s http://{}/metrics -H 'Authorization: Bearer {}' \
                 | grep gshare_edge_microvm_   (each VM's console: {}/data/agent-{}/function-logs/)",
                a.node,
                a.ingress,
                m.metrics_token,
                self.layout.dir.display(),
                a.node
            );
        }
        println!("  operator token: {}", self.operator);
        for (t, tok) in &self.tokens {
            println!("  tenant {t} token: {tok}");
        }
        if let Some((f, node)) = self.placed.iter().find(|(f, _)| f.tier == Tier::Guaranteed) {
            let tok = &self.tokens[f.tenant];
            println!(
                "  curl -s -XPOST http://{r1}/v1/invoke/{}/{} -H 'Authorization: Bearer {tok}' \
                 -H 'X-Gshare-Deadline-Ms: {}' -d '{{}}'",
                f.tenant, f.name, f.deadline_ms
            );
            if let Some(ingress) = node.as_deref().and_then(|n| self.ingress_of(n).ok()) {
                println!(
                    "  curl -s -XPOST http://{ingress}/v1/invoke/{}/{} -H 'Authorization: Bearer {tok}' -d '{{}}'   # the agent directly",
                    f.tenant, f.name
                );
            }
            println!("  curl -s http://{r1}/v1/bill -H 'Authorization: Bearer {tok}'");
        }
        println!(
            "  curl -s http://{r1}/v1/cluster/agents -H 'Authorization: Bearer {}'",
            self.operator
        );
        println!(
            "  GSHARE_REGION=http://{r1} GSHARE_TOKEN={} gsharectl function ls",
            self.tokens.get("acme").map_or("", String::as_str)
        );
    }

    /// Waits until `until` or a signal; warns once per child that exits.
    fn stay_up(&mut self, stop: &mut StopSignal, until: Option<Instant>) {
        let mut warned = std::collections::BTreeSet::new();
        loop {
            let step = Some(until.map_or(Instant::now() + Duration::from_secs(1), |t| {
                t.min(Instant::now() + Duration::from_secs(1))
            }));
            if stop.wait_until(step) {
                return;
            }
            for p in self.children.iter_mut() {
                if let Some(status) = p.exited() {
                    if warned.insert(p.name.clone()) {
                        eprintln!(
                            "gsharectl up: {} exited ({status}); the end of its log {}:\n{}",
                            p.name,
                            p.log.display(),
                            p.log_tail(TAIL_LINES)
                        );
                    }
                }
            }
            if until.is_some_and(|t| Instant::now() >= t) {
                return;
            }
        }
    }
}
