//! Metering and autonomy with real processes: a 3-replica region and one
//! `gshare-edge` agent whose link to every replica runs through a
//! [`FaultProxy`].
//!
//! - `cut_off_agent_keeps_serving_and_bill_matches`: the agent is cut off
//!   from the region for 30 s under load; every invocation still succeeds
//!   (tokens are checked locally, usage is journaled); after healing, the
//!   journal drains and the region's usage for the tenant equals the
//!   agent's own durable totals exactly, the bill is the price of those
//!   totals, and the invocation count is the client's count of successes.
//! - `kill9_agent_mid_load_loses_no_journaled_record`: kill -9 of the agent
//!   under load; the journal read offline (J) is what the region bills once
//!   the restarted agent has drained it, exactly; successes ≤ J ≤
//!   successes + requests that failed at the kill.
//!
//! The first also checks the gateway's rule: usage on a connection that
//! did not register as that agent is refused without retry.
//!
//! The agent names its GPU model otherwise than the topology (`SIM_GPU_16G`
//! against `sim-gpu-16g`, as NVML's names differ from a catalog's) and has a pool kind in its config
//! that its node's pool does not have: every figure above holds only if the
//! region prices usage by the topology's names and kinds.
//!
//! No timing is asserted: waits have generous deadlines and only the
//! figures are compared.

use gshare_core::config::{Topology, Usage};
use gshare_core::model::{GpuId, NodeId, TenantId, Tier};
use gshare_core::protocol::{AgentMessage, AgentMessageV1, RegionMessage, RegionMessageV1};
use gshare_core::state::{AgentId, UsageRecord};
use gshare_edge::journal::{TenantTotals, UsageJournal};
use gshare_region::http_client::{request, HttpReply};
use gshare_tests::{FaultProxy, ProxyLimits, TestRegion, TOKEN};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const FUNCTION: &str = "metered";

fn call(addr: SocketAddr, method: &str, path: &str, token: &str, body: Option<&str>) -> HttpReply {
    request(
        addr,
        method,
        path,
        Some(token),
        body,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| HttpReply {
        status: 0,
        body: e.to_string(),
        ..HttpReply::default()
    })
}

fn json_of(r: &HttpReply) -> Value {
    serde_json::from_str(&r.body).unwrap_or(Value::Null)
}

/// Polls `f` every 200 ms until it returns `Some`, for at most `secs`.
fn until<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A region, proxies in front of its replicas, and one agent behind them.
struct Stand {
    region: TestRegion,
    proxies: Vec<FaultProxy>,
    rt: tokio::runtime::Runtime,
    acme: String,
    node: String,
    ingress: SocketAddr,
    config: PathBuf,
    agent: Option<Child>,
    agent_starts: u32,
}

