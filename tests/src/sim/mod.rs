//! Deterministic simulation of the region's control plane (docs/simulation.md).
//!
//! One seed → one run, bit for bit: three region replicas (openraft with the
//! real state machine and [`RegionState`](gshare_raft_store::RegionState),
//! the proposer's write path [`commit_via`], the QUIC server's Raft answers
//! [`answer_raft`](gshare_region::quic_server::answer_raft), the scheduler's
//! [`decide_on`], on the simulated disk [`MemDisk`]) and the agents' cores
//! ([`SimAgent`]: the executor, assignment reconciliation, metering and the
//! journal's numbering, see `agent.rs`) run in one process on a
//! current-thread tokio runtime whose clock is paused (it jumps to the next
//! timer when every task waits), over [`SimNet`]. Every random choice (the
//! network's fates, the workload, the nemesis, openraft's election
//! timeouts through [`seed_thread_rng`]) comes from the seed.
//!
//! The nemesis injects, from the seed: message loss, delay, duplication and
//! (through delays) reordering; partitions (one replica cut off, one-way
//! cuts); replica crashes (one, the leader, or all at once) that lose what
//! was not flushed; agent crashes that lose their executor, meter and
//! unflushed usage records; and clock steps and drift on agents. After the
//! faults the network heals and every process restarts; the run then checks the chaos suite's invariants with
//! the nemesis checker ([`crate::nemesis::checker`]), exactly-once billing
//! against the agents' journals, agents hosting what the region assigns,
//! every accepted request answered, and that the healed region serves.

mod agent;
mod net;

pub use agent::{Due, SimAgent, SimJournal};

pub use net::{NetCounts, NodeId, SimLinks, SimNet, Weather};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gshare_core::command::{CommandOutcome, RegionCommand};
use gshare_core::config::{Topology, Usage};
use gshare_core::executor::Event;
use gshare_core::model::Micros;
use gshare_core::model::{PoolKind, Quota, TenantId};
use gshare_core::protocol::Assignment;
use gshare_core::state::{Applied, DomainCommand, LivenessRules, NodeState};
use gshare_raft_store::mem::MemDisk;
use gshare_raft_store::{seed_thread_rng, CommandBatch, ReplicaNode, StateReader, TypeConfig};
use gshare_region::network::RaftPeers;
use gshare_region::proposer::{commit_via, WriteError};
use gshare_region::scheduler::{decide_on, watch_plan, Evaluation, HeardTimes};
use openraft::Raft;

use crate::nemesis::checker::{self, Violation};
use crate::nemesis::history::{Op, OpKind, Outcome};

/// A bug planted on purpose, to show that the simulation catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Planted {
    /// None: the protocol as shipped.
    #[default]
    None,
    /// Agents send usage records before their journal write is durable
    /// (the bug `UsageJournal::batch_after`'s `durable_end` fixed).
    UsageBeforeFsync,
}

/// One simulated run.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    /// Every random choice follows from it.
    pub seed: u64,
    /// Simulated seconds of workload and faults (healing and checks follow).
    pub secs: u64,
    /// Region replicas.
    pub replicas: u64,
    /// Node agents.
    pub agents: u64,
    /// A bug to plant.
    pub planted: Planted,
}

impl SimConfig {
    /// The CI shape: 3 replicas, 2 agents, `secs` of faults.
    pub fn new(seed: u64, secs: u64) -> SimConfig {
        SimConfig {
            seed,
            secs,
            replicas: 3,
            agents: 2,
            planted: Planted::None,
        }
    }
}

/// What one run did and found.
#[derive(Debug, Clone)]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// Simulated seconds in all (faults, healing, checks).
    pub sim_secs: f64,
    /// The digest of every decision and outcome: equal for two runs of one seed.
    pub digest: u64,
    /// The client operations with their outcomes.
    pub ops: Vec<Op>,
    /// What the network did.
    pub net: NetCounts,
    /// Faults injected, one line each.
    pub faults: Vec<String>,
    /// Invocations the region billed.
    pub billed: u64,
    /// Requests the agents' executors ran to the end, and rejected.
    pub requests: (u64, u64),
    /// Writes crashes threw away: the replicas' disks, the agents' journals.
    pub lost_writes: (u64, u64),
    /// The leader's watch: nodes marked not ready, instances moved off
    /// them, instances added to underplaced functions.
    pub watch: (u64, u64, u64),
    /// Broken invariants.
    pub violations: Vec<Violation>,
}

impl SimReport {
    /// Ops that ended ok / definitely failed / unknown.
    pub fn outcome_counts(&self) -> (usize, usize, usize) {
        let ok = self.ops.iter().filter(|o| o.outcome.is_ok()).count();
        let unknown = self.ops.iter().filter(|o| o.outcome.is_unknown()).count();
        (ok, self.ops.len() - ok - unknown, unknown)
    }

    /// One line for logs.
    pub fn summary(&self) -> String {
        let (ok, fail, unknown) = self.outcome_counts();
        format!(
            "seed {}: {:.0} simulated s, {} ops ({ok} ok, {fail} failed, {unknown} unknown), \
             {} faults, {} messages ({} lost, {} cut, {} duplicated), {} requests run \
             ({} rejected), {} invocations billed, {}+{} writes lost in crashes, \
             {} nodes marked not ready, {} instances moved off them, {} added, \
             digest {:016x}, {} violations",
            self.seed,
            self.sim_secs,
            self.ops.len(),
            self.faults.len(),
            self.net.sent,
            self.net.lost,
            self.net.cut,
            self.net.duplicated,
            self.requests.0,
            self.requests.1,
            self.billed,
            self.lost_writes.0,
            self.lost_writes.1,
            self.watch.0,
            self.watch.1,
            self.watch.2,
            self.digest,
            self.violations.len()
        )
    }
}

thread_local! {
    /// Panics on this thread since the run began: a panic in a spawned task
    /// would otherwise only end that task (tokio keeps going).
    static PANICS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Runs one seed to the end (never panics on a violation: see the report).
pub fn run(cfg: SimConfig) -> SimReport {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|p| p.set(p.get() + 1));
            previous(info);
        }));
    });
    PANICS.with(|p| p.set(0));
    seed_thread_rng(cfg.seed ^ 0x005e_ed0f_0af7);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let mut report = rt.block_on(World::run(cfg));
    let panics = PANICS.with(|p| p.get());
    if panics > 0 {
        report.violations.push(Violation {
            invariant: "nothing panics",
            detail: format!("{panics} panics in the simulated processes (see stderr)"),
            excerpt: report.faults.join("\n"),
        });
    }
    report
}

