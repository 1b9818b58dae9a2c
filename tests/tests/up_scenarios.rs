//! `gsharectl up --scenario <name>` as a user runs it: each scenario
//! starts the whole local region (3 replicas, 4 agents), runs its script,
//! stops everything and ends with its `scenario:` line. The tests check
//! what the scenario says happened (its own check passed: exit 0; the
//! scale-out, the scale to zero, the move, the recovery from a lost edge
//! node and the return to it; no invocation without an answer; the region
//! billed what the agents journaled) and print the timings; they assert
//! none.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use gshare_tests::up_process::{assert_nothing_left, UpProcess};

/// One region at a time: the machine has few cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `gsharectl up --scenario <name>`; its exit status, its output and
/// the figures of its last line.
fn run(name: &str) -> (bool, Vec<String>, BTreeMap<String, String>) {
    let started = Instant::now();
    let (ok, lines) = UpProcess::start(&["--scenario", name]).finish();
    println!(
        "scenario {name}: {:.1} s wall",
        started.elapsed().as_secs_f64()
    );
    let last = lines.last().cloned().unwrap_or_default();
    let figures = figures(&last)
        .unwrap_or_else(|| panic!("last line {last:?}; output:\n{}", lines.join("\n")));
    (ok, lines, figures)
}

/// The `key=value` pairs of a `scenario:` line.
fn figures(line: &str) -> Option<BTreeMap<String, String>> {
    let rest = line.strip_prefix("scenario: ")?;
    rest.split_whitespace()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

fn int(f: &BTreeMap<String, String>, k: &str) -> u64 {
    f.get(k)
        .unwrap_or_else(|| panic!("no {k} in {f:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("{k} in {f:?}: {e}"))
}

fn decimal(f: &BTreeMap<String, String>, k: &str) -> f64 {
    let v = f.get(k).unwrap_or_else(|| panic!("no {k} in {f:?}"));
    assert!(v.contains('.'), "{k}={v} is not a decimal");
    v.parse().unwrap_or_else(|e| panic!("{k}={v}: {e}"))
}

/// What every scenario line holds.
fn check_common(name: &str, ok: bool, lines: &[String], f: &BTreeMap<String, String>) {
    assert!(ok, "scenario {name} failed; output:\n{}", lines.join("\n"));
    assert_eq!(f.get("name").map(String::as_str), Some(name));
    let n = int(f, "invocations");
    let failed = int(f, "failed");
    assert!(n > 0 && failed <= n, "{f:?}");
    let x = decimal(f, "attainment");
    assert!((0.0..=1.0).contains(&x), "{f:?}");
    // Every invocation the clients sent was billed at most once: the
    // region's count is the agents' journals' (checked by the scenario),
    // and nothing served goes unbilled.
    assert!(int(f, "billed_invocations") >= n - failed, "{f:?}");
    // 3 replicas + 4 agents, and any agent the scenario restarted.
    let restarts = lines
        .iter()
        .filter(|l| l.starts_with("up: restarted agent "))
        .count();
    assert_nothing_left(lines, 7 + restarts);
}

#[test]
fn burst_scales_out_and_loses_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (ok, lines, f) = run("burst");
    check_common("burst", ok, &lines, &f);
    let start = int(&f, "instances_start");
    let peak = int(&f, "instances_peak");
    assert_eq!(start, 1, "{f:?}");
    assert!(peak > start, "no scale-out: {f:?}");
    // Refusals while one instance carries the burst are answers; a request
    // without any answer is lost.
    assert_eq!(int(&f, "lost"), 0, "{f:?}");
    let scaled = decimal(&f, "scaled_s");
    println!(
        "burst: scaled_s={scaled} instances {start}→{peak} invocations={} failed={} attainment={}",
        f["invocations"], f["failed"], f["attainment"]
    );
}

#[test]
fn to_zero_reaches_zero_and_resumes_warm_then_cold() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (ok, lines, f) = run("to-zero");
    check_common("to-zero", ok, &lines, &f);
    assert_eq!(int(&f, "instances_min"), 0, "{f:?}");
    assert_eq!(int(&f, "failed"), 0, "{f:?}");
    assert_eq!(f.get("warm_kind").map(String::as_str), Some("swap_in"));
    assert_eq!(f.get("cold_kind").map(String::as_str), Some("cold_start"));
    assert!(
        lines.iter().any(|l| l.starts_with("up: restarted agent ")),
        "no agent was restarted"
    );
    let (warm, cold) = (decimal(&f, "warm_ms"), decimal(&f, "cold_ms"));
    println!(
        "to-zero: from_zero_ms={} zero_s={} warm_ms={warm} cold_ms={cold} (warm below cold: {})",
        f["from_zero_ms"],
        f["zero_s"],
        warm < cold
    );
}

#[test]
fn migrate_moves_under_load_and_loses_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (ok, lines, f) = run("migrate");
    check_common("migrate", ok, &lines, &f);
    // Make-before-break: the old instance serves until the new one is
    // resident, so no invocation fails because of the move.
    assert_eq!(int(&f, "failed"), 0, "{f:?}");
    assert!(int(&f, "moved") >= 1, "nothing moved: {f:?}");
    println!(
        "migrate: move_s={} moved={} invocations={} attainment={}",
        decimal(&f, "move_s"),
        f["moved"],
        f["invocations"],
        f["attainment"]
    );
}

#[test]
fn edge_loss_recovers_from_the_center_and_returns() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (ok, lines, f) = run("edge-loss");
    check_common("edge-loss", ok, &lines, &f);
    assert!(
        lines.iter().any(|l| l.starts_with("up: killed agent ")),
        "no agent was killed"
    );
    assert!(int(&f, "moved") >= 1, "nothing moved: {f:?}");
    let (recovered, returned) = (decimal(&f, "recovered_s"), decimal(&f, "returned_s"));
    println!(
        "edge-loss: recovered_s={recovered} returned_s={returned} invocations={} failed={} \
         attainment={}",
        f["invocations"], f["failed"], f["attainment"]
    );
}

#[test]
fn a_scenario_line_splits_into_its_figures() {
    let f = figures("scenario: name=burst invocations=3 failed=0 attainment=1.000 scaled_s=2.5")
        .unwrap();
    assert_eq!(int(&f, "invocations"), 3);
    assert_eq!(decimal(&f, "scaled_s"), 2.5);
    assert!(figures("up: invocations=3").is_none());
    assert!(figures("scenario: name=burst stray").is_none());
}
