//! `gsharectl up --runtime microvm` as a user runs it: the local region
//! with two of the demo's functions (one per tenant, a center and an edge
//! node) served in QEMU microVMs by the agents' `microvm` driver. The
//! report lists each VM with the boot-to-ready its agent measured and a
//! summary line; the load is served from the VMs; every replica, agent and
//! VM is gone at the end, and after a `kill -9` of `up` too.
//!
//! Needs QEMU and the guest image (`scripts/microvm-image.sh`); without
//! them the test prints why and passes, except with `GSHARE_CI` set
//! (`.ci/run` sets it after building the image), where it fails. A missing
//! image is refused before anything starts (that test needs neither).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gshare_tests::up_process::{
    assert_nothing_left, child_pids, data_dir, is_live, is_live_child, live_processes_mentioning,
    UpProcess as Up,
};

/// One region at a time: the machine has few cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// The two demo functions it serves in VMs (not the demo's moved or
/// scaling functions: each of those would boot more VMs).
const FUNCTIONS: [(&str, &str); 2] = [("acme/rank", "local-c"), ("globex/translate", "local-eb1")];

/// The guest image directory, or why the test cannot run (a panic in CI).
fn image_dir() -> Option<PathBuf> {
    gshare_tests::agent_proc::microvm_image_dir("`gsharectl up --runtime microvm`")
}

/// `key=value` words of a line.
fn figures(line: &str) -> BTreeMap<&str, &str> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .collect()
}

#[test]
fn up_runtime_microvm_serves_the_demo_in_vms_and_reports_each_boot() {
    let Some(image) = image_dir() else { return };
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let image = image.display().to_string();
    let names = FUNCTIONS.map(|(f, _)| f).join(",");
    let up = Up::start(&[
        "--runtime",
        "microvm",
        "--microvm-image",
        &image,
        "--functions",
        &names,
        "--for",
        "1",
        "--load-s",
        "3",
    ]);
    let (ok, lines) = up.finish();
    let all = lines.join("\n");
    assert!(ok, "gsharectl up --runtime microvm failed; output:\n{all}");
    // One row per VM: function, node, QEMU pid, boot-to-ready ms, RSS MiB.
    let header = lines
        .iter()
        .position(|l| l.starts_with("up: microVMs running (accel "))
        .unwrap_or_else(|| panic!("no microVM table in:\n{all}"));
    let rows: Vec<Vec<&str>> = lines[header + 2..]
        .iter()
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), FUNCTIONS.len(), "one VM per function:\n{all}");
    let mut boots = Vec::new();
    for (function, node) in FUNCTIONS {
        let row = rows
            .iter()
            .find(|r| r[0] == function)
            .unwrap_or_else(|| panic!("no VM of {function}:\n{all}"));
        assert!(row[1].starts_with(node), "{function} on {}:\n{all}", row[1]);
        let pid: u32 = row[2].parse().unwrap_or_else(|_| panic!("pid {row:?}"));
        assert!(pid > 0, "{row:?}");
        let boot: u64 = row[3].parse().unwrap_or_else(|_| panic!("boot {row:?}"));
        assert!(boot > 0, "{row:?}");
        let rss: u64 = row[4].parse().unwrap_or_else(|_| panic!("rss {row:?}"));
        assert!(rss > 0, "{row:?}");
        boots.push(boot);
        println!(
            "microvm up: {function} on {}: boot-to-ready {boot} ms, RSS {rss} MiB",
            row[1]
        );
    }
    boots.sort_unstable();
    let summary = lines
        .iter()
        .find(|l| l.starts_with("up: microvm boot-to-ready: "))
        .unwrap_or_else(|| panic!("no summary in:\n{all}"));
    let f = figures(summary);
    assert_eq!(f["vms"], "2", "{summary}");
    // The summary is of the rows printed: min and max are two of them.
    assert_eq!(f["min_ms"].parse::<u64>().unwrap(), boots[0], "{summary}");
    assert_eq!(f["max_ms"].parse::<u64>().unwrap(), boots[1], "{summary}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("up: microVM boots measured by the agents so far")),
        "{all}"
    );
    // Served from the VMs: both tenants invoked and billed (the last line).
    let last = lines.last().expect("output");
    let f = figures(last);
    assert!(last.starts_with("up: invocations="), "{last}");
    assert!(f["invocations"].parse::<u64>().unwrap() > 0, "{last}");
    assert_eq!(f["tenants_billed"], "2", "{last}");
    // 3 replicas + 4 agents gone, no process (QEMU included: its command
    // line names the directory) left using the directory, which is removed.
    let dir = data_dir(&lines);
    assert_nothing_left(&lines, 7);
    assert!(!dir.exists());
}

/// The agents die with `up` (their parent-death signal) but QEMU does not
/// inherit that; `up`'s VM reaper stops the VMs.
#[test]
fn kill_9_of_up_runtime_microvm_leaves_no_vm() {
    let Some(image) = image_dir() else { return };
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let image = image.display().to_string();
    let mut up = Up::start(&[
        "--runtime",
        "microvm",
        "--microvm-image",
        &image,
        "--functions",
        FUNCTIONS[0].0,
        "--load-s",
        "60",
    ]);
    up.wait_line("up: microvm boot-to-ready: vms=1 ");
    let dir = data_dir(up.seen()).display().to_string();
    let is_qemu = |p: &u32| {
        std::fs::read(format!("/proc/{p}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).starts_with("qemu-system"))
    };
    let vms: Vec<u32> = live_processes_mentioning(&dir)
        .into_iter()
        .filter(is_qemu)
        .collect();
    assert_eq!(vms.len(), 1, "the function's VM: {vms:?}");
    up.signal("KILL");
    let (ok, lines) = up.finish();
    assert!(!ok);
    let children = child_pids(&lines);
    assert_eq!(children.len(), 7, "{children:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let gone = |vms: &[u32]| {
        vms.iter().all(|p| !is_live(*p))
            && children.iter().all(|p| !is_live_child(*p))
            && live_processes_mentioning(&dir).is_empty()
    };
    while !gone(&vms) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left: Vec<u32> = vms.iter().copied().filter(|p| is_live(*p)).collect();
    let strays = live_processes_mentioning(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(left.is_empty(), "VMs outlived kill -9 of up: {left:?}");
    assert!(strays.is_empty(), "processes using {dir}: {strays:?}");
    assert!(children.iter().all(|p| !is_live_child(*p)), "{children:?}");
}

#[test]
fn up_runtime_microvm_without_an_image_says_how_to_build_it() {
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(gshare_tests::binary("gsharectl"))
        .args(["up", "--runtime", "microvm", "--microvm-image"])
        .arg(empty.path())
        .output()
        .expect("run gsharectl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("no guest image in") && stderr.contains("scripts/microvm-image.sh"),
        "{stderr}"
    );
    // Refused before anything was started.
    assert!(!stdout.contains("up: replica"), "{stdout}");
}
