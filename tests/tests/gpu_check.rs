//! `tests/gpu/check.sh`, the GPU check, on a machine without a GPU (CI):
//! its dry run says what each part would do, with the CUDA/MPS environment the
//! process driver renders (through `gshare-gpu-probe mps-env`), writes its JSON
//! report and exits 0; the probe reports NVML as the agent reads it; the MPS
//! verdict the real run gives is judged right on made-up client results.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn probe() -> PathBuf {
    gshare_tests::binary("gshare-gpu-probe")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The machine has a GPU the auto mode would use (then only `--dry-run` is tested).
fn has_gpu() -> bool {
    Path::new("/dev/nvidia0").exists()
        || std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("nvidia-smi").is_file()))
}

fn check(args: &[&str], out: &Path) -> Output {
    let o = Command::new("bash")
        .arg(root().join("tests/gpu/check.sh"))
        .args(args)
        .arg("--probe")
        .arg(probe())
        .arg("--out")
        .arg(out)
        .output()
        .expect("run tests/gpu/check.sh");
    println!("{}", text(&o));
    o
}

fn report(out: &Path) -> Value {
    let path = out.join("gpu-check.json");
    let s = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}\n{s}", path.display()))
}

const PARTS: [&str; 5] = ["nvml", "calibrate", "bandwidth", "mps", "checkpoint"];

#[test]
fn the_dry_run_says_what_it_would_do_with_the_process_drivers_env_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let o = check(&["--dry-run"], dir.path());
    assert!(o.status.success(), "exit {:?}", o.status);
    let out = text(&o);
    for p in PARTS {
        assert!(
            out.contains(&format!("[dry-run] {p}: would ")),
            "{p} missing:\n{out}"
        );
    }
    // The clients' env is the process driver's, rendered for the two slices.
    let line = |prefix: &str| {
        out.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?}:\n{out}"))
            .to_string()
    };
    let a = line("[dry-run] mps client a (250 milli-GPU, 4096 MiB) env:");
    for kv in [
        "CUDA_VISIBLE_DEVICES=0",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M",
        "GSHARE_COMPUTE_PERCENT=25",
    ] {
        assert!(a.split(' ').any(|w| w == kv), "{kv} not in {a}");
    }
    let b = line("[dry-run] mps client b (750 milli-GPU, 12288 MiB) env:");
    for kv in [
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=75",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=12288M",
    ] {
        assert!(b.split(' ').any(|w| w == kv), "{kv} not in {b}");
    }
    // What NVML says here, as the agent reads it.
    let nvml: Value = serde_json::from_str(
        line("[dry-run] nvml here: ")
            .trim_start_matches("[dry-run] nvml here: ")
            .trim(),
    )
    .expect("the probe's NVML report is JSON");
    assert!(
        ["supported", "unsupported"].contains(&nvml["status"].as_str().unwrap_or("")),
        "{nvml}"
    );

    let r = report(dir.path());
    assert_eq!(r["mode"], "dry-run", "{r}");
    for p in PARTS {
        assert_eq!(r["parts"][p]["status"], "dry-run", "{p}: {r}");
        assert!(
            r["parts"][p]["would"]
                .as_str()
                .is_some_and(|w| !w.is_empty()),
            "{p}: {r}"
        );
    }
    assert!(r["parts"]["mps"]["would"]
        .as_str()
        .unwrap()
        .contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M"));
    assert_eq!(r["parts"]["environment"]["mode"], "dry-run");
}

