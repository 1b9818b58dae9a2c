//! What the binaries log, as an operator reads it from a file or journald:
//! no ANSI colour when stderr is not a terminal, `--log-format json` gives one
//! JSON object per line, and a normal start of a region logs no ERROR.

use gshare_tests::TestRegion;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// One region at a time: the machine has few cores.
static SERIAL: Mutex<()> = Mutex::new(());

const LEADER_WAIT: Duration = Duration::from_secs(20);

fn region_logs(extra: &[&str]) -> Vec<String> {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut region = TestRegion::new(3).unwrap();
    // One at a time with a pause, as an operator brings replicas up: the
    // first ones ask for votes from peers that are not up yet.
    for id in 1..=3 {
        region.start_with_args(id, id == 1, extra).unwrap();
        std::thread::sleep(Duration::from_millis(700));
    }
    region.wait_leader(&[1, 2, 3], LEADER_WAIT).unwrap();
    // A write, so the followers have been replicated to.
    region
        .write("logs-k", "v", Duration::from_secs(15))
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let logs: Vec<String> = (1..=3).map(|id| region.stderr(id, 1)).collect();
    for (i, l) in logs.iter().enumerate() {
        println!("--- replica {} ---\n{l}", i + 1);
    }
    logs
}

#[test]
fn a_normal_region_start_logs_no_error_and_no_colour() {
    let logs = region_logs(&[]);
    for (i, log) in logs.iter().enumerate() {
        assert!(
            !log.contains('\u{1b}'),
            "replica {}: ANSI escapes in a file:\n{log}",
            i + 1
        );
        let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
        assert!(errors.is_empty(), "replica {}: {errors:#?}", i + 1);
    }
    // The first replica waited for its peers and says so once per peer, not
    // once per vote request.
    let waiting = logs[0]
        .lines()
        .filter(|l| l.contains("waiting for the replica to come up"))
        .count();
    assert!((1..=2).contains(&waiting), "{waiting} lines:\n{}", logs[0]);
}

#[test]
fn json_logs_are_one_object_per_line() {
    let logs = region_logs(&["--log-format", "json"]);
    // The first replica at least has something to say (it waited for its peers).
    assert!(!logs[0].trim().is_empty(), "replica 1 logged nothing");
    for (i, log) in logs.iter().enumerate() {
        for line in log.lines() {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("replica {}: not JSON ({e}): {line}", i + 1));
            assert!(
                v["level"].is_string() && v["timestamp"].is_string(),
                "{line}"
            );
            assert!(v["fields"]["message"].is_string(), "{line}");
            assert_ne!(v["level"], "ERROR", "{line}");
        }
    }
}

/// An agent with `backend = "nvml"` (no driver on CI: the fallback warning)
/// and a region that is not there, stopped with SIGTERM after `run_for`.
fn agent_log(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    for args in [
        vec!["certs", "init", "--dir"],
        vec!["certs", "issue", "--name", "n1", "--dir"],
    ] {
        let o = Command::new(gshare_tests::binary("gsharectl"))
            .args(&args)
            .arg(&certs)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        "node = \"n1\"\npool = \"center\"\npool_kind = \"center\"\ndata_dir = \"data\"\n\
         ingress_addr = \"127.0.0.1:0\"\nhost_swap_mib = 1024\n\n\
         [gpus]\nbackend = \"nvml\"\nnvml_fallback = \"simulated\"\n\n\
         [[gpus.simulated]]\nmodel = \"g\"\nmemory_mib = 1024\nh2d_mib_per_s = 1000\n\n\
         [[replicas]]\nquic_addr = \"127.0.0.1:9\"\n\n\
         [tls]\nca_cert = \"certs/ca.pem\"\ncert = \"certs/n1.pem\"\nkey = \"certs/n1.key\"\n",
    )
    .unwrap();
    let child = Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(&config)
        .args(extra)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let o = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&o.stderr).into_owned();
    println!("{log}");
    log
}

fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect()
}

#[test]
fn the_agent_logs_without_colour_to_a_pipe_and_as_json_when_asked() {
    let text = agent_log(&[]);
    assert!(text.contains("starting"), "{text}");
    assert!(!text.contains('\u{1b}'), "ANSI escapes in a pipe:\n{text}");

    let json = agent_log(&["--log-format", "json"]);
    let lines = json_lines(&json);
    assert!(
        lines.iter().any(|v| v["fields"]["message"] == "starting"),
        "{json}"
    );
    assert!(lines.iter().all(|v| v["level"].is_string()), "{json}");

    // A fatal error is a JSON line too, naming what failed.
    let o = Command::new(gshare_tests::binary("gshare-edge"))
        .args([
            "--config",
            "/nonexistent/agent.toml",
            "--log-format",
            "json",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    let lines = json_lines(&err);
    assert_eq!(lines.len(), 1, "{err}");
    assert_eq!(lines[0]["level"], "ERROR", "{err}");
    assert!(
        lines[0]["fields"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("/nonexistent/agent.toml")),
        "{err}"
    );

    let bad = Command::new(gshare_tests::binary("gshare-edge"))
        .args(["--config", "x.toml", "--log-format", "yaml"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("[possible values: text, json]"));
}

#[test]
fn the_agent_says_which_replica_leads_when_it_registers() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut region = TestRegion::new(3).unwrap();
    for id in 1..=3 {
        region.start(id, id == 1).unwrap();
    }
    let leader = region.wait_leader(&[1, 2, 3], LEADER_WAIT).unwrap();
    let certs = region.certs();
    let (ok, out) = region
        .gsharectl(&[
            "certs",
            "issue",
            "--dir",
            certs.to_str().unwrap(),
            "--name",
            "local-c1",
        ])
        .unwrap();
    assert!(ok, "{out}");
    let replicas: String = region
        .replicas
        .values()
        .map(|r| format!("[[replicas]]\nquic_addr = \"{}\"\n", r.raft_addr))
        .collect();
    let config = region.root().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "node = \"local-c1\"\npool = \"center\"\npool_kind = \"center\"\ndata_dir = \"data/agent\"\n\
             ingress_addr = \"127.0.0.1:0\"\nhost_swap_mib = 8192\n\
             [gpus]\nbackend = \"simulated\"\n\
             [[gpus.simulated]]\nmodel = \"sim-gpu-16g\"\nmemory_mib = 16384\nh2d_mib_per_s = 12000\ncount = 2\n\
             {replicas}\n[tls]\nca_cert = \"certs/ca.pem\"\ncert = \"certs/local-c1.pem\"\nkey = \"certs/local-c1.key\"\n"
        ),
    )
    .unwrap();
    let log_path = region.root().join("agent.err");
    let mut agent = Command::new(gshare_tests::binary("gshare-edge"))
        .arg("--config")
        .arg(&config)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log_path).unwrap()))
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let line = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Some(l) = log
            .lines()
            .find(|l| l.contains("registered with the region"))
        {
            break l.to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never registered:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = agent.kill();
    let _ = agent.wait();
    println!("{line}");
    // The leader may have changed since wait_leader, but it is a replica.
    assert!(
        (1..=3).any(|id| line.contains(&format!("region_leader=replica {id}"))),
        "{line} (leader was {leader})"
    );
    assert!(!line.contains("leader=0"), "{line}");
}
