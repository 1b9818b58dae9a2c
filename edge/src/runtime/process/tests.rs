//! Tests of the process driver, end to end with `tests/fixtures/echo_server.py`.

use super::*;
use std::time::Duration;

const ECHO: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/echo_server.py"
);

fn echo_template(extra_args: &[&str]) -> RuntimeTemplate {
    let mut args: Vec<String> = ["python3", ECHO, "--port", "{port}"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra_args.iter().map(|s| s.to_string()));
    let text = format!(
        "runtime = \"custom\"\ncommand = {}\nhealth_path = \"/health\"\ninvoke_path = \"/invoke\"\nstartup_timeout_s = 20\nstop_grace_s = 5\n[env]\nGSHARE_TEST_EXTRA = \"{{instance}}@{{gpu}}:{{compute_percent}}\"\n",
        toml_array(&args)
    );
    RuntimeTemplate::parse(&text, "echo.toml").unwrap()
}

fn toml_array(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

fn slice() -> SliceLimits {
    SliceLimits {
        gpus: vec![2],
        compute_milli: 250,
        memory_mib: 4096,
        gpu_memory_mib: Some(16_384),
    }
}

fn spec(extra_args: &[&str]) -> ProcessSpec {
    let mut s = ProcessSpec::from_template(
        &echo_template(extra_args),
        "i-7",
        FunctionArgs::model("m"),
        0,
        slice(),
    )
    .unwrap();
    s.backoff = Backoff {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(400),
        reset_after: Duration::from_secs(60),
    };
    s.stop_grace = Duration::from_millis(400);
    s
}

fn json(resp: &HttpResponse) -> serde_json::Value {
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    serde_json::from_slice(&resp.body).unwrap()
}

/// Whether a process is gone (no /proc entry, or a zombie nobody reaped yet).
fn dead(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

async fn eventually_dead(pid: u64) -> bool {
    for _ in 0..250 {
        if dead(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

async fn wait_status(p: &ProcessInstance, f: impl Fn(&Status) -> bool) -> Status {
    let mut rx = p.subscribe();
    let s = tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|s| f(s)))
        .await
        .expect("status not reached in 30 s")
        .expect("status channel closed");
    *s
}

#[test]
fn template_placeholders_are_checked() {
    let t = RuntimeTemplate::parse(
        "runtime = \"vllm\"\ncommand = [\"serve\", \"--port={port}\", \"--mem={memory_fraction}\", \"{{x}}\"]\n",
        "t.toml",
    )
    .unwrap();
    assert_eq!(t.health_path, "/health");
    let s =
        ProcessSpec::from_template(&t, "i-1", FunctionArgs::model("llama"), 8123, slice()).unwrap();
    assert_eq!(s.argv, vec!["serve", "--port=8123", "--mem=0.250", "{x}"]);
    assert_eq!(s.env["CUDA_VISIBLE_DEVICES"], "2");
    assert_eq!(s.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
    assert_eq!(s.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "2=4096M");

    let err = RuntimeTemplate::parse(
        "runtime = \"x\"\ncommand = [\"a\", \"{prot}\"]\n",
        "bad.toml",
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad.toml: command[1]: unknown placeholder {prot}"
    );
    let err = RuntimeTemplate::parse("runtime = \"x\"\ncommand = [\"a\"]\nport = 3\n", "bad.toml")
        .unwrap_err();
    assert!(err.to_string().contains("unknown field `port`"), "{err}");
    let err = RuntimeTemplate::parse(
        "runtime = \"x\"\ncommand = [\"a\"]\nhealth_path = \"health\"\n",
        "bad.toml",
    )
    .unwrap_err();
    assert!(
        err.to_string().starts_with("bad.toml: health_path:"),
        "{err}"
    );
}

#[test]
fn a_function_adds_only_the_args_and_env_its_template_allows() {
    let t = RuntimeTemplate::parse(
        "runtime = \"vllm\"\ncommand = [\"serve\", \"{model}\", \"--port={port}\"]\n\
         allow_args = [\"--max-model-len=\", \"--enforce-eager\"]\nallow_env = [\"HF_TOKEN\", \"MODE\"]\n\
         [env]\nMODE = \"template\"\n",
        "vllm.toml",
    )
    .unwrap();
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let env = |e: &[(&str, &str)]| {
        e.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let render = |a: &[String], e: &std::collections::BTreeMap<String, String>| {
        let f = FunctionArgs {
            model: "org/model",
            args: a,
            env: e,
        };
        ProcessSpec::from_template(&t, "i-1", f, 8123, slice())
    };
    let (a, e) = (
        args(&[
            "--max-model-len",
            "4096",
            "--enforce-eager",
            "--max-model-len=8192",
        ]),
        env(&[("HF_TOKEN", "{not-rendered}"), ("MODE", "function")]),
    );
    let s = render(&a, &e).unwrap();
    assert_eq!(
        s.argv,
        vec![
            "serve",
            "org/model",
            "--port=8123",
            "--max-model-len",
            "4096",
            "--enforce-eager",
            "--max-model-len=8192"
        ]
    );
    assert_eq!(s.env["HF_TOKEN"], "{not-rendered}");
    assert_eq!(s.env["MODE"], "function");
    assert_eq!(s.env["CUDA_VISIBLE_DEVICES"], "2");
    // Refused: a flag not allowed, a switch given a value, a valued flag
    // without one, a variable not allowed (the slice's above all).
    for (a, e, key) in [
        (args(&["--trust-remote-code"]), env(&[]), "args[0]"),
        (args(&["--enforce-eager=1"]), env(&[]), "args[0]"),
        (args(&["--enforce-eager", "extra"]), env(&[]), "args[1]"),
        (args(&["--max-model-len"]), env(&[]), "args[0]"),
        (
            args(&["--max-model-len", "--trust-remote-code"]),
            env(&[]),
            "args[0]",
        ),
        (
            args(&[]),
            env(&[("CUDA_VISIBLE_DEVICES", "0,1")]),
            "env.CUDA_VISIBLE_DEVICES",
        ),
        (args(&[]), env(&[("LD_PRELOAD", "/x.so")]), "env.LD_PRELOAD"),
    ] {
        match render(&a, &e) {
            Err(TemplateError::NotAllowed { key: k, message }) => {
                assert_eq!(k, key, "{a:?} {e:?}: {message}")
            }
            other => panic!("{a:?} {e:?}: expected NotAllowed at {key}, got {other:?}"),
        }
    }
    // A template may not hand the slice's variables to functions.
    let err = RuntimeTemplate::parse(
        "runtime = \"x\"\ncommand = [\"a\"]\nallow_env = [\"CUDA_VISIBLE_DEVICES\"]\n",
        "bad.toml",
    )
    .unwrap_err();
    assert!(
        err.to_string().starts_with("bad.toml: allow_env[0]:"),
        "{err}"
    );
    // Nor the variables that would undo the slice or the loader.
    for name in ["LD_PRELOAD", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_DEVICE_ORDER"] {
        let err = RuntimeTemplate::parse(
            &format!(
                "runtime = \"x\"\ncommand = [\"a\"]\nallow_env = [\"HF_TOKEN\", \"{name}\"]\n"
            ),
            "bad.toml",
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with("bad.toml: allow_env[1]:")
                && err.to_string().contains("never allowable"),
            "{err}"
        );
    }
    let err = RuntimeTemplate::parse(
        "runtime = \"x\"\ncommand = [\"a\"]\nallow_args = [\"port\"]\n",
        "bad.toml",
    )
    .unwrap_err();
    assert!(
        err.to_string().starts_with("bad.toml: allow_args[0]:"),
        "{err}"
    );
}

#[test]
fn template_timeouts_no_instant_can_reach_are_refused() {
    for (key, value) in [
        ("startup_timeout_s", "18446744073709551615"),
        ("startup_timeout_s", "86401"),
        ("stop_grace_s", "18446744073709551615"),
        ("restart_max_ms", "18446744073709551615"),
    ] {
        let text = format!("runtime = \"x\"\ncommand = [\"a\"]\n{key} = {value}\n");
        let err = RuntimeTemplate::parse(&text, "bad.toml").unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("bad.toml: {key}: must be")),
            "{key} = {value}: {err}"
        );
    }
    let ok = "runtime = \"x\"\ncommand = [\"a\"]\nstartup_timeout_s = 86400\nstop_grace_s = 3600\n";
    assert!(RuntimeTemplate::parse(ok, "ok.toml").is_ok());
}

#[test]
fn slice_limits_give_mps_values() {
    let mut s = SliceLimits {
        gpus: vec![1, 3],
        compute_milli: 1000,
        memory_mib: 81_920,
        gpu_memory_mib: None,
    };
    assert_eq!(s.gpu_list(), "1,3");
    assert_eq!(s.compute_percent(), 100);
    assert_eq!(s.mps_memory_limit(MpsOrdinals::Node), "1=81920M,3=81920M");
    assert_eq!(
        s.mps_memory_limit(MpsOrdinals::Visible),
        "0=81920M,1=81920M"
    );
    assert_eq!(s.memory_fraction(), "1.000");
    s.compute_milli = 5;
    assert_eq!(s.compute_percent(), 1, "MPS needs at least 1 %");
    s.compute_milli = 333;
    assert_eq!(s.compute_percent(), 33);
}

#[test]
fn backoff_doubles_then_caps() {
    let b = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(1),
        reset_after: Duration::from_secs(5),
    };
    let d: Vec<u128> = (1..=6).map(|a| b.delay(a).as_millis()).collect();
    assert_eq!(d, vec![100, 200, 400, 800, 1000, 1000]);
    assert_eq!(b.delay(200), Duration::from_secs(1));
}

#[test]
fn example_runtime_templates_parse() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/examples/runtimes");
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let t = RuntimeTemplate::parse(&text, &path.display().to_string())
                .unwrap_or_else(|e| panic!("{e}"));
            ProcessSpec::from_template(&t, "i-1", FunctionArgs::model("model"), 9000, slice())
                .unwrap();
            seen.push(t.runtime);
        }
    }
    seen.sort();
    assert_eq!(seen, vec!["pytorch", "sglang", "tf-serving", "vllm"]);
}

