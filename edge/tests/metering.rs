//! Metering in an in-process agent (NodeAgent with a journal, GPU and
//! instance actors, sim driver, HTTP ingress; no region link): a result is
//! released only after its usage is on disk, the tenant's totals endpoint
//! checks tokens, residency stops accruing when the instance is released,
//! a journal that cannot append withholds results (fail closed), an
//! assignment older than the one applied (a lagging replica's, after a
//! reconnect) never removes instances, and usage is stamped by the agent's
//! clock (a `ManualClock` here).

use gshare_core::clock::{ManualClock, SharedClock, SystemClock};
use gshare_core::model::{
    FunctionSpec, GpuId, LatencyProfile, NodeId, PoolKind, PoolPreference, Runtime, Slice,
    TenantId, Tier,
};
use gshare_core::protocol::{AssignedInstance, Assignment, TenantTokens, TokenDigests};
use gshare_core::state::{AgentId, InstanceId};
use gshare_edge::agent::{
    ApplyAssignment, ApplyTokens, FlushUsage, Metering, NodeAgent, NodeSetup,
};
use gshare_edge::gpu::GpuInfo;
use gshare_edge::ingress;
use gshare_edge::journal::UsageJournal;
use gshare_edge::runtime::SimDriver;
use gshare_edge::token::token_digest;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

const ACME: &str = "acme-token";
const GLOBEX: &str = "globex-token";

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// Blocking HTTP/1.1 request with `Connection: close`: (status, body).
fn http(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 2\r\nConnection: close\r\n\r\nhi"
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

async fn call(
    addr: SocketAddr,
    method: &'static str,
    path: &str,
    token: Option<&'static str>,
) -> (u16, String) {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || http(addr, method, &path, token))
        .await
        .unwrap()
}

fn spec() -> FunctionSpec {
    FunctionSpec {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        tenant: TenantId("acme".into()),
        name: "echo".into(),
        runtime: Runtime::Custom,
        memory_mib: 1024,
        compute_milli: 500,
        tier: Tier::Burstable,
        deadline_ms: 5_000,
        pool: PoolPreference::Any,
        min_instances: 1,
        max_instances: 1,
        idle_timeout_s: 600,
        latency: LatencyProfile {
            full_gpu_us: 2_000,
            saturation_milli: 500,
        },
    }
}

struct Stand {
    ingress: SocketAddr,
    agent: actix::Addr<NodeAgent>,
    journal: Arc<UsageJournal>,
    _dir: tempfile::TempDir,
}

fn start() -> Stand {
    start_with(Duration::from_millis(50))
}

fn start_with(interval: Duration) -> Stand {
    start_on(interval, SystemClock::shared())
}

fn start_on(interval: Duration, clock: SharedClock) -> Stand {
    let dir = tempfile::tempdir().unwrap();
    let journal = Arc::new(UsageJournal::open(dir.path(), AgentId("n1".into())).unwrap());
    let metering = Metering {
        journal: journal.clone(),
        appended: Arc::default(),
        interval,
        pool_kind: PoolKind::Edge,
    };
    let agent = actix::Actor::start(
        NodeAgent::new(NodeSetup {
            node: NodeId("n1".into()),
            gpus: vec![GpuInfo {
                index: 0,
                model: "sim-a".into(),
                memory_mib: 16_384,
                h2d_mib_per_s: 600_000,
            }],
            host_swap_mib: 65_536,
            load: gshare_core::config::AgentLoadCosts {
                swap_setup_us: 1_000,
                cold_setup_us: 5_000,
                storage_mib_per_s: 100_000,
            },
            driver: Box::new(|_| Box::new(SimDriver::new())),
            process_counters: Default::default(),
            clock,
        })
        .with_metering(metering),
    );
    let ingress = free_port();
    let server = ingress::serve_metered(ingress, agent.clone(), 1, Some(journal.clone())).unwrap();
    actix_rt::spawn(server);
    agent.do_send(ApplyTokens(TokenDigests {
        applied_index: 1,
        tenants: ["acme", "globex"]
            .into_iter()
            .zip([ACME, GLOBEX])
            .map(|(t, k)| TenantTokens {
                tenant: TenantId(t.into()),
                digests: vec![token_digest(k)],
            })
            .collect(),
    }));
    assign(&agent, 1, true);
    Stand {
        ingress,
        agent,
        journal,
        _dir: dir,
    }
}