const EPOCH_MS: u64 = 1_800_000_000_000;
const TENANT: &str = "acme";
const CLIENT_TTL: Duration = Duration::from_secs(4);
/// The leader's graces, shorter than a region's defaults (a join grace of
/// 60 s) so that a run sees nodes go not ready, get replaced and return.
const LIVENESS: LivenessRules = LivenessRules {
    join_grace_ms: 10_000,
    ready_grace_ms: 3_000,
    replace_grace_ms: 2_000,
};

fn topology(nodes: u64) -> Topology {
    let mut t = String::from(
        "[[gpu_models]]\nname = \"sim-80g\"\nmemory_mib = 81_920\nh2d_mib_per_s = 25_000\n\n\
         [cold_start]\nsetup_us = 500_000\nstorage_mib_per_s = 2_000\n\n[swap]\nsetup_us = 2_000\n\n\
         [[pools]]\nname = \"center\"\nkind = \"center\"\n",
    );
    for n in 0..nodes {
        t.push_str(&format!(
            "\n[[pools.nodes]]\nname = \"n{n}\"\ncpu_milli = 64_000\nmemory_mib = 524_288\n\
             swap_mib = 262_144\ngpus = [{{ model = \"sim-80g\", count = 2 }}]\n"
        ));
    }
    t.push_str(
        "\n[pricing]\ncurrency = \"USD\"\nunit = \"micro-USD\"\nunits_per_currency = 1_000_000\n\n\
         [pricing.tiers]\nexclusive = { discount_bp = 0 }\nguaranteed = { discount_bp = 1_500 }\n\
         burstable = { discount_bp = 3_500 }\noversubscribed = { discount_bp = 6_000 }\n\n\
         [[pricing.prices]]\ngpu_model = \"sim-80g\"\npool_kind = \"center\"\ngpu_hour = 2_000_000\n\
         memory_gib_hour = 10_000\n",
    );
    Topology::from_toml("sim", &t).expect("the simulation's topology is valid")
}

/// One region replica: its disk outlives its crashes.
struct Replica {
    id: u64,
    addr: String,
    disk: MemDisk,
    raft: Option<Raft<TypeConfig>>,
    reader: Option<StateReader>,
    /// When this replica last heard each node's agent (Unix ms, its clock;
    /// memory, lost in a crash).
    heard: BTreeMap<gshare_core::model::NodeId, u64>,
}

/// One simulated agent process: its core and its journal's disk.
struct AgentSlot {
    core: SimAgent,
    journal: SimJournal,
    /// Raised by a crash: what the crashed process had scheduled does nothing.
    epoch: u64,
    /// Registered with the region since the last restart.
    registered: bool,
    up: bool,
    /// The clock's offset (ms) at `drift.0` (simulated ms), from which it
    /// drifts at `drift.1` ppm.
    skew_ms: i64,
    drift: (u64, i64),
    /// Requests answered (run, rejected) by the cores before the last crash.
    answered_before: (u64, u64),
}

impl AgentSlot {
    /// The clock's offset at simulated time `at_ms`.
    fn skew_at(&self, at_ms: u64) -> i64 {
        let (since, ppm) = self.drift;
        let elapsed = i64::try_from(at_ms.saturating_sub(since)).unwrap_or(i64::MAX / 2);
        self.skew_ms
            .saturating_add(elapsed.saturating_mul(ppm) / 1_000_000)
    }
}

struct World {
    cfg: SimConfig,
    net: SimNet,
    replicas: Mutex<Vec<Replica>>,
    agents: Vec<Mutex<AgentSlot>>,
    /// Set once the run is checked: the agents' loops end.
    frozen: std::sync::atomic::AtomicBool,
    /// Set when the final usage is taken: the meters stop.
    metering_off: std::sync::atomic::AtomicBool,
    /// The leader's watch: nodes marked not ready, instances moved off
    /// them, instances added to underplaced functions (committed).
    watch: Mutex<(u64, u64, u64)>,
    ops: Mutex<Vec<Op>>,
    faults: Mutex<Vec<String>>,
    stop_ms: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn agent_node(i: u64) -> NodeId {
    100 + i
}

fn agent_node_id(i: u64) -> gshare_core::model::NodeId {
    gshare_core::model::NodeId(format!("n{i}"))
}

impl World {
    async fn run(cfg: SimConfig) -> SimReport {
        let net = SimNet::new(cfg.seed, EPOCH_MS);
        let replicas = (1..=cfg.replicas)
            .map(|id| Replica {
                id,
                addr: format!("10.0.0.{id}:7000"),
                disk: MemDisk::new(Duration::from_micros(200 + 300 * id)),
                raft: None,
                reader: None,
                heard: BTreeMap::new(),
            })
            .collect();
        let w = Arc::new(World {
            cfg,
            net: net.clone(),
            replicas: Mutex::new(replicas),
            agents: (0..cfg.agents)
                .map(|a| {
                    Mutex::new(AgentSlot {
                        core: SimAgent::new(agent_node_id(a)),
                        journal: SimJournal::default(),
                        epoch: 0,
                        registered: false,
                        up: true,
                        skew_ms: 0,
                        drift: (0, 0),
                        answered_before: (0, 0),
                    })
                })
                .collect(),
            frozen: std::sync::atomic::AtomicBool::new(false),
            metering_off: std::sync::atomic::AtomicBool::new(false),
            watch: Mutex::new((0, 0, 0)),
            ops: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
            stop_ms: cfg.secs * 1000,
        });
        for i in 0..cfg.replicas as usize {
            w.start_replica(i, i == 0).await;
        }
        w.setup().await;

        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(w.clone().operator()));
        tasks.push(tokio::spawn(w.clone().deployer()));
        let mut agent_tasks = Vec::new();
        for a in 0..cfg.agents {
            tasks.push(tokio::spawn(w.clone().agent_invocations(a)));
            agent_tasks.push(tokio::spawn(w.clone().agent_sender(a)));
            agent_tasks.push(tokio::spawn(w.clone().agent_timer(a)));
            agent_tasks.push(tokio::spawn(w.clone().agent_meter(a)));
            agent_tasks.push(tokio::spawn(w.clone().agent_assignments(a)));
            agent_tasks.push(tokio::spawn(w.clone().agent_heartbeats(a)));
        }
        agent_tasks.push(tokio::spawn(w.clone().leader_ticks()));
        tasks.push(tokio::spawn(w.clone().sampler()));
        tasks.push(tokio::spawn(w.clone().nemesis()));
        for t in tasks {
            let _ = t.await;
        }
        let report = w.clone().heal_and_check().await;
        for t in agent_tasks {
            let _ = t.await;
        }
        report
    }

