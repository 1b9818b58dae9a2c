//! The transparent, streaming invoke path through replicas: 3 real
//! `gshare-region` replicas and a real `gshare-edge` agent linked to
//! replica 1 (metering on, the `process` driver running
//! `tests/fixtures/openai_server.py`), the Python `openai` client pointed at
//! `http://<replica 2>/v1/invoke/acme/chat/v1`.
//!
//! - The client's calls pass through replica 2, its HTTP hand-over to
//!   replica 1 (the pooled client, the body streamed) and replica 1's QUIC
//!   stream to the agent (`InvokeHttp`): the model list, a chat completion,
//!   a streamed one whose tokens arrive as they come (the server holds its
//!   last token until the client has seen the first).
//! - The function's own statuses pass through unchanged, with no
//!   `X-Gshare-Error`; gshare's own errors keep the one shape.
//! - A stream still running at its deadline is cut at the client.
//! - Under an `Idempotency-Key`, a retry gets the stored answer with the
//!   function's status and headers (`X-Gshare-Replayed: 1`), a streamed one
//!   included; a stream that was cut replays as truncated.

use gshare_tests::openai::{exchange, header, openai_package, python3, OPENAI_SERVER};
use gshare_tests::{call, json_of, until, AgentProcess, TestRegion, TOKEN};
use serde_json::{json, Value};
use std::time::Duration;

