//! HTTPS off loopback: real replicas with `[http_tls]` and an agent whose
//! ingress has `[http_tls]` too. `gsharectl --region https://… --ca`
//! works with the operator CA and is refused with another CA; plain HTTP
//! gets no answer from a TLS listener; invocations through every replica
//! reach the agent (the replicas without its link forward to a peer over
//! TLS). A non-loopback bind without TLS is refused at start.

use gshare_region::http_client::{request_to, HttpReply, HttpTarget};
use gshare_tests::{TestRegion, TOKEN};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

struct Tls(Arc<rustls::ClientConfig>);

impl Tls {
    fn call(
        &self,
        addr: SocketAddr,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&str>,
    ) -> HttpReply {
        let target = HttpTarget::tls(addr, self.0.clone());
        request_to(
            &target,
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
}

#[test]
fn the_api_and_the_ingress_speak_https_with_the_operator_ca() {
    let mut region = TestRegion::new(3).expect("region");
    for id in 1..=3 {
        let config = region.replicas[&id].config.clone();
        let mut text = std::fs::read_to_string(&config).unwrap();
        text.push_str(&format!(
            "\n[http_tls]\ncert = \"certs/r{id}.pem\"\nkey = \"certs/r{id}.key\"\n"
        ));
        std::fs::write(&config, text).unwrap();
    }
    for id in 1..=3 {
        region.start(id, id == 1).expect("start");
    }
    let certs = region.certs();
    let ca = certs.join("ca.pem");
    let tls = Tls(Arc::new(
        gshare_region::tls::http_client_config(&ca).unwrap(),
    ));
    let http = region.http(1);
    until("leader over https", || {
        let r = tls.call(http, "GET", "/v1/cluster", TOKEN, None);
        let v: Value = serde_json::from_str(&r.body).ok()?;
        v["leader"].as_u64()
    });
    until("tenants loaded", || {
        let r = tls.call(http, "GET", "/v1/tenants", TOKEN, None);
        let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        v.as_array().is_some_and(|a| a.len() == 2).then_some(())
    });

    // gsharectl over https with the operator CA: a round trip.
    let url = format!("https://{http}");
    let (ok, out) = region
        .gsharectl(&[
            "tenant",
            "ls",
            "--region",
            &url,
            "--ca",
            ca.to_str().unwrap(),
            "--token",
            TOKEN,
        ])
        .unwrap();
    assert!(
        ok && out.contains("acme") && out.contains("globex"),
        "{out}"
    );
    // With another CA the server's certificate is refused (its issuer has
    // the same name, so the signature check is what fails).
    let other = region.root().join("other-ca");
    gshare_region::tls::init_ca(&other).unwrap();
    let (ok, out) = region
        .gsharectl(&[
            "tenant",
            "ls",
            "--region",
            &url,
            "--ca",
            other.join("ca.pem").to_str().unwrap(),
            "--token",
            TOKEN,
        ])
        .unwrap();
    assert!(!ok, "{out}");
    assert!(out.contains("invalid peer certificate"), "{out}");
    // https without a CA is refused before anything is sent.
    let (ok, out) = region
        .gsharectl(&["tenant", "ls", "--region", &url, "--token", TOKEN])
        .unwrap();
    assert!(!ok && out.contains("--ca"), "{out}");
    // Plain HTTP to the TLS listener gets no HTTP answer.
    let plain = gshare_region::http_client::request(
        http,
        "GET",
        "/v1/tenants",
        Some(TOKEN),
        None,
        Duration::from_secs(5),
    );
    assert!(
        plain.as_ref().map_or(true, |r| r.status == 400),
        "{plain:?}"
    );

    // A function, placed on a center node; its agent serves HTTPS.
    let r = until("token", || {
        let r = tls.call(http, "POST", "/v1/tenants/acme/tokens", TOKEN, None);
        (r.status == 201).then_some(r)
    });
    let acme = serde_json::from_str::<Value>(&r.body).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let f = json!({
        "name": "hello", "runtime": "pytorch", "memory_mib": 3000, "compute_milli": 400,
        "tier": "guaranteed", "deadline_ms": 2000, "pool": "center", "min_instances": 1,
        "latency": {"full_gpu_us": 2000, "saturation_milli": 400},
    })
    .to_string();
    let r = until("deploy", || {
        let r = tls.call(http, "POST", "/v1/functions", &acme, Some(&f));
        (r.status != 0 && r.status != 503).then_some(r)
    });
    assert!(r.status == 200 || r.status == 201, "{r:?}");
    let node = until("placed", || {
        let r = tls.call(http, "GET", "/v1/cluster/state", TOKEN, None);
        let s =
            serde_json::from_str::<Value>(&r.body).unwrap_or(Value::Null)["instances"].to_string();
        ["local-c1", "local-c2"]
            .into_iter()
            .find(|n| s.contains(&format!("\"{n}\"")))
    });
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
    let ingress = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let replicas: String = region
        .replicas
        .values()
        .map(|r| format!("[[replicas]]\nquic_addr = \"{}\"\n", r.raft_addr))
        .collect();
    let config = region.root().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            r#"node = "{node}"
pool = "center"
pool_kind = "center"
data_dir = "data/agent"
ingress_addr = "{ingress}"
host_swap_mib = 8192
heartbeat_ms = 200
[gpus]
backend = "simulated"
[[gpus.simulated]]
model = "sim-gpu-16g"
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
[http_tls]
cert = "certs/{node}.pem"
key = "certs/{node}.key"
"#
        ),
    )
    .unwrap();
    let mut agent = Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let served = until("served by the agent over https", || {
        let r = tls.call(ingress, "POST", "/v1/invoke/acme/hello", &acme, Some("{}"));
        (r.status == 200).then_some(r)
    });
    assert_eq!(served.body, "{}");
    // Through every replica (the ones without the agent's link forward to
    // a peer over TLS).
    for id in 1..=3 {
        let r = until("served through a replica", || {
            let r = tls.call(
                region.http(id),
                "POST",
                "/v1/invoke/acme/hello",
                &acme,
                Some("via"),
            );
            (r.status == 200).then_some(r)
        });
        assert_eq!(r.body, "via", "replica {id}");
    }
    let _ = agent.kill();
    let _ = agent.wait();

    // A replica bound off loopback without [http_tls] does not start.
    let bad = region.root().join("r-bad.toml");
    let text = std::fs::read_to_string(&region.replicas[&1].config)
        .unwrap()
        .replace(
            &format!("http_addr = \"{http}\""),
            "http_addr = \"0.0.0.0:1\"",
        );
    let text = text[..text.find("[http_tls]").unwrap()].to_string();
    std::fs::write(&bad, text).unwrap();
    let out = Command::new(gshare_tests::binary("gshare-region"))
        .arg("--config")
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        // file:line:col, then the key path.
        err.contains("r-bad.toml:4:")
            && err.contains(": http_addr: 0.0.0.0")
            && err.contains("[http_tls]"),
        "{err}"
    );
}