    fn replica_count(&self) -> usize {
        self.cfg.replicas as usize
    }

    async fn start_replica(&self, i: usize, init: bool) {
        let (id, addr, disk) = {
            let r = &lock(&self.replicas)[i];
            (r.id, r.addr.clone(), r.disk.clone())
        };
        let (log, sm) = disk.open().expect("the simulated disk opens");
        let reader = sm.reader();
        let config = gshare_region::replica::raft_config(64, 16).expect("a valid Raft config");
        let links = SimLinks {
            net: self.net.clone(),
            from: id,
        };
        let raft = Raft::new(id, Arc::new(config), RaftPeers::new(links), log, sm)
            .await
            .expect("openraft starts");
        if init {
            let members: BTreeMap<u64, ReplicaNode> = lock(&self.replicas)
                .iter()
                .map(|r| {
                    (
                        r.id,
                        ReplicaNode {
                            raft_addr: r.addr.clone(),
                            http_addr: String::new(),
                        },
                    )
                })
                .collect();
            raft.initialize(members).await.expect("initialize");
        }
        self.net.set_down(id, false);
        self.net.set_raft(id, &addr, Some(raft.clone()));
        let mut reps = lock(&self.replicas);
        reps[i].raft = Some(raft);
        reps[i].reader = Some(reader);
    }

    async fn crash_replica(&self, i: usize) {
        let (id, addr, raft) = {
            let mut reps = lock(&self.replicas);
            let r = &mut reps[i];
            r.reader = None;
            r.heard.clear();
            (r.id, r.addr.clone(), r.raft.take())
        };
        let Some(raft) = raft else { return };
        self.net.set_down(id, true);
        self.net.set_raft(id, &addr, None);
        let disk = lock(&self.replicas)[i].disk.clone();
        let keep = self.net.below(disk.unflushed() as u64 + 1) as usize;
        disk.crash(keep);
        let _ = tokio::time::timeout(Duration::from_secs(5), raft.shutdown()).await;
    }

    fn leader(&self) -> Option<usize> {
        let reps = lock(&self.replicas);
        reps.iter().position(|r| {
            r.raft
                .as_ref()
                .is_some_and(|raft| raft.metrics().borrow().current_leader == Some(r.id))
        })
    }

    fn live(&self) -> Vec<usize> {
        lock(&self.replicas)
            .iter()
            .enumerate()
            .filter(|(_, r)| r.raft.is_some())
            .map(|(i, _)| i)
            .collect()
    }

    /// One write from `client` through replica `i`: its hop there, the
    /// proposer's path (forward to the leader included), the hop back.
    async fn write(&self, client: NodeId, i: usize, cmd: DomainCommand) -> (Outcome, String) {
        let (id, raft) = {
            let reps = &lock(&self.replicas)[i];
            (reps.id, reps.raft.clone())
        };
        let Some(raft) = raft else {
            return (
                Outcome::Fail("connection refused".into()),
                format!("r{id} down"),
            );
        };
        let trip = async {
            if !self.net.hop(client, id).await {
                std::future::pending::<()>().await;
            }
            let links = SimLinks {
                net: self.net.clone(),
                from: id,
            };
            let clock = self.net.clone();
            let batch = CommandBatch(vec![RegionCommand::domain(cmd)]);
            let r = commit_via(&raft, &links, batch, move || clock.unix_ms(0)).await;
            if !self.net.hop(id, client).await {
                std::future::pending::<()>().await;
            }
            r
        };
        let outcome = match tokio::time::timeout(CLIENT_TTL, trip).await {
            Err(_) => Outcome::Unknown("timed out".into()),
            Ok(Ok(b)) => match b.0.into_iter().next() {
                Some(CommandOutcome::Domain(Ok(a))) => Outcome::Ok(applied_name(&a)),
                Some(CommandOutcome::Domain(Err(e))) => Outcome::Fail(e.code().into()),
                Some(CommandOutcome::Rejected { reason }) => Outcome::Fail(reason),
                Some(other) => Outcome::Unknown(format!("{other:?}")),
                None => Outcome::Unknown("no outcome".into()),
            },
            Ok(Err(WriteError::Unknown(e))) => Outcome::Unknown(e),
            Ok(Err(WriteError::Stopped)) => Outcome::Unknown("stopped".into()),
            Ok(Err(e)) => Outcome::Fail(format!("{e}")),
        };
        self.net.note(("write", client, id, format!("{outcome}")));
        (outcome, format!("r{id}"))
    }

    fn record(&self, op: Op) {
        lock(&self.ops).push(op);
    }

    /// Records an op of one attempt, sent at `start_ms` through `via`.
    fn record_one(
        &self,
        client: &str,
        kind: OpKind,
        target: String,
        start_ms: u64,
        via: String,
        outcome: Outcome,
    ) {
        self.record(Op {
            client: client.into(),
            kind,
            target,
            args: String::new(),
            start_ms,
            end_ms: self.net.elapsed_ms(),
            attempts: 1,
            trail: vec![format!("{via} {outcome}")],
            outcome,
        });
    }