/// A raw request to `acme/chat`'s transparent route at `addr` (`Connection:
/// close`), with `extra` header lines (each ending `\r\n`).
fn raw(method: &str, suffix: &str, token: &str, extra: &str, body: &str) -> String {
    format!(
        "{method} /v1/invoke/acme/chat{suffix} HTTP/1.1\r\nHost: x\r\n\
         Authorization: Bearer {token}\r\n{extra}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The `content` of every server-sent chat chunk in `body`, in order.
fn deltas(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect()
}

#[test]
fn an_openai_client_streams_through_a_replica_and_keyed_retries_replay_the_functions_answer() {
    if !openai_package() {
        return;
    }
    // The request body cap, set on the replicas and the agent.
    let cap = "max_request_bytes = 65536\n";
    let mut region = TestRegion::with_config(3, cap).expect("region");
    for id in 1..=3 {
        region.start(id, id == 1).expect("start");
    }
    region
        .wait_leader(&[1, 2, 3], Duration::from_secs(15))
        .expect("leader");
    let http = region.http(1);
    let r = until("token", 30, || {
        let r = call(http, "POST", "/v1/tenants/acme/tokens", TOKEN, None);
        (r.status == 201).then_some(r)
    });
    let acme = json_of(&r)["token"].as_str().unwrap().to_string();
    let gate = region.root().join("first-delta-seen");
    let f = json!({
        "name": "chat", "runtime": "pytorch", "model": "org/tiny-chat",
        "args": ["--hold-last-for", gate.to_string_lossy()],
        "memory_mib": 3000, "compute_milli": 400, "tier": "guaranteed",
        "deadline_ms": 20000, "pool": "center", "min_instances": 1, "max_instances": 1,
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
    });
    let template = region.root().join("openai.toml");
    std::fs::write(
        &template,
        format!(
            r#"runtime = "pytorch"
command = ["python3", {OPENAI_SERVER:?}, "--port", "{{port}}", "--model", "{{model}}"]
health_path = "/health"
invoke_path = "/v1/chat/completions"
startup_timeout_s = 20
stop_grace_s = 5
allow_args = ["--hold-last-for="]
"#
        ),
    )
    .unwrap();
    let extra = format!(
        "[metering]\ninterval_ms = 200\n[runtimes.pytorch]\ndriver = \"process\"\ntemplate = {:?}\n",
        template.to_string_lossy()
    );
    let quic = [region.replicas[&1].raft_addr];
    let (config, ingress) = region
        .sim_agent_config_via(node, &quic, "center", "center", 2, &extra)
        .expect("agent config");
    // The cap is a top-level key (the helper puts `extra` after a section).
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{cap}{text}")).unwrap();
    let _agent = AgentProcess::start(&config);

    // The official client through the replica: the model list, a chat
    // completion, and a stream whose last token waits for the first ones
    // to reach the client (a relay that buffered would get `LATE`).
    let script = r#"
import json, os, openai
c = openai.OpenAI(base_url=os.environ["BASE_URL"], api_key=os.environ["TOKEN"], max_retries=0)
out = {"models": [m.id for m in c.models.list().data]}
r = c.chat.completions.create(model="org/tiny-chat", messages=[{"role": "user", "content": "hi there"}])
out["reply"] = r.choices[0].message.content
open(os.environ["GATE"], "a").close()
os.remove(os.environ["GATE"])
s = c.chat.completions.create(model="org/tiny-chat", messages=[{"role": "user", "content": "one two three"}], stream=True)
deltas = []
for ch in s:
    if ch.choices and ch.choices[0].delta.content:
        deltas.append(ch.choices[0].delta.content)
        open(os.environ["GATE"], "a").close()
out["deltas"] = deltas
try:
    openai.OpenAI(base_url=os.environ["BASE_URL"], api_key="nobody", max_retries=0).models.list()
    out["wrong_token"] = "accepted"
except openai.AuthenticationError as e:
    out["wrong_token"] = e.response.headers.get("x-gshare-error")
print(json.dumps(out))
"#;
    // Replica 2 does not hold the agent's link: it hands the call to
    // replica 1, which does.
    let base_url = format!("http://{}/v1/invoke/acme/chat/v1", region.http(2));
    let out = until("the client through the replica", 60, || {
        let run = python3()
            .args(["-c", script])
            .env("BASE_URL", &base_url)
            .env("TOKEN", &acme)
            .env("GATE", &gate)
            .output()
            .unwrap();
        if !run.status.success() {
            eprintln!("not yet: {}", String::from_utf8_lossy(&run.stderr));
            return None;
        }
        serde_json::from_slice::<Value>(&run.stdout).ok()
    });
    assert_eq!(out["models"], json!(["org/tiny-chat"]), "{out}");
    assert_eq!(out["reply"], "echo: hi there", "{out}");
    assert_eq!(
        out["deltas"],
        json!(["echo:", " one", " two", " three"]),
        "the last token waited for a client that saw nothing yet"
    );
    assert_eq!(out["wrong_token"], "unauthorized", "{out}");

    let ask = |method: &str, suffix: &str, extra: &str, body: &str| {
        exchange(http, raw(method, suffix, &acme, extra, body))
    };
    // The function's own 404 passes through as it is: no gshare error
    // header, the function's body; gshare's own 404 keeps its shape.
    let (status, headers, body) = ask("GET", "/nope", "", "");
    assert_eq!(status, 404, "{body}");
    assert_eq!(header(&headers, "x-gshare-error"), None, "{headers:?}");
    assert!(body.contains("no route /nope"), "{body}");
    let (status, headers, _) = exchange(
        http,
        raw("GET", "/v1/models", &acme, "", "").replace("acme/chat", "acme/nope"),
    );
    assert_eq!(status, 404);
    assert_eq!(header(&headers, "x-gshare-error"), Some("unknown_function"));

    // A whole reply (with a length) larger than a QUIC frame (8 MiB) comes
    // whole through replica 2's hand-over to replica 1 and the agent's
    // link: the agent sends it in chunks; the one cap is the template's
    // `max_reply_bytes` (64 MiB).
    let big = 9 << 20;
    let (status, headers, body) = exchange(
        region.http(2),
        raw("GET", &format!("/big?bytes={big}"), &acme, "", ""),
    );
    assert_eq!(status, 200, "{headers:?}");
    // (Relayed chunked: the framing's hex sizes hold no `x`.)
    assert_eq!(body.bytes().filter(|b| *b == b'x').count(), big);
    assert_eq!(
        header(&headers, "content-type"),
        Some("application/octet-stream")
    );

    // A request body over the configured cap (64 KiB here) is refused in
    // the one error shape, at a replica and at the agent's ingress.
    let over = "y".repeat(65537);
    for at in [http, region.http(2), ingress] {
        let (status, headers, body) =
            exchange(at, raw("POST", "/v1/chat/completions", &acme, "", &over));
        assert_eq!(status, 413, "{at}: {body}");
        assert_eq!(header(&headers, "x-gshare-error"), Some("body_too_large"));
        let e: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert_eq!(e["error"]["code"], "body_too_large", "{body}");
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("65536"),
            "{body}"
        );
    }

    // A client cannot pose as a replica forwarding the call: without a
    // proof the forward headers are ignored. A key claimed as one a
    // replica assigned stays the client's (an assigned key would be
    // answered pinned, `forged-1@<node>`); a node pin to a node that does
    // not exist is not followed (it would answer `503 no_agent`).
    let (status, headers, body) = ask(
        "GET",
        "/v1/models",
        "X-Gshare-Forwarded: 1\r\nX-Gshare-Key-Assigned: 1\r\nIdempotency-Key: forged-1\r\n",
        "",
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&headers, "idempotency-key"), Some("forged-1"));
    let (status, _, body) = ask(
        "GET",
        "/v1/models",
        "X-Gshare-Forwarded: 1\r\nX-Gshare-Node: nowhere\r\nIdempotency-Key: forged-2\r\n",
        "",
    );
    assert_eq!(status, 200, "{body}");
    // A proof that does not verify is refused, nothing ran.
    let made_up = format!("X-Gshare-Forward-Proof: {}\r\n", "0".repeat(64));
    for forged in [
        format!("X-Gshare-Forwarded: 1\r\nX-Gshare-Node: {node}\r\nIdempotency-Key: forged-3\r\n{made_up}"),
        format!("X-Gshare-Forwarded: 1\r\nX-Gshare-Key-Assigned: 1\r\nIdempotency-Key: forged-4\r\n{made_up}"),
        made_up.clone(),
    ] {
        let (status, headers, body) = ask("GET", "/v1/models", &forged, "");
        assert_eq!(status, 403, "{forged}: {body}");
        assert_eq!(header(&headers, "x-gshare-error"), Some("forged_forward"));
    }

    // Under a key, a retry replays the function's answer: its status,
    // its headers and its body (a 400 stays a 400).
    let bad = "{not json";
    let key = "Idempotency-Key: bad-1\r\n";
    let (s1, h1, b1) = ask("POST", "/v1/chat/completions", key, bad);
    let (s2, h2, b2) = ask("POST", "/v1/chat/completions", key, bad);
    assert_eq!((s1, s2), (400, 400), "{b1} / {b2}");
    assert_eq!(header(&h1, "x-gshare-replayed"), None, "{h1:?}");
    assert_eq!(header(&h2, "x-gshare-replayed"), Some("1"), "{h2:?}");
    assert_eq!(header(&h2, "content-type"), Some("application/json"));
    assert_eq!(b1, b2);

    // A streamed reply under a key streams (chunked), and its retry gets
    // it whole from the key, with the function's content type.
    std::fs::write(&gate, b"").unwrap();
    let stream = r#"{"model":"org/tiny-chat","stream":true,"messages":[{"role":"user","content":"four five"}]}"#;
    let key = "Idempotency-Key: stream-1\r\n";
    let (s1, h1, b1) = ask("POST", "/v1/chat/completions", key, stream);
    assert_eq!(s1, 200, "{b1}");
    assert_eq!(header(&h1, "transfer-encoding"), Some("chunked"), "{h1:?}");
    assert_eq!(deltas(&b1), ["echo:", " four", " five"], "{b1}");
    let (s2, h2, b2) = ask("POST", "/v1/chat/completions", key, stream);
    assert_eq!(s2, 200, "{b2}");
    assert_eq!(header(&h2, "x-gshare-replayed"), Some("1"), "{h2:?}");
    assert_eq!(header(&h2, "content-type"), Some("text/event-stream"));
    assert_eq!(deltas(&b2), ["echo:", " four", " five"], "{b2}");
    assert!(b2.contains("[DONE]"), "{b2}");
    // The same key through replica 2 (its hand-over to replica 1) replays
    // the same answer.
    let (s3, h3, b3) = exchange(
        region.http(2),
        raw("POST", "/v1/chat/completions", &acme, key, stream),
    );
    assert_eq!(s3, 200, "{b3}");
    assert_eq!(header(&h3, "x-gshare-replayed"), Some("1"), "{h3:?}");
    assert_eq!(deltas(&b3), ["echo:", " four", " five"], "{b3}");

    // The gate gone, the server holds the last token past a 1 s deadline:
    // the client gets the head and the first tokens, then the connection
    // closes without the chunked body's last chunk. Its key replays it as
    // truncated, with the function's status.
    std::fs::remove_file(&gate).unwrap();
    let extra = "X-Gshare-Deadline-Ms: 1000\r\nIdempotency-Key: cut-1\r\n";
    let (status, headers, body) = ask("POST", "/v1/chat/completions", extra, stream);
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&headers, "content-type"), Some("text/event-stream"));
    assert!(
        body.contains(r#""content": " four""#),
        "first tokens: {body}"
    );
    assert!(!body.contains("LATE") && !body.contains("[DONE]"), "{body}");
    assert!(
        !body.ends_with("0\r\n\r\n"),
        "the cut reply looks complete: {body}"
    );
    let (status, headers, body) = ask("POST", "/v1/chat/completions", extra, stream);
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&headers, "x-gshare-replayed"), Some("truncated"));
    let marker: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(marker["replayed_truncated"], true, "{body}");
}
