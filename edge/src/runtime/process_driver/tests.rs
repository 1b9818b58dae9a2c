//! The process driver with `tests/fixtures/echo_server.py` as the function.

use super::*;
use gshare_core::executor::RequestId;
use gshare_core::model::{LatencyProfile, NodeId, PoolPreference, Runtime, TenantId, Tier};

const ECHO: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/echo_server.py"
);

fn options(counters: &ProcessCounters) -> Arc<ProcessOptions> {
    options_with(counters, "")
}

/// The echo server's options, `more` added to its template.
fn options_with(counters: &ProcessCounters, more: &str) -> Arc<ProcessOptions> {
    let text = format!(
        "runtime = \"custom\"\ncommand = [\"python3\", {ECHO:?}, \"--port\", \"{{port}}\", \"--spawn-child\"]\nstartup_timeout_s = 20\nstop_grace_s = 5\n{more}"
    );
    Arc::new(ProcessOptions {
        template: RuntimeTemplate::parse(&text, "echo.toml").unwrap(),
        workdir: None,
        log_dir: None,
        gpu_memory_mib: Some(16_384),
        counters: counters.clone(),
        ledger: None,
        vm: None,
    })
}

fn function() -> FunctionSpec {
    FunctionSpec {
        model: None,
        args: Vec::new(),
        env: Default::default(),
        tenant: TenantId("acme".into()),
        name: "echo".into(),
        runtime: Runtime::Custom,
        memory_mib: 4096,
        compute_milli: 250,
        tier: Tier::Guaranteed,
        deadline_ms: 10_000,
        pool: PoolPreference::Any,
        min_instances: 1,
        max_instances: 1,
        idle_timeout_s: 60,
        latency: LatencyProfile {
            full_gpu_us: 1_000,
            saturation_milli: 500,
        },
    }
}

fn slice(gpu: u32) -> Slice {
    Slice {
        gpu: GpuId {
            node: NodeId("n1".into()),
            index: gpu,
        },
        compute_milli: 250,
        memory_mib: 4096,
    }
}

fn call(body: &str, deadline_ms: Option<u64>) -> Invocation {
    Invocation {
        request: RequestId(1),
        gpu: 0,
        compute_milli: 250,
        service_us: 1_000,
        deadline: deadline_ms.map(|ms| std::time::Instant::now() + Duration::from_millis(ms)),
        body: body.as_bytes().to_vec().into(),
        http: None,
        stream_to: None,
    }
}

async fn echo(d: &mut ProcessDriver, body: &str) -> serde_json::Value {
    let out = d.invoke(call(body, None)).await.expect("echo answers");
    serde_json::from_slice(&out.body).unwrap()
}

