//! The `microvm` runtime driver in the real agent: the `gshare-edge`
//! binary, behind a stand-in region, hosts `tests/fixtures/echo_server.py`
//! as a function of runtime `custom` with `[runtimes.custom] driver =
//! "microvm"` (one QEMU microVM per instance), and the same server as a
//! `process` function of runtime `vllm` beside it, for comparison.
//!
//! The VM function is served through the agent's ingress; it cannot read a
//! host file the process function reads, nor reach the agent's ingress or
//! the region's (UDP) port, which the process function reaches; /metrics
//! says how its VMs are accelerated and how long they took to boot;
//! stopping the agent stops the VMs, and after a `kill -9` of the agent the
//! next one stops the VM its predecessor left (the process ledger).
//!
//! Needs QEMU and the guest image (`scripts/microvm-image.sh`); without
//! them the tests print why and pass, except with `GSHARE_CI` set (`.ci/run`
//! sets it after building the image), where they fail.

use gshare_core::model::{
    FunctionSpec, GpuId, LatencyProfile, NodeId, PoolPreference, Runtime, Slice, TenantId, Tier,
};
use gshare_core::protocol::{
    AssignedInstance, Assignment, RegionMessage, RegionMessageV1, TenantTokens, TokenDigests,
};
use gshare_core::state::InstanceId;
use gshare_edge::token::token_digest;
use gshare_edge::wire::write_frame;
use gshare_tests::agent_proc::{alive, free_port, gone, AgentProc};
use gshare_tests::stand_in_region::{fake_region, issue, new_ca, Ca, FakeRegion};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a stopped process may take to go.
const GONE_WITHIN: Duration = Duration::from_secs(20);

const TOKEN: &str = "s3cret";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures");

/// The guest image directory, or why the test cannot run (a panic in CI).
fn image_dir() -> Option<PathBuf> {
    gshare_tests::agent_proc::microvm_image_dir("the microVM tests")
}

/// The QEMU processes whose command line names `run_dir` (this test's VMs).
fn vms_of(run_dir: &Path) -> Vec<u64> {
    let needle = run_dir.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
                && alive(*pid)
        })
        .collect()
}

fn write_agent_files(dir: &Path, ca: &Ca, region: SocketAddr, image: &Path) -> SocketAddr {
    let (cert, key) = issue(ca, "n1");
    std::fs::write(dir.join("ca.pem"), &ca.pem).unwrap();
    std::fs::write(dir.join("n1.pem"), cert).unwrap();
    std::fs::write(dir.join("n1.key"), key).unwrap();
    std::fs::create_dir_all(dir.join("runtimes")).unwrap();
    std::fs::copy(
        Path::new(FIXTURES).join("echo_server.py"),
        dir.join("runtimes/echo_server.py"),
    )
    .unwrap();
    let command = r#"["python3", "echo_server.py", "--host", "{host}", "--port", "{port}"]"#;
    std::fs::write(
        dir.join("runtimes/echo-vm.toml"),
        format!(
            "runtime = \"custom\"\ncommand = {command}\nstartup_timeout_s = 90\nstop_grace_s = 5\n\
             [vm]\nfiles = [\"echo_server.py\"]\nmemory_mib = 160\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("runtimes/echo-process.toml"),
        format!(
            "runtime = \"vllm\"\ncommand = {command}\nstartup_timeout_s = 20\nstop_grace_s = 5\n"
        ),
    )
    .unwrap();
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
backend = "simulated"
[[gpus.simulated]]
model = "sim"
memory_mib = 16384
h2d_mib_per_s = 600000
count = 1
[load]
cold_setup_us = 20000
storage_mib_per_s = 100000
[[replicas]]
quic_addr = "{region}"
[tls]
ca_cert = "ca.pem"
cert = "n1.pem"
key = "n1.key"
[runtimes.custom]
driver = "microvm"
template = "runtimes/echo-vm.toml"
image = {image:?}
[runtimes.vllm]
driver = "process"
template = "runtimes/echo-process.toml"
"#,
            image = image.display().to_string()
        ),
    )
    .unwrap();
    ingress
}