fn assign(agent: &actix::Addr<NodeAgent>, index: u64, hosted: bool) {
    let instances = if hosted {
        vec![AssignedInstance {
            instance: InstanceId(1),
            spec: spec(),
            version: 1,
            slices: vec![Slice {
                gpu: GpuId {
                    node: NodeId("n1".into()),
                    index: 0,
                },
                compute_milli: 500,
                memory_mib: 1024,
            }],
        }]
    } else {
        Vec::new()
    };
    agent.do_send(ApplyAssignment(Assignment {
        applied_index: index,
        instances,
    }));
}

fn acme_totals(j: &UsageJournal) -> gshare_edge::journal::TenantTotals {
    j.totals(&TenantId("acme".into())).unwrap()
}

#[actix_rt::test]
async fn results_are_released_after_their_usage_is_journaled() {
    let s = start();
    let mut served = 0u64;
    for _ in 0..200 {
        let (status, body) = call(s.ingress, "POST", "/v1/invoke/acme/echo", Some(ACME)).await;
        if status == 200 {
            assert_eq!(body, "hi");
            served += 1;
            // The reply came after the append + flush: it is counted already.
            assert_eq!(acme_totals(&s.journal).invocations, served);
        }
        if served == 10 {
            break;
        }
    }
    assert_eq!(served, 10);
    // Concurrent clients: every reply is counted once.
    let calls: Vec<_> = (0..40)
        .map(|_| call(s.ingress, "POST", "/v1/invoke/acme/echo", Some(ACME)))
        .collect();
    for c in calls {
        assert_eq!(c.await.0, 200);
    }
    let t = acme_totals(&s.journal);
    assert_eq!(t.invocations, 50);
    // 500 milli-GPU busy ≥ 2 ms each (the sim's full-GPU time at half a GPU is 4 ms).
    assert!(t.compute_milli_gpu_ms >= 50 * 500 * 2, "{t:?}");
    assert!(t.memory_mib_ms > 0, "{t:?}");

    // The tenant's own view needs its token.
    let (st, body) = call(s.ingress, "GET", "/v1/agent/usage/acme", Some(ACME)).await;
    assert_eq!(st, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["invocations"], serde_json::json!(50), "{v}");
    assert_eq!(
        call(s.ingress, "GET", "/v1/agent/usage/acme", None).await.0,
        401
    );
    assert_eq!(
        call(s.ingress, "GET", "/v1/agent/usage/acme", Some(GLOBEX))
            .await
            .0,
        403
    );
    assert_eq!(
        call(s.ingress, "GET", "/v1/agent/usage/acme", Some("nope"))
            .await
            .0,
        403
    );
    let (st, body) = call(s.ingress, "GET", "/v1/agent/journal", None).await;
    assert_eq!(st, 200, "{body}");
    let j: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(j["pending_records"].as_u64().unwrap() >= t.records, "{j}");
    assert!(j["next_seq"].as_u64().unwrap() > t.records, "{j}");
    let metrics = call(s.ingress, "GET", "/metrics", None).await.1;
    assert!(
        metrics.contains("gshare_edge_usage_records_journaled_total "),
        "{metrics}"
    );

    // Released: residency stops accruing once the release is journaled.
    assign(&s.agent, 2, false);
    let mut last = acme_totals(&s.journal);
    let mut stable = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = acme_totals(&s.journal);
        stable = if now == last { stable + 1 } else { 0 };
        last = now;
        if stable == 5 {
            break;
        }
    }
    assert_eq!(
        stable, 5,
        "memory still accrues after the release: {last:?}"
    );
    assert!(last.memory_mib_ms > t.memory_mib_ms);
    assert_eq!(last.invocations, 50);
}

