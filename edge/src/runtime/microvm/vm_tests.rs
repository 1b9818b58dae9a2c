//! Real microVMs: the `microvm` driver (a [`ProcessDriver`] with
//! [`ProcessOptions::vm`]) boots `tests/fixtures/echo_server.py` in QEMU
//! from the image `scripts/microvm-image.sh` builds.
//!
//! Where to find the image: `$GSHARE_MICROVM_IMAGE`, else
//! `<workspace>/target/microvm`. Without it (or without QEMU) the tests
//! print why and pass *only* outside CI: with `GSHARE_CI` set (`.ci/run`
//! sets it and builds the image first) a missing image or QEMU fails them.

use crate::runtime::microvm::{self, Accel, MicrovmImage, MicrovmOptions};
use crate::runtime::process::RuntimeTemplate;
use crate::runtime::{
    Invocation, Placement, ProcessCounters, ProcessDriver, ProcessOptions, RuntimeDriver,
    RuntimeError,
};
use gshare_core::executor::RequestId;
use gshare_core::model::{
    FunctionSpec, GpuId, LatencyProfile, NodeId, PoolPreference, Runtime, Slice, TenantId, Tier,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");

/// The image and QEMU, or why not (a panic in CI).
fn image() -> Option<MicrovmImage> {
    let dir = std::env::var_os("GSHARE_MICROVM_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/microvm"));
    let why = match MicrovmImage::open(&dir) {
        Ok(i) if qemu_present() => return Some(i),
        Ok(_) => format!("{} not on PATH", microvm::QEMU),
        Err(e) => format!("{e} (run scripts/microvm-image.sh)"),
    };
    assert!(
        std::env::var_os("GSHARE_CI").is_none(),
        "GSHARE_CI is set but the microVM tests cannot run: {why}"
    );
    eprintln!("SKIPPED: no microVM here: {why}");
    None
}

