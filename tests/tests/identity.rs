//! An agent is the node its certificate names, with the GPUs the topology
//! gives that node (real `gshare-region` and `gshare-edge` processes):
//!
//! - an agent configured as `local-c2` with `local-c1`'s certificate
//!   refuses to start, and a registration that claims another node than
//!   the connection's certificate is refused by the region;
//! - an agent claiming 5 × 80 GiB GPUs on a node of 2 × 16 GiB is refused,
//!   with the reason in its log;
//! - an agent with fewer GPUs is refused, unless its config says
//!   `allow_fewer_gpus = true`: then it registers and the missing GPU is
//!   unavailable (no placement lands there).

use gshare_core::model::NodeId;
use gshare_core::protocol::{
    AgentMessage, AgentMessageV1, NodeGpu, RegionMessage, RegionMessageV1, Register,
};
use gshare_core::state::AgentId;
use gshare_region::http_client::{request, HttpReply};
use gshare_tests::{TestRegion, TOKEN};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// Tenants of the test: `big` may hold four whole center GPUs.
const TENANTS: &str = r#"
[[tenants]]
name = "big"
[tenants.quota.center]
compute_milli = 4_000
memory_mib = 65_536
instances = 8
[tenants.quota.edge]
compute_milli = 0
memory_mib = 0
instances = 0
"#;

struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts an agent named `node` with the certificate of `cert`, `count`
/// GPUs of `memory_mib`, and `extra` top-level config lines.
fn agent(
    region: &TestRegion,
    tag: &str,
    node: &str,
    cert: &str,
    gpus: (u32, u64),
    extra: &str,
) -> Agent {
    let ingress = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let replicas: String = region
        .replicas
        .values()
        .map(|r| format!("[[replicas]]\nquic_addr = \"{}\"\n", r.raft_addr))
        .collect();
    let config = region.root().join(format!("agent-{tag}.toml"));
    let (count, memory_mib) = gpus;
    std::fs::write(
        &config,
        format!(
            r#"node = "{node}"
pool = "center"
pool_kind = "center"
data_dir = "data/agent-{tag}"
ingress_addr = "{ingress}"
host_swap_mib = 8192
heartbeat_ms = 200
{extra}
[gpus]
backend = "simulated"
[[gpus.simulated]]
model = "sim-gpu-16g"
memory_mib = {memory_mib}
h2d_mib_per_s = 12000
count = {count}
{replicas}
[tls]
ca_cert = "certs/ca.pem"
cert = "certs/{cert}.pem"
key = "certs/{cert}.key"
"#
        ),
    )
    .unwrap();
    let log = region.root().join(format!("agent-{tag}.err"));
    let child = Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Agent { child, log }
}

fn issue(region: &TestRegion, node: &str) {
    let certs = region.certs();
    let (ok, out) = region
        .gsharectl(&[
            "certs",
            "issue",
            "--dir",
            certs.to_str().unwrap(),
            "--name",
            node,
        ])
        .unwrap();
    assert!(ok, "{out}");
}

fn state(region: &TestRegion) -> Value {
    let r = call(region.http(1), "GET", "/v1/cluster/state", TOKEN, None);
    serde_json::from_str(&r.body).unwrap_or(Value::Null)
}

/// The entries of a map or a list in the state dump.
fn items(v: &Value) -> Vec<&Value> {
    match v {
        Value::Object(m) => m.values().collect(),
        Value::Array(a) => a.iter().collect(),
        _ => Vec::new(),
    }
}

fn registered(region: &TestRegion, node: &str) -> bool {
    items(&state(region)["agents"])
        .iter()
        .any(|a| a["node"] == node)
}

/// Registers as `claimed` over a QUIC connection made with `cert_of`'s
/// certificate; the region's answer.
fn raw_register(region: &TestRegion, cert_of: &str, claimed: &str) -> RegionMessage {
    let certs: &Path = &region.certs();
    let client = gshare_edge::tls::client_config(
        &certs.join("ca.pem"),
        &certs.join(format!("{cert_of}.pem")),
        &certs.join(format!("{cert_of}.key")),
    )
    .unwrap();
    let addr = region.replicas[&1].raft_addr;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        endpoint.set_default_client_config(client);
        let conn = endpoint.connect(addr, "127.0.0.1").unwrap().await.unwrap();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let msg = AgentMessage::v1(AgentMessageV1::RegisterGpus {
            register: Register {
                agent: AgentId(claimed.into()),
                node: NodeId(claimed.into()),
                pool: "center".into(),
                version: "test".into(),
                gpus: (0..2)
                    .map(|index| NodeGpu {
                        index,
                        model: "sim-gpu-16g".into(),
                        memory_mib: 16_384,
                    })
                    .collect(),
                ingress: "127.0.0.1:1".into(),
            },
            allow_fewer_gpus: false,
        });
        gshare_edge::wire::write_frame(&mut send, &msg)
            .await
            .unwrap();
        let reply: RegionMessage = gshare_edge::wire::read_frame(&mut recv).await.unwrap();
        conn.close(0u32.into(), b"done");
        endpoint.wait_idle().await;
        reply
    })
}

