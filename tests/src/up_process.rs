//! `gsharectl up` run as a user runs it, for the tests that drive it
//! (`up.rs`, `up_scenarios.rs`): its stdout lines on a channel (echoed
//! with `| `), its exit, signals, and the processes it started.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// A generous bound on a whole run (build excluded), so a hang fails
/// instead of blocking the suite.
pub const RUN_LIMIT: Duration = Duration::from_secs(300);

/// `gsharectl up` running, its stdout lines arriving on a channel.
pub struct UpProcess {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl UpProcess {
    /// Starts `gsharectl up <args>`.
    pub fn start(args: &[&str]) -> UpProcess {
        let mut child = Command::new(crate::binary("gsharectl"))
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
        UpProcess {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one starts with `prefix`.
    pub fn wait_line(&mut self, prefix: &str) {
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

    /// The lines read so far.
    pub fn seen(&self) -> &[String] {
        &self.seen
    }

    /// Waits for the exit; returns whether it succeeded and all stdout lines.
    pub fn finish(mut self) -> (bool, Vec<String>) {
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

    /// Sends `kill -<sig>` to it.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{sig} failed");
    }
}

/// The pids `gsharectl up` printed for its replicas and agents (those it
/// restarted included).
pub fn child_pids(lines: &[String]) -> Vec<u32> {
    lines
        .iter()
        .filter(|l| {
            l.starts_with("up: replica r")
                || l.starts_with("up: agent ")
                || l.starts_with("up: restarted agent ")
        })
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "pid")?;
            words.next()?.parse().ok()
        })
        .collect()
}

/// The temporary directory it printed.
pub fn data_dir(lines: &[String]) -> PathBuf {
    let l = lines
        .iter()
        .find(|l| l.starts_with("up: data directory "))
        .expect("data directory line");
    PathBuf::from(l["up: data directory ".len()..].split(' ').next().unwrap())
}

/// Pids of live processes (not zombies) whose command line mentions `needle`.
pub fn live_processes_mentioning(needle: &str) -> Vec<u32> {
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
pub fn is_live_child(pid: u32) -> bool {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmd = String::from_utf8_lossy(&cmd);
    is_live(pid) && (cmd.contains("gshare-region") || cmd.contains("gshare-edge"))
}

/// Whether `pid` is a running process (not a zombie).
pub fn is_live(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesized command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Checks that none of the replicas and agents `gsharectl up` printed
/// (`children` of them, restarts included) is left, that no process uses
/// its directory, and that the directory was removed.
pub fn assert_nothing_left(lines: &[String], children: usize) {
    let pids = child_pids(lines);
    assert_eq!(pids.len(), children, "replicas + agents: {pids:?}");
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