fn qemu_present() -> bool {
    std::process::Command::new(microvm::QEMU)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn vm_options(image: MicrovmImage, counters: &ProcessCounters, run: &Path) -> Arc<ProcessOptions> {
    let text = "runtime = \"custom\"\n\
        command = [\"python3\", \"echo_server.py\", \"--host\", \"{host}\", \"--port\", \"{port}\"]\n\
        startup_timeout_s = 90\nstop_grace_s = 5\nrestart_initial_ms = 100\n\
        [env]\nGSHARE_TEST_EXTRA = \"{instance}@{gpu}\"\n\
        [vm]\nfiles = [\"echo_server.py\"]\nmemory_mib = 160\n";
    let template = RuntimeTemplate::parse(text, "echo-vm.toml").unwrap();
    let (accel, why) = Accel::detect();
    eprintln!("microvm accel: {} ({why})", accel.as_str());
    counters.register_vm_runtime(Runtime::Custom, accel == Accel::Kvm, 3_000_000);
    Arc::new(ProcessOptions {
        template,
        workdir: Some(PathBuf::from(FIXTURES)),
        log_dir: Some(run.join("logs")),
        gpu_memory_mib: Some(16_384),
        counters: counters.clone(),
        ledger: None,
        vm: Some(Arc::new(MicrovmOptions {
            image,
            accel,
            qemu: microvm::QEMU.into(),
            run_dir: run.join("microvm"),
            tsc_khz: microvm::host_tsc_khz(),
        })),
    })
}

fn process_options(counters: &ProcessCounters) -> Arc<ProcessOptions> {
    let text = "runtime = \"custom\"\n\
        command = [\"python3\", \"echo_server.py\", \"--host\", \"{host}\", \"--port\", \"{port}\"]\n\
        startup_timeout_s = 20\nstop_grace_s = 5\n";
    Arc::new(ProcessOptions {
        template: RuntimeTemplate::parse(text, "echo.toml").unwrap(),
        workdir: Some(PathBuf::from(FIXTURES)),
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
        memory_mib: 1024,
        compute_milli: 250,
        tier: Tier::Guaranteed,
        deadline_ms: 30_000,
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
        memory_mib: 1024,
    }
}

fn call(body: &str) -> Invocation {
    Invocation {
        request: RequestId(1),
        gpu: 0,
        compute_milli: 250,
        service_us: 1_000,
        deadline: Some(std::time::Instant::now() + Duration::from_secs(60)),
        body: body.as_bytes().to_vec().into(),
        http: None,
        stream_to: None,
    }
}

async fn echo(d: &mut ProcessDriver, body: &str) -> serde_json::Value {
    let out = d.invoke(call(body)).await.expect("echo answers");
    serde_json::from_slice(&out.body).unwrap()
}

fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

async fn gone(pid: u32) -> bool {
    for _ in 0..500 {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The last lines of the function's log (the VMs' serial console).
fn console_tail(run: &Path) -> String {
    let log = std::fs::read_to_string(run.join("logs/acme-echo.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[tokio::test]
async fn a_microvm_serves_restarts_after_a_crash_and_stops_with_its_weights() {
    let Some(image) = image() else { return };
    let run = tempfile::tempdir().unwrap();
    let counters = ProcessCounters::new();
    let mut d = ProcessDriver::new(vm_options(image, &counters, run.path()));
    d.start(&function(), &[slice(0)]).await.unwrap();
    let vm0 = d.pid().unwrap();
    assert!(
        comm(vm0).starts_with("qemu"),
        "the process is QEMU: {}",
        comm(vm0)
    );
    let first = echo(&mut d, r#"{"x":1}"#).await;
    assert_eq!(first["body"], r#"{"x":1}"#);
    // Inside the guest the function is PID 1 and got the slice's environment.
    assert_eq!(first["pid"], 1);
    assert_eq!(first["env"]["GSHARE_TEST_EXTRA"], "acme-echo@0");
    assert_eq!(first["env"]["CUDA_VISIBLE_DEVICES"], "0");
    assert_eq!(counters.vm_boots(), 1);
    let boot = counters.vm_boot_last_us().unwrap();
    eprintln!(
        "microvm boot-to-ready {} ms, QEMU RSS {} MiB",
        boot / 1000,
        microvm::rss_kib(vm0).unwrap_or(0) / 1024
    );
    assert_eq!(counters.start_estimate_us(Runtime::Custom), Some(boot));
    // The function dies: the guest panics, QEMU exits, the call ends as
    // crashed, and the supervisor boots a new VM.
    let crashed = d.invoke(call(r#"{"crash":true}"#)).await;
    assert!(
        matches!(crashed, Err(RuntimeError::Crashed(_))),
        "{crashed:?}; console:\n{}",
        console_tail(run.path())
    );
    assert!(gone(vm0).await, "the crashed VM's QEMU is gone");
    let again = echo(&mut d, "{}").await;
    assert_eq!(again["pid"], 1);
    assert_eq!(d.generation(), Some(2));
    let vm1 = d.pid().unwrap();
    assert_ne!(vm1, vm0);
    assert_eq!(counters.crashes(), 1);
    // Swap-out stops the VM; swap-in boots a new one.
    d.place(Placement::Joined(0)).await.unwrap();
    assert_eq!(d.pid(), Some(vm1), "a load on its own GPU keeps the VM");
    d.place(Placement::Left(0)).await.unwrap();
    assert!(gone(vm1).await, "swap-out stops the VM");
    assert_eq!(d.invoke(call("{}")).await, Err(RuntimeError::NotRunning));
    let swap_in = std::time::Instant::now();
    d.place(Placement::Joined(1)).await.unwrap();
    eprintln!(
        "microvm swap-in (a boot) {} ms",
        swap_in.elapsed().as_millis()
    );
    let vm2 = d.pid().unwrap();
    assert_eq!(echo(&mut d, "{}").await["env"]["CUDA_VISIBLE_DEVICES"], "1");
    assert_eq!(counters.vm_boots(), 2, "driver starts are measured");
    d.stop().await;
    assert!(gone(vm2).await, "stop ends QEMU");
    assert_eq!(counters.running(), 0);
    let left: Vec<_> = std::fs::read_dir(run.path().join("microvm"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "initramfs files left: {left:?}");
    // The serial console went to the function's log.
    let log = std::fs::read_to_string(run.path().join("logs/acme-echo.log")).unwrap();
    assert!(log.contains("gshare-init: network up"), "{log}");
}

#[tokio::test]
async fn a_function_in_a_microvm_cannot_read_host_files_or_reach_host_ports() {
    let Some(image) = image() else { return };
    let run = tempfile::tempdir().unwrap();
    // A host secret and host services on loopback: a TCP listener (the
    // agent's ingress is TCP) and a UDP echo (the region's QUIC is UDP).
    let secret = run.path().join("secret.txt");
    std::fs::write(&secret, "host-only").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || for _ in listener.incoming() {});
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok((n, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(&buf[..n], from);
        }
    });
    let ask = format!(
        r#"{{"read":{:?},"connect":"127.0.0.1:{port}","udp":"127.0.0.1:{udp_port}"}}"#,
        secret.display().to_string()
    );
    // A process function reads the file and reaches the port…
    let counters = ProcessCounters::new();
    let mut p = ProcessDriver::new(process_options(&counters));
    p.start(&function(), &[slice(0)]).await.unwrap();
    let host = echo(&mut p, &ask).await;
    p.stop().await;
    assert_eq!(host["read"], "host-only", "{host}");
    assert_eq!(host["connect"], "ok", "{host}");
    assert_eq!(host["udp"], "ok: ping", "{host}");
    // …the same function in a VM does neither: its file system is its
    // initramfs, and the guest's connections to the host (10.0.2.2 is the
    // host's loopback in QEMU's user net) are dropped by restrict=on.
    let mut d = ProcessDriver::new(vm_options(image, &counters, run.path()));
    d.start(&function(), &[slice(0)]).await.unwrap();
    let guest = echo(&mut d, &ask).await;
    let read = guest["read"].as_str().unwrap();
    assert!(
        read.starts_with("error: ") && read.contains("No such file"),
        "{guest}"
    );
    let loopback = guest["connect"].as_str().unwrap();
    assert!(loopback.starts_with("error: "), "{guest}");
    for host in ["10.0.2.2", "10.0.2.3"] {
        let out = echo(
            &mut d,
            &format!(r#"{{"connect":"{host}:{port}","udp":"{host}:{udp_port}"}}"#),
        )
        .await;
        for probe in ["connect", "udp"] {
            let c = out[probe].as_str().unwrap();
            assert!(c.starts_with("error: "), "{host} {probe}: {out}");
        }
    }
    // The forwarded port is the one way in, from the host's loopback only.
    let port_in = d.pid().and_then(|_| {
        let argv = std::fs::read_to_string(format!("/proc/{}/cmdline", d.pid()?)).ok()?;
        let net = argv
            .split('\0')
            .find(|a| a.contains("hostfwd="))?
            .to_string();
        Some(net)
    });
    let net = port_in.unwrap();
    assert!(net.contains("restrict=on,hostfwd=tcp:127.0.0.1:"), "{net}");
    d.stop().await;
}