#[test]
fn agents_are_the_node_their_certificate_names_with_the_topologys_gpus() {
    let mut region = TestRegion::new(1).expect("region");
    std::fs::write(region.path("tenants.toml"), TENANTS).unwrap();
    region.start(1, true).expect("start");
    region
        .wait_leader(&[1], Duration::from_secs(15))
        .expect("leader");
    until("topology loaded", 30, || {
        state(&region)["topology"].is_object().then_some(())
    });
    for n in ["local-c1", "local-c2"] {
        issue(&region, n);
    }

    // 1. The agent itself refuses to run as local-c2 with local-c1's certificate.
    let mut wrong = agent(&region, "wrong", "local-c2", "local-c1", (2, 16_384), "");
    let status = until("the mis-certified agent exits", 30, || {
        wrong.child.try_wait().ok().flatten()
    });
    assert!(!status.success());
    let log = wrong.log();
    assert!(
        log.contains("issued for \"local-c1\"") && log.contains("\"local-c2\""),
        "{log}"
    );
    // ... and the region refuses a registration that claims another node
    // than the connection's certificate, saying why.
    match raw_register(&region, "local-c1", "local-c2") {
        RegionMessage::V1(RegionMessageV1::Refused {
            code,
            message,
            retry,
        }) => {
            assert_eq!(code, "identity_mismatch", "{message}");
            assert!(message.contains("\"local-c1\""), "{message}");
            assert!(!retry);
        }
        other => panic!("registered as another node: {other:?}"),
    }
    assert!(!registered(&region, "local-c2"));

    // 2. 5 × 80 GiB on a node of 2 × 16 GiB: refused, the reason in the agent's log.
    let liar = agent(&region, "liar", "local-c1", "local-c1", (5, 81_920), "");
    until("the lie is refused", 30, || {
        let log = liar.log();
        (log.contains("gpu_mismatch") && log.contains("81920 MiB")).then_some(())
    });
    assert!(!registered(&region, "local-c1"), "{}", state(&region));
    drop(liar);

    // 3. One GPU of two: refused without the agent's consent ...
    let short = agent(&region, "short", "local-c1", "local-c1", (1, 16_384), "");
    until("fewer GPUs refused", 30, || {
        short.log().contains("allow_fewer_gpus").then_some(())
    });
    assert!(!registered(&region, "local-c1"));
    drop(short);
    // ... accepted with allow_fewer_gpus = true, the missing GPU unavailable.
    let fewer = agent(
        &region,
        "fewer",
        "local-c1",
        "local-c1",
        (1, 16_384),
        "allow_fewer_gpus = true",
    );
    until("registered with fewer GPUs", 30, || {
        registered(&region, "local-c1").then_some(())
    });
    assert_eq!(
        state(&region)["unavailable_gpus"],
        json!({"local-c1": [1]}),
        "{}",
        fewer.log()
    );
    // Whole-GPU instances land on the GPU the agent has, never on the missing one.
    let r = until("token", 30, || {
        let r = call(
            region.http(1),
            "POST",
            "/v1/tenants/big/tokens",
            TOKEN,
            None,
        );
        (r.status == 201).then_some(r)
    });
    let big = serde_json::from_str::<Value>(&r.body).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    // Three whole-GPU instances take the three GPUs that are there ...
    let whole = |name: &str, n: u32| {
        json!({
            "name": name, "runtime": "pytorch", "memory_mib": 16384, "compute_milli": 1000,
            "tier": "exclusive", "deadline_ms": 2000, "pool": "center",
            "min_instances": n, "max_instances": n,
            "latency": {"full_gpu_us": 2000, "saturation_milli": 1000},
        })
        .to_string()
    };
    let r = call(
        region.http(1),
        "POST",
        "/v1/functions",
        &big,
        Some(&whole("three", 3)),
    );
    assert!(r.status == 200 || r.status == 201, "{r:?}");
    let on = |s: &Value, node: &str, gpu: u64| {
        items(&s["instances"]).iter().any(|i| {
            items(&i["slices"])
                .iter()
                .any(|s| s["gpu"]["node"] == node && s["gpu"]["index"] == gpu)
        })
    };
    let s = state(&region);
    assert!(on(&s, "local-c1", 0), "{s}");
    assert!(!on(&s, "local-c1", 1), "placed on the missing GPU: {s}");
    // ... and a fourth finds none (the quota allows it; the missing GPU does not).
    let r = call(
        region.http(1),
        "POST",
        "/v1/functions",
        &big,
        Some(&whole("fourth", 1)),
    );
    assert_eq!(r.status, 409, "{r:?}");
    let s = state(&region);
    assert!(!on(&s, "local-c1", 1), "placed on the missing GPU: {s}");
    drop(fewer);
}