#[tokio::test]
async fn starts_with_slice_env_waits_for_health_and_proxies() {
    let p = ProcessInstance::start(spec(&["--ready-after-ms", "300"]))
        .await
        .unwrap();
    assert_eq!(p.status().phase, Phase::Ready);
    let resp = p
        .invoke_with(
            FunctionCall {
                method: "POST",
                target: None,
                headers: &[
                    ("content-type", b"application/json"),
                    ("X-Gshare-Deadline-Ms", b"999999"),
                ],
                body: br#"{"hello":"world"}"#.to_vec().into(),
            },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let v = json(&resp);
    assert_eq!(v["body"], r#"{"hello":"world"}"#);
    assert_eq!(v["env"]["CUDA_VISIBLE_DEVICES"], "2");
    assert_eq!(v["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
    assert_eq!(v["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "2=4096M");
    assert_eq!(v["env"]["GSHARE_TEST_EXTRA"], "i-7@2:25");
    assert_eq!(
        v["pid"], v["pgid"],
        "the server leads its own process group"
    );
    assert_eq!(v["pid"].as_u64().map(|x| x as u32), p.status().pid);
    let left: u64 = v["deadline_ms"].as_str().unwrap().parse().unwrap();
    assert!(left <= 10_000, "remaining deadline sent: {left}");
    assert_eq!(p.in_flight(), 0);
    p.stop().await;
    assert_eq!(p.status().phase, Phase::Stopped);
}

#[tokio::test]
async fn crash_restarts_with_backoff_and_in_flight_calls_fail_explicitly() {
    let p = std::sync::Arc::new(ProcessInstance::start(spec(&[])).await.unwrap());
    let first_pid = p.status().pid.unwrap();
    // A slow call in flight when the process dies.
    let slow = {
        let p = p.clone();
        tokio::spawn(async move {
            p.invoke(br#"{"sleep_ms": 60000}"#, Duration::from_secs(120))
                .await
        })
    };
    for _ in 0..500 {
        if p.in_flight() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(p.in_flight(), 1);
    let crash = p
        .invoke(br#"{"crash": true}"#, Duration::from_secs(30))
        .await;
    assert!(
        matches!(crash, Err(InvokeError::Crashed { generation: 1, .. })),
        "{crash:?}"
    );
    let slow = slow.await.unwrap();
    assert!(
        matches!(slow, Err(InvokeError::Crashed { generation: 1, .. })),
        "{slow:?}"
    );
    assert_eq!(slow.unwrap_err().code(), "function_crashed");

    let s = wait_status(&p, |s| s.phase == Phase::Ready).await;
    assert_eq!(s.generation, 2);
    assert_ne!(s.pid, Some(first_pid));
    assert!(eventually_dead(first_pid as u64).await);
    assert_eq!((p.crashes(), p.restarts()), (1, 1));
    let v = json(&p.invoke(b"{}", Duration::from_secs(10)).await.unwrap());
    assert_eq!(v["pid"].as_u64(), s.pid.map(u64::from));

    // A call made while it restarts waits for the new process.
    let waiting = {
        let p = p.clone();
        tokio::spawn(async move {
            wait_status(&p, |s| s.phase == Phase::Restarting).await;
            p.invoke(b"{}", Duration::from_secs(30)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _ = p
        .invoke(br#"{"crash": true}"#, Duration::from_secs(30))
        .await;
    let v = json(&waiting.await.unwrap().unwrap());
    assert_eq!(p.status().generation, 3);
    assert_eq!(v["pid"].as_u64(), p.status().pid.map(u64::from));
    assert_eq!((p.crashes(), p.restarts()), (2, 2));
    p.stop().await;
}

#[tokio::test]
async fn deadline_bounds_a_slow_call() {
    let p = ProcessInstance::start(spec(&[])).await.unwrap();
    let r = p
        .invoke(br#"{"sleep_ms": 30000}"#, Duration::from_millis(300))
        .await;
    assert!(
        matches!(
            r,
            Err(InvokeError::DeadlineExceeded {
                while_: "waiting for response",
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(p.in_flight(), 0);
    p.stop().await;
}

#[tokio::test]
async fn stop_ends_the_process_group() {
    let p = ProcessInstance::start(spec(&["--spawn-child"]))
        .await
        .unwrap();
    let v = json(&p.invoke(b"{}", Duration::from_secs(10)).await.unwrap());
    let (pid, child) = (v["pid"].as_u64().unwrap(), v["child_pid"].as_u64().unwrap());
    assert!(!dead(pid) && !dead(child));
    p.stop().await;
    assert!(eventually_dead(pid).await, "server {pid} left running");
    assert!(
        eventually_dead(child).await,
        "its child {child} left running"
    );
    let r = p.invoke(b"{}", Duration::from_secs(1)).await;
    assert!(
        matches!(
            r,
            Err(InvokeError::Unavailable {
                phase: Phase::Stopped,
                ..
            })
        ),
        "{r:?}"
    );
    p.stop().await; // idempotent
}

#[tokio::test]
async fn stop_escalates_to_sigkill_when_term_is_ignored() {
    let p = ProcessInstance::start(spec(&["--spawn-child", "--ignore-term"]))
        .await
        .unwrap();
    let v = json(&p.invoke(b"{}", Duration::from_secs(10)).await.unwrap());
    let (pid, child) = (v["pid"].as_u64().unwrap(), v["child_pid"].as_u64().unwrap());
    p.stop().await;
    assert!(eventually_dead(pid).await, "server {pid} survived SIGKILL");
    assert!(
        eventually_dead(child).await,
        "child {child} survived SIGKILL"
    );
}

#[tokio::test]
async fn drop_without_stop_kills_the_group() {
    let p = ProcessInstance::start(spec(&["--spawn-child", "--ignore-term"]))
        .await
        .unwrap();
    let v = json(&p.invoke(b"{}", Duration::from_secs(10)).await.unwrap());
    let (pid, child) = (v["pid"].as_u64().unwrap(), v["child_pid"].as_u64().unwrap());
    drop(p);
    assert!(eventually_dead(pid).await);
    assert!(eventually_dead(child).await);
}

#[tokio::test]
async fn failed_first_start_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("no-start");
    std::fs::write(&marker, b"").unwrap();
    let r = ProcessInstance::start(spec(&["--exit-if-exists", marker.to_str().unwrap()])).await;
    assert!(
        matches!(r, Err(ProcessError::ExitedDuringStart { .. })),
        "{r:?}"
    );

    let mut s = spec(&[]);
    s.health_path = "/not-there".into();
    s.startup_timeout = Duration::from_millis(500);
    let r = ProcessInstance::start(s).await;
    assert!(matches!(r, Err(ProcessError::Unhealthy { .. })), "{r:?}");

    let mut s = spec(&[]);
    s.argv[0] = "/nonexistent/python".into();
    let r = ProcessInstance::start(s).await;
    assert!(matches!(r, Err(ProcessError::Spawn { .. })), "{r:?}");
}

#[tokio::test]
async fn gives_up_after_max_failed_starts() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("no-restart");
    let mut s = spec(&["--exit-if-exists", marker.to_str().unwrap()]);
    s.max_failed_starts = Some(3);
    let p = ProcessInstance::start(s).await.unwrap();
    std::fs::write(&marker, b"").unwrap();
    let r = p
        .invoke(br#"{"crash": true}"#, Duration::from_secs(10))
        .await;
    assert!(matches!(r, Err(InvokeError::Crashed { .. })), "{r:?}");
    let st = wait_status(&p, |s| s.phase == Phase::Failed).await;
    assert_eq!(st.generation, 1 + 3, "three restart attempts");
    assert_eq!((p.crashes(), p.failed_starts(), p.restarts()), (1, 3, 0));
    let r = p.invoke(b"{}", Duration::from_secs(1)).await;
    assert!(
        matches!(
            r,
            Err(InvokeError::Unavailable {
                phase: Phase::Failed,
                ..
            })
        ),
        "{r:?}"
    );
}

#[test]
fn restart_keys_set_the_backoff_and_are_checked() {
    let base = "runtime = \"custom\"\ncommand = [\"x\", \"{port}\"]\n";
    let t = RuntimeTemplate::parse(base, "t.toml").unwrap();
    let s = ProcessSpec::from_template(&t, "i", FunctionArgs::model("m"), 9, slice()).unwrap();
    assert_eq!(s.backoff, Backoff::default());
    assert_eq!(s.max_failed_starts, Some(10));
    let text =
        format!("{base}restart_initial_ms = 50\nrestart_max_ms = 800\nmax_failed_starts = 0\n");
    let t = RuntimeTemplate::parse(&text, "t.toml").unwrap();
    let s = ProcessSpec::from_template(&t, "i", FunctionArgs::model("m"), 9, slice()).unwrap();
    assert_eq!(
        (s.backoff.initial, s.backoff.max, s.max_failed_starts),
        (Duration::from_millis(50), Duration::from_millis(800), None)
    );
    let bad = format!("{base}restart_initial_ms = 500\nrestart_max_ms = 100\n");
    let e = RuntimeTemplate::parse(&bad, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("t.toml: restart_max_ms: "), "{e}");
}