fn spec(name: &str, runtime: Runtime) -> FunctionSpec {
    FunctionSpec {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        tenant: TenantId("acme".into()),
        name: name.into(),
        runtime,
        memory_mib: 1024,
        compute_milli: 500,
        tier: Tier::Guaranteed,
        deadline_ms: 60_000,
        pool: PoolPreference::Any,
        min_instances: 1,
        max_instances: 1,
        idle_timeout_s: 600,
        latency: LatencyProfile {
            full_gpu_us: 1_000,
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

async fn assign(conn: &quinn::Connection, index: u64, specs: &[FunctionSpec]) {
    push(
        conn,
        RegionMessageV1::Tokens(TokenDigests {
            applied_index: index,
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
                compute_milli: s.compute_milli,
                memory_mib: s.memory_mib,
            }],
        })
        .collect();
    push(
        conn,
        RegionMessageV1::Assignment(Assignment {
            applied_index: index,
            instances,
        }),
    )
    .await;
}

fn http_as(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
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

async fn invoke(addr: SocketAddr, name: &str, body: &str) -> (u16, String) {
    let (path, body) = (format!("/v1/invoke/acme/{name}"), body.to_string());
    tokio::task::spawn_blocking(move || http_as(addr, "POST", &path, &body, Some(TOKEN)))
        .await
        .unwrap()
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The first successful answer of `name` to `body` (its instance starts on
/// placement; a VM boots for seconds under TCG).
async fn served(addr: SocketAddr, name: &str, body: &str) -> serde_json::Value {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, out) = invoke(addr, name, body).await;
        if status == 200 {
            return json(&out);
        }
        assert!(
            Instant::now() < until,
            "{name} never served: {status} {out}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn metrics(addr: SocketAddr) -> String {
    let (status, text) =
        tokio::task::spawn_blocking(move || http_as(addr, "GET", "/metrics", "", None))
            .await
            .unwrap();
    assert_eq!(status, 200, "{text}");
    text
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{series} ")))
        .and_then(|v| v.trim().parse().ok())
}

async fn start(
    dir: &Path,
    ca: &Ca,
    region: &mut FakeRegion,
    image: &Path,
) -> (AgentProc, SocketAddr, quinn::Connection) {
    let ingress = write_agent_files(dir, ca, region.addr, image);
    let child = Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(dir.join("agent.toml"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let agent = AgentProc(Some(child));
    let conn = tokio::time::timeout(Duration::from_secs(20), region.registered.recv())
        .await
        .expect("agent registers in time")
        .unwrap();
    (agent, ingress, conn)
}

#[actix_rt::test]
async fn a_function_in_a_microvm_is_served_and_reaches_nothing_a_process_reaches() {
    let Some(image) = image_dir() else { return };
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let dir = tempfile::tempdir().unwrap();
    let (mut agent, ingress, conn) = start(dir.path(), &ca, &mut region, &image).await;
    assign(
        &conn,
        1,
        &[spec("vm", Runtime::Custom), spec("proc", Runtime::Vllm)],
    )
    .await;
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "host-only").unwrap();
    // The region's port is UDP (QUIC); the agent's ingress TCP.
    let region_port = region.addr.port();
    let ask = |host: &str| {
        format!(
            r#"{{"read":{:?},"connect":"{host}:{}","udp":"{host}:{region_port}"}}"#,
            secret.display().to_string(),
            ingress.port()
        )
    };
    let host = served(ingress, "proc", &ask("127.0.0.1")).await;
    assert_eq!(host["read"], "host-only", "{host}");
    assert_eq!(
        host["connect"], "ok",
        "the process reaches the ingress: {host}"
    );
    let vm = served(ingress, "vm", &ask("10.0.2.2")).await;
    assert_eq!(vm["pid"], 1, "served from inside the guest: {vm}");
    for probe in ["read", "connect", "udp"] {
        let got = vm[probe].as_str().unwrap_or_default();
        assert!(got.starts_with("error: "), "{probe} from the VM: {vm}");
    }
    let vm_local = served(ingress, "vm", &ask("127.0.0.1")).await;
    for probe in ["connect", "udp"] {
        let got = vm_local[probe].as_str().unwrap_or_default();
        assert!(
            got.starts_with("error: "),
            "{probe} from the VM: {vm_local}"
        );
    }
    // Invoke overhead through the VM vs the process, same run, same agent
    // (printed; no timing is asserted).
    for name in ["proc", "vm"] {
        let mut took = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            let (status, body) = invoke(ingress, name, "{}").await;
            assert_eq!(status, 200, "{body}");
            took.push(t.elapsed().as_micros() as u64);
        }
        took.sort_unstable();
        println!(
            "microvm invoke: {name}: median {} µs, max {} µs over 20 calls",
            took[10], took[19]
        );
    }
    let text = metrics(ingress).await;
    let accel = if std::path::Path::new("/sys/module/kvm_pvm").exists()
        || !std::path::Path::new("/dev/kvm").exists()
    {
        "tcg"
    } else {
        "kvm"
    };
    assert_eq!(
        metric(
            &text,
            &format!("gshare_edge_microvm_accel{{accel=\"{accel}\"}}")
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "gshare_edge_microvm_boots_total"),
        Some(1.0),
        "{text}"
    );
    let boot = metric(&text, "gshare_edge_microvm_boot_last_seconds").unwrap();
    assert!(boot > 0.0, "{text}");
    println!("microvm boot-to-ready through the agent: {boot:.2} s");
    let run_dir = dir.path().join("data/microvm");
    let vms = vms_of(&run_dir);
    assert_eq!(vms.len(), 1, "one VM per instance: {vms:?}");
    let (exit, stderr) = agent.terminate();
    assert!(exit.success(), "agent exit {exit:?}: {stderr}");
    if accel == "tcg" {
        assert!(
            stderr.contains("microVMs fall back to TCG"),
            "the fallback is not logged: {stderr}"
        );
    }
    assert!(stderr.contains("function microvm ready"), "{stderr}");
    for pid in vms {
        assert!(gone(pid, GONE_WITHIN).await, "VM {pid} outlived the agent");
    }
}

#[actix_rt::test]
async fn a_restarted_agent_stops_the_vm_its_killed_predecessor_left() {
    let Some(image) = image_dir() else { return };
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let dir = tempfile::tempdir().unwrap();
    let (mut agent, ingress, conn) = start(dir.path(), &ca, &mut region, &image).await;
    assign(&conn, 1, &[spec("vm", Runtime::Custom)]).await;
    served(ingress, "vm", "{}").await;
    let run_dir = dir.path().join("data/microvm");
    let vms = vms_of(&run_dir);
    assert_eq!(vms.len(), 1, "{vms:?}");
    let mut killed = agent.0.take().expect("agent running");
    killed.kill().unwrap();
    killed.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        alive(vms[0]),
        "the VM should outlive a kill -9 of its agent"
    );
    let (mut agent2, _, _) = start(dir.path(), &ca, &mut region, &image).await;
    assert!(
        gone(vms[0], GONE_WITHIN).await,
        "leftover VM {} not stopped by the new agent",
        vms[0]
    );
    let (exit, stderr) = agent2.terminate();
    assert!(exit.success(), "agent exit {exit:?}: {stderr}");
    assert!(
        stderr.contains("left running by a previous agent"),
        "reaping not logged: {stderr}"
    );
}