#[actix_rt::test]
async fn a_journal_that_cannot_append_withholds_results() {
    let s = start();
    // Serve once normally (the instance is up).
    let mut ok = false;
    for _ in 0..200 {
        if call(s.ingress, "POST", "/v1/invoke/acme/echo", Some(ACME))
            .await
            .0
            == 200
        {
            ok = true;
            break;
        }
    }
    assert!(ok, "never served");
    // Sequence numbers exhausted: every append fails from now on.
    s.journal.reconcile(u64::MAX).unwrap();
    let (status, body) = call(s.ingress, "POST", "/v1/invoke/acme/echo", Some(ACME)).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("usage_not_recorded"), "{body}");
    let metrics = call(s.ingress, "GET", "/metrics", None).await.1;
    let withheld = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gshare_edge_usage_results_withheld_total "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(withheld >= Some(1), "{metrics}");
    assert_eq!(acme_totals(&s.journal).invocations, 1);
}

#[actix_rt::test]
async fn flushing_journals_residency_up_to_now() {
    // Memory would be journaled only hourly (or on release): FlushUsage
    // (graceful shutdown) journals it now.
    let s = start_with(Duration::from_secs(3_600));
    let mut ok = false;
    for _ in 0..200 {
        if call(s.ingress, "POST", "/v1/invoke/acme/echo", Some(ACME))
            .await
            .0
            == 200
        {
            ok = true;
            break;
        }
    }
    assert!(ok, "never served");
    assert_eq!(acme_totals(&s.journal).memory_mib_ms, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.agent.send(FlushUsage).await.unwrap();
    let t = acme_totals(&s.journal);
    // Resident (1024 MiB) since before the first call, ≥ 300 ms ago.
    assert!(t.memory_mib_ms >= 1_024 * 300, "{t:?}");
    assert_eq!(t.invocations, 1);
}

#[actix_rt::test]
async fn usage_is_stamped_by_the_agents_clock() {
    let (manual, clock) = ManualClock::shared(1_000_000);
    let s = start_on(Duration::from_secs(3_600), clock);
    let mut ok = false;
    for _ in 0..200 {
        if call(s.ingress, "POST", "/v1/invoke/acme/echo", Some(ACME))
            .await
            .0
            == 200
        {
            ok = true;
            break;
        }
    }
    assert!(ok, "never served");
    // Real time passed (a load, a run), the agent's clock did not.
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.agent.send(FlushUsage).await.unwrap();
    let t = acme_totals(&s.journal);
    assert_eq!((t.invocations, t.compute_milli_gpu_ms), (1, 0), "{t:?}");
    assert_eq!(t.memory_mib_ms, 0, "{t:?}");
    // Ten seconds on the clock: exactly ten seconds of 1024 MiB resident.
    manual.advance(Duration::from_secs(10));
    s.agent.send(FlushUsage).await.unwrap();
    let t = acme_totals(&s.journal);
    assert_eq!(t.memory_mib_ms, 1_024 * 10_000, "{t:?}");
    assert_eq!(t.compute_milli_gpu_ms, 0, "{t:?}");
}

#[actix_rt::test]
async fn an_older_assignment_never_removes_instances() {
    let s = start();
    assign(&s.agent, 5, true);
    let mut ok = false;
    for _ in 0..200 {
        if call(s.ingress, "POST", "/v1/invoke/acme/echo", Some(ACME))
            .await
            .0
            == 200
        {
            ok = true;
            break;
        }
    }
    assert!(ok, "never served");
    // A replica that is behind pushes the empty view of index 3: ignored.
    assign(&s.agent, 3, false);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, body) = call(s.ingress, "POST", "/v1/invoke/acme/echo", Some(ACME)).await;
    assert_eq!(status, 200, "{body}");
    // The same view at a newer index applies.
    assign(&s.agent, 6, false);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, body) = call(s.ingress, "POST", "/v1/invoke/acme/echo", Some(ACME)).await;
    assert_eq!(status, 404, "{body}");
}
