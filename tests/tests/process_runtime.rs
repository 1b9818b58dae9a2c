//! The `process` runtime driver in the real agent: the `gshare-edge` binary,
//! behind a stand-in region, hosts `tests/fixtures/echo_server.py` (python3,
//! stdlib only) as a function of runtime `custom` with
//! `[runtimes.custom] driver = "process"`.
//!
//! A crash of the function's process mid-request ends the invocations in
//! flight with `502 function_crashed`; the process is restarted (new pid)
//! and serves again; the crash and restart show in the agent's `/metrics`;
//! releasing the function, or stopping the agent, leaves no process of its
//! group behind. The transparent route (`/v1/invoke/{tenant}/{name}/{*path}`)
//! passes the request on and the function's reply back.

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
use gshare_tests::openai::{exchange, header, openai_package, python3, OPENAI_SERVER as OPENAI};
use gshare_tests::raw_http::upload_in_two_parts;
use gshare_tests::stand_in_region::{fake_region, issue, new_ca, Ca, FakeRegion};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a stopped process may take to go.
const GONE_WITHIN: Duration = Duration::from_secs(15);

const TOKEN: &str = "s3cret";
const ECHO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/echo_server.py");
const UPLOAD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/upload_server.py");

fn write_agent_files(dir: &Path, ca: &Ca, region: SocketAddr) -> SocketAddr {
    let (cert, key) = issue(ca, "n1");
    std::fs::write(dir.join("ca.pem"), &ca.pem).unwrap();
    std::fs::write(dir.join("n1.pem"), cert).unwrap();
    std::fs::write(dir.join("n1.key"), key).unwrap();
    std::fs::create_dir_all(dir.join("runtimes")).unwrap();
    std::fs::write(
        dir.join("runtimes/echo.toml"),
        format!(
            r#"runtime = "custom"
description = "tests/fixtures/echo_server.py"
command = ["python3", {ECHO:?}, "--port", "{{port}}", "--spawn-child"]
health_path = "/health"
invoke_path = "/invoke"
startup_timeout_s = 20
stop_grace_s = 5
"#
        ),
    )
    .unwrap();
    // A fake OpenAI-compatible server as the `pytorch` runtime: `{model}`
    // is the function's model; a function may add `--gap-ms`.
    std::fs::write(
        dir.join("runtimes/openai.toml"),
        format!(
            r#"runtime = "pytorch"
command = ["python3", {OPENAI:?}, "--port", "{{port}}", "--model", "{{model}}"]
health_path = "/health"
invoke_path = "/v1/chat/completions"
startup_timeout_s = 20
stop_grace_s = 5
allow_args = ["--gap-ms=", "--hold-last-for="]
"#
        ),
    )
    .unwrap();
    // A server that reads its request body as it arrives, as `sglang`.
    std::fs::write(
        dir.join("runtimes/upload.toml"),
        format!(
            r#"runtime = "sglang"
command = ["python3", {UPLOAD:?}, "--port", "{{port}}"]
health_path = "/health"
invoke_path = "/upload"
startup_timeout_s = 20
stop_grace_s = 5
"#
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
driver = "process"
template = "runtimes/echo.toml"
[runtimes.pytorch]
driver = "process"
template = "runtimes/openai.toml"
[runtimes.sglang]
driver = "process"
template = "runtimes/upload.toml"
"#
        ),
    )
    .unwrap();
    ingress
}