fn alive(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

async fn gone(pid: u64) -> bool {
    for _ in 0..250 {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn serves_on_its_slice_and_follows_its_weights_between_gpus() {
    let counters = ProcessCounters::new();
    let mut d = ProcessDriver::new(options(&counters));
    assert_eq!(
        d.invoke(call("{}", None)).await,
        Err(RuntimeError::NotRunning)
    );
    d.start(&function(), &[slice(0)]).await.unwrap();
    let first = echo(&mut d, r#"{"x":1}"#).await;
    assert_eq!(first["body"], r#"{"x":1}"#);
    assert_eq!(first["env"]["CUDA_VISIBLE_DEVICES"], "0");
    assert_eq!(first["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
    assert_eq!(first["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=4096M");
    let pid0 = first["pid"].as_u64().unwrap();
    let child0 = first["child_pid"].as_u64().unwrap();
    assert_eq!(d.pid(), Some(pid0 as u32));

    // Its copy loads on the same GPU: nothing happens.
    d.place(Placement::Joined(0)).await.unwrap();
    assert_eq!(d.pid(), Some(pid0 as u32));
    // A second copy on GPU 1 does not disturb the running process.
    d.place(Placement::Joined(1)).await.unwrap();
    assert_eq!(d.pid(), Some(pid0 as u32));
    assert_eq!(d.gpus(), Some(vec![0]));
    // The copy on GPU 0 leaves (a move to GPU 1, or an unload): the process
    // follows to GPU 1's slice; the old group is gone.
    d.place(Placement::Left(0)).await.unwrap();
    let moved = echo(&mut d, "{}").await;
    assert_eq!(moved["env"]["CUDA_VISIBLE_DEVICES"], "1");
    assert_eq!(moved["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "1=4096M");
    assert_ne!(moved["pid"].as_u64(), Some(pid0));
    assert!(
        gone(pid0).await && gone(child0).await,
        "old process group left"
    );
    // Swapped out: stopped; invocations are refused until it is back.
    let pid1 = moved["pid"].as_u64().unwrap();
    d.place(Placement::Left(1)).await.unwrap();
    assert!(gone(pid1).await);
    assert_eq!(d.pid(), None);
    assert_eq!(
        d.invoke(call("{}", None)).await,
        Err(RuntimeError::NotRunning)
    );
    d.place(Placement::Joined(1)).await.unwrap();
    assert_eq!(echo(&mut d, "{}").await["env"]["CUDA_VISIBLE_DEVICES"], "1");
    assert_eq!((counters.starts(), counters.running()), (3, 1));
    d.stop().await;
    assert_eq!(counters.running(), 0);
    assert_eq!(counters.crashes(), 0);
}

#[tokio::test]
async fn the_process_runs_the_functions_model_args_and_env_within_its_template() {
    let counters = ProcessCounters::new();
    // `{model}` in a command of its own, so that the function's args follow it.
    let more = "allow_args = [\"--tag=\"]\nallow_env = [\"GSHARE_TEST_FUNCTION\"]\n";
    let text = format!(
        "runtime = \"custom\"\ncommand = [\"python3\", {ECHO:?}, \"--port\", \"{{port}}\", \"--model\", \"{{model}}\"]\nstartup_timeout_s = 20\nstop_grace_s = 5\n{more}"
    );
    let mut opts = (*options_with(&counters, "")).clone();
    opts.template = RuntimeTemplate::parse(&text, "echo.toml").unwrap();
    let opts = Arc::new(opts);
    let mut f = function();
    // No model: `{model}` is the function's name, as before.
    let mut d = ProcessDriver::new(opts.clone());
    d.start(&f, &[slice(0)]).await.unwrap();
    let argv = echo(&mut d, "{}").await["argv"].clone();
    assert_eq!(argv[argv.as_array().unwrap().len() - 1], "echo");
    d.stop().await;

    f.model = Some("org/model".into());
    f.args = vec!["--tag".into(), "a".into(), "--tag=b".into()];
    f.env = [("GSHARE_TEST_FUNCTION".to_string(), "v {x}".to_string())].into();
    let mut d = ProcessDriver::new(opts.clone());
    d.start(&f, &[slice(0)]).await.unwrap();
    let out = echo(&mut d, "{}").await;
    let argv: Vec<String> = serde_json::from_value(out["argv"].clone()).unwrap();
    assert_eq!(
        argv[argv.len() - 5..],
        ["--model", "org/model", "--tag", "a", "--tag=b"]
    );
    assert_eq!(out["env"]["GSHARE_TEST_FUNCTION"], "v {x}");
    assert_eq!(out["env"]["CUDA_VISIBLE_DEVICES"], "0");
    d.stop().await;

    // What the template does not allow: the start fails, naming it.
    f.args = vec!["--spawn-child".into()];
    let mut d = ProcessDriver::new(opts);
    match d.start(&f, &[slice(0)]).await {
        Err(RuntimeError::Failed(m)) => assert!(m.contains("args[0]"), "{m}"),
        other => panic!("expected a refused start, got {other:?}"),
    }
    assert_eq!(d.pid(), None);
}

#[tokio::test]
async fn a_crash_ends_the_call_as_crashed_and_the_process_comes_back() {
    let counters = ProcessCounters::new();
    let mut d = ProcessDriver::new(options(&counters));
    d.start(&function(), &[slice(0)]).await.unwrap();
    let before = echo(&mut d, "{}").await;
    let (pid, child) = (
        before["pid"].as_u64().unwrap(),
        before["child_pid"].as_u64().unwrap(),
    );
    assert_eq!(d.generation(), Some(1));
    let crashed = d.invoke(call(r#"{"crash_after_ms":100}"#, None)).await;
    assert!(
        matches!(crashed, Err(RuntimeError::Crashed(ref m)) if m.contains("acme-echo")),
        "{crashed:?}"
    );
    // The next call waits for the restart and is served by a new process.
    let after = echo(&mut d, "{}").await;
    assert_ne!(after["pid"].as_u64(), Some(pid));
    assert_eq!(d.generation(), Some(2));
    assert!(gone(pid).await && gone(child).await, "crashed group left");
    for _ in 0..100 {
        if counters.restarts() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!((counters.crashes(), counters.restarts()), (1, 1));
    // A call that outlives its deadline ends as such (the process stays).
    let late = d.invoke(call(r#"{"sleep_ms":2000}"#, Some(100))).await;
    assert!(
        matches!(late, Err(RuntimeError::DeadlineExceeded(_))),
        "{late:?}"
    );
    let last = after["pid"].as_u64().unwrap();
    let last_child = after["child_pid"].as_u64().unwrap();
    d.stop().await;
    assert!(
        gone(last).await && gone(last_child).await,
        "stop left the group"
    );
    assert_eq!(counters.crashes(), 1);
}

#[tokio::test]
async fn a_function_that_does_not_start_is_a_start_error() {
    let counters = ProcessCounters::new();
    let text = "runtime = \"custom\"\ncommand = [\"python3\", \"-c\", \"import sys; sys.exit(4)\"]\nstartup_timeout_s = 5\n";
    let mut d = ProcessDriver::new(Arc::new(ProcessOptions {
        template: RuntimeTemplate::parse(text, "bad.toml").unwrap(),
        workdir: None,
        log_dir: None,
        gpu_memory_mib: None,
        counters: counters.clone(),
        ledger: None,
        vm: None,
    }));
    let e = d.start(&function(), &[slice(0)]).await.unwrap_err();
    assert!(
        matches!(e, RuntimeError::Failed(ref m) if m.contains("exited during start-up")),
        "{e:?}"
    );
    assert_eq!(
        d.invoke(call("{}", None)).await,
        Err(RuntimeError::NotRunning)
    );
    assert_eq!((counters.starts(), counters.running()), (0, 0));
}

#[tokio::test]
async fn a_load_starts_over_a_process_its_supervisor_gave_up_on() {
    let counters = ProcessCounters::new();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("broken");
    let text = format!(
        "runtime = \"custom\"\ncommand = [\"python3\", {ECHO:?}, \"--port\", \"{{port}}\", \"--exit-if-exists\", {:?}]\nstartup_timeout_s = 20\nstop_grace_s = 5\nrestart_initial_ms = 20\nrestart_max_ms = 40\nmax_failed_starts = 3\n",
        marker.display().to_string()
    );
    let mut d = ProcessDriver::new(Arc::new(ProcessOptions {
        template: RuntimeTemplate::parse(&text, "echo.toml").unwrap(),
        workdir: None,
        log_dir: None,
        gpu_memory_mib: None,
        counters: counters.clone(),
        ledger: None,
        vm: None,
    }));
    d.start(&function(), &[slice(0)]).await.unwrap();
    // From now on every restart exits at once: the supervisor gives up.
    std::fs::write(&marker, "").unwrap();
    let crashed = d.invoke(call(r#"{"crash":true}"#, None)).await;
    assert!(
        matches!(crashed, Err(RuntimeError::Crashed(_))),
        "{crashed:?}"
    );
    let instance = d.running.borrow().as_ref().unwrap().instance.clone();
    let mut rx = instance.subscribe();
    tokio::time::timeout(
        Duration::from_secs(30),
        rx.wait_for(|s| s.phase == Phase::Failed),
    )
    .await
    .expect("supervisor gives up")
    .unwrap();
    let refused = d.invoke(call("{}", None)).await;
    assert!(
        matches!(refused, Err(RuntimeError::Failed(_))),
        "{refused:?}"
    );
    // Fixed; the next load on the same GPU starts a fresh process.
    std::fs::remove_file(&marker).unwrap();
    d.place(Placement::Joined(0)).await.unwrap();
    assert_eq!(echo(&mut d, "{}").await["env"]["CUDA_VISIBLE_DEVICES"], "0");
    assert_eq!(d.generation(), Some(1));
    d.stop().await;
    assert_eq!(counters.running(), 0);
}