    async fn setup(&self) {
        let mut cmds = vec![DomainCommand::TopologyLoad {
            topology: topology(self.cfg.agents),
        }];
        cmds.push(DomainCommand::TenantCreate {
            tenant: TenantId(TENANT.into()),
            display_name: None,
            quotas: [(
                PoolKind::Center,
                Quota {
                    compute_milli: 6_000,
                    memory_mib: 400_000,
                    instances: 24,
                },
            )]
            .into_iter()
            .collect(),
        });
        for cmd in cmds {
            loop {
                let i = self.net.below(self.replica_count() as u64) as usize;
                match self.write(1_000, i, cmd.clone()).await.0 {
                    Outcome::Ok(_) => break,
                    _ => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
    }

    fn running(&self) -> bool {
        self.net.elapsed_ms() < self.stop_ms
    }

    async fn pause(&self, lo: u64, hi: u64) {
        let ms = lo + self.net.below(hi - lo + 1);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    /// The operator creates tenants, one attempt each.
    async fn operator(self: Arc<Self>) {
        let mut n = 0;
        while self.running() {
            self.pause(200, 900).await;
            n += 1;
            let name = format!("t{n}");
            let i = self.net.below(self.replica_count() as u64) as usize;
            let start_ms = self.net.elapsed_ms();
            let cmd = DomainCommand::TenantCreate {
                tenant: TenantId(name.clone()),
                display_name: Some(format!("v-{name}")),
                quotas: BTreeMap::new(),
            };
            let (outcome, via) = self.write(1_001, i, cmd).await;
            self.record_one(
                "operator",
                OpKind::CreateTenant,
                name,
                start_ms,
                via,
                outcome,
            );
        }
    }

    /// The tenant deploys (keyed, retried under its key while unknown) and
    /// deletes functions, planning on the contacted replica's view as the
    /// leader's scheduler plans on its own.
    async fn deployer(self: Arc<Self>) {
        let tenant = TenantId(TENANT.into());
        let mut k = 0u64;
        let mut names: Vec<String> = Vec::new();
        while self.running() {
            self.pause(100, 600).await;
            let start_ms = self.net.elapsed_ms();
            if !names.is_empty() && self.net.below(2) == 0 {
                let name = names.remove(self.net.below(names.len() as u64) as usize);
                let i = self.net.below(self.replica_count() as u64) as usize;
                let cmd = DomainCommand::FunctionDelete {
                    tenant: tenant.clone(),
                    name: name.clone(),
                };
                let (outcome, via) = self.write(1_002, i, cmd).await;
                let gone = match &outcome {
                    Outcome::Ok(_) => true,
                    Outcome::Fail(c) => !(c.contains("connection refused") || c.contains("leader")),
                    Outcome::Unknown(_) => false,
                };
                if !gone {
                    // It may still be there: delete it again later.
                    names.push(name.clone());
                }
                let target = format!("{TENANT}/{name}");
                self.record_one("deployer", OpKind::Delete, target, start_ms, via, outcome);
                continue;
            }
            k += 1;
            let name = format!("d{k}");
            // Deadlines that a cold start (0.5 s + up to 4 GiB at 2 GiB/s)
            // can meet, so requests run rather than all turn hopeless.
            let deadline_ms = 1_000 + self.net.below(4_000);
            let body = format!(
                "{{\"name\":\"{name}\",\"runtime\":\"pytorch\",\"memory_mib\":{},\
                 \"compute_milli\":{},\"tier\":\"burstable\",\"deadline_ms\":{deadline_ms}}}",
                512 * (1 + self.net.below(8)),
                50 * (1 + self.net.below(10)),
            );
            let spec = serde_json::from_str::<gshare_region::api::functions::FunctionBody>(&body)
                .expect("a valid body")
                .into_spec(tenant.clone())
                .expect("a valid spec");
            let mut trail = Vec::new();
            let mut outcome = Outcome::Unknown("not sent".into());
            let mut attempts = 0;
            let mut maybe = false;
            while attempts < 4 {
                attempts += 1;
                let i = self.net.below(self.replica_count() as u64) as usize;
                let eval = Evaluation::Deploy {
                    tenant: tenant.clone(),
                    key: format!("key-{name}"),
                    fingerprint: format!("fp-{name}-{deadline_ms}"),
                    spec: Box::new(spec.clone()),
                };
                let now = self.net.unix_ms(0);
                let decided = {
                    let reps = lock(&self.replicas);
                    reps[i]
                        .reader
                        .as_ref()
                        .map(|reader| decide_on(reader.read().region.domain(), &eval, now))
                };
                let answered = match decided {
                    None => Some((
                        Outcome::Fail("connection refused".into()),
                        format!("r{} down", i + 1),
                    )),
                    Some(Ok(cmd)) => Some(self.write(1_002, i, cmd).await),
                    // Answered without a proposal: a replay, or refused.
                    Some(Err(Ok(done))) => Some((
                        Outcome::Ok(done.applied.as_ref().map_or("nothing".into(), applied_name)),
                        format!("r{} answered", i + 1),
                    )),
                    Some(Err(Err(e))) => Some((
                        Outcome::Fail(format!("{e}").chars().take(60).collect()),
                        format!("r{} refused", i + 1),
                    )),
                };
                let Some((o, via)) = answered else {
                    continue;
                };
                trail.push(format!("{via} {o}"));
                let settled =
                    !o.is_unknown() && !matches!(&o, Outcome::Fail(c) if c == "connection refused");
                // A definite refusal after an unknown attempt stays unknown:
                // the earlier attempt may have taken effect.
                maybe |= o.is_unknown();
                outcome = match o {
                    Outcome::Fail(c) if maybe => Outcome::Unknown(format!("then refused: {c}")),
                    o => o,
                };
                if settled {
                    break;
                }
            }
            if !matches!(outcome, Outcome::Fail(_)) {
                names.push(name.clone());
            }
            self.record(Op {
                client: "deployer".into(),
                kind: OpKind::Deploy,
                target: format!("{TENANT}/{name}"),
                args: format!("deadline_ms={deadline_ms}"),
                start_ms,
                end_ms: self.net.elapsed_ms(),
                attempts,
                trail,
                outcome,
            });
        }
    }

    fn frozen(&self) -> bool {
        self.frozen.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The agent's executor clock (µs of simulated time) and its skewed
    /// Unix clock (µs), for slot `a`.
    fn agent_clocks(&self, slot: &AgentSlot) -> (Micros, u64) {
        let skew = slot.skew_at(self.net.elapsed_ms());
        (self.net.elapsed_us(), self.net.unix_ms(skew) * 1_000)
    }

    /// Delivers each completion at its time to the agent's core, unless the
    /// agent crashed meanwhile; the completions it causes are scheduled too.
    fn schedule(self: &Arc<Self>, a: u64, epoch: u64, due: Vec<Due>) {
        for d in due {
            let w = self.clone();
            tokio::spawn(async move {
                let now = w.net.elapsed_us();
                tokio::time::sleep(Duration::from_micros(d.at.saturating_sub(now))).await;
                let more = {
                    let mut slot = lock(&w.agents[a as usize]);
                    if slot.epoch != epoch {
                        return;
                    }
                    let (now, unix_us) = w.agent_clocks(&slot);
                    slot.core.step(now.max(d.at), unix_us, d.event)
                };
                w.schedule(a, epoch, more);
            });
        }
    }

    /// An agent's clients: requests for its hosted functions, 5–60 ms apart.
    async fn agent_invocations(self: Arc<Self>, a: u64) {
        while self.running() {
            self.pause(5, 60).await;
            if !self.running() {
                return;
            }
            let pick = self.net.below(1 << 20);
            let work_us = 2_000 + self.net.below(40_000);
            let (epoch, due) = {
                let mut slot = lock(&self.agents[a as usize]);
                if !slot.up {
                    continue;
                }
                let (now, unix_us) = self.agent_clocks(&slot);
                (slot.epoch, slot.core.invoke(now, unix_us, pick, work_us))
            };
            self.schedule(a, epoch, due);
        }
    }

    /// The executor's timer: woken at its `next_timeout` (or every 100 ms).
    async fn agent_timer(self: Arc<Self>, a: u64) {
        while !self.frozen() {
            let wake = {
                let slot = lock(&self.agents[a as usize]);
                let now = self.net.elapsed_us();
                slot.core
                    .next_timeout()
                    .map_or(100_000, |t| t.saturating_sub(now).clamp(1, 100_000))
            };
            tokio::time::sleep(Duration::from_micros(wake)).await;
            let (epoch, due) = {
                let mut slot = lock(&self.agents[a as usize]);
                if !slot.up {
                    continue;
                }
                let (now, unix_us) = self.agent_clocks(&slot);
                (slot.epoch, slot.core.step(now, unix_us, Event::Timer))
            };
            self.schedule(a, epoch, due);
        }
    }

    /// Every 100–300 ms the meter's drafts are written to the journal,
    /// durable after the flush (1–20 ms: the group's fsync).
    async fn agent_meter(self: Arc<Self>, a: u64) {
        while !self.metering_off.load(std::sync::atomic::Ordering::Relaxed) {
            self.pause(100, 300).await;
            let written = {
                let mut slot = lock(&self.agents[a as usize]);
                if self.metering_off.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                if !slot.up {
                    continue;
                }
                let (_, unix_us) = self.agent_clocks(&slot);
                let records = slot.core.take_usage(unix_us);
                if records.is_empty() {
                    continue;
                }
                let end = slot.journal.write(records);
                end.map(|end| (slot.epoch, end))
            };
            let Some((epoch, end)) = written else {
                continue;
            };
            let w = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_micros(1_000 + w.net.below(19_000))).await;
                let mut slot = lock(&w.agents[a as usize]);
                if slot.epoch == epoch {
                    slot.journal.flushed(end);
                }
            });
        }
    }

    /// The agent's linked replica pushes the node's assignment (read from its
    /// applied state) every 200–600 ms; a lost push is just lost.
    async fn agent_assignments(self: Arc<Self>, a: u64) {
        let node = agent_node(a);
        while !self.frozen() {
            self.pause(200, 600).await;
            let i = self.net.below(self.replica_count() as u64) as usize;
            let (id, assignment) = {
                let reps = lock(&self.replicas);
                let r = &reps[i];
                let Some(reader) = r.reader.as_ref() else {
                    continue;
                };
                let st = reader.read();
                let index = st.last_applied.map_or(0, |l| l.index);
                let a = Assignment::of_node(st.region.domain(), &agent_node_id(a), index);
                (r.id, a)
            };
            if !self.net.hop(id, node).await {
                continue;
            }
            let (epoch, due) = {
                let mut slot = lock(&self.agents[a as usize]);
                if !slot.up {
                    continue;
                }
                let (now, unix_us) = self.agent_clocks(&slot);
                (slot.epoch, slot.core.assign(now, unix_us, assignment))
            };
            self.schedule(a, epoch, due);
        }
    }

    /// The agent's link to the region: registers, then sends its sendable
    /// records through a random replica and removes what the region
    /// acknowledged.
    async fn agent_sender(self: Arc<Self>, a: u64) {
        let node = agent_node(a);
        let agent = gshare_core::state::AgentId(format!("agent-{a}"));
        while !self.frozen() {
            self.pause(20, 100).await;
            let (up, registered) = {
                let slot = lock(&self.agents[a as usize]);
                (slot.up, slot.registered)
            };
            if !up {
                continue;
            }
            let i = self.net.below(self.replica_count() as u64) as usize;
            if !registered {
                let cmd = DomainCommand::AgentRegister {
                    agent: agent.clone(),
                    node: agent_node_id(a),
                    version: "sim".into(),
                };
                if let (Outcome::Ok(answer), _) = self.write(node, i, cmd).await {
                    let next: u64 = answer
                        .strip_prefix("registered next_seq=")
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(1);
                    let mut slot = lock(&self.agents[a as usize]);
                    if slot.up {
                        slot.journal.reconcile(next);
                        slot.registered = true;
                    }
                }
                continue;
            }
            let (batch, epoch) = {
                let mut slot = lock(&self.agents[a as usize]);
                let planted = self.cfg.planted == Planted::UsageBeforeFsync;
                (slot.journal.batch(64, planted), slot.epoch)
            };
            if batch.is_empty() {
                continue;
            }
            let seqs: Vec<u64> = batch.iter().map(|r| r.seq).collect();
            let cmd = DomainCommand::UsageBatch {
                agent: agent.clone(),
                records: batch,
            };
            if let (Outcome::Ok(_), _) = self.write(node, i, cmd).await {
                let mut slot = lock(&self.agents[a as usize]);
                if slot.epoch == epoch {
                    slot.journal.ack(&seqs);
                }
            }
        }
    }

    /// An agent's heartbeat every 200–400 ms to a random replica, which
    /// notes when it heard the node (by its own clock, as `AgentHub` does).
    async fn agent_heartbeats(self: Arc<Self>, a: u64) {
        let node = agent_node(a);
        while !self.frozen() {
            self.pause(200, 400).await;
            if !lock(&self.agents[a as usize]).up {
                continue;
            }
            let i = self.net.below(self.replica_count() as u64) as usize;
            let id = lock(&self.replicas)[i].id;
            if self.net.hop(node, id).await {
                let now = self.net.unix_ms(0);
                let mut reps = lock(&self.replicas);
                if reps[i].raft.is_some() {
                    reps[i].heard.insert(agent_node_id(a), now);
                }
            }
        }
    }

    /// One proposal by replica `i` itself (no client hop), within the
    /// client deadline; whether it was applied.
    async fn propose_at(&self, i: usize, cmd: DomainCommand) -> bool {
        let (id, raft) = {
            let r = &lock(&self.replicas)[i];
            (r.id, r.raft.clone())
        };
        let Some(raft) = raft else { return false };
        let links = SimLinks {
            net: self.net.clone(),
            from: id,
        };
        let clock = self.net.clone();
        let batch = CommandBatch(vec![RegionCommand::domain(cmd)]);
        let r = tokio::time::timeout(
            CLIENT_TTL,
            commit_via(&raft, &links, batch, move || clock.unix_ms(0)),
        )
        .await;
        let ok =
            matches!(&r, Ok(Ok(b)) if matches!(b.0.first(), Some(CommandOutcome::Domain(Ok(_)))));
        self.net.note(("leader", id, ok));
        ok
    }

    /// The leader's liveness watch and underplaced tick, as the region's
    /// scheduler runs them: every 0.5 s the leader gathers when each node
    /// was heard (its own and, over the network, its peers'), commits the
    /// nodes' ready states with `liveness_changes`, replaces the instances
    /// of a node not ready past its grace, and places more instances of a
    /// function below its `min_instances`, each decided by `decide_on`.
    async fn leader_ticks(self: Arc<Self>) {
        let mut watching: Option<(u64, u64)> = None;
        let mut heard_times = HeardTimes::default();
        while !self.frozen() {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let Some(l) = self.leader() else {
                watching = None;
                continue;
            };
            let (lid, mut heard) = {
                let r = &lock(&self.replicas)[l];
                (r.id, r.heard.clone())
            };
            let since = match watching {
                Some((who, since)) if who == lid => since,
                _ => {
                    let now = self.net.unix_ms(0);
                    watching = Some((lid, now));
                    heard_times = HeardTimes::default();
                    now
                }
            };
            for p in 0..self.replica_count() {
                let pid = lock(&self.replicas)[p].id;
                if pid == lid || !self.net.hop(lid, pid).await {
                    continue;
                }
                let theirs = {
                    let r = &lock(&self.replicas)[p];
                    r.raft.is_some().then(|| r.heard.clone())
                };
                if let Some(theirs) = theirs {
                    if self.net.hop(pid, lid).await {
                        for (n, t) in theirs {
                            let e = heard.entry(n).or_insert(t);
                            *e = (*e).max(t);
                        }
                    }
                }
            }
            let now = self.net.unix_ms(0);
            let Some(view) = self.state_of(l) else {
                continue;
            };
            let view = view.domain();
            let heard = heard_times.merge(heard, view);
            let (marks, mut evals) = watch_plan(view, heard, since, now, &LIVENESS);
            let commands: Vec<DomainCommand> = marks
                .into_iter()
                .map(|(node, ready)| DomainCommand::NodeReadySet { node, ready })
                .collect();
            // The underplaced tick's work, as `scheduler::underplaced_tick`.
            evals.extend(
                view.underplaced()
                    .into_iter()
                    .map(|(tenant, function, _)| Evaluation::Underplaced { tenant, function }),
            );
            for cmd in commands {
                let down = matches!(cmd, DomainCommand::NodeReadySet { ready: false, .. });
                if self.propose_at(l, cmd).await && down {
                    lock(&self.watch).0 += 1;
                }
            }
            for eval in evals {
                let now = self.net.unix_ms(0);
                let Some(view) = self.state_of(l) else {
                    break;
                };
                let moved = matches!(eval, Evaluation::NodeNotReady { .. });
                if let Ok(cmd) = decide_on(view.domain(), &eval, now) {
                    if self.propose_at(l, cmd).await {
                        let mut w = lock(&self.watch);
                        if moved {
                            w.1 += 1;
                        } else {
                            w.2 += 1;
                        }
                    }
                }
            }
        }
    }

    /// Checks every live replica's applied state against quotas and capacity.
    async fn sampler(self: Arc<Self>) {
        while self.running() {
            self.pause(300, 700).await;
            let broken: Vec<(u64, String)> = lock(&self.replicas)
                .iter()
                .filter_map(|r| {
                    let st = r.reader.as_ref()?.read();
                    st.region
                        .domain()
                        .check_invariants()
                        .err()
                        .map(|why| (r.id, why))
                })
                .collect();
            for (id, why) in broken {
                let at = self.net.elapsed_ms();
                self.record(Op {
                    client: "sampler".into(),
                    kind: OpKind::Sample,
                    target: format!("r{id}"),
                    args: String::new(),
                    start_ms: at,
                    end_ms: at,
                    attempts: 1,
                    trail: Vec::new(),
                    outcome: Outcome::Fail(why),
                });
            }
        }
    }

    fn fault(&self, what: String) {
        self.net.note(("fault", what.clone()));
        let at = self.net.elapsed_ms();
        lock(&self.faults).push(format!("{at} ms: {what}"));
    }

    /// One fault at a time, each for 1–6 s, then healed.
    async fn nemesis(self: Arc<Self>) {
        self.pause(1_000, 3_000).await;
        while self.running() {
            let n = self.replica_count();
            let hold = Duration::from_millis(1_000 + self.net.below(5_000));
            // An agent's outage is 2–9 s: past the leader's ready and
            // replace graces (3 + 2 s) about half the time.
            let outage = Duration::from_millis(2_000 + self.net.below(7_000));
            match self.net.below(9) {
                0 => {
                    let w = Weather {
                        loss: 0.05 + 0.25 * self.net.unit(),
                        dup: 0.2 * self.net.unit(),
                        delay_ms: (1, 5 + self.net.below(80)),
                    };
                    self.fault(format!("weather {w:?}"));
                    self.net.set_weather(w);
                    tokio::time::sleep(hold).await;
                }
                1 | 2 => {
                    let i = self.net.below(n as u64) as usize + 1;
                    let one_way = self.net.below(2) == 0;
                    self.fault(format!(
                        "partition: r{i} cut off{}",
                        if one_way { " (its outbound only)" } else { "" }
                    ));
                    let others: Vec<NodeId> = (1..=n as u64)
                        .chain((0..self.cfg.agents).map(agent_node))
                        .chain(1_000..1_003)
                        .filter(|x| *x != i as u64)
                        .collect();
                    for o in &others {
                        self.net.set_cut(i as u64, *o, true);
                        if !one_way {
                            self.net.set_cut(*o, i as u64, true);
                        }
                    }
                    tokio::time::sleep(hold).await;
                }
                3 | 4 => {
                    let victim = if self.net.below(2) == 0 {
                        self.leader()
                    } else {
                        Some(self.net.below(n as u64) as usize)
                    };
                    if let Some(i) = victim {
                        self.fault(format!("crash r{}", i + 1));
                        self.crash_replica(i).await;
                        tokio::time::sleep(hold).await;
                        self.fault(format!("restart r{}", i + 1));
                        self.start_replica(i, false).await;
                    }
                }
                5 => {
                    self.fault("crash every replica".into());
                    for i in 0..n {
                        self.crash_replica(i).await;
                    }
                    tokio::time::sleep(hold / 4).await;
                    self.fault("restart every replica".into());
                    for i in 0..n {
                        self.start_replica(i, false).await;
                    }
                }
                6 => {
                    let a = self.net.below(self.cfg.agents);
                    self.fault(format!("crash agent-{a}"));
                    {
                        let mut slot = lock(&self.agents[a as usize]);
                        slot.up = false;
                        slot.registered = false;
                        slot.epoch += 1;
                        let (run, rejected) = slot.core.answered;
                        slot.answered_before.0 += run;
                        slot.answered_before.1 += rejected;
                        slot.core = SimAgent::new(agent_node_id(a));
                        let unflushed =
                            slot.journal.held.values().filter(|(_, d)| !*d).count() as u64;
                        let keep = self.net.below(unflushed + 1) as usize;
                        slot.journal.crash(keep);
                    }
                    self.net.set_down(agent_node(a), true);
                    tokio::time::sleep(outage).await;
                    self.net.set_down(agent_node(a), false);
                    lock(&self.agents[a as usize]).up = true;
                    self.fault(format!("restart agent-{a}"));
                }
                7 => {
                    let a = self.net.below(self.cfg.agents);
                    self.fault(format!("agent-{a} cut off from the region"));
                    for r in 1..=n as u64 {
                        self.net.set_cut(agent_node(a), r, true);
                        self.net.set_cut(r, agent_node(a), true);
                    }
                    tokio::time::sleep(outage).await;
                }
                _ => {
                    // The agent's clock jumps by up to ±1 h, then drifts at
                    // up to ±2 % (±20 ms per s) until the next such fault.
                    let a = self.net.below(self.cfg.agents);
                    let skew = self.net.below(7_200_001) as i64 - 3_600_000;
                    let drift_ppm = self.net.below(40_001) as i64 - 20_000;
                    self.fault(format!(
                        "agent-{a} clock steps {skew} ms, drifts {drift_ppm} ppm"
                    ));
                    let mut slot = lock(&self.agents[a as usize]);
                    slot.skew_ms = slot.skew_at(self.net.elapsed_ms()) + skew;
                    slot.drift = (self.net.elapsed_ms(), drift_ppm);
                }
            }
            self.net.heal();
            self.pause(500, 2_000).await;
        }
    }

    /// Heals everything, restarts whatever is down, lets the agents drain,
    /// then checks.
    async fn heal_and_check(self: Arc<Self>) -> SimReport {
        self.net.heal();
        for i in 0..self.replica_count() {
            if !self.live().contains(&i) {
                self.start_replica(i, false).await;
            }
        }
        let mut violations = Vec::new();
        // Liveness: a new write is acknowledged within 30 s of healing.
        let probe_until = self.net.elapsed_ms() + 30_000;
        let mut probed = false;
        while self.net.elapsed_ms() < probe_until {
            let i = self.net.below(self.replica_count() as u64) as usize;
            let cmd = DomainCommand::TenantCreate {
                tenant: TenantId("probe".into()),
                display_name: Some("v-probe".into()),
                quotas: BTreeMap::new(),
            };
            match self.write(1_000, i, cmd).await.0 {
                Outcome::Ok(_) | Outcome::Fail(_)
                    if self.state_of(i).is_some_and(|s| {
                        s.domain().tenant(&TenantId("probe".into())).is_some()
                    }) =>
                {
                    probed = true;
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        if !probed {
            violations.push(Violation {
                invariant: "the healed region serves",
                detail: "no write acknowledged within 30 s of healing".into(),
                excerpt: lock(&self.faults).join("\n"),
            });
        }
        // The agents answer every request they accepted (run or rejected).
        let requests_until = self.net.elapsed_ms() + 20_000;
        while self.net.elapsed_ms() < requests_until
            && self
                .agents
                .iter()
                .any(|s| !lock(s).core.outstanding.is_empty())
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (a, s) in self.agents.iter().enumerate() {
            let n = lock(s).core.outstanding.len();
            if n > 0 {
                violations.push(Violation {
                    invariant: "every accepted request is answered",
                    detail: format!("agent-{a}: {n} requests neither run nor rejected"),
                    excerpt: String::new(),
                });
            }
        }
        // The meters stop; what they hold is journaled and flushed, and the
        // senders drain the journals.
        self.metering_off
            .store(true, std::sync::atomic::Ordering::Relaxed);
        for s in &self.agents {
            let mut slot = lock(s);
            let (_, unix_us) = self.agent_clocks(&slot);
            let records = slot.core.take_usage(unix_us);
            if let Some(end) = slot.journal.write(records) {
                slot.journal.flushed(end);
            }
        }
        let agents_until = self.net.elapsed_ms() + 60_000;
        while self.net.elapsed_ms() < agents_until
            && !self.agents.iter().all(|s| {
                let s = lock(s);
                s.registered && s.journal.drained()
            })
        {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        // The leader's watch settles: every node ready again, and no
        // function below its minimum while there is room for it.
        let settle_until = self.net.elapsed_ms() + 20_000;
        while self.net.elapsed_ms() < settle_until
            && self
                .leader()
                .and_then(|l| self.state_of(l))
                .is_none_or(|s| !self.unsettled(s.domain(), self.net.unix_ms(0)).is_empty())
        {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        // Replicas agree: every replica reaches the same applied index and state.
        let mut states;
        let agree_until = self.net.elapsed_ms() + 20_000;
        loop {
            states = (0..self.replica_count())
                .filter_map(|i| self.applied(i))
                .collect::<Vec<_>>();
            let same_index =
                states.len() == self.replica_count() && states.windows(2).all(|w| w[0].0 == w[1].0);
            if same_index || self.net.elapsed_ms() > agree_until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if states.len() != self.replica_count() || states.windows(2).any(|w| w[0] != w[1]) {
            violations.push(Violation {
                invariant: "replicas agree",
                detail: format!(
                    "applied indexes {:?}, states equal: {}",
                    states.iter().map(|s| s.0).collect::<Vec<_>>(),
                    states.windows(2).all(|w| w[0].1 == w[1].1)
                ),
                excerpt: String::new(),
            });
        }
        let ops = {
            let mut ops = lock(&self.ops).clone();
            ops.sort_by_key(|o| (o.start_ms, o.end_ms));
            ops
        };
        let mut billed = 0;
        if let Some((_, state)) = states.first() {
            let domain = state.domain();
            violations.extend(checker::tenants(&ops, domain));
            violations.extend(checker::functions(&ops, domain, TENANT, &[]));
            violations.extend(checker::samples(&ops));
            if let Err(why) = domain.check_invariants() {
                violations.push(Violation {
                    invariant: "quota and GPU capacity never exceeded on a sampled state",
                    detail: format!("final state: {why}"),
                    excerpt: String::new(),
                });
            }
            // Exactly-once billing: the region billed exactly the records
            // the agents' journals made durable (a record lost and replaced
            // under its number, or billed twice, shows in the sums).
            let tenant = TenantId(TENANT.into());
            let region = domain
                .meter()
                .lines(&tenant, 0, u64::MAX)
                .fold(Usage::default(), |acc, l| {
                    acc.checked_add(&l.usage).unwrap_or(acc)
                });
            let mut journals = Usage::default();
            let mut unacked = 0;
            for s in &self.agents {
                let s = lock(s);
                unacked += s.journal.held.len();
                for r in s.journal.ledger.values() {
                    journals = journals
                        .checked_add(&Usage {
                            compute_milli_gpu_ms: r.compute_milli_gpu_ms,
                            memory_mib_ms: r.memory_mib_ms,
                            invocations: r.invocations,
                        })
                        .unwrap_or(journals);
                }
            }
            billed = region.invocations;
            for (a, s) in self.agents.iter().enumerate() {
                let reused = &lock(s).journal.reused;
                if !reused.is_empty() {
                    violations.push(Violation {
                        invariant: "exactly-once billing",
                        detail: format!("agent-{a} handed out numbers twice: {reused:?}"),
                        excerpt: lock(&self.faults).join("\n"),
                    });
                }
            }
            if region != journals || unacked > 0 {
                violations.push(Violation {
                    invariant: "exactly-once billing",
                    detail: format!(
                        "the region billed {region:?}; the agents' journals hold {journals:?} \
                         ({unacked} records not acknowledged)"
                    ),
                    excerpt: lock(&self.faults).join("\n"),
                });
            }
            for why in self.unsettled(domain, self.net.unix_ms(0)) {
                violations.push(Violation {
                    invariant: "the leader's watch settles after healing",
                    detail: why,
                    excerpt: lock(&self.faults).join("\n"),
                });
            }
            // Assignment reconciliation: each agent hosts exactly what the
            // region assigns its node, once the pushes (every 0.2–0.6 s)
            // have caught up.
            let index = states.first().map_or(0, |s| s.0);
            let assigned_until = self.net.elapsed_ms() + 10_000;
            while self.net.elapsed_ms() < assigned_until
                && self.agents.iter().enumerate().any(|(a, s)| {
                    let want = Assignment::of_node(domain, &agent_node_id(a as u64), index);
                    lock(s).core.matches(want).is_err()
                })
            {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            for (a, s) in self.agents.iter().enumerate() {
                let s = lock(s);
                let want = Assignment::of_node(domain, &agent_node_id(a as u64), index);
                if let Err(why) = s.core.matches(want) {
                    violations.push(Violation {
                        invariant: "agents host what the region assigns",
                        detail: format!("agent-{a}: {why}"),
                        excerpt: String::new(),
                    });
                }
            }
        }
        for i in 0..self.replica_count() {
            self.crash_replica(i).await;
        }
        for v in &violations {
            self.net.note(("violation", v.invariant, v.detail.clone()));
        }
        self.frozen
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let faults = lock(&self.faults).clone();
        SimReport {
            seed: self.cfg.seed,
            sim_secs: self.net.elapsed_ms() as f64 / 1000.0,
            digest: self.net.digest(),
            ops,
            net: self.net.counts(),
            faults,
            billed,
            watch: *lock(&self.watch),
            lost_writes: (
                lock(&self.replicas)
                    .iter()
                    .map(|r| r.disk.lost_writes())
                    .sum(),
                self.agents.iter().map(|s| lock(s).journal.lost).sum(),
            ),
            requests: self.agents.iter().fold((0, 0), |acc, s| {
                let s = lock(s);
                let (done, rejected) = s.core.answered;
                (
                    acc.0 + done + s.answered_before.0,
                    acc.1 + rejected + s.answered_before.1,
                )
            }),
            violations,
        }
    }

    /// What keeps `domain` from settled: a node not ready, or a function
    /// below `min_instances` that the scheduler would place now.
    fn unsettled(&self, domain: &gshare_core::state::RegionState, now: u64) -> Vec<String> {
        let mut out = Vec::new();
        for a in 0..self.cfg.agents {
            let node = agent_node_id(a);
            let state = domain.node_status(&node).map(|s| s.state);
            if state != Some(NodeState::Ready) {
                out.push(format!("node {} is {state:?}", node.0));
            }
        }
        for (tenant, function, _) in domain.underplaced() {
            let what = format!("{}/{function}", tenant.0);
            let eval = Evaluation::Underplaced { tenant, function };
            if decide_on(domain, &eval, now).is_ok() {
                out.push(format!("{what} is below its minimum with room for it"));
            }
        }
        out
    }

    fn state_of(&self, i: usize) -> Option<gshare_raft_store::RegionState> {
        let reps = lock(&self.replicas);
        let region = reps[i].reader.as_ref()?.read().region.clone();
        Some(region)
    }

    fn applied(&self, i: usize) -> Option<(u64, gshare_raft_store::RegionState)> {
        let reps = lock(&self.replicas);
        let st = reps[i].reader.as_ref()?.read();
        Some((st.last_applied.map_or(0, |l| l.index), st.region.clone()))
    }
}

fn applied_name(a: &Applied) -> String {
    match a {
        Applied::AgentRegistered { next_seq, .. } => format!("registered next_seq={next_seq}"),
        other => format!("{other:?}").chars().take(60).collect(),
    }
}