#[test]
fn without_a_gpu_the_plain_run_falls_back_to_the_dry_run() {
    if has_gpu() {
        println!("this machine has a GPU: the plain run would use it; skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = check(&[], dir.path());
    assert!(o.status.success(), "exit {:?}", o.status);
    assert!(text(&o).starts_with("no GPU here"), "{}", text(&o));
    assert_eq!(report(dir.path())["mode"], "dry-run");
}

#[test]
fn bad_arguments_are_refused_with_status_2() {
    let dir = tempfile::tempdir().unwrap();
    let o = check(&["--budget-s", "soon"], dir.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--budget-s takes whole seconds"));
    assert!(!dir.path().join("gpu-check.json").exists());
}

#[test]
fn the_probe_reports_nvml_as_the_agent_reads_it() {
    let o = Command::new(probe()).arg("nvml").output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    match v["status"].as_str() {
        // No driver (CI): the agent's own wording, and what to do about it.
        Some("unsupported") => assert!(
            v["reason"]
                .as_str()
                .unwrap()
                .contains("set gpus.nvml_fallback"),
            "{v}"
        ),
        Some("supported") => {
            let gpus = v["gpus"].as_array().unwrap();
            assert!(!gpus.is_empty(), "{v}");
            assert_eq!(gpus[0]["h2d_mib_per_s"], 12_000, "the agent's default");
            assert_eq!(v["inventory"]["gpus"].as_array().unwrap().len(), gpus.len());
        }
        other => panic!("status {other:?}: {v}"),
    }
}

#[test]
fn the_probe_refuses_a_slice_the_driver_would_refuse() {
    let template = root().join("configs/examples/runtimes/pytorch.toml");
    let run = |args: &[&str]| {
        Command::new(probe())
            .arg("mps-env")
            .arg("--template")
            .arg(&template)
            .args(args)
            .output()
            .unwrap()
    };
    let ok = run(&[
        "--compute-milli",
        "1000",
        "--memory-mib",
        "80000",
        "--gpus",
        "2,3",
    ]);
    assert!(ok.status.success(), "{}", text(&ok));
    let env = String::from_utf8_lossy(&ok.stdout);
    assert!(
        env.lines().any(|l| l == "CUDA_VISIBLE_DEVICES=2,3"),
        "{env}"
    );
    assert!(
        env.lines()
            .any(|l| l == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=2=80000M,3=80000M"),
        "{env}"
    );
    let zero = run(&["--compute-milli", "0", "--memory-mib", "1"]);
    assert!(!zero.status.success());
    assert!(text(&zero).contains("compute-milli"), "{}", text(&zero));
    let missing = Command::new(probe())
        .args(["mps-env", "--template", "/nonexistent.toml"])
        .args(["--compute-milli", "10", "--memory-mib", "1"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(
        text(&missing).contains("/nonexistent.toml"),
        "{}",
        text(&missing)
    );
}

/// One MPS client's result as `cuda_probe.py client` prints it.
fn client(percent: u32, limit: u64, sms: u32, kernel_ms: f64, allocated: u64) -> Value {
    json!({
        "status": "supported",
        "env": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": percent.to_string(),
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": format!("0={limit}M")},
        "sm_count_device": 132,
        "sm_count_context": sms,
        "mem_info": {"free_mib": limit, "total_mib": limit},
        "limit_mib": limit,
        "kernel_ms": kernel_ms,
        "kernels_per_s": 1000.0 / kernel_ms,
        "alloc": {"allocated_mib": allocated, "refused_with": "CUDA_ERROR_OUT_OF_MEMORY",
                  "cap_mib": limit + 1024, "chunk_mib": 256},
    })
}

fn shared(kernels_per_s: f64) -> Value {
    json!({"status": "supported", "window": {"kernels": 10, "seconds": 3.0, "kernels_per_s": kernels_per_s}})
}

fn mps_verdict(solo_a: Value, solo_b: Value, shared_a: Value, shared_b: Value) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["tests/gpu/cuda_probe.py".to_string(), "mps-report".into()];
    for (name, v) in [
        ("solo-a", solo_a),
        ("solo-b", solo_b),
        ("shared-a", shared_a),
        ("shared-b", shared_b),
    ] {
        let p = dir.path().join(format!("{name}.json"));
        std::fs::write(&p, format!("noise on stdout\n{v}\n")).unwrap();
        args.push(format!("--{name}"));
        args.push(p.display().to_string());
    }
    let o = Command::new("python3")
        .current_dir(root())
        .args(&args)
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).expect("JSON verdict")
}

#[test]
fn the_mps_verdict_passes_limits_that_hold_and_names_the_one_that_does_not() {
    // 25 % → 34 SMs, 75 % → 100 SMs: the same work takes ~3× as long on a.
    let good = mps_verdict(
        client(25, 4096, 34, 600.0, 3968),
        client(75, 12288, 100, 204.0, 12160),
        shared(1.6),
        shared(4.8),
    );
    assert_eq!(good["status"], "supported", "{good}");
    assert_eq!(good["memory"]["solo_a"]["enforced"], true);

    // b allocated past its limit: the memory limit did not hold.
    let over = mps_verdict(
        client(25, 4096, 34, 600.0, 3968),
        client(75, 12288, 100, 204.0, 13312),
        shared(1.6),
        shared(4.8),
    );
    assert_eq!(over["status"], "failed", "{over}");
    let why = over["reason"].as_str().unwrap();
    assert!(
        why.contains("solo_b: allocated 13312 MiB against a limit of 12288 MiB"),
        "{why}"
    );
    assert!(!why.contains("solo_a"), "{why}");

    // a got all SMs (MPS not in force): the compute share did not hold.
    let unlimited = mps_verdict(
        client(25, 4096, 132, 150.0, 3968),
        client(75, 12288, 100, 204.0, 12160),
        shared(6.6),
        shared(4.8),
    );
    assert_eq!(unlimited["status"], "failed", "{unlimited}");
    assert!(
        unlimited["reason"]
            .as_str()
            .unwrap()
            .contains("a: context has 132 SMs for 25 %"),
        "{unlimited}"
    );

    // A client that did not run makes the whole part failed, saying which.
    let crashed = mps_verdict(
        json!({"status": "failed", "reason": "client a: exit 124"}),
        client(75, 12288, 100, 204.0, 12160),
        shared(1.6),
        shared(4.8),
    );
    assert_eq!(crashed["status"], "failed");
    assert!(crashed["reason"]
        .as_str()
        .unwrap()
        .contains("solo_a: client a: exit 124"));
}