fn echo_spec() -> FunctionSpec {
    FunctionSpec {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        tenant: TenantId("acme".into()),
        name: "echo".into(),
        runtime: Runtime::Custom,
        memory_mib: 1024,
        compute_milli: 500,
        tier: Tier::Guaranteed,
        deadline_ms: 20_000,
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

/// Blocking HTTP/1.1 request with `Connection: close`: (status, body).
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    http_as(addr, method, path, body, Some(TOKEN))
}

/// `token: None` sends no Authorization header (the agent's public
/// `/metrics`; a tenant's token there is refused with 401).
fn http_as(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
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

async fn invoke(addr: SocketAddr, body: &str) -> (u16, String) {
    invoke_fn(addr, "echo", body).await
}

async fn invoke_fn(addr: SocketAddr, name: &str, body: &str) -> (u16, String) {
    let (path, body) = (format!("/v1/invoke/acme/{name}"), body.to_string());
    tokio::task::spawn_blocking(move || http(addr, "POST", &path, &body))
        .await
        .unwrap()
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The first successful echo (the process starts on placement).
async fn first_echo(addr: SocketAddr) -> serde_json::Value {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = invoke(addr, r#"{"hello":1}"#).await;
        if status == 200 {
            return json(&body);
        }
        assert!(Instant::now() < until, "never served: {status} {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn metric(addr: SocketAddr, name: &str) -> u64 {
    let (status, text) =
        tokio::task::spawn_blocking(move || http_as(addr, "GET", "/metrics", "", None))
            .await
            .unwrap();
    assert_eq!(status, 200, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("gshare_edge_{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}

async fn metric_reaches(addr: SocketAddr, name: &str, want: u64) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let got = metric(addr, name).await;
        if got == want {
            return;
        }
        assert!(Instant::now() < until, "{name} = {got}, expected {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start(
    dir: &Path,
    ca: &Ca,
    region: &mut FakeRegion,
) -> (AgentProc, SocketAddr, quinn::Connection) {
    start_with(dir, ca, region, "").await
}

/// [`start`] with `extra` appended to the agent's config.
async fn start_with(
    dir: &Path,
    ca: &Ca,
    region: &mut FakeRegion,
    extra: &str,
) -> (AgentProc, SocketAddr, quinn::Connection) {
    start_edited(dir, ca, region, |config| format!("{config}{extra}")).await
}

/// [`start`] with the agent's config as `edit` makes it.
async fn start_edited(
    dir: &Path,
    ca: &Ca,
    region: &mut FakeRegion,
    edit: impl FnOnce(String) -> String,
) -> (AgentProc, SocketAddr, quinn::Connection) {
    let ingress = write_agent_files(dir, ca, region.addr);
    let path = dir.join("agent.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, edit(config)).unwrap();
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

/// A raw `POST …/chat/v1/chat/completions` to the agent's transparent
/// route for `acme/chat`, with `extra` header lines (each ending `\r\n`).
fn chat_completion(body: &str, extra: &str) -> String {
    format!(
        "POST /v1/invoke/acme/chat/v1/chat/completions HTTP/1.1\r\nHost: x\r\n\
         Authorization: Bearer {TOKEN}\r\n{extra}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[actix_rt::test]
async fn the_transparent_route_passes_the_request_on_and_the_reply_back() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let dir = tempfile::tempdir().unwrap();
    let (_agent, ingress, conn) = start(dir.path(), &ca, &mut region).await;
    assign(&conn, 1, &[echo_spec()]).await;
    // The plain route works as before (and the process is up).
    assert_eq!(first_echo(ingress).await["body"], r#"{"hello":1}"#);

    let call = |req: String| tokio::task::spawn_blocking(move || exchange(ingress, req));
    // Method, path suffix (as sent), query, headers, body through; the
    // hop-by-hop ones (and those `Connection` names), the token, the
    // idempotency key and gshare's own headers not.
    let (status, headers, body) = call(format!(
        "PUT /v1/invoke/acme/echo/t/a%20b/c?x=1&y=2 HTTP/1.1\r\nHost: x\r\n\
         Authorization: Bearer {TOKEN}\r\nX-Custom: v\r\nX-Hop: h\r\n\
         Connection: close, X-Hop\r\nX-Gshare-Deadline-Ms: 15000\r\nX-Gshare-Other: o\r\n\
         X-Want-Status: 201\r\nContent-Length: 5\r\n\r\nhello"
    ))
    .await
    .unwrap();
    assert_eq!(status, 201, "{headers:?} {body}");
    let v = json(&body);
    assert_eq!(v["method"], "PUT");
    assert_eq!(v["path"], "/t/a%20b/c?x=1&y=2");
    assert_eq!(v["body"], "hello");
    let seen = v["headers"].as_object().unwrap();
    assert_eq!(seen["x-custom"], "v");
    for gone in [
        "authorization",
        "x-hop",
        "x-gshare-other",
        "idempotency-key",
    ] {
        assert!(
            !seen.contains_key(gone),
            "{gone} reached the function: {seen:?}"
        );
    }
    // The agent's own remaining deadline, not the client's header.
    let left: u64 = seen["x-gshare-deadline-ms"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(left <= 15_000, "{left}");
    // The function's headers back, but not its forged gshare error.
    assert_eq!(header(&headers, "x-fn"), Some("yes"));
    assert_eq!(header(&headers, "x-gshare-error"), None, "{headers:?}");
    assert!(
        header(&headers, "x-gshare-service-us").is_some(),
        "{headers:?}"
    );

    // The function's own error statuses pass through unchanged.
    let (status, headers, body) = call(format!(
        "GET /v1/invoke/acme/echo/t/?q=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         X-Want-Status: 503\r\nConnection: close\r\n\r\n"
    ))
    .await
    .unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(header(&headers, "x-gshare-error"), None);
    let v = json(&body);
    assert_eq!(
        (v["method"].as_str(), v["path"].as_str()),
        (Some("GET"), Some("/t/?q=1"))
    );

    // gshare's own errors keep their shape and carry X-Gshare-Error.
    for (request, want_status, want_code) in [
        (
            format!(
                "POST /v1/invoke/acme/nope/t/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            ),
            404,
            "unknown_function",
        ),
        (
            "GET /v1/invoke/acme/echo/t/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                .to_string(),
            401,
            "unauthorized",
        ),
    ] {
        let (status, headers, body) = call(request).await.unwrap();
        assert_eq!(status, want_status, "{body}");
        assert_eq!(header(&headers, "x-gshare-error"), Some(want_code), "{headers:?}");
        assert_eq!(json(&body)["error"]["code"], want_code);
    }
}

/// The official OpenAI client, its `base_url` at the agent's transparent
/// route of `acme/chat`, against a fake OpenAI-compatible server run by the
/// `process` driver with the function's `model` and `args`: a chat
/// completion, a streamed one, and the model list all work through gshare.
#[actix_rt::test]
async fn an_openai_client_talks_to_a_function_through_the_agent() {
    if !openai_package() {
        return;
    }
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let dir = tempfile::tempdir().unwrap();
    let (_agent, ingress, conn) = start(dir.path(), &ca, &mut region).await;
    let chat = FunctionSpec {
        name: "chat".into(),
        runtime: Runtime::Pytorch,
        model: Some("org/tiny-chat".into()),
        args: vec!["--gap-ms".into(), "10".into()],
        ..echo_spec()
    };
    assign(&conn, 1, &[chat]).await;
    let script = r#"
import json, os, sys, openai
c = openai.OpenAI(base_url=os.environ["BASE_URL"], api_key=os.environ["TOKEN"], max_retries=0)
out = {}
r = c.chat.completions.create(model="org/tiny-chat", messages=[{"role": "user", "content": "hello gshare"}])
out["model"], out["content"] = r.model, r.choices[0].message.content
s = c.chat.completions.create(model="org/tiny-chat", messages=[{"role": "user", "content": "one two three"}], stream=True)
out["deltas"] = [ch.choices[0].delta.content for ch in s if ch.choices and ch.choices[0].delta.content]
out["models"] = [m.id for m in c.models.list()]
try:
    c.with_options(api_key="wrong").models.list()
    out["wrong_token"] = "accepted"
except openai.AuthenticationError as e:
    out["wrong_token"] = e.response.headers.get("x-gshare-error")
print(json.dumps(out))
"#;
    let base_url = format!("http://{ingress}/v1/invoke/acme/chat/v1");
    let until = Instant::now() + Duration::from_secs(30);
    let out = loop {
        let (base_url, script) = (base_url.clone(), script.to_string());
        let run = tokio::task::spawn_blocking(move || {
            python3()
                .args(["-c", &script])
                .env("BASE_URL", base_url)
                .env("TOKEN", TOKEN)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        if run.status.success() {
            break json(&String::from_utf8_lossy(&run.stdout));
        }
        // Until the instance's process is up (503/429 from gshare).
        let err = String::from_utf8_lossy(&run.stderr).to_string();
        assert!(Instant::now() < until, "the client failed: {err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(out["model"], "org/tiny-chat", "{out}");
    assert_eq!(out["content"], "echo: hello gshare");
    assert_eq!(
        out["deltas"],
        serde_json::json!(["echo:", " one", " two", " three"])
    );
    assert_eq!(out["models"], serde_json::json!(["org/tiny-chat"]));
    assert_eq!(out["wrong_token"], "unauthorized");
}

/// A streamed reply passes through the agent as it comes: the fake server
/// holds its last token until the client has seen the first ones (it
/// writes a file on its first delta; a proxy that buffered the reply would
/// never let it, and the last token would be `LATE`). A stream still
/// running at its deadline is cut: the reply ends without its last chunk.
#[actix_rt::test]
async fn streamed_tokens_arrive_incrementally_and_a_stream_is_cut_at_its_deadline() {
    if !openai_package() {
        return;
    }
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("first-delta-seen");
    let (_agent, ingress, conn) = start(dir.path(), &ca, &mut region).await;
    let chat = FunctionSpec {
        name: "chat".into(),
        runtime: Runtime::Pytorch,
        model: Some("org/tiny-chat".into()),
        args: vec![
            "--hold-last-for".into(),
            gate.to_string_lossy().into_owned(),
        ],
        ..echo_spec()
    };
    assign(&conn, 1, &[chat]).await;
    let script = r#"
import json, os, openai
c = openai.OpenAI(base_url=os.environ["BASE_URL"], api_key=os.environ["TOKEN"], max_retries=0)
c.models.list()
s = c.chat.completions.create(model="org/tiny-chat", messages=[{"role": "user", "content": "one two three"}], stream=True)
deltas = []
for ch in s:
    if ch.choices and ch.choices[0].delta.content:
        deltas.append(ch.choices[0].delta.content)
        open(os.environ["GATE"], "a").close()
print(json.dumps(deltas))
"#;
    let base_url = format!("http://{ingress}/v1/invoke/acme/chat/v1");
    let until = Instant::now() + Duration::from_secs(30);
    let deltas = loop {
        let (base_url, script, g) = (base_url.clone(), script.to_string(), gate.clone());
        let run = tokio::task::spawn_blocking(move || {
            python3()
                .args(["-c", &script])
                .env("BASE_URL", base_url)
                .env("TOKEN", TOKEN)
                .env("GATE", g)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        if run.status.success() {
            break json(&String::from_utf8_lossy(&run.stdout));
        }
        let err = String::from_utf8_lossy(&run.stderr).to_string();
        assert!(Instant::now() < until, "the client failed: {err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        deltas,
        serde_json::json!(["echo:", " one", " two", " three"]),
        "the last token waited for a client that saw nothing yet"
    );

    // The gate gone, the server holds the last token (up to 30 s) past a
    // 1 s deadline: the client gets the head and the first tokens, then
    // the connection closes without the chunked body's last chunk.
    std::fs::remove_file(&gate).unwrap();
    let body = r#"{"model":"org/tiny-chat","stream":true,"messages":[{"role":"user","content":"one two"}]}"#;
    let (status, headers, raw) = tokio::task::spawn_blocking(move || {
        exchange(
            ingress,
            chat_completion(body, "X-Gshare-Deadline-Ms: 1000\r\n"),
        )
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{raw}");
    assert_eq!(header(&headers, "content-type"), Some("text/event-stream"));
    assert!(raw.contains(r#""content": " one""#), "first tokens: {raw}");
    assert!(!raw.contains("LATE") && !raw.contains("[DONE]"), "{raw}");
    assert!(
        !raw.ends_with("0\r\n\r\n"),
        "the cut reply looks complete: {raw}"
    );
}

/// With metering on (the shipped path) a stream's start is released once
/// its first part is journaled; a short stream can end before that write
/// returns. Its outcome must not overtake its start: the client gets the
/// whole stream, never an empty `200` (found by review: the outcome was
/// released at once and the ingress answered it with no body).
#[actix_rt::test]
async fn a_short_metered_stream_reaches_the_client_whole() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let dir = tempfile::tempdir().unwrap();
    let (_agent, ingress, conn) = start_with(dir.path(), &ca, &mut region, "[metering]\n").await;
    let chat = FunctionSpec {
        name: "chat".into(),
        runtime: Runtime::Pytorch,
        model: Some("org/tiny-chat".into()),
        ..echo_spec()
    };
    assign(&conn, 1, &[chat]).await;
    let body = r#"{"model":"org/tiny-chat","stream":true,"messages":[{"role":"user","content":"one two three"}]}"#;
    let call = move || exchange(ingress, chat_completion(body, ""));
    // Until the process serves.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _, raw) = tokio::task::spawn_blocking(call).await.unwrap();
        if status == 200 {
            break;
        }
        assert!(Instant::now() < until, "never served: {status} {raw}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Rounds of 8 at once: a journal write in flight delays the next
    // stream's start, the window the outcome could overtake it in.
    for round in 0..5 {
        let calls: Vec<_> = (0..8).map(|_| tokio::task::spawn_blocking(call)).collect();
        for (i, c) in calls.into_iter().enumerate() {
            let (status, headers, raw) = c.await.unwrap();
            assert_eq!(status, 200, "round {round} call {i}: {raw}");
            assert_eq!(header(&headers, "content-type"), Some("text/event-stream"));
            assert!(
                raw.contains(r#""content": " three""#) && raw.contains("[DONE]"),
                "round {round} call {i}: the stream did not arrive whole: {raw:?}"
            );
        }
    }
}

#[actix_rt::test]
async fn a_crashed_function_process_fails_its_calls_explicitly_and_is_restarted() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let dir = tempfile::tempdir().unwrap();
    let (mut agent, ingress, conn) = start(dir.path(), &ca, &mut region).await;
    assign(&conn, 1, &[echo_spec()]).await;

    // Served by the process, on its slice's CUDA/MPS environment.
    let first = first_echo(ingress).await;
    assert_eq!(first["body"], r#"{"hello":1}"#);
    assert_eq!(first["env"]["CUDA_VISIBLE_DEVICES"], "0");
    assert_eq!(first["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "50");
    assert_eq!(first["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=1024M");
    let deadline_ms: u64 = first["deadline_ms"].as_str().unwrap().parse().unwrap();
    assert!(
        deadline_ms > 0 && deadline_ms <= 20_000,
        "the request's deadline reaches the function: {deadline_ms}"
    );
    let (pid, child) = (
        first["pid"].as_u64().unwrap(),
        first["child_pid"].as_u64().unwrap(),
    );
    assert!(alive(pid) && alive(child));
    assert_eq!(metric(ingress, "process_running").await, 1);
    assert_eq!(metric(ingress, "process_crashes_total").await, 0);

    // A slow call in flight, then a call that makes the process exit.
    let slow = tokio::spawn(invoke(ingress, r#"{"sleep_ms":3000}"#));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let crash = tokio::spawn(invoke(ingress, r#"{"crash_after_ms":300}"#));
    for (what, call) in [("crashing", crash), ("in flight", slow)] {
        let (status, body) = call.await.unwrap();
        assert_eq!(status, 502, "{what} call: {body}");
        let e = json(&body);
        assert_eq!(
            e["error"]["code"], "function_crashed",
            "{what} call: {body}"
        );
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("crashed during the invocation"),
            "{body}"
        );
    }
    // Restarted with backoff: a new process serves later calls.
    let after = first_echo(ingress).await;
    let (pid2, child2) = (
        after["pid"].as_u64().unwrap(),
        after["child_pid"].as_u64().unwrap(),
    );
    assert_ne!(pid2, pid, "not restarted");
    assert!(
        gone(pid, GONE_WITHIN).await,
        "crashed server {pid} still there"
    );
    assert!(
        gone(child, GONE_WITHIN).await,
        "its child {child} still there"
    );
    metric_reaches(ingress, "process_crashes_total", 1).await;
    metric_reaches(ingress, "process_restarts_total", 1).await;
    for i in 0..5 {
        let (status, body) = invoke(ingress, &format!("{{\"n\":{i}}}")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(json(&body)["pid"].as_u64(), Some(pid2));
    }

    // Released by the region: the process group is stopped.
    assign(&conn, 2, &[]).await;
    assert!(
        gone(pid2, GONE_WITHIN).await,
        "released function's server {pid2} still there"
    );
    assert!(
        gone(child2, GONE_WITHIN).await,
        "its child {child2} still there"
    );
    metric_reaches(ingress, "process_running", 0).await;
    let (status, body) = invoke(ingress, "{}").await;
    assert_eq!(status, 404, "{body}");

    // Metered like any function: only the 7 calls that returned 200 (first
    // echo, first echo after the restart, 5 more), not the crashed ones.
    let (status, body) =
        tokio::task::spawn_blocking(move || http(ingress, "GET", "/v1/agent/usage/acme", ""))
            .await
            .unwrap();
    assert_eq!(status, 200, "{body}");
    let usage = json(&body);
    assert_eq!(usage["invocations"], 7, "agent's usage: {body}");
    assert!(
        usage["compute_milli_gpu_ms"].as_u64().unwrap() > 0,
        "{body}"
    );
    assert!(usage["memory_mib_ms"].as_u64().unwrap() > 0, "{body}");

    let log = std::fs::read_to_string(dir.path().join("data/function-logs/acme-echo.log"));
    assert!(log.is_ok(), "function output file: {log:?}");
    let (exit, stderr) = agent.terminate();
    assert!(exit.success(), "agent exit {exit:?}: {stderr}");
    println!(
        "process runtime: pid {pid} crashed (2 calls -> 502 function_crashed), restarted as {pid2}, released"
    );
}

/// Two process functions that do not fit on the GPU together: each
/// swap-out stops the evicted one's process, each swap-in starts it again
/// (a new pid: process runtimes pay a cold start).
#[actix_rt::test]
async fn swapping_a_process_function_out_and_in_restarts_its_process() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let dir = tempfile::tempdir().unwrap();
    let (mut agent, ingress, conn) = start(dir.path(), &ca, &mut region).await;
    let big = |name: &str| FunctionSpec {
        name: name.into(),
        tier: Tier::Oversubscribed,
        memory_mib: 10_240,
        ..echo_spec()
    };
    assign(&conn, 1, &[big("a"), big("b")]).await;
    let pid_of = |body: &str| json(body)["pid"].as_u64().unwrap();
    let mut pids = Vec::new();
    let t0 = Instant::now();
    for name in ["a", "b", "a", "b"] {
        let until = Instant::now() + Duration::from_secs(30);
        let body = loop {
            let (status, body) = invoke_fn(ingress, name, "{}").await;
            if status == 200 {
                break body;
            }
            assert!(Instant::now() < until, "{name}: {status} {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        pids.push(pid_of(&body));
    }
    println!(
        "process swap: a, b, a, b served in {:?} (pids {pids:?})",
        t0.elapsed()
    );
    assert_ne!(pids[0], pids[2], "a was not restarted after its swap-out");
    assert_ne!(pids[1], pids[3], "b was not restarted after its swap-out");
    assert!(
        gone(pids[0], GONE_WITHIN).await && gone(pids[1], GONE_WITHIN).await,
        "swapped-out processes left"
    );
    assert!(metric(ingress, "swap_outs_total").await >= 2);
    assert!(metric(ingress, "process_starts_total").await >= 4);
    metric_reaches(ingress, "process_running", 1).await;
    assert_eq!(metric(ingress, "process_crashes_total").await, 0);
    let (exit, stderr) = agent.terminate();
    assert!(exit.success(), "agent exit {exit:?}: {stderr}");
    for pid in &pids[2..] {
        assert!(gone(*pid, GONE_WITHIN).await, "{pid} outlived the agent");
    }
}

#[actix_rt::test]
async fn stopping_the_agent_stops_its_function_processes() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let dir = tempfile::tempdir().unwrap();
    let (mut agent, ingress, conn) = start(dir.path(), &ca, &mut region).await;
    assign(&conn, 1, &[echo_spec()]).await;
    let first = first_echo(ingress).await;
    let (pid, child) = (
        first["pid"].as_u64().unwrap(),
        first["child_pid"].as_u64().unwrap(),
    );
    let (exit, stderr) = agent.terminate();
    assert!(exit.success(), "agent exit {exit:?}: {stderr}");
    // Stopped by the agent (SIGTERM to its group), not killed on drop.
    assert!(
        stderr.contains("function process stopped"),
        "no graceful stop logged: {stderr}"
    );
    assert!(
        gone(pid, GONE_WITHIN).await,
        "function server {pid} outlived the agent"
    );
    assert!(
        gone(child, GONE_WITHIN).await,
        "its child {child} outlived the agent"
    );
}

/// `kill -9` of the agent leaves its function processes running (they are
/// in their own process groups); the next agent on the node stops them
/// before it starts anything (the process ledger in its data dir).
#[actix_rt::test]
async fn a_restarted_agent_stops_the_processes_its_killed_predecessor_left() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let dir = tempfile::tempdir().unwrap();
    let (mut agent, ingress, conn) = start(dir.path(), &ca, &mut region).await;
    assign(&conn, 1, &[echo_spec()]).await;
    let first = first_echo(ingress).await;
    let (pid, child) = (
        first["pid"].as_u64().unwrap(),
        first["child_pid"].as_u64().unwrap(),
    );
    let mut killed = agent.0.take().expect("agent running");
    killed.kill().unwrap();
    killed.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        alive(pid) && alive(child),
        "the function process should outlive a kill -9 of its agent"
    );

    let (mut agent2, ingress2, conn2) = start(dir.path(), &ca, &mut region).await;
    assert!(
        gone(pid, GONE_WITHIN).await,
        "leftover server {pid} not stopped by the new agent"
    );
    assert!(
        gone(child, GONE_WITHIN).await,
        "leftover child {child} not stopped by the new agent"
    );
    assign(&conn2, 1, &[echo_spec()]).await;
    let again = first_echo(ingress2).await;
    assert_ne!(again["pid"].as_u64(), Some(pid));
    let (exit, stderr) = agent2.terminate();
    assert!(exit.success(), "agent exit {exit:?}: {stderr}");
    assert!(
        stderr.contains("left running by a previous agent"),
        "reaping not logged: {stderr}"
    );
    println!("process ledger: leftover pid {pid} (child {child}) stopped by the next agent");
}

#[test]
fn a_missing_template_is_refused_at_its_key() {
    let ca = new_ca();
    let dir = tempfile::tempdir().unwrap();
    write_agent_files(dir.path(), &ca, free_port());
    std::fs::remove_file(dir.path().join("runtimes/echo.toml")).unwrap();
    let out = Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(dir.path().join("agent.toml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("runtimes.custom.template: cannot read template")
            && err.contains("(got \"runtimes/echo.toml\")"),
        "{err}"
    );
    let line = err.lines().next().unwrap_or("");
    assert!(line.contains("agent.toml:"), "{err}");
}

/// The upload function (`tests/fixtures/upload_server.py`) as `acme/upload`.
fn upload_spec() -> FunctionSpec {
    FunctionSpec {
        name: "upload".into(),
        runtime: Runtime::Sglang,
        ..echo_spec()
    }
}

/// A request body streams to the function as it arrives: a chunked upload's
/// first part reaches the function (which says so on its streamed reply)
/// before the client sends the second. `max_request_bytes` is a running
/// count: a length announced over it is refused at once (413); a chunked
/// body that passes it aborts the call (413, saying how much the function
/// had been passed) or, once the reply streams, cuts the reply.
#[actix_rt::test]
async fn a_request_body_streams_to_the_function_as_it_arrives() {
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let dir = tempfile::tempdir().unwrap();
    let (_agent, ingress, conn) = start_edited(dir.path(), &ca, &mut region, |c| {
        format!("max_request_bytes = 4096\n{c}")
    })
    .await;
    assign(&conn, 1, &[echo_spec(), upload_spec()]).await;
    first_echo(ingress).await;
    let path = "/v1/invoke/acme/upload/in";
    let upload = |part1: Vec<u8>, part2: Vec<u8>, path: &'static str| {
        tokio::task::spawn_blocking(move || {
            upload_in_two_parts(ingress, path, TOKEN, &part1, &part2)
        })
    };
    // The process may still be starting: the first answer may be a 5xx.
    let until = Instant::now() + Duration::from_secs(30);
    let (acked, raw) = loop {
        let (acked, raw) = upload(b"hello".to_vec(), b"world!!".to_vec(), path)
            .await
            .unwrap();
        if raw.starts_with("HTTP/1.1 200") || Instant::now() > until {
            break (acked, raw);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(
        acked,
        "the function did not see part 1 before part 2 was sent: {raw}"
    );
    assert!(
        raw.contains("got 12\n") && raw.contains("done 12\n"),
        "{raw}"
    );
    assert!(raw.ends_with("0\r\n\r\n"), "{raw}");

    // Larger than the cap would allow whole: 3 KiB, then 1 KiB (4 KiB in all).
    let (acked, raw) = upload(vec![b'a'; 3072], vec![b'b'; 1024], path)
        .await
        .unwrap();
    assert!(acked && raw.contains("done 4096\n"), "{raw}");

    // Announced over the cap: refused before anything is read.
    let (status, headers, body) = tokio::task::spawn_blocking(move || {
        exchange(
            ingress,
            format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
                 Content-Length: 5000\r\nConnection: close\r\n\r\n"
            ),
        )
    })
    .await
    .unwrap();
    assert_eq!(status, 413, "{body}");
    assert_eq!(header(&headers, "x-gshare-error"), Some("body_too_large"));
    assert_eq!(json(&body)["error"]["code"], "body_too_large");

    // Over the cap while it streams, the function answering only at the
    // body's end: the call is aborted and the answer says how far it got.
    let (status, headers, body) = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(ingress).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
             X-Reply-After-Body: 1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
             c00\r\n{}\r\n",
            "a".repeat(3072)
        )
        .unwrap();
        // Let part 1 reach the function before the part that passes the cap.
        std::thread::sleep(Duration::from_millis(300));
        write!(s, "800\r\n{}\r\n0\r\n\r\n", "b".repeat(2048)).unwrap();
        let mut raw = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Ok(n @ 1..) = s.read(&mut chunk) {
            raw.extend_from_slice(&chunk[..n]);
        }
        let out = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let headers: Vec<(String, String)> = head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        (status, headers, body.to_string())
    })
    .await
    .unwrap();
    assert_eq!(status, 413, "{headers:?} {body}");
    assert_eq!(header(&headers, "x-gshare-error"), Some("body_too_large"));
    let message = json(&body)["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(message.contains("aborted after 3072 bytes"), "{message}");

    // Over the cap once the reply streams: the reply is cut (no last chunk).
    let (acked, raw) = upload(vec![b'a'; 3000], vec![b'b'; 2000], path)
        .await
        .unwrap();
    assert!(acked, "{raw}");
    assert!(
        raw.starts_with("HTTP/1.1 200") && !raw.contains("done") && !raw.ends_with("0\r\n\r\n"),
        "{raw}"
    );
}

/// Request bodies of every shape at the agent's ingress
/// (`body_idle_timeout_ms = 1000` here):
/// - a chunked upload on a GET reaches the function chunked, whole (hyper
///   alone would send a GET of unknown length without its body);
/// - a small body with a `Content-Length` is read whole before the call:
///   sent in two writes 300 ms apart, the function reads it in one piece;
/// - an upload that stalls is cut at the idle timeout: the call is aborted
///   and the client gets `408 body_timeout` (the bound below is a hang
///   guard, generous on purpose, not a timing assert).
#[actix_rt::test]
async fn a_chunked_get_arrives_a_small_body_comes_whole_and_a_stalled_upload_is_cut() {
    use gshare_tests::raw_http::paced;
    let ca = new_ca();
    let mut region = fake_region(&ca);
    let dir = tempfile::tempdir().unwrap();
    let (_agent, ingress, conn) = start_edited(dir.path(), &ca, &mut region, |c| {
        format!("body_idle_timeout_ms = 1000\n{c}")
    })
    .await;
    assign(&conn, 1, &[echo_spec(), upload_spec()]).await;
    first_echo(ingress).await;
    let path = "/v1/invoke/acme/upload/in";
    let send = |parts: Vec<String>, pause_ms: u64| {
        tokio::task::spawn_blocking(move || {
            let parts: Vec<&[u8]> = parts.iter().map(|p| p.as_bytes()).collect();
            paced(ingress, &parts, Duration::from_millis(pause_ms))
        })
    };
    let head = |method: &str, framing: &str| {
        format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
             {framing}\r\nConnection: close\r\n\r\n"
        )
    };

    // A chunked GET (the process may still be starting: the first answer
    // may be a 5xx).
    let until = Instant::now() + Duration::from_secs(30);
    let get = loop {
        let parts = vec![
            head("GET", "Transfer-Encoding: chunked"),
            "3\r\nhel\r\n".to_string(),
            "2\r\nlo\r\n0\r\n\r\n".to_string(),
        ];
        let r = send(parts, 100).await.unwrap();
        if r.status == 200 || Instant::now() > until {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(get.status, 200, "{get:?}");
    assert!(
        get.body.contains("framing chunked") && get.body.contains("done 5\n"),
        "{get:?}"
    );

    // A small body with its length, in two writes: read whole first.
    let parts = vec![
        format!("{}hel", head("POST", "Content-Length: 5")),
        "lo".to_string(),
    ];
    let small = send(parts, 300).await.unwrap();
    assert_eq!(small.status, 200, "{small:?}");
    assert!(
        small.body.contains("framing length")
            && small.body.contains("got 5\n")
            && !small.body.contains("got 3\n")
            && small.body.contains("done 5\n"),
        "{small:?}"
    );

    // Part of a chunked body, then nothing: cut at the idle timeout.
    let started = Instant::now();
    let parts = vec![format!(
        "{}3\r\nabc\r\n",
        head(
            "POST",
            "X-Reply-After-Body: 1\r\nTransfer-Encoding: chunked"
        )
    )];
    let stalled = send(parts, 0).await.unwrap();
    let took = started.elapsed();
    gshare_tests::raw_http::assert_error(&stalled, 408, "body_timeout", false);
    assert!(
        stalled.body.contains("1000 ms") && stalled.body.contains("after 3 bytes"),
        "{stalled:?}"
    );
    assert!(took < Duration::from_secs(20), "answered after {took:?}");

    // A small body that stalls is cut the same way (nothing ran).
    let parts = vec![format!("{}hel", head("POST", "Content-Length: 5"))];
    let stalled = send(parts, 0).await.unwrap();
    gshare_tests::raw_http::assert_error(&stalled, 408, "body_timeout", false);
}