impl Stand {
    fn new(seed: u64) -> Stand {
        // The agent is cut off (or dead) far longer than the default
        // replace grace: keep its function where it is, as autonomy is
        // what this file tests (node liveness moves it: tests/tests/liveness.rs).
        let mut region =
            TestRegion::with_config(3, "node_replace_grace_ms = 600000\n").expect("region");
        for id in 1..=3 {
            region.start(id, id == 1).expect("start");
        }
        region
            .wait_leader(&[1, 2, 3], Duration::from_secs(30))
            .expect("leader");
        let http = region.http(1);
        until("tenants loaded", 30, || {
            let r = call(http, "GET", "/v1/tenants", TOKEN, None);
            json_of(&r)
                .as_array()
                .is_some_and(|a| a.len() == 2)
                .then_some(())
        });
        let r = until("token", 30, || {
            let r = call(http, "POST", "/v1/tenants/acme/tokens", TOKEN, None);
            (r.status == 201).then_some(r)
        });
        let acme = json_of(&r)["token"].as_str().unwrap().to_string();
        let f = json!({
            "name": FUNCTION, "runtime": "pytorch", "memory_mib": 3000, "compute_milli": 400,
            "tier": "guaranteed", "deadline_ms": 5000, "pool": "center", "min_instances": 1,
            "latency": {"full_gpu_us": 2000, "saturation_milli": 400},
        })
        .to_string();
        let r = until("deploy", 30, || {
            let r = call(http, "POST", "/v1/functions", &acme, Some(&f));
            (r.status != 0 && r.status != 503).then_some(r)
        });
        assert!(r.status == 200 || r.status == 201, "{r:?}");
        let node = until("placed", 30, || {
            let r = call(http, "GET", "/v1/cluster/state", TOKEN, None);
            let instances = json_of(&r)["instances"].to_string();
            ["local-c1", "local-c2"]
                .into_iter()
                .find(|n| instances.contains(&format!("\"{n}\"")))
        })
        .to_string();
        let certs = region.certs();
        let (ok, out) = region
            .gsharectl(&[
                "certs",
                "issue",
                "--dir",
                certs.to_str().unwrap(),
                "--name",
                &node,
            ])
            .unwrap();
        assert!(ok, "{out}");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let proxies: Vec<FaultProxy> = region
            .replicas
            .values()
            .enumerate()
            .map(|(i, r)| {
                rt.block_on(FaultProxy::start_with(
                    "127.0.0.1:0".parse().unwrap(),
                    r.raft_addr,
                    seed + i as u64,
                    ProxyLimits::default(),
                ))
                .expect("proxy")
            })
            .collect();
        let ingress = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let replicas: String = proxies
            .iter()
            .map(|p| format!("[[replicas]]\nquic_addr = \"{}\"\n", p.addr()))
            .collect();
        // The agent names its GPUs otherwise than the topology
        // (`SIM_GPU_16G` for `sim-gpu-16g`, as NVML says `NVIDIA
        // A100-SXM4-80GB` for a catalog's `A100-SXM4-80GB`; registration
        // accepts both) and its config has a pool kind its node's pool
        // does not have: the region prices its usage by the topology's
        // name and kind (`usage_as_configured`), so the bill below is the
        // center price (the edge price is higher; an unknown name is
        // unpriced, which refused every batch and billed nothing).
        let config = region.root().join("agent.toml");
        std::fs::write(
            &config,
            format!(
                r#"node = "{node}"
pool = "center"
pool_kind = "edge"
data_dir = "data/agent"
ingress_addr = "{ingress}"
host_swap_mib = 8192
heartbeat_ms = 200
[metering]
interval_ms = 200
[gpus]
backend = "simulated"
[[gpus.simulated]]
model = "SIM_GPU_16G"
memory_mib = 16384
h2d_mib_per_s = 12000
count = 2
[load]
cold_setup_us = 20000
{replicas}
[tls]
ca_cert = "certs/ca.pem"
cert = "certs/{node}.pem"
key = "certs/{node}.key"
"#
            ),
        )
        .unwrap();
        let mut stand = Stand {
            region,
            proxies,
            rt,
            acme,
            node,
            ingress,
            config,
            agent: None,
            agent_starts: 0,
        };
        stand.start_agent();
        stand
    }

    fn start_agent(&mut self) {
        self.agent_starts += 1;
        let err = std::fs::File::create(
            self.region
                .path(&format!("agent.{}.err", self.agent_starts)),
        )
        .unwrap();
        self.agent = Some(
            Command::new(gshare_tests::binary("gshare-edge"))
                .arg("--config")
                .arg(&self.config)
                .stdout(Stdio::null())
                .stderr(Stdio::from(err))
                .spawn()
                .unwrap(),
        );
    }

