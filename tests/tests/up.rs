//! `gsharectl up` as a user runs it: a whole local region (3 replicas, 4
//! agents) with the demo, ended by `--for`, by SIGTERM in the middle of
//! the load, and by `kill -9`. In every case no replica or agent outlives
//! it; the first two exit 0 and end with the summary line.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use gshare_tests::up_process::{
    assert_nothing_left, child_pids, data_dir, is_live_child, UpProcess as Up,
};

/// One region at a time: the machine has few cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// Checks the summary line and that nothing it started is left. With
/// `load_ran` the load had time to answer something, so the count is above
/// zero; a signal as the load starts may come before its first answer.
fn check_clean_exit(ok: bool, lines: &[String], load_ran: bool) {
    assert!(ok, "gsharectl up failed; output:\n{}", lines.join("\n"));
    let last = lines.last().expect("some output");
    let rest = last
        .strip_prefix("up: invocations=")
        .unwrap_or_else(|| panic!("last line {last:?}"));
    let (n, rest) = rest.split_once(" attainment=").expect("attainment");
    let (x, k) = rest.split_once(" tenants_billed=").expect("tenants_billed");
    let n: u64 = n.parse().expect("N");
    let x_value: f64 = x.parse().expect("x");
    let k: u32 = k.parse().expect("K");
    assert!(!load_ran || n > 0, "{last}");
    assert!((0.0..=1.0).contains(&x_value), "{last}");
    assert_eq!(x.split_once('.').map(|(_, d)| d.len()), Some(3), "{last}");
    println!("summary: invocations={n} attainment={x} tenants_billed={k}");
    // Both demo tenants were invoked; their agents journaled the usage and
    // delivered it before stopping, so both have a bill above zero.
    assert_eq!(k, 2, "{last}");
    // 3 replicas + 4 agents.
    assert_nothing_left(lines, 7);
}

#[test]
fn up_for_runs_the_demo_and_exits_0_leaving_no_child() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let up = Up::start(&["--for", "1", "--load-s", "5"]);
    let (ok, lines) = up.finish();
    check_clean_exit(ok, &lines, true);
    for section in [
        "up: deadline attainment",
        "up: GPU utilization",
        "up: bills",
        "up: where to look:",
        "up: scaling",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(section)),
            "no {section:?} in:\n{}",
            lines.join("\n")
        );
    }
}

#[test]
fn sigterm_in_the_middle_of_the_load_stops_children_and_exits_0() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut up = Up::start(&["--load-s", "60"]);
    up.wait_line("up: invocation load");
    std::thread::sleep(Duration::from_secs(2));
    up.signal("TERM");
    let (ok, lines) = up.finish();
    assert!(
        lines.iter().any(|l| l == "up: SIGTERM received, stopping"),
        "{}",
        lines.join("\n")
    );
    check_clean_exit(ok, &lines, true);
}

/// Ctrl-C as a terminal sends it (SIGINT), as the load starts: the same
/// clean stop and summary line (both tenants billed for the warm-up).
#[test]
fn sigint_at_the_start_of_the_load_stops_children_and_exits_0() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut up = Up::start(&["--load-s", "60"]);
    up.wait_line("up: invocation load");
    up.signal("INT");
    let (ok, lines) = up.finish();
    assert!(
        lines.iter().any(|l| l == "up: SIGINT received, stopping"),
        "{}",
        lines.join("\n")
    );
    // The signal comes as the load starts: it may stop it before its first
    // answer (CI saw invocations=0), so only the warm-up is billed for sure.
    check_clean_exit(ok, &lines, false);
}

#[test]
fn kill_9_of_up_leaves_no_child() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut up = Up::start(&[]);
    up.wait_line("up: all 4 agents registered");
    up.signal("KILL");
    let (ok, lines) = up.finish();
    assert!(!ok);
    let pids = child_pids(&lines);
    assert_eq!(pids.len(), 7, "{pids:?}");
    // The kernel delivers the parent-death signal when gsharectl dies; give
    // the children a moment to be reaped by init.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut left: Vec<u32> = pids.clone();
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        left.retain(|p| is_live_child(*p));
    }
    assert!(left.is_empty(), "children outlived kill -9: {left:?}");
    // Nobody removes the directory after kill -9.
    let _ = std::fs::remove_dir_all(data_dir(&lines));
}
