//! `gsharectl up` as a user runs it: a whole local region (3 replicas, 4
//! agents) with the demo, ended by `--for`, by SIGTERM in the middle of
//! the load, and by `kill -9`. In every case no replica or agent outlives
//! it; the first two exit 0 and end with the summary line.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One region at a time: the machine has few cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// A generous bound on a whole run (build excluded), so a hang fails
/// instead of blocking the suite.
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// `gsharectl up` running, its stdout lines arriving on a channel.
struct Up {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Up {
    fn start(args: &[&str]) -> Up {
        let mut child = Command::new(gshare_tests::binary("gsharectl"))
            .arg("up")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn gsharectl up");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                println!("| {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Up {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one starts with `prefix`.
    fn wait_line(&mut self, prefix: &str) {
        let deadline = Instant::now() + RUN_LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.starts_with(prefix);
                    self.seen.push(l);
                    if hit {
                        return;
                    }
                }
                Err(e) => {
                    let _ = self.child.kill();
                    panic!(
                        "no line {prefix:?} ({e}); output so far:\n{}",
                        self.seen.join("\n")
                    );
                }
            }
        }
    }

    /// Waits for the exit; returns whether it succeeded and all stdout lines.
    fn finish(mut self) -> (bool, Vec<String>) {
        let deadline = Instant::now() + RUN_LIMIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("gsharectl up still running after {RUN_LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        // The reader ends at EOF, which comes once the process is gone.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(10)) {
            self.seen.push(l);
        }
        (status.success(), self.seen)
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{sig} failed");
    }
}

/// The pids `gsharectl up` printed for its replicas and agents.
fn child_pids(lines: &[String]) -> Vec<u32> {
    lines
        .iter()
        .filter(|l| l.starts_with("up: replica r") || l.starts_with("up: agent "))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "pid")?;
            words.next()?.parse().ok()
        })
        .collect()
}

/// The temporary directory it printed.
fn data_dir(lines: &[String]) -> PathBuf {
    let l = lines
        .iter()
        .find(|l| l.starts_with("up: data directory "))
        .expect("data directory line");
    PathBuf::from(l["up: data directory ".len()..].split(' ').next().unwrap())
}

/// Pids of live processes (not zombies) whose command line mentions `needle`.
fn live_processes_mentioning(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if is_live(pid) {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmd).contains(needle) {
                out.push(pid);
            }
        }
    }
    out
}

/// Whether `pid` is a running gshare replica or agent (a zombie or a
/// reused pid of another program is not).
fn is_live_child(pid: u32) -> bool {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmd = String::from_utf8_lossy(&cmd);
    is_live(pid) && (cmd.contains("gshare-region") || cmd.contains("gshare-edge"))
}

fn is_live(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesized command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Checks the summary line and that nothing it started is left.
fn check_clean_exit(ok: bool, lines: &[String]) {
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
    assert!(n > 0, "{last}");
    assert!((0.0..=1.0).contains(&x_value), "{last}");
    assert_eq!(x.split_once('.').map(|(_, d)| d.len()), Some(3), "{last}");
    println!("summary: invocations={n} attainment={x} tenants_billed={k}");
    // Both demo tenants were invoked; their agents journaled the usage and
    // delivered it before stopping, so both have a bill above zero.
    assert_eq!(k, 2, "{last}");
    let pids = child_pids(lines);
    assert_eq!(pids.len(), 7, "3 replicas + 4 agents: {pids:?}");
    let left: Vec<u32> = pids.into_iter().filter(|p| is_live_child(*p)).collect();
    assert!(left.is_empty(), "children still running: {left:?}");
    let dir = data_dir(lines);
    let strays = live_processes_mentioning(&dir.display().to_string());
    assert!(
        strays.is_empty(),
        "processes using {}: {strays:?}",
        dir.display()
    );
    assert!(!dir.exists(), "{} not removed", dir.display());
}

#[test]
fn up_for_runs_the_demo_and_exits_0_leaving_no_child() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let up = Up::start(&["--for", "1", "--load-s", "5"]);
    let (ok, lines) = up.finish();
    check_clean_exit(ok, &lines);
    for section in [
        "up: deadline attainment",
        "up: GPU utilization",
        "up: bills",
        "up: where to look:",
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
    check_clean_exit(ok, &lines);
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
    check_clean_exit(ok, &lines);
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