    fn kill9_agent(&mut self) {
        if let Some(mut c) = self.agent.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    fn invoke(&self) -> HttpReply {
        call(
            self.ingress,
            "POST",
            &format!("/v1/invoke/acme/{FUNCTION}"),
            &self.acme,
            Some("{}"),
        )
    }

    fn journal_dir(&self) -> PathBuf {
        self.region.path("data/agent/journal")
    }

    /// The agent's durable totals for acme, through its ingress.
    fn agent_totals(&self) -> Option<TenantTotals> {
        let r = call(
            self.ingress,
            "GET",
            "/v1/agent/usage/acme",
            &self.acme,
            None,
        );
        (r.status == 200).then(|| serde_json::from_str(&r.body).ok())?
    }

    fn journal_status(&self) -> Option<Value> {
        let r = call(self.ingress, "GET", "/v1/agent/journal", "", None);
        (r.status == 200).then(|| json_of(&r))
    }

    fn agent_metric(&self, name: &str) -> Option<u64> {
        // No Authorization header: the public series (an empty bearer
        // token is a malformed one, answered 401).
        let r = request(
            self.ingress,
            "GET",
            "/metrics",
            None,
            None,
            Duration::from_secs(10),
        )
        .ok()?;
        r.body
            .lines()
            .find_map(|l| l.strip_prefix(&format!("gshare_edge_{name} ")))
            .and_then(|v| v.trim().parse().ok())
    }

    fn delete_function(&self) {
        until("function deleted", 30, || {
            let r = call(
                self.region.http(1),
                "DELETE",
                &format!("/v1/functions/{FUNCTION}"),
                &self.acme,
                None,
            );
            (r.status == 200 || r.status == 204 || r.status == 404).then_some(())
        });
    }

    /// Waits until the agent hosts nothing and its journal is empty and
    /// stays so (nothing left to meter or send).
    fn wait_quiescent(&self) -> Value {
        let mut last: Option<Value> = None;
        until("agent quiescent and journal drained", 120, || {
            let s = self.journal_status()?;
            let idle = self.agent_metric("functions") == Some(0)
                && s["pending_records"] == json!(0)
                && s["region_next_seq"].as_u64().unwrap_or(0) > 0;
            let stable = last.as_ref() == Some(&s);
            last = Some(s.clone());
            (idle && stable).then_some(s)
        })
    }

    /// The region's metered usage of acme (summed over its lines), via replica `id`.
    fn region_usage(&self, id: u64) -> Option<Usage> {
        let r = call(self.region.http(id), "GET", "/v1/usage", &self.acme, None);
        if r.status != 200 {
            return None;
        }
        let mut sum = Usage::default();
        for l in json_of(&r).as_array()? {
            let u: Usage = serde_json::from_value(l["usage"].clone()).ok()?;
            sum = sum.checked_add(&u)?;
        }
        Some(sum)
    }

    /// Waits until replica `id`'s usage of acme equals `want` (it may lag
    /// the leader); returns what it has at the deadline.
    fn region_usage_converged(&self, id: u64, want: &Usage) -> Usage {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let have = self.region_usage(id).unwrap_or_default();
            if &have == want || Instant::now() > deadline {
                return have;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What `usage` on this agent's node costs at the function's tier,
    /// by the local topology's price list.
    fn price(&self, usage: &Usage) -> u64 {
        let topology =
            Topology::from_toml("topology.toml", gshare_tests::test_region::LOCAL_TOPOLOGY)
                .unwrap();
        let gpu = GpuId {
            node: NodeId(self.node.clone()),
            index: 0,
        };
        topology
            .quote(&gpu, Tier::Guaranteed, usage)
            .expect("node in topology")
            .expect("priced")
            .total
    }

    fn region_bill_total(&self, id: u64) -> u64 {
        let r = call(self.region.http(id), "GET", "/v1/bill", &self.acme, None);
        assert_eq!(r.status, 200, "{r:?}");
        json_of(&r)["total"].as_u64().expect("total")
    }
}

/// Sends one usage record for `node` to replica `addr` on a fresh mTLS
/// connection with the node's certificate, without registering first.
async fn unregistered_usage(addr: SocketAddr, root: PathBuf, node: String) -> RegionMessage {
    let certs = root.join("certs");
    let client = gshare_edge::tls::client_config(
        &certs.join("ca.pem"),
        &certs.join(format!("{node}.pem")),
        &certs.join(format!("{node}.key")),
    )
    .unwrap();
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(client);
    let conn = ep.connect(addr, "127.0.0.1").unwrap().await.unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let record = UsageRecord {
        seq: 1_000_000,
        tenant: TenantId("acme".into()),
        function: FUNCTION.into(),
        tier: Tier::Guaranteed,
        gpu_model: "sim-gpu-16g".into(),
        pool_kind: gshare_core::model::PoolKind::Center,
        compute_milli_gpu_ms: 1_000_000,
        memory_mib_ms: 0,
        invocations: 1,
        end_ms: 1,
    };
    let msg = AgentMessage::v1(AgentMessageV1::Usage {
        agent: AgentId(node),
        records: vec![record],
    });
    gshare_edge::wire::write_frame(&mut send, &msg)
        .await
        .unwrap();
    let reply = gshare_edge::wire::read_frame(&mut recv).await.unwrap();
    conn.close(0u32.into(), b"done");
    reply
}

impl Drop for Stand {
    fn drop(&mut self) {
        self.kill9_agent();
    }
}

fn usage_of(t: &TenantTotals) -> Usage {
    Usage {
        compute_milli_gpu_ms: t.compute_milli_gpu_ms,
        memory_mib_ms: t.memory_mib_ms,
        invocations: t.invocations,
    }
}

/// Client threads invoking until `stop`; counts successes and failures.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<Vec<String>>>,
}

impl Load {
    fn start(stand: &Stand, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let threads = (0..clients)
            .map(|_| {
                let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
                let (ingress, token) = (stand.ingress, stand.acme.clone());
                std::thread::spawn(move || {
                    let mut errors = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let r = call(
                            ingress,
                            "POST",
                            &format!("/v1/invoke/acme/{FUNCTION}"),
                            &token,
                            Some("{}"),
                        );
                        if r.status == 200 {
                            ok.fetch_add(1, Ordering::Relaxed);
                        } else {
                            failed.fetch_add(1, Ordering::Relaxed);
                            if errors.len() < 5 {
                                errors.push(format!("{} {}", r.status, r.body));
                            }
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    errors
                })
            })
            .collect();
        Load {
            stop,
            ok,
            failed,
            threads,
        }
    }

    /// Stops the clients; returns (successes, failures, some errors).
    fn finish(self) -> (u64, u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let errors = self
            .threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            errors,
        )
    }
}

#[test]
fn cut_off_agent_keeps_serving_and_bill_matches() {
    let stand = Stand::new(11);
    let first = until("served through the agent", 60, || {
        let r = stand.invoke();
        (r.status == 200).then_some(r)
    });
    assert_eq!(first.body, "{}");
    let load = Load::start(&stand, 4);
    std::thread::sleep(Duration::from_secs(3));
    for p in &stand.proxies {
        p.cut();
    }
    let cut_at = Instant::now();
    let ok_at_cut = load.ok.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(30));
    let ok_while_cut = load.ok.load(Ordering::Relaxed) - ok_at_cut;
    let pending_while_cut = stand
        .journal_status()
        .expect("journal status while cut off")["pending_records"]
        .as_u64()
        .unwrap_or(0);
    for p in &stand.proxies {
        p.heal();
    }
    let cut_for = cut_at.elapsed();
    std::thread::sleep(Duration::from_secs(3));
    let (ok, failed, errors) = load.finish();
    assert_eq!(failed, 0, "invocations failed: {errors:?}");
    assert!(ok_while_cut > 0, "nothing served while cut off");
    let successes = ok + 1;
    stand.delete_function();
    let journal = stand.wait_quiescent();
    let agent = stand.agent_totals().expect("agent totals");
    let want = usage_of(&agent);
    let have = stand.region_usage_converged(1, &want);
    let bill = stand.region_bill_total(1);
    let price = stand.price(&want);
    println!(
        "cut off {cut_for:?}: client successes {successes} ({ok_while_cut} while cut off, \
         journal pending then {pending_while_cut}); agent totals {agent:?}; \
         region usage {have:?}; bill {bill} micro-USD = price {price}; journal {journal}"
    );
    assert!(pending_while_cut > 0, "usage was journaled while cut off");
    assert_eq!(have, want, "region usage == the agent's own totals");
    assert_eq!(bill, price, "bill == price of the agent's totals");
    assert_eq!(agent.invocations, successes, "one invocation per success");
    assert!(agent.compute_milli_gpu_ms > 0 && agent.memory_mib_ms > 0);
    // Every replica converges on the same usage.
    for id in 2..=3 {
        assert_eq!(
            stand.region_usage_converged(id, &want),
            want,
            "replica {id}"
        );
    }
    // Usage on a connection that did not register as the agent: refused, not applied.
    let reply = stand.rt.block_on(unregistered_usage(
        stand.region.replicas[&1].raft_addr,
        stand.region.root().to_path_buf(),
        stand.node.clone(),
    ));
    match reply {
        RegionMessage::V1(RegionMessageV1::Refused { code, retry, .. }) => {
            assert_eq!((code.as_str(), retry), ("not_registered", false));
        }
        other => panic!("unregistered usage answered {other:?}"),
    }
    assert_eq!(stand.region_usage(1), Some(want), "nothing applied");
}

#[test]
fn kill9_agent_mid_load_loses_no_journaled_record() {
    let mut stand = Stand::new(23);
    until("served through the agent", 60, || {
        (stand.invoke().status == 200).then_some(())
    });
    let load = Load::start(&stand, 8);
    std::thread::sleep(Duration::from_secs(4));
    stand.kill9_agent();
    let (ok, failed, _) = load.finish();
    let successes = ok + 1;
    // The journal, read offline.
    let j = {
        let journal = UsageJournal::open(&stand.journal_dir(), AgentId(stand.node.clone()))
            .expect("open the journal offline");
        let t = journal.totals(&TenantId("acme".into())).unwrap();
        println!("journal after kill -9: {:?}", journal.status());
        t
    };
    // Nothing more for acme after the restart: its function is gone.
    stand.delete_function();
    std::thread::sleep(Duration::from_millis(500));
    stand.start_agent();
    let journal = stand.wait_quiescent();
    let want = usage_of(&j);
    let have = stand.region_usage_converged(1, &want);
    let after = stand.agent_totals().expect("agent totals after restart");
    println!(
        "kill -9 under load: successes {successes}, failed at the kill {failed}; \
         journal J {j:?}; region usage {have:?}; agent after restart {after:?}; journal {journal}"
    );
    assert_eq!(have, want, "region usage == the journal read after kill -9");
    assert_eq!(after, j, "the restarted agent added nothing for acme");
    assert!(
        successes <= j.invocations && j.invocations <= successes + failed,
        "successes {successes} <= journaled {} <= successes + failed {}",
        j.invocations,
        successes + failed
    );
    assert_eq!(stand.region_bill_total(1), stand.price(&want));
}

/// One invocation through replica `id` under `key`; the answer and its headers.
fn invoke_keyed(stand: &Stand, id: u64, key: &str) -> (HttpReply, Vec<(String, String)>) {
    gshare_region::http_client::request_with(
        stand.region.http(id),
        "POST",
        &format!("/v1/invoke/acme/{FUNCTION}"),
        Some(&stand.acme),
        &[("Idempotency-Key", key)],
        Some("{\"n\": 1}"),
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| {
        (
            HttpReply {
                status: 0,
                body: e.to_string(),
                ..HttpReply::default()
            },
            Vec::new(),
        )
    })
}

#[test]
fn invocations_through_replicas_across_agent_and_leader_kills_are_billed_as_answered() {
    let mut stand = Stand::new(31);
    until("served through a replica", 60, || {
        (invoke_keyed(&stand, 1, "warm-up").0.status == 200).then_some(())
    });
    // Clients invoke through the replicas, each invocation under its own
    // key, retrying with the same key on no answer, 502 and 503.
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(1)); // the warm-up
    let unknown = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let replayed_key: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let addrs: Vec<SocketAddr> = (1..=3).map(|i| stand.region.http(i)).collect();
    let threads: Vec<_> = (0..6)
        .map(|c| {
            let (stop, ok, unknown, refused) =
                (stop.clone(), ok.clone(), unknown.clone(), refused.clone());
            let (addrs, acme, replayed_key) =
                (addrs.clone(), stand.acme.clone(), replayed_key.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("c{c}-{i}");
                    let deadline = Instant::now() + Duration::from_secs(30);
                    let mut ambiguous = false;
                    let mut k = c as usize + i as usize;
                    let heard = loop {
                        let (r, h) = gshare_region::http_client::request_with(
                            addrs[k % addrs.len()],
                            "POST",
                            &format!("/v1/invoke/acme/{FUNCTION}"),
                            Some(&acme),
                            &[("Idempotency-Key", key.as_str())],
                            Some("{\"n\": 1}"),
                            Duration::from_secs(10),
                        )
                        .unwrap_or_else(|e| {
                            (
                                HttpReply {
                                    status: 0,
                                    body: e.to_string(),
                                    ..HttpReply::default()
                                },
                                Vec::new(),
                            )
                        });
                        let code = json_of(&r)["error"]["code"]
                            .as_str()
                            .unwrap_or("")
                            .to_string();
                        if r.status == 502 && code == "outcome_unknown" {
                            assert_eq!(json_of(&r)["error"]["retryable"], json!(true), "{r:?}");
                            assert_eq!(json_of(&r)["error"]["idempotency_key"], json!(key));
                            assert!(h.iter().any(|(n, v)| n == "idempotency-key" && *v == key));
                        }
                        match r.status {
                            200 => break Some(true),
                            0 | 502 | 503 if Instant::now() < deadline => {
                                // No answer, or an outcome not known: it may have run.
                                ambiguous |= r.status == 0 || code == "outcome_unknown";
                                k += 1;
                                std::thread::sleep(Duration::from_millis(100));
                            }
                            0 | 502 | 503 => break None,
                            _ => break Some(false),
                        }
                    };
                    match heard {
                        Some(true) => {
                            ok.fetch_add(1, Ordering::Relaxed);
                            replayed_key.lock().unwrap().get_or_insert(key);
                        }
                        Some(false) if !ambiguous => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {
                            unknown.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    stand.kill9_agent();
    std::thread::sleep(Duration::from_millis(1_500));
    stand.start_agent();
    std::thread::sleep(Duration::from_secs(4));
    let leader = stand
        .region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    stand.region.kill9(leader).expect("kill leader");
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("client");
    }
    let survivor = (1..=3).find(|i| *i != leader).unwrap();
    // A key that succeeded, sent again: the stored answer, not a second run.
    let key = replayed_key.lock().unwrap().clone().expect("a success");
    let before = stand.agent_totals().expect("agent totals").invocations;
    let (again, h) = invoke_keyed(&stand, survivor, &key);
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.body, "{\"n\": 1}");
    assert!(
        h.iter().any(|(n, v)| n == "x-gshare-replayed" && v == "1"),
        "{h:?}"
    );
    let (ok, unknown, refused) = (
        ok.load(Ordering::Relaxed),
        unknown.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    );
    until("function deleted", 30, || {
        let r = call(
            stand.region.http(survivor),
            "DELETE",
            &format!("/v1/functions/{FUNCTION}"),
            &stand.acme,
            None,
        );
        (r.status == 200 || r.status == 404).then_some(())
    });
    let journal = stand.wait_quiescent();
    let after = stand.agent_totals().expect("agent totals");
    assert_eq!(after.invocations, before, "the replay ran nothing");
    let want = usage_of(&after);
    let billed = stand.region_usage_converged(survivor, &want).invocations;
    println!(
        "invocations through replicas across an agent kill and a leader kill: \
         successes {ok}, unknown {unknown}, refused {refused}; region bills {billed}; \
         journal {journal}"
    );
    assert!(
        ok <= billed && billed <= ok + unknown,
        "successes {ok} <= billed {billed} <= successes + unknown {}",
        ok + unknown
    );
}
